//! `topk_topp`: exact top-k / top-p / min-p truncation of f32 logits by
//! the Qrita pivot search (issue 4), first GPU version.
//!
//! The selection is the driver of [`crate::pivot::select_row`] run by one
//! thread block over one row, with every per-element step (statistics,
//! pre-filter tiers, pivot rounds, tie resolution) a pass of the block over
//! the row and every sum a block reduction in a fixed order, so a row's
//! result depends on the row and its parameters only. The portable pieces
//! ([`RowStats`], the pre-filter deltas, [`Weights`], [`Pivots`],
//! [`QuadAcc`], [`QuadSearch`], [`Cut`], [`top_p_ties`]) are the very
//! functions the CPU driver and its tests run.
//!
//! The passes that touch every element run over **chunks** of
//! [`TOPK_TOPP_CHUNK`] elements, one block each, so a row is spread over
//! `ceil(V / 8192)` blocks and a batch over the whole GPU; the selection
//! itself runs in one block per row over the pre-filter's candidates,
//! compacted into a list in the workspace:
//!
//! 1. [`topk_topp_stats_f32`] (a block per chunk): the chunk's
//!    [`RowStats`] and, for a row whose top-k keeps at most
//!    [`cover::LOCAL_MAX_K`], the chunk's own list: every element at or
//!    above a floor from the chunk's statistics that lists at least the
//!    chunk's k largest ([`cover`]); up to [`cover::SHARED_MAX_K`], the
//!    elements at or above a floor aimed at the chunk's share of the row's
//!    k; the chunk held in registers from its loads to its list;
//! 2. [`topk_topp_plan_f32`] (a block per row): merges the row's
//!    statistics and writes the pre-filter's thresholds, and flags the row
//!    [`COVERED`] when every chunk listed (the union of the lists then
//!    holds the row's top k) and, for shares, when the listed elements at
//!    or above the highest chunk floor number at least k
//!    ([`cover::shared_cover`]);
//! 3. [`topk_topp_filter_f32`] (a block per chunk; nothing for a covered
//!    row): writes the chunk's pre-filter tiers and its tier-1 survivors
//!    (the usual candidates), in the block's scan order (each thread marks
//!    its survivors in a bit mask while it counts the tiers, and reads only
//!    them again to list them);
//! 4. a selection kernel (a block per row) merges the tiers, loads the
//!    candidate lists into shared memory when every candidate fits (else it
//!    reads the row itself, as the one-block version did) and runs the
//!    pivot rounds there (a covered row's candidates are its lists' entries
//!    at or above the first tier's key, or the highest chunk floor:
//!    [`covered_view`]); a list of at most 4096 candidates is sorted
//!    instead (its entries' order words in shared memory, by rank counting
//!    up to 256 and a bitonic network above, then the cut from the masses
//!    summed in that order by block scans), and so are, after the top-k
//!    pivot search, the top-k survivors of any other row whose top-k keeps
//!    at most [`RANKED_MAX_K`] (gathered into shared memory): such a row's
//!    cut is the rank-order one whatever its route, the slab kernels'
//!    below included;
//! 5. for masking, [`topk_topp_apply_f32`] (a block per chunk) writes -inf
//!    over the chunk's elements outside the kept set, without reading them
//!    when the kept set came from the lists.
//!
//! Every partial is merged in a fixed order and the chunking depends on V
//! only, so a row's result depends only on the row and its parameters.
//!
//! Two selection kernels:
//! - [`topk_topp_mask_f32`] writes the cut and the kept count per row (and
//!   on request the kept mass), and then, a block per chunk,
//!   [`topk_topp_apply_f32`] writes -inf in place over every logit outside
//!   the kept set (vLLM semantics), or [`topk_topp_renorm_f32`] writes the
//!   probabilities renormalised over the kept set into another buffer, or
//!   [`topk_topp_kept_count_f32`] and [`topk_topp_kept_write_f32`] write
//!   the kept indices in ascending order (a bitmap of the chunk's kept
//!   elements, then its words' counts scanned over the block);
//! - [`topk_topp_sample_f32`] draws one token per row from the kept set
//!   renormalised, by inverse CDF in the total order (value desc, index
//!   asc) with `u = uniform_open(row_uniform_bits(seed_key(seed), offset,
//!   0))`, found by one more pivot search over the kept set's cumulative
//!   mass (by one block scan over the ranks when the candidates were
//!   sorted).
//!
//! The slab route: when every row's top-k keeps at most [`RANKED_MAX_K`],
//! a radix select ([`crate::radix_select`]) can write each row's top-k to
//! a slab instead of the passes above, and [`topk_topp_slab_mask_f32`]
//! (followed by the same renorm or kept-set passes, or by
//! [`topk_topp_slab_apply_f32`], which marks the kept elements from the
//! slab and so writes without reading) or [`topk_topp_slab_sample_f32`]
//! cut it by the same rank-order rule: the same results as the selection
//! kernels, bit for bit. When the select itself wrote -inf outside each
//! row's slab ([`MODE_MASK`](crate::radix_select::MODE_MASK)),
//! [`topk_topp_slab_mask_f32`] given the rows writes the slab entries its
//! cut drops, and no apply pass follows.
//!
//! # Launch
//! In this order on one stream: stats, plan, filter, then mask and apply
//! (or renorm, or kept count and kept write), or sample. Block
//! [`ROW_THREADS`] (exactly); the chunked kernels a grid of
//! `(batch * chunks, 1, 1)` blocks and the plan kernel `(batch, 1, 1)`,
//! with [`TOPK_TOPP_CHUNK_SMEM_BYTES`] of dynamic shared memory; the
//! selection kernels `(batch, 1, 1)` with [`TOPK_TOPP_SMEM_BYTES`];
//! `chunks` is [`TopkToppLayout::chunks`].
//!
//! # Safety (caller)
//! `logits` holds `batch` rows `row_stride` elements apart with `vocab`
//! readable (and, for the apply kernel, writable) elements each, `1 <=
//! vocab <= MAX_VOCAB`; `top_k`, `top_p`, `min_p`, `temperature` (and
//! `seed`, `offset`, `tokens`, `valid`, or `kept`) hold `batch` elements;
//! `ws` holds [`TopkToppLayout::words`] words for (batch, vocab), used by
//! no other work meanwhile; every kernel of one call gets the same
//! arguments; no other thread of the device writes them during the launch.

use crate::arch;
use crate::block;
use crate::cover::{self, LocalTier};
use crate::noise;
use crate::params::{
    ROW_THREADS, TOPK_TOPP_CHUNK, TOPK_TOPP_CHUNK_SMEM_BYTES, TOPK_TOPP_LIST_CAP,
    TOPK_TOPP_MAX_LISTED_CHUNKS, TOPK_TOPP_PLAN_SLOT_BYTES, TOPK_TOPP_SMEM_BYTES,
    TOPK_TOPP_STATS_SLOT_BYTES, TOPK_TOPP_TIERS_SLOT_BYTES, TopkToppLayout,
};
use crate::philox;
use crate::pivot::{
    Cut, Found, Group, Measure, Pivots, Plan, Prefilter, QuadAcc, QuadSearch, RowParams, RowStats,
    Truncation, Weights, index_key, top_p_ties,
};
use crate::radix::{f32_from_key, f32_key};

/// Warps of a block.
const WARPS: usize = (ROW_THREADS / 32) as usize;

/// Bytes of reduction slots at the start of the dynamic shared memory: one
/// slot per warp of the largest reduced type ([`QuadAcc<f64>`], 80 bytes).
const REDUCE_BYTES: usize = 1024;

const _: () = assert!(core::mem::size_of::<QuadAcc<f64>>() * WARPS <= REDUCE_BYTES);
const _: () = assert!((core::mem::size_of::<Tiers>() + 4) * WARPS <= REDUCE_BYTES);
const _: () = assert!((WARPS + 1) * 8 <= REDUCE_BYTES);
// The butterfly over the warps' results stays inside a warp.
const _: () = assert!(WARPS.is_power_of_two() && WARPS <= 32);
// The selection block keeps an offset per listed chunk.
const _: () = assert!(TOPK_TOPP_MAX_LISTED_CHUNKS <= ROW_THREADS);
const _: () = assert!(core::mem::size_of::<RowStats>() <= TOPK_TOPP_STATS_SLOT_BYTES);
const _: () = assert!(core::mem::size_of::<Tiers>() <= TOPK_TOPP_TIERS_SLOT_BYTES);
const _: () = assert!(core::mem::size_of::<RowPlan>() <= TOPK_TOPP_PLAN_SLOT_BYTES);
const _: () = assert!(
    REDUCE_BYTES + ROW_THREADS as usize * 4 + TOPK_TOPP_LIST_CAP as usize * 8
        <= TOPK_TOPP_SMEM_BYTES as usize
);
// The sorted order words, then their masses, inside the list's room.
const _: () = assert!(2 * SORT_MAX <= TOPK_TOPP_LIST_CAP);
const _: () =
    assert!(REDUCE_BYTES + TOPK_TOPP_CHUNK as usize / 8 <= TOPK_TOPP_CHUNK_SMEM_BYTES as usize);
// The kept-set passes: a bitmap word per thread.
const _: () = assert!(TOPK_TOPP_CHUNK / 32 == ROW_THREADS);

// ---------------------------------------------------------------------------
// Block reductions in a fixed order.
// ---------------------------------------------------------------------------

/// A per-thread partial result that can be exchanged across a warp and
/// merged. `merge` must be commutative bit for bit (sums of floats are),
/// so both partners of a butterfly step hold the same value.
trait Reduce: Copy {
    /// The value of lane `self ^ lane_mask` (every lane must call it).
    fn shfl(&self, lane_mask: u32) -> Self;
    fn merge_with(&mut self, o: &Self);

    /// The merge over the warp, to every lane (every lane must call it): a
    /// butterfly unless the type has a cheaper exact form.
    #[inline(always)]
    fn warp_merge(mut self) -> Self {
        let mut m = 16;
        while m > 0 {
            let o = self.shfl(m);
            self.merge_with(&o);
            m >>= 1;
        }
        self
    }
}

#[inline(always)]
fn shfl_f32(x: f32, m: u32) -> f32 {
    f32::from_bits(arch::shfl_bfly_u32(x.to_bits(), m))
}

#[inline(always)]
fn shfl_f64(x: f64, m: u32) -> f64 {
    let b = x.to_bits();
    let lo = arch::shfl_bfly_u32(b as u32, m);
    let hi = arch::shfl_bfly_u32((b >> 32) as u32, m);
    f64::from_bits((u64::from(hi) << 32) | u64::from(lo))
}

/// A measure that crosses a warp shuffle.
trait ShflMeasure: Measure {
    fn shfl(self, m: u32) -> Self;

    /// The sum over the warp, to every lane (every lane must call it).
    fn warp_sum(self) -> Self;
}

impl ShflMeasure for u32 {
    #[inline(always)]
    fn shfl(self, m: u32) -> u32 {
        arch::shfl_bfly_u32(self, m)
    }

    #[inline(always)]
    fn warp_sum(self) -> u32 {
        arch::redux_add_u32(self)
    }
}

impl ShflMeasure for f64 {
    #[inline(always)]
    fn shfl(self, m: u32) -> f64 {
        shfl_f64(self, m)
    }

    /// A butterfly: the same bits in every lane (sums of two floats
    /// commute), and those of the butterfly over the whole accumulator.
    #[inline(always)]
    fn warp_sum(mut self) -> f64 {
        let mut m = 16;
        while m > 0 {
            self += shfl_f64(self, m);
            m >>= 1;
        }
        self
    }
}

/// The sum over the warp by a butterfly, to every lane (every lane must
/// call it): the same bits in every lane, and those of the butterfly over
/// a whole [`Reduce`] value whose merge adds this field.
#[inline(always)]
fn warp_sum_f32(mut x: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        x += shfl_f32(x, m);
        m >>= 1;
    }
    x
}

impl Reduce for RowStats {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        RowStats {
            max_key: arch::shfl_bfly_u32(self.max_key, m),
            n_posinf: arch::shfl_bfly_u32(self.n_posinf, m),
            n_finite: arch::shfl_bfly_u32(self.n_finite, m),
            sum: shfl_f32(self.sum, m),
            sum_sq: shfl_f32(self.sum_sq, m),
        }
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        self.merge(o);
    }

    /// The integers by one `redux.sync` each (exact, so the butterfly's
    /// values), the sums by the butterfly.
    #[inline(always)]
    fn warp_merge(self) -> Self {
        RowStats {
            max_key: arch::redux_max_u32(self.max_key),
            n_posinf: arch::redux_add_u32(self.n_posinf),
            n_finite: arch::redux_add_u32(self.n_finite),
            sum: warp_sum_f32(self.sum),
            sum_sq: warp_sum_f32(self.sum_sq),
        }
    }
}

impl<M: ShflMeasure> Reduce for QuadAcc<M> {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        // Constant indices only: the arrays stay in registers.
        QuadAcc {
            count: [
                arch::shfl_bfly_u32(self.count[0], m),
                arch::shfl_bfly_u32(self.count[1], m),
                arch::shfl_bfly_u32(self.count[2], m),
                arch::shfl_bfly_u32(self.count[3], m),
            ],
            measure: [
                self.measure[0].shfl(m),
                self.measure[1].shfl(m),
                self.measure[2].shfl(m),
                self.measure[3].shfl(m),
            ],
            min_key: [
                arch::shfl_bfly_u32(self.min_key[0], m),
                arch::shfl_bfly_u32(self.min_key[1], m),
                arch::shfl_bfly_u32(self.min_key[2], m),
                arch::shfl_bfly_u32(self.min_key[3], m),
            ],
            max_key: [
                arch::shfl_bfly_u32(self.max_key[0], m),
                arch::shfl_bfly_u32(self.max_key[1], m),
                arch::shfl_bfly_u32(self.max_key[2], m),
                arch::shfl_bfly_u32(self.max_key[3], m),
            ],
        }
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        self.merge(o);
    }

    /// Counts, key ranges (and integer measures) by one `redux.sync` each
    /// instead of five shuffle steps: exact, so the same as the butterfly.
    #[inline(always)]
    fn warp_merge(self) -> Self {
        QuadAcc {
            count: [
                arch::redux_add_u32(self.count[0]),
                arch::redux_add_u32(self.count[1]),
                arch::redux_add_u32(self.count[2]),
                arch::redux_add_u32(self.count[3]),
            ],
            measure: [
                self.measure[0].warp_sum(),
                self.measure[1].warp_sum(),
                self.measure[2].warp_sum(),
                self.measure[3].warp_sum(),
            ],
            min_key: [
                arch::redux_min_u32(self.min_key[0]),
                arch::redux_min_u32(self.min_key[1]),
                arch::redux_min_u32(self.min_key[2]),
                arch::redux_min_u32(self.min_key[3]),
            ],
            max_key: [
                arch::redux_max_u32(self.max_key[0]),
                arch::redux_max_u32(self.max_key[1]),
                arch::redux_max_u32(self.max_key[2]),
                arch::redux_max_u32(self.max_key[3]),
            ],
        }
    }
}

impl Reduce for Group {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        Group {
            n: arch::shfl_bfly_u32(self.n, m),
            min: arch::shfl_bfly_u32(self.min, m),
            max: arch::shfl_bfly_u32(self.max, m),
            mass: shfl_f64(self.mass, m),
        }
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        *self = self.join(*o);
    }

    /// The count and key range by one `redux.sync` each (exact, so the
    /// butterfly's values), the mass by the butterfly.
    #[inline(always)]
    fn warp_merge(self) -> Self {
        Group {
            n: arch::redux_add_u32(self.n),
            min: arch::redux_min_u32(self.min),
            max: arch::redux_max_u32(self.max),
            mass: self.mass.warp_sum(),
        }
    }
}

/// Count and softmax mass of one of the pre-filter's candidate sets (its
/// key range is known without a scan: [`Tiers::candidates`]).
#[derive(Clone, Copy)]
struct Tier {
    n: u32,
    mass: f64,
}

impl Reduce for Tier {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        Tier {
            n: arch::shfl_bfly_u32(self.n, m),
            mass: shfl_f64(self.mass, m),
        }
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        self.n = self.n.wrapping_add(o.n);
        self.mass += o.mass;
    }

    /// The count by one `redux.sync` (exact, so the butterfly's value), the
    /// mass by the butterfly.
    #[inline(always)]
    fn warp_merge(self) -> Self {
        Tier {
            n: arch::redux_add_u32(self.n),
            mass: self.mass.warp_sum(),
        }
    }
}

/// The pre-filter's nested candidate sets among min-p's survivors: keys
/// `>= t1`, keys `>= t2` (`t2 <= t1`), and all of them. Three named fields
/// rather than an array indexed by the tier, which would live in local
/// memory.
#[derive(Clone, Copy)]
struct Tiers {
    s1: Tier,
    s2: Tier,
    all: Tier,
}

impl Tiers {
    const EMPTY: Tiers = Tiers {
        s1: Tier { n: 0, mass: 0.0 },
        s2: Tier { n: 0, mass: 0.0 },
        all: Tier { n: 0, mass: 0.0 },
    };

    /// The floor and group of [`Plan::candidates`] of the row planned by
    /// `rp`, the group's key range bounded rather than scanned: from the
    /// set's least key (`rp.keys`: its threshold, at least min-p's key;
    /// every element of the row from there up is in the set) up to the
    /// row's largest (which every non-empty set holds). A pivot search or a
    /// histogram over the bounds finds the same elements, and the pass over
    /// every element no longer tracks three key ranges.
    #[inline(always)]
    fn candidates(&self, rp: &RowPlan) -> (u32, Group) {
        let g = |t: Tier| Group {
            n: t.n,
            min: 0,
            max: 0,
            mass: t.mass,
        };
        let (floor, mut cand, tier) = rp.plan.candidates(g(self.s1), g(self.s2), g(self.all));
        if cand.n > 0 {
            cand.min = match tier {
                Prefilter::Hit => rp.keys[0],
                Prefilter::HitSecondTier => rp.keys[1],
                _ => rp.keys[2],
            };
            cand.max = f32_key(rp.plan.weights.max.to_bits());
        } else {
            (cand.min, cand.max) = (u32::MAX, 0);
        }
        (floor, cand)
    }
}

impl Reduce for Tiers {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        Tiers {
            s1: self.s1.shfl(m),
            s2: self.s2.shfl(m),
            all: self.all.shfl(m),
        }
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        self.s1.merge_with(&o.s1);
        self.s2.merge_with(&o.s2);
        self.all.merge_with(&o.all);
    }

    #[inline(always)]
    fn warp_merge(self) -> Self {
        Tiers {
            s1: self.s1.warp_merge(),
            s2: self.s2.warp_merge(),
            all: self.all.warp_merge(),
        }
    }
}

/// `N` counts summed over the block: the [`Tiers`]' counts alone, for rows
/// whose masses the selection does not need (every mass 0: one `redux.sync`
/// a count and warp instead of f64 butterflies), or the listed elements at
/// the plan's floors ([`listed_at`]).
#[derive(Clone, Copy)]
struct Counts<const N: usize>([u32; N]);

impl Counts<3> {
    #[inline(always)]
    fn tiers(self) -> Tiers {
        let g = |n: u32| Tier { n, mass: 0.0 };
        Tiers {
            s1: g(self.0[0]),
            s2: g(self.0[1]),
            all: g(self.0[2]),
        }
    }
}

impl<const N: usize> Reduce for Counts<N> {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        // Element by element in place: `array::map` keeps its array in
        // local memory (an 80-byte stack frame in every kernel using it).
        let mut n = self.0;
        for n in n.iter_mut() {
            *n = arch::shfl_bfly_u32(*n, m);
        }
        Counts(n)
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        // By index: zipping with the array by value keeps its iterator in
        // local memory.
        for i in 0..N {
            self.0[i] = self.0[i].wrapping_add(o.0[i]);
        }
    }
    #[inline(always)]
    fn warp_merge(self) -> Self {
        let mut n = self.0;
        for n in n.iter_mut() {
            *n = arch::redux_add_u32(*n);
        }
        Counts(n)
    }
}

/// One thread's [`Tiers`] while it scans: per set a count and a mass.
#[derive(Clone, Copy)]
struct TierScan {
    n: [u32; 3],
    mass: [f64; 3],
}

impl TierScan {
    const EMPTY: TierScan = TierScan {
        n: [0; 3],
        mass: [0.0; 3],
    };

    /// Adds an element that passes thresholds `k[0] >= k[1] >= k[2]` as
    /// flagged in `on` (nested: `on[0]` implies `on[1]` implies `on[2]`)
    /// with weight `w` (`None` when the masses are not needed). Constant
    /// indices only (the arrays stay in registers).
    #[inline(always)]
    fn add(&mut self, on: [bool; 3], w: Option<f64>) {
        for t in 0..3 {
            self.n[t] += u32::from(on[t]);
            if let Some(w) = w {
                self.mass[t] += if on[t] { w } else { 0.0 };
            }
        }
    }

    #[inline(always)]
    fn tiers(&self) -> Tiers {
        let g = |t: usize| Tier {
            n: self.n[t],
            mass: self.mass[t],
        };
        Tiers {
            s1: g(0),
            s2: g(1),
            all: g(2),
        }
    }
}

/// The block-wide merge of every thread's `v`, returned to every thread:
/// [`Reduce::warp_merge`] within each warp, then a butterfly over the
/// warps' results.
/// The same inputs give the same bits on every launch.
///
/// # Safety
/// Every thread of the block calls it (uniform control flow); `smem`
/// points to `WARPS` slots of `T` in shared memory no one else uses
/// meanwhile.
#[inline(always)]
unsafe fn block_reduce<T: Reduce>(v: T, smem: *mut T) -> T {
    let tid = arch::thread_idx_x();
    let v = v.warp_merge();
    // SAFETY: slots below WARPS (caller's contract); barriers separate the
    // writes from the reads and the reads from the next call's writes.
    unsafe {
        if tid.is_multiple_of(32) {
            *smem.add((tid / 32) as usize) = v;
        }
        arch::bar_sync();
        let r = merge_over_warps(*smem.add((tid % 32) as usize % WARPS));
        arch::bar_sync();
        r
    }
}

/// The merge of the block's `WARPS` per-warp results, to every thread,
/// from `mine`, the result of warp `lane % WARPS` (read by the caller from
/// the slots): a butterfly over those `WARPS` lanes (one slot in registers
/// per thread, where a loop over the slots had the compiler load all of
/// them at once: 144 registers for `Tiers`). Every lane must call it.
#[inline(always)]
fn merge_over_warps<T: Reduce>(mine: T) -> T {
    let mut r = mine;
    let mut m = WARPS as u32 / 2;
    while m > 0 {
        let o = r.shfl(m);
        r.merge_with(&o);
        m >>= 1;
    }
    r
}

/// The inclusive prefix sum of `v` over the lanes of the warp, in lane
/// order (every lane must call it).
#[inline(always)]
fn warp_inclusive_scan(v: u32) -> u32 {
    let lane = arch::thread_idx_x() % 32;
    let mut inclusive = v;
    let mut d = 1;
    while d < 32 {
        let o = arch::shfl_up_u32(inclusive, d);
        if lane >= d {
            inclusive = inclusive.wrapping_add(o);
        }
        d <<= 1;
    }
    inclusive
}

/// The block-wide exclusive prefix sum of `v` in thread order, and the
/// total, to every thread.
///
/// # Safety
/// As [`block_reduce`] (`smem`: `WARPS` u32 slots).
#[inline(always)]
unsafe fn block_exclusive_scan(v: u32, smem: *mut u32) -> (u32, u32) {
    let tid = arch::thread_idx_x();
    let (lane, warp) = (tid % 32, (tid / 32) as usize);
    let inclusive = warp_inclusive_scan(v);
    // SAFETY: slots below WARPS (caller's contract); barriers as in
    // `block_reduce`.
    unsafe {
        if lane == 31 {
            *smem.add(warp) = inclusive;
        }
        arch::bar_sync();
        let (mut before, mut total) = (0u32, 0u32);
        let mut w = 0;
        while w < WARPS {
            let c = *smem.add(w);
            if w < warp {
                before = before.wrapping_add(c);
            }
            total = total.wrapping_add(c);
            w += 1;
        }
        arch::bar_sync();
        (before.wrapping_add(inclusive).wrapping_sub(v), total)
    }
}

/// [`block_exclusive_scan`] of `v` (this thread's exclusive prefix) and
/// [`block_reduce`] of `t`, to every thread, over one pair of barriers
/// instead of two.
///
/// # Safety
/// As [`block_reduce`] (`smem`: `WARPS` slots of `T`, then `WARPS` u32).
#[inline(always)]
unsafe fn block_scan_reduce<T: Reduce>(v: u32, t: T, smem: *mut u8) -> (u32, T) {
    let tid = arch::thread_idx_x();
    let (lane, warp) = (tid % 32, (tid / 32) as usize);
    let inclusive = warp_inclusive_scan(v);
    let t = t.warp_merge();
    // SAFETY: the slots lie below REDUCE_BYTES (caller's contract; const
    // asserts for `Tiers`); barriers as in `block_reduce`.
    unsafe {
        let slots = smem as *mut T;
        let counts = smem.add(WARPS * core::mem::size_of::<T>()) as *mut u32;
        if lane == 31 {
            *counts.add(warp) = inclusive;
        }
        if lane == 0 {
            *slots.add(warp) = t;
        }
        arch::bar_sync();
        let mut before = 0u32;
        let mut w = 0;
        while w < warp {
            before = before.wrapping_add(*counts.add(w));
            w += 1;
        }
        let r = merge_over_warps(*slots.add((tid % 32) as usize % WARPS));
        arch::bar_sync();
        (before.wrapping_add(inclusive).wrapping_sub(v), r)
    }
}

// ---------------------------------------------------------------------------
// The selection.
// ---------------------------------------------------------------------------

/// A row, or a chunk of one: its logits, its length and the row index of
/// its first element.
#[derive(Clone, Copy)]
struct Row {
    ptr: *const f32,
    n: u32,
    base: u32,
}

/// Calls `f(v)` for `v` from 0 to 7, written out: arrays indexed by `v`
/// (or `4 v + i`) then stay in registers.
#[inline(always)]
fn each_quad(mut f: impl FnMut(usize)) {
    f(0);
    f(1);
    f(2);
    f(3);
    f(4);
    f(5);
    f(6);
    f(7);
}

/// Calls `f(p)` for `p` from 0 to 31, written out (see [`each_quad`]).
#[inline(always)]
fn each_slot(mut f: impl FnMut(usize)) {
    each_quad(|v| {
        f(4 * v);
        f(4 * v + 1);
        f(4 * v + 2);
        f(4 * v + 3);
    });
}

/// Four f32 loaded by one 16-byte load.
#[inline(always)]
unsafe fn load4(p: *const f32) -> [f32; 4] {
    // SAFETY: caller's contract (16-byte aligned, readable).
    let v = unsafe { arch::ld_global_v4_u32(p as *const u32) };
    [
        f32::from_bits(v[0]),
        f32::from_bits(v[1]),
        f32::from_bits(v[2]),
        f32::from_bits(v[3]),
    ]
}

impl Row {
    /// A whole row of `n` elements.
    #[inline(always)]
    fn whole(ptr: *const f32, n: u32) -> Row {
        Row { ptr, n, base: 0 }
    }

    /// Chunk `c` (`c < chunks`) of the row `row` of `TOPK_TOPP_CHUNK`
    /// elements (the last one shorter).
    #[inline(always)]
    fn chunk(row: Row, c: u32) -> Row {
        let base = c * TOPK_TOPP_CHUNK;
        Row {
            // SAFETY: base < row.n, inside the row.
            ptr: unsafe { row.ptr.add(base as usize) },
            n: (row.n - base).min(TOPK_TOPP_CHUNK),
            base,
        }
    }

    /// Whether [`Row::scan`] reads this row by 16-byte loads (a 16-byte
    /// aligned row whose length is a multiple of 4), else one element at a
    /// time.
    #[inline(always)]
    fn vectorized(&self) -> bool {
        (self.ptr as usize).is_multiple_of(16) && self.n.is_multiple_of(4)
    }

    /// The element (offset from `ptr`) of this thread's `p`-th call of `f`
    /// in [`Row::scan`] over a row of at most `32 * ROW_THREADS` elements
    /// (one round of eight 16-byte loads, or 32 rounds of one element).
    #[inline(always)]
    fn scan_slot(&self, p: u32) -> u32 {
        let tid = arch::thread_idx_x();
        if self.vectorized() {
            4 * ((p / 4) * ROW_THREADS + tid) + p % 4
        } else {
            p * ROW_THREADS + tid
        }
    }

    /// Whether this thread's `p`-th slot ([`Row::scan_slot`]) lies inside
    /// the row.
    #[inline(always)]
    fn holds(&self, p: u32) -> bool {
        self.scan_slot(p) < self.n
    }

    /// This thread's 32 slots of a chunk ([`Row::scan_slot`]; -inf past
    /// the row's end), all loads in flight before the first is used, in
    /// registers.
    ///
    /// # Safety
    /// `ptr` holds `n <= TOPK_TOPP_CHUNK` readable f32.
    #[inline(always)]
    unsafe fn load_chunk(&self) -> [f32; 32] {
        let mut x = [f32::NEG_INFINITY; 32];
        // SAFETY: every load is of a slot below n (caller's contract).
        unsafe {
            if self.vectorized() {
                each_quad(|v| {
                    let p = 4 * v as u32;
                    if self.holds(p) {
                        let q = load4(self.ptr.add(self.scan_slot(p) as usize));
                        x[4 * v..4 * v + 4].copy_from_slice(&q);
                    }
                });
            } else {
                each_slot(|p| {
                    if self.holds(p as u32) {
                        x[p] = *self.ptr.add(self.scan_slot(p as u32) as usize);
                    }
                });
            }
        }
        x
    }

    /// Calls `f(valid, key, index, x)` on this thread's slots in rounds that
    /// are uniform over the block (so `f` may use warp votes); `valid` is
    /// false for the slots past the row's end. With a 16-byte aligned row
    /// whose length is a multiple of 4, a thread's slots are 4 consecutive
    /// elements per 16-byte load, eight loads in flight; else one element
    /// per round.
    ///
    /// # Safety
    /// `ptr` holds `n` readable f32; every thread of the block calls it.
    #[inline(always)]
    unsafe fn scan(&self, mut f: impl FnMut(bool, u32, u32, f32)) {
        // SAFETY: forwarded.
        unsafe {
            self.scan4(|ok, width, j, q| {
                f(ok, f32_key(q[0].to_bits()), j, q[0]);
                if width == 4 {
                    f(ok, f32_key(q[1].to_bits()), j + 1, q[1]);
                    f(ok, f32_key(q[2].to_bits()), j + 2, q[2]);
                    f(ok, f32_key(q[3].to_bits()), j + 3, q[3]);
                }
            })
        }
    }

    /// [`Row::scan`] by groups: calls `f(valid, width, index, q)` with the
    /// `width` elements of a group from row index `index` in `q[..width]`:
    /// a 16-byte load (`width` 4) when [`Row::vectorized`], else one
    /// element (`width` 1, `q[1..]` unspecified). The same slots in the same
    /// order as [`Row::scan`].
    ///
    /// # Safety
    /// As [`Row::scan`].
    #[inline(always)]
    unsafe fn scan4(&self, mut f: impl FnMut(bool, u32, u32, [f32; 4])) {
        let tid = arch::thread_idx_x();
        let base0 = self.base;
        // SAFETY: every load is of an index below n (caller's contract).
        unsafe {
            if self.vectorized() {
                let nv = self.n / 4;
                let load = |v: u32| {
                    if v < nv {
                        load4(self.ptr.add(4 * v as usize))
                    } else {
                        [0.0f32; 4]
                    }
                };
                let mut base = 0u32;
                while base < nv {
                    // Eight loads in flight before the first is used: one
                    // block per SM streams only as fast as its bytes in
                    // flight allow (two loads gave about 1 TB/s GPU-wide).
                    let v = [
                        base + tid,
                        base + ROW_THREADS + tid,
                        base + 2 * ROW_THREADS + tid,
                        base + 3 * ROW_THREADS + tid,
                        base + 4 * ROW_THREADS + tid,
                        base + 5 * ROW_THREADS + tid,
                        base + 6 * ROW_THREADS + tid,
                        base + 7 * ROW_THREADS + tid,
                    ];
                    let q = [
                        load(v[0]),
                        load(v[1]),
                        load(v[2]),
                        load(v[3]),
                        load(v[4]),
                        load(v[5]),
                        load(v[6]),
                        load(v[7]),
                    ];
                    f(v[0] < nv, 4, base0 + 4 * v[0], q[0]);
                    f(v[1] < nv, 4, base0 + 4 * v[1], q[1]);
                    f(v[2] < nv, 4, base0 + 4 * v[2], q[2]);
                    f(v[3] < nv, 4, base0 + 4 * v[3], q[3]);
                    f(v[4] < nv, 4, base0 + 4 * v[4], q[4]);
                    f(v[5] < nv, 4, base0 + 4 * v[5], q[5]);
                    f(v[6] < nv, 4, base0 + 4 * v[6], q[6]);
                    f(v[7] < nv, 4, base0 + 4 * v[7], q[7]);
                    base = match base.checked_add(8 * ROW_THREADS) {
                        Some(b) => b,
                        None => break,
                    };
                }
            } else {
                let mut base = 0u32;
                while base < self.n {
                    let j = base + tid;
                    let ok = j < self.n;
                    let x = if ok { *self.ptr.add(j as usize) } else { 0.0 };
                    f(ok, 1, base0 + j, [x; 4]);
                    base = match base.checked_add(ROW_THREADS) {
                        Some(b) => b,
                        None => break,
                    };
                }
            }
        }
    }
}

/// The pre-filter's candidates of a row in shared memory: `total` entries
/// (key in the low half, index in the high half), chunk after chunk, each
/// chunk's in its block's scan order; the elements with `key >= floor` of
/// them are the candidates.
#[derive(Clone, Copy)]
struct List {
    entries: *const u64,
    total: u32,
    floor: u32,
}

/// Where the passes after the pre-filter read a row's elements: the
/// compacted list when every candidate fits, else the row itself.
#[derive(Clone, Copy)]
struct Source {
    row: Row,
    list: Option<List>,
}

impl Source {
    /// Calls `f(key, index, x)` on this thread's share of the elements: of
    /// the list, those with `key >= floor` (`x` rebuilt from its key, which
    /// is exact for every non-NaN value, and NaN never reaches the list);
    /// else of the row.
    ///
    /// # Safety
    /// As [`Row::scan`]; with a list, the list is loaded and visible to the
    /// block (a barrier since).
    #[inline(always)]
    unsafe fn for_each(&self, mut f: impl FnMut(u32, u32, f32)) {
        // SAFETY: forwarded; list reads stay below each segment's count.
        unsafe {
            match self.list {
                Some(l) => {
                    let mut p = arch::thread_idx_x();
                    while p < l.total {
                        let e = *l.entries.add(p as usize);
                        let key = e as u32;
                        if key >= l.floor {
                            f(key, (e >> 32) as u32, f32::from_bits(f32_from_key(key)));
                        }
                        p += ROW_THREADS;
                    }
                }
                None => self.row.scan(|ok, key, i, x| {
                    if ok {
                        f(key, i, x)
                    }
                }),
            }
        }
    }
}

/// A pivot search run to its end over the elements `keep` accepts, one
/// pass of the block over the row per round; the key of an element is
/// `key_of(key, index)`, its measure `measure(x)`.
///
/// # Safety
/// As [`block_reduce`] and [`Row::for_each`].
#[inline(always)]
unsafe fn run_search<M: ShflMeasure>(
    src: Source,
    mut search: QuadSearch<M>,
    key_of: impl Fn(u32, u32) -> u32,
    measure: impl Fn(f32) -> M,
    keep: impl Fn(u32, u32, f32) -> bool,
    smem: *mut u8,
) -> Found<M> {
    // Every thread holds the same search (same merged accumulators), so the
    // loop and its barriers are uniform.
    while let Some(p) = search.pivots() {
        let mut acc = QuadAcc::<M>::new();
        let pv: Pivots = p;
        // SAFETY: forwarded.
        unsafe {
            src.for_each(|key, i, x| {
                if keep(key, i, x) {
                    acc.add(&pv, key_of(key, i), measure(x));
                }
            });
            let merged = block_reduce(acc, smem as *mut QuadAcc<M>);
            search.advance(&merged);
        }
    }
    search.found().unwrap_or(Found::AtLeast(u32::MAX))
}

/// The index key of the `take`-th lowest index (`1 <= take < count`) among
/// the `count` elements `keep` accepts with key `key`: an index search, as
/// the CPU driver's tie resolution.
///
/// # Safety
/// As [`run_search`].
#[inline(always)]
unsafe fn tie_index(
    src: Source,
    key: u32,
    take: u32,
    count: u32,
    keep: impl Fn(u32, u32, f32) -> bool,
    smem: *mut u8,
) -> u32 {
    let lo = index_key(src.row.n.saturating_sub(1));
    let search = QuadSearch::<u32>::new(take, lo, u32::MAX, count, count, false);
    // SAFETY: forwarded.
    let found = unsafe {
        run_search(
            src,
            search,
            |_, i| index_key(i),
            |_| 1u32,
            |k, i, x| k == key && keep(k, i, x),
            smem,
        )
    };
    match found {
        Found::Boundary { key, .. } | Found::AtLeast(key) => key,
    }
}

/// The cut keeping the first `take` (by index) of the `count` elements
/// `keep` accepts with key `key` (the CPU driver's `tie_cut`).
///
/// # Safety
/// As [`run_search`].
#[inline(always)]
unsafe fn tie_cut(
    src: Source,
    key: u32,
    take: u32,
    count: u32,
    keep: impl Fn(u32, u32, f32) -> bool,
    smem: *mut u8,
) -> Cut {
    if take >= count {
        return Cut::at_least(key);
    }
    if take == 0 {
        return Cut { key, index_end: 0 };
    }
    // SAFETY: forwarded.
    let ik = unsafe { tie_index(src, key, take, count, keep, smem) };
    Cut {
        key,
        index_end: (!ik).saturating_add(1),
    }
}

/// A row's truncation parameters as the kernel reads them.
#[derive(Clone, Copy)]
pub(crate) struct Params {
    top_k: u32,
    top_p: f32,
    min_p: f32,
    temperature: f32,
}

/// A row's [`Plan`] and what the pre-filter pass derives from it, written
/// once per row by [`topk_topp_plan_f32`] (the plan's arithmetic would
/// otherwise set the register count of the streaming pass and cost every
/// selection block a few microseconds).
#[derive(Clone, Copy)]
#[repr(C)]
struct RowPlan {
    plan: Plan,
    /// Least keys of the nested sets: the list (t1), the second tier (t2),
    /// all of min-p's survivors; each at least min-p's key.
    keys: [u32; 3],
    /// [`VALID`], [`MASS_NEEDED`], [`COVERED`].
    flags: u32,
    /// A covered row's candidate floor when the first tier's does not
    /// serve ([`cover::tight_floor_serves`]), and always for a row listed
    /// by shares: the highest chunk floor, at least min-p's key.
    wide: u32,
}

/// [`RowPlan::flags`]: the row has a finite or +inf entry.
const VALID: u32 = 1;
/// [`RowPlan::flags`]: the pre-filter needs the masses (top-p without
/// top-k).
const MASS_NEEDED: u32 = 2;
/// [`RowPlan::flags`]: the statistics pass's chunk lists cover the row
/// ([`cover::row_covered`]): the pre-filter pass skips it and the
/// selection takes its candidates from those lists ([`covered_view`]).
const COVERED: u32 = 4;

/// The result of [`select`].
#[derive(Clone, Copy)]
pub(crate) struct Selected {
    cut: Cut,
    weights: Weights,
    pub(crate) valid: bool,
    /// Kept ranks when [`ranked_cut`] made the cut (its sorted order and
    /// masses are in shared memory, a list's entries gone), else 0.
    pub(crate) ranked: u32,
}

/// Row `r`'s slots in the workspace (see [`TopkToppLayout`]).
#[derive(Clone, Copy)]
struct Slots {
    lay: TopkToppLayout,
    ws: *mut u64,
    r: usize,
}

impl Slots {
    #[inline(always)]
    fn new(ws: *mut u64, batch: u32, vocab: u32, r: u32) -> Slots {
        Slots {
            lay: TopkToppLayout::new(batch, vocab),
            ws,
            r: r as usize,
        }
    }

    /// Index of chunk `c`'s slot among all (row, chunk) slots.
    #[inline(always)]
    fn slot(&self, c: u32) -> usize {
        self.r * self.lay.chunks as usize + c as usize
    }

    /// Chunk `c`'s statistics partial.
    #[inline(always)]
    fn stats(&self, c: u32) -> *mut RowStats {
        // SAFETY: inside the layout's words (caller's contract on `ws`).
        unsafe {
            (self.ws.add(self.lay.stats) as *mut u8).add(self.slot(c) * TOPK_TOPP_STATS_SLOT_BYTES)
                as *mut RowStats
        }
    }

    /// Chunk `c`'s tiers partial.
    #[inline(always)]
    fn tiers(&self, c: u32) -> *mut Tiers {
        // SAFETY: as `stats`; slots are multiples of 8 bytes.
        unsafe {
            (self.ws.add(self.lay.tiers) as *mut u8).add(self.slot(c) * TOPK_TOPP_TIERS_SLOT_BYTES)
                as *mut Tiers
        }
    }

    /// Chunk `c`'s candidate count (all of them, listed or not).
    #[inline(always)]
    fn count(&self, c: u32) -> *mut u32 {
        // SAFETY: as `stats`.
        unsafe { (self.ws.add(self.lay.counts) as *mut u32).add(self.slot(c)) }
    }

    /// Chunk `c`'s kept count (the kept-set passes).
    #[inline(always)]
    fn kept_count(&self, c: u32) -> *mut u32 {
        // SAFETY: as `stats`.
        unsafe { (self.ws.add(self.lay.kept_counts) as *mut u32).add(self.slot(c)) }
    }

    /// Chunk `c`'s list floor from the statistics pass ([`cover`]).
    #[inline(always)]
    fn floor(&self, c: u32) -> *mut u32 {
        // SAFETY: as `stats`.
        unsafe { (self.ws.add(self.lay.floors) as *mut u32).add(self.slot(c)) }
    }

    /// Chunk `c`'s candidate list (`cap` entries).
    #[inline(always)]
    fn list(&self, c: u32) -> *mut u64 {
        // SAFETY: as `stats`.
        unsafe {
            self.ws
                .add(self.lay.lists + self.slot(c) * self.lay.cap as usize)
        }
    }

    /// The row's plan, as the pre-filter pass reads it.
    #[inline(always)]
    fn plan(&self) -> *mut RowPlan {
        // SAFETY: as `stats`; slots are multiples of 8 bytes.
        unsafe {
            (self.ws.add(self.lay.plans) as *mut u8).add(self.r * TOPK_TOPP_PLAN_SLOT_BYTES)
                as *mut RowPlan
        }
    }

    /// The row's cut: `[key, index_end, mode, 0]`.
    #[inline(always)]
    fn cut(&self) -> *mut u32 {
        // SAFETY: as `stats`.
        unsafe { (self.ws.add(self.lay.cuts) as *mut u32).add(4 * self.r) }
    }
}

/// The row's statistics: its chunks' partials, merged in a fixed order
/// (the same in every block that asks).
///
/// # Safety
/// As [`block_reduce`]; the statistics pass has completed.
#[inline(always)]
unsafe fn merged_stats(slots: Slots, smem: *mut u8) -> RowStats {
    // SAFETY: caller's contract.
    unsafe {
        block_reduce(
            merge_chunks(slots, RowStats::EMPTY, |c| *slots.stats(c)),
            smem as *mut RowStats,
        )
    }
}

/// This thread's share of a per-chunk partial: chunks `t`, `t + 256`, ...
/// merged in this order into `empty`.
#[inline(always)]
fn merge_chunks<T: Reduce>(slots: Slots, empty: T, part: impl Fn(u32) -> T) -> T {
    let mut v = empty;
    let mut c = arch::thread_idx_x();
    while c < slots.lay.chunks {
        v.merge_with(&part(c));
        c += ROW_THREADS;
    }
    v
}

/// The row's parameters as [`Plan::new`] and [`Truncation::new`] take
/// them, the pre-filter on.
#[inline(always)]
fn row_params(params: Params) -> RowParams {
    RowParams {
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
        temperature: params.temperature,
        prefilter: true,
    }
}

/// The list's room in the selection kernels' dynamic shared memory
/// `smem`: [`TOPK_TOPP_LIST_CAP`] list entries after the reduction slots
/// and a word per thread (the offsets of [`load_list`] and
/// [`covered_view`], the count of [`gather_kept`]).
///
/// # Safety
/// `smem` is the selection kernels' dynamic shared memory.
#[inline(always)]
unsafe fn list_room(smem: *mut u8) -> *mut u64 {
    // SAFETY: inside TOPK_TOPP_SMEM_BYTES (const assert; caller's contract).
    unsafe { smem.add(REDUCE_BYTES + ROW_THREADS as usize * 4) as *mut u64 }
}

/// Loads the row's candidate lists into shared memory, chunk after chunk:
/// thread `t` offers chunk `t`'s exclusive prefix `off` of the counts (each
/// at most `cap`); `total` (at most `TOPK_TOPP_LIST_CAP`) is their sum.
///
/// # Safety
/// As [`block_reduce`]; the filter pass has completed; `smem` is the
/// selection kernels' dynamic shared memory.
#[inline(always)]
unsafe fn load_list(slots: Slots, off: u32, total: u32, floor: u32, smem: *mut u8) -> List {
    let tid = arch::thread_idx_x();
    let chunks = slots.lay.chunks;
    // SAFETY: offsets inside TOPK_TOPP_SMEM_BYTES (const asserts); entry q
    // of the row lies in the chunk whose offsets bracket it, below its
    // count.
    unsafe {
        let offsets = smem.add(REDUCE_BYTES) as *mut u32;
        let entries = list_room(smem);
        if tid < chunks {
            *offsets.add(tid as usize) = off;
        }
        arch::bar_sync();
        let mut q = tid;
        while q < total {
            // The last chunk whose offset is at most q (binary search; the
            // offsets ascend, empty chunks repeat them).
            let (mut lo, mut hi) = (0u32, chunks);
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if *offsets.add(mid as usize) <= q {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let j = q - *offsets.add(lo as usize);
            *entries.add(q as usize) = *slots.list(lo).add(j as usize);
            q += ROW_THREADS;
        }
        arch::bar_sync();
        List {
            entries,
            total,
            floor,
        }
    }
}

/// The row's list counts: this thread's chunk's offset among the listed
/// candidates (0 past the chunks), their total, and whether every chunk
/// listed all it found and they fit in shared memory.
#[derive(Clone, Copy)]
struct ListCounts {
    off: u32,
    total: u32,
    fit: bool,
}

/// The row's [`ListCounts`], to every thread.
///
/// # Safety
/// As [`block_reduce`]; the filter pass has completed.
#[inline(always)]
unsafe fn list_counts(slots: Slots, smem: *mut u8) -> ListCounts {
    let chunks = slots.lay.chunks;
    let listable = chunks <= TOPK_TOPP_MAX_LISTED_CHUNKS;
    let tid = arch::thread_idx_x();
    // SAFETY: caller's contract; chunk `tid` is a slot of the row.
    unsafe {
        let count = if listable && tid < chunks {
            *slots.count(tid)
        } else {
            0
        };
        let most = block::block_max_u64(u64::from(count), smem as *mut u64);
        let (off, total) = block_exclusive_scan(count, smem as *mut u32);
        ListCounts {
            off,
            total,
            fit: listable && most <= u64::from(slots.lay.cap) && total <= TOPK_TOPP_LIST_CAP,
        }
    }
}

/// What the selection reads of the pre-filter pass first (uniform over
/// the block): the floor and group of [`Plan::candidates`] from the row's tiers
/// merged over its chunks, the mass of all of min-p's survivors (when the
/// pass summed it), and the row's list counts.
#[derive(Clone, Copy)]
struct RowView {
    floor: u32,
    cand: Group,
    total_mass: f64,
    counts: ListCounts,
    /// A covered row's candidates, already in shared memory when they fit
    /// ([`covered_view`]); `None` otherwise.
    loaded: Option<List>,
}

/// The row's [`RowView`] under its plan (meaningless for a row without a
/// finite or +inf entry, whose pre-filter pass wrote nothing).
///
/// # Safety
/// As [`block_reduce`]; the filter pass has completed.
#[inline(always)]
unsafe fn row_view(slots: Slots, smem: *mut u8) -> RowView {
    // SAFETY: caller's contract.
    unsafe {
        let mine = merge_chunks(slots, Tiers::EMPTY, |c| *slots.tiers(c));
        let tiers = block_reduce(mine, smem as *mut Tiers);
        // The plan read after the reduction: fewer registers held across it.
        let rp = *slots.plan();
        let (floor, cand) = tiers.candidates(&rp);
        RowView {
            floor,
            cand,
            total_mass: tiers.all.mass,
            counts: list_counts(slots, smem),
            loaded: None,
        }
    }
}

/// A thread's run `[q0, q1)` of the union of a row's chunk lists (chunk
/// `c` from `offsets[c]` on, in shared memory), starting in chunk `c0`.
#[derive(Clone, Copy)]
struct UnionRun {
    offsets: *const u32,
    chunks: u32,
    c0: u32,
    q0: u32,
    q1: u32,
}

impl UnionRun {
    /// Calls `f(entry)` on the run's list entries in order.
    ///
    /// # Safety
    /// The offsets are those of the row's lists in `slots`, visible to the
    /// thread; `c0` holds `q0`.
    #[inline(always)]
    unsafe fn walk(&self, slots: Slots, mut f: impl FnMut(u64)) {
        let (mut c, mut q) = (self.c0, self.q0);
        // SAFETY: entry q - offsets[c] lies below chunk c's count.
        unsafe {
            while q < self.q1 {
                while c + 1 < self.chunks && *self.offsets.add(c as usize + 1) <= q {
                    c += 1;
                }
                f(*slots
                    .list(c)
                    .add((q - *self.offsets.add(c as usize)) as usize));
                q += 1;
            }
        }
    }
}

/// The [`RowView`] of a row the statistics pass's chunk lists cover
/// ([`COVERED`]), its candidates loaded into shared memory as
/// [`load_list`] lays them out: the listed elements at or above the first
/// tier's key (`rp.keys[0]`) when [`cover::tight_floor_serves`], else (and
/// always for a row listed by shares, [`cover::is_shared`]) at or above
/// `rp.wide`, chunk after chunk, each chunk's in its list's order
/// (so on a row where no chunk floor lies above the first tier's key, the
/// very candidates and order of the pre-filter pass). Each thread walks a
/// run of the lists' union twice: to count (one block scan, which also
/// merges the candidates' key range) and to store.
///
/// # Safety
/// As [`block_reduce`]; the plan kernel has completed (the pre-filter pass
/// skips the row); `smem` is the selection kernels' dynamic shared memory.
#[inline(always)]
unsafe fn covered_view(rp: &RowPlan, slots: Slots, smem: *mut u8) -> RowView {
    let tid = arch::thread_idx_x();
    let chunks = slots.lay.chunks;
    // SAFETY: a covered row has at most TOPK_TOPP_MAX_LISTED_CHUNKS
    // (= ROW_THREADS) chunks, each listing at most `cap` (the statistics
    // pass); the offsets and the candidates inside TOPK_TOPP_SMEM_BYTES
    // (const asserts), as in `load_list`; barriers between the offsets'
    // and the candidates' writes and their reads.
    unsafe {
        let offsets = smem.add(REDUCE_BYTES) as *mut u32;
        let entries = list_room(smem);
        let count = if tid < chunks { *slots.count(tid) } else { 0 };
        let (off, total) = block_exclusive_scan(count, smem as *mut u32);
        if tid < chunks {
            *offsets.add(tid as usize) = off;
        }
        arch::bar_sync();
        // This thread's run [q0, q1) of the union, from chunk `c0` on.
        let per = total.div_ceil(ROW_THREADS);
        let q0 = (tid * per).min(total);
        let q1 = (q0 + per).min(total);
        let (mut lo, mut hi) = (0u32, chunks);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if *offsets.add(mid as usize) <= q0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let run = UnionRun {
            offsets,
            chunks,
            c0: lo,
            q0,
            q1,
        };
        let run_group = |floor: u32| {
            let mut g = Group::EMPTY;
            run.walk(slots, |e| {
                let key = e as u32;
                if key >= floor {
                    g.add(key, 0.0);
                }
            });
            g
        };
        let k = rp.plan.k;
        let (tight, min_key) = (rp.keys[0], rp.keys[2]);
        // Shares of k: the elements at or above the highest chunk floor hold
        // the row's top k (the plan's test), about 1.2 k of them on
        // Gaussian rows against the first tier's 2.3 k at k = 1000.
        let shared = cover::is_shared(k);
        let mut floor = if shared { rp.wide } else { tight };
        let g = run_group(floor);
        let (mut at, mut cand) = block_scan_reduce(g.n, g, smem);
        if !shared && !cover::tight_floor_serves(tight, min_key, cand.n, k) {
            floor = rp.wide;
            let g = run_group(floor);
            (at, cand) = block_scan_reduce(g.n, g, smem);
        }
        let fit = cand.n <= TOPK_TOPP_LIST_CAP;
        if fit {
            run.walk(slots, |e| {
                if e as u32 >= floor {
                    *entries.add(at as usize) = e;
                    at += 1;
                }
            });
        }
        arch::bar_sync();
        RowView {
            floor,
            cand,
            total_mass: 0.0,
            counts: ListCounts {
                off: 0,
                total: cand.n,
                fit,
            },
            loaded: fit.then_some(List {
                entries,
                total: cand.n,
                floor,
            }),
        }
    }
}

/// Bins of [`refine`]'s histogram: eight a thread.
const REFINE_BINS: u32 = 8 * ROW_THREADS;
/// Where the histogram lies in the selection kernels' shared memory (after
/// the reduction slots), followed by two words: the chosen bin and the
/// candidates from it up.
const REFINE_HIST: usize = REDUCE_BYTES;

const _: () =
    assert!(REFINE_HIST + (REFINE_BINS as usize + 2) * 4 <= TOPK_TOPP_SMEM_BYTES as usize);

/// A barrier over the `size` blocks that share a row: the cluster's when
/// there are several, else the block's.
#[inline(always)]
fn row_sync(size: u32) {
    if size > 1 {
        row_cluster_sync();
    } else {
        arch::bar_sync();
    }
}

/// Bins `8 g .. 8 g + 8` of the histograms at shared address `base` (the
/// block's own at `hist`), summed over the `size` blocks of the row's
/// cluster in rank order.
///
/// # Safety
/// The histograms are complete and visible (a [`row_sync`] since), and
/// every block of the cluster is running.
#[inline(always)]
unsafe fn row_bins(hist: *const u32, base: u32, g: u32, size: u32) -> [u32; 8] {
    let mut h = [0u32; 8];
    #[cfg(target_feature = "sm_90")]
    if size > 1 {
        for q in 0..size {
            let a = arch::mapa_shared_cluster(base + 32 * g, q);
            // SAFETY: caller's contract; 32-byte aligned bins of block q.
            let (lo, hi) = unsafe {
                (
                    arch::ld_shared_cluster_v4_u32(a),
                    arch::ld_shared_cluster_v4_u32(a + 16),
                )
            };
            for j in 0..4 {
                h[j] += lo[j];
                h[4 + j] += hi[j];
            }
        }
        return h;
    }
    let _ = (base, size);
    for (j, b) in h.iter_mut().enumerate() {
        // SAFETY: caller's contract; bin 8 g + j < REFINE_BINS.
        *b = unsafe { *hist.add(8 * g as usize + j) };
    }
    h
}

/// Makes a top-k row whose candidates would not come from the lists (the
/// pre-filter's tiers missed: too few above the first threshold, or too
/// many listed) list them after all: one pass counts the candidates in a
/// histogram of [`REFINE_BINS`] equal key ranges over their keys, the
/// highest bin at which at least k are counted from the top becomes the
/// first tier's threshold, and the pre-filter pass runs again with it
/// (new tiers, counts and lists; the plan slot rewritten). One pass and a
/// pre-filter instead of pivot rounds that each read the row. Keys are
/// monotone in the value's bits, so the bins are about a fifth of an
/// octave wide wherever the values lie. Nothing changes when the lists
/// already serve the selection, the row has no top-k, or the new lists
/// would not fit.
///
/// `LISTED`: the call's statistics pass listed chunks, so a [`COVERED`]
/// row's view comes from those lists ([`covered_view`]); the kernels of
/// the other routes compile without that code.
///
/// Called by every block of the row (`rank` of `size`: its cluster, or one
/// block reading every chunk); the counts are integers, so the threshold
/// and the lists are the same whatever the blocks, and the cluster route
/// keeps the chunked route's results bit for bit.
///
/// # Safety
/// As [`block_reduce`] and [`Row::scan`]; the filter pass has completed
/// and is visible to every block of the row; `smem` is the selection
/// kernels' dynamic shared memory.
#[inline(always)]
unsafe fn refine<const LISTED: bool>(
    row: Row,
    slots: Slots,
    rank: u32,
    size: u32,
    smem: *mut u8,
) -> RowView {
    let tid = arch::thread_idx_x();
    // SAFETY: the caller's contract covers every access; control flow
    // depends only on the row's plan and block-reduced (or row-merged)
    // values, the same in every block of the row.
    unsafe {
        let rp = *slots.plan();
        if LISTED && rp.flags & COVERED != 0 {
            return covered_view(&rp, slots, smem);
        }
        let plan = rp.plan;
        let view = row_view(slots, smem);
        if rp.flags & VALID == 0 || !plan.topk || plan.k > TOPK_TOPP_LIST_CAP {
            return view;
        }
        let (floor, cand) = (view.floor, view.cand);
        let chunks = slots.lay.chunks;
        if (floor >= plan.t1 && view.counts.fit)
            || chunks > TOPK_TOPP_MAX_LISTED_CHUNKS
            || cand.n == 0
        {
            return view;
        }

        // The histogram of the candidates' keys (every key >= lo is one).
        let (lo, hi) = (cand.min, cand.max);
        let width = u64::from(hi - lo) + 1;
        let bins = u64::from(REFINE_BINS);
        let hist = smem.add(REFINE_HIST) as *mut u32;
        let base = arch::smem_addr(hist);
        let mut j = tid;
        while j < REFINE_BINS + 2 {
            *hist.add(j as usize) = 0;
            j += ROW_THREADS;
        }
        arch::bar_sync();
        let lane = tid % 32;
        let mut c = rank;
        while c < chunks {
            Row::chunk(row, c).scan(|ok, key, _, _| {
                let bin = if ok && key >= lo {
                    (u64::from(key - lo) * bins / width) as u32
                } else {
                    u32::MAX
                };
                // A warp whose elements share a bin (a row of equal values)
                // adds once.
                let first = arch::shfl_idx_u32(bin, 0);
                if arch::ballot(bin == first) == u32::MAX {
                    if lane == 0 && first != u32::MAX {
                        arch::red_shared_add_u32(base + 4 * first, 32);
                    }
                } else if bin != u32::MAX {
                    arch::red_shared_add_u32(base + 4 * bin, 1);
                }
            });
            c += size;
        }
        row_sync(size);

        // Thread t holds bins 8 g .. 8 g + 8 with g = 255 - t, so the
        // exclusive scan in thread order counts the candidates above them.
        let g = ROW_THREADS - 1 - tid;
        let h = row_bins(hist, base, g, size);
        let sum: u32 = h.iter().sum();
        let (above, total) = block_exclusive_scan(sum, smem as *mut u32);
        let chosen = hist.add(REFINE_BINS as usize);
        if above < plan.k && above + sum >= plan.k {
            // Unrolled without an exit, so that `h` stays in registers.
            let (mut run, mut at, mut from) = (above, 0, 0);
            for j in (0..8).rev() {
                let before = run;
                run += h[j];
                if before < plan.k && run >= plan.k {
                    (at, from) = (8 * g + j as u32, run);
                }
            }
            *chosen = at;
            *chosen.add(1) = from;
        }
        arch::bar_sync();
        // Fewer than k candidates in all: every one of them.
        let (bin, listed) = if total < plan.k {
            (0, total)
        } else {
            (*chosen, *chosen.add(1))
        };
        if listed <= TOPK_TOPP_LIST_CAP {
            // The least key of bin `bin`: ceil(bin * width / bins) above lo.
            let t1 = lo + (u64::from(bin) * width).div_ceil(bins) as u32;
            let mut next = rp;
            next.plan.t1 = t1;
            next.plan.t2 = plan.t2.min(t1);
            let min_key = rp.keys[2];
            next.keys = [t1.max(min_key), next.plan.t2.max(min_key), min_key];
            if rank == 0 && tid == 0 {
                let slot = slots.plan();
                (*slot).plan.t1 = next.plan.t1;
                (*slot).plan.t2 = next.plan.t2;
                (*slot).keys = next.keys;
            }
            let mut c = rank;
            while c < chunks {
                filter_chunk(row, c, next, slots, smem);
                c += size;
            }
            // Every block has read the others' histograms, and the new
            // plan and lists are visible to the row's selection.
            row_sync(size);
            return row_view(slots, smem);
        }
        // Every block has read the others' histograms.
        row_sync(size);
        view
    }
}

/// The kept prefix of row `row` ([`crate::pivot::select_row`] with the
/// pre-filter on) from the partials of the statistics and filter passes:
/// the pivot rounds over the candidate list when every candidate is
/// listed, else over the row; a list of at most [`SORT_MAX`] candidates is
/// sorted instead, and so are the top-k survivors of a row whose top-k
/// keeps at most [`RANKED_MAX_K`] ([`gather_kept`]): its top-p cut is then
/// [`sort_cut`]'s, in rank order, as on the slab kernels.
///
/// # Safety
/// As [`run_search`]; both chunked passes of this call have completed.
#[inline(always)]
unsafe fn select(row: Row, slots: Slots, view: RowView, smem: *mut u8) -> (Selected, Source) {
    // SAFETY: the caller's contract covers every access; all control flow
    // below depends only on the row's plan and block-reduced values, so it
    // is uniform.
    unsafe {
        let row_plan = *slots.plan();
        let none = Selected {
            cut: Cut::NONE,
            weights: Weights::new(f32::NEG_INFINITY, 1.0, 0.0),
            valid: false,
            ranked: 0,
        };
        if row_plan.flags & VALID == 0 {
            return (none, Source { row, list: None });
        }
        let plan = row_plan.plan;
        let Plan {
            k,
            topk,
            top_p,
            topp,
            weights: w,
            t1,
            ..
        } = plan;

        let RowView {
            floor,
            cand,
            total_mass,
            counts,
            ..
        } = view;
        let min_key = row_plan.keys[2];
        let is_cand = move |key: u32, _: f32| key >= floor && key >= min_key;
        // The lists hold every candidate when the floor is the first
        // tier's threshold and no chunk listed fewer than it found (a
        // second-tier or fallback floor reads the row).
        let list = if view.loaded.is_some() {
            view.loaded
        } else if floor >= t1 && counts.fit {
            Some(load_list(slots, counts.off, counts.total, floor, smem))
        } else {
            None
        };
        let src = Source { row, list };

        // The cut in rank order ([`sort_cut`]) over `ranked` candidates in
        // the list's room: a list of at most SORT_MAX, every candidate of
        // it, no pivot rounds; else, for a top-k of at most RANKED_MAX_K,
        // the top-k survivors, gathered after the top-k search, so that a
        // row's cut is one rule whichever its source (and the slab
        // kernels'). 0: the pivot search's top-p below.
        let mut cut = Cut::at_least(cand.min);
        let ranked = match list {
            Some(l) if (1..=SORT_MAX).contains(&l.total) => l.total,
            _ => {
                // Top-k.
                if topk && cand.n > k {
                    let search =
                        QuadSearch::<u32>::new(k, cand.min, cand.max, cand.n, cand.n, true);
                    let found = run_search(
                        src,
                        search,
                        |key, _| key,
                        |_| 1u32,
                        |key, _, x| is_cand(key, x),
                        smem,
                    );
                    cut = match found {
                        Found::AtLeast(key) => Cut::at_least(key),
                        Found::Boundary { key, above, count } => tie_cut(
                            src,
                            key,
                            k.saturating_sub(above),
                            count,
                            |key, _, x| is_cand(key, x),
                            smem,
                        ),
                    };
                }
                if topk && k <= RANKED_MAX_K {
                    let kcut = cut;
                    gather_kept(src, |key, i, x| is_cand(key, x) && kcut.keeps(key, i), smem)
                } else {
                    0
                }
            }
        };
        if ranked > 0 {
            let (cut, ranked) = sort_cut(
                ranked,
                topk.then_some(k),
                topp.then_some(top_p),
                w,
                total_mass,
                smem,
            );
            return (
                Selected {
                    cut,
                    weights: w,
                    valid: true,
                    ranked,
                },
                src,
            );
        }

        // Top-p on the survivors of min-p and top-k.
        if topp {
            let kcut = cut;
            let in_k = move |key: u32, i: u32, x: f32| is_cand(key, x) && kcut.keeps(key, i);
            let (count, mass) = if topk {
                let mut g = Group::EMPTY;
                src.for_each(|key, i, x| {
                    if in_k(key, i, x) {
                        g.add(key, f64::from(w.weight(x)));
                    }
                });
                let g = block_reduce(g, smem as *mut Group);
                (g.n, g.mass)
            } else {
                (cand.n, cand.mass)
            };
            let target = f64::from(top_p) * if topk { mass } else { total_mass };
            let search = QuadSearch::<f64>::new(target, kcut.key, cand.max, count, mass, true);
            let found = run_search(
                src,
                search,
                |key, _| key,
                |x| f64::from(w.weight(x)),
                in_k,
                smem,
            );
            let pcut = match found {
                Found::AtLeast(key) => Cut::at_least(key),
                Found::Boundary { key, above, count } => {
                    let wk = w.weight(f32::from_bits(f32_from_key(key)));
                    let take = top_p_ties(above, wk, target, count);
                    tie_cut(src, key, take, count, in_k, smem)
                }
            };
            cut = pcut.tighter(kcut);
        }
        (
            Selected {
                cut,
                weights: w,
                valid: true,
                ranked: 0,
            },
            src,
        )
    }
}

/// Longest candidate list [`sort_cut`] sorts: its order words in the
/// first half of the list's room, their masses in the second. The sampler
/// sorts lists up to it: its draw is one scan over the sorted ranks instead
/// of a second pivot search.
const SORT_MAX: u32 = TOPK_TOPP_LIST_CAP / 2;
const _: () = assert!(SORT_MAX <= 16 * ROW_THREADS);

/// Largest top-k whose cut is always taken in rank order ([`ranked_cut`]
/// over the top-k survivors): on every route of the selection kernels
/// ([`select`] gathers the survivors when it did not sort the whole list)
/// and on the slab kernels, whose slab holds at most this many, so that a
/// row's result is the same whichever route computed it.
pub const RANKED_MAX_K: u32 = 1024;
const _: () = assert!(RANKED_MAX_K == crate::radix_select::SLAB);
const _: () = assert!(RANKED_MAX_K <= SORT_MAX);

/// The position of a list entry (key in the low half, index in the high
/// half) in the total order as one number: larger first (key descending,
/// then index ascending). Never 0 (the index's complement is not).
#[inline(always)]
fn order_of(entry: u64) -> u64 {
    (entry << 32) | u64::from(!((entry >> 32) as u32))
}

/// This thread's run of ranks when `n` ranks are spread over the block:
/// `(first, count)`, thread `t` the `ceil(n / ROW_THREADS)` ranks from
/// `t` times that (some past `n`; all of them for a thread from
/// [`ROW_THREADS`] on, see [`cut_lane`]).
#[inline(always)]
fn my_ranks(n: u32) -> (u32, u32) {
    let per = n.div_ceil(ROW_THREADS);
    (arch::thread_idx_x() * per, per)
}

/// This thread's first position in the ranked cut's loops strided by
/// [`ROW_THREADS`]: its index, or past every count for a thread from
/// [`ROW_THREADS`] on. A block larger than [`ROW_THREADS`] (the radix
/// cluster kernel's, [`slab_cut`]) so runs the cut on its first
/// [`ROW_THREADS`] threads, the others only at the barriers and in the
/// scans with nothing to add: the sums are the selection kernels' bit for
/// bit.
#[inline(always)]
fn cut_lane() -> u32 {
    let tid = arch::thread_idx_x();
    if tid < ROW_THREADS { tid } else { u32::MAX }
}

/// The sum, in rank order, of the masses of this thread's run of ranks
/// ([`my_ranks`]) below `end`.
///
/// # Safety
/// `mass` holds the ranks below `end`.
#[inline(always)]
unsafe fn run_mass(mass: *const f64, (r0, per): (u32, u32), end: u32) -> f64 {
    let mut sum = 0.0f64;
    let mut j = 0;
    while j < per {
        if r0 + j < end {
            // SAFETY: below end (caller's contract).
            sum += unsafe { *mass.add((r0 + j) as usize) };
        }
        j += 1;
    }
    sum
}

/// Gathers the elements of `src` that `keep` accepts into the list's room
/// as list entries (key in the low half, index in the high half, as
/// [`load_list`] lays them out) and returns their count, to every thread:
/// a loaded list (which the room holds) compacted in place, in its order,
/// [`ROW_THREADS`] entries a round; the row's elements appended in any
/// order (for [`sort_cut`], which sorts them; a shared atomic counts them
/// in the offsets' first word). `keep` accepts at most [`RANKED_MAX_K`]
/// elements: the count is cut to it, and the row's elements past it are
/// not stored. Ends with a block barrier.
///
/// # Safety
/// As [`run_search`]; `smem` is the selection kernels' dynamic shared
/// memory, no thread still reading the room (without a list: nor the
/// offsets) since the last block barrier.
#[inline(always)]
unsafe fn gather_kept(src: Source, keep: impl Fn(u32, u32, f32) -> bool, smem: *mut u8) -> u32 {
    let tid = arch::thread_idx_x();
    // SAFETY: the room's entries below the list's total (at most
    // TOPK_TOPP_LIST_CAP) or below RANKED_MAX_K, and the offsets' first
    // word, inside TOPK_TOPP_SMEM_BYTES (const asserts); barriers as
    // commented; control flow uniform (the list's total is).
    let n = unsafe {
        let room = list_room(smem);
        match src.list {
            Some(l) => {
                // Every read of a round comes before the first barrier of
                // its scan and every write after it; a round's writes land
                // below its end (no more entries kept before it than read),
                // never on an entry a later round reads.
                let (mut n, mut base) = (0u32, 0u32);
                while base < l.total {
                    let p = base + tid;
                    let e = if p < l.total {
                        *room.add(p as usize)
                    } else {
                        0
                    };
                    let key = e as u32;
                    let on = p < l.total
                        && key >= l.floor
                        && keep(key, (e >> 32) as u32, f32::from_bits(f32_from_key(key)));
                    let (at, count) = block_exclusive_scan(u32::from(on), smem as *mut u32);
                    if on {
                        *room.add((n + at) as usize) = e;
                    }
                    n += count;
                    base += ROW_THREADS;
                }
                // The last round's writes before any read of them.
                arch::bar_sync();
                n
            }
            None => {
                let count = smem.add(REDUCE_BYTES) as *mut u32;
                if tid == 0 {
                    *count = 0;
                }
                arch::bar_sync();
                let addr = arch::smem_addr(count);
                src.for_each(|key, i, x| {
                    if keep(key, i, x) {
                        let at = arch::atom_shared_add_u32(addr, 1);
                        if at < RANKED_MAX_K {
                            *room.add(at as usize) = u64::from(key) | (u64::from(i) << 32);
                        }
                    }
                });
                // Every entry and the count before any read of them.
                arch::bar_sync();
                *count
            }
        }
    };
    n.min(RANKED_MAX_K)
}

/// The kept prefix of a row whose candidates are the `n` (1 to
/// [`SORT_MAX`]) list entries at the start of the list's room (every one a
/// candidate, or, with top-k, every top-k survivor): the entries, turned
/// in place into their order words ([`order_of`]), sorted descending (by
/// rank counting up to [`ROW_THREADS`] words, else by the bitonic network
/// held in registers, [`block::bitonic_sort_desc_regs`]), so rank `r` is
/// the `r`-th candidate of the total order; then [`ranked_cut`]. The
/// sorted order and masses stay in shared memory ([`sorted_arrays`]) for
/// [`sorted_mass`] and [`sorted_draw`]; the entries are gone: a caller
/// reads the kept set from the ranks.
///
/// # Safety
/// As [`block_reduce`]; `smem` is the selection kernels' dynamic shared
/// memory; the entries are written and visible to the block (a barrier
/// since).
#[inline(always)]
unsafe fn sort_cut(
    n: u32,
    k: Option<u32>,
    top_p: Option<f32>,
    w: Weights,
    total_mass: f64,
    smem: *mut u8,
) -> (Cut, u32) {
    let tid = arch::thread_idx_x();
    // SAFETY: the entries below n, turned into order words by the thread
    // that reads them; the sort's padding up to E ROW_THREADS at most
    // SORT_MAX, inside the room (const assert); the sorts start and end
    // with a block barrier.
    unsafe {
        let a = sorted_arrays(smem);
        let order = a.order;
        let mut q = tid;
        while q < n {
            *order.add(q as usize) = order_of(*order.add(q as usize));
            q += ROW_THREADS;
        }
        // The sort's first barrier follows the conversion; the order words
        // are distinct (each holds its index).
        if n <= ROW_THREADS {
            block::rank_sort_desc::<0>(order, n, ROW_THREADS);
        } else if n <= 2 * ROW_THREADS {
            block::bitonic_sort_desc_regs::<2>(order, n, ROW_THREADS);
        } else if n <= 4 * ROW_THREADS {
            block::bitonic_sort_desc_regs::<4>(order, n, ROW_THREADS);
        } else if n <= 8 * ROW_THREADS {
            block::bitonic_sort_desc_regs::<8>(order, n, ROW_THREADS);
        } else {
            block::bitonic_sort_desc_regs::<16>(order, n, ROW_THREADS);
        }
        ranked_cut(n, k, top_p, w, total_mass, a)
    }
}

/// The kept prefix of `n` (1 to [`SORT_MAX`]) candidates whose order words
/// ([`order_of`]) lie sorted descending in `a.order` (rank `r` the `r`-th
/// candidate of the total order): their masses (weights under `w`)
/// written to `a.mass`, then top-k (`k`)
/// keeps the ranks below `k` and top-p (`top_p`) the ranks whose exclusive
/// mass, summed in rank order, is below `top_p` times the top-k survivors'
/// mass (`total_mass`, every min-p survivor's, without top-k; unused with
/// top-k), and at least one. Returns the cut and the kept ranks. The one
/// rule of [`sort_cut`] and the slab kernels ([`slab_select`]).
///
/// # Safety
/// As [`block_reduce`], on a block of at least [`ROW_THREADS`] threads
/// ([`cut_lane`]); `a` as [`CutArrays`] for `n` ranks; the order words
/// are written and visible to the block (a barrier since).
#[inline(always)]
unsafe fn ranked_cut(
    n: u32,
    k: Option<u32>,
    top_p: Option<f32>,
    w: Weights,
    total_mass: f64,
    a: CutArrays,
) -> (Cut, u32) {
    let smem = a.scratch;
    // SAFETY: ranks below n of the arrays (caller's contract); a barrier
    // between the masses' writes and their reads; block scans as their
    // contracts.
    unsafe {
        let (order, mass) = (a.order, a.mass);
        let mut r = cut_lane();
        while r < n {
            let key = (*order.add(r as usize) >> 32) as u32;
            *mass.add(r as usize) = f64::from(w.weight(f32::from_bits(f32_from_key(key))));
            r += ROW_THREADS;
        }
        arch::bar_sync();
        // Top-k: the first k ranks.
        let kept_k = k.map_or(n, |k| k.min(n));
        let kept = match top_p {
            None => kept_k,
            Some(p) => {
                // Each thread sums its run of the top-k survivors' ranks.
                let (r0, per) = my_ranks(kept_k);
                let sum = run_mass(mass, (r0, per), kept_k);
                let (excl, kmass) = block_exclusive_scan_f64(sum, smem as *mut f64);
                let target = f64::from(p) * if k.is_some() { kmass } else { total_mass };
                let (mut below, mut acc) = (0u32, excl);
                let mut j = 0;
                while j < per {
                    if r0 + j < kept_k {
                        below += u32::from(acc < target);
                        acc += *mass.add((r0 + j) as usize);
                    }
                    j += 1;
                }
                let (_, count) = block_exclusive_scan(below, smem as *mut u32);
                count.max(1)
            }
        };
        let last = *order.add(kept as usize - 1);
        let cut = Cut {
            key: (last >> 32) as u32,
            index_end: (!(last as u32)).saturating_add(1),
        };
        (cut, kept)
    }
}

/// Where [`ranked_cut`] and [`sorted_draw`] work: `order` holds the
/// sorted order words and `mass` their masses (a slot a rank each), and
/// `scratch` the block scans' partials (a u64 slot a warp of the block;
/// [`sorted_draw`] one more). No two overlap.
#[derive(Clone, Copy)]
pub(crate) struct CutArrays {
    pub(crate) order: *mut u64,
    pub(crate) mass: *mut f64,
    pub(crate) scratch: *mut u8,
}

/// The [`CutArrays`] of the selection kernels: the list's room, its first
/// [`SORT_MAX`] words, then as many masses; the scratch at the start of
/// the dynamic shared memory (`REDUCE_BYTES`).
///
/// # Safety
/// `smem` is the selection kernels' dynamic shared memory.
#[inline(always)]
unsafe fn sorted_arrays(smem: *mut u8) -> CutArrays {
    // SAFETY: inside the list's room (const assert; caller's contract).
    unsafe {
        let order = list_room(smem);
        CutArrays {
            order,
            mass: order.add(SORT_MAX as usize) as *mut f64,
            scratch: smem,
        }
    }
}

/// The sum of the masses of the `kept` first ranks of [`ranked_cut`], to
/// every thread, in a fixed order.
///
/// # Safety
/// As [`block_reduce`]; `smem` is the selection kernels' dynamic shared
/// memory; [`ranked_cut`] wrote at least `kept` masses there and nothing
/// has written them since.
#[inline(always)]
unsafe fn sorted_mass(kept: u32, smem: *mut u8) -> f64 {
    // SAFETY: ranks below kept (caller's contract); the scan's slots.
    unsafe {
        let mass = sorted_arrays(smem).mass;
        block_exclusive_scan_f64(run_mass(mass, my_ranks(kept), kept), smem as *mut f64).1
    }
}

/// The draw of [`sample_row`] over the `kept` first ranks of
/// [`ranked_cut`]: the index of the first rank whose cumulative mass,
/// summed in rank order, exceeds `u` times the kept mass (the last kept
/// rank when rounding leaves none).
///
/// # Safety
/// As [`ranked_cut`]; [`ranked_cut`] made `kept` (at least 1) ranks in
/// `a.order` and `a.mass` and nothing has written them since; `a.scratch`
/// holds a u64 slot a warp and one more.
#[inline(always)]
unsafe fn sorted_draw(kept: u32, u: f32, a: CutArrays) -> u32 {
    let smem = a.scratch;
    // SAFETY: ranks below kept of the arrays; block scans and reductions
    // as their contracts.
    unsafe {
        let (order, mass) = (a.order, a.mass);
        let (r0, per) = my_ranks(kept);
        let sum = run_mass(mass, (r0, per), kept);
        let (excl, total) = block_exclusive_scan_f64(sum, smem as *mut f64);
        let target = f64::from(u) * total;
        // The first rank whose inclusive mass exceeds the target, as the
        // largest `SORT_MAX - rank` (0: none).
        let (mut first, mut acc) = (0u32, excl);
        let mut j = 0;
        while j < per {
            let r = r0 + j;
            if r < kept && first == 0 {
                acc += *mass.add(r as usize);
                if acc > target {
                    first = SORT_MAX - r;
                }
            }
            j += 1;
        }
        let best = block::block_max_u64(u64::from(first), smem as *mut u64) as u32;
        let r = if best == 0 { kept - 1 } else { SORT_MAX - best };
        !(*order.add(r as usize) as u32)
    }
}

/// The block-wide exclusive prefix sum of `v` in thread order, and the
/// total, to every thread, in a fixed order (the same bits on every
/// launch).
///
/// # Safety
/// As [`block_reduce`] (`smem`: `WARPS` f64 slots).
#[inline(always)]
unsafe fn block_exclusive_scan_f64(v: f64, smem: *mut f64) -> (f64, f64) {
    let tid = arch::thread_idx_x();
    let (lane, warp) = (tid % 32, (tid / 32) as usize);
    let mut inclusive = v;
    let mut d = 1;
    while d < 32 {
        let b = inclusive.to_bits();
        let lo = arch::shfl_up_u32(b as u32, d);
        let hi = arch::shfl_up_u32((b >> 32) as u32, d);
        if lane >= d {
            inclusive += f64::from_bits((u64::from(hi) << 32) | u64::from(lo));
        }
        d <<= 1;
    }
    // SAFETY: slots below WARPS (caller's contract); barriers as in
    // `block_reduce`.
    unsafe {
        if lane == 31 {
            *smem.add(warp) = inclusive;
        }
        arch::bar_sync();
        let (mut before, mut total) = (0.0f64, 0.0f64);
        let mut w = 0;
        while w < WARPS {
            let c = *smem.add(w);
            if w < warp {
                before += c;
            }
            total += c;
            w += 1;
        }
        arch::bar_sync();
        (before + (inclusive - v), total)
    }
}

/// Per-row parameters.
///
/// # Safety
/// Each pointer holds at least `r + 1` elements.
#[inline(always)]
pub(crate) unsafe fn read_params(
    r: usize,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
) -> Params {
    // SAFETY: caller's contract.
    unsafe {
        Params {
            top_k: *top_k.add(r),
            top_p: *top_p.add(r),
            min_p: *min_p.add(r),
            temperature: *temperature.add(r),
        }
    }
}

/// Every pass's first step: lets the next pass of the call start its
/// blocks (the host launches the passes after the first with a
/// programmatic dependency on sm_90), then waits for the previous pass of
/// the call to complete, before reading anything it wrote.
#[inline(always)]
fn pass_start() {
    arch::griddepcontrol_launch_dependents();
    arch::griddepcontrol_wait();
}

/// The (row, chunk) of this block of a chunked pass, and the row's slots.
#[inline(always)]
fn chunk_block(batch: u32, vocab: u32, ws: *mut u64) -> (u32, u32, Slots) {
    let lay = TopkToppLayout::new(batch, vocab);
    let b = arch::block_idx_x();
    let (r, c) = (b / lay.chunks, b % lay.chunks);
    let slots = Slots {
        lay,
        ws,
        r: r as usize,
    };
    (r, c, slots)
}

/// One chunk's statistics partial ([`RowStats`] of chunk `c` of `row`,
/// shifted by `shift`), written to its slot.
///
/// # Safety
/// As [`block_reduce`] and [`Row::scan`]; `c` is a chunk of the row.
#[inline(always)]
unsafe fn stats_chunk(row: Row, c: u32, shift: f32, slots: Slots, smem: *mut u8) {
    let mut st = RowStats::EMPTY;
    // SAFETY: forwarded.
    unsafe {
        Row::chunk(row, c).scan4(|ok, width, _, q| {
            if ok {
                if width == 4 {
                    st.add4(q, shift)
                } else {
                    st.add(q[0], shift)
                }
            }
        });
        let st = block_reduce(st, smem as *mut RowStats);
        if arch::thread_idx_x() == 0 {
            *slots.stats(c) = st;
        }
    }
}

/// The row's [`RowPlan`] from its merged statistics.
#[inline(always)]
fn row_plan(stats: &RowStats, shift: f32, vocab: u32, params: Params) -> RowPlan {
    if stats.is_valid() {
        let plan = Plan::new(stats, shift, vocab, &row_params(params));
        let min_key = plan.weights.min_p_key();
        RowPlan {
            plan,
            keys: [plan.t1.max(min_key), plan.t2.max(min_key), min_key],
            flags: VALID
                | if plan.topp && !plan.topk {
                    MASS_NEEDED
                } else {
                    0
                },
            wide: u32::MAX,
        }
    } else {
        RowPlan {
            plan: Plan {
                k: 0,
                topk: false,
                top_p: 1.0,
                topp: false,
                weights: Weights::new(f32::NEG_INFINITY, 1.0, 0.0),
                prefiltered: false,
                t1: 0,
                t2: 0,
            },
            keys: [u32::MAX; 3],
            flags: 0,
            wide: u32::MAX,
        }
    }
}

/// One chunk's statistics partial, as [`stats_chunk`], and, when it lists
/// for top-k `k` ([`cover::list_k`], [`cover::chunk_lists`]), its list:
/// every element at or above the chunk floor of the tier
/// [`cover::local_choice`] picks for [`cover::chunk_ask`], in the block's
/// scan order, its count and its floor ([`cover::NO_LIST`] when no tier
/// serves, or without a list: the row then takes the pre-filter pass). The
/// chunk stays in registers from its loads to its list.
///
/// # Safety
/// As [`block_reduce`] and [`Row::scan`]; `c` is a chunk of the row.
#[inline(always)]
unsafe fn survey_chunk(row: Row, c: u32, shift: f32, k: u32, slots: Slots, smem: *mut u8) {
    let tid = arch::thread_idx_x();
    let chunk = Row::chunk(row, c);
    let ask = cover::chunk_ask(k, chunk.n, row.n, slots.lay.cap);
    // SAFETY: the caller's contract covers every access; control flow
    // depends only on `k` and block-reduced values (uniform).
    unsafe {
        // The chunk held as values, one register a slot: slots past the
        // row's end hold -inf's, which changes neither the statistics (nor
        // the merged largest key: every chunk holds an element, whose key
        // is at least -inf's) nor any tier.
        let x = chunk.load_chunk();
        let mut st = RowStats::EMPTY;
        each_quad(|v| st.add4([x[4 * v], x[4 * v + 1], x[4 * v + 2], x[4 * v + 3]], shift));
        let st = block_reduce(st, smem as *mut RowStats);
        let unlisted = !cover::chunk_lists(k, &st, shift);
        if tid == 0 {
            *slots.stats(c) = st;
            if unlisted {
                *slots.floor(c) = cover::NO_LIST;
            }
        }
        if unlisted {
            return;
        }
        // This thread's elements at or above each tier's floor, bit p for
        // slot p: as floats where that decides as the keys do (each floor a
        // number above -inf other than +0; NaN fails, as its key, -inf's,
        // would), else as keys.
        let t = cover::floor_keys(&st, shift, ask.targets);
        let tf = [
            f32::from_bits(f32_from_key(t[0])),
            f32::from_bits(f32_from_key(t[1])),
        ];
        let exact = |t: f32| t > f32::NEG_INFINITY && t.to_bits() != 0;
        let (mut h1, mut h2) = (0u32, 0u32);
        if exact(tf[0]) && exact(tf[1]) {
            each_slot(|p| {
                h1 |= u32::from(x[p] >= tf[0]) << p;
                h2 |= u32::from(x[p] >= tf[1]) << p;
            });
        } else {
            each_slot(|p| {
                let key = f32_key(x[p].to_bits());
                h1 |= u32::from(key >= t[0]) << p;
                h2 |= u32::from(key >= t[1]) << p;
            });
        }
        // Both tiers' counts in one scan: a chunk's are below 2^16.
        let (pre, tot) =
            block_exclusive_scan(h1.count_ones() | (h2.count_ones() << 16), smem as *mut u32);
        let counts = [tot & 0xffff, tot >> 16];
        let cap = slots.lay.cap;
        let (floor, n, hits, at) =
            match cover::local_choice(counts, st.n_finite, st.n_posinf, ask.need, cap) {
                Some(LocalTier::First) => (t[0], counts[0], h1, pre & 0xffff),
                Some(LocalTier::Second) => (t[1], counts[1], h2, pre >> 16),
                Some(LocalTier::Finite) => {
                    let mut h = 0u32;
                    each_slot(|p| {
                        h |= u32::from(f32_key(x[p].to_bits()) >= cover::LEAST_FINITE_KEY) << p
                    });
                    let (at, n) = block_exclusive_scan(h.count_ones(), smem as *mut u32);
                    (cover::LEAST_FINITE_KEY, n, h, at)
                }
                None => (cover::NO_LIST, 0, 0, 0),
            };
        if tid == 0 {
            *slots.floor(c) = floor;
            *slots.count(c) = n;
        }
        list_hits(chunk, hits, at, slots.list(c), cap);
    }
}

/// Pass 1: the statistics ([`RowStats`]) of one chunk of a row.
///
/// # Launch
/// See the module docs (a block per chunk).
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn topk_topp_stats_f32(
    logits: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        stats_chunk(row, c, RowStats::shift_of(*row.ptr), slots, smem);
    }
}

/// Pass 1 of the listing route: [`topk_topp_stats_f32`]'s statistics and,
/// when the row's top-k is listed ([`cover::list_k`]), the chunk's list
/// ([`survey_chunk`]); else its floor is [`cover::NO_LIST`]. With
/// `shares_only` (not 0) only rows listed by shares ([`cover::is_shared`])
/// list: a row whose chunks list no floor is planned and filtered as on the
/// plain passes.
///
/// # Launch
/// See the module docs (a block per chunk); `top_k` and `temperature` hold
/// `batch` entries.
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_stats_listed_f32(
    logits: *const f32,
    top_k: *const u32,
    temperature: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    shares_only: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let shift = RowStats::shift_of(*row.ptr);
        let k = cover::list_k(*top_k.add(r as usize), *temperature.add(r as usize), vocab);
        let k = if shares_only != 0 && !cover::is_shared(k) {
            0
        } else {
            k
        };
        survey_chunk(row, c, shift, k, slots, smem);
    }
}

/// Per row: merges the chunks' statistics and writes what the pre-filter
/// pass needs of the row's plan ([`RowPlan`]).
///
/// # Launch
/// See the module docs (a block per row, after the statistics pass).
///
/// # Safety
/// See the module docs; the statistics pass of this call has completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_plan_f32(
    logits: *const f32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    // SAFETY: forwarded.
    unsafe {
        plan_row::<false>(
            logits,
            [top_k, top_p.cast(), min_p.cast(), temperature.cast()],
            vocab,
            row_stride,
            batch,
            ws,
        )
    }
}

/// [`topk_topp_plan_f32`] after [`topk_topp_stats_listed_f32`]: the plan,
/// flagged [`COVERED`] when the statistics pass's chunk lists hold the
/// row's candidates.
///
/// # Launch
/// As [`topk_topp_plan_f32`], after the listing statistics pass.
///
/// # Safety
/// See the module docs; the statistics pass of this call has completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_plan_listed_f32(
    logits: *const f32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    // SAFETY: forwarded.
    unsafe {
        plan_row::<true>(
            logits,
            [top_k, top_p.cast(), min_p.cast(), temperature.cast()],
            vocab,
            row_stride,
            batch,
            ws,
        )
    }
}

/// The plan kernels' work; `LISTED`: the statistics pass listed chunks
/// (their floors are in the workspace), so the row may be [`COVERED`].
/// `params` are the `top_k`, `top_p`, `min_p` and `temperature` arrays.
///
/// # Safety
/// As the plan kernels.
#[inline(always)]
unsafe fn plan_row<const LISTED: bool>(
    logits: *const f32,
    params: [*const u32; 4],
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let r = arch::block_idx_x();
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    let [top_k, top_p, min_p, temperature] = params;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let slots = Slots::new(ws, batch, vocab, r);
        let shift = RowStats::shift_of(*logits.add(r as usize * row_stride as usize));
        let stats = merged_stats(slots, smem);
        let tid = arch::thread_idx_x();
        let (mut f_max, mut shared_wide) = (0, None);
        let mut shared = false;
        if LISTED {
            let (mut floor, mut c) = (0u32, tid);
            while c < slots.lay.chunks {
                floor = floor.max(*slots.floor(c));
                c += ROW_THREADS;
            }
            f_max = block::block_max_u64(u64::from(floor), smem as *mut u64) as u32;
            let k = cover::list_k(
                *top_k.add(r as usize),
                *temperature.cast::<f32>().add(r as usize),
                vocab,
            );
            shared = cover::is_shared(k);
            if shared && f_max != cover::NO_LIST {
                let floors = cover::shared_floors(&stats, shift, k, f_max);
                let at = listed_at(slots, floors, smem);
                shared_wide = Some((floors, at));
            }
        }
        if tid != 0 {
            return;
        }
        let params = read_params(
            r as usize,
            top_k,
            top_p.cast(),
            min_p.cast(),
            temperature.cast(),
        );
        let mut out = row_plan(&stats, shift, vocab, params);
        let plan = out.plan;
        let min_key = out.keys[2];
        // The candidate floor of a covered row.
        let wide = if shared {
            shared_wide.and_then(|(floors, at)| {
                cover::shared_cover(f_max, stats.n_posinf, floors, at, min_key, plan.k)
            })
        } else if cover::row_covered(f_max, stats.n_finite, stats.n_posinf, plan.k) {
            Some(f_max.max(min_key))
        } else {
            None
        };
        if let Some(wide) = wide
            && LISTED
            && out.flags & VALID != 0
            && plan.topk
            && slots.lay.chunks <= TOPK_TOPP_MAX_LISTED_CHUNKS
        {
            out.flags |= COVERED;
            out.wide = wide;
        }
        *slots.plan() = out;
    }
}

/// How many entries of a row's chunk lists have keys at least each of
/// `floors` (every chunk listed), to every thread: warp `w` reads chunks
/// `w`, `w + WARPS`, ..., each lane four entries at a time.
///
/// # Safety
/// As [`block_reduce`]; the statistics pass has completed and every chunk
/// of the row listed (its count at most the layout's `cap`).
#[inline(always)]
unsafe fn listed_at<const N: usize>(slots: Slots, floors: [u32; N], smem: *mut u8) -> [u32; N] {
    let tid = arch::thread_idx_x();
    let (mut n, mut c) = ([0u32; N], tid / 32);
    // SAFETY: entries below each chunk's count, inside its list.
    unsafe {
        while c < slots.lay.chunks {
            let (count, list) = (*slots.count(c), slots.list(c));
            let mut q = tid % 32;
            while q < count {
                // A range, not an array by value (whose iterator would
                // sit in local memory).
                for j in 0..4 {
                    let d = 32 * j;
                    if q + d < count {
                        let key = *list.add((q + d) as usize) as u32;
                        for (n, &f) in n.iter_mut().zip(floors.iter()) {
                            *n += u32::from(key >= f);
                        }
                    }
                }
                q += 128;
            }
            c += ROW_THREADS / 32;
        }
        block_reduce(Counts(n), smem as *mut Counts<N>).0
    }
}

/// Pass 2: one chunk's pre-filter tiers (min-p's survivors by tier, masses
/// when top-p alone needs them) and its candidates (the first tier), listed
/// in the block's scan order up to the chunk's `cap` and counted in full,
/// under the row's plan from [`topk_topp_plan_f32`].
///
/// # Launch
/// See the module docs (a block per chunk).
///
/// # Safety
/// See the module docs; the plan kernel of this call has completed.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn topk_topp_filter_f32(
    logits: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        filter_chunk(row, c, *slots.plan(), slots, smem);
    }
}

/// Pass 2 of the listing route: [`topk_topp_filter_f32`] over `group`
/// consecutive chunks a block; nothing for a row the statistics pass's
/// lists cover ([`COVERED`]), whose blocks end at once (hence several
/// chunks a block at large batches: fewer blocks to start for nothing).
///
/// # Launch
/// See the module docs, except the grid: `(batch * ceil(chunks / group), 1,
/// 1)` blocks, `group >= 1`, block `b` taking chunks `group * (b % per_row)`
/// on of row `b / per_row`, `per_row = ceil(chunks / group)`.
///
/// # Safety
/// See the module docs; the plan kernel of this call has completed.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn topk_topp_filter_grouped_f32(
    logits: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    group: u32,
    ws: *mut u64,
) {
    pass_start();
    let lay = TopkToppLayout::new(batch, vocab);
    let group = group.max(1);
    let per_row = lay.chunks.div_ceil(group).max(1);
    let b = arch::block_idx_x();
    let r = b / per_row;
    let slots = Slots {
        lay,
        ws,
        r: r as usize,
    };
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access;
    // the loop's bounds are uniform over the block.
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let plan = *slots.plan();
        let mut c = group * (b % per_row);
        let end = (c + group).min(lay.chunks);
        while c < end {
            filter_chunk(row, c, plan, slots, smem);
            c += 1;
        }
    }
}

/// One chunk's pre-filter tiers and candidate list (see
/// [`topk_topp_filter_f32`]) under the row's plan `plan`; nothing for a row
/// with nothing finite and no +inf (the selection reads no partial of it).
///
/// # Safety
/// As [`block_reduce`] and [`Row::scan`]; `c` is a chunk of the row.
#[inline(always)]
unsafe fn filter_chunk(row: Row, c: u32, plan: RowPlan, slots: Slots, smem: *mut u8) {
    let tid = arch::thread_idx_x();
    if plan.flags & (VALID | COVERED) != VALID {
        return;
    }
    // SAFETY: the caller's contract covers every access; control flow
    // depends only on the row's plan (uniform).
    unsafe {
        let (w, k) = (plan.plan.weights, plan.keys);
        let mass_needed = plan.flags & MASS_NEEDED != 0;
        let chunk = Row::chunk(row, c);
        // Two copies of the scan, so that rows without a top-p-only cut
        // (which needs no masses) skip the weights.
        // Bit p of `hits`: this thread's p-th element of the scan is a
        // candidate (a chunk gives a thread at most 32 elements).
        let mut acc = TierScan::EMPTY;
        let (mut hits, mut p) = (0u32, 0u32);
        if mass_needed {
            chunk.scan(|ok, key, _, x| {
                let on = [ok && key >= k[0], ok && key >= k[1], ok && key >= k[2]];
                let wx = if on[2] { f64::from(w.weight(x)) } else { 0.0 };
                acc.add(on, Some(wx));
                hits |= u32::from(on[0]) << p;
                p += 1;
            });
        } else {
            // Where comparing floats decides as comparing keys does, the
            // tiers are tested as floats: two or three tests an element and
            // no key (its NaN test is what made the key path's cost). That
            // holds for each threshold that is a number above -inf other
            // than +0 (below which -0 passes as a float but not as a key);
            // NaN, whose key is -inf's, then fails every test as it should.
            // The third tier is every element when min-p keeps everything
            // (`k[2]` at most -inf's key, the least key of any element).
            let every = k[2] <= f32_key(f32::NEG_INFINITY.to_bits());
            let t = k.map(|key| f32::from_bits(f32_from_key(key)));
            let exact = |t: f32| t > f32::NEG_INFINITY && t.to_bits() != 0;
            if exact(t[0]) && exact(t[1]) && (every || exact(t[2])) {
                // The second and third tiers' counts without a branch (the
                // third's a constant when it holds everything); the first
                // tier (the list's bits) only for a group that holds one,
                // about one warp in seven at k = 50.
                let mut scan = |every: bool| {
                    let in2 = |x: f32| u32::from(every || x >= t[2]);
                    chunk.scan4(|ok, width, _, q| {
                        if ok && width == 4 {
                            let in1 = |x: f32| u32::from(x >= t[1]);
                            acc.n[1] += (in1(q[0]) + in1(q[1])) + (in1(q[2]) + in1(q[3]));
                            acc.n[2] += (in2(q[0]) + in2(q[1])) + (in2(q[2]) + in2(q[3]));
                            if q[0].max(q[1]).max(q[2].max(q[3])) >= t[0] {
                                for (l, &x) in q.iter().enumerate() {
                                    let on = u32::from(x >= t[0]);
                                    acc.n[0] += on;
                                    hits |= on << (p + l as u32);
                                }
                            }
                        } else if ok {
                            let on = [q[0] >= t[0], q[0] >= t[1], in2(q[0]) != 0];
                            acc.add(on, None);
                            hits |= u32::from(on[0]) << p;
                        }
                        p += width;
                    })
                };
                if every { scan(true) } else { scan(false) }
            } else {
                chunk.scan(|ok, key, _, _| {
                    let on = [ok && key >= k[0], ok && key >= k[1], ok && key >= k[2]];
                    acc.add(on, None);
                    hits |= u32::from(on[0]) << p;
                    p += 1;
                });
            }
        }
        // The first tier's count is the scanned count's total.
        let (at, tiers) = if mass_needed {
            block_scan_reduce(acc.n[0], acc.tiers(), smem)
        } else {
            let (at, counts) = block_scan_reduce(acc.n[0], Counts(acc.n), smem);
            (at, counts.tiers())
        };
        let total = tiers.s1.n;
        if tid == 0 {
            *slots.tiers(c) = tiers;
            *slots.count(c) = total;
        }
        list_hits(chunk, hits, at, slots.list(c), slots.lay.cap);
    }
}

/// Writes this thread's elements of `chunk` flagged in `hits` (bit `p`:
/// its `p`-th slot) to `list` from entry `at` on, below `cap`, in scan
/// order, each read once more (L1 and L2 hold the chunk): key in the low
/// half, row index in the high half.
///
/// # Safety
/// As [`Row::scan`]; `list` holds `cap` entries; `at` is this thread's
/// exclusive prefix of the chunk's flagged elements.
#[inline(always)]
unsafe fn list_hits(chunk: Row, mut hits: u32, mut at: u32, list: *mut u64, cap: u32) {
    // SAFETY: flagged slots lie inside the chunk; entries below cap.
    unsafe {
        while hits != 0 && at < cap {
            let j = chunk.scan_slot(hits.trailing_zeros());
            hits &= hits - 1;
            let key = f32_key((*chunk.ptr.add(j as usize)).to_bits());
            *list.add(at as usize) = u64::from(key) | (u64::from(chunk.base + j) << 32);
            at += 1;
        }
    }
}

/// Pass 3 of masking (and of the renormalised probabilities and the kept
/// sets): selects each row's kept set and writes its cut (for
/// [`topk_topp_apply_f32`], [`topk_topp_renorm_f32`] and
/// [`topk_topp_kept_count_f32`]), the kept count (0 for a row with nothing
/// finite and no +inf) and, when `with_mass` is not 0, the kept mass (for
/// [`topk_topp_renorm_f32`]). Reads the logits only.
///
/// # Launch
/// See the module docs (a block per row).
///
/// # Safety
/// See the module docs; both chunked passes of this call have completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_mask_f32(
    logits: *const f32,
    kept: *mut u32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
    with_mass: u32,
) {
    // SAFETY: forwarded.
    unsafe { mask_kernel::<false>(logits, kept, vocab, row_stride, batch, ws, with_mass) }
}

/// [`topk_topp_mask_f32`] on the listing route: a [`COVERED`] row takes its
/// candidates from the statistics pass's chunk lists.
///
/// # Launch
/// As [`topk_topp_mask_f32`], after [`topk_topp_plan_listed_f32`] and
/// [`topk_topp_filter_grouped_f32`].
///
/// # Safety
/// See the module docs; both chunked passes of this call have completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_mask_listed_f32(
    logits: *const f32,
    kept: *mut u32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
    with_mass: u32,
) {
    // SAFETY: forwarded.
    unsafe { mask_kernel::<true>(logits, kept, vocab, row_stride, batch, ws, with_mass) }
}

/// The mask kernels' work (`LISTED`: see [`refine`]).
///
/// # Safety
/// As the mask kernels.
#[inline(always)]
unsafe fn mask_kernel<const LISTED: bool>(
    logits: *const f32,
    kept: *mut u32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
    with_mass: u32,
) {
    pass_start();
    let r = arch::block_idx_x();
    // Typed as u64 for its 8-byte alignment (f64 and u64 slots).
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let slots = Slots::new(ws, batch, vocab, r);
        let view = refine::<LISTED>(row, slots, 0, 1, smem);
        mask_row(row, slots, view, kept.add(r as usize), with_mass != 0, smem);
    }
}

/// The mask kernel's work for one row: its cut to its slot, its kept count
/// to `*kept`, and (`with_mass`) the kept set's mass (its weights' sum) to
/// the slot's last word, as f32 bits (else 0).
///
/// # Safety
/// As [`select`]; `kept` is writable.
#[inline(always)]
unsafe fn mask_row(
    row: Row,
    slots: Slots,
    view: RowView,
    kept: *mut u32,
    with_mass: bool,
    smem: *mut u8,
) {
    // SAFETY: forwarded.
    unsafe {
        let (sel, src) = select(row, slots, view, smem);
        let (cut, w) = (sel.cut, sel.weights);
        // A ranked cut's kept set is its first ranks (and a list's entries
        // are gone); else count the kept elements.
        let (n, mass) = if sel.ranked > 0 {
            ranked_kept(sel.ranked, with_mass, smem)
        } else {
            let mut g = Group::EMPTY;
            src.for_each(|key, i, x| {
                if cut.keeps(key, i) {
                    if with_mass {
                        g.add(key, f64::from(w.weight(x)));
                    } else {
                        g.n += 1;
                    }
                }
            });
            let g = block_reduce(g, smem as *mut Group);
            (g.n, g.mass)
        };
        // The lists hold every kept element when the selection read them.
        store_cut(slots, kept, cut, n, src.list.is_some(), mass);
    }
}

/// The kept count and (`with_mass`) mass of a ranked cut's `ranked` kept
/// ranks ([`sorted_mass`]; else 0), to every thread.
///
/// # Safety
/// As [`sorted_mass`].
#[inline(always)]
unsafe fn ranked_kept(ranked: u32, with_mass: bool, smem: *mut u8) -> (u32, f64) {
    let mass = if with_mass {
        // SAFETY: forwarded.
        unsafe { sorted_mass(ranked, smem) }
    } else {
        0.0
    };
    (ranked, mass)
}

/// A mask kernel's outputs for a row (thread 0 writes them): its kept
/// count `n` to `*kept`, its cut to its slot, with whether the cut came
/// from the lists (`from_lists`: they then hold every kept element, read
/// by [`kept_bits`]) and the kept mass as f32 bits.
///
/// # Safety
/// `kept` is writable; `slots` are the row's.
#[inline(always)]
unsafe fn store_cut(slots: Slots, kept: *mut u32, cut: Cut, n: u32, from_lists: bool, mass: f64) {
    if arch::thread_idx_x() == 0 {
        // SAFETY: caller's contract.
        unsafe {
            *kept = n;
            let out = slots.cut();
            *out = cut.key;
            *out.add(1) = cut.index_end;
            *out.add(2) = u32::from(from_lists);
            *out.add(3) = (mass as f32).to_bits();
        }
    }
}

/// Pass 4 of masking: writes -inf over one chunk's elements outside the
/// row's kept set; kept entries keep their bits. When the cut came from
/// the lists (which hold every kept element) the chunk is only written:
/// the kept elements are marked in a bitmap from the chunk's list first.
///
/// # Launch
/// See the module docs (a block per chunk).
///
/// # Safety
/// See the module docs; [`topk_topp_mask_f32`] of this call has completed.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn topk_topp_apply_f32(
    logits: *mut f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        apply_chunk(
            logits.add(r as usize * row_stride as usize),
            vocab,
            c,
            slots,
            smem,
        )
    }
}

/// The apply kernel's work for chunk `c` of the row of `vocab` logits at
/// `ptr`; ends with a block barrier (the next chunk's bitmap may follow).
///
/// # Safety
/// As [`block_reduce`]; the row is writable; its cut is in its slot (and
/// visible to the block).
#[inline(always)]
unsafe fn apply_chunk(ptr: *mut f32, vocab: u32, c: u32, slots: Slots, smem: *mut u8) {
    // SAFETY: the caller's contract covers every access.
    unsafe {
        let chunk = Row::chunk(Row::whole(ptr, vocab), c);
        let (cut, from_lists) = read_cut(slots);
        if !from_lists {
            chunk.scan(|ok, key, i, _| {
                if ok && !cut.keeps(key, i) {
                    *ptr.add(i as usize) = f32::NEG_INFINITY;
                }
            });
            arch::bar_sync();
            return;
        }
        let bits = kept_bits(chunk, c, slots, cut, true, smem);
        mask_unmarked(chunk, bits);
    }
}

/// Writes -inf over the elements of `chunk` whose bits are clear in its
/// bitmap `bits` ([`cleared_bitmap`], marked); marked elements are not
/// written and keep their bits. Ends with a block barrier.
///
/// # Safety
/// As [`block::write_chunk`], `chunk` writable.
#[inline(always)]
unsafe fn mask_unmarked(chunk: Row, bits: *const u32) {
    // SAFETY: the caller's contract.
    unsafe {
        block::write_chunk(
            chunk.ptr as *mut f32,
            chunk.n,
            bits,
            f32::NEG_INFINITY,
            |_| None,
            ROW_THREADS,
        )
    }
}

/// The row's cut as the selection wrote it, and whether it came from the
/// lists (which then hold every kept element).
///
/// # Safety
/// The selection of this call has completed.
#[inline(always)]
unsafe fn read_cut(slots: Slots) -> (Cut, bool) {
    let at = slots.cut();
    // SAFETY: the row's cut slot (caller's contract).
    unsafe {
        (
            Cut {
                key: *at,
                index_end: *at.add(1),
            },
            *at.add(2) != 0,
        )
    }
}

/// The chunk passes' bitmap of a chunk's elements in shared memory,
/// `TOPK_TOPP_CHUNK / 32` words after the reduction slots, cleared; ends
/// with a block barrier (marks may follow: [`mark_bit`]).
///
/// # Safety
/// Every thread of the block calls it; the shared memory holds
/// [`TOPK_TOPP_CHUNK_SMEM_BYTES`] (the bitmap fits: const assert).
#[inline(always)]
unsafe fn cleared_bitmap(smem: *mut u8) -> *mut u32 {
    // SAFETY: the caller's contract.
    unsafe {
        let bits = smem.add(REDUCE_BYTES) as *mut u32;
        let mut w = arch::thread_idx_x();
        while w < TOPK_TOPP_CHUNK / 32 {
            *bits.add(w as usize) = 0;
            w += ROW_THREADS;
        }
        arch::bar_sync();
        bits
    }
}

/// Sets the bit of row element `i` (an element of `chunk`) in the chunk's
/// bitmap `bits` ([`cleared_bitmap`]): bit `l % 32` of word `l / 32` for
/// the chunk's element `l`.
///
/// # Safety
/// `bits` is the block's cleared bitmap; `i` lies in the chunk.
#[inline(always)]
unsafe fn mark_bit(bits: *mut u32, chunk: Row, i: u32) {
    let l = i - chunk.base;
    // SAFETY: l below the chunk's length, inside the bitmap.
    unsafe { arch::red_shared_add_u32(arch::smem_addr(bits.add((l / 32) as usize)), 1 << (l % 32)) }
}

/// Chunk `chunk` (chunk `c` of its row)'s kept elements under `cut` as a
/// bitmap in shared memory, `TOPK_TOPP_CHUNK / 32` words after the
/// reduction slots (bit `l % 32` of word `l / 32` for the chunk's element
/// `l`): marked from the chunk's list when the cut came from the lists
/// (`from_lists`), else by reading the chunk. Ends with a block barrier.
///
/// # Safety
/// As [`block_reduce`] and [`Row::scan`]; the shared memory holds
/// [`TOPK_TOPP_CHUNK_SMEM_BYTES`]; the selection of this call has completed.
#[inline(always)]
unsafe fn kept_bits(
    chunk: Row,
    c: u32,
    slots: Slots,
    cut: Cut,
    from_lists: bool,
    smem: *mut u8,
) -> *mut u32 {
    let tid = arch::thread_idx_x();
    // SAFETY: the bitmap inside the chunk passes' shared memory (the
    // caller's contract); list entries below the chunk's count and
    // capacity; a barrier after the marking.
    unsafe {
        let bits = cleared_bitmap(smem);
        let mark = |i: u32| mark_bit(bits, chunk, i);
        if from_lists {
            let count = (*slots.count(c)).min(slots.lay.cap);
            let list = slots.list(c);
            let mut j = tid;
            while j < count {
                let e = *list.add(j as usize);
                let (key, i) = (e as u32, (e >> 32) as u32);
                if cut.keeps(key, i) {
                    mark(i);
                }
                j += ROW_THREADS;
            }
        } else {
            chunk.scan(|ok, key, i, _| {
                if ok && cut.keeps(key, i) {
                    mark(i);
                }
            });
        }
        arch::bar_sync();
        bits
    }
}

/// Writes each row's probabilities renormalised over its kept set (as
/// `reference::probabilities`): `weight(x) / mass` for a kept logit `x`
/// (`weight`: the row's `exp((x - max) / T)`, `mass`: the kept weights'
/// sum, from the selection), 0 elsewhere, into row `r` of `probs` (rows
/// `probs_stride` apart; a row with nothing finite and no +inf all 0).
/// Reads the logits (only the kept ones when the cut came from the lists).
///
/// # Launch
/// See the module docs (a block per chunk, after [`topk_topp_mask_f32`]
/// with `with_mass` set).
///
/// # Safety
/// See the module docs; `probs` holds `batch` rows of `vocab` writable
/// f32 `probs_stride` apart, overlapping nothing else of the call; the
/// selection of this call has completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_renorm_f32(
    logits: *const f32,
    probs: *mut f32,
    vocab: u32,
    row_stride: u64,
    probs_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract covers every access; control flow
    // depends only on the row's cut (uniform).
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let chunk = Row::chunk(row, c);
        let (cut, from_lists) = read_cut(slots);
        let mass = f32::from_bits(*slots.cut().add(3));
        let w = (*slots.plan()).plan.weights;
        let bits = kept_bits(chunk, c, slots, cut, from_lists, smem);
        let out = probs.add(r as usize * probs_stride as usize + chunk.base as usize);
        block::write_chunk(
            out,
            chunk.n,
            bits,
            0.0,
            |l| Some(w.weight(*chunk.ptr.add(l as usize)) / mass),
            ROW_THREADS,
        );
    }
}

/// The kept-set passes, 1 of 2: each chunk's kept count (in the
/// workspace, for [`topk_topp_kept_write_f32`]).
///
/// # Launch
/// See the module docs (a block per chunk, after [`topk_topp_mask_f32`]).
///
/// # Safety
/// See the module docs; the selection of this call has completed.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn topk_topp_kept_count_f32(
    logits: *const f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract covers every access; the bitmap has a
    // word per thread (const assert).
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let (cut, from_lists) = read_cut(slots);
        let bits = kept_bits(Row::chunk(row, c), c, slots, cut, from_lists, smem);
        let mine = (*bits.add(arch::thread_idx_x() as usize)).count_ones();
        let (_, total) = block_exclusive_scan(mine, smem as *mut u32);
        if arch::thread_idx_x() == 0 {
            *slots.kept_count(c) = total;
        }
    }
}

/// The kept-set passes, 2 of 2: each row's kept indices in ascending
/// order into row `r` of `indices` (`capacity` a row; a row's first
/// `capacity` when it keeps more; its kept count is the selection's).
///
/// # Launch
/// See the module docs (a block per chunk, after
/// [`topk_topp_kept_count_f32`]).
///
/// # Safety
/// See the module docs; `indices` holds `batch * capacity` writable u32;
/// the kept-count pass of this call has completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_kept_write_f32(
    logits: *const f32,
    indices: *mut u32,
    capacity: u32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let (r, c, slots) = chunk_block(batch, vocab, ws);
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    let tid = arch::thread_idx_x();
    // SAFETY: the launch contract covers every access; the bitmap has a
    // word per thread (const assert); the scans' barriers separate their
    // uses of the reduction slots.
    unsafe {
        // The kept elements of the row's earlier chunks.
        let mut before = 0u32;
        let mut e = tid;
        while e < c {
            before += *slots.kept_count(e);
            e += ROW_THREADS;
        }
        let (_, offset) = block_exclusive_scan(before, smem as *mut u32);
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let chunk = Row::chunk(row, c);
        let (cut, from_lists) = read_cut(slots);
        let bits = kept_bits(chunk, c, slots, cut, from_lists, smem);
        let mut word = *bits.add(tid as usize);
        let (mut at, _) = block_exclusive_scan(word.count_ones(), smem as *mut u32);
        at += offset;
        let out = indices.add(r as usize * capacity as usize);
        while word != 0 && at < capacity {
            let b = word.trailing_zeros();
            *out.add(at as usize) = chunk.base + 32 * tid + b;
            word &= word - 1;
            at += 1;
        }
    }
}

/// Draws one token per row from its kept set renormalised: the first
/// element, in the total order, whose cumulative kept mass exceeds
/// `u * mass`, with `u = uniform_open(row_uniform_bits(seed_key(seed),
/// offset, 0))` (as `reference::sample_top_k_top_p`; the two may differ
/// only where the cumulative mass is within rounding of `u * mass`).
/// `valid = 0` and token 0 for a row with nothing finite and no +inf. The
/// logits are only read.
///
/// # Launch
/// See the module docs (a block per row, after the two chunked passes).
///
/// # Safety
/// See the module docs; both chunked passes of this call have completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_sample_f32(
    logits: *const f32,
    seed: *const u64,
    offset: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    // SAFETY: forwarded.
    unsafe {
        sample_kernel::<false>(
            logits, seed, offset, tokens, valid, vocab, row_stride, batch, ws,
        )
    }
}

/// [`topk_topp_sample_f32`] on the listing route: a [`COVERED`] row takes
/// its candidates from the statistics pass's chunk lists.
///
/// # Launch
/// As [`topk_topp_sample_f32`], after [`topk_topp_plan_listed_f32`] and
/// [`topk_topp_filter_grouped_f32`].
///
/// # Safety
/// See the module docs; both chunked passes of this call have completed.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_sample_listed_f32(
    logits: *const f32,
    seed: *const u64,
    offset: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    // SAFETY: forwarded.
    unsafe {
        sample_kernel::<true>(
            logits, seed, offset, tokens, valid, vocab, row_stride, batch, ws,
        )
    }
}

/// The sample kernels' work (`LISTED`: see [`refine`]).
///
/// # Safety
/// As the sample kernels.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn sample_kernel<const LISTED: bool>(
    logits: *const f32,
    seed: *const u64,
    offset: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    pass_start();
    let r = arch::block_idx_x();
    // Typed as u64 for its 8-byte alignment (f64 and u64 slots).
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let row = Row::whole(logits.add(r as usize * row_stride as usize), vocab);
        let slots = Slots::new(ws, batch, vocab, r);
        let view = refine::<LISTED>(row, slots, 0, 1, smem);
        let r = r as usize;
        sample_row(
            row,
            slots,
            view,
            *seed.add(r),
            *offset.add(r),
            tokens.add(r),
            valid.add(r),
            smem,
        );
    }
}

/// The sample kernel's work for one row: its token to `*token_out` and
/// its validity to `*valid`, drawn with `(seed, offset)`.
///
/// # Safety
/// As [`select`]; `token_out` and `valid` are writable.
#[inline(always)]
unsafe fn sample_row(
    row: Row,
    slots: Slots,
    view: RowView,
    seed: u64,
    offset: u64,
    token_out: *mut u32,
    valid: *mut u8,
    smem: *mut u8,
) {
    // SAFETY: the caller's contract covers every access; control flow
    // depends only on block-reduced values (uniform).
    unsafe {
        let (sel, src) = select(row, slots, view, smem);
        if !sel.valid {
            store_token(token_out, valid, None, row.n);
            return;
        }
        let u = row_uniform(seed, offset);
        if sel.ranked > 0 {
            let token = sorted_draw(sel.ranked, u, sorted_arrays(smem));
            store_token(token_out, valid, Some(token), row.n);
            return;
        }
        let cut = sel.cut;
        let w = sel.weights;
        let kept = move |key: u32, i: u32, _x: f32| cut.keeps(key, i);
        // The kept set's count, key range and mass.
        let mut g = Group::EMPTY;
        src.for_each(|key, i, x| {
            if kept(key, i, x) {
                g.add(key, f64::from(w.weight(x)));
            }
        });
        let g = block_reduce(g, smem as *mut Group);
        let target = f64::from(u) * g.mass;
        // The first key whose cumulative mass (from the top) reaches the
        // target, then among its tied kept elements the one whose own
        // cumulative mass does.
        let search = QuadSearch::<f64>::new(target, g.min, g.max, g.n, g.mass, true);
        let found = run_search(
            src,
            search,
            |key, _| key,
            |x| f64::from(w.weight(x)),
            kept,
            smem,
        );
        let (key, take, count) = match found {
            Found::Boundary { key, above, count } => {
                let wk = w.weight(f32::from_bits(f32_from_key(key)));
                (key, top_p_ties(above, wk, target, count), count)
            }
            // The target is met exactly at the end of `key`'s elements (or,
            // by rounding, never): the last of them.
            Found::AtLeast(key) => (key, u32::MAX, u32::MAX),
        };
        let token = if take >= count {
            // The highest kept index with this key.
            let mut best = 0u64;
            src.for_each(|k, i, x| {
                // A maximum, not the last seen: the list visits a thread's
                // elements out of index order.
                if k == key && kept(k, i, x) && u64::from(i) + 1 > best {
                    best = u64::from(i) + 1;
                }
            });
            let b = block::block_max_u64(best, smem as *mut u64);
            b.saturating_sub(1) as u32
        } else {
            !tie_index(src, key, take, count, kept, smem)
        };
        store_token(token_out, valid, Some(token), row.n);
    }
}

/// A row's uniform draw in `(0, 1)`: `uniform_open(row_uniform_bits(
/// seed_key(seed), offset, 0))`.
#[inline(always)]
pub(crate) fn row_uniform(seed: u64, offset: u64) -> f32 {
    noise::uniform_open(philox::row_uniform_bits(philox::seed_key(seed), offset, 0))
}

/// A sample kernel's outputs for a row of `n` elements (thread 0 writes
/// them): `token` (0 when it is not below `n`) and valid 1, or token 0
/// and valid 0 for `None` (a row with nothing finite and no +inf).
///
/// # Safety
/// `token_out` and `valid` are writable.
#[inline(always)]
pub(crate) unsafe fn store_token(token_out: *mut u32, valid: *mut u8, token: Option<u32>, n: u32) {
    if arch::thread_idx_x() == 0 {
        // SAFETY: caller's contract.
        unsafe {
            *token_out = token.filter(|&t| t < n).unwrap_or(0);
            *valid = u8::from(token.is_some());
        }
    }
}

// ---------------------------------------------------------------------------
// The slab route: the top-k found by a radix select.
// ---------------------------------------------------------------------------

/// A radix select's per-row top-k ([`crate::radix_select`]): row `r`'s
/// `counts[r]` (1 to [`RANKED_MAX_K`]) entries from `r * RANKED_MAX_K` on,
/// in the total order (value descending, then index ascending): `values`
/// (f32 logits, NaN turned into -inf) and `indices` (token indices).
#[derive(Clone, Copy)]
struct Slab {
    values: *const f32,
    indices: *const u32,
    counts: *const u32,
}

/// Row `r`'s [`Selected`] from its slab ([`slab_cut`] over the slab's
/// entries, the row's count of them, the selection kernels' arrays).
///
/// # Safety
/// As [`block_reduce`]; `smem` is the selection kernels' dynamic shared
/// memory, unused so far; the slab holds row `r`.
#[inline(always)]
unsafe fn slab_select(slab: Slab, r: u32, params: Params, vocab: u32, smem: *mut u8) -> Selected {
    // SAFETY: the slab's entries below RANKED_MAX_K of row r (caller's
    // contract; `slab_cut` reads below the count it clamps to that).
    unsafe {
        let at = r as usize * RANKED_MAX_K as usize;
        let (values, indices) = (slab.values.add(at), slab.indices.add(at));
        let entry = |q: u32| {
            (
                f32_key((*values.add(q as usize)).to_bits()),
                *indices.add(q as usize),
            )
        };
        let count = *slab.counts.add(r as usize);
        slab_cut(count, entry, params, vocab, sorted_arrays(smem))
    }
}

/// The [`Selected`] of a row from its top-k in the total order (value
/// descending, then index ascending): `entry(q)` the key ([`f32_key`], NaN
/// as -inf's) and index of its `q`-th entry, `count` (1 to
/// [`RANKED_MAX_K`]) of them, as a radix select finds them (its slab, or
/// its sorted gather on the radix cluster kernel). The very result of
/// [`select`] on the row's logits when its top-k keeps at most
/// [`RANKED_MAX_K`]: the row is valid when its first value (its largest
/// logit, [`RowStats::max`]) is above -inf; its truncation is
/// [`Plan::new`]'s ([`Truncation::new`] with that value as the maximum);
/// its candidates, min-p's survivors among the entries (a prefix: min-p
/// keeps a prefix of the total order, the largest logit always), are
/// written as order words ([`order_of`]) to `a.order`, already sorted, and
/// [`ranked_cut`] cuts them. A count outside `1 ..= RANKED_MAX_K` is taken
/// as the nearest bound, so nothing is read or written out of bounds; a
/// row whose top-k does not cut or keeps more than its count (both ruled
/// out by the launch contracts) is invalid.
///
/// # Safety
/// As [`ranked_cut`] ([`CutArrays`] for [`RANKED_MAX_K`] ranks);
/// `entry(q)` reads what it reads for `q` below `count` clamped so.
#[inline(always)]
pub(crate) unsafe fn slab_cut(
    count: u32,
    entry: impl Fn(u32) -> (u32, u32),
    params: Params,
    vocab: u32,
    a: CutArrays,
) -> Selected {
    // SAFETY: entries below the clamped count (caller's contract); the
    // order words below it <= RANKED_MAX_K; the scan's barriers between
    // their writes and `ranked_cut`'s reads; control flow uniform (the
    // first value, the count and the scan's total are).
    unsafe {
        let max = f32::from_bits(f32_from_key(entry(0).0));
        let Truncation {
            k,
            topk,
            top_p,
            topp,
            weights: w,
        } = Truncation::new(max, vocab, &row_params(params));
        let count = count.clamp(1, RANKED_MAX_K);
        // A row whose top-k the entries do not hold (top-k off, or above
        // the count the caller's bound let the select keep) breaks the
        // launch contract: it comes out invalid, never truncated wrongly.
        if max.is_nan() || max == f32::NEG_INFINITY || !topk || k > count {
            return Selected {
                cut: Cut::NONE,
                weights: w,
                valid: false,
                ranked: 0,
            };
        }
        let min_key = w.min_p_key();
        let (mut mine, mut q) = (0u32, cut_lane());
        while q < count {
            let (key, index) = entry(q);
            if key >= min_key {
                let e = u64::from(key) | (u64::from(index) << 32);
                *a.order.add(q as usize) = order_of(e);
                mine += 1;
            }
            q += ROW_THREADS;
        }
        let (_, n) = block_exclusive_scan(mine, a.scratch as *mut u32);
        // Top-k always cuts here (`top_k` below `vocab`): the candidates'
        // total mass, which only top-p without top-k reads, is not needed.
        let (cut, ranked) = ranked_cut(n, topk.then_some(k), topp.then_some(top_p), w, 0.0, a);
        Selected {
            cut,
            weights: w,
            valid: true,
            ranked,
        }
    }
}

/// The token of a row whose [`Selected`] is `sel` (of [`slab_cut`], its
/// ranks in `a`), drawn with `(seed, offset)` as [`topk_topp_sample_f32`]
/// draws from a ranked cut ([`sorted_draw`], `u = uniform_open(
/// row_uniform_bits(seed_key(seed), offset, 0))`): `None` for an invalid
/// row.
///
/// # Safety
/// As [`sorted_draw`], `a.scratch` free once `sel` was made (a block
/// barrier since its last read); `seed` and `offset` are readable.
#[inline(always)]
pub(crate) unsafe fn slab_token(
    sel: &Selected,
    seed: *const u64,
    offset: *const u64,
    a: CutArrays,
) -> Option<u32> {
    if !sel.valid {
        return None;
    }
    // SAFETY: the caller's contract.
    unsafe {
        let u = row_uniform(*seed, *offset);
        Some(sorted_draw(sel.ranked, u, a))
    }
}

/// [`topk_topp_mask_f32`] on the slab route: each row's kept set from the
/// top-k a radix select wrote to its slab ([`slab_select`]; bit-identical
/// to the selection kernels' on the same row), written as
/// [`topk_topp_mask_f32`] writes it (the cut, `from_lists` 0, the kept
/// count and, when `with_mass` is not 0, the kept mass) and the row's
/// weights into its plan slot, so that [`topk_topp_apply_f32`],
/// [`topk_topp_renorm_f32`] or [`topk_topp_kept_count_f32`] and
/// [`topk_topp_kept_write_f32`] follow it with the same `(vocab, batch,
/// ws)`, no other pass before it, or [`topk_topp_slab_apply_f32`] with its
/// slab indices and `kept` (the one the host launches for masking, unless
/// the select masked the rows: see `logits`).
///
/// With `logits` not null (the rows the select masked in place with
/// [`MODE_MASK`](crate::radix_select::MODE_MASK): -inf everywhere but the
/// slab), the kernel also writes -inf over the row's slab entries the cut
/// drops (all of them on an invalid row), which completes the masking.
///
/// # Launch
/// Grid `(batch, 1, 1)`, block [`ROW_THREADS`], [`TOPK_TOPP_SMEM_BYTES`] of
/// dynamic shared memory; row `r = blockIdx.x`.
///
/// # Safety
/// `slab_values` and `slab_indices` hold `batch * RANKED_MAX_K` elements
/// and `slab_counts` `batch`, as the radix select wrote them: row `r`'s
/// count `clamp(top_k[r], 1, min(vocab, RANKED_MAX_K))` and its entries in
/// the total order, NaN turned into -inf; every row's `top_k` is in `1
/// ..= RANKED_MAX_K` and below `vocab`; `top_k`, `top_p`, `min_p`,
/// `temperature` and `kept` hold `batch` elements; `ws` holds
/// [`TopkToppLayout::words`] words for (batch, vocab), used by no other
/// work meanwhile; `logits` is null or holds `batch` writable rows of
/// `vocab` f32 `row_stride` apart; the radix select has completed; no
/// other thread of the device writes them during the launch.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_slab_mask_f32(
    slab_values: *const f32,
    slab_indices: *const u32,
    slab_counts: *const u32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    kept: *mut u32,
    vocab: u32,
    batch: u32,
    ws: *mut u64,
    with_mass: u32,
    logits: *mut f32,
    row_stride: u64,
) {
    pass_start();
    let r = arch::block_idx_x();
    if r >= batch {
        return;
    }
    // Typed as u64 for its 8-byte alignment (f64 and u64 slots).
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    let slab = Slab {
        values: slab_values,
        indices: slab_indices,
        counts: slab_counts,
    };
    // SAFETY: the launch contract covers every access; control flow
    // depends only on block-uniform values.
    unsafe {
        let params = read_params(r as usize, top_k, top_p, min_p, temperature);
        let slots = Slots::new(ws, batch, vocab, r);
        let sel = slab_select(slab, r, params, vocab, smem);
        let (n, mass) = if sel.valid {
            ranked_kept(sel.ranked, with_mass != 0, smem)
        } else {
            (0, 0.0)
        };
        // The renormalising pass reads the weights from the plan slot.
        if arch::thread_idx_x() == 0 {
            (*slots.plan()).plan.weights = sel.weights;
        }
        store_cut(slots, kept.add(r as usize), sel.cut, n, false, mass);
        if !logits.is_null() {
            // The kept set is the slab's first n entries; the select left
            // the row's other elements -inf.
            let row = logits.add(r as usize * row_stride as usize);
            let count = (*slab_counts.add(r as usize)).clamp(1, RANKED_MAX_K);
            let at = r as usize * RANKED_MAX_K as usize;
            let mut q = n + arch::thread_idx_x();
            while q < count {
                *row.add(*slab_indices.add(at + q as usize) as usize) = f32::NEG_INFINITY;
                q += ROW_THREADS;
            }
        }
    }
}

/// [`topk_topp_apply_f32`] on the slab route, after
/// [`topk_topp_slab_mask_f32`]: writes -inf over one chunk's elements
/// outside the row's kept set without reading them. The kept set is the
/// first `kept[r]` entries of the row's slab (the cut is a prefix of the
/// slab's total order), marked in the chunk's bitmap from their indices;
/// kept elements are not written and keep their bits.
///
/// # Launch
/// As [`topk_topp_apply_f32`] (a block per chunk, [`ROW_THREADS`],
/// [`TOPK_TOPP_CHUNK_SMEM_BYTES`]).
///
/// # Safety
/// `logits` holds `batch` writable rows of `vocab` f32 `row_stride` apart;
/// `slab_indices` the slab's `batch * RANKED_MAX_K` indices and `kept`
/// `batch` counts, as [`topk_topp_slab_mask_f32`] of this call (completed)
/// left them; no other thread of the device writes them during the
/// launch.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn topk_topp_slab_apply_f32(
    logits: *mut f32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    slab_indices: *const u32,
    kept: *const u32,
) {
    pass_start();
    let chunks = TopkToppLayout::new(batch, vocab).chunks;
    let b = arch::block_idx_x();
    let (r, c) = (b / chunks, b % chunks);
    if r >= batch {
        return;
    }
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract covers every access: the row's first
    // `kept[r]` (at most RANKED_MAX_K) slab entries, indices below vocab;
    // only elements of the chunk marked and written.
    unsafe {
        let row = logits.add(r as usize * row_stride as usize);
        let chunk = Row::chunk(Row::whole(row, vocab), c);
        let bits = cleared_bitmap(smem);
        let n = (*kept.add(r as usize)).min(RANKED_MAX_K);
        let indices = slab_indices.add(r as usize * RANKED_MAX_K as usize);
        let mut j = arch::thread_idx_x();
        while j < n {
            let i = *indices.add(j as usize);
            if i.wrapping_sub(chunk.base) < chunk.n {
                mark_bit(bits, chunk, i);
            }
            j += ROW_THREADS;
        }
        arch::bar_sync();
        mask_unmarked(chunk, bits);
    }
}

/// [`topk_topp_sample_f32`] on the slab route: each row's token drawn from
/// the kept set of [`slab_select`] as [`topk_topp_sample_f32`] draws it
/// from a ranked cut ([`sorted_draw`], `u = uniform_open(row_uniform_bits(
/// seed_key(seed), offset, 0))`): the same token on the same row. `valid =
/// 0` and token 0 for a row with nothing finite and no +inf.
///
/// # Launch
/// As [`topk_topp_slab_mask_f32`].
///
/// # Safety
/// As [`topk_topp_slab_mask_f32`], with `seed`, `offset`, `tokens` and
/// `valid` (`batch` elements each) instead of `kept` and `ws`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_slab_sample_f32(
    slab_values: *const f32,
    slab_indices: *const u32,
    slab_counts: *const u32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    vocab: u32,
    batch: u32,
) {
    pass_start();
    let r = arch::block_idx_x();
    if r >= batch {
        return;
    }
    // Typed as u64 for its 8-byte alignment (f64 and u64 slots).
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    let slab = Slab {
        values: slab_values,
        indices: slab_indices,
        counts: slab_counts,
    };
    // SAFETY: the launch contract covers every access; control flow
    // depends only on block-uniform values.
    unsafe {
        let params = read_params(r as usize, top_k, top_p, min_p, temperature);
        let sel = slab_select(slab, r, params, vocab, smem);
        let r = r as usize;
        let token = slab_token(&sel, seed.add(r), offset.add(r), sorted_arrays(smem));
        store_token(tokens.add(r), valid.add(r), token, vocab);
    }
}

// ---------------------------------------------------------------------------
// One launch per call: a thread block cluster per row.
// ---------------------------------------------------------------------------

/// This block's rank in its row's cluster and the cluster's size (a
/// cluster of one before sm_90, where the host launches no larger one).
#[inline(always)]
fn row_cluster() -> (u32, u32) {
    #[cfg(target_feature = "sm_90")]
    {
        (arch::cluster_ctarank(), arch::cluster_nctarank())
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        (0, 1)
    }
}

/// A barrier over the row's cluster: every block's global-memory writes
/// before it are visible to every block of the cluster after it (release
/// and acquire at cluster scope, one fence a block:
/// [`arch::cluster_sync_cumulative`]; a block barrier in a cluster of one).
#[inline(always)]
fn row_cluster_sync() {
    #[cfg(target_feature = "sm_90")]
    arch::cluster_sync_cumulative();
    #[cfg(not(target_feature = "sm_90"))]
    arch::bar_sync();
}

/// A row's place in a cluster kernel: this block's `rank` of the `size`
/// blocks of the row's cluster, the row `r`, its logits and its slots.
#[derive(Clone, Copy)]
struct ClusterRow {
    rank: u32,
    size: u32,
    r: u32,
    row: Row,
    slots: Slots,
}

/// The cluster kernels' common start: this block's [`ClusterRow`], then
/// the statistics of its chunks (`rank`, `rank + size`, ...), the row's
/// plan under `params(r)` (every block computes it from the merged
/// statistics, the same bits; the first block also writes it to the row's
/// slot for the selection), then the pre-filter of its chunks, each step
/// after a barrier over the cluster. On return every partial the
/// selection reads is visible to the whole cluster.
///
/// # Safety
/// As [`block_reduce`] and [`Row::scan`]; every block of the cluster calls
/// it; the launch contract of the cluster kernels holds.
#[inline(always)]
unsafe fn cluster_start(
    logits: *const f32,
    row_stride: u64,
    vocab: u32,
    batch: u32,
    ws: *mut u64,
    params: impl FnOnce(usize) -> Params,
    smem: *mut u8,
) -> ClusterRow {
    pass_start();
    let (rank, size) = row_cluster();
    let r = arch::block_idx_x() / size.max(1);
    // SAFETY: the caller's contract (row r of the batch).
    let row = Row::whole(
        unsafe { logits.add(r as usize * row_stride as usize) },
        vocab,
    );
    let slots = Slots::new(ws, batch, vocab, r);
    let params = params(r as usize);
    let chunks = slots.lay.chunks;
    // SAFETY: forwarded; control flow depends only on the row's merged
    // statistics and plan (uniform over the cluster).
    unsafe {
        let shift = RowStats::shift_of(*row.ptr);
        let mut c = rank;
        while c < chunks {
            stats_chunk(row, c, shift, slots, smem);
            c += size;
        }
        row_cluster_sync();
        let stats = merged_stats(slots, smem);
        let plan = row_plan(&stats, shift, row.n, params);
        if rank == 0 && arch::thread_idx_x() == 0 {
            *slots.plan() = plan;
        }
        let mut c = rank;
        while c < chunks {
            filter_chunk(row, c, plan, slots, smem);
            c += size;
        }
        row_cluster_sync();
    }
    ClusterRow {
        rank,
        size,
        r,
        row,
        slots,
    }
}

/// [`topk_topp_mask_f32`] and [`topk_topp_apply_f32`] in one launch, a
/// thread block cluster per row: the blocks of a row's cluster share its
/// chunks (`rank`, `rank + size`, ...) for the statistics, the pre-filter
/// and the masking writes, each step after a barrier over the cluster, and
/// its first block runs the selection. The same results as the chunked
/// passes (the same partials, merged in the same order).
///
/// # Launch
/// Grid `(batch * size, 1, 1)` in clusters of `size` (1 to 16) blocks of
/// [`ROW_THREADS`], [`TOPK_TOPP_SMEM_BYTES`] of dynamic shared memory.
///
/// # Safety
/// See the module docs (the parameters of the plan kernel too); no other
/// kernel of the call.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_cluster_mask_f32(
    logits: *mut f32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    kept: *mut u32,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract covers every access; control flow
    // depends only on the rank and on cluster-merged values (uniform over
    // each block).
    unsafe {
        let c = cluster_start(
            logits,
            row_stride,
            vocab,
            batch,
            ws,
            |r| read_params(r, top_k, top_p, min_p, temperature),
            smem,
        );
        let view = refine::<false>(c.row, c.slots, c.rank, c.size, smem);
        if c.rank == 0 {
            mask_row(c.row, c.slots, view, kept.add(c.r as usize), false, smem);
        }
        row_cluster_sync();
        let mut chunk = c.rank;
        while chunk < c.slots.lay.chunks {
            apply_chunk(
                logits.add(c.r as usize * row_stride as usize),
                vocab,
                chunk,
                c.slots,
                smem,
            );
            chunk += c.size;
        }
    }
}

/// [`topk_topp_sample_f32`] and the passes before it in one launch, a
/// thread block cluster per row (as [`topk_topp_cluster_mask_f32`]; the
/// first block of the row's cluster draws the token).
///
/// # Launch
/// As [`topk_topp_cluster_mask_f32`].
///
/// # Safety
/// See the module docs (the parameters of the plan kernel too); no other
/// kernel of the call.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_cluster_sample_f32(
    logits: *const f32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    vocab: u32,
    row_stride: u64,
    batch: u32,
    ws: *mut u64,
) {
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: as `topk_topp_cluster_mask_f32`.
    unsafe {
        let c = cluster_start(
            logits,
            row_stride,
            vocab,
            batch,
            ws,
            |r| read_params(r, top_k, top_p, min_p, temperature),
            smem,
        );
        let view = refine::<false>(c.row, c.slots, c.rank, c.size, smem);
        if c.rank == 0 {
            let r = c.r as usize;
            sample_row(
                c.row,
                c.slots,
                view,
                *seed.add(r),
                *offset.add(r),
                tokens.add(r),
                valid.add(r),
                smem,
            );
        }
    }
}
