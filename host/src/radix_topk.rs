//! `radix_topk`: exact top-k of f32 probabilities by cluster radix select
//! and sparse top-p sampling from the top-k (issue 5, FlashInfer's "cake"
//! route): [`Device::top_k_to_slab`] (stage 1 alone: a sorted `[batch,
//! SLAB]` slab per row), [`Device::top_k_top_p_sampling_from_probs`]
//! (`top_k_first`: top-k, then top-p on the top-k mass, then one draw) and
//! [`Device::route`] (which path a request takes).
//!
//! # Semantics
//!
//! - A probability counts through its clean value: finite positive values
//!   as themselves, NaN, negative values, +-0 and +inf as 0. Rows need not
//!   be normalised.
//! - top-k keeps the first `min(k, V)` entries of the total order (value
//!   descending, index ascending; zeros tie and go by index).
//! - top-p keeps the shortest prefix of the top-k whose exclusive mass is
//!   below `top_p * topk_mass` (the first entry always; `top_p = 1` keeps
//!   all `k`).
//! - The token is the first kept entry whose cumulative mass exceeds
//!   `u * kept_mass`, `u = uniform_open(row_uniform_bits(seed_key(seed),
//!   offset, 0))`: the Qrita sampler's draw (`Device::sample_top_k_top_p`).
//!   Masses are exact integers (`radix_select::fixed_mass`, exact to
//!   `2^-53` of the row's largest value), so the GPU's token equals the
//!   portable emulation's ([`flashsample_kernels::radix_select`]) bit for
//!   bit, and the float64 reference's
//!   ([`crate::reference::sample_probs_top_k_top_p`]) except where the
//!   exact cumulative mass lies within rounding of `u * kept_mass` or the
//!   top-p cut within its 1e-6 band.
//! - A row whose top-k has no positive mass is invalid (`valid = 0`, token
//!   0).
//!
//! # Routes
//!
//! `k <= SLAB` (1024) takes the radix route; on GPUs with thread block
//! clusters (sm_90+) a cluster of `ctas` CTAs per row ([`Route::Cluster`],
//! `ctas` from a cost model: [`plan_route`]), elsewhere one CTA per row
//! ([`Route::SingleCta`]) or, for small batches, a cooperative multi-CTA
//! launch ([`Route::Cooperative`]). Large batches take one CTA per row
//! that streams its row once against a running threshold
//! ([`Route::Filter`]) where the GPU's shared memory holds its candidate
//! buffer. `k > SLAB` takes the pivot path of the
//! Qrita sampler ([`Route::Pivot`]) on the logits `ln p` of the clean
//! probabilities (`radix_select::prob_logit`, then temperature 1, min-p
//! off): the same contract, except that probabilities whose f32
//! logarithms round to the same value tie there (and go by index), and
//! that its masses carry the rounding of `exp(ln p)` (about 1e-7 relative).
//! Every route accepts any row stride.

use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUdeviceptr, CUfunction};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, LaunchConfig};
use flashsample_kernels::radix_select::{
    BUCKETS, FILTER_MASK_MAX_VOCAB, FILTER_MAX_CAP, FILTER_MIN_CAP, FILTER_SMALL_MAX_K, GATHER_CAP,
    MODE_MASK, MODE_SAMPLE, MODE_SLAB, RADIX_FIXED_SMEM, RADIX_THREADS, RadixArgs, SLAB,
    filter_smem_bytes, radix_smem_bytes,
};

use crate::device::{Device, cluster_attr, launch_ex, max_active_clusters};
use crate::error::{Result, param, shape};
use crate::rows::Rows;
use crate::sampling::{SampleOutput, Workspace};
use crate::topk_topp::TruncParams;

/// Largest cluster the planner asks for: 16, the non-portable size Hopper
/// schedules when a kernel allows it (the portable limit is 8); the GPU's
/// own limit is [`RadixCaps::max_cluster`].
pub const MAX_CLUSTER: u32 = 16;
/// Most CTAs of a cluster of filter CTAs ([`Route::FilterCluster`]): their
/// gathers (each at most `GATHER_CAP` keys) merge in one candidate buffer.
pub const MAX_FILTER_CLUSTER: u32 = 4;
/// Most CTAs per row of the cooperative route (GPUs without clusters).
const MAX_COOPERATIVE: u64 = 8;
/// Largest grid y of a launch; more rows loop.
const MAX_GRID_Y: usize = 65_535;

/// Per-row parameters of the probability samplers, in device memory (a
/// captured CUDA graph reads the current seeds and offsets at each
/// replay). Held as the pivot path's [`TruncParams`] (min-p off,
/// temperature 1), so both routes read the same buffers.
#[derive(Debug)]
pub struct TopKTopPParams {
    trunc: TruncParams,
    max_k: u32,
}

impl TopKTopPParams {
    /// Uploads per-row `top_k` (>= 1; above the vocabulary means the whole
    /// row), `top_p` (in `(0, 1]`, 1 is off), seeds and offsets, all of one
    /// length (the batch). Rejects `top_k = 0` and `top_p` outside `(0, 1]`
    /// (NaN included) before any copy.
    pub fn upload(
        stream: &Arc<CudaStream>,
        top_k: &[u32],
        top_p: &[f32],
        seed: &[u64],
        offset: &[u64],
    ) -> Result<TopKTopPParams> {
        let b = top_k.len();
        if b == 0 {
            return Err(param("batch", 0));
        }
        for (what, len) in [
            ("top_p", top_p.len()),
            ("seed", seed.len()),
            ("offset", offset.len()),
        ] {
            if len != b {
                return Err(shape(what, b, len));
            }
        }
        if top_k.contains(&0) {
            return Err(param("top_k", 0));
        }
        let trunc = TruncParams::upload(
            stream,
            top_k,
            top_p,
            &vec![0.0; b],
            &vec![1.0; b],
            seed,
            offset,
        )?;
        Ok(TopKTopPParams {
            trunc,
            max_k: top_k.iter().copied().max().unwrap_or(1),
        })
    }

    /// Rows described.
    pub fn batch(&self) -> usize {
        self.trunc.batch()
    }

    /// The largest `top_k`: it decides the route.
    pub fn max_k(&self) -> u32 {
        self.max_k
    }

    /// Per-row seeds (write new values between calls or graph replays).
    pub fn seed_mut(&mut self) -> &mut CudaSlice<u64> {
        &mut self.trunc.row.seed
    }

    /// Per-row Philox offsets (advance them every step).
    pub fn offset_mut(&mut self) -> &mut CudaSlice<u64> {
        &mut self.trunc.row.offset
    }

    fn check(&self, batch: usize) -> Result<()> {
        if self.batch() < batch {
            return Err(shape(
                "params",
                format!("at least {batch} rows"),
                self.batch(),
            ));
        }
        Ok(())
    }
}

/// Stage 1's output: per row, [`SLAB`] entries sorted by value descending
/// then index ascending, of which the first `counts[r] = min(top_k, V)` are
/// the row's top-k (clean values: NaN, negative and infinite
/// probabilities as 0) and the rest padding (value 0, index `u32::MAX`).
#[derive(Debug)]
pub struct Slab {
    /// `[batch, SLAB]` clean values.
    pub values: CudaSlice<f32>,
    /// `[batch, SLAB]` vocabulary indices.
    pub indices: CudaSlice<u32>,
    /// `[batch]` entries of the top-k per row.
    pub counts: CudaSlice<u32>,
}

impl Slab {
    /// A slab for `batch` rows.
    pub fn new(stream: &Arc<CudaStream>, batch: usize) -> Result<Slab> {
        let n = batch * SLAB as usize;
        Ok(Slab {
            values: stream.alloc_zeros(n)?,
            indices: stream.alloc_zeros(n)?,
            counts: stream.alloc_zeros(batch)?,
        })
    }

    fn check(&self, batch: usize) -> Result<()> {
        let n = batch * SLAB as usize;
        for (what, len) in [
            ("values", self.values.len()),
            ("indices", self.indices.len()),
        ] {
            if len < n {
                return Err(shape(what, format!("at least {n}"), len));
            }
        }
        if self.counts.len() < batch {
            return Err(shape(
                "counts",
                format!("at least {batch}"),
                self.counts.len(),
            ));
        }
        Ok(())
    }
}

/// Scratch memory of the probability samplers: the cooperative route's
/// histograms, gather buffers, counts and barrier words, and the pivot
/// route's logits and workspace. Belongs to one stream at a time; grows on
/// demand (run the call once before capturing a CUDA graph).
#[derive(Debug)]
pub struct RadixWorkspace {
    hist: CudaSlice<u32>,
    gather: CudaSlice<u64>,
    /// Gather counts, one per row in flight: 0 between launches.
    counts: CudaSlice<u32>,
    /// Grid-barrier words, one per row in flight: any value.
    barriers: CudaSlice<u32>,
    logits: CudaSlice<f32>,
    pivot: Workspace,
    forced: Option<Route>,
}

impl RadixWorkspace {
    /// An empty workspace on `stream`.
    pub fn new(stream: &Arc<CudaStream>) -> Result<RadixWorkspace> {
        Ok(RadixWorkspace {
            hist: stream.alloc_zeros(1)?,
            gather: stream.alloc_zeros(1)?,
            counts: stream.alloc_zeros(1)?,
            barriers: stream.alloc_zeros(1)?,
            logits: stream.alloc_zeros(1)?,
            pivot: Workspace::new(stream)?,
            forced: None,
        })
    }

    /// Serves every later call through this workspace by `route` instead
    /// of the planned one (tests and benches compare routes); `None`
    /// restores the planner. Calls reject a route the GPU cannot run, and
    /// radix routes for `max_k > SLAB`.
    pub fn force_route(&mut self, route: Option<Route>) {
        self.forced = route;
    }

    /// The route of a call: the forced one, else the planned one.
    fn route_of(&self, dev: &Device, rows: Rows, params: &TopKTopPParams) -> Result<Route> {
        match self.forced {
            Some(r) => Ok(r),
            None => dev.route(rows, params.max_k()),
        }
    }

    /// Room for `slots` rows in flight of `ctas` cooperative CTAs each.
    fn fit_coop(&mut self, stream: &Arc<CudaStream>, slots: usize, ctas: usize) -> Result<()> {
        let hist = slots * 2 * ctas * BUCKETS as usize;
        if self.hist.len() < hist {
            self.hist = stream.alloc_zeros(hist)?;
        }
        if self.gather.len() < slots * GATHER_CAP as usize {
            self.gather = stream.alloc_zeros(slots * GATHER_CAP as usize)?;
        }
        if self.counts.len() < slots {
            // Fresh zeros: the counts' invariant, which every launch keeps.
            self.counts = stream.alloc_zeros(slots)?;
            self.barriers = stream.alloc_zeros(slots)?;
        }
        Ok(())
    }
}

/// The path a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Radix select, a thread block cluster of `ctas` CTAs per row,
    /// exchanging through distributed shared memory (sm_90 and newer).
    Cluster { ctas: u32 },
    /// Radix select, `ctas` CTAs per row of a cooperative launch,
    /// exchanging through global memory (the multi-CTA fallback).
    Cooperative { ctas: u32 },
    /// Radix select, one CTA per row (every GPU).
    SingleCta,
    /// One CTA per row without a row cache: the row streamed once, every
    /// key at or above a running threshold kept in a candidate buffer in
    /// shared memory, the threshold raised by a radix select over the
    /// buffer whenever it fills (the large-batch route; GPUs whose shared
    /// memory holds the buffer, [`RadixCaps::filter_ctas_per_sm`] > 0).
    Filter,
    /// The filter route with each row split over a thread block cluster of
    /// `ctas` CTAs (2 to [`MAX_FILTER_CLUSTER`]), each streaming its part
    /// and their top keys merged in the first CTA's buffer through
    /// distributed shared memory (sm_90 and newer;
    /// [`RadixCaps::filter_cluster_slots`]).
    FilterCluster { ctas: u32 },
    /// The Qrita pivot path on `ln p`, for `k > SLAB`.
    Pivot,
}

/// What the route planner knows of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixCaps {
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Largest thread block cluster of radix CTAs the GPU schedules (0
    /// without cluster support; the planner splits rows over clusters
    /// from 2).
    pub max_cluster: u32,
    /// Radix CTAs resident per multiprocessor (registers and the shared
    /// memory budget).
    pub ctas_per_sm: u32,
    /// Elements of a chunk one CTA caches in shared memory.
    pub cache_elems: u32,
    /// Clusters of `c` radix CTAs the GPU runs at once, at index `c` (1 to
    /// [`MAX_CLUSTER`]; 0 where it cannot, and everywhere without
    /// clusters): the rows a wave of the cluster route holds.
    pub cluster_slots: [u32; MAX_CLUSTER as usize + 1],
    /// Filter CTAs ([`Route::Filter`]) resident per multiprocessor with
    /// their candidate buffer; 0 where the GPU cannot run them (its shared
    /// memory per block below the smallest buffer).
    pub filter_ctas_per_sm: u32,
    /// Clusters of `c` filter CTAs ([`Route::FilterCluster`]) the GPU runs
    /// at once, at index `c` (2 to [`MAX_FILTER_CLUSTER`]; 0 where it
    /// cannot, and at indices 0 and 1).
    pub filter_cluster_slots: [u32; MAX_FILTER_CLUSTER as usize + 1],
}

// The cost model, fitted on the H200 to the bench's every-route table of
// session 4 (V = 128256, k = 50; docs/performance.md, radix v3): a row's
// CTAs, all resident, take a fixed time plus a time per element of the
// chunk and per element re-read past the cache; rows beyond what the GPU
// holds at once run in further waves. Rows split over more than 8 CTAs
// (Hopper's non-portable clusters, session 10) add 0.2 us a CTA beyond
// the eighth: clusters of 16 measured 16.8 us against 19.4 for 8 at V =
// 128256 and B = 1, but 12.5 against 12.3 at V = 32768, where their chunks
// are 2048 elements.
const CTA_FIXED_US: f64 = 12.9;
const US_PER_CTA_ABOVE_8: f64 = 0.2;
const US_PER_ELEM: f64 = 0.43e-3;
const US_PER_REREAD: f64 = 0.12e-3;
/// Fewest elements per CTA worth splitting a row for.
const MIN_CHUNK: u32 = 2048;

// The filter route's cost: rows the GPU holds at once (one CTA each) take
// a fixed time plus a time per element streamed. Fitted on the H200 to the
// bench of session 10 (the seeded filter, B = 64, k = 50: 16.4 us at V =
// 32768, 25.8 at 128256, 28.3 at 151936, 40.0 at 262144; at V = 128256
// 24.2 us at B = 1, 25.5 at 32, 28.6 at 128, where the rows share the read
// bandwidth).
const FILTER_FIXED_US: f64 = 13.0;
const FILTER_US_PER_ELEM: f64 = 0.105e-3;

/// Added time of a split filter row: the second select and the merge
/// through distributed shared memory. Fitted on the H200 (session 11, V =
/// 128256, k = 50: clusters of 4 16.2 us at B = 1, 18.5 at B = 16, of 3
/// 19.9 at B = 32, of 2 22.1 at B = 64), so that at B <= 4 clusters of 16
/// radix CTAs (15.7 us) win.
const FILTER_MERGE_US: f64 = 2.0;

// The row end's cost grows with k (the sort of the slab and the top-p
// cut): per unit of the largest k above 50, fitted on the H200 (session 11,
// V = 128256, k = 1000 against 50): about 14 us more on the radix routes at
// B = 2 to 16, 22 to 25 us on the filter routes (one CTA or a cluster of 2
// to 4 per row) at B = 2 to 128, whose row end runs in one CTA with the
// whole candidate set.
const RADIX_US_PER_K: f64 = 0.015;
const FILTER_US_PER_K: f64 = 0.025;

/// The row end's added time for a largest k of `max_k` at `per_k` us per
/// unit above 50.
fn k_cost_us(max_k: u32, per_k: f64) -> f64 {
    f64::from(max_k.saturating_sub(50)) * per_k
}

/// Estimated time of a launch of the filter route split over clusters of
/// `ctas` (at least [`MIN_CHUNK`] elements each); infinite where the GPU
/// cannot run one.
fn filter_cluster_time_us(rows: &Rows, max_k: u32, ctas: u32, caps: &RadixCaps) -> f64 {
    let at_once = caps
        .filter_cluster_slots
        .get(ctas as usize)
        .map_or(0, |&n| u64::from(n));
    if ctas < 2 || at_once == 0 || (rows.vocab as u64) < u64::from(ctas * MIN_CHUNK) {
        return f64::INFINITY;
    }
    let waves = (rows.batch.max(1) as u64).div_ceil(at_once) as f64;
    let part = (rows.vocab as u64).div_ceil(u64::from(ctas)) as f64;
    waves
        * (FILTER_FIXED_US
            + FILTER_MERGE_US
            + part * FILTER_US_PER_ELEM
            + k_cost_us(max_k, FILTER_US_PER_K))
}

/// Estimated time of a filter launch; infinite where the GPU cannot run
/// one.
fn filter_time_us(rows: &Rows, max_k: u32, caps: &RadixCaps) -> f64 {
    let rows_at_once = u64::from(caps.sm_count) * u64::from(caps.filter_ctas_per_sm);
    if rows_at_once == 0 {
        return f64::INFINITY;
    }
    let waves = (rows.batch.max(1) as u64).div_ceil(rows_at_once) as f64;
    waves
        * (FILTER_FIXED_US
            + rows.vocab as f64 * FILTER_US_PER_ELEM
            + k_cost_us(max_k, FILTER_US_PER_K))
}

/// Estimated time of a radix launch with `ctas` CTAs per row, as clusters
/// (`clustered`) or plain CTAs; infinite where the GPU cannot run one row.
fn radix_time_us(rows: &Rows, max_k: u32, ctas: u32, caps: &RadixCaps, clustered: bool) -> f64 {
    let ctas = ctas.max(1);
    let chunk = (rows.vocab as u64).div_ceil(u64::from(ctas));
    let uncached = chunk.saturating_sub(u64::from(caps.cache_elems));
    let rows_at_once = if clustered {
        caps.cluster_slots
            .get(ctas as usize)
            .map_or(0, |&n| u64::from(n))
    } else {
        u64::from(caps.sm_count) * u64::from(caps.ctas_per_sm) / u64::from(ctas)
    };
    if rows_at_once == 0 {
        return f64::INFINITY;
    }
    let waves = (rows.batch.max(1) as u64).div_ceil(rows_at_once) as f64;
    waves
        * (CTA_FIXED_US
            + f64::from(ctas.saturating_sub(8)) * US_PER_CTA_ABOVE_8
            + chunk as f64 * US_PER_ELEM
            + uncached as f64 * US_PER_REREAD
            + k_cost_us(max_k, RADIX_US_PER_K))
}

/// The route of a request of `rows` with largest `top_k` `max_k` on a GPU
/// with `caps`: the pivot path above [`SLAB`]; else the CTAs per row (1 to
/// [`MAX_CLUSTER`], at least 2048 elements each) that minimise the
/// estimated time (waves of the rows the GPU holds at once, each a fixed
/// time plus a time per element of its CTAs' chunks and per element
/// re-read past their cache), as a cluster where the GPU has them, else a
/// cooperative launch when its CTAs fit the GPU at once, else one CTA per
/// row; and the filter route ([`Route::Filter`]: waves of rows, each a
/// fixed time plus a time per element of the row) where the GPU runs it
/// and its estimate is lower (large batches).
///
/// ```
/// use flashsample::{RadixCaps, Route, Rows, plan_route};
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
/// assert_eq!(plan_route(&Rows::contiguous(1, 128_256), 50, &h200), Route::Cluster { ctas: 8 });
/// assert_eq!(plan_route(&Rows::contiguous(16, 128_256), 50, &h200), Route::Cluster { ctas: 8 });
/// assert_eq!(plan_route(&Rows::contiguous(32, 128_256), 50, &h200), Route::Filter);
/// assert_eq!(plan_route(&Rows::contiguous(64, 128_256), 50, &h200), Route::Filter);
/// assert_eq!(plan_route(&Rows::contiguous(128, 128_256), 50, &h200), Route::Filter);
/// assert_eq!(plan_route(&Rows::contiguous(8, 128_256), 2000, &h200), Route::Pivot);
/// ```
pub fn plan_route(rows: &Rows, max_k: u32, caps: &RadixCaps) -> Route {
    if max_k > SLAB {
        return Route::Pivot;
    }
    let by_chunk = (rows.vocab as u64 / u64::from(MIN_CHUNK)).clamp(1, u64::from(MAX_CLUSTER));
    let limit = if caps.max_cluster >= 2 {
        u64::from(caps.max_cluster).min(by_chunk)
    } else {
        // Cooperative: every CTA of the launch resident at once, at most
        // the 8 a row that the cost model was fitted to.
        let slots = u64::from(caps.sm_count) * u64::from(caps.ctas_per_sm);
        (slots / rows.batch.max(1) as u64)
            .min(by_chunk)
            .min(MAX_COOPERATIVE)
    };
    // One CTA per row is a cluster of one where the GPU has clusters.
    let clustered = caps.max_cluster >= 1;
    let mut best = (1u32, radix_time_us(rows, max_k, 1, caps, clustered));
    for ctas in 2..=limit as u32 {
        let t = radix_time_us(rows, max_k, ctas, caps, caps.max_cluster >= 2);
        if t < best.1 {
            best = (ctas, t);
        }
    }
    let mut filter = (Route::Filter, filter_time_us(rows, max_k, caps));
    for ctas in 2..=MAX_FILTER_CLUSTER {
        let t = filter_cluster_time_us(rows, max_k, ctas, caps);
        if t < filter.1 {
            filter = (Route::FilterCluster { ctas }, t);
        }
    }
    if filter.1 < best.1 {
        return filter.0;
    }
    match best.0 {
        1 => Route::SingleCta,
        ctas if caps.max_cluster >= 2 => Route::Cluster { ctas },
        ctas => Route::Cooperative { ctas },
    }
}

/// A kernel handle of the device's loaded module (valid while the module
/// is: the device cache keeps every module loaded for the process).
#[derive(Debug, Clone, Copy)]
struct Func(CUfunction);

// SAFETY: a CUfunction is a driver handle usable from any thread (the
// driver API is thread-safe; calls bind the context first).
unsafe impl Send for Func {}
// SAFETY: as for Send; the handle is never mutated.
unsafe impl Sync for Func {}

/// The radix kernels of one device and what the planner knows of it.
#[derive(Debug)]
struct RadixKernels {
    cluster: Func,
    coop: Func,
    filter: Func,
    /// The filter kernel for launches whose every `top_k` is at most
    /// [`FILTER_SMALL_MAX_K`] (the same layout and launch).
    filter_small: Func,
    /// The kernels of [`RadixInput::Logits`] (no cooperative one).
    logits: LogitsKernels,
    to_logits: Func,
    caps: RadixCaps,
    /// Cooperative CTAs resident per multiprocessor.
    coop_per_sm: u32,
    /// Largest dynamic shared memory of a radix CTA.
    smem_budget: u32,
    /// The filter kernel's candidate buffer, in keys (0: the GPU cannot
    /// run it).
    filter_cap: u32,
    /// Whether the module's filter kernel is the staged one (its shared
    /// memory layout: [`filter_smem_bytes`]).
    filter_staged: bool,
}

/// The radix kernels over f32 logits, for the pivot sampler's radix route
/// (stage 1 only): the same launches as their probability forms.
#[derive(Debug)]
struct LogitsKernels {
    cluster: Func,
    /// The cluster kernel's masking and sampling forms
    /// ([`SelectTail`]).
    cluster_mask: Func,
    cluster_sample: Func,
    filter: Func,
    filter_small: Func,
}

/// What a radix launch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RadixInput {
    /// Probabilities (clean values: NaN, negative and infinite as 0).
    Probs,
    /// Logits in the total order (NaN as -inf), stage 1 only
    /// ([`MODE_SLAB`]), on any route but [`Route::Cooperative`].
    Logits,
}

/// Whether the PTX module `arch` (`"sm_80"`, `"sm_90a"`, ..) runs the
/// staged filter kernel (the row by bulk copies into shared-memory
/// stages): the kernels crate compiles it under `cfg(target_feature =
/// "sm_90")`, which every module from sm_90 on has.
fn filter_staged(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .map(|n| n.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n >= 90)
}

/// The filter kernel's candidate buffer in keys for `optin` bytes of
/// shared memory per CTA: as large as they hold next to the kernel's fixed
/// layout (`staged`: [`filter_staged`]), up to FILTER_MAX_CAP keys; 0 below
/// FILTER_MIN_CAP (no filter).
fn filter_cap_for(optin: u32, staged: bool) -> u32 {
    let fixed = filter_smem_bytes(0, staged);
    let fit = (optin.saturating_sub(fixed) / 8).min(FILTER_MAX_CAP) & !3;
    if fit >= FILTER_MIN_CAP { fit } else { 0 }
}

/// Resident CTAs of `f` per multiprocessor with `smem` bytes each.
fn occupancy(f: Func, smem: u32) -> Result<u32> {
    let mut n = 0;
    // SAFETY: a loaded function; `n` is written by the driver.
    unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut n,
            f.0,
            RADIX_THREADS as i32,
            smem as usize,
        )
        .result()?
    };
    Ok(n.max(0) as u32)
}

impl RadixKernels {
    /// Looks the radix kernels up in `dev`'s loaded module (the module of
    /// its other kernels) and measures what the planner needs.
    fn load(dev: &Device) -> Result<RadixKernels> {
        let ctx = dev.context();
        ctx.bind_to_thread()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: a function of the device's loaded module; the driver
        // writes the module handle.
        unsafe {
            sys::cuFuncGetModule(
                &mut module,
                dev.kernels().topk_topp_sample_f32.cu_function(),
            )
            .result()?
        };
        let attr = |a| ctx.attribute(a).map(|v| v.max(0) as u32);
        let optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let per_sm = attr(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )?;
        let get = |name: &str| -> Result<Func> {
            let c = CString::new(name).map_err(|_| param("kernel", name))?;
            let mut f = std::ptr::null_mut();
            // SAFETY: a loaded module and a NUL-terminated name; the driver
            // writes the handle.
            unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()).result()? };
            // SAFETY: a valid function; the value is the device's limit.
            unsafe {
                sys::cuFuncSetAttribute(
                    f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    optin as i32,
                )
                .result()?
            };
            Ok(Func(f))
        };
        let cluster = get("radix_topk_cluster_f32")?;
        let logits = LogitsKernels {
            cluster: get("radix_topk_cluster_logits_f32")?,
            cluster_mask: get("radix_topk_cluster_mask_logits_f32")?,
            cluster_sample: get("radix_topk_cluster_sample_logits_f32")?,
            filter: get("radix_topk_filter_logits_f32")?,
            filter_small: get("radix_topk_filter_small_logits_f32")?,
        };
        let clusters = dev.arch().starts_with("sm_9")
            && attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? == 1;
        // Every kernel of the cluster route, which share its plans.
        let cluster_route = [
            cluster,
            logits.cluster,
            logits.cluster_mask,
            logits.cluster_sample,
        ];
        if clusters {
            for f in cluster_route {
                // SAFETY: a valid function; 1 allows clusters above the
                // portable size of 8 where the GPU schedules them (the
                // occupancy query below says which).
                unsafe {
                    sys::cuFuncSetAttribute(
                        f.0,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    )
                    .result()?
                };
            }
        }
        let coop = get("radix_topk_coop_f32")?;
        let filter = get("radix_topk_filter_f32")?;
        let filter_small = get("radix_topk_filter_small_f32")?;
        let to_logits = get("radix_probs_to_logits_f32")?;
        // Every figure below holds for all the route's kernels (the least).
        let both = |smem: u32| -> Result<u32> {
            let mut n = u32::MAX;
            for f in cluster_route {
                n = n.min(occupancy(f, smem)?);
            }
            Ok(n)
        };
        // Registers decide how many CTAs fit; they share the shared memory.
        let by_regs = both(RADIX_FIXED_SMEM)?.max(1);
        let smem_budget = (per_sm / by_regs).saturating_sub(1024).min(optin) & !15;
        let ctas_per_sm = both(smem_budget)?.max(1);
        let coop_per_sm = occupancy(coop, smem_budget)?;
        let cache_elems = (smem_budget.saturating_sub(RADIX_FIXED_SMEM) / 4) & !3;
        // The filter's buffer: as large as one CTA's shared memory allows
        // next to its stages (sm_90 on) or its work space.
        let filter_staged = filter_staged(dev.arch());
        let fit = filter_cap_for(optin, filter_staged);
        let filter_per_sm = if fit > 0 {
            let smem = filter_smem_bytes(fit, filter_staged);
            let mut n = u32::MAX;
            for f in [filter, filter_small, logits.filter, logits.filter_small] {
                n = n.min(occupancy(f, smem)?);
            }
            n
        } else {
            0
        };
        let filter_cap = if filter_per_sm > 0 { fit } else { 0 };
        let mut cluster_slots = [0; MAX_CLUSTER as usize + 1];
        if clusters {
            for (c, n) in cluster_slots.iter_mut().enumerate().skip(1) {
                let at_once = |f: Func| {
                    max_active_clusters(ctx, f.0, c as u32, RADIX_THREADS, smem_budget).unwrap_or(0)
                };
                *n = cluster_route.into_iter().map(at_once).min().unwrap_or(0);
            }
        }
        let max_cluster = (1..=MAX_CLUSTER)
            .rev()
            .find(|&c| cluster_slots[c as usize] > 0)
            .unwrap_or(0);
        // Clusters of filter CTAs: the staged kernel (sm_90 on), whose
        // buffer holds the cluster's merged gathers.
        let mut filter_cluster_slots = [0; MAX_FILTER_CLUSTER as usize + 1];
        if clusters && filter_staged && filter_per_sm > 0 {
            let smem = filter_smem_bytes(filter_cap, filter_staged);
            for (c, n) in filter_cluster_slots.iter_mut().enumerate().skip(2) {
                if c as u32 * GATHER_CAP <= filter_cap {
                    let at_once = |f: Func| {
                        max_active_clusters(ctx, f.0, c as u32, RADIX_THREADS, smem).unwrap_or(0)
                    };
                    *n = [filter, filter_small, logits.filter, logits.filter_small]
                        .into_iter()
                        .map(at_once)
                        .min()
                        .unwrap_or(0);
                }
            }
        }
        Ok(RadixKernels {
            cluster,
            coop,
            filter,
            filter_small,
            logits,
            to_logits,
            caps: RadixCaps {
                sm_count: dev.sm_count(),
                max_cluster,
                ctas_per_sm,
                cache_elems,
                cluster_slots,
                filter_ctas_per_sm: filter_per_sm,
                filter_cluster_slots,
            },
            coop_per_sm,
            smem_budget,
            filter_cap,
            filter_staged,
        })
    }
}

fn cooperative_attr() -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute is a valid (ignored) attribute.
    let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    a.value.cooperative = 1;
    a
}

/// The radix kernels of `dev`, looked up once per device and process.
fn radix_kernels(dev: &Device) -> Result<&'static RadixKernels> {
    type Cache = Mutex<Vec<(usize, &'static RadixKernels)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = Arc::as_ptr(dev.context()) as usize;
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, k)) = cache.iter().find(|(c, _)| *c == key) {
        return Ok(k);
    }
    // One per device for the life of the process, as the device cache.
    let k: &'static RadixKernels = Box::leak(Box::new(RadixKernels::load(dev)?));
    cache.push((key, k));
    Ok(k)
}

/// How a launch is configured beyond grid, block and shared memory.
#[derive(Clone, Copy)]
enum LaunchKind {
    Plain,
    Cluster(u32),
    Cooperative,
}

/// Launches `f` with `args` through `cuLaunchKernelEx`.
///
/// # Safety
/// `args` point to the kernel's parameters, in order, with the types its
/// signature has; the configuration satisfies its launch contract.
unsafe fn launch(
    stream: &CudaStream,
    f: Func,
    grid: (u32, u32),
    smem: u32,
    kind: LaunchKind,
    args: &mut [*mut c_void],
) -> Result<()> {
    let mut attr = match kind {
        LaunchKind::Plain => None,
        LaunchKind::Cluster(c) => Some(cluster_attr(c)),
        LaunchKind::Cooperative => Some(cooperative_attr()),
    };
    let cfg = LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (RADIX_THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    // SAFETY: the caller's contract.
    unsafe {
        launch_ex(
            stream,
            f.0,
            cfg,
            attr.as_mut().map_or(&mut [], std::slice::from_mut),
            args,
        )
    }
}

/// The device pointers of one radix launch (0 for buffers a mode leaves
/// untouched).
struct RadixPtrs {
    probs: CUdeviceptr,
    top_k: CUdeviceptr,
    top_p: CUdeviceptr,
    seed: CUdeviceptr,
    offset: CUdeviceptr,
    slab_values: CUdeviceptr,
    slab_indices: CUdeviceptr,
    slab_counts: CUdeviceptr,
    tokens: CUdeviceptr,
    valid: CUdeviceptr,
    min_p: CUdeviceptr,
    temperature: CUdeviceptr,
    kept: CUdeviceptr,
}

/// Where a radix launch writes.
enum Target<'a> {
    Slab(&'a mut Slab),
    Sample(&'a mut SampleOutput),
}

impl Device {
    /// The route [`Device::top_k_top_p_sampling_from_probs`] takes for
    /// `rows` with largest `top_k` `max_k` on this GPU (see
    /// [`plan_route`]).
    ///
    /// ```no_run
    /// # fn main() -> flashsample::Result<()> {
    /// use flashsample::{Device, Route, Rows};
    /// let dev = Device::new(0)?;
    /// let route = dev.route(Rows::contiguous(128, 128_256), 50)?;
    /// assert_ne!(route, Route::Pivot);
    /// # Ok(()) }
    /// ```
    pub fn route(&self, rows: Rows, max_k: u32) -> Result<Route> {
        Ok(plan_route(&rows, max_k, &radix_kernels(self)?.caps))
    }

    /// What the route planner knows of this GPU.
    pub fn radix_caps(&self) -> Result<RadixCaps> {
        Ok(radix_kernels(self)?.caps)
    }

    /// Stage 1 alone: the exact top-k of every row of `[batch, vocab]` f32
    /// probabilities into `slab` (see [`Slab`]), by the radix route
    /// [`Device::route`] picks (or the workspace's
    /// [`RadixWorkspace::force_route`]). Rejects `max_k > SLAB` and the pivot
    /// route. Returns the route taken. The slab of a row depends only on the
    /// row and its `top_k`.
    ///
    /// ```no_run
    /// # fn main() -> flashsample::Result<()> {
    /// use flashsample::{Device, RadixWorkspace, Rows, Slab, TopKTopPParams};
    /// let dev = Device::new(0)?;
    /// let stream = dev.new_stream()?;
    /// let probs = stream.clone_htod(&[0.1f32, 0.4, 0.2, 0.3]).map_err(flashsample::Error::from)?;
    /// let params = TopKTopPParams::upload(&stream, &[2], &[1.0], &[0], &[0])?;
    /// let mut slab = Slab::new(&stream, 1)?;
    /// let mut ws = RadixWorkspace::new(&stream)?;
    /// dev.top_k_to_slab(&stream, &probs.as_view(), Rows::contiguous(1, 4), &params, &mut slab, &mut ws)?;
    /// let idx = stream.clone_dtoh(&slab.indices).map_err(flashsample::Error::from)?;
    /// assert_eq!(&idx[..2], &[1, 3]);
    /// # Ok(()) }
    /// ```
    pub fn top_k_to_slab(
        &self,
        stream: &Arc<CudaStream>,
        probs: &CudaView<'_, f32>,
        rows: Rows,
        params: &TopKTopPParams,
        slab: &mut Slab,
        ws: &mut RadixWorkspace,
    ) -> Result<Route> {
        let route = ws.route_of(self, rows, params)?;
        if route == Route::Pivot {
            return Err(param("route", route));
        }
        slab.check(rows.batch)?;
        self.radix(route, stream, probs, rows, params, Target::Slab(slab), ws)?;
        Ok(route)
    }

    /// One token per row of `[batch, vocab]` f32 probabilities: top-k, then
    /// top-p on the top-k's mass, then an inverse-CDF draw from the kept
    /// prefix renormalised (see the module docs for the exact semantics);
    /// `valid = 0` and token 0 for a row whose top-k has no positive mass.
    /// Deterministic: a row's token depends only on the row, its `top_k`,
    /// `top_p`, seed and offset. Takes the route [`Device::route`] picks (or
    /// the workspace's [`RadixWorkspace::force_route`]) and returns it.
    ///
    /// ```no_run
    /// # fn main() -> flashsample::Result<()> {
    /// use flashsample::{Device, RadixWorkspace, Rows, SampleOutput, TopKTopPParams};
    /// let dev = Device::new(0)?;
    /// let stream = dev.new_stream()?;
    /// let probs = stream.clone_htod(&[0.1f32, 0.6, 0.0, 0.3]).map_err(flashsample::Error::from)?;
    /// let params = TopKTopPParams::upload(&stream, &[2], &[0.5], &[7], &[0])?;
    /// let mut out = SampleOutput::new(&stream, 1)?;
    /// let mut ws = RadixWorkspace::new(&stream)?;
    /// dev.top_k_top_p_sampling_from_probs(&stream, &probs.as_view(), Rows::contiguous(1, 4),
    ///     &params, &mut out, &mut ws)?;
    /// let tokens = stream.clone_dtoh(&out.tokens).map_err(flashsample::Error::from)?;
    /// assert_eq!(tokens[0], 1); // top-p 0.5 keeps only the 0.6
    /// # Ok(()) }
    /// ```
    pub fn top_k_top_p_sampling_from_probs(
        &self,
        stream: &Arc<CudaStream>,
        probs: &CudaView<'_, f32>,
        rows: Rows,
        params: &TopKTopPParams,
        out: &mut SampleOutput,
        ws: &mut RadixWorkspace,
    ) -> Result<Route> {
        let route = ws.route_of(self, rows, params)?;
        let outputs = out.tokens.len().min(out.valid.len());
        if outputs < rows.batch {
            return Err(shape("tokens and valid", rows.batch, outputs));
        }
        if route == Route::Pivot {
            self.pivot(stream, probs, rows, params, out, ws)?;
        } else {
            self.radix(route, stream, probs, rows, params, Target::Sample(out), ws)?;
        }
        Ok(route)
    }

    /// The pivot route: `ln p` into the workspace, then the Qrita sampler.
    fn pivot(
        &self,
        stream: &Arc<CudaStream>,
        probs: &CudaView<'_, f32>,
        rows: Rows,
        params: &TopKTopPParams,
        out: &mut SampleOutput,
        ws: &mut RadixWorkspace,
    ) -> Result<()> {
        self.check_stream(stream)?;
        rows.validate("probs", probs.len())?;
        params.check(rows.batch)?;
        let k = radix_kernels(self)?;
        let len = rows.batch * rows.vocab;
        if ws.logits.len() < len {
            ws.logits = stream.alloc_zeros(len)?;
        }
        let args = RadixArgs {
            batch: rows.batch as u32,
            vocab: rows.vocab as u32,
            row_stride: rows.row_stride as u64,
            chunk: 0,
            cache_slots: 0,
            mode: 0,
            reserved: 0,
        };
        let grid = (
            rows.vocab.div_ceil(RADIX_THREADS as usize).min(1024) as u32,
            rows.batch.min(MAX_GRID_Y) as u32,
        );
        {
            let (mut p, _g1) = probs.device_ptr(stream);
            let (mut l, _g2) = ws.logits.device_ptr_mut(stream);
            let mut a = args;
            let mut list = [
                &mut p as *mut CUdeviceptr as *mut c_void,
                &mut l as *mut CUdeviceptr as *mut c_void,
                &mut a as *mut RadixArgs as *mut c_void,
            ];
            // SAFETY: the parameters of `radix_probs_to_logits_f32` in
            // order; `probs` holds the validated rows, `logits` batch *
            // vocab elements; blocks of RADIX_THREADS, no shared memory.
            unsafe { launch(stream, k.to_logits, grid, 0, LaunchKind::Plain, &mut list)? };
        }
        let logits = ws.logits.slice(..len);
        self.sample_top_k_top_p(
            stream,
            &logits,
            Rows::contiguous(rows.batch, rows.vocab),
            &params.trunc,
            out,
            &mut ws.pivot,
        )
    }

    /// A radix launch of `route` over probabilities writing `target`.
    #[allow(clippy::too_many_arguments)]
    fn radix(
        &self,
        route: Route,
        stream: &Arc<CudaStream>,
        probs: &CudaView<'_, f32>,
        rows: Rows,
        params: &TopKTopPParams,
        target: Target<'_>,
        ws: &mut RadixWorkspace,
    ) -> Result<()> {
        self.check_stream(stream)?;
        rows.validate("probs", probs.len())?;
        params.check(rows.batch)?;
        let mode = match target {
            Target::Slab(_) => MODE_SLAB,
            Target::Sample(_) => MODE_SAMPLE,
        };
        let plan =
            radix_kernels(self)?.plan(route, RadixInput::Probs, &rows, params.max_k(), mode)?;
        if matches!(plan.kind, LaunchKind::Cooperative) {
            ws.fit_coop(stream, plan.slots, plan.ctas as usize)?;
        }
        let t = &params.trunc;
        let (probs_p, _g1) = probs.device_ptr(stream);
        let (top_k, _g2) = t.top_k.device_ptr(stream);
        let (top_p, _g3) = t.top_p.device_ptr(stream);
        let (seed, _g4) = t.row.seed.device_ptr(stream);
        let (offset, _g5) = t.row.offset.device_ptr(stream);
        let mut p = RadixPtrs {
            probs: probs_p,
            top_k,
            top_p,
            seed,
            offset,
            slab_values: 0,
            slab_indices: 0,
            slab_counts: 0,
            tokens: 0,
            valid: 0,
            min_p: 0,
            temperature: 0,
            kept: 0,
        };
        // Output guards live until after the launch.
        let _out_guards = match target {
            Target::Slab(s) => {
                let (v, g1) = s.values.device_ptr_mut(stream);
                let (i, g2) = s.indices.device_ptr_mut(stream);
                let (c, g3) = s.counts.device_ptr_mut(stream);
                (p.slab_values, p.slab_indices, p.slab_counts) = (v, i, c);
                (g1, g2, Some(g3))
            }
            Target::Sample(o) => {
                let (tok, g1) = o.tokens.device_ptr_mut(stream);
                let (v, g2) = o.valid.device_ptr_mut(stream);
                (p.tokens, p.valid) = (tok, v);
                (g1, g2, None)
            }
        };
        let (ws_hist, _g6) = ws.hist.device_ptr_mut(stream);
        let (ws_gather, _g7) = ws.gather.device_ptr_mut(stream);
        let (ws_counts, _g8) = ws.counts.device_ptr_mut(stream);
        let (ws_barriers, _g9) = ws.barriers.device_ptr_mut(stream);
        // The cluster and filter kernels do not touch the workspace.
        let coop = match plan.kind {
            LaunchKind::Cooperative => [ws_hist, ws_gather, ws_counts, ws_barriers],
            _ => [0; 4],
        };
        // SAFETY: `probs` holds the validated rows, the parameter buffers
        // at least `batch` rows (checked), the outputs the mode writes
        // `batch` rows (checked; the others are 0 and unread), the
        // cooperative workspace `slots` rows of `ctas` CTAs with zeroed
        // counts (grown above), all live buffers of this stream's context.
        unsafe { launch_radix(stream, &plan, p, coop) }
    }
}

/// What the select over logits may finish in its own launch on the
/// cluster route (the cluster kernel's masking and sampling forms, one CTA
/// a row included): the pivot sampler's cut of min-p and top-p over each
/// row's top-k, as the slab kernels make it, then the masking or the
/// draw.
#[derive(Clone, Copy)]
pub(crate) enum SelectTail {
    /// -inf over every logit outside the row's kept set, the kept counts
    /// to `kept` (`batch` u32).
    Mask { kept: CUdeviceptr },
    /// One draw per row with its `seed` and `offset`, the token and its
    /// validity to `tokens` and `valid` (`batch` each).
    Sample {
        seed: CUdeviceptr,
        offset: CUdeviceptr,
        tokens: CUdeviceptr,
        valid: CUdeviceptr,
    },
}

/// What [`logits_to_slab`] left for the caller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    /// The slab is written; the cut (and the masking) are still to do.
    Slab,
    /// The slab is written and every logit outside it is -inf: the cut
    /// remains, with -inf over the slab entries it drops.
    MaskedOutsideSlab,
    /// The tail is done (no slab written).
    Complete,
}

/// The top-k slab of `[batch, vocab]` f32 logits at `logits` (rows
/// `rows.row_stride` apart; NaN counts as -inf and comes back as -inf) by
/// the radix `route` ([`RadixInput::Logits`]: not the cooperative one),
/// for rows with `top_k` at most `max_k` (at most [`SLAB`]): the pivot
/// sampler's radix route ([`crate::TopkToppRoute::Radix`]). With a `tail`,
/// on the cluster route its own launch does it instead
/// ([`Finished::Complete`]); else a [`SelectTail::Mask`], where the
/// route's kernel can ([`MODE_MASK`]: the staged filter route, `vocab` at
/// most [`FILTER_MASK_MAX_VOCAB`]) and that measured faster than the
/// separate apply pass, also writes -inf over every logit outside its
/// row's slab ([`Finished::MaskedOutsideSlab`]).
///
/// # Safety
/// `logits` holds the validated rows (writable with a
/// [`SelectTail::Mask`]); `params` (`top_k`, `top_p`, `min_p`,
/// `temperature`) hold `rows.batch` elements each, every `top_k` from 1 to
/// `max_k` and below `vocab`; `values` and `indices` hold `rows.batch *
/// SLAB` elements and `counts` `rows.batch`; the tail's pointers
/// `rows.batch` elements; all live buffers of `stream`'s context, not
/// written by other work meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn logits_to_slab(
    dev: &Device,
    stream: &CudaStream,
    route: Route,
    logits: CUdeviceptr,
    rows: &Rows,
    [top_k, top_p, min_p, temperature]: [CUdeviceptr; 4],
    max_k: u32,
    [values, indices, counts]: [CUdeviceptr; 3],
    tail: Option<SelectTail>,
) -> Result<Finished> {
    let kernels = radix_kernels(dev)?;
    let cluster_route = matches!(route, Route::Cluster { .. } | Route::SingleCta);
    // `can_mask_in_place` holds on the filter route only.
    let masks = matches!(tail, Some(SelectTail::Mask { .. }))
        && kernels.can_mask_in_place(route, rows)
        && kernels.mask_in_place_pays(rows, max_k);
    let mode = if masks {
        MODE_SLAB | MODE_MASK
    } else {
        MODE_SLAB
    };
    let mut plan = kernels.plan(route, RadixInput::Logits, rows, max_k, mode)?;
    let mut p = RadixPtrs {
        probs: logits,
        top_k,
        top_p: 0,
        seed: 0,
        offset: 0,
        slab_values: values,
        slab_indices: indices,
        slab_counts: counts,
        tokens: 0,
        valid: 0,
        min_p: 0,
        temperature: 0,
        kept: 0,
    };
    let finished = match tail {
        Some(t) if cluster_route => {
            (p.top_p, p.min_p, p.temperature) = (top_p, min_p, temperature);
            plan.func = match t {
                SelectTail::Mask { kept } => {
                    p.kept = kept;
                    kernels.logits.cluster_mask
                }
                SelectTail::Sample {
                    seed,
                    offset,
                    tokens,
                    valid,
                } => {
                    (p.seed, p.offset, p.tokens, p.valid) = (seed, offset, tokens, valid);
                    kernels.logits.cluster_sample
                }
            };
            Finished::Complete
        }
        _ if masks => Finished::MaskedOutsideSlab,
        _ => Finished::Slab,
    };
    // SAFETY: the caller's contract; the plan is never cooperative for
    // logits (no workspace), and masks only on the route and rows that
    // `can_mask_in_place` accepts (`plan` checks); the cluster route's
    // masking and sampling forms take the cluster kernel's plan (the same
    // launch contract, their occupancy in the caps) with the pointers
    // they read and write.
    unsafe { launch_radix(stream, &plan, p, [0; 4]) }?;
    Ok(finished)
}

/// A radix launch but its pointers: kernel, launch kind, CTAs per row,
/// rows in flight, shared memory and arguments.
struct RadixPlan {
    func: Func,
    kind: LaunchKind,
    ctas: u32,
    slots: usize,
    smem: u32,
    args: RadixArgs,
}

impl RadixKernels {
    /// Whether the select of `route` over `rows` of logits can mask them in
    /// place ([`MODE_MASK`]): the filter route of one CTA a row, in the
    /// modules whose filter kernel stages its rounds in shared memory
    /// (where the row's bitmap goes), `vocab` at most
    /// [`FILTER_MASK_MAX_VOCAB`]. The launch contract; [`RadixKernels::plan`]
    /// rejects [`MODE_MASK`] elsewhere.
    fn can_mask_in_place(&self, route: Route, rows: &Rows) -> bool {
        route == Route::Filter
            && self.filter_cap > 0
            && self.filter_staged
            && rows.vocab <= FILTER_MASK_MAX_VOCAB as usize
    }

    /// Whether masking in place pays for `rows` whose `top_k` are at most
    /// `max_k` on the filter route, as measured against the separate apply
    /// pass (H100, session 41): a top-k of at most [`FILTER_SMALL_MAX_K`]
    /// (the cut then drops few slab entries, each written on its own
    /// afterwards: at `k = 1000` those writes cost more than the pass they
    /// save), and rows that fit one wave of filter CTAs, or rows whose
    /// fixed time in the cost model exceeds their streaming time (the
    /// select is then compute-bound and the writes overlap it; V = 32000
    /// gained 3 to 10 % at B = 512 and 1024, V >= 128256 lost 1 to 9 %).
    fn mask_in_place_pays(&self, rows: &Rows, max_k: u32) -> bool {
        let one_wave = (rows.batch as u64)
            <= u64::from(self.caps.sm_count) * u64::from(self.caps.filter_ctas_per_sm);
        let compute_bound = rows.vocab as f64 * FILTER_US_PER_ELEM <= FILTER_FIXED_US;
        max_k <= FILTER_SMALL_MAX_K && (one_wave || compute_bound)
    }

    /// The launch of `route` over `input` for `rows` whose `top_k` are at
    /// most `max_k`, writing `mode`; rejects `max_k > SLAB`, the pivot
    /// route, routes the GPU cannot run, the cooperative route for logits,
    /// and [`MODE_MASK`] where [`RadixKernels::can_mask_in_place`] does
    /// not hold.
    fn plan(
        &self,
        route: Route,
        input: RadixInput,
        rows: &Rows,
        max_k: u32,
        mode: u32,
    ) -> Result<RadixPlan> {
        if max_k > SLAB {
            return Err(param("top_k", max_k));
        }
        if mode & MODE_MASK != 0
            && !(input == RadixInput::Logits && self.can_mask_in_place(route, rows))
        {
            return Err(param("mode", mode));
        }
        let caps = self.caps;
        let batch = rows.batch;
        let (cluster, filter, filter_small) = match input {
            RadixInput::Probs => (self.cluster, self.filter, self.filter_small),
            RadixInput::Logits => (
                self.logits.cluster,
                self.logits.filter,
                self.logits.filter_small,
            ),
        };
        let filter_func = if max_k <= FILTER_SMALL_MAX_K {
            filter_small
        } else {
            filter
        };
        let (ctas, kind, func) = match route {
            Route::Cluster { ctas } if (1..=caps.max_cluster).contains(&ctas) => {
                (ctas, LaunchKind::Cluster(ctas), cluster)
            }
            Route::Cooperative { ctas }
                if input == RadixInput::Probs
                    && ctas >= 1
                    && ctas <= caps.sm_count * self.coop_per_sm =>
            {
                (ctas, LaunchKind::Cooperative, self.coop)
            }
            // An explicit cluster of one where the GPU has clusters (the
            // kernel then uses the cluster instructions on itself).
            Route::SingleCta if caps.max_cluster >= 1 => (1, LaunchKind::Cluster(1), cluster),
            Route::SingleCta => (1, LaunchKind::Plain, cluster),
            Route::Filter if self.filter_cap > 0 => (1, LaunchKind::Plain, filter_func),
            Route::FilterCluster { ctas }
                if caps
                    .filter_cluster_slots
                    .get(ctas as usize)
                    .is_some_and(|&n| n > 0) =>
            {
                (ctas, LaunchKind::Cluster(ctas), filter_func)
            }
            _ => return Err(param("route", route)),
        };
        let chunk = rows.vocab.div_ceil(ctas as usize).div_ceil(4) * 4;
        let filter = matches!(route, Route::Filter | Route::FilterCluster { .. });
        let (cache_slots, smem) = if filter {
            // The filter's `cache_slots` is its candidate buffer in keys.
            (
                self.filter_cap,
                filter_smem_bytes(self.filter_cap, self.filter_staged),
            )
        } else {
            let slots = (chunk + 4).min(caps.cache_elems as usize) as u32 & !3;
            let smem = radix_smem_bytes(slots);
            if smem > self.smem_budget {
                return Err(param("shared memory", smem));
            }
            (slots, smem)
        };
        let slots = match kind {
            LaunchKind::Cooperative => {
                let resident = (caps.sm_count * self.coop_per_sm / ctas) as usize;
                batch.min(resident)
            }
            // The filter's CTAs (clusters) loop over the rows: as many as
            // the GPU holds at once.
            _ if route == Route::Filter => {
                let resident = caps.sm_count.max(1) as usize * caps.filter_ctas_per_sm as usize;
                batch.min(resident).min(MAX_GRID_Y)
            }
            _ if filter => {
                let resident = caps.filter_cluster_slots[ctas as usize] as usize;
                batch.min(resident).min(MAX_GRID_Y)
            }
            _ => batch.min(MAX_GRID_Y),
        };
        Ok(RadixPlan {
            func,
            kind,
            ctas,
            slots,
            smem,
            args: RadixArgs {
                batch: batch as u32,
                vocab: rows.vocab as u32,
                row_stride: rows.row_stride as u64,
                chunk: chunk as u32,
                cache_slots,
                mode,
                reserved: 0,
            },
        })
    }
}

/// Launches a radix plan with its pointers `p` and the cooperative
/// workspace `coop` (histograms, gather buffers, counts, barrier words; 0
/// for the other routes, which never read it).
///
/// # Safety
/// `p.probs` holds the plan's rows (`args.batch` rows `args.row_stride`
/// apart, `args.vocab` readable each) in the plan's input; `p.top_k`
/// holds `batch` elements of at most the plan's `max_k`, and the pointers
/// the plan's mode reads or writes (`top_p`, `seed`, `offset`, `tokens`,
/// `valid` for [`MODE_SAMPLE`]; the slab's for [`MODE_SLAB`]) `batch` rows;
/// a cooperative plan's workspace holds `slots` rows of `ctas` CTAs with
/// zeroed counts ([`RadixWorkspace::fit_coop`]); all live buffers of
/// `stream`'s context that no other work writes meanwhile.
unsafe fn launch_radix(
    stream: &CudaStream,
    plan: &RadixPlan,
    mut p: RadixPtrs,
    mut coop: [CUdeviceptr; 4],
) -> Result<()> {
    let mut args = plan.args;
    let mut list: Vec<*mut c_void> = [
        &mut p.probs,
        &mut p.top_k,
        &mut p.top_p,
        &mut p.seed,
        &mut p.offset,
        &mut p.slab_values,
        &mut p.slab_indices,
        &mut p.slab_counts,
        &mut p.tokens,
        &mut p.valid,
        &mut p.min_p,
        &mut p.temperature,
        &mut p.kept,
    ]
    .into_iter()
    .map(|x| x as *mut CUdeviceptr as *mut c_void)
    .collect();
    list.extend(
        coop.iter_mut()
            .map(|x| x as *mut CUdeviceptr as *mut c_void),
    );
    list.push(&mut args as *mut RadixArgs as *mut c_void);
    // SAFETY: the parameters of every radix kernel (one signature; the
    // small filter kernels only for `top_k` at most FILTER_SMALL_MAX_K,
    // which the plan checked) in order, their buffers the caller's; the
    // plan's grid has `ctas * chunk >= vocab`, blocks of RADIX_THREADS, the
    // shared memory of `cache_slots` (within the function's limit; for the
    // filter a buffer of `filter_cap` keys, at least FILTER_MIN_CAP, in the
    // layout of the module's kernel (`filter_staged`), whose shared memory
    // the occupancy query accepted), a cluster of `ctas` only where the GPU
    // has them (checked against `max_cluster`), and a cooperative grid
    // that fits the GPU (checked against its occupancy).
    unsafe {
        launch(
            stream,
            plan.func,
            (plan.ctas, plan.slots as u32),
            plan.smem,
            plan.kind,
            &mut list,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Cluster slots assumed (132 / c); the GPU reports its own.
    const H200: RadixCaps = RadixCaps {
        sm_count: 132,
        max_cluster: 8,
        ctas_per_sm: 1,
        cache_elems: 48_764,
        cluster_slots: [0, 132, 66, 44, 33, 26, 22, 18, 16, 0, 0, 0, 0, 0, 0, 0, 0],
        filter_ctas_per_sm: 1,
        filter_cluster_slots: [0; MAX_FILTER_CLUSTER as usize + 1],
    };
    // The clusters at once the H200 reported (session 6).
    const H200_MEASURED: RadixCaps = RadixCaps {
        cluster_slots: [0, 132, 66, 39, 30, 22, 17, 15, 15, 0, 0, 0, 0, 0, 0, 0, 0],
        ..H200
    };

    #[test]
    fn filter_buffer_fits_each_layout() {
        for (arch, staged) in [
            ("sm_80", false),
            ("sm_89", false),
            ("sm_90", true),
            ("sm_90a", true),
            ("sm_100a", true),
        ] {
            assert_eq!(filter_staged(arch), staged, "{arch}");
        }
        // Opt-in shared memory per CTA: H100 / H200 (227 KiB), A100
        // (163 KiB), sm_86 / sm_89 (99 KiB).
        let h200 = 232_448;
        let cap = filter_cap_for(h200, true);
        assert_eq!(cap, 12_608);
        assert!(filter_smem_bytes(cap, true) <= h200);
        assert_eq!(filter_cap_for(h200, false), FILTER_MAX_CAP);
        assert_eq!(filter_cap_for(166_912, false), FILTER_MAX_CAP);
        assert_eq!(filter_cap_for(101_376, false), 0);
        assert_eq!(filter_cap_for(101_376, true), 0);
        for optin in [0, 100_000, 166_912, 200_000, h200, 300_000] {
            for staged in [false, true] {
                let cap = filter_cap_for(optin, staged);
                assert!(cap == 0 || (FILTER_MIN_CAP..=FILTER_MAX_CAP).contains(&cap));
                assert!(cap == 0 || filter_smem_bytes(cap, staged) <= optin);
                assert_eq!(cap % 4, 0);
            }
        }
    }

    #[test]
    fn routes_follow_k_and_the_gpu() {
        let rows = Rows::contiguous(1, 128_256);
        assert_eq!(plan_route(&rows, 1025, &H200), Route::Pivot);
        assert_eq!(plan_route(&rows, 1024, &H200), Route::Cluster { ctas: 8 });
        // Small vocabularies are not split below MIN_CHUNK elements (one
        // CTA per row, a cluster's or the filter's).
        let small = plan_route(&Rows::contiguous(1, 3000), 50, &H200);
        assert!(
            matches!(small, Route::SingleCta | Route::Filter),
            "{small:?}"
        );
        let ampere = RadixCaps {
            max_cluster: 0,
            cluster_slots: [0; MAX_CLUSTER as usize + 1],
            ..H200
        };
        assert_eq!(
            plan_route(&rows, 50, &ampere),
            Route::Cooperative { ctas: 8 }
        );
        // A full GPU of rows: one CTA per row, no cooperation needed; the
        // filter's where the GPU runs it.
        assert_eq!(
            plan_route(&Rows::contiguous(512, 128_256), 50, &ampere),
            Route::Filter
        );
        let no_filter = RadixCaps {
            filter_ctas_per_sm: 0,
            ..ampere
        };
        assert_eq!(
            plan_route(&Rows::contiguous(512, 128_256), 50, &no_filter),
            Route::SingleCta
        );
        // Every planned radix route respects the limits.
        for batch in [1usize, 2, 4, 8, 16, 32, 64, 128, 1024] {
            for vocab in [1usize, 5000, 32_768, 128_256, 151_936, 262_144] {
                let rows = Rows::contiguous(batch, vocab);
                for caps in [H200, ampere, no_filter] {
                    match plan_route(&rows, 50, &caps) {
                        Route::Cluster { ctas } => {
                            assert!((2..=caps.max_cluster).contains(&ctas));
                            assert!(vocab as u32 / ctas >= MIN_CHUNK);
                        }
                        Route::Cooperative { ctas } => {
                            assert!(ctas >= 2 && batch as u32 * ctas <= caps.sm_count);
                        }
                        Route::SingleCta => {}
                        Route::Filter => assert!(caps.filter_ctas_per_sm > 0),
                        Route::FilterCluster { ctas } => {
                            assert!(caps.filter_cluster_slots[ctas as usize] > 0);
                        }
                        Route::Pivot => panic!("k = 50 is a radix request"),
                    }
                }
            }
        }
    }

    #[test]
    fn the_cost_model_spreads_small_batches() {
        for vocab in [32_768usize, 128_256, 151_936, 262_144] {
            let mut line = format!("V = {vocab}:");
            for batch in [1usize, 2, 4, 8, 16, 32, 64, 128] {
                let r = plan_route(&Rows::contiguous(batch, vocab), 50, &H200);
                line += &format!(" B={batch} {r:?};");
            }
            println!("{line}");
            let one = plan_route(&Rows::contiguous(1, vocab), 50, &H200);
            assert!(
                matches!(one, Route::Cluster { ctas: 4.. }),
                "V = {vocab}: {one:?}"
            );
        }
        // The filter takes large batches, the clusters small ones, on the
        // assumed and on the measured clusters at once.
        for caps in [H200, H200_MEASURED] {
            for vocab in [32_768usize, 128_256, 151_936, 262_144] {
                for batch in [1usize, 2, 4, 8, 16] {
                    let r = plan_route(&Rows::contiguous(batch, vocab), 50, &caps);
                    assert!(
                        matches!(r, Route::Cluster { .. }),
                        "B={batch} V={vocab}: {r:?}"
                    );
                }
                // From B = 32 where the rows are long (measured: 25.5 us
                // against 33.0 for clusters of 3 at V = 128256).
                let from = if vocab >= 128_256 { 32 } else { 64 };
                for batch in [32usize, 64, 128, 256, 1024] {
                    let r = plan_route(&Rows::contiguous(batch, vocab), 50, &caps);
                    if batch >= from {
                        assert_eq!(r, Route::Filter, "B={batch} V={vocab}");
                    }
                }
            }
        }
        // Hopper's non-portable clusters (the H200's measured slots, session
        // 10): 16 CTAs for long rows at B = 1, 8 for short ones.
        let h200_16 = RadixCaps {
            max_cluster: 16,
            cluster_slots: [0, 132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7],
            ..H200
        };
        let long = plan_route(&Rows::contiguous(1, 128_256), 50, &h200_16);
        assert_eq!(long, Route::Cluster { ctas: 16 });
        let short = plan_route(&Rows::contiguous(1, 32_768), 50, &h200_16);
        assert_eq!(short, Route::Cluster { ctas: 8 });
        // Filter clusters of 2 to 4 (session 11, V = 128256, the slots of the
        // radix clusters of session 6): clusters of 16
        // radix CTAs at B <= 4 and at k = 1000 up to B = 16, the split filter
        // from B = 8 at k = 50 and from B = 32 at k = 1000, one filter CTA a
        // row once the clusters need a second wave.
        let h200_fc = RadixCaps {
            filter_cluster_slots: [0, 0, 66, 39, 30],
            ..h200_16
        };
        for (batch, k, want) in [
            (1, 50, Route::Cluster { ctas: 16 }),
            (4, 50, Route::Cluster { ctas: 16 }),
            (8, 50, Route::FilterCluster { ctas: 4 }),
            (16, 50, Route::FilterCluster { ctas: 4 }),
            (32, 50, Route::FilterCluster { ctas: 3 }),
            (64, 50, Route::FilterCluster { ctas: 2 }),
            (128, 50, Route::Filter),
            (1, 1000, Route::Cluster { ctas: 16 }),
            (32, 1000, Route::FilterCluster { ctas: 3 }),
        ] {
            let got = plan_route(&Rows::contiguous(batch, 128_256), k, &h200_fc);
            assert_eq!(got, want, "B={batch} k={k}");
        }
        let t1 = radix_time_us(&Rows::contiguous(128, 128_256), 50, 1, &H200, true);
        let t8 = radix_time_us(&Rows::contiguous(128, 128_256), 50, 8, &H200, true);
        assert!(t1.is_finite() && t8.is_finite() && t1 > 0.0 && t8 > 0.0);
    }
}
