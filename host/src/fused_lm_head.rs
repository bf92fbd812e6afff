//! `fused_sample`: LM-head matmul and Gumbel-max sampling in one pass
//! (FlashSampling); the `[batch, vocab]` logits are never written.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, ValidAsZeroBits,
};
use flashsample_kernels::params::{
    FUSED_BLOCK_V, FUSED_MAX_STRIDE, FUSED_PARTIAL_WORDS, FUSED_WS_THREADS, FusedParams, TensorMap,
    fused_blocks_per_sm, fused_mtiles, fused_smem_bytes, fused_threads, fused_ws,
    fused_ws_smem_bytes, fused_ws_step_tiles,
};
use flashsample_kernels::sample::MAX_VOCAB;

use crate::device::{Device, SmemPerSm, kernel_arg};
use crate::error::{Error, Result, param, shape};
use crate::rows::RowParams;
use crate::sampling::Workspace;

/// Element types of LM heads and hidden states (sealed: bf16 and f16).
pub trait HeadElem: crate::sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + 'static {
    /// Whether the kernels read it as bf16 (else f16).
    const IS_BF16: bool;
}

impl HeadElem for half::bf16 {
    const IS_BF16: bool = true;
}

impl HeadElem for half::f16 {
    const IS_BF16: bool = false;
}

/// Shape of a fused LM-head call: `hidden [batch, dim]` (rows
/// `hidden_stride` elements apart) against `lm_head [vocab, dim]`; `dim`
/// and `hidden_stride` are multiples of 8 of at most 2^23 elements
/// ([`HeadShape::validate`]), `vocab` at most 2^30.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub batch: usize,
    pub vocab: usize,
    pub dim: usize,
    pub hidden_stride: usize,
}

impl HeadShape {
    /// Contiguous hidden states.
    pub fn new(batch: usize, vocab: usize, dim: usize) -> HeadShape {
        HeadShape {
            batch,
            vocab,
            dim,
            hidden_stride: dim,
        }
    }

    /// Rejects inconsistent shapes and buffers shorter than the shape needs
    /// (hidden states, LM head, optional bias): the check every fused launch
    /// makes first.
    pub fn validate(
        &self,
        hidden_len: usize,
        head_len: usize,
        bias_len: Option<usize>,
    ) -> Result<()> {
        if self.batch == 0 || self.batch > (u32::MAX / 2) as usize {
            return Err(param("batch", self.batch));
        }
        if self.vocab == 0 || self.vocab as u64 > MAX_VOCAB {
            return Err(param("vocab", self.vocab));
        }
        if self.dim == 0 || !self.dim.is_multiple_of(8) || self.dim > FUSED_MAX_STRIDE as usize {
            return Err(param(
                "dim",
                format_args!("{} (a positive multiple of 8, at most 2^24)", self.dim),
            ));
        }
        if self.hidden_stride < self.dim
            || !self.hidden_stride.is_multiple_of(8)
            || self.hidden_stride > FUSED_MAX_STRIDE as usize
        {
            return Err(param("hidden_stride", self.hidden_stride));
        }
        let need_h = (self.batch - 1)
            .checked_mul(self.hidden_stride)
            .and_then(|n| n.checked_add(self.dim))
            .ok_or_else(|| param("hidden_stride", self.hidden_stride))?;
        if hidden_len < need_h {
            return Err(shape(
                "hidden",
                format!("at least {need_h} elements"),
                hidden_len,
            ));
        }
        let need_w = self
            .vocab
            .checked_mul(self.dim)
            .ok_or_else(|| param("vocab", self.vocab))?;
        if head_len < need_w {
            return Err(shape(
                "lm_head",
                format!("at least {need_w} elements"),
                head_len,
            ));
        }
        if let Some(b) = bias_len
            && b < self.vocab
        {
            return Err(shape(
                "bias",
                format!("at least {} elements", self.vocab),
                b,
            ));
        }
        Ok(())
    }
}

/// The operands of a fused call on one device: hidden states `[batch, dim]`,
/// LM-head rows `[vocab, dim]` (the whole head, or a tensor-parallel
/// shard's rows), the optional bias of those rows, and the per-row
/// temperature, seed and offset (device memory).
#[derive(Debug, Clone, Copy)]
pub struct HeadInput<'a, T> {
    /// `[batch, dim]`, rows `hidden_stride` elements apart.
    pub hidden: &'a CudaView<'a, T>,
    /// `[vocab, dim]` row-major (`nn.Linear`'s weight, or a shard's rows).
    pub lm_head: &'a CudaView<'a, T>,
    /// `[vocab]` f32 added to the logits, if any.
    pub bias: Option<&'a CudaView<'a, f32>>,
    /// Per-row temperature, seed and offset.
    pub params: &'a RowParams,
}

/// Where one launch of the fused kernel sits in the full vocabulary and in
/// a row's partials: LM-head rows `[offset, offset + vocab)`, covering
/// `tiles` tiles of the full vocabulary's grid, whose partials are the
/// row's parts `[part_offset, part_offset + tiles)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shard {
    pub offset: usize,
    pub vocab: usize,
    pub tiles: usize,
    pub part_offset: usize,
}

impl Shard {
    /// Rows `[offset, offset + vocab)`, partials from part `part_offset`.
    pub fn new(offset: usize, vocab: usize, part_offset: usize) -> Shard {
        let block = FUSED_BLOCK_V as usize;
        Shard {
            offset,
            vocab,
            tiles: (offset + vocab).div_ceil(block) - offset / block,
            part_offset,
        }
    }

    /// The kernel parameters of this shard's launch for `shape` (whose
    /// `vocab` is the shard's), in a buffer of `parts` parts per row,
    /// writing to `peers` peer buffers too.
    pub fn params(
        &self,
        shape: &HeadShape,
        has_bias: bool,
        parts: usize,
        peers: usize,
    ) -> FusedParams {
        FusedParams {
            batch: shape.batch as u32,
            vocab: self.vocab as u32,
            dim: shape.dim as u32,
            tiles: self.tiles as u32,
            hidden_stride: shape.hidden_stride as u64,
            has_bias: u32::from(has_bias),
            vocab_offset: self.offset as u32,
            part_offset: self.part_offset as u32,
            parts: parts as u32,
            peers: peers as u32,
            reserved: 0,
        }
    }
}

/// Which of the `of` fused launches that share a device at once (simulated
/// or co-located shards) a launch is: it gets its share of the device's
/// resident blocks, the first `resident % of` launches one more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub index: u32,
    pub of: u32,
}

impl Slot {
    /// The only launch on its device.
    pub const ALONE: Slot = Slot { index: 0, of: 1 };

    /// This launch's share of `resident` blocks (at least 1).
    fn blocks(self, resident: u32) -> u32 {
        let of = u64::from(self.of.max(1));
        let i = u64::from(self.index).min(of - 1);
        let r = u64::from(resident);
        ((r * (i + 1) / of - r * i / of) as u32).max(1)
    }
}

/// CTAs along the vocabulary for `steps` steps on at most `slots` CTAs:
/// the fewest rounds (`ceil(steps / slots)`), and as few CTAs as keep that
/// many, so that every CTA takes the same number of steps to within one.
/// Measured on the H200 (B = 1, 264 slots): 1187 tiles on 238 CTAs (5 each)
/// take 5 % less time than on 264 (4 or 5), 1002 on 251 (4 each) 2 % less
/// than on 264 (3 or 4); a last round with half the CTAs streams at about
/// half the rate, so it costs a whole round.
fn balanced_ctas(steps: u32, slots: u32) -> u32 {
    let steps = steps.max(1);
    let rounds = steps.div_ceil(slots.max(1));
    steps.div_ceil(rounds)
}

/// u64 words of the partials of `batch` rows of `parts` parts each.
pub(crate) fn partial_words(batch: usize, parts: usize) -> usize {
    batch * parts * FUSED_PARTIAL_WORDS as usize
}

/// Outputs of [`Device::fused_sample`], one entry per row: the token, its
/// validity, the row's log-normaliser `ln sum_j exp(logit_j / T)` (T = 1 for
/// greedy rows) and the token's log-probability under that distribution.
#[derive(Debug)]
pub struct FusedOutput {
    pub tokens: CudaSlice<u32>,
    pub valid: CudaSlice<u8>,
    pub log_normalizer: CudaSlice<f32>,
    pub logprob: CudaSlice<f32>,
}

impl FusedOutput {
    /// Output buffers for `batch` rows.
    pub fn new(stream: &Arc<CudaStream>, batch: usize) -> Result<FusedOutput> {
        Ok(FusedOutput {
            tokens: stream.alloc_zeros(batch)?,
            valid: stream.alloc_zeros(batch)?,
            log_normalizer: stream.alloc_zeros(batch)?,
            logprob: stream.alloc_zeros(batch)?,
        })
    }

    /// Rejects buffers shorter than `batch` rows or of another context.
    pub(crate) fn check(&self, batch: usize, ctx: &Arc<CudaContext>) -> Result<()> {
        for (what, c) in [
            ("tokens", self.tokens.context()),
            ("valid", self.valid.context()),
            ("log_normalizer", self.log_normalizer.context()),
            ("logprob", self.logprob.context()),
        ] {
            if !Arc::ptr_eq(c, ctx) {
                return Err(Error::WrongContext { what });
            }
        }
        for (what, len) in [
            ("tokens", self.tokens.len()),
            ("valid", self.valid.len()),
            ("log_normalizer", self.log_normalizer.len()),
            ("logprob", self.logprob.len()),
        ] {
            if len < batch {
                return Err(shape(what, format!("at least {batch}"), len));
            }
        }
        Ok(())
    }
}

/// The batch tiles of the fused kernels, in the order of
/// `Kernels::fused_bf16` / `fused_f16` (`fused_sample_*_b{rows}`).
pub(crate) const FUSED_BATCH_TILES: [u32; 4] = [16, 32, 64, 128];

/// The batch tile for a batch in module `arch`, as an index into
/// [`FUSED_BATCH_TILES`]: the smallest tile that holds it (128 rows for
/// larger batches, tiled), and on sm_90a at least the warp-specialised
/// 64-row tile. There the 64-row kernel's bulk tensor copies stream the LM
/// head faster than the 16- and 32-row kernels' `cp.async` pipelines, though
/// most of its rows are empty (H100, session 44: 1 to 6 % faster at B = 1
/// to 32 on three heads).
fn batch_tile(batch: usize, arch: &str) -> usize {
    let rows = if tile_ws(arch, 64) {
        batch.max(64)
    } else {
        batch
    };
    FUSED_BATCH_TILES
        .iter()
        .position(|&b| rows <= b as usize)
        .unwrap_or(FUSED_BATCH_TILES.len() - 1)
}

/// How the fused kernel for a batch tile of `nb` rows runs in a module:
/// threads, dynamic shared memory and resident blocks per SM (what its
/// launch bounds fit the registers to, fewer if the multiprocessor's shared
/// memory says so: one on an A100's 164 KiB for the 16- and 32-row tiles,
/// two on Hopper's 228 KiB).
/// On sm_90a the 64- and 128-row kernels are warp-specialised (one block
/// of the consumers and a producer warpgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TileLaunch {
    threads: u32,
    smem: u32,
    blocks_per_sm: u32,
    /// Warp-specialised: takes the hidden states and the LM head as tensor
    /// maps.
    ws: bool,
}

/// Whether module `arch`'s kernel for a batch tile of `nb` rows is the
/// warp-specialised one.
fn tile_ws(arch: &str, nb: u32) -> bool {
    arch == "sm_90a" && fused_ws(nb)
}

/// Dynamic shared memory of module `arch`'s kernel for a batch tile of `nb`
/// rows.
fn tile_smem(arch: &str, nb: u32) -> u32 {
    if tile_ws(arch, nb) {
        fused_ws_smem_bytes(nb)
    } else {
        fused_smem_bytes(nb)
    }
}

impl TileLaunch {
    fn new(arch: &str, nb: u32, smem: SmemPerSm) -> TileLaunch {
        if tile_ws(arch, nb) {
            TileLaunch {
                threads: FUSED_WS_THREADS,
                smem: tile_smem(arch, nb),
                blocks_per_sm: 1,
                ws: true,
            }
        } else {
            TileLaunch {
                threads: fused_threads(nb),
                smem: tile_smem(arch, nb),
                blocks_per_sm: smem
                    .blocks(fused_smem_bytes(nb))
                    .clamp(1, fused_blocks_per_sm(nb)),
                ws: false,
            }
        }
    }
}

/// Kernel-argument wrapper of a [`TensorMap`] (passed by value).
#[repr(transparent)]
#[derive(Clone, Copy)]
struct TensorMapArg(TensorMap);

// SAFETY: 128 bytes of plain data, which the warp-specialised kernels take
// by value (the driver copies them into parameter space).
unsafe impl DeviceRepr for TensorMapArg {}

const _: () = assert!(std::mem::size_of::<TensorMapArg>() == 128);

/// The tensor map of `rows` rows of `cols` elements of `T`, `stride`
/// elements apart, at device address `ptr`, read in boxes of 64 columns
/// (128 bytes, the 128-byte swizzle of the kernels' stages) by `box_rows`
/// rows; elements outside the tensor read as zero.
fn tensor_map_2d<T: HeadElem>(
    ptr: CUdeviceptr,
    cols: usize,
    rows: usize,
    stride: usize,
    box_rows: u32,
) -> Result<TensorMapArg> {
    use cudarc::driver::sys::{
        CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
        CUtensorMapL2promotion, CUtensorMapSwizzle,
    };
    let dtype = if T::IS_BF16 {
        CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    } else {
        CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    };
    let dims = [cols as u64, rows as u64];
    let strides = [(stride * std::mem::size_of::<T>()) as u64];
    let boxes = [64u32, box_rows];
    let steps = [1u32, 1];
    let mut map = std::mem::MaybeUninit::<cudarc::driver::sys::CUtensorMap>::zeroed();
    // SAFETY: every array holds the rank's entries (the stride array one
    // fewer); the map is written by the call. The address, dimensions and
    // strides were validated by the caller (16-byte aligned, strides
    // multiples of 16 bytes, sizes below 2^32).
    unsafe {
        cudarc::driver::sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?;
        Ok(TensorMapArg(TensorMap(map.assume_init().opaque)))
    }
}

fn check_align(name: &'static str, p: u64) -> Result<()> {
    if p == 0 || !p.is_multiple_of(16) {
        return Err(param(
            name,
            format_args!("{p:#x} (needs a non-null 16-byte aligned address)"),
        ));
    }
    Ok(())
}

impl Device {
    /// Samples one token per row of `hidden` from `softmax(hidden . lm_head^T
    /// (+ bias)) / T` by Gumbel-max, without writing the logits: the
    /// FlashSampling kernel (tensor-core matmul, Gumbel-max epilogue at the
    /// global vocabulary index, per-tile partials, one finishing launch).
    /// `lm_head` is the row-major `nn.Linear` weight `[vocab, dim]`; per-row
    /// temperature, seed and offset come from `params` (device memory).
    /// Tokens are those of the float64 reference except where two perturbed
    /// logits are within the f32 accumulation bound, and do not depend on
    /// batch size, row position or launch shape.
    #[allow(clippy::too_many_arguments)]
    pub fn fused_sample<T: HeadElem>(
        &self,
        stream: &Arc<CudaStream>,
        hidden: &CudaView<'_, T>,
        lm_head: &CudaView<'_, T>,
        bias: Option<&CudaView<'_, f32>>,
        shape: HeadShape,
        params: &RowParams,
        out: &mut FusedOutput,
        ws: &mut Workspace,
    ) -> Result<()> {
        let input = HeadInput {
            hidden,
            lm_head,
            bias,
            params,
        };
        self.check_stream(stream)?;
        self.check_head_input(stream, &input, &shape)?;
        out.check(shape.batch, self.context())?;
        let whole = Shard::new(0, shape.vocab, 0);
        let p = whole.params(&shape, bias.is_some(), whole.tiles, 0);
        ws.reserve(stream, partial_words(shape.batch, whole.tiles), 1)?;
        let (part, _g) = ws.partial_mut().device_ptr_mut(stream);
        // One device, one stream: both launches may start while the
        // kernel before them drains (each waits for it before any access).
        self.launch_fused_tiles(stream, &input, &p, part, 0, Slot::ALONE, true)?;
        self.launch_fused_finish(stream, part, &p, out, true)
    }

    /// Rejects an input whose shape (`shape.vocab`: the rows it holds),
    /// buffers, parameters or alignment do not fit: the checks every fused
    /// launch makes before any launch.
    pub(crate) fn check_head_input<T: HeadElem>(
        &self,
        stream: &Arc<CudaStream>,
        input: &HeadInput<'_, T>,
        shape: &HeadShape,
    ) -> Result<()> {
        shape.validate(
            input.hidden.len(),
            input.lm_head.len(),
            input.bias.map(|b| b.len()),
        )?;
        input.params.check(shape.batch)?;
        for (what, c) in [
            ("temperature", input.params.temperature.context()),
            ("seed", input.params.seed.context()),
            ("offset", input.params.offset.context()),
        ] {
            if !Arc::ptr_eq(c, self.context()) {
                return Err(Error::WrongContext { what });
            }
        }
        let (h, _g1) = input.hidden.device_ptr(stream);
        let (w, _g2) = input.lm_head.device_ptr(stream);
        check_align("hidden", h)?;
        check_align("lm_head", w)
    }

    /// Launches `fused_sample_*` for `input` on `stream` with parameters
    /// `p`, writing the partials to `partial` (and to the `p.peers` buffers
    /// whose addresses `peer_table` holds), its grid sized for its `slot`
    /// among the launches running on the device at once; with `dependent`,
    /// through a programmatic dependency on the stream's previous kernel
    /// ([`Device::launch_pass`]).
    ///
    /// The caller has checked `input` ([`Device::check_head_input`] with
    /// `p`'s shape) and sized every partial buffer for `p`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_fused_tiles<T: HeadElem>(
        &self,
        stream: &Arc<CudaStream>,
        input: &HeadInput<'_, T>,
        p: &FusedParams,
        partial: CUdeviceptr,
        peer_table: CUdeviceptr,
        slot: Slot,
        dependent: bool,
    ) -> Result<()> {
        let batch = p.batch as usize;
        let (h, _g1) = input.hidden.device_ptr(stream);
        let (w, _g2) = input.lm_head.device_ptr(stream);
        let (b, _g3) = match input.bias {
            Some(b) => {
                let (p, g) = b.device_ptr(stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let tile = batch_tile(batch, self.arch());
        let nb = FUSED_BATCH_TILES[tile];
        let k = self.kernels();
        let funcs = if T::IS_BF16 {
            &k.fused_bf16
        } else {
            &k.fused_f16
        };
        let func = &funcs[tile];
        let tl = TileLaunch::new(self.arch(), nb, self.smem_per_sm());
        let batch_tiles = batch.div_ceil(nb as usize) as u32;
        let resident = tl.blocks_per_sm * self.sm_count();
        // CTAs along the vocabulary, each looping over steps of
        // `step_tiles` tiles.
        let step_tiles = if tl.ws {
            fused_ws_step_tiles(nb)
        } else {
            fused_mtiles(nb)
        };
        let steps = p.tiles.div_ceil(step_tiles);
        let ctas_v = balanced_ctas(steps, slot.blocks(resident) / batch_tiles);
        let params = input.params;
        let (t, _g4) = params.temperature.device_ptr(stream);
        let (s, _g5) = params.seed.device_ptr(stream);
        let (o, _g6) = params.offset.device_ptr(stream);
        // The warp-specialised kernels read the hidden states (boxes of the
        // batch tile's rows) and the launch's LM-head rows (boxes of a
        // step's tiles) through tensor maps.
        let maps = if tl.ws {
            let dim = p.dim as usize;
            Some((
                tensor_map_2d::<T>(h, dim, batch, p.hidden_stride as usize, nb)?,
                tensor_map_2d::<T>(w, dim, p.vocab as usize, dim, step_tiles * FUSED_BLOCK_V)?,
            ))
        } else {
            None
        };
        let (head_arg, weight_arg) = match &maps {
            Some((hm, wm)) => (kernel_arg(hm), kernel_arg(wm)),
            None => (kernel_arg(&h), kernel_arg(&w)),
        };
        let mut args = [
            head_arg,
            weight_arg,
            kernel_arg(&b),
            kernel_arg(&t),
            kernel_arg(&s),
            kernel_arg(&o),
            kernel_arg(&partial),
            kernel_arg(&peer_table),
            kernel_arg(p),
        ];
        let cfg = LaunchConfig {
            grid_dim: (batch_tiles, ctas_v, 1),
            block_dim: (tl.threads, 1, 1),
            shared_mem_bytes: tl.smem,
        };
        // SAFETY: the arguments match `fused_sample_*`'s signature in this
        // module (tensor maps of the same buffers for the warp-specialised
        // kernels); shapes, lengths and 16-byte alignment were validated
        // (dim and the hidden stride are multiples of 8 elements; the LM
        // head and bias hold the launch's `vocab` rows); `partial` and the
        // `peers` buffers listed in `peer_table` hold batch * parts
        // partials and are mapped into this context (the caller's
        // contract); the function's dynamic shared memory limit was raised
        // to tl.smem when the module was loaded. The kernels wait in
        // `griddepcontrol.wait` before any access (`dependent`).
        unsafe { self.launch_pass(stream, func, cfg, dependent, &mut args) }?;
        Ok(())
    }

    /// Launches `fused_sample_finish` on `stream`: folds the `p.parts`
    /// partials of each row in `partial` into `out` (with `dependent`, as
    /// [`Device::launch_fused_tiles`]).
    ///
    /// The caller has checked `out` for `p.batch` rows and ordered the
    /// launches that wrote every part before this one.
    pub(crate) fn launch_fused_finish(
        &self,
        stream: &Arc<CudaStream>,
        partial: CUdeviceptr,
        p: &FusedParams,
        out: &mut FusedOutput,
        dependent: bool,
    ) -> Result<()> {
        let (tok, _g1) = out.tokens.device_ptr_mut(stream);
        let (val, _g2) = out.valid.device_ptr_mut(stream);
        let (lse, _g3) = out.log_normalizer.device_ptr_mut(stream);
        let (lp, _g4) = out.logprob.device_ptr_mut(stream);
        let mut args = [
            kernel_arg(&partial),
            kernel_arg(&tok),
            kernel_arg(&val),
            kernel_arg(&lse),
            kernel_arg(&lp),
            kernel_arg(p),
        ];
        let cfg = LaunchConfig {
            grid_dim: (p.batch, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 8 * FUSED_PARTIAL_WORDS * 8,
        };
        // SAFETY: matches `fused_sample_finish`; `partial` holds batch *
        // parts partials, all written by launches ordered before this one
        // (the caller's contract); outputs hold batch rows.
        unsafe {
            self.launch_pass(
                stream,
                &self.kernels().fused_finish,
                cfg,
                dependent,
                &mut args,
            )
        }?;
        Ok(())
    }
}

/// Raises the dynamic shared memory limit of the fused kernels (they use
/// more than the default 48 KiB).
pub(crate) fn configure(
    arch: &str,
    bf16: &[cudarc::driver::CudaFunction; FUSED_BATCH_TILES.len()],
    f16: &[cudarc::driver::CudaFunction; FUSED_BATCH_TILES.len()],
) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM;
    for (i, nb) in FUSED_BATCH_TILES.into_iter().enumerate() {
        let smem = tile_smem(arch, nb) as i32;
        bf16[i].set_attribute(MAX_SMEM, smem)?;
        f16[i].set_attribute(MAX_SMEM, smem)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_grids_take_equal_rounds() {
        // The measured cases: 1187 and 1002 tiles on 264 slots.
        assert_eq!(balanced_ctas(1187, 264), 238);
        assert_eq!(balanced_ctas(1002, 264), 251);
        assert_eq!(balanced_ctas(2048, 264), 256);
        for steps in 1..3000u32 {
            for slots in [1u32, 16, 66, 132, 264] {
                let c = balanced_ctas(steps, slots);
                assert!(c >= 1 && c <= slots.min(steps), "{steps} {slots} {c}");
                // The same number of rounds as on every slot.
                assert_eq!(steps.div_ceil(c), steps.div_ceil(slots), "{steps} {slots}");
            }
        }
    }

    #[test]
    fn slots_split_the_resident_blocks() {
        assert_eq!(Slot::ALONE.blocks(132), 132);
        for of in 1..=9u32 {
            let shares: Vec<u32> = (0..of)
                .map(|index| Slot { index, of }.blocks(132))
                .collect();
            assert_eq!(shares.iter().sum::<u32>(), 132, "{of}: {shares:?}");
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(hi - lo <= 1, "{of}: {shares:?}");
        }
        // More launches than blocks: each still gets one.
        assert_eq!(Slot { index: 3, of: 8 }.blocks(4), 1);
    }

    #[test]
    fn shapes_are_validated() {
        let s = HeadShape::new(2, 10, 16);
        assert!(s.validate(32, 160, None).is_ok());
        assert!(s.validate(31, 160, None).is_err());
        assert!(s.validate(32, 159, None).is_err());
        assert!(s.validate(32, 160, Some(9)).is_err());
        assert!(
            HeadShape::new(2, 10, 12).validate(100, 1000, None).is_err(),
            "dim % 8"
        );
        assert!(HeadShape::new(0, 10, 16).validate(100, 1000, None).is_err());
        assert!(
            HeadShape {
                hidden_stride: 20,
                ..s
            }
            .validate(100, 1000, None)
            .is_err()
        );
        assert!(
            HeadShape::new(1, (1 << 30) + 1, 8)
                .validate(8, usize::MAX, None)
                .is_err()
        );
    }

    #[test]
    fn tiles_fit_shared_memory() {
        // H100 / H200 and A100 multiprocessors (the driver's attributes).
        let hopper = SmemPerSm {
            total: 228 * 1024,
            reserved_per_block: 1024,
        };
        let a100 = SmemPerSm {
            total: 164 * 1024,
            reserved_per_block: 1024,
        };
        for arch in ["sm_80", "sm_90", "sm_90a"] {
            for nb in FUSED_BATCH_TILES {
                let tl = TileLaunch::new(arch, nb, hopper);
                assert!(tl.smem <= 227 * 1024);
                assert!(tl.blocks_per_sm >= 1);
                assert_eq!(tl.ws, arch == "sm_90a" && nb >= 64);
                assert_eq!(tile_smem(arch, nb), tl.smem);
            }
        }
        for nb in [16, 32] {
            assert_eq!(TileLaunch::new("sm_90a", nb, hopper).blocks_per_sm, 2);
            assert_eq!(TileLaunch::new("sm_80", nb, a100).blocks_per_sm, 1);
        }
        assert_eq!(TileLaunch::new("sm_90", 128, hopper).blocks_per_sm, 1);
        assert_eq!(
            TileLaunch::new("sm_90a", 128, hopper).threads,
            FUSED_WS_THREADS
        );
        for arch in ["sm_80", "sm_89", "sm_90"] {
            let rows = |b| FUSED_BATCH_TILES[batch_tile(b, arch)];
            assert_eq!(rows(1), 16);
            assert_eq!(rows(17), 32);
            assert_eq!(rows(64), 64);
            assert_eq!(rows(65), 128);
            assert_eq!(rows(256), 128);
        }
        let rows = |b| FUSED_BATCH_TILES[batch_tile(b, "sm_90a")];
        assert_eq!(rows(1), 64);
        assert_eq!(rows(32), 64);
        assert_eq!(rows(64), 64);
        assert_eq!(rows(65), 128);
    }
}
