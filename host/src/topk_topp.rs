//! `topk_topp`: exact top-k / top-p / min-p truncation of f32 logits on the
//! GPU (Qrita pivot search, issue 4): masking in place, the probabilities
//! renormalised over the kept set, the kept set as (count, indices), and
//! sampling from the truncated distribution.
//!
//! A row is spread over `ceil(V / 8192)` blocks for the passes that touch
//! every element (statistics; the pre-filter, which lists the candidates
//! in the workspace; the masking writes), and one block per row runs the
//! pivot rounds over the listed candidates (over the row when they do not
//! fit). See the kernels' module docs for the passes. Two routes
//! ([`TopkToppRoute`]): the passes as five launches over the whole GPU, or
//! (small batches, sm_90 on) in one launch of a thread block cluster per
//! row whose blocks share the row's chunks, with barriers over the cluster
//! between the passes.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, SyncOnDrop,
};
use flashsample_kernels::cover;
use flashsample_kernels::params::{
    CONVERT_PER_THREAD, CONVERT_THREADS, ROW_THREADS, TOPK_TOPP_CHUNK_SMEM_BYTES,
    TOPK_TOPP_FILTER_BLOCKS_PER_SM, TOPK_TOPP_SMEM_BYTES, TopkToppLayout,
};
use flashsample_kernels::radix_select::SLAB;

use crate::device::{Device, kernel_arg, max_active_clusters};
use crate::error::{Result, param, shape};
use crate::radix_topk::{self, Finished, RadixCaps, Route, SelectTail};
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
    /// Whether some row's `top_k` lies in `cover::LOCAL_MAX_K + 1 ..=
    /// cover::SHARED_MAX_K` (257 to 4096), the k whose rows the listing
    /// passes cover by shares ([`plan_topk_topp_route`]). [`upload`] sets
    /// it; a caller that writes the buffers itself sets it from what it
    /// wrote (false plans as if every top-k were small or off: the same
    /// results, another route).
    ///
    /// [`upload`]: TruncParams::upload
    pub large_top_k: bool,
    /// A bound on every row's `top_k`: each lies in `1..=top_k_bound`, or
    /// 0 when nothing is known (some row's top-k off or unknown). With a
    /// bound of at most [`SLAB`] (1024) below the vocabulary, calls may take
    /// the radix route ([`TopkToppRoute::Radix`]), which finds the top-k by
    /// radix select: [`upload`] sets it; a caller that writes the buffers
    /// itself (a CUDA graph replayed with new parameters included) keeps it
    /// true of what it writes or sets 0. A row the radix route cannot serve
    /// (its top-k off or above 1024) comes out invalid (`valid = 0`, or
    /// `kept = 0` and every logit -inf), never truncated wrongly.
    ///
    /// [`upload`]: TruncParams::upload
    pub top_k_bound: u32,
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
        let large_top_k = top_k
            .iter()
            .any(|&k| cover::is_shared(k) && k <= cover::SHARED_MAX_K);
        let top_k_bound = if top_k.contains(&0) {
            0
        } else {
            top_k.iter().copied().max().unwrap_or(0)
        };
        Ok(TruncParams {
            large_top_k,
            top_k_bound,
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

/// Largest cluster of the cluster route: 16, Hopper's non-portable size.
pub const MAX_TOPK_TOPP_CLUSTER: u32 = 16;

/// How a truncation call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopkToppRoute {
    /// Five launches (statistics, plan, pre-filter, selection, masking
    /// writes), the chunked passes over the whole GPU (every GPU).
    Chunked,
    /// One launch, a thread block cluster of `ctas` blocks per row sharing
    /// its chunks; its first block selects (a cluster of one on any GPU,
    /// larger ones from sm_90 on).
    Cluster { ctas: u32 },
    /// The chunked passes whose statistics pass also lists each chunk's
    /// own top k (rows with top-k of at most `cover::LOCAL_MAX_K`), or its
    /// share of the row's top k (up to `cover::SHARED_MAX_K`): a row the
    /// lists cover skips the pre-filter pass, one read of its logits fewer,
    /// and its masking writes without reading (every GPU; the same results
    /// as [`Chunked`]). With `shares_only` only rows listed by shares list;
    /// the others take the plain passes' way through the same kernels.
    ///
    /// [`Chunked`]: TopkToppRoute::Chunked
    Listed { shares_only: bool },
    /// The rows' top-k by the radix select of `route` (a slab of at most
    /// [`SLAB`] entries per row in the workspace: the probability
    /// sampler's stage 1 over the logits, [`crate::Route`]), then one block
    /// per row cuts min-p and top-p from it and draws (sampling) or writes
    /// the cut (masking, then a block per chunk writes -inf outside the
    /// slab's kept prefix without reading the logits): calls whose
    /// [`TruncParams::top_k_bound`] is at most [`SLAB`] and below the
    /// vocabulary, on any radix route but [`Route::Cooperative`] and
    /// [`Route::Pivot`]. The same results as the other routes, bit for bit.
    Radix(Route),
}

/// Smallest batch the planner lists chunks for
/// ([`TopkToppRoute::Listed`]) on rows of at least
/// [`LISTED_MIN_CHUNKS`] chunks; shorter rows from
/// [`LISTED_MIN_BATCH_SHORT`]. Measured on the H200 (p = 0.9, against the
/// plain passes):
/// - session 20, B = 512 and 1024: k = 50 masking 8.5 to 11 % and sampling
///   8 to 17 % faster on Gaussian and bf16-quantised rows, 1 to 10 % and 4
///   to 12 % on real SmolLM2 rows; heavy-tailed rows 6 % faster at V =
///   32000 but 4 to 10 % slower from V = 151936 (their chunks rarely
///   list); k = 1000 (no lists) within -1 to +2.6 %;
/// - session 22, B = 128, V = 128256 to 262144: k = 50 masking 6.7 to 8.0
///   % and sampling 5 to 10 % faster on Gaussian and bf16-quantised rows,
///   heavy-tailed rows 1.5 to 8 % (masking) and 5 to 13 % (sampling)
///   slower, k = 1000 1 to 2 % slower; at V = 32000 Gaussian rows even,
///   heavy-tailed 7 % slower; at B = 32 the listing passes lose 4 to 12 %
///   everywhere (session 19: 3 to 26 % at B <= 32).
pub const LISTED_MIN_BATCH: usize = 128;

/// Smallest batch the planner lists chunks for on rows of fewer than
/// [`LISTED_MIN_CHUNKS`] chunks (see [`LISTED_MIN_BATCH`]).
pub const LISTED_MIN_BATCH_SHORT: usize = 512;

/// Chunks (of 8192 elements) a row needs to be listed from
/// [`LISTED_MIN_BATCH`] rows on: V = 65536 and more. Below that batch rows
/// of at least `cover::SHARED_MIN_VOCAB` (65536) list only their shares of
/// a larger top-k (`TopkToppRoute::Listed { shares_only: true }`), when the
/// call has one ([`TruncParams::large_top_k`]). Measured on the H200 (session 35, k =
/// 1000, p = 0.9, against the plain passes, B = 1, 8 and 32 at V = 151936
/// and 262144, B = 32 at 128256): masking real SmolLM2 rows 24 to 39 %
/// and sampling them 38 to 47 % faster, Gaussian and bf16-quantised rows 7
/// to 12 % slower at B = 1, 5 to 8 % at B = 8, within 2 % at B = 32,
/// heavy-tailed rows 1 to 9 % slower. Calls without such a top-k keep the
/// plain passes: listed without lists, their k = 50 rows took 2 to 12 %
/// longer.
pub const LISTED_MIN_CHUNKS: u32 = 8;

/// What the route planner knows of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopkToppCaps {
    /// Rows of the cluster route (clusters of `c` blocks, index `c`) the
    /// GPU runs at once; 0 where it runs no such cluster.
    pub cluster_slots: [u32; MAX_TOPK_TOPP_CLUSTER as usize + 1],
}

/// The route of a call of `rows` on a GPU with `caps`: a cluster per row,
/// a block for each of its chunks of 8192 elements, when a row has 2 to 16
/// chunks and the GPU runs every row's cluster at once; else the chunked
/// passes. Measured on the H200 (session 11, V = 128256, k = 50, p = 0.9):
/// the cluster route takes 30.3 us at B = 1 and 34.0 at B = 8 against 32.7
/// and 41.1 for the chunked passes, but 94 against 55 at B = 32, where its
/// clusters take two waves; with two chunks a block (V = 151936, 262144)
/// it lost at every batch. Chunked calls of at least [`LISTED_MIN_BATCH`]
/// rows of at least [`LISTED_MIN_CHUNKS`] chunks, or of at least
/// [`LISTED_MIN_BATCH_SHORT`] shorter rows, list chunks
/// ([`TopkToppRoute::Listed`]); smaller calls of rows of at least
/// `cover::SHARED_MIN_VOCAB` elements (the vocabularies whose chunks list
/// shares) list shares only where some row's top-k is large
/// (`large_top_k`, [`TruncParams::large_top_k`]).
///
/// ```
/// use flashsample::{Rows, TopkToppCaps, TopkToppRoute, plan_topk_topp_route};
///
/// let mut caps = TopkToppCaps { cluster_slots: [0; 17] };
/// caps.cluster_slots[16] = 16;
/// caps.cluster_slots[4] = 64;
/// let route = |b, v| plan_topk_topp_route(&Rows::contiguous(b, v), &caps, true);
/// assert_eq!(route(1, 128_256), TopkToppRoute::Cluster { ctas: 16 });
/// assert_eq!(route(32, 32_000), TopkToppRoute::Cluster { ctas: 4 });
/// let shares = TopkToppRoute::Listed { shares_only: true };
/// let all = TopkToppRoute::Listed { shares_only: false };
/// assert_eq!(route(32, 128_256), shares);
/// assert_eq!(route(1, 151_936), shares);
/// assert_eq!(route(1, 8192), TopkToppRoute::Chunked);
/// // Eight chunks, but below the vocabularies whose chunks list shares.
/// assert_eq!(route(32, 60_000), TopkToppRoute::Chunked);
/// assert_eq!(route(127, 128_256), shares);
/// assert_eq!(route(128, 128_256), all);
/// assert_eq!(route(128, 32_000), TopkToppRoute::Chunked);
/// assert_eq!(route(512, 32_000), all);
/// // Without a large top-k, the plain passes below 128 rows.
/// let small_k = plan_topk_topp_route(&Rows::contiguous(32, 128_256), &caps, false);
/// assert_eq!(small_k, TopkToppRoute::Chunked);
/// ```
pub fn plan_topk_topp_route(rows: &Rows, caps: &TopkToppCaps, large_top_k: bool) -> TopkToppRoute {
    let chunks = TopkToppLayout::new(1, rows.vocab.min(u32::MAX as usize) as u32).chunks;
    let slots = caps
        .cluster_slots
        .get(chunks as usize)
        .map_or(0, |&n| u64::from(n));
    if chunks >= 2 && rows.batch as u64 <= slots {
        TopkToppRoute::Cluster { ctas: chunks }
    } else if rows.batch >= LISTED_MIN_BATCH_SHORT
        || (rows.batch >= LISTED_MIN_BATCH && chunks >= LISTED_MIN_CHUNKS)
    {
        TopkToppRoute::Listed { shares_only: false }
    } else if large_top_k && rows.vocab >= cover::SHARED_MIN_VOCAB as usize {
        TopkToppRoute::Listed { shares_only: true }
    } else {
        TopkToppRoute::Chunked
    }
}

/// The radix route of a call of `rows` whose every row's top-k lies in
/// `1..=top_k_bound` ([`TruncParams::top_k_bound`]) on a GPU whose radix
/// planner knows `caps`: the radix planner's route for that top-k
/// ([`radix_topk::plan_route`]) when the bound is at most [`SLAB`] and
/// below the vocabulary and that route has logits kernels (not
/// [`Route::Cooperative`] nor [`Route::Pivot`]); else `None`, and the
/// call takes [`plan_topk_topp_route`]'s route.
///
/// ```
/// use flashsample::{RadixCaps, Route, Rows, plan_topk_topp_radix};
///
/// let h200 = RadixCaps {
///     sm_count: 132,
///     max_cluster: 8,
///     ctas_per_sm: 1,
///     cache_elems: 48_764,
///     cluster_slots: [0, 132, 66, 44, 33, 26, 22, 18, 16, 0, 0, 0, 0, 0, 0, 0, 0],
///     filter_ctas_per_sm: 1,
///     filter_cluster_slots: [0; 5],
/// };
/// let radix = |b, k| plan_topk_topp_radix(&Rows::contiguous(b, 128_256), k, &h200);
/// assert_eq!(radix(128, 50), Some(Route::Filter));
/// assert_eq!(radix(128, 1000), Some(Route::Filter));
/// // No bound (some row's top-k off), or one the slab cannot hold.
/// assert_eq!(radix(128, 0), None);
/// assert_eq!(radix(128, 2000), None);
/// ```
pub fn plan_topk_topp_radix(rows: &Rows, top_k_bound: u32, caps: &RadixCaps) -> Option<Route> {
    if top_k_bound == 0 || top_k_bound > SLAB || top_k_bound as usize >= rows.vocab {
        return None;
    }
    match radix_topk::plan_route(rows, top_k_bound, caps) {
        Route::Cooperative { .. } | Route::Pivot => None,
        route => Some(route),
    }
}

/// One block of [`ROW_THREADS`] per row (the selection kernels).
fn row_per_block(rows: &Rows) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.batch as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: TOPK_TOPP_SMEM_BYTES,
    }
}

/// `per_row` blocks of [`ROW_THREADS`] with `smem` bytes of dynamic shared
/// memory for every row: a block per chunk for the chunked passes, a
/// cluster per row for the cluster route.
fn blocks_per_row(rows: &Rows, per_row: u32, smem: u32) -> Result<LaunchConfig> {
    let blocks = rows.batch as u64 * u64::from(per_row);
    if blocks > i32::MAX as u64 {
        return Err(param("batch * blocks per row", blocks));
    }
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: smem,
    })
}

/// Chunks a block of the pre-filter pass takes on the listing route: `g`
/// (at most 4) when the blocks of `g` chunks still make `g` waves or more
/// ([`TOPK_TOPP_FILTER_BLOCKS_PER_SM`] blocks a multiprocessor), so that
/// rows the statistics pass's lists cover (whose blocks end at once) start
/// fewer blocks, while the other rows' chunks, run one after another in
/// their block, keep about the one-chunk grid's time (a partial last wave
/// weighs little among four or more).
fn filter_group(rows: &Rows, lay: &TopkToppLayout, sm_count: u32) -> u32 {
    let items = rows.batch as u64 * u64::from(lay.chunks);
    let resident = u64::from(TOPK_TOPP_FILTER_BLOCKS_PER_SM) * u64::from(sm_count.max(1));
    let mut g = 4;
    while g > 1 && items < g * g * resident {
        g -= 1;
    }
    g as u32
}

/// One block of [`ROW_THREADS`] per chunk of every row (the chunked
/// passes).
fn chunk_per_block(rows: &Rows, lay: &TopkToppLayout) -> Result<LaunchConfig> {
    blocks_per_row(rows, lay.chunks, TOPK_TOPP_CHUNK_SMEM_BYTES)
}

/// The 16-bit logit formats the truncation calls take (widened to f32 in
/// the workspace first; f32 logits are read in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
}

/// Element types of the logits the truncation calls take: f32 (read in
/// place, the fast path), bf16 and f16 (widened exactly into an f32 copy in
/// the workspace, about 4 more bytes a logit there; masking writes its
/// result back narrowed, exactly). Sealed: the kernels read exactly these.
pub trait TruncElem: crate::sealed::Sealed + DeviceRepr + Copy + 'static {
    /// `None` for f32, else the 16-bit format.
    const HALF: Option<Half>;
}

impl TruncElem for f32 {
    const HALF: Option<Half> = None;
}

impl TruncElem for half::bf16 {
    const HALF: Option<Half> = Some(Half::Bf16);
}

impl TruncElem for half::f16 {
    const HALF: Option<Half> = Some(Half::F16);
}

/// Where a call's widened copy of 16-bit logits lies: after the layout's
/// words, 16-byte aligned, rows a multiple of 4 elements apart (so the
/// kernels take their 16-byte loads): (first word, its rows).
fn wide_copy(lay: &TopkToppLayout, rows: &Rows) -> (usize, Rows) {
    let rows = Rows {
        row_stride: rows.vocab.next_multiple_of(4),
        ..*rows
    };
    (lay.words.next_multiple_of(2), rows)
}

/// The workspace layout of a call on `T` logits by `route`, with the
/// workspace grown to hold it (and the widened copy of 16-bit logits, and
/// the radix route's slab): the layout and the slab's first word (after
/// the rest; [`slab_ptrs`]).
fn fit_workspace<T: TruncElem>(
    stream: &Arc<CudaStream>,
    rows: &Rows,
    ws: &mut Workspace,
    route: TopkToppRoute,
) -> Result<(TopkToppLayout, usize)> {
    let lay = TopkToppLayout::new(rows.batch as u32, rows.vocab as u32);
    let mut words = if T::HALF.is_some() {
        let (at, wide) = wide_copy(&lay, rows);
        at + wide.min_len().div_ceil(2)
    } else {
        lay.words
    };
    let slab_at = words;
    if matches!(route, TopkToppRoute::Radix(_)) {
        // Values and indices, one word a pair, then the counts.
        words = slab_at + rows.batch * SLAB as usize + rows.batch.div_ceil(2);
    }
    ws.reserve(stream, words, 0)?;
    Ok((lay, slab_at))
}

/// The radix route's slab in the workspace `ws` from word `at`: `batch *
/// SLAB` values (f32), as many indices (u32), then `batch` counts (u32).
fn slab_ptrs(ws: u64, at: usize, batch: usize) -> [u64; 3] {
    let n = batch as u64 * u64::from(SLAB);
    let values = ws + 8 * at as u64;
    [values, values + 4 * n, values + 8 * n]
}

/// Launches a row copy (`widen_rows_*`, `narrow_rows_*`) of `rows.batch`
/// rows of `rows.vocab` elements from `src` (rows `rows.row_stride` apart)
/// to `dst` (rows `dst_stride` apart), after the stream's work before it.
///
/// # Safety
/// `func` is one of the row copies; `src` and `dst` are live device
/// buffers of the stream's context holding those rows in the kernel's
/// element types, not overlapping.
unsafe fn launch_copy_rows(
    dev: &Device,
    stream: &Arc<CudaStream>,
    func: &cudarc::driver::CudaFunction,
    src: u64,
    dst: u64,
    rows: &Rows,
    dst_stride: usize,
) -> Result<()> {
    let vocab = rows.vocab as u32;
    let (src_stride, dst_stride) = (rows.row_stride as u64, dst_stride as u64);
    let batch = rows.batch as u32;
    let cfg = LaunchConfig {
        grid_dim: (
            vocab.div_ceil(CONVERT_THREADS * CONVERT_PER_THREAD),
            batch.min(65_535),
            1,
        ),
        block_dim: (CONVERT_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut args = [
        kernel_arg(&src),
        kernel_arg(&dst),
        kernel_arg(&vocab),
        kernel_arg(&src_stride),
        kernel_arg(&dst_stride),
        kernel_arg(&batch),
    ];
    // SAFETY: the argument list matches the row copies' signature; the
    // buffers as the caller's contract says; the grid the kernels expect.
    // A plain launch: the copies do not wait for a previous pass.
    unsafe { dev.launch_pass(stream, func, cfg, false, &mut args) }
}

/// The f32 rows the kernels read for a call's logits at `logits`
/// (validated `rows` of `T`): the caller's own for f32; for 16-bit logits
/// their exact widening, launched here, into the workspace at `ws` (grown
/// by [`fit_workspace`]).
fn kernel_rows<T: TruncElem>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    logits: u64,
    rows: &Rows,
    lay: &TopkToppLayout,
    ws: u64,
) -> Result<(u64, Rows)> {
    let Some(half) = T::HALF else {
        return Ok((logits, *rows));
    };
    let (at, wide) = wide_copy(lay, rows);
    let dst = ws + 8 * at as u64;
    let k = dev.kernels();
    let func = match half {
        Half::Bf16 => &k.widen_rows_bf16,
        Half::F16 => &k.widen_rows_f16,
    };
    // SAFETY: `logits` holds the validated rows of 16-bit elements; the
    // copy lies inside the workspace after the layout's words (grown to
    // hold it), apart from the logits.
    unsafe { launch_copy_rows(dev, stream, func, logits, dst, rows, wide.row_stride) }?;
    Ok((dst, wide))
}

/// Writes the masked f32 rows back over 16-bit logits (`logits`, `rows`)
/// from the workspace copy (`wide`, `wide_rows`), exactly; nothing for f32
/// logits, masked in place.
fn narrow_back<T: TruncElem>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    (wide, wide_rows): (u64, Rows),
    logits: u64,
    rows: &Rows,
) -> Result<()> {
    let Some(half) = T::HALF else {
        return Ok(());
    };
    let k = dev.kernels();
    let func = match half {
        Half::Bf16 => &k.narrow_rows_bf16,
        Half::F16 => &k.narrow_rows_f16,
    };
    // SAFETY: the workspace copy holds `wide_rows` f32 rows (widened and
    // masked by this call), `logits` the validated 16-bit rows, apart.
    unsafe { launch_copy_rows(dev, stream, func, wide, logits, &wide_rows, rows.row_stride) }
}

/// The device pointers of the truncation parameters, and the guards that
/// keep them recorded on `stream` until dropped.
fn param_ptrs<'a>(
    stream: &'a Arc<CudaStream>,
    params: &'a TruncParams,
) -> (ParamPtrs, impl Sized + 'a) {
    let (top_k, g1) = params.top_k.device_ptr(stream);
    let (top_p, g2) = params.top_p.device_ptr(stream);
    let (min_p, g3) = params.min_p.device_ptr(stream);
    let (temperature, g4) = params.row.temperature.device_ptr(stream);
    (
        ParamPtrs {
            top_k,
            top_p,
            min_p,
            temperature,
        },
        (g1, g2, g3, g4),
    )
}

/// Launches the passes every call starts with: statistics (per chunk), the
/// plan (per row), then the pre-filter (per chunk); on the listing route
/// ([`TopkToppRoute::Listed`]) their listing forms.
#[allow(clippy::too_many_arguments)]
fn launch_prefilter(
    dev: &Device,
    stream: &Arc<CudaStream>,
    logits: u64,
    rows: &Rows,
    params: &TruncParams,
    lay: &TopkToppLayout,
    ws: u64,
    route: TopkToppRoute,
) -> Result<()> {
    let (listed, shares_only) = match route {
        TopkToppRoute::Listed { shares_only } => (true, u32::from(shares_only)),
        _ => (false, 0),
    };
    let vocab = rows.vocab as u32;
    let stride = rows.row_stride as u64;
    let batch = rows.batch as u32;
    let cfg = chunk_per_block(rows, lay)?;
    let k = dev.kernels();
    let (p, _g) = param_ptrs(stream, params);
    let mut chunk_args = [
        kernel_arg(&logits),
        kernel_arg(&vocab),
        kernel_arg(&stride),
        kernel_arg(&batch),
        kernel_arg(&ws),
    ];
    if listed {
        let mut stats_args = [
            kernel_arg(&logits),
            kernel_arg(&p.top_k),
            kernel_arg(&p.temperature),
            kernel_arg(&vocab),
            kernel_arg(&stride),
            kernel_arg(&batch),
            kernel_arg(&shares_only),
            kernel_arg(&ws),
        ];
        // SAFETY: the arguments match `topk_topp_stats_listed_f32`'s
        // signature; the caller validated `logits` (batch rows `row_stride`
        // apart, 1 <= vocab <= MAX_VOCAB), the parameter buffers (at least
        // `batch` elements) and grew `ws` to the layout's words; a block per
        // chunk of every row, as the kernel expects. The call's first pass:
        // after whatever precedes it on the stream, as usual.
        unsafe {
            dev.launch_pass(
                stream,
                &k.topk_topp_stats_listed_f32,
                cfg,
                false,
                &mut stats_args,
            )
        }?;
    } else {
        // SAFETY: as above, for `topk_topp_stats_f32`'s signature (no
        // parameters).
        unsafe { dev.launch_pass(stream, &k.topk_topp_stats_f32, cfg, false, &mut chunk_args) }?;
    }
    let mut plan_args = [
        kernel_arg(&logits),
        kernel_arg(&p.top_k),
        kernel_arg(&p.top_p),
        kernel_arg(&p.min_p),
        kernel_arg(&p.temperature),
        kernel_arg(&vocab),
        kernel_arg(&stride),
        kernel_arg(&batch),
        kernel_arg(&ws),
    ];
    let plan_cfg = LaunchConfig {
        shared_mem_bytes: TOPK_TOPP_CHUNK_SMEM_BYTES,
        ..row_per_block(rows)
    };
    let plan = if listed {
        &k.topk_topp_plan_listed_f32
    } else {
        &k.topk_topp_plan_f32
    };
    // SAFETY: as above, for `topk_topp_plan_f32` and
    // `topk_topp_plan_listed_f32` (one signature); the four parameter
    // buffers hold at least `batch` elements (checked by the caller); a
    // block per row, after the statistics pass on the same stream (every
    // pass waits for the previous one before reading: `pass_start`).
    unsafe { dev.launch_pass(stream, plan, plan_cfg, true, &mut plan_args) }?;
    if !listed {
        // SAFETY: as above, for `topk_topp_filter_f32`, after the plan
        // kernel on the same stream.
        return unsafe {
            dev.launch_pass(stream, &k.topk_topp_filter_f32, cfg, true, &mut chunk_args)
        };
    }
    // Grouped chunks pay only where covered rows' blocks end at once.
    let group = filter_group(rows, lay, dev.sm_count());
    let mut filter_args = [
        kernel_arg(&logits),
        kernel_arg(&vocab),
        kernel_arg(&stride),
        kernel_arg(&batch),
        kernel_arg(&group),
        kernel_arg(&ws),
    ];
    let filter_cfg = blocks_per_row(rows, lay.chunks.div_ceil(group), TOPK_TOPP_CHUNK_SMEM_BYTES)?;
    // SAFETY: as above, for `topk_topp_filter_grouped_f32` (its grid of
    // `group` chunks a block, as the kernel expects), after the plan kernel
    // on the same stream.
    unsafe {
        dev.launch_pass(
            stream,
            &k.topk_topp_filter_grouped_f32,
            filter_cfg,
            true,
            &mut filter_args,
        )
    }
}

/// Launches the selection kernel (`topk_topp_mask_f32`, or its listing
/// form on [`TopkToppRoute::Listed`]: a block per row) after the pre-filter
/// passes of the same route: each row's cut into the workspace, its kept
/// count to `kept`, and (`with_mass`) its kept mass into its cut slot.
///
/// # Safety
/// `logits` holds the call's validated `rows`, `kept` at least `batch`
/// u32, `ws` the layout's words with the pre-filter passes of the same
/// call launched before on `stream`; all live buffers of the stream's
/// context.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_selection(
    dev: &Device,
    stream: &Arc<CudaStream>,
    logits: u64,
    kept: u64,
    rows: &Rows,
    with_mass: bool,
    ws: u64,
    route: TopkToppRoute,
) -> Result<()> {
    let vocab = rows.vocab as u32;
    let stride = rows.row_stride as u64;
    let batch = rows.batch as u32;
    let with_mass = u32::from(with_mass);
    let mut args = [
        kernel_arg(&logits),
        kernel_arg(&kept),
        kernel_arg(&vocab),
        kernel_arg(&stride),
        kernel_arg(&batch),
        kernel_arg(&ws),
        kernel_arg(&with_mass),
    ];
    let k = dev.kernels();
    let func = if matches!(route, TopkToppRoute::Listed { .. }) {
        &k.topk_topp_mask_listed_f32
    } else {
        &k.topk_topp_mask_f32
    };
    // SAFETY: the argument list matches `topk_topp_mask_f32`'s signature
    // (and its listing form's); the buffers as the caller's contract says;
    // one block of ROW_THREADS per row with the shared memory the kernel
    // asks for, after the prefilter passes of `route` on this stream.
    unsafe { dev.launch_pass(stream, func, row_per_block(rows), true, &mut args) }
}

/// What the radix route's second kernel does after the slab: the cut of
/// each row into the workspace and its kept count, with the kept mass when
/// `with_mass` (the chunked masking, renormalising or kept-set writes
/// follow), or the draw. `in_place`: the call masks the logits it selects
/// from, so that the select may write -inf outside each row's slab and the
/// cut over the slab entries it drops (where the route allows: see
/// [`launch_radix_route`]).
enum RadixTail {
    Mask {
        kept: u64,
        with_mass: bool,
        in_place: bool,
    },
    Sample {
        seed: u64,
        offset: u64,
        tokens: u64,
        valid: u64,
    },
}

/// The radix route ([`TopkToppRoute::Radix`]): the rows' top-k slab by
/// the radix select of `route` into the workspace, then a block per row
/// cutting min-p and top-p from it (`topk_topp_slab_mask_f32` or
/// `topk_topp_slab_sample_f32`, by `tail`); on the cluster route, masking
/// in place and sampling are the select's launch alone (its masking and
/// sampling forms: `radix_topk::logits_to_slab`). Returns whether the
/// rows are masked already (a [`RadixTail::Mask`] `in_place` whose select
/// could write the rows); else masking still needs
/// `topk_topp_slab_apply_f32`.
///
/// # Safety
/// `logits` holds the call's validated f32 `rows`; the parameters and the
/// pointers of `tail` at least `batch` elements; `ws` (the workspace, the
/// slab's first word) the layout's words and the slab ([`fit_workspace`]);
/// all live buffers of `stream`'s context.
#[allow(clippy::too_many_arguments)]
unsafe fn launch_radix_route(
    dev: &Device,
    stream: &Arc<CudaStream>,
    route: Route,
    logits: u64,
    rows: &Rows,
    params: &TruncParams,
    (ws, slab_at): (u64, usize),
    tail: RadixTail,
) -> Result<bool> {
    let bound = params.top_k_bound;
    if bound == 0 || bound > SLAB || bound as usize >= rows.vocab {
        return Err(param("top_k_bound for the radix route", bound));
    }
    let (p, _g) = param_ptrs(stream, params);
    let [values, indices, counts] = slab_ptrs(ws, slab_at, rows.batch);
    // Masking in place and sampling; the renormalising and kept-set calls
    // read the cut and the mass from the workspace.
    let select_tail = match tail {
        RadixTail::Mask {
            kept,
            with_mass: false,
            in_place: true,
        } => Some(SelectTail::Mask { kept }),
        RadixTail::Mask { .. } => None,
        RadixTail::Sample {
            seed,
            offset,
            tokens,
            valid,
        } => Some(SelectTail::Sample {
            seed,
            offset,
            tokens,
            valid,
        }),
    };
    // SAFETY: the caller's contract (the rows writable for a call that
    // masks them in place); every row's top_k is from 1 to `bound` and
    // below `vocab` (the parameters' contract, `bound` checked), the
    // parameters, `kept` and the sampling outputs `batch` rows, the slab
    // `batch` rows.
    let finished = unsafe {
        radix_topk::logits_to_slab(
            dev,
            stream,
            route,
            logits,
            rows,
            [p.top_k, p.top_p, p.min_p, p.temperature],
            bound,
            [values, indices, counts],
            select_tail,
        )
    }?;
    let masked = match finished {
        Finished::Complete => return Ok(matches!(select_tail, Some(SelectTail::Mask { .. }))),
        Finished::MaskedOutsideSlab => true,
        Finished::Slab => false,
    };
    let vocab = rows.vocab as u32;
    let batch = rows.batch as u32;
    let k = dev.kernels();
    let with_mass = u32::from(matches!(
        tail,
        RadixTail::Mask {
            with_mass: true,
            ..
        }
    ));
    let mut args = vec![
        kernel_arg(&values),
        kernel_arg(&indices),
        kernel_arg(&counts),
        kernel_arg(&p.top_k),
        kernel_arg(&p.top_p),
        kernel_arg(&p.min_p),
        kernel_arg(&p.temperature),
    ];
    // The rows the select masked, for the cut's dropped slab entries.
    let masked_rows = if masked { logits } else { 0 };
    let stride = rows.row_stride as u64;
    let func = match &tail {
        RadixTail::Mask { kept, .. } => {
            args.extend([
                kernel_arg(kept),
                kernel_arg(&vocab),
                kernel_arg(&batch),
                kernel_arg(&ws),
                kernel_arg(&with_mass),
                kernel_arg(&masked_rows),
                kernel_arg(&stride),
            ]);
            &k.topk_topp_slab_mask_f32
        }
        RadixTail::Sample {
            seed,
            offset,
            tokens,
            valid,
        } => {
            args.extend([
                kernel_arg(seed),
                kernel_arg(offset),
                kernel_arg(tokens),
                kernel_arg(valid),
                kernel_arg(&vocab),
                kernel_arg(&batch),
            ]);
            &k.topk_topp_slab_sample_f32
        }
    };
    // SAFETY: the argument lists match `topk_topp_slab_mask_f32`'s and
    // `topk_topp_slab_sample_f32`'s signatures; the slab written by the
    // radix launch just before on this stream (the kernel waits for it:
    // `pass_start`), the rest as the caller's contract (the masked rows
    // the call's, writable); one block of ROW_THREADS per row with the
    // shared memory the kernels ask for.
    unsafe { dev.launch_pass(stream, func, row_per_block(rows), true, &mut args) }?;
    Ok(masked)
}

/// Checks a per-row output of at least `batch` elements.
fn check_rows_out(what: &'static str, len: usize, batch: usize) -> Result<()> {
    if len < batch {
        return Err(shape(what, format!("at least {batch} rows"), len));
    }
    Ok(())
}

/// The route of a call: the workspace's forced one (checked against what
/// the GPU runs), else the planned one.
fn route_of(
    dev: &Device,
    rows: &Rows,
    params: &TruncParams,
    ws: &Workspace,
) -> Result<TopkToppRoute> {
    let caps = dev.topk_topp_caps();
    match ws.topk_topp_forced() {
        None => dev.topk_topp_route(*rows, params),
        Some(TopkToppRoute::Cluster { ctas })
            if ctas == 0
                || ctas > MAX_TOPK_TOPP_CLUSTER
                || caps.cluster_slots[ctas as usize] == 0 =>
        {
            Err(param("forced top-k/top-p cluster", ctas))
        }
        Some(r) => Ok(r),
    }
}

/// The parameter pointers of the cluster kernels and the plan kernel.
struct ParamPtrs {
    top_k: u64,
    top_p: u64,
    min_p: u64,
    temperature: u64,
}

/// Most outputs a cluster kernel takes (the sampler's seed, offset, tokens
/// and valid flags).
const MAX_CLUSTER_OUTPUTS: usize = 4;

/// Launches `func`, a cluster kernel whose parameters are `(logits, top_k,
/// top_p, min_p, temperature, outputs.., vocab, row_stride, batch, ws)`,
/// every output a device pointer, in clusters of `ctas` per row (a plain
/// launch for a cluster of one). The one place both cluster kernels' argument
/// lists are made.
///
/// # Safety
/// `func`'s parameters are those; `logits` holds the validated `rows`, the
/// parameters and each output at least `rows.batch` elements, `ws` the
/// layout's words, all live buffers of the stream's context; the GPU runs
/// clusters of `ctas` of it (the caps say so).
#[allow(clippy::too_many_arguments)]
unsafe fn launch_cluster_route(
    dev: &Device,
    stream: &Arc<CudaStream>,
    func: &cudarc::driver::CudaFunction,
    logits: u64,
    params: &TruncParams,
    outputs: &[u64],
    rows: &Rows,
    ctas: u32,
    ws: u64,
) -> Result<()> {
    if outputs.len() > MAX_CLUSTER_OUTPUTS {
        return Err(param("cluster kernel outputs", outputs.len()));
    }
    let cfg = blocks_per_row(rows, ctas, TOPK_TOPP_SMEM_BYTES)?;
    let (p, _g) = param_ptrs(stream, params);
    let vocab = rows.vocab as u32;
    let stride = rows.row_stride as u64;
    let batch = rows.batch as u32;
    let mut args = [std::ptr::null_mut(); 9 + MAX_CLUSTER_OUTPUTS];
    let head = [
        kernel_arg(&logits),
        kernel_arg(&p.top_k),
        kernel_arg(&p.top_p),
        kernel_arg(&p.min_p),
        kernel_arg(&p.temperature),
    ];
    let tail = [
        kernel_arg(&vocab),
        kernel_arg(&stride),
        kernel_arg(&batch),
        kernel_arg(&ws),
    ];
    let n = head.len() + outputs.len() + tail.len();
    for (slot, a) in args.iter_mut().zip(
        head.into_iter()
            .chain(outputs.iter().map(kernel_arg))
            .chain(tail),
    ) {
        *slot = a;
    }
    // SAFETY: the caller's contract, the arguments in `func`'s order; the
    // call's only kernel, after whatever precedes it on the stream.
    unsafe {
        if ctas == 1 {
            dev.launch_pass(stream, func, cfg, false, &mut args[..n])
        } else {
            dev.launch_cluster(stream, func, cfg, ctas, &mut args[..n])
        }
    }
}

/// A call's rows after [`Device::select_rows`]: the f32 rows the kernels
/// read (`l`, `rows`: the caller's, or their widening in the workspace),
/// the workspace's layout and address (`w`), the selection launched;
/// it holds the workspace, logits and kept-count buffers' stream guards
/// until the caller's last pass is launched.
struct Selected<'a> {
    l: u64,
    rows: Rows,
    lay: TopkToppLayout,
    w: u64,
    _guards: [SyncOnDrop<'a>; 3],
}

impl Selected<'_> {
    /// `(vocab, row_stride, batch)` as the kernels take them.
    fn dims(&self) -> (u32, u64, u32) {
        (
            self.rows.vocab as u32,
            self.rows.row_stride as u64,
            self.rows.batch as u32,
        )
    }

    /// A block per chunk of every row.
    fn chunk_cfg(&self) -> Result<LaunchConfig> {
        chunk_per_block(&self.rows, &self.lay)
    }
}

impl Device {
    /// The common start of the calls whose outputs come from the cut
    /// (renormalised probabilities, kept sets): checks the stream, the
    /// logits, the parameters and `kept`, grows the workspace, widens
    /// 16-bit rows, and launches the pre-filter passes and the selection
    /// (the kept counts into `kept`; with the kept mass when `with_mass`).
    /// The caller launches its own passes after it on `stream`, while `ws`
    /// and the logits stay borrowed.
    #[allow(clippy::too_many_arguments)]
    fn select_rows<'a, T: TruncElem>(
        &self,
        stream: &'a Arc<CudaStream>,
        logits: &'a CudaView<'_, T>,
        rows: Rows,
        params: &TruncParams,
        kept: &'a mut CudaSlice<u32>,
        with_mass: bool,
        ws: &'a mut Workspace,
    ) -> Result<Selected<'a>> {
        self.check_stream(stream)?;
        rows.validate("logits", logits.len())?;
        params.check(rows.batch)?;
        check_rows_out("kept", kept.len(), rows.batch)?;
        // The renormalised probabilities and the kept sets take the radix
        // route where the planner does, else the chunked passes without
        // lists.
        let route = match route_of(self, &rows, params, ws)? {
            radix @ TopkToppRoute::Radix(_) => radix,
            _ => TopkToppRoute::Chunked,
        };
        let (lay, slab_at) = fit_workspace::<T>(stream, &rows, ws, route)?;
        let (w, g0) = ws.partial_mut().device_ptr_mut(stream);
        let (user, g1) = logits.device_ptr(stream);
        let (kp, g2) = kept.device_ptr_mut(stream);
        let (l, rows) = kernel_rows::<T>(self, stream, user, &rows, &lay, w)?;
        if let TopkToppRoute::Radix(radix) = route {
            // SAFETY: the f32 rows at `l` hold `rows.min_len()` elements
            // (the caller's, validated, or the workspace copy), `kept` and
            // the parameters at least `batch` elements (checked), the
            // workspace the layout's words and the slab from `slab_at`
            // (grown above), all live cudarc buffers of this stream's
            // context.
            unsafe {
                launch_radix_route(
                    self,
                    stream,
                    radix,
                    l,
                    &rows,
                    params,
                    (w, slab_at),
                    RadixTail::Mask {
                        kept: kp,
                        with_mass,
                        in_place: false,
                    },
                )
            }?;
            return Ok(Selected {
                l,
                rows,
                lay,
                w,
                _guards: [g0, g1, g2],
            });
        }
        launch_prefilter(
            self,
            stream,
            l,
            &rows,
            params,
            &lay,
            w,
            TopkToppRoute::Chunked,
        )?;
        // SAFETY: the f32 rows at `l` hold `rows.min_len()` elements (the
        // caller's, validated, or the workspace copy), `kept` at least
        // `batch` elements (checked), `ws` the layout's words (grown
        // above), all live cudarc buffers of this stream's context; the
        // prefilter passes launched just before.
        unsafe {
            launch_selection(
                self,
                stream,
                l,
                kp,
                &rows,
                with_mass,
                w,
                TopkToppRoute::Chunked,
            )
        }?;
        Ok(Selected {
            l,
            rows,
            lay,
            w,
            _guards: [g0, g1, g2],
        })
    }
}

impl Device {
    /// The route a top-k/top-p call of `rows` with `params` takes on this
    /// GPU (unless a workspace forces another): the radix route where
    /// [`plan_topk_topp_radix`] gives one, else [`plan_topk_topp_route`]'s.
    pub fn topk_topp_route(&self, rows: Rows, params: &TruncParams) -> Result<TopkToppRoute> {
        let radix = plan_topk_topp_radix(&rows, params.top_k_bound, &self.radix_caps()?);
        Ok(radix.map_or_else(
            || plan_topk_topp_route(&rows, &self.topk_topp_caps(), params.large_top_k),
            TopkToppRoute::Radix,
        ))
    }

    /// Truncates `[batch, vocab]` logits (f32, bf16 or f16: [`TruncElem`])
    /// in place (vLLM semantics):
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
    /// `ws` holds the per-call state (about one byte per logit, four more
    /// for 16-bit logits); it grows on the first call of a shape, so reuse
    /// one per stream and make a call of the largest shape before capturing
    /// a CUDA graph.
    pub fn top_k_top_p_mask_logits<T: TruncElem>(
        &self,
        stream: &Arc<CudaStream>,
        logits: &mut CudaViewMut<'_, T>,
        rows: Rows,
        params: &TruncParams,
        kept: &mut CudaSlice<u32>,
        ws: &mut Workspace,
    ) -> Result<()> {
        self.check_stream(stream)?;
        rows.validate("logits", logits.len())?;
        params.check(rows.batch)?;
        check_rows_out("kept", kept.len(), rows.batch)?;
        let route = route_of(self, &rows, params, ws)?;
        let (lay, slab_at) = fit_workspace::<T>(stream, &rows, ws, route)?;
        let (w, _g0) = ws.partial_mut().device_ptr_mut(stream);
        let (user, _g1) = logits.device_ptr_mut(stream);
        let (kp, _g6) = kept.device_ptr_mut(stream);
        let (l, krows) = kernel_rows::<T>(self, stream, user, &rows, &lay, w)?;
        let vocab = krows.vocab as u32; // validate: vocab <= MAX_VOCAB
        let stride = krows.row_stride as u64;
        let batch = krows.batch as u32;
        let k = self.kernels();
        if let TopkToppRoute::Cluster { ctas } = route {
            // SAFETY: `topk_topp_cluster_mask_f32` takes the shared list with
            // `kept` as its one output; the f32 rows at `l` hold
            // `krows.min_len()` elements (the caller's, validated, or the
            // workspace copy), the parameters and `kept` at least `batch`
            // elements (checked), `ws` the layout's words (grown above), all
            // live cudarc buffers of this stream's context; clusters of
            // `ctas` the GPU runs (`route_of`).
            unsafe {
                launch_cluster_route(
                    self,
                    stream,
                    &k.topk_topp_cluster_mask_f32,
                    l,
                    params,
                    &[kp],
                    &krows,
                    ctas,
                    w,
                )
            }?;
        } else if let TopkToppRoute::Radix(radix) = route {
            // SAFETY: the f32 rows at `l` hold `krows.min_len()` elements
            // (the caller's, validated and writable, or the workspace
            // copy), `kept` and the parameters at least `batch` elements
            // (checked), the workspace the layout's words and the slab from
            // `slab_at` (grown above), all live cudarc buffers of this
            // stream's context.
            let masked = unsafe {
                launch_radix_route(
                    self,
                    stream,
                    radix,
                    l,
                    &krows,
                    params,
                    (w, slab_at),
                    RadixTail::Mask {
                        kept: kp,
                        with_mass: false,
                        in_place: true,
                    },
                )
            }?;
            if !masked {
                // The kept sets are prefixes of the slab: the slab apply
                // marks them from its indices and writes without reading.
                let indices = slab_ptrs(w, slab_at, krows.batch)[1];
                let mut args = vec![
                    kernel_arg(&l),
                    kernel_arg(&vocab),
                    kernel_arg(&stride),
                    kernel_arg(&batch),
                    kernel_arg(&indices),
                    kernel_arg(&kp),
                ];
                // SAFETY: the arguments match `topk_topp_slab_apply_f32`'s
                // signature, a block per chunk: the f32 rows at `l` as
                // above (writable), the slab's indices and `kept` (`batch`
                // rows each) written by the slab cut launched just before.
                unsafe {
                    self.launch_pass(
                        stream,
                        &k.topk_topp_slab_apply_f32,
                        chunk_per_block(&krows, &lay)?,
                        true,
                        &mut args,
                    )
                }?;
            }
        } else {
            launch_prefilter(self, stream, l, &krows, params, &lay, w, route)?;
            // SAFETY: the f32 rows at `l` hold `krows.min_len()`
            // elements (batch rows `row_stride` apart with `vocab`
            // each, 1 <= vocab <= MAX_VOCAB), `kept` at least `batch`
            // elements (checked), `ws` the layout's words (grown
            // above), all live cudarc buffers of this stream's
            // context; the prefilter passes launched just before.
            unsafe { launch_selection(self, stream, l, kp, &krows, false, w, route) }?;
            let mut args = vec![
                kernel_arg(&l),
                kernel_arg(&vocab),
                kernel_arg(&stride),
                kernel_arg(&batch),
                kernel_arg(&w),
            ];
            // SAFETY: the arguments match `topk_topp_apply_f32`'s
            // signature, a block per chunk, as `launch_prefilter`'s passes,
            // after the selection on this stream.
            unsafe {
                self.launch_pass(
                    stream,
                    &k.topk_topp_apply_f32,
                    chunk_per_block(&krows, &lay)?,
                    true,
                    &mut args,
                )
            }?;
        }
        narrow_back::<T>(self, stream, (l, krows), user, &rows)
    }

    /// Samples one token per row of `[batch, vocab]` logits (f32, bf16 or f16) from the
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
    pub fn sample_top_k_top_p<T: TruncElem>(
        &self,
        stream: &Arc<CudaStream>,
        logits: &CudaView<'_, T>,
        rows: Rows,
        params: &TruncParams,
        out: &mut SampleOutput,
        ws: &mut Workspace,
    ) -> Result<()> {
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
        let route = route_of(self, &rows, params, ws)?;
        let (lay, slab_at) = fit_workspace::<T>(stream, &rows, ws, route)?;
        let (w, _g0) = ws.partial_mut().device_ptr_mut(stream);
        let (user, _g1) = logits.device_ptr(stream);
        let (l, rows) = kernel_rows::<T>(self, stream, user, &rows, &lay, w)?;
        let vocab = rows.vocab as u32; // validate: vocab <= MAX_VOCAB
        let stride = rows.row_stride as u64;
        let batch = rows.batch as u32;
        let (s, _g6) = params.row.seed.device_ptr(stream);
        let (o, _g7) = params.row.offset.device_ptr(stream);
        let (tok, _g8) = out.tokens.device_ptr_mut(stream);
        let (v, _g9) = out.valid.device_ptr_mut(stream);
        if let TopkToppRoute::Cluster { ctas } = route {
            // SAFETY: `topk_topp_cluster_sample_f32` takes the shared list
            // with seed, offset, tokens and valid as its outputs; `logits`
            // holds `rows.min_len()` elements (validated), the parameters,
            // seeds, offsets and both outputs at least `batch` elements
            // (checked), `ws` the layout's words (grown above), all live
            // cudarc buffers of this stream's context; clusters of `ctas`
            // the GPU runs (`route_of`).
            return unsafe {
                launch_cluster_route(
                    self,
                    stream,
                    &self.kernels().topk_topp_cluster_sample_f32,
                    l,
                    params,
                    &[s, o, tok, v],
                    &rows,
                    ctas,
                    w,
                )
            };
        }
        if let TopkToppRoute::Radix(radix) = route {
            // SAFETY: the f32 rows at `l` hold `rows.min_len()` elements
            // (validated, or the workspace copy), the parameters, seeds,
            // offsets and both outputs at least `batch` elements (checked),
            // the workspace the layout's words and the slab from `slab_at`
            // (grown above), all live cudarc buffers of this stream's
            // context.
            unsafe {
                launch_radix_route(
                    self,
                    stream,
                    radix,
                    l,
                    &rows,
                    params,
                    (w, slab_at),
                    RadixTail::Sample {
                        seed: s,
                        offset: o,
                        tokens: tok,
                        valid: v,
                    },
                )
            }?;
            return Ok(());
        }
        launch_prefilter(self, stream, l, &rows, params, &lay, w, route)?;
        let mut sample_args = [
            kernel_arg(&l),
            kernel_arg(&s),
            kernel_arg(&o),
            kernel_arg(&tok),
            kernel_arg(&v),
            kernel_arg(&vocab),
            kernel_arg(&stride),
            kernel_arg(&batch),
            kernel_arg(&w),
        ];
        let sample = if matches!(route, TopkToppRoute::Listed { .. }) {
            &self.kernels().topk_topp_sample_listed_f32
        } else {
            &self.kernels().topk_topp_sample_f32
        };
        // SAFETY: the argument list matches `topk_topp_sample_f32`'s
        // signature (and its listing form's); `logits` holds `rows.min_len()` elements (validated),
        // seeds, offsets and both outputs at least `batch` elements
        // (checked), `ws` the layout's words (grown above, the plans and
        // lists written by the passes before), all live cudarc buffers of
        // this stream's context; one block of ROW_THREADS per row with the
        // shared memory the kernel asks for, after the prefilter passes on
        // this stream.
        unsafe { self.launch_pass(stream, sample, row_per_block(&rows), true, &mut sample_args) }?;
        Ok(())
    }
}

impl Device {
    /// Probabilities renormalised over each row's kept set (as
    /// [`Device::top_k_top_p_mask_logits`] keeps it) into `probs`
    /// (`[batch, vocab]`, contiguous): `exp((x - max) / T)` of a kept logit
    /// `x` over the kept set's sum of the same, 0 outside the kept set
    /// ([`crate::reference::probabilities`]; within f32 rounding of it, and
    /// of the one-element top-p band of the kept set); `kept[r]` receives
    /// the kept count. A row with nothing finite and no +inf gets all zeros
    /// and `kept = 0`; rows with +inf entries spread the mass evenly over
    /// them. The logits (f32, bf16 or f16) are only read. Always the chunked passes (five
    /// launches).
    ///
    /// ```no_run
    /// # fn main() -> flashsample::Result<()> {
    /// use flashsample::{Device, Rows, TruncParams, Workspace};
    ///
    /// let dev = Device::new(0)?;
    /// let stream = dev.new_stream()?;
    /// let logits = stream.clone_htod(&[1.0f32, 3.0, 2.0, 0.0]).map_err(flashsample::Error::from)?;
    /// // top-k 2, top-p off, min-p off, temperature 1.
    /// let params = TruncParams::upload(&stream, &[2], &[1.0], &[0.0], &[1.0], &[0], &[0])?;
    /// let mut probs = stream.alloc_zeros::<f32>(4).map_err(flashsample::Error::from)?;
    /// let mut kept = stream.alloc_zeros::<u32>(1).map_err(flashsample::Error::from)?;
    /// let mut ws = Workspace::new(&stream)?;
    /// dev.top_k_top_p_renorm_probs(&stream, &logits.as_view(), Rows::contiguous(1, 4), &params,
    ///     &mut probs.as_view_mut(), &mut kept, &mut ws)?;
    /// let p = stream.clone_dtoh(&probs).map_err(flashsample::Error::from)?;
    /// assert!((p[1] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6 && p[0] == 0.0);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn top_k_top_p_renorm_probs<T: TruncElem>(
        &self,
        stream: &Arc<CudaStream>,
        logits: &CudaView<'_, T>,
        rows: Rows,
        params: &TruncParams,
        probs: &mut CudaViewMut<'_, f32>,
        kept: &mut CudaSlice<u32>,
        ws: &mut Workspace,
    ) -> Result<()> {
        let out_len = rows.batch.saturating_mul(rows.vocab);
        if probs.len() < out_len {
            return Err(shape("probs", format!("at least {out_len}"), probs.len()));
        }
        let probs_stride = rows.vocab as u64;
        let (pr, _g) = probs.device_ptr_mut(stream);
        let selected = self.select_rows(stream, logits, rows, params, kept, true, ws)?;
        let Selected { l, w, .. } = selected;
        let (vocab, stride, batch) = selected.dims();
        let mut args = [
            kernel_arg(&l),
            kernel_arg(&pr),
            kernel_arg(&vocab),
            kernel_arg(&stride),
            kernel_arg(&probs_stride),
            kernel_arg(&batch),
            kernel_arg(&w),
        ];
        // SAFETY: the argument list matches `topk_topp_renorm_f32`'s
        // signature; `probs` holds `batch * vocab` f32 (checked), a buffer
        // of its own (a `&mut` view); the rest as above; a block per chunk
        // of every row, after the selection (with the mass) on this stream.
        unsafe {
            self.launch_pass(
                stream,
                &self.kernels().topk_topp_renorm_f32,
                selected.chunk_cfg()?,
                true,
                &mut args,
            )
        }
    }

    /// Each row's kept set (as [`Device::top_k_top_p_mask_logits`] keeps
    /// it) as its count, into `kept[r]`, and its indices in ascending
    /// order, into `indices[r * capacity ..]` (the first `capacity` of them
    /// when the row keeps more; the rest of the row's slots untouched): for
    /// speculative decoding and RL, which need the truncated support. Equal
    /// to [`crate::reference::kept_set`] sorted by index, but for top-p's
    /// one-element 1e-6 band. The logits (f32, bf16 or f16) are only read. Always the chunked
    /// passes (six launches).
    ///
    /// ```no_run
    /// # fn main() -> flashsample::Result<()> {
    /// use flashsample::{Device, Rows, TruncParams, Workspace};
    ///
    /// let dev = Device::new(0)?;
    /// let stream = dev.new_stream()?;
    /// let logits = stream.clone_htod(&[1.0f32, 3.0, 2.0, 0.0]).map_err(flashsample::Error::from)?;
    /// let params = TruncParams::upload(&stream, &[2], &[1.0], &[0.0], &[1.0], &[0], &[0])?;
    /// let mut kept = stream.alloc_zeros::<u32>(1).map_err(flashsample::Error::from)?;
    /// let mut indices = stream.alloc_zeros::<u32>(4).map_err(flashsample::Error::from)?;
    /// let mut ws = Workspace::new(&stream)?;
    /// dev.top_k_top_p_kept_set(&stream, &logits.as_view(), Rows::contiguous(1, 4), &params,
    ///     &mut kept, &mut indices.as_view_mut(), 4, &mut ws)?;
    /// assert_eq!(stream.clone_dtoh(&kept).map_err(flashsample::Error::from)?, [2]);
    /// assert_eq!(stream.clone_dtoh(&indices).map_err(flashsample::Error::from)?[..2], [1, 2]);
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn top_k_top_p_kept_set<T: TruncElem>(
        &self,
        stream: &Arc<CudaStream>,
        logits: &CudaView<'_, T>,
        rows: Rows,
        params: &TruncParams,
        kept: &mut CudaSlice<u32>,
        indices: &mut CudaViewMut<'_, u32>,
        capacity: usize,
        ws: &mut Workspace,
    ) -> Result<()> {
        if capacity == 0 || capacity > u32::MAX as usize {
            return Err(param("capacity", capacity));
        }
        let out_len = rows.batch.saturating_mul(capacity);
        if indices.len() < out_len {
            return Err(shape(
                "indices",
                format!("at least {out_len}"),
                indices.len(),
            ));
        }
        let cap = capacity as u32;
        let (ix, _g) = indices.device_ptr_mut(stream);
        let selected = self.select_rows(stream, logits, rows, params, kept, false, ws)?;
        let Selected { l, w, .. } = selected;
        let (vocab, stride, batch) = selected.dims();
        let cfg = selected.chunk_cfg()?;
        let mut count_args = [
            kernel_arg(&l),
            kernel_arg(&vocab),
            kernel_arg(&stride),
            kernel_arg(&batch),
            kernel_arg(&w),
        ];
        // SAFETY: the argument list matches `topk_topp_kept_count_f32`'s
        // signature; buffers as above; a block per chunk of every row,
        // after the selection on this stream.
        unsafe {
            self.launch_pass(
                stream,
                &self.kernels().topk_topp_kept_count_f32,
                cfg,
                true,
                &mut count_args,
            )
        }?;
        let mut write_args = [
            kernel_arg(&l),
            kernel_arg(&ix),
            kernel_arg(&cap),
            kernel_arg(&vocab),
            kernel_arg(&stride),
            kernel_arg(&batch),
            kernel_arg(&w),
        ];
        // SAFETY: the argument list matches `topk_topp_kept_write_f32`'s
        // signature; `indices` holds `batch * capacity` u32 (checked), a
        // buffer of its own; after the count pass on this stream.
        unsafe {
            self.launch_pass(
                stream,
                &self.kernels().topk_topp_kept_write_f32,
                cfg,
                true,
                &mut write_args,
            )
        }
    }
}

/// Raises the dynamic shared memory limit of the selecting `topk_topp_*`
/// kernels (their candidate list needs more than the default 48 KiB),
/// allows the cluster kernels Hopper's non-portable cluster sizes, and
/// measures the clusters the GPU runs at once.
pub(crate) fn configure(
    ctx: &Arc<cudarc::driver::CudaContext>,
    arch: &str,
    sm_count: u32,
    k: &crate::device::Kernels,
) -> Result<TopkToppCaps> {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH;
    use cudarc::driver::sys::CUfunction_attribute::{
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SMEM,
        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED as NON_PORTABLE,
    };
    let cluster_kernels = [
        &k.topk_topp_cluster_mask_f32,
        &k.topk_topp_cluster_sample_f32,
    ];
    for f in [
        &k.topk_topp_mask_f32,
        &k.topk_topp_mask_listed_f32,
        &k.topk_topp_sample_f32,
        &k.topk_topp_sample_listed_f32,
        &k.topk_topp_slab_mask_f32,
        &k.topk_topp_slab_sample_f32,
    ]
    .into_iter()
    .chain(cluster_kernels)
    {
        f.set_attribute(MAX_SMEM, TOPK_TOPP_SMEM_BYTES as i32)?;
    }
    let mut caps = TopkToppCaps {
        cluster_slots: [0; MAX_TOPK_TOPP_CLUSTER as usize + 1],
    };
    let mut per_sm = u32::MAX;
    for f in cluster_kernels {
        let n = f.occupancy_max_active_blocks_per_multiprocessor(
            ROW_THREADS,
            TOPK_TOPP_SMEM_BYTES as usize,
            None,
        )?;
        per_sm = per_sm.min(n);
    }
    caps.cluster_slots[1] = per_sm.saturating_mul(sm_count);
    let clusters =
        arch.starts_with("sm_9") && ctx.attribute(CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? == 1;
    if clusters {
        for f in cluster_kernels {
            f.set_attribute(NON_PORTABLE, 1)?;
        }
        for c in 2..=MAX_TOPK_TOPP_CLUSTER {
            let mut n = u32::MAX;
            for f in cluster_kernels {
                let m =
                    max_active_clusters(ctx, f.cu_function(), c, ROW_THREADS, TOPK_TOPP_SMEM_BYTES)
                        .unwrap_or(0);
                n = n.min(m);
            }
            caps.cluster_slots[c as usize] = n;
        }
    }
    Ok(caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_shapes_are_a_block_per_row_and_per_chunk() {
        let rows = Rows::contiguous(7, 151_936);
        let c = row_per_block(&rows);
        assert_eq!(c.grid_dim, (7, 1, 1));
        assert_eq!(c.block_dim, (ROW_THREADS, 1, 1));
        assert_eq!(c.shared_mem_bytes, TOPK_TOPP_SMEM_BYTES);
        let lay = TopkToppLayout::new(7, 151_936);
        assert_eq!(lay.chunks, 19);
        let c = chunk_per_block(&rows, &lay).unwrap();
        assert_eq!(c.grid_dim, (7 * 19, 1, 1));
        assert_eq!(c.shared_mem_bytes, TOPK_TOPP_CHUNK_SMEM_BYTES);
    }

    #[test]
    fn the_prefilter_pass_groups_chunks_only_over_several_waves() {
        // The H200: 132 multiprocessors, four pre-filter blocks each.
        let group = |batch, vocab| {
            let rows = Rows::contiguous(batch, vocab);
            filter_group(&rows, &TopkToppLayout::new(batch as u32, vocab as u32), 132)
        };
        assert_eq!(group(1, 128_256), 1);
        assert_eq!(group(64, 128_256), 1);
        assert_eq!(group(128, 128_256), 1);
        assert_eq!(group(256, 128_256), 2);
        assert_eq!(group(512, 128_256), 3);
        assert_eq!(group(1024, 128_256), 4);
        assert_eq!(group(1024, 32_000), 2);
        assert_eq!(group(8192, 1), 3);
        assert_eq!(
            filter_group(&Rows::contiguous(8, 8192), &TopkToppLayout::new(8, 8192), 0),
            1
        );
    }

    #[test]
    fn layout_regions_are_disjoint_and_lists_fit_the_selection_block() {
        for (batch, vocab) in [
            (1, 1),
            (3, 111),
            (1, 8192),
            (2, 8193),
            (128, 151_936),
            (5, 1 << 21),
        ] {
            let lay = TopkToppLayout::new(batch, vocab);
            let slots = batch as usize * lay.chunks as usize;
            assert_eq!(lay.chunks, vocab.div_ceil(8192));
            let even = 8192 / lay.chunks;
            assert_eq!(lay.cap, if lay.chunks > 256 { 0 } else { even.max(1024) });
            assert!(lay.tiers >= lay.stats + slots * 24 / 8);
            assert!(lay.counts >= lay.tiers + slots * 72 / 8);
            assert!(lay.lists * 2 >= lay.counts * 2 + slots);
            assert_eq!(lay.kept_counts, lay.lists + slots * lay.cap as usize);
            assert!(lay.floors * 2 >= lay.kept_counts * 2 + slots);
            assert!(lay.cuts * 2 >= lay.floors * 2 + slots);
            assert_eq!(lay.plans, lay.cuts + 2 * batch as usize);
            assert_eq!(lay.words, lay.plans + 7 * batch as usize);
        }
    }
}
