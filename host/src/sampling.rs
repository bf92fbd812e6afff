//! `sampling_from_logits` and `softmax` on the GPU.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg, sys::CUdeviceptr,
};
use flashsample_kernels::params::{
    ROW_THREADS, RowSplit, SAMPLING_BLOCKS_PER_SM, SAMPLING_SMEM_BYTES, sampling_seeded,
};

use crate::device::{Device, kernel_arg};
use crate::error::{Result, param, shape};
use crate::rows::{DType, LogitElem, RowParams, Rows, SplitArg, split_for_batch, split_for_vocab};
use crate::topk_topp::TopkToppRoute;

/// Scratch memory of the multi-block kernels: per-block partial results,
/// per-row tickets and per-row running maxima. Belongs to one stream at a
/// time (calls on different streams need different workspaces). The kernels
/// leave the tickets and maxima at zero, so a workspace can serve any later
/// call or graph replay; it grows on demand, which allocates: before
/// capturing a CUDA graph, run the captured call once (or
/// [`Workspace::reserve`]) so that capture allocates nothing.
#[derive(Debug)]
pub struct Workspace {
    partial: CudaSlice<u64>,
    counters: CudaSlice<u32>,
    keys: CudaSlice<u64>,
    topk_topp_forced: Option<TopkToppRoute>,
}

impl Workspace {
    /// An empty workspace on `stream`.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Workspace> {
        Ok(Workspace {
            partial: stream.alloc_zeros(1)?,
            counters: stream.alloc_zeros(1)?,
            keys: stream.alloc_zeros(1)?,
            topk_topp_forced: None,
        })
    }

    /// Serves every later top-k/top-p call through this workspace
    /// ([`Device::top_k_top_p_mask_logits`], [`Device::sample_top_k_top_p`])
    /// by `route` instead of the planned one (tests and benches compare
    /// routes); `None` restores the planner. Calls reject a cluster the GPU
    /// cannot run.
    pub fn force_topk_topp_route(&mut self, route: Option<TopkToppRoute>) {
        self.topk_topp_forced = route;
    }

    /// The forced top-k/top-p route, if any.
    pub(crate) fn topk_topp_forced(&self) -> Option<TopkToppRoute> {
        self.topk_topp_forced
    }

    /// Grows to hold `partial` words and `rows` tickets and maxima.
    pub fn reserve(&mut self, stream: &Arc<CudaStream>, partial: usize, rows: usize) -> Result<()> {
        if self.partial.len() < partial {
            self.partial = stream.alloc_zeros(partial)?;
        }
        if self.counters.len() < rows {
            self.counters = stream.alloc_zeros(rows)?;
        }
        if self.keys.len() < rows {
            self.keys = stream.alloc_zeros(rows)?;
        }
        Ok(())
    }

    pub(crate) fn partial_mut(&mut self) -> &mut CudaSlice<u64> {
        &mut self.partial
    }

    fn fit(
        &mut self,
        stream: &Arc<CudaStream>,
        split: &RowSplit,
        words_per_block: usize,
    ) -> Result<()> {
        let rows = split.batch as usize;
        self.reserve(
            stream,
            rows * split.ctas_per_row as usize * words_per_block,
            rows,
        )
    }
}

/// Where a sampler writes: one token and one validity flag per row (a row
/// with no finite logit and no +inf gets `valid = 0` and token 0).
#[derive(Debug)]
pub struct SampleOutput {
    pub tokens: CudaSlice<u32>,
    pub valid: CudaSlice<u8>,
}

impl SampleOutput {
    /// Output buffers for `batch` rows.
    pub fn new(stream: &Arc<CudaStream>, batch: usize) -> Result<SampleOutput> {
        Ok(SampleOutput {
            tokens: stream.alloc_zeros(batch)?,
            valid: stream.alloc_zeros(batch)?,
        })
    }

    fn check(&self, batch: usize) -> Result<()> {
        if self.tokens.len() < batch {
            return Err(shape(
                "tokens",
                format!("at least {batch}"),
                self.tokens.len(),
            ));
        }
        if self.valid.len() < batch {
            return Err(shape(
                "valid",
                format!("at least {batch}"),
                self.valid.len(),
            ));
        }
        Ok(())
    }
}

/// Raw device addresses of a sampling call, for callers that own their
/// memory (PyTorch, candle): every pointer is a device address in the
/// stream's context.
#[derive(Debug, Clone, Copy)]
pub struct RawSampling {
    pub logits: CUdeviceptr,
    pub dtype: DType,
    pub rows: Rows,
    pub temperature: CUdeviceptr,
    pub seed: CUdeviceptr,
    pub offset: CUdeviceptr,
    pub tokens: CUdeviceptr,
    pub valid: CUdeviceptr,
}

fn check_ptr(name: &'static str, p: CUdeviceptr, align: u64) -> Result<()> {
    if p == 0 || !p.is_multiple_of(align) {
        return Err(param(
            name,
            format_args!("{p:#x} (needs a non-null {align}-byte aligned address)"),
        ));
    }
    Ok(())
}

/// Launch of `sampling_from_logits_*`: the row grid, with the staged
/// shared memory for the seeded kernels (the others load into registers).
fn sampling_launch(split: &RowSplit, seeded: bool) -> LaunchConfig {
    let rows = row_launch(split);
    LaunchConfig {
        shared_mem_bytes: if seeded {
            SAMPLING_SMEM_BYTES
        } else {
            rows.shared_mem_bytes
        },
        ..rows
    }
}

/// Whether a launch of blocks of several rounds takes the wide kernels:
/// its grid fits in one wave of the seeded kernels
/// ([`SAMPLING_BLOCKS_PER_SM`] blocks a multiprocessor). There the wide
/// kernels' interleaved Philox chains, at
/// [`flashsample_kernels::params::SAMPLING_WIDE_BLOCKS_PER_SM`]
/// blocks a multiprocessor, fill the schedulers' issue slots better (H200,
/// session 16: 2 to 12 % faster from B = 32 to 512); larger grids
/// (B = 1024 at V = 128256: 2.7 % slower wide) take the seeded kernels.
fn sampling_wide(split: &RowSplit, sm_count: u32) -> bool {
    u64::from(split.batch) * u64::from(split.ctas_per_row)
        <= u64::from(SAMPLING_BLOCKS_PER_SM) * u64::from(sm_count)
}

/// Raises the dynamic shared memory limit of the staged sampling kernels
/// (seeded and wide: their stages take more than the default 48 KiB; the
/// others launch with a few words).
pub(crate) fn configure(staged: &[&cudarc::driver::CudaFunction]) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM;
    for f in staged {
        f.set_attribute(MAX_SMEM, SAMPLING_SMEM_BYTES as i32)?;
    }
    Ok(())
}

fn row_launch(split: &RowSplit) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (split.ctas_per_row, split.batch, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: (2 * ROW_THREADS / 32 + 2) * 8,
    }
}

impl Device {
    /// Samples one token per row of `[batch, vocab]` logits by Gumbel-max:
    /// `argmax_j x_j / T + G_j`, with `G_j` the Gumbel noise of the row's
    /// Philox stream at (seed, offset, j). Exact (the kernel's winner is the
    /// winner of the f32 scores computed with the library's noise),
    /// deterministic, and independent of batch size, row position and launch
    /// shape. Greedy rows (T <= 0 or NaN) take the argmax; ties go to the
    /// lowest index; NaN counts as -inf; +inf entries are sampled uniformly.
    ///
    /// ```no_run
    /// # fn main() -> flashsample::Result<()> {
    /// use flashsample::{Device, RowParams, Rows, SampleOutput, Workspace};
    /// let dev = Device::new(0)?;
    /// let stream = dev.new_stream()?;
    /// let (batch, vocab) = (2, 5);
    /// let logits = stream.clone_htod(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    ///     .map_err(flashsample::Error::from)?;
    /// let params = RowParams::upload(&stream, &[1.0, 0.0], &[7, 7], &[0, 0])?;
    /// let mut out = SampleOutput::new(&stream, batch)?;
    /// let mut ws = Workspace::new(&stream)?;
    /// dev.sampling_from_logits(&stream, &logits.as_view(), Rows::contiguous(batch, vocab),
    ///     &params, &mut out, &mut ws)?;
    /// let tokens = stream.clone_dtoh(&out.tokens).map_err(flashsample::Error::from)?;
    /// assert_eq!(tokens[1], 0); // greedy row
    /// # Ok(()) }
    /// ```
    pub fn sampling_from_logits<T: LogitElem>(
        &self,
        stream: &Arc<CudaStream>,
        logits: &CudaView<'_, T>,
        rows: Rows,
        params: &RowParams,
        out: &mut SampleOutput,
        ws: &mut Workspace,
    ) -> Result<()> {
        rows.validate("logits", logits.len())?;
        params.check(rows.batch)?;
        out.check(rows.batch)?;
        let (l, _g1) = logits.device_ptr(stream);
        let (t, _g2) = params.temperature.device_ptr(stream);
        let (s, _g3) = params.seed.device_ptr(stream);
        let (o, _g4) = params.offset.device_ptr(stream);
        let (tok, _g5) = out.tokens.device_ptr_mut(stream);
        let (v, _g6) = out.valid.device_ptr_mut(stream);
        let raw = RawSampling {
            logits: l,
            dtype: T::DTYPE,
            rows,
            temperature: t,
            seed: s,
            offset: o,
            tokens: tok,
            valid: v,
        };
        // SAFETY: every address comes from a live cudarc buffer of this
        // stream's context, and the lengths were checked above.
        unsafe { self.sampling_from_logits_raw(stream, &raw, ws) }
    }

    /// [`Device::sampling_from_logits`] on raw device addresses.
    ///
    /// # Safety
    /// `raw.logits` holds `raw.rows.min_len()` elements of `raw.dtype`;
    /// `temperature`, `seed`, `offset` hold `batch` f32 / u64 / u64;
    /// `tokens` and `valid` `batch` writable u32 / u8; all in `stream`'s
    /// context and not written by anyone else until the call completes.
    pub unsafe fn sampling_from_logits_raw(
        &self,
        stream: &Arc<CudaStream>,
        raw: &RawSampling,
        ws: &mut Workspace,
    ) -> Result<()> {
        self.check_stream(stream)?;
        raw.rows.validate("logits", raw.rows.min_len())?;
        check_ptr("logits", raw.logits, raw.dtype.size() as u64)?;
        check_ptr("temperature", raw.temperature, 4)?;
        check_ptr("seed", raw.seed, 8)?;
        check_ptr("offset", raw.offset, 8)?;
        check_ptr("tokens", raw.tokens, 4)?;
        check_ptr("valid", raw.valid, 1)?;
        let split = split_for_batch(&raw.rows, self.sm_count());
        ws.fit(stream, &split, 0)?;
        let k = self.kernels();
        let seeded = sampling_seeded(split.chunk, raw.dtype.size() as u32);
        let func = match (raw.dtype, seeded, sampling_wide(&split, self.sm_count())) {
            (DType::F32, false, _) => &k.sampling_f32,
            (DType::Bf16, false, _) => &k.sampling_bf16,
            (DType::F32, true, false) => &k.sampling_seeded_f32,
            (DType::Bf16, true, false) => &k.sampling_seeded_bf16,
            (DType::F32, true, true) => &k.sampling_wide_f32,
            (DType::Bf16, true, true) => &k.sampling_wide_bf16,
        };
        let (m, _g1) = ws.keys.device_ptr_mut(stream);
        let (c, _g2) = ws.counters.device_ptr_mut(stream);
        let mut args = [
            kernel_arg(&raw.logits),
            kernel_arg(&raw.temperature),
            kernel_arg(&raw.seed),
            kernel_arg(&raw.offset),
            kernel_arg(&raw.tokens),
            kernel_arg(&raw.valid),
            kernel_arg(&m),
            kernel_arg(&c),
            // `RowSplit` is `#[repr(C)]` and passed by value.
            kernel_arg(&split),
        ];
        // SAFETY: the argument list matches `sampling_from_logits_*`'s
        // signature; the caller guarantees the buffers (validated sizes and
        // alignment above); the workspace holds batch zeroed maxima and
        // tickets; ctas_per_row <= ROW_THREADS by the split. The kernels
        // wait in `griddepcontrol.wait` before any read, so they may start
        // while the stream's previous kernel drains.
        unsafe {
            self.launch_pass(
                stream,
                func,
                sampling_launch(&split, seeded),
                true,
                &mut args,
            )
        }?;
        Ok(())
    }

    /// Probabilities `softmax(x / T)` of f32 logits, written to `probs`
    /// (same shape). Greedy rows are one-hot at the argmax; +inf entries
    /// share the mass evenly; NaN and -inf get 0; a row with nothing valid is
    /// all zeros. Each row's bits depend only on the row and its temperature.
    pub fn softmax(
        &self,
        stream: &Arc<CudaStream>,
        logits: &CudaView<'_, f32>,
        rows: Rows,
        temperature: &CudaView<'_, f32>,
        probs: &mut CudaViewMut<'_, f32>,
        ws: &mut Workspace,
    ) -> Result<()> {
        self.check_stream(stream)?;
        rows.validate("logits", logits.len())?;
        rows.validate("probs", probs.len())?;
        if temperature.len() < rows.batch {
            return Err(shape(
                "temperature",
                format!("at least {}", rows.batch),
                temperature.len(),
            ));
        }
        let split = split_for_vocab(&rows);
        ws.fit(stream, &split, 3)?;
        let k = self.kernels();
        let (l, _g1) = logits.device_ptr(stream);
        let (t, _g2) = temperature.device_ptr(stream);
        let (p, _g3) = probs.device_ptr_mut(stream);
        let (st, _g4) = ws.partial.device_ptr_mut(stream);
        let arg = SplitArg(split);
        let cfg = row_launch(&split);
        let mut b = stream.launch_builder(&k.softmax_stats_f32);
        b.arg(&l).arg(&t).arg(&st).arg(&arg);
        // SAFETY: matches `softmax_stats_f32`; sizes validated above; the
        // workspace holds 3 words per block.
        unsafe { b.launch(cfg) }?;
        let mut b = stream.launch_builder(&k.softmax_write_f32);
        b.arg(&l).arg(&t).arg(&st).arg(&p).arg(&arg);
        // SAFETY: matches `softmax_write_f32`; `probs` validated like logits.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The largest error of the kernels' approximate Gumbel noise against the
    /// exact noise, over all 2^32 random words (a diagnostic: the samplers'
    /// candidate filter is exact only while this stays below
    /// [`flashsample_kernels::noise::GUMBEL_APPROX_ERR`]).
    pub fn gumbel_filter_max_error(&self, stream: &Arc<CudaStream>) -> Result<f32> {
        self.check_stream(stream)?;
        let mut out = stream.alloc_zeros::<u32>(1)?;
        let blocks = 8 * self.sm_count();
        // Two launches of 2^31 words each (the count argument is a u32).
        for first in [0u32, 1 << 31] {
            let count = 1u32 << 31;
            let mut b = stream.launch_builder(&self.kernels().gumbel_probe);
            b.arg(&mut out).arg(&first).arg(&count);
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches `gumbel_filter_error_probe`; `out` is one u32.
            unsafe { b.launch(cfg) }?;
        }
        let bits = stream.clone_dtoh(&out)?;
        Ok(f32::from_bits(bits[0]))
    }

    /// Reads `data` once from device memory (a bench diagnostic: the time of
    /// this launch is the read floor of a memory-bound kernel). `data.len()`
    /// must be a multiple of 4 words (16 bytes).
    pub fn read_once(
        &self,
        stream: &Arc<CudaStream>,
        data: &CudaView<'_, u32>,
        ws: &mut Workspace,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if data.len() % 4 != 0 || data.is_empty() {
            return Err(shape("data", "a non-empty multiple of 4 words", data.len()));
        }
        let blocks = 8 * self.sm_count();
        ws.reserve(stream, blocks as usize, 1)?;
        let (d, _g) = data.device_ptr(stream);
        check_ptr("data", d, 16)?;
        let (out, _g2) = ws.partial.device_ptr_mut(stream);
        let n = (data.len() / 4) as u64;
        let mut b = stream.launch_builder(&self.kernels().read_probe);
        b.arg(&d).arg(&n).arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `read_bandwidth_probe`; `data` holds n 16-byte
        // aligned words (checked); the workspace holds a word per block.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{Rows, split_for_batch};

    /// Small and middle batches take the wide kernels (grids of one wave of
    /// the seeded kernels: every batch up to four rows a multiprocessor,
    /// whatever the vocabulary), large ones the seeded kernels.
    #[test]
    fn wide_kernels_take_one_wave_grids() {
        for sm in [108u32, 132, 144] {
            let one_wave = SAMPLING_BLOCKS_PER_SM as usize * sm as usize;
            for vocab in [32_000usize, 128_256, 262_144] {
                for batch in [1usize, 8, 32, 128, 256, 512, 600, 1024] {
                    let split = split_for_batch(&Rows::contiguous(batch, vocab), sm);
                    assert_eq!(
                        sampling_wide(&split, sm),
                        batch <= one_wave,
                        "{sm} SMs, V = {vocab}, B = {batch}: {split:?}"
                    );
                }
            }
        }
    }
}
