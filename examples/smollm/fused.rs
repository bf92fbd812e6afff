//! SmolLM2's LM head on the GPU in bf16, and one row's sampling from a final
//! hidden state: fused (`Device::fused_sample`: the LM-head matmul and
//! Gumbel-max in one pass, no logits written) or unfused (cuBLAS logits from
//! the same bf16 head, then `sampling_from_logits`). Used by `generate
//! --fused` and by `tests/model.rs`.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use cudarc::driver::CudaStream;
use flashsample::{Device, FusedOutput, HeadShape, RowParams, SampleOutput, Unfused, Workspace};
use half::bf16;

use super::{HIDDEN, Result, VOCAB};

/// `x` rounded to bf16 (round to nearest even), as the GPU reads it.
pub fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// The bf16 LM head `[VOCAB, HIDDEN]` uploaded once, one row's hidden state
/// and parameters (temperature and seed set per text, the offset per step)
/// in device memory, and the outputs and workspace of both pipelines. Every
/// call runs on one stream.
pub struct GpuHead {
    device: Device,
    stream: Arc<CudaStream>,
    lm_head: CudaSlice<bf16>,
    hidden: CudaSlice<bf16>,
    params: RowParams,
    fused: FusedOutput,
    unfused: SampleOutput,
    ws: Workspace,
}

impl GpuHead {
    /// Uploads `lm_head` (`VOCAB * HIDDEN` values, row-major: row `v` is
    /// token `v`'s weights) and the row's `temperature` and `seed` (see
    /// [`GpuHead::set_sampling`]).
    pub fn new(
        device: &Device,
        stream: &Arc<CudaStream>,
        lm_head: &[bf16],
        temperature: f32,
        seed: u64,
    ) -> Result<GpuHead> {
        if lm_head.len() != VOCAB * HIDDEN {
            return Err(format!(
                "LM head of {} values, expected {VOCAB} x {HIDDEN}",
                lm_head.len()
            )
            .into());
        }
        Ok(GpuHead {
            device: device.clone(),
            stream: stream.clone(),
            lm_head: stream.clone_htod(lm_head)?,
            hidden: stream.alloc_zeros(HIDDEN)?,
            params: RowParams::upload(stream, &[temperature], &[seed], &[0])?,
            fused: FusedOutput::new(stream, 1)?,
            unfused: SampleOutput::new(stream, 1)?,
            ws: Workspace::new(stream)?,
        })
    }

    /// Sets the row's temperature (`<= 0` is greedy) and Philox seed for the
    /// next calls.
    pub fn set_sampling(&mut self, temperature: f32, seed: u64) -> Result<()> {
        self.stream
            .memcpy_htod(&[temperature], &mut self.params.temperature)?;
        self.stream.memcpy_htod(&[seed], &mut self.params.seed)?;
        Ok(())
    }

    fn shape() -> HeadShape {
        HeadShape::new(1, VOCAB, HIDDEN)
    }

    /// Sets the row the next [`GpuHead::fused`] / [`GpuHead::unfused`]
    /// samples: the final hidden state `hidden` (`HIDDEN` values, rounded to
    /// bf16 on upload) at Philox offset `offset` (the step index).
    pub fn set_row(&mut self, hidden: &[f32], offset: u64) -> Result<()> {
        if hidden.len() != HIDDEN {
            return Err(
                format!("hidden state of {} values, expected {HIDDEN}", hidden.len()).into(),
            );
        }
        self.stream
            .memcpy_htod(&to_bf16(hidden), &mut self.hidden)?;
        self.stream
            .memcpy_htod(&[offset], &mut self.params.offset)?;
        Ok(())
    }

    /// The row's token from the fused LM-head sampler.
    pub fn fused(&mut self) -> Result<u32> {
        self.device.fused_sample(
            &self.stream,
            &self.hidden.as_view(),
            &self.lm_head.as_view(),
            None,
            Self::shape(),
            &self.params,
            &mut self.fused,
            &mut self.ws,
        )?;
        self.read(true)
    }

    /// The row's token from the unfused pipeline: `unfused` (a cuBLAS handle
    /// on this head's stream) writes the f32 logits of the same bf16 head,
    /// then `sampling_from_logits` samples them.
    pub fn unfused(&mut self, unfused: &mut Unfused) -> Result<u32> {
        unfused.sample(
            &self.device,
            &self.hidden.as_view(),
            &self.lm_head.as_view(),
            Self::shape(),
            &self.params,
            &mut self.unfused,
            &mut self.ws,
        )?;
        self.read(false)
    }

    /// Copies back (and waits for) the token of the fused or unfused output.
    fn read(&self, fused: bool) -> Result<u32> {
        let (tokens, valid) = if fused {
            (&self.fused.tokens, &self.fused.valid)
        } else {
            (&self.unfused.tokens, &self.unfused.valid)
        };
        let token = self.stream.clone_dtoh(tokens)?[0];
        match self.stream.clone_dtoh(valid)?[0] {
            1 if (token as usize) < VOCAB => Ok(token),
            1 => Err(format!("sampled token {token} is outside the vocabulary").into()),
            v => Err(format!(
                "the {} sampler flagged the row invalid (valid = {v}): a hidden state \
                 with no finite logit",
                if fused { "fused" } else { "unfused" }
            )
            .into()),
        }
    }

    /// The GPU's one-line description (`'NVIDIA H200' (sm_90a, 132 SMs)`).
    pub fn describe(&self) -> String {
        format!(
            "'{}' ({}, {} SMs)",
            self.device.name().unwrap_or_else(|_| "?".into()),
            self.device.arch(),
            self.device.sm_count()
        )
    }
}
