//! `topk_topp`: exact top-k / top-p / min-p truncation of f32 logits on the
//! GPU (Qrita pivot search, issue 4): masking in place and sampling from
//! the truncated distribution.
//!
//! One thread block per row: two passes over the row (statistics, then the
//! pre-filter tiers while compacting the survivors into shared memory),
//! the pivot rounds over the compacted candidates (over the row when they
//! do not fit), and the masking pass. Several blocks per row for small
//! batches are the next step.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use flashsample_kernels::params::{ROW_THREADS, TOPK_TOPP_SMEM_BYTES};

use crate::device::Device;
use crate::error::{Result, param, shape};
use crate::rows::{RowParams, Rows};
use crate::sampling::{SampleOutput, Workspace};

/// Per-row truncation parameters in device memory (so that a captured CUDA
/// graph reads the current values at each replay). Truncation order
/// (vLLM v1): temperature, min-p, top-k, then top-p on the mass that
/// survives min-p and top-k.
#[derive(Debug)]
pub struct TruncParams {
    /// Keep the `top_k` first tokens of the total order (value desc, index
    /// asc); 0 or `>= vocab` is off.
    pub top_k: CudaSlice<u32>,
    /// Keep the shortest prefix whose exclusive mass is below
    /// `top_p * mass`; in `(0, 1]`, 1 is off.
    pub top_p: CudaSlice<f32>,
    /// Keep `p_i >= min_p * p_max`; in `[0, 1]`, 0 is off.
    pub min_p: CudaSlice<f32>,
    /// Temperature (`<= 0` or NaN is greedy: keeps the argmax), and the
    /// Philox seed and offset of the sampling kernel.
    pub row: RowParams,
}

impl TruncParams {
    /// Uploads per-row parameters (all slices of one length, the batch),
    /// rejecting `top_p` outside `(0, 1]` and `min_p` outside `[0, 1]`
    /// (NaN included). Every `top_k` and every temperature is valid. The
    /// kernels never misbehave on other values written to the buffers
    /// directly (they treat NaN or `>= 1` top-p and NaN or `<= 0` min-p as
    /// off), but only validated values have documented semantics.
    pub fn upload(
        stream: &Arc<CudaStream>,
        top_k: &[u32],
        top_p: &[f32],
        min_p: &[f32],
        temperature: &[f32],
        seed: &[u64],
        offset: &[u64],
    ) -> Result<TruncParams> {
        let b = top_k.len();
        for (what, len) in [
            ("top_p", top_p.len()),
            ("min_p", min_p.len()),
            ("temperature", temperature.len()),
        ] {
            if len != b {
                return Err(shape(what, b, len));
            }
        }
        if let Some(&p) = top_p.iter().find(|&&p| !(p > 0.0 && p <= 1.0)) {
            return Err(param("top_p", p));
        }
        if let Some(&m) = min_p.iter().find(|&&m| !(0.0..=1.0).contains(&m)) {
            return Err(param("min_p", m));
        }
        Ok(TruncParams {
            top_k: stream.clone_htod(top_k)?,
            top_p: stream.clone_htod(top_p)?,
            min_p: stream.clone_htod(min_p)?,
            row: RowParams::upload(stream, temperature, seed, offset)?,
        })
    }

    /// Rows described.
    pub fn batch(&self) -> usize {
        self.top_k.len()
    }

    fn check(&self, batch: usize) -> Result<()> {
        for (what, len) in [
            ("top_k", self.top_k.len()),
            ("top_p", self.top_p.len()),
            ("min_p", self.min_p.len()),
        ] {
            if len < batch {
                return Err(shape(what, format!("at least {batch} rows"), len));
            }
        }
        self.row.check(batch)
    }
}

/// One block of [`ROW_THREADS`] per row.
fn row_per_block(rows: &Rows) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.batch as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: TOPK_TOPP_SMEM_BYTES,
    }
}

impl Device {
    /// Truncates `[batch, vocab]` f32 logits in place (vLLM semantics):
    /// every logit outside its row's kept set (min-p, then top-k, then
    /// top-p, after temperature; see [`TruncParams`]) becomes -inf, kept
    /// logits keep their bits, and `kept[r]` receives the kept count. The
    /// kept set equals the float64 sorted reference
    /// ([`crate::reference::kept_set`]) except that top-p may differ by one
    /// element when the exact cumulative mass lies within 1e-6 (relative) of
    /// its threshold. Greedy rows keep their argmax; a row with nothing
    /// finite and no +inf becomes all -inf with `kept = 0`. Deterministic:
    /// a row's result depends only on the row and its parameters.
    ///
    /// `ws` is unused by this first, one-block-per-row version; it is part
    /// of the signature for the multi-block version.
    pub fn top_k_top_p_mask_logits(
        &self,
        stream: &Arc<CudaStream>,
        logits: &mut CudaViewMut<'_, f32>,
        rows: Rows,
        params: &TruncParams,
        kept: &mut CudaSlice<u32>,
        ws: &mut Workspace,
    ) -> Result<()> {
        let _ = ws;
        self.check_stream(stream)?;
        rows.validate("logits", logits.len())?;
        params.check(rows.batch)?;
        if kept.len() < rows.batch {
            return Err(shape(
                "kept",
                format!("at least {} rows", rows.batch),
                kept.len(),
            ));
        }
        let vocab = rows.vocab as u32; // validate: vocab <= MAX_VOCAB
        let stride = rows.row_stride as u64;
        let (l, _g1) = logits.device_ptr_mut(stream);
        let (tk, _g2) = params.top_k.device_ptr(stream);
        let (tp, _g3) = params.top_p.device_ptr(stream);
        let (mp, _g4) = params.min_p.device_ptr(stream);
        let (t, _g5) = params.row.temperature.device_ptr(stream);
        let (kp, _g6) = kept.device_ptr_mut(stream);
        let mut b = stream.launch_builder(&self.kernels().topk_topp_mask_f32);
        b.arg(&l)
            .arg(&tk)
            .arg(&tp)
            .arg(&mp)
            .arg(&t)
            .arg(&kp)
            .arg(&vocab)
            .arg(&stride);
        // SAFETY: the argument list matches `topk_topp_mask_f32`'s
        // signature; `logits` holds `rows.min_len()` elements (validated:
        // batch rows `row_stride` apart with `vocab` each, 1 <= vocab <=
        // MAX_VOCAB), the four parameter buffers and `kept` at least `batch`
        // elements (checked), all live cudarc buffers of this stream's
        // context; the grid has one block of ROW_THREADS per row and the
        // shared memory the kernel asks for.
        unsafe { b.launch(row_per_block(&rows)) }?;
        Ok(())
    }

    /// Samples one token per row of `[batch, vocab]` f32 logits from the
    /// row's kept set (as [`Device::top_k_top_p_mask_logits`]) with its
    /// probabilities renormalised: inverse CDF in the total order (value
    /// desc, index asc) with the uniform
    /// `uniform_open(row_uniform_bits(seed_key(seed), offset, 0))`, the
    /// draw of [`crate::reference::sample_top_k_top_p`]. Tokens equal the
    /// reference's except where the cumulative kept mass lies within
    /// rounding of `u * mass` (or the kept set differs in top-p's 1e-6
    /// band); no token outside the kept set is ever drawn. A row with
    /// nothing finite and no +inf gets `valid = 0` and token 0. The logits
    /// are only read.
    pub fn sample_top_k_top_p(
        &self,
        stream: &Arc<CudaStream>,
        logits: &CudaView<'_, f32>,
        rows: Rows,
        params: &TruncParams,
        out: &mut SampleOutput,
        ws: &mut Workspace,
    ) -> Result<()> {
        let _ = ws;
        self.check_stream(stream)?;
        rows.validate("logits", logits.len())?;
        params.check(rows.batch)?;
        if out.tokens.len() < rows.batch {
            return Err(shape(
                "tokens",
                format!("at least {}", rows.batch),
                out.tokens.len(),
            ));
        }
        if out.valid.len() < rows.batch {
            return Err(shape(
                "valid",
                format!("at least {}", rows.batch),
                out.valid.len(),
            ));
        }
        let vocab = rows.vocab as u32; // validate: vocab <= MAX_VOCAB
        let stride = rows.row_stride as u64;
        let (l, _g1) = logits.device_ptr(stream);
        let (tk, _g2) = params.top_k.device_ptr(stream);
        let (tp, _g3) = params.top_p.device_ptr(stream);
        let (mp, _g4) = params.min_p.device_ptr(stream);
        let (t, _g5) = params.row.temperature.device_ptr(stream);
        let (s, _g6) = params.row.seed.device_ptr(stream);
        let (o, _g7) = params.row.offset.device_ptr(stream);
        let (tok, _g8) = out.tokens.device_ptr_mut(stream);
        let (v, _g9) = out.valid.device_ptr_mut(stream);
        let mut b = stream.launch_builder(&self.kernels().topk_topp_sample_f32);
        b.arg(&l)
            .arg(&tk)
            .arg(&tp)
            .arg(&mp)
            .arg(&t)
            .arg(&s)
            .arg(&o)
            .arg(&tok)
            .arg(&v)
            .arg(&vocab)
            .arg(&stride);
        // SAFETY: the argument list matches `topk_topp_sample_f32`'s
        // signature; `logits` holds `rows.min_len()` elements (validated),
        // the six parameter buffers and both outputs at least `batch`
        // elements (checked), all live cudarc buffers of this stream's
        // context; one block of ROW_THREADS per row with the shared memory
        // the kernel asks for.
        unsafe { b.launch(row_per_block(&rows)) }?;
        Ok(())
    }
}

/// Raises the dynamic shared memory limit of the `topk_topp_*` kernels
/// (their candidate list needs more than the default 48 KiB).
pub(crate) fn configure(
    mask: &cudarc::driver::CudaFunction,
    sample: &cudarc::driver::CudaFunction,
) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM;
    mask.set_attribute(MAX_SMEM, TOPK_TOPP_SMEM_BYTES as i32)?;
    sample.set_attribute(MAX_SMEM, TOPK_TOPP_SMEM_BYTES as i32)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shape_is_one_block_per_row() {
        let c = row_per_block(&Rows::contiguous(7, 151_936));
        assert_eq!(c.grid_dim, (7, 1, 1));
        assert_eq!(c.block_dim, (ROW_THREADS, 1, 1));
        assert_eq!(c.shared_mem_bytes, TOPK_TOPP_SMEM_BYTES);
    }
}
