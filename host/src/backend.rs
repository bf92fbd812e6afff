//! One entry point over host memory that runs on the GPU when there is one
//! and on the float64 CPU reference otherwise, with the same results (the
//! GPU's tokens equal the reference's except where two perturbed scores are
//! within f32 rounding).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::reference;
use crate::rows::{RowParams, Rows};
use crate::sampling::{SampleOutput, Workspace};

/// Where sampling runs.
#[derive(Debug)]
pub enum Backend {
    /// A GPU, its stream and the calls' scratch memory.
    Gpu {
        device: Device,
        stream: Arc<CudaStream>,
        workspace: Workspace,
    },
    /// The float64 CPU reference.
    Cpu,
}

impl Backend {
    /// GPU 0 when one is usable, else the CPU backend, with the reason.
    ///
    /// ```
    /// let (backend, why) = flashsample::Backend::auto();
    /// println!("sampling on {} ({why})", backend.describe());
    /// ```
    pub fn auto() -> (Backend, String) {
        match Backend::gpu(0) {
            Ok(b) => (b, "GPU found".into()),
            Err(e) => (Backend::Cpu, format!("no GPU: {e}")),
        }
    }

    /// GPU `ordinal`.
    pub fn gpu(ordinal: usize) -> Result<Backend> {
        let device = Device::new(ordinal)?;
        let stream = device.new_stream()?;
        let workspace = Workspace::new(&stream)?;
        Ok(Backend::Gpu {
            device,
            stream,
            workspace,
        })
    }

    /// A one-line description (`GPU 'NVIDIA H200' (sm_90a, 132 SMs)` or
    /// `CPU (float64 reference)`).
    pub fn describe(&self) -> String {
        match self {
            Backend::Gpu { device, .. } => format!(
                "GPU '{}' ({}, {} SMs)",
                device.name().unwrap_or_else(|_| "?".into()),
                device.arch(),
                device.sm_count()
            ),
            Backend::Cpu => "CPU (float64 reference)".into(),
        }
    }

    /// Gumbel-max sampling of contiguous `[batch, vocab]` f32 logits in host
    /// memory, one token per row (`None` for a row with nothing to sample);
    /// `temperature`, `seed` and `offset` have one entry per row.
    ///
    /// ```
    /// let mut cpu = flashsample::Backend::Cpu;
    /// let logits = [0.0f32, 5.0, 1.0, 9.0, 2.0, 3.0];
    /// let t = cpu.sample_from_logits(&logits, 3, &[0.0, 0.0], &[1, 1], &[0, 0])?;
    /// assert_eq!(t, vec![Some(1), Some(0)]);
    /// # Ok::<(), flashsample::Error>(())
    /// ```
    pub fn sample_from_logits(
        &mut self,
        logits: &[f32],
        vocab: usize,
        temperature: &[f32],
        seed: &[u64],
        offset: &[u64],
    ) -> Result<Vec<Option<u32>>> {
        match self {
            Backend::Cpu => Ok(reference::sample_gumbel_batch(
                logits,
                vocab,
                temperature,
                seed,
                offset,
            )?),
            Backend::Gpu {
                device,
                stream,
                workspace,
            } => {
                let batch = temperature.len();
                let rows = Rows::contiguous(batch, vocab);
                rows.validate("logits", logits.len())?;
                if logits.len() != batch * vocab {
                    return Err(crate::error::shape("logits", batch * vocab, logits.len()));
                }
                let params = RowParams::upload(stream, temperature, seed, offset)?;
                let d_logits = stream.clone_htod(logits).map_err(Error::from)?;
                let mut out = SampleOutput::new(stream, batch)?;
                device.sampling_from_logits(
                    stream,
                    &d_logits.as_view(),
                    rows,
                    &params,
                    &mut out,
                    workspace,
                )?;
                let tokens = stream.clone_dtoh(&out.tokens)?;
                let valid = stream.clone_dtoh(&out.valid)?;
                Ok(tokens
                    .into_iter()
                    .zip(valid)
                    .map(|(t, v)| (v == 1).then_some(t))
                    .collect())
            }
        }
    }
}
