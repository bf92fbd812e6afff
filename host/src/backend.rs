//! One entry point over host memory that runs on the GPU when there is one
//! and on the float64 CPU reference otherwise, with the same results (the
//! GPU's tokens equal the reference's except where two perturbed scores are
//! within f32 rounding).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::reference;
use crate::rows::{RowParams, Rows};
use crate::sampling::{SampleOutput, Workspace};
use crate::topk_topp::TruncParams;

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
                let (rows, d_logits, mut out) =
                    upload_rows(stream, logits, vocab, temperature.len())?;
                let params = RowParams::upload(stream, temperature, seed, offset)?;
                device.sampling_from_logits(
                    stream,
                    &d_logits.as_view(),
                    rows,
                    &params,
                    &mut out,
                    workspace,
                )?;
                read_tokens(stream, &out)
            }
        }
    }

    /// Top-k / top-p / min-p sampling (temperature, min-p, top-k, then
    /// top-p on what survives, vLLM's order) of contiguous `[batch, vocab]`
    /// f32 logits in host memory, one token per row (`None` for a row with
    /// nothing to sample): [`reference::sample_top_k_top_p`] on the CPU,
    /// [`Device::sample_top_k_top_p`] (the Qrita pivot kernels) on the GPU,
    /// with one [`reference::SamplingParams`] per row. The two agree except
    /// where a cumulative mass is within rounding of a boundary.
    ///
    /// ```
    /// use flashsample::reference::SamplingParams;
    ///
    /// let mut cpu = flashsample::Backend::Cpu;
    /// let p = SamplingParams { temperature: 1.0, top_k: 1, top_p: 1.0, min_p: 0.0, seed: 3, offset: 0 };
    /// let t = cpu.sample_top_k_top_p(&[0.0f32, 5.0, 1.0], 3, &[p])?;
    /// assert_eq!(t, vec![Some(1)]); // top-k = 1 keeps the argmax alone
    /// # Ok::<(), flashsample::Error>(())
    /// ```
    pub fn sample_top_k_top_p(
        &mut self,
        logits: &[f32],
        vocab: usize,
        params: &[reference::SamplingParams],
    ) -> Result<Vec<Option<u32>>> {
        match self {
            Backend::Cpu => Ok(reference::sample_top_k_top_p_batch(logits, vocab, params)?),
            Backend::Gpu {
                device,
                stream,
                workspace,
            } => {
                let (rows, d_logits, mut out) = upload_rows(stream, logits, vocab, params.len())?;
                let trunc = upload_trunc(stream, params)?;
                device.sample_top_k_top_p(
                    stream,
                    &d_logits.as_view(),
                    rows,
                    &trunc,
                    &mut out,
                    workspace,
                )?;
                read_tokens(stream, &out)
            }
        }
    }
}

impl Backend {
    /// Probabilities renormalised over each row's kept set (temperature,
    /// min-p, top-k, top-p, as [`Backend::sample_top_k_top_p`]; 0 outside
    /// it, all 0 for a row with nothing to sample) of contiguous `[batch,
    /// vocab]` f32 logits in host memory, row-major:
    /// [`reference::probabilities`] on the CPU (rounded to f32),
    /// [`Device::top_k_top_p_renorm_probs`] on the GPU.
    ///
    /// ```
    /// use flashsample::reference::SamplingParams;
    ///
    /// let mut cpu = flashsample::Backend::Cpu;
    /// let p = SamplingParams { top_k: 2, ..SamplingParams::default() };
    /// let probs = cpu.top_k_top_p_renorm_probs(&[0.0f32, 1.0, 1.0], 3, &[p])?;
    /// assert_eq!(probs, vec![0.0, 0.5, 0.5]);
    /// # Ok::<(), flashsample::Error>(())
    /// ```
    pub fn top_k_top_p_renorm_probs(
        &mut self,
        logits: &[f32],
        vocab: usize,
        params: &[reference::SamplingParams],
    ) -> Result<Vec<f32>> {
        match self {
            Backend::Cpu => Ok(reference::probabilities_batch(logits, vocab, params)?
                .into_iter()
                .map(|p| p as f32)
                .collect()),
            Backend::Gpu {
                device,
                stream,
                workspace,
            } => {
                let (rows, d_logits, _) = upload_rows(stream, logits, vocab, params.len())?;
                let trunc = upload_trunc(stream, params)?;
                let mut probs = stream.alloc_zeros::<f32>(logits.len())?;
                let mut kept = stream.alloc_zeros::<u32>(params.len())?;
                device.top_k_top_p_renorm_probs(
                    stream,
                    &d_logits.as_view(),
                    rows,
                    &trunc,
                    &mut probs.as_view_mut(),
                    &mut kept,
                    workspace,
                )?;
                Ok(stream.clone_dtoh(&probs)?)
            }
        }
    }

    /// Each row's kept set (as [`Backend::top_k_top_p_renorm_probs`] keeps
    /// it) as ascending token indices, for contiguous `[batch, vocab]` f32
    /// logits in host memory: [`reference::kept_sets`] on the CPU,
    /// [`Device::top_k_top_p_kept_set`] on the GPU.
    ///
    /// ```
    /// use flashsample::reference::SamplingParams;
    ///
    /// let mut cpu = flashsample::Backend::Cpu;
    /// let p = SamplingParams { top_k: 2, ..SamplingParams::default() };
    /// let sets = cpu.top_k_top_p_kept_sets(&[3.0f32, 1.0, 2.0, 0.0], 4, &[p])?;
    /// assert_eq!(sets, vec![vec![0, 2]]);
    /// # Ok::<(), flashsample::Error>(())
    /// ```
    pub fn top_k_top_p_kept_sets(
        &mut self,
        logits: &[f32],
        vocab: usize,
        params: &[reference::SamplingParams],
    ) -> Result<Vec<Vec<u32>>> {
        match self {
            Backend::Cpu => {
                let mut sets = reference::kept_sets(logits, vocab, params)?;
                for s in &mut sets {
                    s.sort_unstable();
                }
                Ok(sets)
            }
            Backend::Gpu {
                device,
                stream,
                workspace,
            } => {
                let (rows, d_logits, _) = upload_rows(stream, logits, vocab, params.len())?;
                let trunc = upload_trunc(stream, params)?;
                let mut kept = stream.alloc_zeros::<u32>(params.len())?;
                let mut indices = stream.alloc_zeros::<u32>(logits.len())?;
                device.top_k_top_p_kept_set(
                    stream,
                    &d_logits.as_view(),
                    rows,
                    &trunc,
                    &mut kept,
                    &mut indices.as_view_mut(),
                    vocab,
                    workspace,
                )?;
                let kept = stream.clone_dtoh(&kept)?;
                let indices = stream.clone_dtoh(&indices)?;
                Ok(kept
                    .iter()
                    .zip(indices.chunks(vocab))
                    .map(|(&n, row)| row[..(n as usize).min(vocab)].to_vec())
                    .collect())
            }
        }
    }
}

/// The per-row truncation parameters of `params`, uploaded.
fn upload_trunc(
    stream: &Arc<CudaStream>,
    params: &[reference::SamplingParams],
) -> Result<TruncParams> {
    let column =
        |f: fn(&reference::SamplingParams) -> f32| -> Vec<f32> { params.iter().map(f).collect() };
    TruncParams::upload(
        stream,
        &params.iter().map(|p| p.top_k).collect::<Vec<_>>(),
        &column(|p| p.top_p),
        &column(|p| p.min_p),
        &column(|p| p.temperature),
        &params.iter().map(|p| p.seed).collect::<Vec<_>>(),
        &params.iter().map(|p| p.offset).collect::<Vec<_>>(),
    )
}

/// Checks that host `logits` are exactly `batch` rows of `vocab`, uploads
/// them and allocates the outputs.
fn upload_rows(
    stream: &Arc<CudaStream>,
    logits: &[f32],
    vocab: usize,
    batch: usize,
) -> Result<(Rows, CudaSlice<f32>, SampleOutput)> {
    let rows = Rows::contiguous(batch, vocab);
    rows.validate("logits", logits.len())?;
    if logits.len() != batch * vocab {
        return Err(crate::error::shape("logits", batch * vocab, logits.len()));
    }
    let d_logits = stream.clone_htod(logits).map_err(Error::from)?;
    Ok((rows, d_logits, SampleOutput::new(stream, batch)?))
}

/// The tokens of `out` back in host memory, `None` where a row is invalid.
fn read_tokens(stream: &Arc<CudaStream>, out: &SampleOutput) -> Result<Vec<Option<u32>>> {
    let tokens = stream.clone_dtoh(&out.tokens)?;
    let valid = stream.clone_dtoh(&out.valid)?;
    Ok(tokens
        .into_iter()
        .zip(valid)
        .map(|(t, v)| (v == 1).then_some(t))
        .collect())
}
