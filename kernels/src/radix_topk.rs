//! `radix_topk`: exact per-row top-k of f32 probabilities into a sorted
//! `[batch, SLAB]` slab by radix select, and sparse top-p sampling from it
//! (issue 5, FlashInfer's "cake" route). The decisions are the portable
//! functions of [`crate::radix_select`]; see its docs for the algorithm.
//!
//! The CTAs of a row each own a chunk of it. The streaming pass reads the
//! chunk once from global memory, keeps its clean bits in shared memory
//! (`cache_slots` of them; the rest is read again from L2 by later passes)
//! and histograms the first digit; the CTAs then exchange histograms, and
//! every CTA finds the same crossing bucket. Later passes (crowded buckets,
//! ties) run over the cached chunk. The gather sends every key at or above
//! the crossing bucket to the row's first CTA, which sorts them with a
//! bitonic network, writes the slab and (stage 2, fused for every `k`)
//! draws the row's token. Two exchanges:
//!
//! - [`radix_topk_cluster_f32`]: on sm_90, the row's CTAs form a thread
//!   block cluster and exchange through distributed shared memory
//!   (`mapa`, `ld`/`st`/`atom.shared::cluster`, `barrier.cluster`); on
//!   older GPUs (no clusters) the same entry point runs one CTA per row.
//! - [`radix_topk_coop_f32`]: a cooperative launch whose CTAs exchange
//!   through global memory and a per-row grid barrier (the multi-CTA
//!   fallback of GPUs without clusters, runnable on every GPU).
//!
//! A third kernel, [`radix_topk_filter_f32`] (the large-batch route), runs
//! one CTA per row with no chunk cache: it streams the row once (through
//! registers on sm_80 and sm_89, by bulk copies into a ring of
//! shared-memory stages from sm_90 on), pushes
//! every key at or above a running threshold into a candidate buffer in
//! shared memory and raises the threshold by a radix select over the
//! buffer whenever the buffer fills (and once after the first round, and
//! once four rounds before the end for a small `k`); a last select over
//! the buffer gathers the top keys (none when the buffer is short enough
//! to sort as it is), and the sort, the slab and stage 2 are the other
//! kernels' (see `filter_rows`).
//!
//! Every exchange and every sum is exact (integer counts, integer masses),
//! so the slab and the token of a row do not depend on the number of CTAs,
//! the exchange or the batch.
//!
//! # Launch
//! Block [`RADIX_THREADS`] (exactly); grid `(ctas, rows_in_flight)` with
//! `ctas * chunk >= vocab`; rows `blockIdx.y, blockIdx.y + gridDim.y, ..`;
//! dynamic shared memory [`radix_smem_bytes`]`(args.cache_slots)`, with
//! `args.cache_slots` a multiple of 4. The cluster kernel: cluster
//! `(ctas, 1, 1)` on sm_90 (no cluster, `ctas = 1`, elsewhere). The
//! cooperative kernel: a cooperative launch (all CTAs resident). The
//! filter kernel: grid `(1, rows_in_flight)`, `args.chunk >= vocab`,
//! `args.cache_slots` the candidate buffer's capacity in keys (at least
//! [`FILTER_MIN_CAP`]) and dynamic shared memory
//! [`filter_smem_bytes`]`(args.cache_slots, staged)`, `staged` in the
//! sm_90 and newer modules (whose filter kernel streams the row into
//! shared memory by bulk copies).
//!
//! # Safety (caller)
//! `probs` holds `batch` rows `row_stride` elements apart with `vocab`
//! readable each; `top_k` holds `batch` elements, and with
//! [`MODE_SAMPLE`] `top_p`, `seed`, `offset`, `tokens`, `valid` do; with
//! [`MODE_SLAB`] `slab_values` and `slab_indices` hold `batch * SLAB`
//! elements and `slab_counts` `batch`; the cluster kernel's masking and
//! sampling forms over logits read `top_p`, `min_p` and `temperature`
//! (`batch` each, every `top_k` from 1 to `SLAB` and below `vocab`), the
//! masking form writes `kept` (`batch`) and the rows (writable, read by no
//! other thread), the sampling form reads `seed`, `offset` and writes
//! `tokens`, `valid` (`batch` each); with
//! [`MODE_MASK`](crate::radix_select::MODE_MASK) (the staged filter
//! kernels over logits, one CTA a row, `vocab` at most
//! [`FILTER_MASK_MAX_VOCAB`]) the rows at `probs` are writable and no
//! other thread reads them; the cooperative kernel's workspace holds, per
//! grid row `y`, `2 * ctas * BUCKETS` histogram words, `GATHER_CAP` gather
//! words, a gather count that is 0 before the launch (every launch leaves
//! it 0) and a barrier word; no other thread of the device writes any of
//! these during the launch. The filter kernel reads no workspace.
//!
//! [`FILTER_MIN_CAP`]: crate::radix_select::FILTER_MIN_CAP
//! [`filter_smem_bytes`]: crate::radix_select::filter_smem_bytes

use core::marker::PhantomData;

use crate::arch;
use crate::block;
use crate::noise;
use crate::philox;
use crate::radix::{f32_from_key, f32_key};
use crate::radix_select::{
    BUCKETS, Crossing, FILTER_DIRECT_KEYS, FILTER_FIXED_SMEM, FILTER_MASK_MAX_VOCAB,
    FILTER_ROUND_GROUPS, FILTER_ROUND_VECS, FILTER_STAGE_BYTES, FILTER_STAGED_FIXED_SMEM,
    FILTER_STAGES, FILTER_WORK_BYTES, GATHER_CAP, MODE_SAMPLE, MODE_SLAB, RADIX_FIXED_SMEM,
    RADIX_SLICE_BYTES, RADIX_THREADS, RadixArgs, RadixSelect, SLAB, before_draw, composite,
    composite_bits, composite_index, crossing_in_group, draw_target, filter_compaction,
    filter_direct, filter_final_fit, filter_pushes, first_digit, fixed_mass, high_word,
    logit_composite, logit_composite_index, logit_composite_key, prob_bits, prob_logit,
    seed_by_maxima, seed_threshold, slab_len, top_p_keeps, top_p_threshold,
};
use crate::topk_topp::{CutArrays, read_params, slab_cut, slab_token, store_token};

const THREADS: u32 = RADIX_THREADS;
const WARPS: u32 = THREADS / 32;

// One digit group of four buckets per thread in the crossing search, two
// slab entries per thread in stage 2, two compare-exchanges per thread and
// sorting stage.
const _: () = assert!(BUCKETS == 4 * THREADS);
const _: () = assert!(SLAB == 2 * THREADS);
const _: () = assert!(GATHER_CAP == 4 * THREADS);

/// A 16-byte aligned group of four clean bits (the cache's unit, and the
/// type of the dynamic shared memory, for its alignment).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Quad([u32; 4]);

/// How a radix kernel reads its input: the clean bits (the unsigned keys,
/// larger first) it selects on, and what the filter route tests on the
/// bit patterns as stored.
trait Keys {
    /// The stored bits the loads give a slot outside the row: no key
    /// [`Keys::pushes`] passes.
    const PAD: u32;
    /// Whether [`Keys::clean`] of [`Keys::PAD`] is 0 (the key of no
    /// element), so that a load's clean bits need no test of the slot.
    const PAD_IS_CLEAN_ZERO: bool;
    /// Whether stage 2 (the draw from probabilities) serves the input.
    const DRAWS: bool;
    /// The clean bits of an element stored as `raw`.
    fn clean(raw: u32) -> u32;
    /// The composite key (of [`KEY_BITS`] bits: larger clean bits first,
    /// then lower index) of clean bits `bits` at `index`.
    fn composite(bits: u32, index: u32) -> u64;
    /// The clean bits of a composite key.
    fn bits(key: u64) -> u32;
    /// The index of a composite key.
    fn index(key: u64) -> u32;
    /// The [`high_word`] of the keys with clean bits `bits` (whatever the
    /// index), for [`first_digit`].
    #[inline(always)]
    fn high(bits: u32) -> u32 {
        high_word(Self::composite(bits, 0))
    }
    /// Whether the filter's pushes against threshold `t` need the exact
    /// test (the slot's validity and its composite key).
    fn exact_push(t: u64) -> bool;
    /// The filter's push test against `t` when not [`Keys::exact_push`]:
    /// every element whose key is `>= t` passes, and none whose clean bits
    /// are below `t`'s, nor a slot outside the row.
    fn pushes(raw: u32, t: u64) -> bool;
    /// The slab's value of an element with clean bits `bits`.
    fn value(bits: u32) -> f32;
}

/// f32 probabilities ([`prob_bits`]: NaN, negative values and +inf weigh
/// nothing).
struct Probs;

impl Keys for Probs {
    const PAD: u32 = 0;
    const PAD_IS_CLEAN_ZERO: bool = true;
    const DRAWS: bool = true;
    #[inline(always)]
    fn clean(raw: u32) -> u32 {
        prob_bits(f32::from_bits(raw))
    }
    #[inline(always)]
    fn composite(bits: u32, index: u32) -> u64 {
        composite(bits, index)
    }
    #[inline(always)]
    fn bits(key: u64) -> u32 {
        composite_bits(key)
    }
    #[inline(always)]
    fn index(key: u64) -> u32 {
        composite_index(key)
    }
    #[inline(always)]
    fn exact_push(t: u64) -> bool {
        composite_bits(t) == 0
    }
    #[inline(always)]
    fn pushes(raw: u32, t: u64) -> bool {
        // Not exact: `t` has value bits, so the index plays no part.
        filter_pushes(raw, 0, t)
    }
    #[inline(always)]
    fn value(bits: u32) -> f32 {
        f32::from_bits(bits)
    }
}

/// f32 logits, for the top-k of the pivot route's calls
/// (`crate::topk_topp`): clean bits [`f32_key`] (NaN has the key of -inf;
/// no element's key is 0), slab values `f32_from_key` of them (NaN comes
/// back as -inf).
struct Logits;

/// The key of -inf (and NaN).
const NEG_INF_KEY: u32 = 0x007f_ffff;
/// The bits of -inf.
const NEG_INF_BITS: u32 = 0xff80_0000;
const _: () = assert!(NEG_INF_KEY == !NEG_INF_BITS && NEG_INF_BITS == f32::NEG_INFINITY.to_bits());
/// The key of +0.0, whose float also equals -0.0 (key `0x7fff_ffff`).
const POS_ZERO_KEY: u32 = 0x8000_0000;

impl Keys for Logits {
    // A NaN: fails every float comparison.
    const PAD: u32 = 0x7fff_ffff;
    const PAD_IS_CLEAN_ZERO: bool = false;
    const DRAWS: bool = false;
    #[inline(always)]
    fn clean(raw: u32) -> u32 {
        f32_key(raw)
    }
    #[inline(always)]
    fn composite(bits: u32, index: u32) -> u64 {
        logit_composite(bits, index)
    }
    #[inline(always)]
    fn bits(key: u64) -> u32 {
        logit_composite_key(key)
    }
    #[inline(always)]
    fn index(key: u64) -> u32 {
        logit_composite_index(key)
    }
    #[inline(always)]
    fn exact_push(t: u64) -> bool {
        // At or below -inf's key the float test would miss NaN (whose key
        // is -inf's); at +0.0's it would pass -0.0, whose key is below.
        let b = logit_composite_key(t);
        b <= NEG_INF_KEY || b == POS_ZERO_KEY
    }
    #[inline(always)]
    fn pushes(raw: u32, t: u64) -> bool {
        // One float comparison: `t`'s clean bits lie above -inf's key and
        // are not +0.0's, so the floats `>=` its value are exactly the keys
        // `>=` its bits, and NaN (pads included) fails.
        f32::from_bits(raw) >= f32::from_bits(f32_from_key(logit_composite_key(t)))
    }
    #[inline(always)]
    fn value(bits: u32) -> f32 {
        f32::from_bits(f32_from_key(bits))
    }
}

// Dynamic shared memory, in bytes from its base: two histograms, the
// gather buffer, reduction scratch, then the chunk cache.
const HIST_BYTES: usize = BUCKETS as usize * 4;
const GATHER_OFF: usize = 2 * HIST_BYTES;
const SCRATCH_OFF: usize = GATHER_OFF + GATHER_CAP as usize * 8;
const SLICE_OFF: usize = SCRATCH_OFF + 512;
const CACHE_OFF: usize = RADIX_FIXED_SMEM as usize;
// Scratch: per-warp scan partials (u64), then control words (u32).
const CTL_OFF: usize = SCRATCH_OFF + WARPS as usize * 8;
const CTL_DIGIT: usize = 0;
const CTL_ABOVE: usize = 1;
const CTL_COUNT: usize = 2;
const CTL_GATHERED: usize = 3;
const CTL_MASS: usize = 4; // a u64 in words 4 and 5
/// The filter kernel's three round counters (words 6, 7, 8).
const CTL_FILL: usize = 6;
/// Keys merged into rank 0's candidate buffer (a cluster of filter CTAs).
#[cfg(target_feature = "sm_90")]
const CTL_MERGED: usize = 9;
const CTL_WORDS: usize = 10;
// The filter kernel's candidate buffer takes the place of the slice (it
// has no cluster).
const CANDIDATES_OFF: usize = SLICE_OFF;

const _: () = assert!(CTL_OFF + CTL_WORDS * 4 <= SLICE_OFF);
const _: () =
    assert!(SLICE_OFF + RADIX_SLICE_BYTES as usize == CACHE_OFF && SLICE_OFF.is_multiple_of(16));
const _: () = assert!(CACHE_OFF.is_multiple_of(16) && GATHER_OFF.is_multiple_of(16));
const _: () = assert!(CTL_OFF.is_multiple_of(8) && (CTL_OFF + CTL_MASS * 4).is_multiple_of(8));
const _: () = assert!(CANDIDATES_OFF == FILTER_FIXED_SMEM as usize);
const _: () = assert!(CANDIDATES_OFF.is_multiple_of(16));
const _: () = assert!(FILTER_ROUND_VECS == 4);
const _: () = assert!(SCRATCH_OFF == FILTER_WORK_BYTES as usize);

// The staged filter kernel (sm_90): FILTER_STAGES stages of a round each,
// then the scratch and the candidate buffer at their usual offsets from
// the base (STAGED_BASE bytes in).
const STAGE_BYTES: usize = FILTER_STAGE_BYTES as usize;
const STAGED_BASE: usize = FILTER_STAGES as usize * STAGE_BYTES - SCRATCH_OFF;
/// The stages' full barriers (one u64 each), in the scratch after the
/// control words (the other kernels leave these bytes unused).
const MBAR_OFF: usize = SCRATCH_OFF + 256;
const _: () = assert!(STAGE_BYTES == 16 * FILTER_ROUND_GROUPS as usize);
// The bitmap of a MODE_MASK row end fills stages 1 and up.
const _: () =
    assert!(FILTER_MASK_MAX_VOCAB as usize / 8 <= (FILTER_STAGES as usize - 1) * STAGE_BYTES);
const _: () = assert!(STAGE_BYTES.is_multiple_of(16) && STAGED_BASE.is_multiple_of(16));
const _: () = assert!(STAGED_BASE + CANDIDATES_OFF == FILTER_STAGED_FIXED_SMEM as usize);
const _: () = assert!(MBAR_OFF >= CTL_OFF + CTL_WORDS * 4 && MBAR_OFF.is_multiple_of(8));
const _: () = assert!(MBAR_OFF + 8 * FILTER_STAGES as usize <= SLICE_OFF);

/// The block's dynamic shared memory, by region.
#[derive(Clone, Copy)]
struct Smem {
    /// The layout's base: the scratch, the slice, the cache and the
    /// candidate buffer lie at their offsets from it.
    base: *mut u8,
    /// The work space: the histograms and the gather buffer lie at their
    /// offsets from it (below [`SCRATCH_OFF`]). `base` except in the staged
    /// filter kernel, where it is a stage that holds no round at the time.
    work: *mut u8,
}

impl Smem {
    #[inline(always)]
    fn new() -> Smem {
        let p = arch::dynamic_shared::<Quad>() as *mut u8;
        Smem { base: p, work: p }
    }

    /// The staged filter kernel's layout: [`FILTER_STAGES`] stages, then
    /// the radix layout from its scratch on (`base` is placed so that the
    /// scratch and the candidate buffer keep their offsets; nothing is
    /// accessed through `base` below [`SCRATCH_OFF`]). The work space is
    /// stage 0 until [`Smem::with_work`] moves it.
    #[cfg(target_feature = "sm_90")]
    #[inline(always)]
    fn staged() -> Smem {
        let p = arch::dynamic_shared::<Quad>() as *mut u8;
        // SAFETY (of the offset): inside the staged layout (STAGED_BASE is
        // below its size).
        Smem {
            base: unsafe { p.add(STAGED_BASE) },
            work: p,
        }
    }

    /// The same layout with its work space at `work`.
    #[cfg(target_feature = "sm_90")]
    #[inline(always)]
    fn with_work(self, work: *mut u8) -> Smem {
        Smem {
            base: self.base,
            work,
        }
    }

    /// Stage `s` of the staged filter kernel (a round of f32, as groups).
    #[cfg(target_feature = "sm_90")]
    #[inline(always)]
    fn stage(self, s: u32) -> *mut Quad {
        let p = arch::dynamic_shared::<Quad>() as *mut u8;
        // SAFETY (of the offset): `s < FILTER_STAGES`, inside the layout.
        unsafe { p.add(s as usize * STAGE_BYTES) as *mut Quad }
    }

    /// The shared address of stage `s`'s full barrier (staged filter).
    #[cfg(target_feature = "sm_90")]
    #[inline(always)]
    fn full(self, s: u32) -> u32 {
        arch::smem_addr(self.region::<u64>(MBAR_OFF + 8 * s as usize))
    }

    /// The region at byte offset `off` from the base, as a `T` pointer.
    #[inline(always)]
    fn region<T>(self, off: usize) -> *mut T {
        // SAFETY (of the offset): every caller's offset is one of the
        // layout's regions, inside the dynamic shared memory.
        unsafe { self.base.add(off) as *mut T }
    }

    /// The work space's region at byte offset `off`, as a `T` pointer.
    #[inline(always)]
    fn work_region<T>(self, off: usize) -> *mut T {
        // SAFETY (of the offset): every caller's offset is one of the work
        // space's regions (below SCRATCH_OFF).
        unsafe { self.work.add(off) as *mut T }
    }

    /// The histogram of pass parity `parity` (0 or 1).
    #[inline(always)]
    fn hist(self, parity: u32) -> *mut u32 {
        self.work_region(parity as usize * HIST_BYTES)
    }

    #[inline(always)]
    fn gather(self) -> *mut u64 {
        self.work_region(GATHER_OFF)
    }

    #[inline(always)]
    fn warp_partials(self) -> *mut u64 {
        self.region(SCRATCH_OFF)
    }

    #[inline(always)]
    fn ctl(self, word: usize) -> *mut u32 {
        self.region(CTL_OFF + 4 * word)
    }

    /// The reduced histogram slice this CTA owns in a cluster (groups of
    /// four counts, at most `BUCKETS / 8` of them).
    #[cfg(target_feature = "sm_90")]
    #[inline(always)]
    fn slice(self) -> *mut Quad {
        self.region(SLICE_OFF)
    }

    /// The row cache, after the fixed part.
    #[inline(always)]
    fn cache(self) -> *mut Quad {
        self.region(CACHE_OFF)
    }

    /// The filter kernel's candidate buffer, after its fixed part.
    #[inline(always)]
    fn candidates(self) -> *mut u64 {
        self.region(CANDIDATES_OFF)
    }
}

// ---------------------------------------------------------------------------
// Block scans.
// ---------------------------------------------------------------------------

/// The inclusive prefix sum of `v` over the lanes of the warp (integer
/// sums: exact in any order); every lane calls it.
#[inline(always)]
fn warp_inclusive_scan(v: u64) -> u64 {
    let lane = arch::thread_idx_x() % 32;
    let mut inc = v;
    let mut d = 1;
    while d < 32 {
        let lo = arch::shfl_up_u32(inc as u32, d);
        let hi = arch::shfl_up_u32((inc >> 32) as u32, d);
        if lane >= d {
            inc = inc.wrapping_add((u64::from(hi) << 32) | u64::from(lo));
        }
        d <<= 1;
    }
    inc
}

/// The exclusive prefix sum of `v` over the lanes of the warp and the
/// warp's total; every lane calls it.
#[inline(always)]
fn warp_scan(v: u64) -> (u64, u64) {
    let inc = warp_inclusive_scan(v);
    let lo = arch::shfl_idx_u32(inc as u32, 31);
    let hi = arch::shfl_idx_u32((inc >> 32) as u32, 31);
    (inc.wrapping_sub(v), (u64::from(hi) << 32) | u64::from(lo))
}

/// The exclusive prefix sum of `v` over the block's threads in thread
/// order, and the block's total (integer sums: exact in any order).
///
/// # Safety
/// Every thread of the block calls it; the scratch is not used meanwhile.
#[inline(always)]
unsafe fn block_scan(v: u64, smem: Smem) -> (u64, u64) {
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let inc = warp_inclusive_scan(v);
    let partials = smem.warp_partials();
    // SAFETY: WARPS partial slots in the scratch; the barriers separate the
    // writes from the reads and the reads from the next call's writes.
    unsafe {
        if lane == 31 {
            *partials.add((tid / 32) as usize) = inc;
        }
        arch::bar_sync();
        let (mut before, mut total) = (0u64, 0u64);
        let mut w = 0;
        while w < WARPS {
            let t = *partials.add(w as usize);
            if w < tid / 32 {
                before = before.wrapping_add(t);
            }
            total = total.wrapping_add(t);
            w += 1;
        }
        arch::bar_sync();
        (before.wrapping_add(inc).wrapping_sub(v), total)
    }
}

// ---------------------------------------------------------------------------
// How the CTAs of a row exchange histograms and gathered keys.
// ---------------------------------------------------------------------------

/// The exchange between the CTAs of a row. Every method is called by every
/// thread of every CTA of the row, in the same order.
trait Exchange {
    /// This CTA's rank among the row's CTAs.
    fn rank(&self) -> u32;
    /// The row's CTAs.
    fn size(&self) -> u32;
    /// Starts a row: rank 0 zeroes its gather count (before the row's
    /// first [`Exchange::share`], which no push precedes).
    ///
    /// # Safety
    /// The launch contract.
    unsafe fn begin_row(&self, smem: Smem);
    /// Publishes this CTA's finished histogram of `parity` and waits until
    /// every CTA of the row did: [`Exchange::load4`] then reads them.
    ///
    /// # Safety
    /// The launch contract.
    unsafe fn share(&self, smem: Smem, parity: u32);
    /// Digit group `group` of CTA `rank`'s histogram of `parity`.
    ///
    /// # Safety
    /// After the [`Exchange::share`] of `parity`, before the next one.
    unsafe fn load4(&self, smem: Smem, parity: u32, rank: u32, group: u32) -> [u32; 4];
    /// The crossing of the pass of `parity` from every CTA's histogram;
    /// every CTA finds the same.
    ///
    /// # Safety
    /// Every thread of every CTA of the row calls it after the pass's
    /// [`Exchange::share`].
    unsafe fn crossing(&self, smem: Smem, parity: u32, need: u32) -> Crossing
    where
        Self: Sized,
    {
        // SAFETY: forwarded.
        unsafe { find_crossing(self, smem, parity, need) }
    }
    /// Reserves `n` positions of the row's gather buffer.
    ///
    /// # Safety
    /// The launch contract.
    unsafe fn reserve(&self, smem: Smem, n: u32) -> u32;
    /// Stores a gathered key at a reserved position.
    ///
    /// # Safety
    /// `pos` was reserved and is below [`GATHER_CAP`].
    unsafe fn push(&self, smem: Smem, pos: u32, key: u64);
    /// Waits until every CTA of the row pushed its keys; on rank 0 they
    /// then lie in its gather buffer, and their count is returned.
    ///
    /// # Safety
    /// The launch contract.
    unsafe fn end_gather(&self, smem: Smem) -> u32;
}

/// Rank 0 zeroes its shared gather count.
///
/// # Safety
/// The launch contract.
#[inline(always)]
unsafe fn zero_gather_count(rank: u32, smem: Smem) {
    if rank == 0 && arch::thread_idx_x() == 0 {
        // SAFETY: a control word of this block.
        unsafe { core::ptr::write_volatile(smem.ctl(CTL_GATHERED), 0) };
    }
}

/// One CTA per row: its own shared memory (the cluster kernel on GPUs
/// without clusters, and the filter kernel everywhere).
struct Solo;

impl Exchange for Solo {
    #[inline(always)]
    fn rank(&self) -> u32 {
        0
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        1
    }
    #[inline(always)]
    unsafe fn begin_row(&self, smem: Smem) {
        // SAFETY: forwarded.
        unsafe { zero_gather_count(0, smem) }
    }
    #[inline(always)]
    unsafe fn share(&self, _smem: Smem, _parity: u32) {
        arch::bar_sync();
    }
    #[inline(always)]
    unsafe fn load4(&self, smem: Smem, parity: u32, _rank: u32, group: u32) -> [u32; 4] {
        // SAFETY: a group of this block's histogram (16-byte aligned).
        unsafe { (*(smem.hist(parity) as *const Quad).add(group as usize)).0 }
    }
    #[inline(always)]
    unsafe fn reserve(&self, smem: Smem, n: u32) -> u32 {
        // SAFETY: a control word of this block.
        unsafe { arch::atom_shared_add_u32(arch::smem_addr(smem.ctl(CTL_GATHERED)), n) }
    }
    #[inline(always)]
    unsafe fn push(&self, smem: Smem, pos: u32, key: u64) {
        // SAFETY: the caller's contract.
        unsafe { *smem.gather().add(pos as usize) = key };
    }
    #[inline(always)]
    unsafe fn end_gather(&self, smem: Smem) -> u32 {
        arch::bar_sync();
        // SAFETY: a control word of this block, final after the barrier.
        unsafe { core::ptr::read_volatile(smem.ctl(CTL_GATHERED)) }
    }
}

/// The CTAs of a row form a cluster and use each other's shared memory.
#[cfg(target_feature = "sm_90")]
struct Dsmem;

#[cfg(target_feature = "sm_90")]
impl Exchange for Dsmem {
    #[inline(always)]
    fn rank(&self) -> u32 {
        arch::cluster_ctarank()
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        arch::cluster_nctarank()
    }
    #[inline(always)]
    unsafe fn begin_row(&self, smem: Smem) {
        // SAFETY: forwarded.
        unsafe { zero_gather_count(self.rank(), smem) }
    }
    #[inline(always)]
    unsafe fn share(&self, _smem: Smem, _parity: u32) {
        // Release / acquire: every CTA's histogram writes are visible to
        // every CTA of the cluster after it.
        arch::cluster_sync();
    }
    #[inline(always)]
    unsafe fn load4(&self, smem: Smem, parity: u32, rank: u32, group: u32) -> [u32; 4] {
        // SAFETY (of the offset): a group of the histogram.
        let local = unsafe { smem.hist(parity).add(4 * group as usize) };
        let remote = arch::mapa_shared_cluster(arch::smem_addr(local), rank);
        // SAFETY: 16-byte aligned; every CTA of the cluster runs until the
        // row's last cluster barrier, after every read.
        unsafe { arch::ld_shared_cluster_v4_u32(remote) }
    }
    #[inline(always)]
    unsafe fn crossing(&self, smem: Smem, parity: u32, need: u32) -> Crossing {
        // SAFETY: forwarded.
        unsafe {
            if self.size() == 1 {
                find_crossing(self, smem, parity, need)
            } else {
                find_crossing_split(self, smem, parity, need)
            }
        }
    }
    #[inline(always)]
    unsafe fn reserve(&self, smem: Smem, n: u32) -> u32 {
        let remote = arch::mapa_shared_cluster(arch::smem_addr(smem.ctl(CTL_GATHERED)), 0);
        // SAFETY: rank 0's control word; rank 0 runs until after the gather.
        unsafe { arch::atom_shared_cluster_add_u32(remote, n) }
    }
    #[inline(always)]
    unsafe fn push(&self, smem: Smem, pos: u32, key: u64) {
        // SAFETY (of the offset): the caller's contract.
        let local = unsafe { smem.gather().add(pos as usize) };
        let remote = arch::mapa_shared_cluster(arch::smem_addr(local), 0);
        // SAFETY: rank 0's gather buffer; rank 0 runs until after the gather.
        unsafe { arch::st_shared_cluster_u64(remote, key) };
    }
    #[inline(always)]
    unsafe fn end_gather(&self, smem: Smem) -> u32 {
        arch::cluster_sync();
        // SAFETY: a control word of this block, final after the barrier
        // (only rank 0's value is used).
        unsafe { core::ptr::read_volatile(smem.ctl(CTL_GATHERED)) }
    }
}

/// The CTAs of a row exchange through global memory (a cooperative
/// launch: all CTAs are resident, so the grid barrier cannot deadlock).
struct Global {
    /// Histograms: per grid row, parity and rank, [`BUCKETS`] words.
    hist: *mut u32,
    /// Gather buffers: per grid row, [`GATHER_CAP`] keys.
    gather: *mut u64,
    /// Gather counts: per grid row, 0 between rows.
    count: *mut u32,
    /// Barrier words: per grid row.
    barrier: *mut u32,
    /// This CTA's grid row.
    slot: u32,
}

impl Global {
    /// A barrier of the row's CTAs: each adds 1, rank 0 adds `2^31 -
    /// (size - 1)`, so the word's top bit flips once all arrived and its
    /// other bits come back to their start (no reset needed).
    ///
    /// # Safety
    /// Every thread of every CTA of the row calls it; all are resident.
    #[inline(always)]
    unsafe fn sync(&self) {
        arch::bar_sync();
        if arch::thread_idx_x() == 0 {
            let size = self.size();
            let add = if self.rank() == 0 {
                0x8000_0000u32.wrapping_sub(size - 1)
            } else {
                1
            };
            // SAFETY: the row's barrier word.
            unsafe {
                let word = self.barrier.add(self.slot as usize);
                arch::fence_acq_rel_gpu();
                let old = arch::atom_add_acq_rel_gpu_u32(word, add);
                while (arch::ld_relaxed_gpu_u32(word) ^ old) & 0x8000_0000 == 0 {}
            }
            arch::fence_acq_rel_gpu();
        }
        arch::bar_sync();
    }

    /// The global histogram of `parity` and `rank` of this grid row.
    #[inline(always)]
    fn hist_of(&self, parity: u32, rank: u32) -> *mut u32 {
        let at = ((self.slot * 2 + parity) * self.size() + rank) as usize * BUCKETS as usize;
        // SAFETY (of the offset): the workspace holds 2 * size histograms
        // per grid row (the launch contract).
        unsafe { self.hist.add(at) }
    }
}

impl Exchange for Global {
    #[inline(always)]
    fn rank(&self) -> u32 {
        arch::block_idx_x()
    }
    #[inline(always)]
    fn size(&self) -> u32 {
        arch::grid_dim_x()
    }
    #[inline(always)]
    unsafe fn begin_row(&self, _smem: Smem) {
        // The global count is 0 between rows.
    }
    #[inline(always)]
    unsafe fn share(&self, smem: Smem, parity: u32) {
        arch::bar_sync();
        let g = arch::thread_idx_x() as usize;
        // SAFETY: one 16-byte group per thread, of this CTA's histogram in
        // shared memory and of its slot in the workspace.
        unsafe {
            let from = (smem.hist(parity) as *const Quad).add(g);
            *(self.hist_of(parity, self.rank()) as *mut Quad).add(g) = *from;
            self.sync();
        }
    }
    #[inline(always)]
    unsafe fn load4(&self, _smem: Smem, parity: u32, rank: u32, group: u32) -> [u32; 4] {
        // SAFETY: written by CTA `rank` before the barrier of `share`.
        unsafe {
            let p = self.hist_of(parity, rank).add(4 * group as usize);
            [
                arch::ld_relaxed_gpu_u32(p),
                arch::ld_relaxed_gpu_u32(p.add(1)),
                arch::ld_relaxed_gpu_u32(p.add(2)),
                arch::ld_relaxed_gpu_u32(p.add(3)),
            ]
        }
    }
    #[inline(always)]
    unsafe fn reserve(&self, _smem: Smem, n: u32) -> u32 {
        // SAFETY: the row's count word.
        unsafe { arch::atom_add_acq_rel_gpu_u32(self.count.add(self.slot as usize), n) }
    }
    #[inline(always)]
    unsafe fn push(&self, _smem: Smem, pos: u32, key: u64) {
        let at = self.slot as usize * GATHER_CAP as usize + pos as usize;
        // SAFETY: the caller's contract.
        unsafe { *self.gather.add(at) = key };
    }
    #[inline(always)]
    unsafe fn end_gather(&self, smem: Smem) -> u32 {
        // SAFETY: the row's words; every push precedes the barrier.
        unsafe {
            self.sync();
            if self.rank() != 0 {
                return 0;
            }
            let count_word = self.count.add(self.slot as usize);
            let n = arch::ld_relaxed_gpu_u32(count_word);
            let from = self.gather.add(self.slot as usize * GATHER_CAP as usize);
            let mut i = arch::thread_idx_x();
            while i < n && i < GATHER_CAP {
                *smem.gather().add(i as usize) = arch::ld_relaxed_gpu_u64(from.add(i as usize));
                i += THREADS;
            }
            // Every thread has read the count; the next row's pushes come
            // after its first barrier.
            arch::bar_sync();
            if arch::thread_idx_x() == 0 {
                *count_word = 0;
            }
            n
        }
    }
}

// ---------------------------------------------------------------------------
// A CTA's chunk of its row.
// ---------------------------------------------------------------------------

/// This CTA's elements of a row, as 16-byte groups of "slots": slot `s` is
/// element `start + s - misalign`, so that group `g` (slots `4g .. 4g + 4`)
/// is one aligned vector in global memory and one [`Quad`] of the cache.
#[derive(Clone, Copy)]
struct Chunk<K: Keys> {
    /// Address of slot 0.
    base: *const f32,
    /// Row index of slot 0, wrapping (slot 0 may precede the row).
    first: u32,
    /// Slots before the chunk's first element (0..4).
    misalign: u32,
    /// `misalign` + the chunk's elements.
    end: u32,
    /// Groups covering the slots.
    groups: u32,
    /// Groups held in the shared-memory cache.
    cached: u32,
    keys: PhantomData<K>,
}

impl<K: Keys> Chunk<K> {
    #[inline(always)]
    fn new(row: *const f32, rank: u32, args: &RadixArgs) -> Chunk<K> {
        let start = rank.saturating_mul(args.chunk).min(args.vocab);
        let len = (args.vocab - start).min(args.chunk);
        // SAFETY (of the offset): `start <= vocab`.
        let p = unsafe { row.add(start as usize) };
        let misalign = ((p as usize / 4) & 3) as u32;
        let end = misalign + len;
        let groups = end.div_ceil(4);
        Chunk {
            // Never dereferenced before the row: slots below `misalign` are
            // read only as part of a whole aligned vector that starts in
            // the row, or not at all.
            base: p.wrapping_sub(misalign as usize),
            first: start.wrapping_sub(misalign),
            misalign,
            end,
            groups,
            cached: groups.min(args.cache_slots / 4),
            keys: PhantomData,
        }
    }

    /// Whether slot `s` holds an element of the chunk.
    #[inline(always)]
    fn valid(&self, s: u32) -> bool {
        s >= self.misalign && s < self.end
    }

    /// The groups whose four slots all hold elements of the chunk:
    /// `lo..hi` ([`crate::radix_select::filter_whole_groups`]).
    /// [`Chunk::load_raw`] reads these with one vector load, the others
    /// slot by slot.
    #[cfg(target_feature = "sm_90")]
    #[inline(always)]
    fn whole(&self) -> (u32, u32) {
        crate::radix_select::filter_whole_groups(self.misalign, self.end)
    }

    /// The clean bits of group `g` read from global memory (0 for slots
    /// outside the chunk): one vector load inside, scalar loads at the
    /// chunk's ends.
    ///
    /// # Safety
    /// `g < groups`; the row is readable (the launch contract).
    #[inline(always)]
    unsafe fn load(&self, g: u32) -> [u32; 4] {
        // SAFETY: forwarded.
        let v = unsafe { self.load_raw(g) };
        let s = 4 * g;
        let clean = |e: u32| {
            if K::PAD_IS_CLEAN_ZERO || self.valid(s + e) {
                K::clean(v[e as usize])
            } else {
                0
            }
        };
        [clean(0), clean(1), clean(2), clean(3)]
    }

    /// The bit patterns of group `g` as stored ([`Keys::PAD`] for slots
    /// outside the chunk): one vector load inside, scalar loads at the
    /// chunk's ends.
    ///
    /// # Safety
    /// `g < groups`; the row is readable (the launch contract).
    #[inline(always)]
    unsafe fn load_raw(&self, g: u32) -> [u32; 4] {
        let s = 4 * g;
        // SAFETY: every slot read lies in the chunk.
        unsafe {
            if s >= self.misalign && s + 4 <= self.end {
                arch::ld_global_nc_v4_u32(self.base.add(s as usize) as *const u32)
            } else {
                let one = |e: u32| {
                    if self.valid(s + e) {
                        arch::ld_global_nc_u32(self.base.add((s + e) as usize) as *const u32)
                    } else {
                        K::PAD
                    }
                };
                [one(0), one(1), one(2), one(3)]
            }
        }
    }

    /// Group `g`'s clean bits from the cache or, past it, global memory.
    ///
    /// # Safety
    /// `g < groups`; the streaming pass filled the cache.
    #[inline(always)]
    unsafe fn group(&self, smem: Smem, g: u32) -> [u32; 4] {
        // SAFETY: cached groups lie in the cache; the rest in the row.
        unsafe {
            if g < self.cached {
                (*smem.cache().add(g as usize)).0
            } else {
                self.load(g)
            }
        }
    }

    /// The composite key of slot `s` with clean bits `bits`; `None` outside
    /// the chunk.
    #[inline(always)]
    fn key(&self, s: u32, bits: u32) -> Option<u64> {
        if self.valid(s) {
            Some(K::composite(bits, self.first.wrapping_add(s)))
        } else {
            None
        }
    }

    /// Calls `f(g, bits)` for this thread's groups `tid, tid + THREADS, ..`
    /// in rounds that every thread of the block runs (`g >= groups` with
    /// zero bits past the end), so `f` may use warp votes.
    ///
    /// # Safety
    /// As [`Chunk::group`].
    #[inline(always)]
    unsafe fn for_each_round(&self, smem: Smem, mut f: impl FnMut(u32, [u32; 4])) {
        let rounds = self.groups.div_ceil(THREADS);
        let mut g = arch::thread_idx_x();
        let mut r = 0;
        while r < rounds {
            let bits = if g < self.groups {
                // SAFETY: the caller's contract.
                unsafe { self.group(smem, g) }
            } else {
                [0; 4]
            };
            f(g, bits);
            g += THREADS;
            r += 1;
        }
    }
}

/// Counts digits into a shared histogram, one atomic per run of equal
/// digits of a thread (zeros, ties and index digits come in runs).
struct RunCounter {
    hist: u32,
    digit: u32,
    run: u32,
}

impl RunCounter {
    #[inline(always)]
    fn new(hist: *mut u32) -> RunCounter {
        RunCounter {
            hist: arch::smem_addr(hist),
            digit: 0,
            run: 0,
        }
    }

    #[inline(always)]
    fn add(&mut self, digit: u32) {
        if digit != self.digit {
            self.flush();
            self.digit = digit;
        }
        self.run += 1;
    }

    #[inline(always)]
    fn flush(&mut self) {
        if self.run > 0 {
            // SAFETY: `digit < BUCKETS`, inside the histogram.
            unsafe { arch::red_shared_add_u32(self.hist + 4 * self.digit, self.run) };
            self.run = 0;
        }
    }
}

// ---------------------------------------------------------------------------
// Stage 1.
// ---------------------------------------------------------------------------

/// Zeroes the histogram of `parity` (every thread, then a barrier).
///
/// # Safety
/// Every thread of the block calls it.
#[inline(always)]
unsafe fn clear_hist(smem: Smem, parity: u32) {
    let g = arch::thread_idx_x() as usize;
    // SAFETY: one group of the histogram per thread.
    unsafe { *(smem.hist(parity) as *mut Quad).add(g) = Quad([0; 4]) };
    arch::bar_sync();
}

/// The streaming pass: reads the chunk once, fills the cache and
/// histograms the first digit. Four vectors in flight per thread.
///
/// # Safety
/// The launch contract; every thread calls it after [`clear_hist`].
#[inline(always)]
unsafe fn stream_pass<K: Keys>(chunk: &Chunk<K>, smem: Smem, hist: *mut u32) {
    let tid = arch::thread_idx_x();
    let mut counter = RunCounter::new(hist);
    let mut visit = |g: u32, v: [u32; 4]| {
        if g >= chunk.groups {
            return;
        }
        if g < chunk.cached {
            // SAFETY: a cached group.
            unsafe { *smem.cache().add(g as usize) = Quad(v) };
        }
        let s = 4 * g;
        if chunk.valid(s) {
            counter.add(first_digit(K::high(v[0])));
        }
        if chunk.valid(s + 1) {
            counter.add(first_digit(K::high(v[1])));
        }
        if chunk.valid(s + 2) {
            counter.add(first_digit(K::high(v[2])));
        }
        if chunk.valid(s + 3) {
            counter.add(first_digit(K::high(v[3])));
        }
    };
    // SAFETY: groups below `groups` only.
    let load = |g: u32| unsafe {
        if g < chunk.groups {
            chunk.load(g)
        } else {
            [0; 4]
        }
    };
    let mut g = tid;
    while g < chunk.groups {
        let a = load(g);
        let b = load(g + THREADS);
        let c = load(g + 2 * THREADS);
        let d = load(g + 3 * THREADS);
        visit(g, a);
        visit(g + THREADS, b);
        visit(g + 2 * THREADS, c);
        visit(g + 3 * THREADS, d);
        g += 4 * THREADS;
    }
    counter.flush();
}

/// A refining pass over the cached chunk: histograms the current digit of
/// the keys still in range.
///
/// # Safety
/// The launch contract; every thread calls it after [`clear_hist`].
#[inline(always)]
unsafe fn refine_pass<K: Keys>(chunk: &Chunk<K>, smem: Smem, hist: *mut u32, sel: &RadixSelect) {
    let mut counter = RunCounter::new(hist);
    // SAFETY: forwarded.
    unsafe {
        chunk.for_each_round(smem, |g, bits| {
            let s = 4 * g;
            let mut one = |e: u32, b: u32| {
                if let Some(d) = chunk.key(s + e, b).and_then(|k| sel.digit(k)) {
                    counter.add(d);
                }
            };
            one(0, bits[0]);
            one(1, bits[1]);
            one(2, bits[2]);
            one(3, bits[3]);
        });
    }
    counter.flush();
}

/// Adds two groups of four counts.
#[inline(always)]
fn add4(a: [u32; 4], b: [u32; 4]) -> [u32; 4] {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
}

/// The crossing of this pass from every CTA's histogram of `parity`: thread
/// `t` sums digit group `BUCKETS / 4 - 1 - t` over the CTAs, so that a scan
/// in thread order counts the keys in higher groups.
///
/// # Safety
/// Every thread of every CTA calls it after the pass's `share`.
#[inline(always)]
unsafe fn find_crossing<X: Exchange>(x: &X, smem: Smem, parity: u32, need: u32) -> Crossing {
    let group = BUCKETS / 4 - 1 - arch::thread_idx_x();
    let mut c = [0u32; 4];
    let mut rank = 0;
    // SAFETY: the caller's contract.
    unsafe {
        while rank < x.size() {
            c = add4(c, x.load4(smem, parity, rank, group));
            rank += 1;
        }
        settle_crossing(smem, c, group, need)
    }
}

/// The crossing from this thread's counts `c` of digit group `group`
/// (thread `t` holding group `BUCKETS / 4 - 1 - t`, so that a scan in
/// thread order counts the keys in higher groups): the thread whose group
/// holds it publishes it, every thread returns it (all zeros when no group
/// does, which a well-formed row never sees but keeps a malformed one
/// deterministic).
///
/// # Safety
/// Every thread of the block calls it; control words of this block, written
/// before the scan's barriers and read after the next barrier.
#[inline(always)]
unsafe fn settle_crossing(smem: Smem, c: [u32; 4], group: u32, need: u32) -> Crossing {
    // SAFETY: the caller's contract.
    unsafe {
        if arch::thread_idx_x() == 0 {
            *smem.ctl(CTL_DIGIT) = 0;
            *smem.ctl(CTL_ABOVE) = 0;
            *smem.ctl(CTL_COUNT) = 0;
        }
        let (above, _) = block_scan(u64::from(c[0] + c[1] + c[2] + c[3]), smem);
        if let Some(found) = crossing_in_group(c, group, above as u32, need) {
            *smem.ctl(CTL_DIGIT) = found.digit;
            *smem.ctl(CTL_ABOVE) = found.above;
            *smem.ctl(CTL_COUNT) = found.count;
        }
        arch::bar_sync();
        Crossing {
            digit: *smem.ctl(CTL_DIGIT),
            above: *smem.ctl(CTL_ABOVE),
            count: *smem.ctl(CTL_COUNT),
        }
    }
}

/// [`find_crossing`] for a cluster of two or more CTAs, by reduce-scatter
/// in two rounds of distributed shared memory, one remote 16-byte load a
/// thread each:
/// - each CTA sums one slice of the digit groups (`per` = `BUCKETS / 4 /
///   size` rounded up) over every CTA's histogram: thread `t` loads slice
///   group `t / S` of CTA `t % S` (`S` the cluster size rounded up to a
///   power of two, so a group's `S` loads sit in adjacent lanes of one
///   warp), butterfly shuffles over the `S` lanes sum them, and the group's
///   first lane publishes the sum;
/// - after a cluster barrier, thread `t` reads digit group
///   `BUCKETS / 4 - 1 - t` of the reduced histogram from the CTA whose
///   slice holds it, and the block scan of [`settle_crossing`] finds the
///   crossing.
///
/// Every CTA reads 8 KiB remotely a pass, not every histogram (64 KiB per
/// CTA at eight, which the profile showed bound by distributed shared
/// memory, about 2 us). The form before (one warp loading its slice four
/// CTAs at a time, then slice totals, a search for the slice holding the
/// crossing and a read of that slice) took 3.4 us a pass at B = 1 on the
/// H200 (session 25's phase stamps); this one is 1.6 us faster a call.
/// Integer sums: the same crossing as [`find_crossing`].
///
/// # Safety
/// Every thread of every CTA of the cluster calls it after the pass's
/// `share`; the cluster has at most 32 CTAs. The slice is written before
/// this call's cluster barrier and read after it; the next write is after
/// the next pass's (or row's) `share`, which every CTA reaches only after
/// its reads.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
unsafe fn find_crossing_split(x: &Dsmem, smem: Smem, parity: u32, need: u32) -> Crossing {
    const GROUPS: u32 = BUCKETS / 4;
    let tid = arch::thread_idx_x();
    let (rank, size) = (x.rank(), x.size());
    let per = GROUPS.div_ceil(size.max(1)).max(1);
    // Lanes a slice group (uniform): 2^shift, up to 32.
    let shift = size.next_power_of_two().trailing_zeros().min(5);
    let lanes = 1 << shift;
    let from = tid & (lanes - 1);
    // SAFETY: the caller's contract; slice positions below `per <= GROUPS /
    // 2` (size >= 2), remote reads of running CTAs.
    unsafe {
        // This CTA's slice: rounds of THREADS / lanes groups, uniform over
        // the block (every lane shuffles in every round).
        let mut first = 0;
        while first < per {
            let j = first + (tid >> shift);
            let g = rank * per + j;
            let mut c = if j < per && g < GROUPS && from < size {
                x.load4(smem, parity, from, g)
            } else {
                [0; 4]
            };
            let mut m = 1;
            while m < lanes {
                c = add4(
                    c,
                    [
                        arch::shfl_bfly_u32(c[0], m),
                        arch::shfl_bfly_u32(c[1], m),
                        arch::shfl_bfly_u32(c[2], m),
                        arch::shfl_bfly_u32(c[3], m),
                    ],
                );
                m <<= 1;
            }
            if from == 0 && j < per {
                *smem.slice().add(j as usize) = Quad(c);
            }
            first += THREADS >> shift;
        }
        arch::cluster_sync();

        // Thread t's group, from the reduced slice of the CTA that owns it
        // (`per * size >= GROUPS`: every group has one).
        let group = GROUPS - 1 - tid;
        let owner = group / per;
        let local = smem.slice().add((group - owner * per) as usize) as *const u32;
        let c = arch::ld_shared_cluster_v4_u32(arch::mapa_shared_cluster(
            arch::smem_addr(local),
            owner,
        ));
        settle_crossing(smem, c, group, need)
    }
}

/// Pushes every key of the chunk `>= threshold` to the row's gather
/// buffer, one reservation per warp and group round.
///
/// With `MASK` (the masking form over logits) it also writes -inf over
/// every element of the chunk below the threshold, in the same loop: one
/// vector store for a group whose four slots all are.
///
/// # Safety
/// Every thread calls it; at most [`GATHER_CAP`] keys of the row qualify;
/// with `MASK` the chunk's elements are writable and no other thread
/// reads them.
#[inline(always)]
unsafe fn gather_pass<K: Keys, X: Exchange, const MASK: bool>(
    x: &X,
    chunk: &Chunk<K>,
    smem: Smem,
    threshold: u64,
) {
    let lane = arch::thread_idx_x() % 32;
    let lower = (1u32 << lane) - 1;
    // SAFETY: forwarded; reserved positions stay below GATHER_CAP; the
    // stores go to slots of the chunk (valid), a whole group's to its
    // aligned vector.
    unsafe {
        chunk.for_each_round(smem, |g, bits| {
            let s = 4 * g;
            let key = |e: u32, b: u32| chunk.key(s + e, b).filter(|&k| k >= threshold);
            let k = [
                key(0, bits[0]),
                key(1, bits[1]),
                key(2, bits[2]),
                key(3, bits[3]),
            ];
            if MASK {
                let below = |e: u32| chunk.valid(s + e) && k[e as usize].is_none();
                let at = (chunk.base as *mut f32).wrapping_add(s as usize);
                if below(0) && below(1) && below(2) && below(3) {
                    arch::st_global_v4_u32(at as *mut u32, [NEG_INF_BITS; 4]);
                } else {
                    let mut e = 0;
                    while e < 4 {
                        if below(e) {
                            *at.add(e as usize) = f32::NEG_INFINITY;
                        }
                        e += 1;
                    }
                }
            }
            let m = [
                arch::ballot(k[0].is_some()),
                arch::ballot(k[1].is_some()),
                arch::ballot(k[2].is_some()),
                arch::ballot(k[3].is_some()),
            ];
            let n = [
                m[0].count_ones(),
                m[1].count_ones(),
                m[2].count_ones(),
                m[3].count_ones(),
            ];
            let total = n[0] + n[1] + n[2] + n[3];
            if total == 0 {
                return;
            }
            let mut base = 0;
            if lane == 0 {
                base = x.reserve(smem, total);
            }
            let base = arch::shfl_idx_u32(base, 0);
            let at = [
                base,
                base + n[0],
                base + n[0] + n[1],
                base + n[0] + n[1] + n[2],
            ];
            let put = |e: usize| {
                if let Some(key) = k[e] {
                    let pos = at[e] + (m[e] & lower).count_ones();
                    if pos < GATHER_CAP {
                        x.push(smem, pos, key);
                    }
                }
            };
            put(0);
            put(1);
            put(2);
            put(3);
        });
    }
}

// ---------------------------------------------------------------------------
// Stage 2.
// ---------------------------------------------------------------------------

/// Per-row outputs and parameters (pointers from the launch).
#[derive(Clone, Copy)]
struct Outputs<K: Keys> {
    top_k: *const u32,
    top_p: *const f32,
    seed: *const u64,
    offset: *const u64,
    slab_values: *mut f32,
    slab_indices: *mut u32,
    slab_counts: *mut u32,
    tokens: *mut u32,
    valid: *mut u8,
    /// The masking and sampling forms over logits: min-p, temperature and
    /// (masking) the kept counts.
    min_p: *const f32,
    temperature: *const f32,
    kept: *mut u32,
    keys: PhantomData<K>,
}

/// Writes row `row`'s slab from the sorted gather buffer (`k` entries,
/// then padding: value 0, index `u32::MAX`).
///
/// # Safety
/// Every thread of rank 0 calls it; the slab pointers hold the row.
#[inline(always)]
unsafe fn write_slab<K: Keys>(out: &Outputs<K>, smem: Smem, row: u32, k: u32) {
    let tid = arch::thread_idx_x();
    let at = row as usize * SLAB as usize;
    // SAFETY: the launch contract.
    unsafe {
        let mut i = tid;
        while i < SLAB {
            let (value, index) = if i < k {
                let key = *smem.gather().add(i as usize);
                (K::value(K::bits(key)), K::index(key))
            } else {
                (0.0, u32::MAX)
            };
            *out.slab_values.add(at + i as usize) = value;
            *out.slab_indices.add(at + i as usize) = index;
            i += THREADS;
        }
        if tid == 0 {
            *out.slab_counts.add(row as usize) = k;
        }
    }
}

/// Stage 2 of row `row` over the sorted slab in the gather buffer (`k`
/// entries): exact integer masses, the top-p cut and the inverse-CDF draw,
/// as [`crate::radix_select::draw_from_slab`] computes them sequentially.
/// A slab of at most 64 keys is drawn by the first warp alone (warp scans,
/// no block barrier), a longer one by the block.
///
/// # Safety
/// Every thread of rank 0 calls it; the sampling pointers hold the row.
#[inline(always)]
unsafe fn sample_row<K: Keys>(out: &Outputs<K>, smem: Smem, row: u32, k: u32) {
    let tid = arch::thread_idx_x();
    // SAFETY: forwarded; the warp's and the block's scans and barriers are
    // reached by every thread of their group.
    unsafe {
        if k <= 64 {
            if tid < 32 {
                draw_row(
                    out,
                    smem,
                    row,
                    k,
                    tid,
                    warp_scan,
                    arch::redux_add_u32,
                    arch::bar_warp_sync,
                );
            }
        } else {
            draw_row(
                out,
                smem,
                row,
                k,
                tid,
                |v| block_scan(v, smem),
                |v| block_scan(u64::from(v), smem).1 as u32,
                arch::bar_sync,
            );
        }
    }
}

/// [`sample_row`] on a group of threads: thread `t` of the group holds
/// slab entries `2 t` and `2 t + 1` (the group holds at least `k`); `scan`
/// is the group's exclusive prefix sum and total, `count` its sum of small
/// counts (the kept entries, the entries before the draw: one `redux` on a
/// warp where a scan takes twelve dependent shuffles), `sync` its barrier.
///
/// # Safety
/// Every thread of the group calls it with the same arguments but `t`; the
/// sampling pointers hold the row; the control word `CTL_MASS` is written
/// before `sync` and read after it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn draw_row<K: Keys>(
    out: &Outputs<K>,
    smem: Smem,
    row: u32,
    k: u32,
    t: u32,
    scan: impl Fn(u64) -> (u64, u64),
    count: impl Fn(u32) -> u32,
    sync: fn(),
) {
    let r = row as usize;
    let buf = smem.gather();
    // SAFETY: the launch contract; slab positions below k <= SLAB; the
    // control word is written before a barrier and read after it.
    unsafe {
        let top = K::bits(*buf);
        let (i0, i1) = (2 * t, 2 * t + 1);
        let mass = |i: u32| {
            if i < k {
                fixed_mass(K::bits(*buf.add(i as usize)), top)
            } else {
                0
            }
        };
        let (w0, w1) = (mass(i0), mass(i1));
        let (e0, total) = scan(w0 + w1);
        if total == 0 {
            if t == 0 {
                *out.tokens.add(r) = 0;
                *out.valid.add(r) = 0;
            }
            return;
        }
        let (p0, p1) = (e0 + w0, e0 + w0 + w1);
        let threshold = top_p_threshold(*out.top_p.add(r), total);
        let keeps = u32::from(i0 < k && top_p_keeps(i0, e0, threshold))
            + u32::from(i1 < k && top_p_keeps(i1, p0, threshold));
        let kept = count(keeps);
        let mass_word = smem.ctl(CTL_MASS) as *mut u64;
        if i0 + 1 == kept {
            *mass_word = p0;
        }
        if i1 + 1 == kept {
            *mass_word = p1;
        }
        sync();
        let kept_mass = *mass_word;
        let u = noise::uniform_open(philox::row_uniform_bits(
            philox::seed_key(*out.seed.add(r)),
            *out.offset.add(r),
            0,
        ));
        let target = draw_target(u, kept_mass);
        let before = u32::from(i0 < kept && before_draw(p0, target))
            + u32::from(i1 < kept && before_draw(p1, target));
        let position = count(before);
        if t == 0 {
            let at = position.min(kept - 1);
            *out.tokens.add(r) = K::index(*buf.add(at as usize));
            *out.valid.add(r) = 1;
        }
    }
}

/// The end of row `row` on the CTA holding its gathered keys (`n` of them):
/// the sort, then the slab (`MODE_SLAB` in `mode`) and the draw
/// (`MODE_SAMPLE`) of its `k` first keys, and a barrier before the next
/// row reuses the gather count and buffer.
///
/// # Safety
/// Every thread of the CTA calls it; `n <= GATHER_CAP`; the output pointers
/// of `mode` hold the row.
#[inline(always)]
unsafe fn finish_row<K: Keys>(out: &Outputs<K>, smem: Smem, row: u32, k: u32, n: u32, mode: u32) {
    // SAFETY: forwarded.
    unsafe {
        sort_gathered(smem, n);
        if mode & MODE_SLAB != 0 {
            write_slab(out, smem, row, k);
        }
        if K::DRAWS && mode & MODE_SAMPLE != 0 {
            sample_row(out, smem, row, k);
        }
    }
    arch::bar_sync();
}

/// Sorts the `n` gathered keys descending (the total order).
///
/// # Safety
/// Every thread of the CTA calls it; `n <= GATHER_CAP`; the gather buffer
/// holds `n` keys, written before a block barrier.
#[inline(always)]
unsafe fn sort_gathered(smem: Smem, n: u32) {
    // SAFETY: forwarded. The gathered composites are distinct (each holds
    // its index).
    unsafe {
        if n <= THREADS {
            block::rank_sort_desc::<3>(smem.gather(), n, THREADS);
        } else if n <= 2 * THREADS {
            block::bitonic_sort_desc_regs::<2>(smem.gather(), n, THREADS);
        } else {
            block::bitonic_sort_desc_regs::<4>(smem.gather(), n, THREADS);
        }
    }
}

/// The end of row `row` (at `row_ptr`, `vocab` elements) of the masking
/// (`MASK`) or sampling (`DRAW`) form over logits, on the CTA holding its
/// `n` gathered keys, sorted: the pivot route's cut of min-p and top-p
/// over their `k` first ([`slab_cut`], the slab kernels' code: the kept
/// set and the token of `topk_topp_slab_mask_f32` and
/// `topk_topp_slab_sample_f32` on the slab this row's select writes), its
/// order words and masses in the two histograms (free after the gather:
/// no CTA reads them before the next row's first exchange, which clears
/// them first), its scans in the warp partials. `MASK`: the kept count to
/// `kept` and -inf over the gathered keys from it on (the gather pass and
/// the narrowing's drops wrote -inf over the rest of the row outside the
/// kept set). `DRAW`: the token and its validity, the block maximum's
/// scratch in the gather buffer (which the cut has finished reading).
/// Ends with a block barrier.
///
/// # Safety
/// Every thread of the CTA calls it after [`sort_gathered`]; `k <= n <=
/// GATHER_CAP`; the parameter pointers hold the row; `MASK`: `kept` and
/// the row writable, no other thread reading them; `DRAW`: `seed`,
/// `offset`, `tokens` and `valid` hold the row.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn cut_row<K: Keys, const MASK: bool, const DRAW: bool>(
    out: &Outputs<K>,
    smem: Smem,
    row: u32,
    k: u32,
    n: u32,
    vocab: u32,
    row_ptr: *mut f32,
) {
    let tid = arch::thread_idx_x();
    let buf = smem.gather();
    let r = row as usize;
    // SAFETY: gather positions below n; the arrays in rank 0's
    // histograms (8 KiB each: SLAB u64 and f64) and the scans' in the
    // warp partials (a u64 a warp) as `slab_cut` asks; the row's indices
    // below vocab; the draw's scratch (a slot a warp and one more) in the
    // gather buffer, last read before the cut's first scan barrier.
    unsafe {
        let params = read_params(r, out.top_k, out.top_p, out.min_p, out.temperature);
        let a = CutArrays {
            order: smem.hist(0) as *mut u64,
            mass: smem.hist(1) as *mut f64,
            scratch: smem.warp_partials() as *mut u8,
        };
        let entry = |q: u32| {
            let key = *buf.add(q as usize);
            (K::bits(key), K::index(key))
        };
        let sel = slab_cut(k, entry, params, vocab, a);
        if MASK {
            let kept = if sel.valid { sel.ranked } else { 0 };
            if tid == 0 {
                *out.kept.add(r) = kept;
            }
            let mut q = kept + tid;
            while q < n {
                mask_key::<K>(row_ptr, *buf.add(q as usize));
                q += THREADS;
            }
        }
        if DRAW {
            let draw = CutArrays {
                scratch: buf as *mut u8,
                ..a
            };
            let token = slab_token(&sel, out.seed.add(r), out.offset.add(r), draw);
            store_token(out.tokens.add(r), out.valid.add(r), token, vocab);
        }
    }
    arch::bar_sync();
}
const _: () =
    assert!(HIST_BYTES >= SLAB as usize * 8 && WARPS as usize * 8 <= CTL_OFF - SCRATCH_OFF);

/// Writes -inf over the element of the row at `row` that composite key
/// `key` names (the masking form's writes outside the kept set).
///
/// # Safety
/// The row is writable, its index `K::index(key)` inside it.
#[inline(always)]
unsafe fn mask_key<K: Keys>(row: *mut f32, key: u64) {
    // SAFETY: the caller's contract.
    unsafe { *row.add(K::index(key) as usize) = f32::NEG_INFINITY };
}
const _: () = assert!(GATHER_CAP > WARPS);

// ---------------------------------------------------------------------------
// The row loop.
// ---------------------------------------------------------------------------

/// Both stages for rows `blockIdx.y, blockIdx.y + gridDim.y, ..`; the
/// masking (`MASK`) and sampling (`DRAW`) forms over logits end each row
/// with [`cut_row`] instead of [`finish_row`].
///
/// # Safety
/// The launch contract in the module docs; control flow depends only on
/// values every CTA of the row computes alike (uniform).
#[inline(always)]
unsafe fn radix_rows<K: Keys, X: Exchange, const MASK: bool, const DRAW: bool>(
    x: &X,
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    let smem = Smem::new();
    let mut parity = 0;
    let mut row = arch::block_idx_y();
    // SAFETY: the launch contract covers every access below.
    unsafe {
        while row < args.batch {
            x.begin_row(smem);
            let row_ptr = probs.add(row as usize * args.row_stride as usize);
            let chunk = Chunk::<K>::new(row_ptr, x.rank(), args);
            // `k` is read after the stream pass's loads are issued (read
            // before, every thread waited for it before its first load);
            // the select is made then.
            let mut k = 0;
            let mut sel = RadixSelect::new(1);
            let threshold = loop {
                clear_hist(smem, parity);
                if sel.passes() == 0 {
                    stream_pass(&chunk, smem, smem.hist(parity));
                    k = slab_len(*out.top_k.add(row as usize), args.vocab);
                    sel = RadixSelect::new(k);
                } else {
                    refine_pass(&chunk, smem, smem.hist(parity), &sel);
                }
                x.share(smem, parity);
                let crossing = x.crossing(smem, parity, sel.need());
                parity ^= 1;
                if let Some(t) = sel.advance(crossing) {
                    break t;
                }
            };
            gather_pass::<K, X, MASK>(x, &chunk, smem, threshold);
            let mut n = x.end_gather(smem).min(GATHER_CAP);
            if x.rank() == 0 {
                // A crowded crossing bucket leaves up to GATHER_CAP keys
                // where `k` are needed. For a small `k` a local select
                // narrows them to at most FILTER_DIRECT_KEYS before the
                // sort, as the filter route's end does: the rank sort of
                // 277 and 474 keys cost 3 and 7 us more than that at
                // k = 50 (H100, session 45). Not for a large `k`: the
                // select then saved about 1 us of a sort of 2048 keys, but
                // cost up to 3 us more where ties crowd the boundary (its
                // passes go down through the index bits). Rank 0's
                // histograms are free after the gather's barrier (no CTA
                // reads them before the next row's first exchange, which
                // clears them first), so the select's passes use them on a
                // parity of their own.
                if k <= FILTER_DIRECT_KEYS && !filter_direct(n) {
                    // Every thread has read the gather count (`end_gather`)
                    // before the select zeroes it: without this barrier a
                    // warp running ahead zeroed it before a slower one read
                    // it, which then took the other branch (a race of the
                    // first form, session 45, that racecheck's serialised
                    // warps turned into a hang; memcheck and the tests
                    // passed).
                    arch::bar_sync();
                    let mut p = parity;
                    // The masking form: -inf over the keys it drops.
                    let drop = |key: u64| {
                        if MASK {
                            mask_key::<K>(row_ptr as *mut f32, key);
                        }
                    };
                    n = filter_narrow::<false>(
                        smem,
                        smem.gather(),
                        n,
                        k,
                        FILTER_DIRECT_KEYS,
                        0,
                        &mut p,
                        drop,
                    )
                    .1;
                }
                if MASK || DRAW {
                    sort_gathered(smem, n);
                    cut_row::<K, MASK, DRAW>(out, smem, row, k, n, args.vocab, row_ptr as *mut f32);
                } else {
                    finish_row(out, smem, row, k, n, args.mode);
                }
            }
            row += arch::grid_dim_y();
        }
    }
}

// ---------------------------------------------------------------------------
// The filter route: one CTA per row, one streaming pass, a running threshold.
// ---------------------------------------------------------------------------

/// Elements of a thread's round (four 16-byte vectors).
const ROUND_ELEMS: usize = 4 * FILTER_ROUND_VECS as usize;

/// Runs `$body` for `$i` = 0 to 15 ([`ROUND_ELEMS`]), written out: constant
/// indices keep a round's elements in registers (a loop, unrolled by LLVM
/// only in part, put them in local memory).
macro_rules! each_elem {
    ($i:ident, $body:block) => {{
        let $i: usize = 0;
        $body
    }
    {
        let $i: usize = 1;
        $body
    }
    {
        let $i: usize = 2;
        $body
    }
    {
        let $i: usize = 3;
        $body
    }
    {
        let $i: usize = 4;
        $body
    }
    {
        let $i: usize = 5;
        $body
    }
    {
        let $i: usize = 6;
        $body
    }
    {
        let $i: usize = 7;
        $body
    }
    {
        let $i: usize = 8;
        $body
    }
    {
        let $i: usize = 9;
        $body
    }
    {
        let $i: usize = 10;
        $body
    }
    {
        let $i: usize = 11;
        $body
    }
    {
        let $i: usize = 12;
        $body
    }
    {
        let $i: usize = 13;
        $body
    }
    {
        let $i: usize = 14;
        $body
    }
    {
        let $i: usize = 15;
        $body
    }};
}
const _: () = assert!(ROUND_ELEMS == 16);

/// This thread's bit patterns of filter round `r`: element `4 j + e` is
/// slot `e` of group `r FILTER_ROUND_GROUPS + tid + j THREADS`
/// ([`Keys::PAD`] for slots outside the row).
///
/// # Safety
/// The launch contract (the row is readable).
#[cfg(not(target_feature = "sm_90"))]
#[inline(always)]
unsafe fn filter_load<K: Keys>(chunk: &Chunk<K>, r: u32) -> [u32; ROUND_ELEMS] {
    let g = r * FILTER_ROUND_GROUPS + arch::thread_idx_x();
    // SAFETY: groups below `groups` only.
    let load = |g: u32| unsafe {
        if g < chunk.groups {
            chunk.load_raw(g)
        } else {
            [K::PAD; 4]
        }
    };
    let (a, b, c, d) = (
        load(g),
        load(g + THREADS),
        load(g + 2 * THREADS),
        load(g + 3 * THREADS),
    );
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

/// The slot of this thread's element `i` of round `r`.
#[inline(always)]
fn filter_slot(r: u32, i: usize) -> u32 {
    let g = r * FILTER_ROUND_GROUPS + arch::thread_idx_x() + (i as u32 / 4) * THREADS;
    4 * g + i as u32 % 4
}

/// Reserves `total` (lane 0's value) positions of this round through the
/// round's counter word at shared address `fill`; every lane returns the
/// first.
///
/// # Safety
/// Every lane of the warp calls it; `fill` is a control word of the block.
#[inline(always)]
unsafe fn filter_reserve(fill: u32, total: u32) -> u32 {
    let mut base = 0;
    if arch::thread_idx_x() % 32 == 0 {
        // SAFETY: the caller's contract.
        base = unsafe { arch::atom_shared_add_u32(fill, total) };
    }
    arch::shfl_idx_u32(base, 0)
}

/// Pushes this thread's keys of round `r` (`v`) that are `>= t` to the
/// candidate buffer, after its first `at` keys (below `cap`).
///
/// While [`Keys::exact_push`] (for probabilities: `t` has no value bits,
/// rows whose first round's crossing bucket is the zero bucket: fewer than
/// `k` positive values) the test compares exact keys, and each element's keys take
/// consecutive positions across the warp (one ballot each: such a round
/// pushes most elements, and this layout has no bank conflicts). Later it
/// is [`Keys::pushes`] on the bit pattern, and the few threads with
/// candidates (a selective `t` passes about `k` keys of a round's 8192)
/// reserve their positions with one shared atomic each and store only
/// their candidates, one loop turn each ([`pick_elem`]), instead of the
/// whole warp visiting all sixteen elements.
///
/// # Safety
/// Every thread of the block calls it with the same `r`, `t`, `at`, `cap`
/// and `fill` (a control word); `at <= cap`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn filter_push<K: Keys>(
    chunk: &Chunk<K>,
    smem: Smem,
    r: u32,
    v: &[u32; ROUND_ELEMS],
    t: u64,
    at: u32,
    cap: u32,
    fill: u32,
) {
    let lane = arch::thread_idx_x() % 32;
    let lower = (1u32 << lane) - 1;
    let buf = smem.candidates();
    let key = |i: usize| K::composite(K::clean(v[i]), chunk.first.wrapping_add(filter_slot(r, i)));
    let mut mask = 0u32;
    // SAFETY: positions below `cap`, inside the buffer (the launch
    // contract); the counter word is the caller's.
    unsafe {
        if K::exact_push(t) {
            each_elem!(i, {
                let slot = filter_slot(r, i);
                if chunk.valid(slot) && key(i) >= t {
                    mask |= 1 << i;
                }
            });
            if arch::ballot(mask != 0) == 0 {
                return;
            }
            let mut total = 0;
            each_elem!(i, {
                total += arch::ballot(mask & (1 << i) != 0).count_ones();
            });
            let mut pos = at + filter_reserve(fill, total);
            // The last element's advance of `pos` is not read.
            #[allow(unused_assignments)]
            let () = {
                each_elem!(i, {
                    let bit = mask & (1 << i) != 0;
                    let m = arch::ballot(bit);
                    let p = pos + (m & lower).count_ones();
                    if bit && p < cap {
                        *buf.add(p as usize) = key(i);
                    }
                    pos += m.count_ones();
                });
            };
        } else {
            // Slots outside the row hold `K::PAD`, which fails.
            each_elem!(i, {
                if K::pushes(v[i], t) {
                    mask |= 1 << i;
                }
            });
            if mask != 0 {
                let mut p = at + arch::atom_shared_add_u32(fill, mask.count_ones());
                while mask != 0 {
                    let i = mask.trailing_zeros() as usize;
                    mask &= mask - 1;
                    if p < cap {
                        *buf.add(p as usize) = K::composite(
                            K::clean(pick_elem(v, i)),
                            chunk.first.wrapping_add(filter_slot(r, i)),
                        );
                    }
                    p += 1;
                }
            }
        }
    }
}

/// Element `i` (< [`ROUND_ELEMS`]) of a round, `i` not a constant: a tree
/// of selects on its bits, so that the round stays in registers (an
/// indexed read would put it in local memory).
#[inline(always)]
fn pick_elem(v: &[u32; ROUND_ELEMS], i: usize) -> u32 {
    let pick = |a: u32, b: u32, bit: usize| if i & bit != 0 { b } else { a };
    let l1 = [
        pick(v[0], v[1], 1),
        pick(v[2], v[3], 1),
        pick(v[4], v[5], 1),
        pick(v[6], v[7], 1),
        pick(v[8], v[9], 1),
        pick(v[10], v[11], 1),
        pick(v[12], v[13], 1),
        pick(v[14], v[15], 1),
    ];
    let l2 = [
        pick(l1[0], l1[1], 2),
        pick(l1[2], l1[3], 2),
        pick(l1[4], l1[5], 2),
        pick(l1[6], l1[7], 2),
    ];
    pick(pick(l2[0], l2[1], 4), pick(l2[2], l2[3], 4), 8)
}

/// The threshold the first round of a row starts from: the lowest key of
/// the crossing bucket of the top `k` among the round's first digits (one
/// histogram of the round in registers and the block's crossing), 0 when
/// that bucket is the zero bucket. At least `k` keys of the round, so of
/// the row, are at or above it (the bucket and those above hold `k` or
/// more), so it never exceeds the row's `k`-th key; it is the threshold
/// the first pass of [`filter_narrow`] over the round's keys would give
/// when that pass settles (its crossing bucket and those above fit
/// [`GATHER_CAP`]), and lower otherwise (a crowded bucket: the round's
/// pushes then exceed `GATHER_CAP` and the compaction after the round
/// refines it). For `k` up to the threads ([`seed_by_maxima`]) the
/// histogram holds each thread's largest element of the round instead (a
/// zero for a thread with none): one key a thread, where the round's
/// sixteen a thread, mostly in a few crowded buckets, cost their colliding
/// shared atomics; the same guarantee (the maxima are distinct elements).
///
/// # Safety
/// Every thread of the block calls it with the same arguments; the
/// histograms of `smem` are free (no thread reads or writes them until
/// the call returns).
#[inline(always)]
unsafe fn filter_seed<K: Keys, const SMALL: bool>(
    chunk: &Chunk<K>,
    smem: Smem,
    v: &[u32; ROUND_ELEMS],
    k: u32,
    parity: &mut u32,
) -> u64 {
    // SAFETY: the caller's contract.
    unsafe {
        clear_hist(smem, *parity);
        let mut counter = RunCounter::new(smem.hist(*parity));
        if SMALL && seed_by_maxima(k) {
            let mut top = 0u32;
            each_elem!(i, {
                if chunk.valid(filter_slot(0, i)) {
                    top = top.max(K::clean(v[i]));
                }
            });
            counter.add(first_digit(K::high(top)));
        } else {
            each_elem!(i, {
                if chunk.valid(filter_slot(0, i)) {
                    counter.add(first_digit(K::high(K::clean(v[i]))));
                }
            });
        }
        counter.flush();
        Solo.share(smem, *parity);
        let crossing = find_crossing(&Solo, smem, *parity, k);
        *parity ^= 1;
        seed_threshold(crossing.digit)
    }
}

/// The radix select of the top `k` over `n` candidate keys at `buf` (the
/// passes of [`RadixSelect`] until at most `fit` keys lie at or above the
/// crossing bucket, each a histogram of the candidates still in range and
/// the block's crossing), then the candidates `>= max(its threshold,
/// floor)` gathered into the gather buffer (at most [`GATHER_CAP`]: the
/// select's guarantee). Returns that threshold and the keys gathered.
/// `buf` is the filter kernel's candidate buffer, or the gather buffer
/// itself (the end of a cluster row: every round of the compaction then
/// reads its keys before a barrier and writes after it, so no key is
/// overwritten before it is read).
/// In the kernel for any `k` (`SMALL` false) the first pass counts the
/// digit below the key bits the candidates' least and largest share
/// ([`RadixSelect::within_bits`]), where the first digit crowds them in a
/// dozen buckets: 0.5 to 2.5 us faster at `k = 1000` on the H200, but 0.3
/// to 0.9 us slower at `k <= 50` in the small-`k` kernel, whose selects
/// count a few hundred keys (session 27); that one starts at the first
/// digit.
///
/// `drop(key)` is called for each key of the buffer it does not gather.
///
/// # Safety
/// Every thread of the block calls it with the same arguments; `n` is at
/// most the buffer's capacity and at least `k` of its keys are `>=
/// floor`; `k <= fit <= GATHER_CAP`; the gather count word and the
/// histograms are free (no thread reads them before the call).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn filter_narrow<const SMALL: bool>(
    smem: Smem,
    buf: *const u64,
    n: u32,
    k: u32,
    fit: u32,
    floor: u64,
    parity: &mut u32,
    drop: impl Fn(u64),
) -> (u64, u32) {
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let in_place = core::ptr::eq(buf, smem.gather());
    // SAFETY: buffer positions below `n`, gather positions below
    // GATHER_CAP; the count word is zeroed before the first pass's
    // barrier, read after the last barrier.
    unsafe {
        if tid == 0 {
            core::ptr::write_volatile(smem.ctl(CTL_GATHERED), 0);
        }
        // In the kernel for any `k`: the candidates' least and largest
        // clean bits, each warp's in its slot of the scan partials (free
        // until the first pass's crossing, after the pass's barrier), read
        // after the first pass's clearing barrier; the select starts below
        // the key bits they share.
        let bounds = smem.warp_partials() as *mut u32;
        if !SMALL {
            let (mut lo, mut hi) = (u32::MAX, 0u32);
            let mut i = tid;
            while i < n {
                let bits = high_word(*buf.add(i as usize));
                lo = lo.min(bits);
                hi = hi.max(bits);
                i += THREADS;
            }
            let (lo, hi) = (arch::redux_min_u32(lo), arch::redux_max_u32(hi));
            if lane == 0 {
                *bounds.add((2 * (tid / 32)) as usize) = lo;
                *bounds.add((2 * (tid / 32) + 1) as usize) = hi;
            }
        }
        let mut sel = RadixSelect::new(k);
        let threshold = loop {
            clear_hist(smem, *parity);
            if !SMALL && sel.passes() == 0 {
                let (mut lo, mut hi) = (u32::MAX, 0u32);
                let mut w = 0;
                while w < WARPS {
                    lo = lo.min(*bounds.add((2 * w) as usize));
                    hi = hi.max(*bounds.add((2 * w + 1) as usize));
                    w += 1;
                }
                sel = RadixSelect::within_bits(k, lo, hi);
            }
            let mut counter = RunCounter::new(smem.hist(*parity));
            let mut i = tid;
            while i < n {
                if let Some(d) = sel.digit(*buf.add(i as usize)) {
                    counter.add(d);
                }
                i += THREADS;
            }
            counter.flush();
            Solo.share(smem, *parity);
            let crossing = find_crossing(&Solo, smem, *parity, sel.need());
            *parity ^= 1;
            if let Some(t) = sel.advance_within(crossing, fit) {
                break t.max(floor);
            }
        };
        let count = arch::smem_addr(smem.ctl(CTL_GATHERED));
        let rounds = n.div_ceil(THREADS);
        let mut i = tid;
        let mut r = 0;
        while r < rounds {
            let key = if i < n { *buf.add(i as usize) } else { 0 };
            let keep = i < n && key >= threshold;
            if i < n && !keep {
                drop(key);
            }
            if in_place {
                // Every thread's key of the round read before any is
                // written: a position written in this round may be one a
                // slower warp reads in it (later rounds' lie above).
                arch::bar_sync();
            }
            let m = arch::ballot(keep);
            if m != 0 {
                let mut base = 0;
                if lane == 0 {
                    base = arch::atom_shared_add_u32(count, m.count_ones());
                }
                let pos = arch::shfl_idx_u32(base, 0) + (m & ((1u32 << lane) - 1)).count_ones();
                if keep && pos < GATHER_CAP {
                    *smem.gather().add(pos as usize) = key;
                }
            }
            i += THREADS;
            r += 1;
        }
        arch::bar_sync();
        let kept = core::ptr::read_volatile(smem.ctl(CTL_GATHERED)).min(GATHER_CAP);
        (threshold, kept)
    }
}

/// The keys a filter CTA ends its row with, into the gather buffer: the
/// candidate buffer's first `n` as they are when `direct` (the late
/// compaction of [`filter_compaction`] leaves most rows of a small `k`
/// short enough to sort so), else those [`filter_narrow`]'s final select
/// gathers. Returns how many.
///
/// # Safety
/// As [`filter_narrow`]; with `direct`, `n <= GATHER_CAP`.
#[inline(always)]
unsafe fn filter_final<const SMALL: bool>(
    smem: Smem,
    n: u32,
    k: u32,
    floor: u64,
    parity: &mut u32,
    direct: bool,
) -> u32 {
    // SAFETY: the caller's contract; with `direct`, buffer and gather
    // positions below `n`, read after the barrier that ended the buffer's
    // writes, read by their next users after this barrier.
    unsafe {
        if direct {
            let mut i = arch::thread_idx_x();
            while i < n {
                *smem.gather().add(i as usize) = *smem.candidates().add(i as usize);
                i += THREADS;
            }
            arch::bar_sync();
            n
        } else {
            filter_narrow::<SMALL>(
                smem,
                smem.candidates(),
                n,
                k,
                filter_final_fit(k),
                floor,
                parity,
                |_| {},
            )
            .1
        }
    }
}
const _: () = assert!(crate::radix_select::FILTER_DIRECT_KEYS <= THREADS);

/// A row of the filter kernel: its shape and running state.
struct FilterRow {
    /// Keys to select (`slab_len`).
    k: u32,
    /// The candidate buffer's capacity in keys.
    cap: u32,
    /// Rounds of the row.
    rounds: u32,
    /// The running threshold.
    t: u64,
    /// Keys in the candidate buffer.
    count: u32,
    /// Whether the buffer was compacted in this row.
    compacted: bool,
    /// The current round's counter word (`CTL_FILL + fill`).
    fill: usize,
}

impl FilterRow {
    #[inline(always)]
    fn new(k: u32, cap: u32, rounds: u32) -> FilterRow {
        FilterRow {
            k,
            cap,
            rounds,
            t: 0,
            count: 0,
            compacted: false,
            fill: 0,
        }
    }
}

/// Round `r` of a row once its elements `v` are in every
/// thread's registers: on the first round the seed ([`filter_seed`]), then
/// the push, the block barrier that ends the round, and the compaction
/// when [`filter_compaction`] says. The seed's and the compaction's
/// histograms and gather buffer are `work`'s. In the staged kernel (sm_90
/// and newer) `work` is the round's stage: the seed first waits at a block
/// barrier for every thread's reads of it, and both fence their writes to
/// it before the block barrier after which it is refilled.
///
/// # Safety
/// Every thread of the block calls it with the same arguments but `v`;
/// `work`'s histograms and gather buffer are free.
#[inline(always)]
unsafe fn filter_round<K: Keys, const SMALL: bool>(
    chunk: &Chunk<K>,
    smem: Smem,
    work: Smem,
    r: u32,
    v: &[u32; ROUND_ELEMS],
    st: &mut FilterRow,
    parity: &mut u32,
) {
    let tid = arch::thread_idx_x();
    let (k, cap) = (st.k, st.cap);
    // SAFETY: the caller's contract; round r counts its pushes in word
    // CTL_FILL + r % 3, zeroed two rounds ahead, after the barrier that
    // ends the reads of its previous use, and before the barrier that
    // starts its round.
    unsafe {
        if r == 0 {
            #[cfg(target_feature = "sm_90")]
            arch::bar_sync();
            st.t = filter_seed::<K, SMALL>(chunk, work, v, k, parity);
            #[cfg(target_feature = "sm_90")]
            arch::fence_proxy_async_shared();
        }
        let word = smem.ctl(CTL_FILL + st.fill);
        filter_push(
            chunk,
            smem,
            r,
            v,
            st.t,
            st.count,
            cap,
            arch::smem_addr(word),
        );
        arch::bar_sync();
        st.count = st
            .count
            .saturating_add(core::ptr::read_volatile(word))
            .min(cap);
        if tid == 0 {
            core::ptr::write_volatile(smem.ctl(CTL_FILL + (st.fill + 2) % 3), 0);
        }
        st.fill = (st.fill + 1) % 3;
        if let Some(fit) = filter_compaction(r, st.rounds, st.count, cap, st.compacted, k, SMALL) {
            let (threshold, kept) = filter_narrow::<SMALL>(
                work,
                work.candidates(),
                st.count,
                k,
                fit,
                st.t,
                parity,
                |_| {},
            );
            let mut i = tid;
            while i < kept {
                *smem.candidates().add(i as usize) = *work.gather().add(i as usize);
                i += THREADS;
            }
            #[cfg(target_feature = "sm_90")]
            arch::fence_proxy_async_shared();
            arch::bar_sync();
            st.t = threshold;
            st.count = kept;
            st.compacted = true;
        }
    }
}

/// The end of a filter row after its last round: the final select over the
/// candidate buffer, or the buffer as it is ([`filter_final`]; its
/// histograms and gather buffer `smem`'s), and [`finish_row`], which ends
/// with the barrier after which the next row reuses the counters and the
/// buffer.
///
/// # Safety
/// Every thread of the block calls it with the same arguments; every round
/// of the row was filtered ([`filter_round`]); the output pointers of
/// `mode` hold the row.
#[inline(always)]
unsafe fn filter_end_row<K: Keys, const SMALL: bool>(
    out: &Outputs<K>,
    smem: Smem,
    row: u32,
    st: &FilterRow,
    parity: &mut u32,
    mode: u32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let direct = SMALL && filter_direct(st.count);
        let n = filter_final::<SMALL>(smem, st.count, st.k, st.t, parity, direct);
        finish_row(out, smem, row, st.k, n, mode);
    }
}

/// Both stages for rows `blockIdx.y, blockIdx.y + gridDim.y, ..`, one CTA
/// per row: the row streamed once in rounds of [`FILTER_ROUND_VECS`]
/// vectors per thread (the next round's loads issued before the current
/// round is filtered), every key at or above the running threshold `t`
/// pushed into the candidate buffer (`args.cache_slots` keys). When
/// [`filter_compaction`] says (the buffer could overflow in the next round,
/// or once after the first round), a radix select over the buffer finds
/// the threshold at which its keys fit [`GATHER_CAP`], `t` rises to it and
/// the buffer keeps only the keys at or above it. Every key `>= t` ever
/// seen stays in the buffer and at least `k` keys of the row are `>= t`
/// (`t` never exceeds the k-th key), so the buffer always holds the row's
/// top `k` of what was seen. After the last round a final select gathers
/// the top keys, which are sorted, written and sampled as in
/// [`radix_rows`]: the same slab and token bit for bit.
///
/// This is the kernel of the sm_80 and sm_89 modules; from sm_90 on the
/// rounds come through shared memory (the staged `filter_rows`).
///
/// # Safety
/// The launch contract; `args.cache_slots >= FILTER_MIN_CAP` and the
/// dynamic shared memory holds [`filter_smem_bytes`]`(args.cache_slots,
/// false)` bytes.
///
/// [`filter_smem_bytes`]: crate::radix_select::filter_smem_bytes
#[cfg(not(target_feature = "sm_90"))]
#[inline(always)]
unsafe fn filter_rows<K: Keys, const SMALL: bool>(
    _ws: [*mut u8; 4],
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    let smem = Smem::new();
    let tid = arch::thread_idx_x();
    let cap = args.cache_slots;
    let mut parity = 0;
    let mut row = arch::block_idx_y();
    // SAFETY: the launch contract covers every access below; control flow
    // depends only on values every thread computes alike (uniform).
    unsafe {
        while row < args.batch {
            let row_ptr = probs.add(row as usize * args.row_stride as usize);
            let chunk = Chunk::<K>::new(row_ptr, 0, args);
            let rounds = chunk.groups.div_ceil(FILTER_ROUND_GROUPS);
            // The first round's loads go out before anything waits.
            let mut next = filter_load(&chunk, 0);
            let k = slab_len(*out.top_k.add(row as usize), args.vocab);
            // The first two rounds' counter words ([`filter_round`]).
            if tid == 0 {
                core::ptr::write_volatile(smem.ctl(CTL_FILL), 0);
                core::ptr::write_volatile(smem.ctl(CTL_FILL + 1), 0);
            }
            arch::bar_sync();
            let mut st = FilterRow::new(k, cap, rounds);
            let mut r = 0;
            while r < rounds {
                let v = next;
                if r + 1 < rounds {
                    next = filter_load(&chunk, r + 1);
                }
                filter_round::<K, SMALL>(&chunk, smem, smem, r, &v, &mut st, &mut parity);
                r += 1;
            }
            filter_end_row::<K, SMALL>(out, smem, row, &st, &mut parity, args.mode);
            row += arch::grid_dim_y();
        }
    }
}

/// The end of a row split over a cluster of filter CTAs (sm_90 and
/// newer): each CTA's final select gathers its own keys at or above its
/// threshold (its top `k`, or all of its keys), or it takes its whole
/// buffer when that fits [`GATHER_CAP`] ([`filter_final`]: the select
/// over the union sees them anyway); after a cluster barrier (every
/// CTA's select is done, rank 0's merge count zeroed) every CTA appends
/// them to rank 0's candidate buffer through distributed shared memory
/// (warp-aggregated reservations on rank 0's count); after a second one
/// rank 0 selects the row's top keys from the union (or sorts a short one
/// as it is), which holds them (a key of the row's top `k` is among its
/// CTA's top `k`), and ends the row ([`finish_row`]). The host keeps
/// `ctas * GATHER_CAP` within the buffer.
///
/// # Safety
/// Every thread of every CTA of the cluster calls it for the same row;
/// every round of the row was filtered; the output pointers of `mode`
/// hold the row; the candidate buffers hold `cluster_nctarank() *
/// GATHER_CAP` keys.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
unsafe fn filter_merge_end_row<K: Keys, const SMALL: bool>(
    out: &Outputs<K>,
    smem: Smem,
    row: u32,
    st: &FilterRow,
    parity: &mut u32,
    mode: u32,
) {
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let rank = arch::cluster_ctarank();
    // SAFETY: the caller's contract; rank 0's count word and buffer
    // positions below the reserved total (at most the cluster's gathers,
    // within its buffer); every CTA runs until the second cluster barrier,
    // after every remote access.
    unsafe {
        // No sort follows here: a buffer the merge can take goes as it is.
        let direct = SMALL && st.count <= GATHER_CAP;
        let n = filter_final::<SMALL>(smem, st.count, st.k, st.t, parity, direct);
        if rank == 0 && tid == 0 {
            core::ptr::write_volatile(smem.ctl(CTL_MERGED), 0);
        }
        arch::cluster_sync();
        let count = arch::mapa_shared_cluster(arch::smem_addr(smem.ctl(CTL_MERGED)), 0);
        let buf = arch::mapa_shared_cluster(arch::smem_addr(smem.candidates()), 0);
        let gather = smem.gather();
        let mut i = tid;
        while i < n.div_ceil(THREADS) * THREADS {
            let keep = i < n;
            let m = arch::ballot(keep);
            if m != 0 {
                let mut base = 0;
                if lane == 0 {
                    base = arch::atom_shared_cluster_add_u32(count, m.count_ones());
                }
                let pos = arch::shfl_idx_u32(base, 0) + (m & ((1u32 << lane) - 1)).count_ones();
                if keep {
                    arch::st_shared_cluster_u64(buf + 8 * pos, *gather.add(i as usize));
                }
            }
            i += THREADS;
        }
        arch::cluster_sync();
        if rank == 0 {
            let merged = core::ptr::read_volatile(smem.ctl(CTL_MERGED));
            let direct = SMALL && filter_direct(merged);
            let n = filter_final::<SMALL>(smem, merged, st.k, 0, parity, direct);
            finish_row(out, smem, row, st.k, n, mode);
        }
    }
}

/// The bulk copy of filter round `r` of `chunk` into stage `s`, issued by
/// one thread: the round's whole groups
/// ([`crate::radix_select::filter_bulk_groups`], 16-byte aligned in global
/// memory) at their places in the stage, their bytes expected on the
/// stage's full barrier. A round without whole groups (a row of one or two
/// groups, or a last round of one partial group) completes the phase by
/// the arrival alone. The round's other groups (at most the row's
/// partial first and last) are read by their threads from global memory
/// ([`filter_stage_load`]).
///
/// # Safety
/// One thread calls it; every thread read stage `s` for the last time and
/// fenced its writes to it ([`arch::fence_proxy_async_shared`]) before a
/// block barrier this thread passed since; every round issued to the
/// stage before was waited for (its barrier has no phase pending).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
unsafe fn filter_issue<K: Keys>(chunk: &Chunk<K>, smem: Smem, r: u32, s: u32) {
    let first = r * FILTER_ROUND_GROUPS;
    let (a, b) = crate::radix_select::filter_bulk_groups(chunk.misalign, chunk.end, r);
    let bar = smem.full(s);
    // SAFETY: groups `a..b` are whole groups of the row (readable, 16-byte
    // aligned: group `g` is at `base + 16 g`, `base` 16-byte aligned by
    // construction), `b - a <= FILTER_ROUND_GROUPS`, so they fit the stage
    // from group `a - first` on (16-byte aligned); the caller's contract.
    unsafe {
        if a < b {
            let bytes = 16 * (b - a);
            arch::mbarrier_arrive_expect_tx(bar, bytes);
            arch::cp_async_bulk_shared_global(
                arch::smem_addr(smem.stage(s).add((a - first) as usize)),
                chunk.base.add(4 * a as usize) as *const u8,
                bytes,
                bar,
            );
        } else {
            arch::mbarrier_arrive(bar);
        }
    }
}

/// This thread's bit patterns of filter round `r`, the round's bulk copy
/// complete in `stage`: element `4 j + e` is slot `e` of group `r
/// FILTER_ROUND_GROUPS + tid + j THREADS`, as the register path's
/// `filter_load` reads them: whole groups from the stage (one 16-byte
/// shared load each; a warp reads 512 contiguous bytes, no bank
/// conflict), the row's partial first and last groups from global memory
/// slot by slot ([`Keys::PAD`] outside the row and past it).
///
/// # Safety
/// The launch contract; `stage` holds round `r` ([`filter_issue`], its
/// phase waited for).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
unsafe fn filter_stage_load<K: Keys>(
    chunk: &Chunk<K>,
    stage: *const Quad,
    r: u32,
) -> [u32; ROUND_ELEMS] {
    let tid = arch::thread_idx_x();
    let (lo, hi) = chunk.whole();
    let first = r * FILTER_ROUND_GROUPS;
    let g = first + tid;
    // SAFETY: stage groups below FILTER_ROUND_GROUPS that the copy wrote
    // (whole groups of the round); other groups below `groups` only.
    let (a, b, c, d) = unsafe {
        if g >= lo && g + 3 * THREADS < hi {
            // All four groups whole (every round but a row's first and
            // last): four shared loads back to back.
            let at = |j: u32| (*stage.add((tid + j * THREADS) as usize)).0;
            (at(0), at(1), at(2), at(3))
        } else {
            let load = |j: u32| {
                let i = tid + j * THREADS;
                let g = first + i;
                if g >= lo && g < hi {
                    (*stage.add(i as usize)).0
                } else if g < chunk.groups {
                    chunk.load_raw(g)
                } else {
                    [K::PAD; 4]
                }
            };
            (load(0), load(1), load(2), load(3))
        }
    };
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

/// Both stages for rows `blockIdx.y, blockIdx.y + gridDim.y, ..`, one CTA
/// per row, the rounds streamed through shared memory (sm_90 and newer):
/// the same rounds, pushes, compactions, final select and end of row as the
/// register path's `filter_rows` (so the same slab and token bit for bit),
/// but each round's whole groups come by one bulk copy into a stage of a
/// ring of [`FILTER_STAGES`], so that the copies of the next
/// `FILTER_STAGES - 1` rounds (96 KiB) are in flight while a round is
/// filtered, without registers.
///
/// Thread 0 issues a row's first rounds at its start and round `r +
/// FILTER_STAGES` into the stage of round `r` once every thread has read it
/// (after the block barrier that ends round `r`'s pushes, and after the
/// compaction, if any: its histograms and gather buffer borrow that stage,
/// [`Smem::with_work`]; the final select and the end of the row borrow
/// stage 0, every round having been read by then). The CTA's `n`-th round
/// (over its rows) uses stage `n % FILTER_STAGES` and waits for phase
/// `n / FILTER_STAGES` of its full barrier (parity `(n / FILTER_STAGES) %
/// 2`): it was issued after the wait for phase `n / FILTER_STAGES - 1`, so
/// no wait is ever more than one phase ahead of the barrier.
///
/// # Safety
/// The launch contract; `args.cache_slots >= FILTER_MIN_CAP` and the
/// dynamic shared memory holds [`filter_smem_bytes`]`(args.cache_slots,
/// true)` bytes.
///
/// [`filter_smem_bytes`]: crate::radix_select::filter_smem_bytes
#[cfg(target_feature = "sm_90")]
#[inline(always)]
unsafe fn filter_rows<K: Keys, const SMALL: bool>(
    _ws: [*mut u8; 4],
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    let smem = Smem::staged();
    let tid = arch::thread_idx_x();
    let cap = args.cache_slots;
    let mut parity = 0;
    // Rounds this CTA has waited for, over its rows.
    let mut seq = 0u32;
    let mut row = arch::block_idx_y();
    // SAFETY: the launch contract covers every access below; control flow
    // depends only on values every thread computes alike (uniform).
    unsafe {
        if tid == 0 {
            let mut s = 0;
            while s < FILTER_STAGES {
                arch::mbarrier_init(smem.full(s), 1);
                s += 1;
            }
            // Published to the other threads by the row's first barrier.
            arch::fence_mbarrier_init();
        }
        while row < args.batch {
            let row_ptr = probs.add(row as usize * args.row_stride as usize);
            // A cluster's CTAs split the row (rank r takes chunk r); a
            // launch without one is a cluster of one, the whole row.
            let chunk = Chunk::<K>::new(row_ptr, arch::cluster_ctarank(), args);
            let rounds = chunk.groups.div_ceil(FILTER_ROUND_GROUPS);
            // The first two rounds' counter words ([`filter_round`]).
            if tid == 0 {
                core::ptr::write_volatile(smem.ctl(CTL_FILL), 0);
                core::ptr::write_volatile(smem.ctl(CTL_FILL + 1), 0);
            }
            // The previous row's final select and end wrote stage 0 (its
            // work space); the copies below overwrite it.
            arch::fence_proxy_async_shared();
            arch::bar_sync();
            if tid == 0 {
                let mut j = 0;
                while j < rounds && j < FILTER_STAGES {
                    filter_issue(&chunk, smem, j, (seq + j) % FILTER_STAGES);
                    j += 1;
                }
            }
            // Read after the copies are issued: its first use, the seed,
            // follows the first round's arrival, so the load waits for
            // nothing (read before, the issuing thread waited for it).
            let k = slab_len(*out.top_k.add(row as usize), args.vocab);
            let mut st = FilterRow::new(k, cap, rounds);
            let mut r = 0;
            while r < rounds {
                let s = seq % FILTER_STAGES;
                arch::mbarrier_wait_parity(smem.full(s), (seq / FILTER_STAGES) & 1);
                let v = filter_stage_load(&chunk, smem.stage(s), r);
                // Stage s is read once the round's elements are in
                // registers: the seed and the compaction work in it.
                let work = smem.with_work(smem.stage(s) as *mut u8);
                filter_round::<K, SMALL>(&chunk, smem, work, r, &v, &mut st, &mut parity);
                if tid == 0 && r + FILTER_STAGES < rounds {
                    filter_issue(&chunk, smem, r + FILTER_STAGES, s);
                }
                seq += 1;
                r += 1;
            }
            // Every round issued was waited for: stage 0 is free.
            if arch::cluster_nctarank() == 1 {
                filter_end_row::<K, SMALL>(out, smem, row, &st, &mut parity, args.mode);
                if !K::DRAWS && args.mode & crate::radix_select::MODE_MASK != 0 {
                    mask_outside_slab::<K>(smem, row_ptr as *mut f32, args.vocab, st.k);
                }
            } else {
                filter_merge_end_row::<K, SMALL>(out, smem, row, &st, &mut parity, args.mode);
            }
            row += arch::grid_dim_y();
        }
    }
}

/// [`MODE_MASK`] at the end of a row of the staged filter kernel: -inf over
/// every element of the row (`vocab` of them at `row`) but the `k` of its
/// slab, which the sorted gather buffer still holds ([`finish_row`]); the
/// slab's elements keep their bits. The row's bitmap of slab elements goes
/// in stages 1 and up, which hold no round at a row's end (the work space
/// is stage 0). Ends with a block barrier.
///
/// # Safety
/// Every thread of the CTA calls it after [`filter_end_row`] of the row;
/// `vocab <= FILTER_MASK_MAX_VOCAB`; `row` holds `vocab` writable f32 that
/// no other thread of the device reads or writes during the launch.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
unsafe fn mask_outside_slab<K: Keys>(smem: Smem, row: *mut f32, vocab: u32, k: u32) {
    let tid = arch::thread_idx_x();
    // SAFETY: the bitmap's vocab.div_ceil(32) words fit stages 1 to 3
    // (FILTER_MASK_MAX_VOCAB); gather entries below k <= SLAB are the
    // row's sorted slab, their indices below vocab; barriers between the
    // clearing, the marks and the reads.
    unsafe {
        let bits = smem.stage(1) as *mut u32;
        let mut w = tid;
        while w < vocab.div_ceil(32) {
            *bits.add(w as usize) = 0;
            w += THREADS;
        }
        arch::bar_sync();
        let mut i = tid;
        while i < k {
            let index = K::index(*smem.gather().add(i as usize));
            let word = arch::smem_addr(bits.add((index / 32) as usize));
            // Indices are distinct: adding sets the bit.
            arch::red_shared_add_u32(word, 1 << (index % 32));
            i += THREADS;
        }
        arch::bar_sync();
        block::write_chunk(row, vocab, bits, f32::NEG_INFINITY, |_| None, THREADS);
    }
}

/// The exchange of [`radix_topk_cluster_f32`] on this architecture (it
/// needs no workspace).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
fn cluster_exchange(_ws: [*mut u8; 4]) -> Dsmem {
    Dsmem
}

/// The exchange of [`radix_topk_cluster_f32`] on this architecture (it
/// needs no workspace).
#[cfg(not(target_feature = "sm_90"))]
#[inline(always)]
fn cluster_exchange(_ws: [*mut u8; 4]) -> Solo {
    Solo
}

/// The exchange of [`radix_topk_coop_f32`]: the workspace's histograms,
/// gather buffers, counts and barrier words.
#[inline(always)]
fn global_exchange(ws: [*mut u8; 4]) -> Global {
    Global {
        hist: ws[0] as *mut u32,
        gather: ws[1] as *mut u64,
        count: ws[2] as *mut u32,
        barrier: ws[3] as *mut u32,
        slot: arch::block_idx_y(),
    }
}

/// The rows of [`radix_topk_cluster_f32`] and of the logits kernels of
/// its route (`MASK`, `DRAW`: the masking and sampling forms).
///
/// # Safety
/// The launch contract.
#[inline(always)]
unsafe fn cluster_rows<K: Keys, const MASK: bool, const DRAW: bool>(
    ws: [*mut u8; 4],
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    // SAFETY: forwarded.
    unsafe { radix_rows::<K, _, MASK, DRAW>(&cluster_exchange(ws), probs, out, args) }
}

/// The rows of [`radix_topk_filter_f32`]: any `k`.
///
/// # Safety
/// The launch contract.
#[inline(always)]
unsafe fn filter_rows_any<K: Keys>(
    ws: [*mut u8; 4],
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    // SAFETY: forwarded.
    unsafe { filter_rows::<K, false>(ws, probs, out, args) }
}

/// The rows of [`radix_topk_filter_small_f32`]: every row's `k` at most
/// [`FILTER_SMALL_MAX_K`](crate::radix_select::FILTER_SMALL_MAX_K).
///
/// # Safety
/// The launch contract.
#[inline(always)]
unsafe fn filter_rows_small<K: Keys>(
    ws: [*mut u8; 4],
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    // SAFETY: forwarded.
    unsafe { filter_rows::<K, true>(ws, probs, out, args) }
}

/// The rows of [`radix_topk_coop_f32`].
///
/// # Safety
/// The launch contract.
#[inline(always)]
unsafe fn coop_rows<K: Keys>(
    ws: [*mut u8; 4],
    probs: *const f32,
    out: &Outputs<K>,
    args: &RadixArgs,
) {
    // SAFETY: forwarded.
    unsafe { radix_rows::<K, _, false, false>(&global_exchange(ws), probs, out, args) }
}

macro_rules! radix_entry {
    ($name:ident, $rows:expr, $what:literal) => {
        #[doc = concat!($what, " (see the module docs).")]
        ///
        /// # Launch
        /// See the module docs.
        ///
        /// # Safety
        /// See the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            probs: *const f32,
            top_k: *const u32,
            top_p: *const f32,
            seed: *const u64,
            offset: *const u64,
            slab_values: *mut f32,
            slab_indices: *mut u32,
            slab_counts: *mut u32,
            tokens: *mut u32,
            valid: *mut u8,
            min_p: *const f32,
            temperature: *const f32,
            kept: *mut u32,
            ws_hist: *mut u32,
            ws_gather: *mut u64,
            ws_count: *mut u32,
            ws_barrier: *mut u32,
            args: RadixArgs,
        ) {
            let out = Outputs {
                top_k,
                top_p,
                seed,
                offset,
                slab_values,
                slab_indices,
                slab_counts,
                tokens,
                valid,
                min_p,
                temperature,
                kept,
                keys: PhantomData,
            };
            let ws = [
                ws_hist as *mut u8,
                ws_gather as *mut u8,
                ws_count as *mut u8,
                ws_barrier as *mut u8,
            ];
            // SAFETY: the launch contract.
            unsafe { $rows(ws, probs, &out, &args) }
        }
    };
}

radix_entry!(
    radix_topk_cluster_f32,
    cluster_rows::<Probs, false, false>,
    "Top-k slab and / or sparse top-p sampling of `[batch, vocab]` f32 probabilities, the CTAs of a row forming a thread block cluster that exchanges through distributed shared memory (sm_90; one CTA per row on older GPUs; the workspace pointers are unused)"
);
radix_entry!(
    radix_topk_coop_f32,
    coop_rows::<Probs>,
    "Top-k slab and / or sparse top-p sampling of `[batch, vocab]` f32 probabilities, the CTAs of a row exchanging through the global workspace (`ws_hist`, `ws_gather`, `ws_count`, `ws_barrier`) of a cooperative launch: the multi-CTA fallback of GPUs without clusters"
);
radix_entry!(
    radix_topk_filter_f32,
    filter_rows_any::<Probs>,
    "Top-k slab and / or sparse top-p sampling of `[batch, vocab]` f32 probabilities, one CTA per row streaming it once against a running threshold, its candidates in shared memory (the large-batch route; `args.cache_slots` is the candidate buffer's capacity in keys; the workspace pointers are unused)"
);
radix_entry!(
    radix_topk_filter_small_f32,
    filter_rows_small::<Probs>,
    "Top-k slab and / or sparse top-p sampling of `[batch, vocab]` f32 probabilities, as `radix_topk_filter_f32`, for launches whose every `top_k` is at most `FILTER_SMALL_MAX_K`: the first round's seed from each thread's largest element, a late compaction and a row end without a final select where the buffer is short (kept out of `radix_topk_filter_f32`, whose code for larger `k` they made 0.5 to 1.9 us slower on the H200)"
);

radix_entry!(
    radix_topk_cluster_logits_f32,
    cluster_rows::<Logits, false, false>,
    "The top-k slab (`MODE_SLAB` only) of `[batch, vocab]` f32 logits (`probs` points to them; NaN counts as -inf and comes back as -inf), as `radix_topk_cluster_f32`: the pivot route's top-k (`crate::topk_topp`)"
);
radix_entry!(
    radix_topk_cluster_mask_logits_f32,
    cluster_rows::<Logits, true, false>,
    "In-place top-k / top-p / min-p masking of `[batch, vocab]` f32 logits (`probs` points to them, writable; NaN counts as -inf), as `radix_topk_cluster_logits_f32` selects their top-k, in one launch: every element outside a row's kept set becomes -inf (the gather pass writes the elements below its threshold, the row's first CTA the gathered keys outside the set), the kept ones keep their bits, and the kept count goes to `kept`; the cut is `topk_topp_slab_mask_f32`'s over the slab the select would write (`crate::topk_topp::slab_cut`). Reads `top_k`, `top_p`, `min_p`, `temperature` (`batch` each; every `top_k` from 1 to `SLAB` and below `vocab`); `args.mode` and the slab, token and workspace pointers unused"
);
radix_entry!(
    radix_topk_cluster_sample_logits_f32,
    cluster_rows::<Logits, false, true>,
    "One draw per row of `[batch, vocab]` f32 logits under top-k / top-p / min-p and temperature, as `radix_topk_cluster_logits_f32` selects their top-k, in one launch: the token and its validity of `topk_topp_slab_sample_f32` over the slab the select would write (`crate::topk_topp::slab_cut`, then its draw with the row's `seed` and `offset`). Reads `top_k` (as the masking form), `top_p`, `min_p`, `temperature`, `seed`, `offset`; writes `tokens`, `valid` (`batch` each); `args.mode`, the slab, `kept` and the workspace pointers unused"
);
radix_entry!(
    radix_topk_filter_logits_f32,
    filter_rows_any::<Logits>,
    "The top-k slab (`MODE_SLAB` only) of `[batch, vocab]` f32 logits, as `radix_topk_cluster_logits_f32`, by the route of `radix_topk_filter_f32`"
);
radix_entry!(
    radix_topk_filter_small_logits_f32,
    filter_rows_small::<Logits>,
    "The top-k slab (`MODE_SLAB` only) of `[batch, vocab]` f32 logits, as `radix_topk_cluster_logits_f32`, by the route of `radix_topk_filter_small_f32`"
);

/// The pivot route's input for probabilities: `logits[r][j] =
/// prob_logit(prob_bits(probs[r][j]))` (`ln p`, -inf for no mass), written
/// contiguously (`[batch, vocab]`).
///
/// # Launch
/// Any grid of blocks of [`RADIX_THREADS`]; rows `blockIdx.y + n
/// gridDim.y`, elements `blockIdx.x * RADIX_THREADS + tid + n gridDim.x
/// RADIX_THREADS`. No shared memory.
///
/// # Safety
/// `probs` as for the radix kernels; `logits` holds `batch * vocab`
/// writable elements.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn radix_probs_to_logits_f32(
    probs: *const f32,
    logits: *mut f32,
    args: RadixArgs,
) {
    let step = arch::grid_dim_x() * THREADS;
    let mut row = arch::block_idx_y();
    while row < args.batch {
        let mut j = arch::block_idx_x() * THREADS + arch::thread_idx_x();
        while j < args.vocab {
            // SAFETY: the launch contract.
            unsafe {
                let x = *probs.add(row as usize * args.row_stride as usize + j as usize);
                *logits.add(row as usize * args.vocab as usize + j as usize) =
                    prob_logit(prob_bits(x));
            }
            j = match j.checked_add(step) {
                Some(v) => v,
                None => break,
            };
        }
        row += arch::grid_dim_y();
    }
}
