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
//! This first version keeps it simple: **one block per row** (several
//! blocks per row for small batches is the next step) and **every pass
//! re-reads the row from global memory** (mostly from L2); compacting the
//! pre-filter survivors into shared memory so that the pivot rounds touch
//! only them is the step after.
//!
//! Two kernels share the selection:
//! - [`topk_topp_mask_f32`] writes -inf in place over every logit outside
//!   the kept set (vLLM semantics) and the kept count per row;
//! - [`topk_topp_sample_f32`] draws one token per row from the kept set
//!   renormalised, by inverse CDF in the total order (value desc, index
//!   asc) with `u = uniform_open(row_uniform_bits(seed_key(seed), offset,
//!   0))`, found by one more pivot search over the kept set's cumulative
//!   mass.
//!
//! # Launch
//! Grid `(batch, 1, 1)`, block [`ROW_THREADS`] (exactly), dynamic shared
//! memory [`TOPK_TOPP_SMEM_BYTES`].
//!
//! # Safety (caller)
//! `logits` holds `batch` rows `row_stride` elements apart with `vocab`
//! readable (and, for the mask kernel, writable) elements each, `vocab >=
//! 1`; `top_k`, `top_p`, `min_p`, `temperature` (and `seed`, `offset`,
//! `tokens`, `valid`, or `kept`) hold `batch` elements; no other thread
//! of the device writes them during the launch.

use crate::arch;
use crate::block;
use crate::noise;
use crate::params::{ROW_THREADS, TOPK_TOPP_SEGMENT, TOPK_TOPP_SMEM_BYTES};
use crate::philox;
use crate::pivot::{
    Cut, Found, Measure, Pivots, Plan, QuadAcc, QuadSearch, RowParams, RowStats, Weights,
    index_key, top_p_ties,
};
use crate::radix::{f32_from_key, f32_key};

/// Warps of a block.
const WARPS: usize = (ROW_THREADS / 32) as usize;

/// Bytes of reduction slots at the start of the dynamic shared memory: one
/// slot per warp of the largest reduced type ([`QuadAcc<f64>`], 80 bytes).
const REDUCE_BYTES: usize = 1024;
/// Candidates per warp segment of the compacted list.
const SEG: u32 = TOPK_TOPP_SEGMENT;

const _: () = assert!(core::mem::size_of::<QuadAcc<f64>>() * WARPS <= REDUCE_BYTES);
const _: () = assert!(core::mem::size_of::<Tiers>() * WARPS <= REDUCE_BYTES);
const _: () = assert!((WARPS + 1) * 8 <= REDUCE_BYTES);
const _: () =
    assert!(REDUCE_BYTES + WARPS * SEG as usize * 8 + WARPS * 4 <= TOPK_TOPP_SMEM_BYTES as usize);

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
}

impl ShflMeasure for u32 {
    #[inline(always)]
    fn shfl(self, m: u32) -> u32 {
        arch::shfl_bfly_u32(self, m)
    }
}

impl ShflMeasure for f64 {
    #[inline(always)]
    fn shfl(self, m: u32) -> f64 {
        shfl_f64(self, m)
    }
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
}

/// Count, key range and softmax mass of a set of elements (a pre-filter
/// tier, the top-k survivors, the kept set).
#[derive(Clone, Copy)]
struct Group {
    n: u32,
    min: u32,
    max: u32,
    mass: f64,
}

impl Group {
    const EMPTY: Group = Group {
        n: 0,
        min: u32::MAX,
        max: 0,
        mass: 0.0,
    };

    #[inline(always)]
    fn add(&mut self, key: u32, w: f64) {
        self.n = self.n.wrapping_add(1);
        if key < self.min {
            self.min = key;
        }
        if key > self.max {
            self.max = key;
        }
        self.mass += w;
    }

    /// [`Group::add`] when `on`, else nothing, without a branch.
    #[inline(always)]
    fn add_if(&mut self, on: bool, key: u32, w: f64) {
        self.n = self.n.wrapping_add(u32::from(on));
        let (lo, hi) = if on { (key, key) } else { (u32::MAX, 0) };
        if lo < self.min {
            self.min = lo;
        }
        if hi > self.max {
            self.max = hi;
        }
        self.mass += if on { w } else { 0.0 };
    }

    #[inline(always)]
    fn join(self, o: Group) -> Group {
        Group {
            n: self.n.wrapping_add(o.n),
            min: if o.min < self.min { o.min } else { self.min },
            max: if o.max > self.max { o.max } else { self.max },
            mass: self.mass + o.mass,
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
}

/// The pre-filter's three tiers: keys `>= t1`, in `[t2, t1)`, below `t2`
/// (min-p survivors only). Three named fields rather than an array indexed
/// by the tier, which would live in local memory.
#[derive(Clone, Copy)]
struct Tiers {
    g1: Group,
    g2: Group,
    g3: Group,
}

impl Reduce for Tiers {
    #[inline(always)]
    fn shfl(&self, m: u32) -> Self {
        Tiers {
            g1: self.g1.shfl(m),
            g2: self.g2.shfl(m),
            g3: self.g3.shfl(m),
        }
    }
    #[inline(always)]
    fn merge_with(&mut self, o: &Self) {
        self.g1.merge_with(&o.g1);
        self.g2.merge_with(&o.g2);
        self.g3.merge_with(&o.g3);
    }
}

/// The block-wide merge of every thread's `v`, returned to every thread:
/// a butterfly within each warp, then warps 0, 1, ..., in this order. The
/// same inputs give the same bits on every launch.
///
/// # Safety
/// Every thread of the block calls it (uniform control flow); `smem`
/// points to `WARPS` slots of `T` in shared memory no one else uses
/// meanwhile.
#[inline(always)]
unsafe fn block_reduce<T: Reduce>(v: T, smem: *mut T) -> T {
    let tid = arch::thread_idx_x();
    let mut v = v;
    let mut m = 16;
    while m > 0 {
        let o = v.shfl(m);
        v.merge_with(&o);
        m >>= 1;
    }
    // SAFETY: slots below WARPS (caller's contract); barriers separate the
    // writes from the reads and the reads from the next call's writes.
    unsafe {
        if tid.is_multiple_of(32) {
            *smem.add((tid / 32) as usize) = v;
        }
        arch::bar_sync();
        let mut r = *smem;
        let mut w = 1;
        while w < WARPS {
            r.merge_with(&*smem.add(w));
            w += 1;
        }
        arch::bar_sync();
        r
    }
}

// ---------------------------------------------------------------------------
// The selection.
// ---------------------------------------------------------------------------

/// One row: its logits and length.
#[derive(Clone, Copy)]
struct Row {
    ptr: *const f32,
    n: u32,
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
        let tid = arch::thread_idx_x();
        let mut visit4 = |ok: bool, j: u32, q: [f32; 4]| {
            f(ok, f32_key(q[0].to_bits()), j, q[0]);
            f(ok, f32_key(q[1].to_bits()), j + 1, q[1]);
            f(ok, f32_key(q[2].to_bits()), j + 2, q[2]);
            f(ok, f32_key(q[3].to_bits()), j + 3, q[3]);
        };
        // SAFETY: every load is of an index below n (caller's contract).
        unsafe {
            if (self.ptr as usize).is_multiple_of(16) && self.n.is_multiple_of(4) {
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
                    visit4(v[0] < nv, 4 * v[0], q[0]);
                    visit4(v[1] < nv, 4 * v[1], q[1]);
                    visit4(v[2] < nv, 4 * v[2], q[2]);
                    visit4(v[3] < nv, 4 * v[3], q[3]);
                    visit4(v[4] < nv, 4 * v[4], q[4]);
                    visit4(v[5] < nv, 4 * v[5], q[5]);
                    visit4(v[6] < nv, 4 * v[6], q[6]);
                    visit4(v[7] < nv, 4 * v[7], q[7]);
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
                    f(ok, f32_key(x.to_bits()), j, x);
                    base = match base.checked_add(ROW_THREADS) {
                        Some(b) => b,
                        None => break,
                    };
                }
            }
        }
    }
}

/// The pre-filter's candidates compacted into shared memory: one segment
/// of up to [`SEG`] (key, index) pairs per warp, in the warp's scan order,
/// and the elements with `key >= floor` of them are the candidates.
#[derive(Clone, Copy)]
struct List {
    keys: *mut u32,
    idx: *mut u32,
    counts: *mut u32,
    floor: u32,
}

impl List {
    /// The list's place in the dynamic shared memory `smem`.
    #[inline(always)]
    fn at(smem: *mut u8) -> List {
        // SAFETY: offsets inside TOPK_TOPP_SMEM_BYTES (const asserts).
        unsafe {
            let keys = smem.add(REDUCE_BYTES) as *mut u32;
            let idx = keys.add(WARPS * SEG as usize);
            List {
                keys,
                idx,
                counts: idx.add(WARPS * SEG as usize),
                floor: 0,
            }
        }
    }
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
    /// As [`Row::scan`]; with a list, the compaction is complete and
    /// visible to the block (a barrier since).
    #[inline(always)]
    unsafe fn for_each(&self, mut f: impl FnMut(u32, u32, f32)) {
        // SAFETY: forwarded; list reads stay below each segment's count.
        unsafe {
            match self.list {
                Some(l) => {
                    let mut w = 0;
                    while w < WARPS {
                        let c = *l.counts.add(w);
                        let seg = w * SEG as usize;
                        let mut p = arch::thread_idx_x();
                        while p < c {
                            let key = *l.keys.add(seg + p as usize);
                            if key >= l.floor {
                                f(
                                    key,
                                    *l.idx.add(seg + p as usize),
                                    f32::from_bits(f32_from_key(key)),
                                );
                            }
                            p += ROW_THREADS;
                        }
                        w += 1;
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
struct Params {
    top_k: u32,
    top_p: f32,
    min_p: f32,
    temperature: f32,
}

/// The result of [`select`].
#[derive(Clone, Copy)]
struct Selected {
    cut: Cut,
    weights: Weights,
    valid: bool,
}

/// The kept prefix of a row: [`crate::pivot::select_row`] with the
/// pre-filter on, pass by pass over the block.
///
/// # Safety
/// As [`run_search`].
#[inline(always)]
unsafe fn select(row: Row, params: Params, smem: *mut u8) -> (Selected, Source) {
    let n = row.n;
    // SAFETY: the caller's contract covers every pass; all control flow
    // below depends only on block-reduced values, so it is uniform.
    unsafe {
        // Pass 1: statistics.
        let shift = RowStats::shift_of(if n > 0 { *row.ptr } else { 0.0 });
        let mut st = RowStats::EMPTY;
        row.scan(|ok, _, _, x| {
            if ok {
                st.add(x, shift)
            }
        });
        let stats = block_reduce(st, smem as *mut RowStats);
        let none = Selected {
            cut: Cut::NONE,
            weights: Weights::new(f32::NEG_INFINITY, 1.0, 0.0),
            valid: false,
        };
        if !stats.is_valid() {
            return (none, Source { row, list: None });
        }
        let plan = Plan::new(
            &stats,
            shift,
            n,
            &RowParams {
                top_k: params.top_k,
                top_p: params.top_p,
                min_p: params.min_p,
                temperature: params.temperature,
                prefilter: true,
            },
        );
        let Plan {
            k,
            topk,
            top_p,
            topp,
            weights: w,
            t1,
            t2,
            ..
        } = plan;

        // Pass 2: min-p's survivors by tier, and those of the first tier
        // (the usual candidates) compacted into the list, each warp into its own segment in
        // its scan order (ballots: no atomics, so the order and every later
        // sum are the same on every launch).
        let mass_needed = topp && !topk;
        let mut tiers = Tiers {
            g1: Group::EMPTY,
            g2: Group::EMPTY,
            g3: Group::EMPTY,
        };
        let mut list = List::at(smem);
        let lane = arch::thread_idx_x() % 32;
        let warp = (arch::thread_idx_x() / 32) as usize;
        let mut listed = 0u32;
        row.scan(|ok, key, i, x| {
            let keep = ok && w.min_p_keeps(x);
            let put = keep && key >= t1;
            let votes = arch::ballot(put);
            if put {
                let at = listed + (votes & ((1u32 << lane) - 1)).count_ones();
                if at < SEG {
                    let slot = warp * SEG as usize + at as usize;
                    *list.keys.add(slot) = key;
                    *list.idx.add(slot) = i;
                }
            }
            listed = listed.saturating_add(votes.count_ones());
            if !keep {
                return;
            }
            let wx = if mass_needed {
                f64::from(w.weight(x))
            } else {
                0.0
            };
            // The CPU driver's tier index; branch-free, since a branch per
            // tier made LLVM select a pointer to the tier's mass, which put
            // the tiers in local memory.
            let tier = u32::from(key < t1) + u32::from(key < t2);
            tiers.g1.add_if(tier == 0, key, wx);
            tiers.g2.add_if(tier == 1, key, wx);
            tiers.g3.add_if(tier == 2, key, wx);
        });
        if lane == 0 {
            *list.counts.add(warp) = listed;
        }
        // (The reduction's barriers publish the list and the counts.)
        let tiers = block_reduce(tiers, smem as *mut Tiers);
        let (s1, s2) = (tiers.g1, tiers.g1.join(tiers.g2));
        let all = s2.join(tiers.g3);
        let total_mass = all.mass;
        let target_p = f64::from(top_p) * total_mass;
        let enough = |g: Group| {
            g.n == all.n
                || if topk {
                    g.n >= k
                } else {
                    topp && g.mass >= target_p * (1.0 + 1.0e-9)
                }
        };
        let (floor, cand) = if enough(s1) {
            (t1, s1)
        } else if enough(s2) {
            (t2, s2)
        } else {
            (0, all)
        };
        let is_cand = move |key: u32, x: f32| key >= floor && w.min_p_keeps(x);
        // The list holds every candidate when the floor is the first
        // tier's threshold and no segment overflowed (a second-tier or
        // fallback floor reads the row).
        let mut fits = floor >= t1;
        let mut v = 0;
        while v < WARPS {
            fits &= *list.counts.add(v) <= SEG;
            v += 1;
        }
        list.floor = floor;
        let src = Source {
            row,
            list: if fits { Some(list) } else { None },
        };

        // Top-k.
        let mut cut = Cut::at_least(cand.min);
        if topk && cand.n > k {
            let search = QuadSearch::<u32>::new(k, cand.min, cand.max, cand.n, cand.n, true);
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
            },
            src,
        )
    }
}

/// Per-row parameters.
///
/// # Safety
/// Each pointer holds at least `r + 1` elements.
#[inline(always)]
unsafe fn read_params(
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

/// Masks every logit of a row outside its kept set to -inf, in place, and
/// writes the kept count (0 for a row with nothing finite and no +inf,
/// whose every entry becomes -inf). Kept entries keep their bits.
///
/// # Launch
/// See the module docs.
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_mask_f32(
    logits: *mut f32,
    top_k: *const u32,
    top_p: *const f32,
    min_p: *const f32,
    temperature: *const f32,
    kept: *mut u32,
    vocab: u32,
    row_stride: u64,
) {
    let r = arch::block_idx_x() as usize;
    // Typed as u64 for its 8-byte alignment (f64 and u64 slots).
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let ptr = logits.add(r * row_stride as usize);
        let row = Row {
            ptr: ptr as *const f32,
            n: vocab,
        };
        let params = read_params(r, top_k, top_p, min_p, temperature);
        let (sel, _) = select(row, params, smem);
        // Every thread has finished reading the row (the last reduction in
        // `select` ends with a barrier); each now rewrites its own elements.
        let cut = sel.cut;
        let mut g = Group::EMPTY;
        row.scan(|ok, key, j, _| {
            if ok {
                if cut.keeps(key, j) {
                    g.n += 1;
                } else {
                    *ptr.add(j as usize) = f32::NEG_INFINITY;
                }
            }
        });
        let g = block_reduce(g, smem as *mut Group);
        if arch::thread_idx_x() == 0 {
            *kept.add(r) = g.n;
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
/// See the module docs.
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn topk_topp_sample_f32(
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
) {
    let r = arch::block_idx_x() as usize;
    let tid = arch::thread_idx_x();
    // Typed as u64 for its 8-byte alignment (f64 and u64 slots).
    let smem = arch::dynamic_shared::<u64>() as *mut u8;
    // SAFETY: the launch contract in the module docs covers every access;
    // control flow depends only on block-reduced values (uniform).
    unsafe {
        let row = Row {
            ptr: logits.add(r * row_stride as usize),
            n: vocab,
        };
        let params = read_params(r, top_k, top_p, min_p, temperature);
        let (sel, src) = select(row, params, smem);
        if !sel.valid {
            if tid == 0 {
                *tokens.add(r) = 0;
                *valid.add(r) = 0;
            }
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
        let u = noise::uniform_open(philox::row_uniform_bits(
            philox::seed_key(*seed.add(r)),
            *offset.add(r),
            0,
        ));
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
        if tid == 0 {
            *tokens.add(r) = if token < vocab { token } else { 0 };
            *valid.add(r) = 1;
        }
    }
}
