//! `sampling_from_logits`: one token per row of a `[batch, vocab]` logits
//! tensor by Gumbel-max, `argmax_j x_j / T + G_j`, with `G_j` the Gumbel noise
//! of the row's Philox stream at (seed, offset, j).
//!
//! Entry points `sampling_from_logits_{f32,bf16}` and, for splits whose
//! blocks take more than one round of loads
//! ([`crate::params::sampling_seeded`]), `sampling_from_logits_seeded_*`,
//! which first raise every thread's filter to the block's best approximate
//! score among a few tokens (same tokens, same bits) and stage their rounds
//! in shared memory ([`crate::params::SAMPLING_STAGES`]); the others load
//! their one round into registers. `sampling_from_logits_wide_*` are the
//! seeded kernels for grids of one wave of them (the host's choice), built
//! for [`crate::params::SAMPLING_WIDE_BLOCKS_PER_SM`] blocks a
//! multiprocessor, whose threads make four groups' Philox calls at a time.
//!
//! # Launch
//! Grid `(split.ctas_per_row, split.batch)`, block [`ROW_THREADS`], dynamic
//! shared memory (16-byte aligned) [`crate::params::SAMPLING_SMEM_BYTES`]
//! for the seeded and wide kernels, `(2 * ROW_THREADS / 32 + 2) * 8` bytes for the
//! others. With more than one block
//! per row, each block's thread 0 folds the block's best key into
//! `keys[row]` (an atomic maximum) and takes an acq_rel ticket on
//! `counters[row]`; the last one takes the row's key, writes the token and
//! resets both words to 0. Every thread first executes
//! `griddepcontrol.wait`, so on sm_90 the host may launch the kernel with a
//! programmatic dependency on the stream's previous kernel (its blocks
//! start while that kernel drains and touch no memory before it has
//! completed). They do not trigger their own dependents early: a trigger at
//! the start made graph-replayed calls at B = 1 slower (session 43).
//!
//! # Safety (caller)
//! `logits` holds `batch` rows of `split.row_stride` elements with `vocab`
//! readable; `temperature`, `seed`, `offset`, `tokens`, `valid`, `keys` and
//! `counters` hold `batch` elements; `keys` and `counters` are zero before
//! the launch (every launch leaves them zero); `ctas_per_row <= ROW_THREADS`;
//! no other launch uses `keys` or `counters` at the same time.

use crate::arch;
use crate::block;
use crate::float16::bf16_to_f32;
use crate::noise;
use crate::params::{
    ROW_THREADS, RowSplit, SAMPLING_ROUND_VECTORS, SAMPLING_STAGE_OFFSET, SAMPLING_STAGES,
};
use crate::race::Race;
use crate::sample;

/// Loads of one element type: 16-byte vectors of `LANES` elements.
trait Elem {
    const LANES: u32;
    /// Visits the `LANES` tokens of a loaded vector starting at token `j`.
    fn visit_vec(v: [u32; 4], j: u32, race: &mut Race);
    /// Visits a thread's round of four vectors, vector `i` read by `v(i)`
    /// and starting at token `j[i]`, ignored unless `valid[i]`, four
    /// groups' Philox calls at a time ([`Race::visit16`]).
    fn visit_round(v: impl Fn(u32) -> [u32; 4], j: [u32; 4], valid: [bool; 4], race: &mut Race);
    /// The largest logit of a loaded vector starting at token `j`, and its
    /// token (NaN never chosen; -inf with token `j` when every logit is NaN
    /// or -inf).
    fn max_token(v: [u32; 4], j: u32) -> (f32, u32);
    /// # Safety
    /// `p` points to one readable element.
    unsafe fn load1(p: *const u8) -> f32;
    const BYTES: usize;
}

struct F32;
struct Bf16;

impl Elem for F32 {
    const LANES: u32 = 4;
    const BYTES: usize = 4;
    #[inline(always)]
    fn visit_vec(v: [u32; 4], j: u32, race: &mut Race) {
        let x = [
            f32::from_bits(v[0]),
            f32::from_bits(v[1]),
            f32::from_bits(v[2]),
            f32::from_bits(v[3]),
        ];
        race.visit4(x, j);
    }
    #[inline(always)]
    fn visit_round(v: impl Fn(u32) -> [u32; 4], j: [u32; 4], valid: [bool; 4], race: &mut Race) {
        race.visit16(|i| v(i as u32).map(f32::from_bits), j, valid);
    }
    #[inline(always)]
    fn max_token(v: [u32; 4], j: u32) -> (f32, u32) {
        let mut best = (f32::NEG_INFINITY, j);
        for (i, &w) in v.iter().enumerate() {
            let x = f32::from_bits(w);
            if x > best.0 {
                best = (x, j + i as u32);
            }
        }
        best
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: caller's contract.
        f32::from_bits(unsafe { arch::ld_global_nc_u32(p as *const u32) })
    }
}

impl Elem for Bf16 {
    const LANES: u32 = 8;
    const BYTES: usize = 2;
    #[inline(always)]
    fn visit_vec(v: [u32; 4], j: u32, race: &mut Race) {
        race.visit4(widen4(v[0], v[1]), j);
        race.visit4(widen4(v[2], v[3]), j + 4);
    }
    #[inline(always)]
    fn visit_round(v: impl Fn(u32) -> [u32; 4], j: [u32; 4], valid: [bool; 4], race: &mut Race) {
        race.visit16(
            |i| {
                let w = v(i as u32);
                widen4(w[0], w[1])
            },
            j,
            valid,
        );
        race.visit16(
            |i| {
                let w = v(i as u32);
                widen4(w[2], w[3])
            },
            [j[0] + 4, j[1] + 4, j[2] + 4, j[3] + 4],
            valid,
        );
    }
    #[inline(always)]
    fn max_token(v: [u32; 4], j: u32) -> (f32, u32) {
        let mut best = (f32::NEG_INFINITY, j);
        for (i, &w) in v.iter().enumerate() {
            // Halves by index: an array of the two taken by value would
            // keep its iterator in local memory.
            for h in 0..2 {
                let x = bf16_to_f32((w >> (16 * h)) as u16);
                if x > best.0 {
                    best = (x, j + 2 * i as u32 + h);
                }
            }
        }
        best
    }
    #[inline(always)]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: caller's contract.
        bf16_to_f32(unsafe { arch::ld_global_nc_u16(p as *const u16) })
    }
}

/// The four bf16 logits of two words, low half first.
#[inline(always)]
fn widen4(w0: u32, w1: u32) -> [f32; 4] {
    [
        bf16_to_f32(w0 as u16),
        bf16_to_f32((w0 >> 16) as u16),
        bf16_to_f32(w1 as u16),
        bf16_to_f32((w1 >> 16) as u16),
    ]
}

/// Vectors a thread loads a round.
const UNROLL: u32 = SAMPLING_ROUND_VECTORS;

/// One round of a thread's vectors into registers: `UNROLL` (4) 16-byte
/// loads `ROW_THREADS` vectors apart from vector `v`, those at or past
/// `nvec` not issued (zeros). Written out: an indexed loop left the array
/// in local memory.
///
/// # Safety
/// `vec_ptr(i)` is a readable 16-byte aligned address for every `i < nvec`.
#[inline(always)]
unsafe fn load_round(
    v: u32,
    nvec: u32,
    vec_ptr: impl Fn(u32) -> *const u32,
) -> [[u32; 4]; UNROLL as usize] {
    let load = |i: u32| {
        let vi = v + i * ROW_THREADS;
        if vi < nvec {
            // SAFETY: vi < nvec (caller's contract).
            unsafe { arch::ld_global_nc_v4_u32(vec_ptr(vi)) }
        } else {
            [0; 4]
        }
    };
    [load(0), load(1), load(2), load(3)]
}

/// Bytes between a thread's consecutive slots of a stage: the block's
/// threads' slots of one vector are consecutive (conflict-free 16-byte
/// shared loads).
const SLOT_STRIDE: u32 = ROW_THREADS * 16;
/// Bytes of one stage: a round of every thread's vectors.
const STAGE_BYTES: u32 = UNROLL * SLOT_STRIDE;

/// Starts one round of a thread's vectors into its slots of a stage:
/// `UNROLL` (4) 16-byte `cp.async` copies `ROW_THREADS` vectors apart from
/// vector `v`, those at or past `nvec` not issued, as one commit group
/// (empty past the chunk). Staged in shared memory, a round in flight holds
/// no registers: the kernels keep two rounds ahead at four blocks a
/// multiprocessor, where three blocks held one round ahead in registers.
///
/// # Safety
/// `vec_ptr(i)` is a readable 16-byte aligned address for every `i < nvec`;
/// `slots` is the thread's first slot of a stage that no pending copy or
/// unfinished read uses.
#[inline(always)]
unsafe fn copy_round(v: u32, nvec: u32, vec_ptr: impl Fn(u32) -> *const u32, slots: u32) {
    let copy = |i: u32| {
        let vi = v + i * ROW_THREADS;
        if vi < nvec {
            // SAFETY: vi < nvec (caller's contract); the slot is the
            // thread's own.
            unsafe { arch::cp_async_cg_16(slots + i * SLOT_STRIDE, vec_ptr(vi) as *const u8, 16) };
        }
    };
    copy(0);
    copy(1);
    copy(2);
    copy(3);
    arch::cp_async_commit_group();
}

/// Visits vector `v` of the chunk starting at token `lo` from its slot at
/// shared address `slot`, unless `v` is past the chunk (`nvec` vectors).
///
/// # Safety
/// When `v < nvec`, the slot holds the vector (its copy completed).
#[inline(always)]
unsafe fn visit_slot<E: Elem>(slot: u32, v: u32, nvec: u32, lo: u32, race: &mut Race) {
    if v < nvec {
        // SAFETY: the caller's contract.
        let x = unsafe { arch::ld_shared_v4_u32(slot) };
        E::visit_vec(x, lo + v * E::LANES, race);
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn sampling_from_logits<E: Elem, const SEEDED: bool, const WIDE: bool>(
    logits: *const u8,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    keys: *mut u64,
    counters: *mut u32,
    split: RowSplit,
) {
    // Before any memory access (see the module docs' launch section).
    arch::griddepcontrol_wait();
    let tid = arch::thread_idx_x();
    let c = arch::block_idx_x();
    let row = arch::block_idx_y();
    let smem = arch::dynamic_shared::<u64>();
    // SAFETY: the launch contract in the module docs covers every access.
    unsafe {
        let r = row as usize;
        let lo = c * split.chunk;
        let hi = if lo + split.chunk < split.vocab {
            lo + split.chunk
        } else {
            split.vocab
        };
        let row_ptr = logits.add(r * split.row_stride as usize * E::BYTES);
        let lanes = E::LANES;
        let aligned = (row_ptr as usize) % 16 == 0 && split.vocab % lanes == 0;
        // Chunks are multiples of 8 elements: every block starts aligned.
        let nvec = if aligned { (hi - lo) / lanes } else { 0 };
        let vec_ptr = |vi: u32| row_ptr.add((lo + vi * lanes) as usize * E::BYTES) as *const u32;
        // The first loads go out before anything waits (the row's
        // parameters, the barrier below). The seeded kernels (blocks of
        // several rounds) stage their rounds in shared memory, stage `s` of
        // thread `tid` at `slots(s)`; the others (one round a block at the
        // host's splits: small batches, where that round's latency is the
        // kernel's) load theirs straight into registers, 0.3 us sooner at B
        // = 1 than through a stage.
        let slots0 = arch::smem_addr(smem) + SAMPLING_STAGE_OFFSET + tid * 16;
        let slots = |stage: u32| slots0 + stage * STAGE_BYTES;
        let mut first = [[0; 4]; UNROLL as usize];
        if SEEDED {
            let mut s = 0;
            while s + 1 < SAMPLING_STAGES {
                copy_round(tid + s * UNROLL * ROW_THREADS, nvec, vec_ptr, slots(s));
                s += 1;
            }
        } else {
            first = load_round(tid, nvec, vec_ptr);
        }
        let mut race = Race::new(*temperature.add(r), *seed.add(r), *offset.add(r));
        // The block's running best approximate score, shared after every
        // round but the last so that each thread filters against the whole
        // block's tokens, not just its own.
        let shared_top = arch::smem_addr(smem.add((ROW_THREADS / 32 + 2) as usize));
        if tid == 0 {
            *(smem.add((ROW_THREADS / 32 + 2) as usize) as *mut u32) = 0;
        }
        arch::bar_sync();
        if aligned && !SEEDED {
            // Rounds of UNROLL vectors per thread, uniform over the block
            // (the sharing needs whole warps); vectors past the chunk are
            // neither loaded nor visited. (More than one only at splits the
            // host does not make.)
            let mut base = 0;
            let mut round = first;
            loop {
                let [a, b, c, d] = round;
                let mut visit = |x: [u32; 4], i: u32| {
                    let v = base + tid + i * ROW_THREADS;
                    if v < nvec {
                        E::visit_vec(x, lo + v * lanes, &mut race);
                    }
                };
                visit(a, 0);
                visit(b, 1);
                visit(c, 2);
                visit(d, 3);
                base += UNROLL * ROW_THREADS;
                if base >= nvec {
                    break;
                }
                round = load_round(base + tid, nvec, vec_ptr);
                if !race.is_greedy() {
                    race.raise(block::block_running_max_f32(race.top_score(), shared_top));
                }
            }
        } else if aligned {
            // The same rounds, staged.
            let mut base = 0;
            // The stage of the round being visited.
            let mut stage = 0;
            // The seeded kernels (for blocks of several rounds) first seed
            // every thread's filter with the best approximate score among
            // its block's largest logits of each thread's first round
            // (one Philox call a thread, one barrier): otherwise each
            // thread's threshold starts from its own first tokens and the
            // first round visits most of them. (A separate kernel: the
            // code made the one-round blocks of small batches 0.3 us
            // slower even where it did not run.)
            if !race.is_greedy() && nvec > UNROLL * ROW_THREADS {
                // The first round's group is the oldest pending one.
                arch::cp_async_wait_group::<{ SAMPLING_STAGES - 2 }>();
                // Each thread's candidate is the largest logit of its whole
                // first round, which is full (the chunk holds more than a
                // round): 1 to 2 % faster at B = 32 to 512 than the largest
                // of its first vector (H200, session 16).
                let max_of = |i: u32| {
                    let v = arch::ld_shared_v4_u32(slots(0) + i * SLOT_STRIDE);
                    E::max_token(v, lo + (tid + i * ROW_THREADS) * lanes)
                };
                let pick = |a: (f32, u32), b: (f32, u32)| if b.0 > a.0 { b } else { a };
                let (x, j) = pick(pick(max_of(0), max_of(1)), pick(max_of(2), max_of(3)));
                let score = race.approx_score(x, j);
                block::block_running_max_f32(score, shared_top);
                arch::bar_sync();
                race.raise(block::block_running_max_f32(f32::NEG_INFINITY, shared_top));
            }
            loop {
                // The round `SAMPLING_STAGES - 1` ahead goes into the stage
                // this thread visited last (vectors past the chunk are not
                // copied); then this round's group, the oldest, completes.
                let ahead = if stage == 0 {
                    SAMPLING_STAGES - 1
                } else {
                    stage - 1
                };
                copy_round(
                    base + (SAMPLING_STAGES - 1) * UNROLL * ROW_THREADS + tid,
                    nvec,
                    vec_ptr,
                    slots(ahead),
                );
                arch::cp_async_wait_group::<{ SAMPLING_STAGES - 1 }>();
                let here = slots(stage);
                // Written out (a loop stayed rolled, one group's code a
                // turn).
                let v = base + tid;
                if WIDE {
                    // Vectors past the chunk were not copied: their slots
                    // are not read.
                    let vs = [v, v + ROW_THREADS, v + 2 * ROW_THREADS, v + 3 * ROW_THREADS];
                    E::visit_round(
                        |i| arch::ld_shared_v4_u32(here + i * SLOT_STRIDE),
                        [
                            lo + vs[0] * lanes,
                            lo + vs[1] * lanes,
                            lo + vs[2] * lanes,
                            lo + vs[3] * lanes,
                        ],
                        [vs[0] < nvec, vs[1] < nvec, vs[2] < nvec, vs[3] < nvec],
                        &mut race,
                    );
                } else {
                    visit_slot::<E>(here, v, nvec, lo, &mut race);
                    visit_slot::<E>(here + SLOT_STRIDE, v + ROW_THREADS, nvec, lo, &mut race);
                    visit_slot::<E>(
                        here + 2 * SLOT_STRIDE,
                        v + 2 * ROW_THREADS,
                        nvec,
                        lo,
                        &mut race,
                    );
                    visit_slot::<E>(
                        here + 3 * SLOT_STRIDE,
                        v + 3 * ROW_THREADS,
                        nvec,
                        lo,
                        &mut race,
                    );
                }
                base += UNROLL * ROW_THREADS;
                if base >= nvec {
                    break;
                }
                stage = if stage + 1 == SAMPLING_STAGES {
                    0
                } else {
                    stage + 1
                };
                // The block's best score is shared after each of the first
                // four rounds, then after every eighth: by then the
                // threshold is near its final value and a share (about 40
                // instructions a warp) buys little (B = 1024: 3.5 % faster
                // than a share every round, and 0.5 to 1 % faster than
                // every fourth; H200, session 16).
                let done = base / (UNROLL * ROW_THREADS);
                if !race.is_greedy() && (done <= 4 || done % 8 == 0) {
                    race.raise(block::block_running_max_f32(race.top_score(), shared_top));
                }
            }
        } else {
            let mut j = lo + tid;
            while j < hi {
                race.visit1(E::load1(row_ptr.add(j as usize * E::BYTES)), j);
                j += ROW_THREADS;
            }
        }
        let best = block::block_max_u64_to_first(race.take_best().0, smem);
        if tid == 0 {
            finish_row(best, row, split.ctas_per_row, tokens, valid, keys, counters);
        }
    }
}

/// Writes a row's token from its blocks' maxima: directly with one block per
/// row, else through `keys[row]` and the last-block ticket. Called by thread
/// 0 of each block with the block's best key.
///
/// # Safety
/// The pointers satisfy the kernel's launch contract.
#[inline(always)]
unsafe fn finish_row(
    best: u64,
    row: u32,
    ctas_per_row: u32,
    tokens: *mut u32,
    valid: *mut u8,
    keys: *mut u64,
    counters: *mut u32,
) {
    let r = row as usize;
    // SAFETY: the launch contract covers every access.
    unsafe {
        let winner = if ctas_per_row == 1 {
            best
        } else {
            arch::red_max_relaxed_gpu_u64(keys.add(r), best);
            // The ticket's release orders the maximum before it; the last
            // block's acquire sees every block's maximum.
            let ticket = arch::atom_add_acq_rel_gpu_u32(counters.add(r), 1);
            if ticket != ctas_per_row - 1 {
                return;
            }
            *counters.add(r) = 0;
            arch::atom_exch_relaxed_gpu_u64(keys.add(r), 0)
        };
        let ok = sample::is_valid(winner);
        *tokens.add(r) = if ok { sample::token(winner) } else { 0 };
        *valid.add(r) = u8::from(ok);
    }
}

macro_rules! sampling_entry {
    ($name:ident, $elem:ty, $seeded:literal, $wide:literal, $t:ty, $what:literal) => {
        #[doc = concat!("`sampling_from_logits` over ", $what, " logits (see the module docs).")]
        ///
        /// # Safety
        /// See the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            logits: *const $t,
            temperature: *const f32,
            seed: *const u64,
            offset: *const u64,
            tokens: *mut u32,
            valid: *mut u8,
            keys: *mut u64,
            counters: *mut u32,
            split: RowSplit,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe {
                sampling_from_logits::<$elem, $seeded, $wide>(
                    logits as *const u8,
                    temperature,
                    seed,
                    offset,
                    tokens,
                    valid,
                    keys,
                    counters,
                    split,
                )
            }
        }
    };
}

sampling_entry!(sampling_from_logits_f32, F32, false, false, f32, "f32");
sampling_entry!(sampling_from_logits_bf16, Bf16, false, false, u16, "bf16");
sampling_entry!(
    sampling_from_logits_seeded_f32,
    F32,
    true,
    false,
    f32,
    "f32, for blocks of several rounds (filters seeded first),"
);
sampling_entry!(
    sampling_from_logits_seeded_bf16,
    Bf16,
    true,
    false,
    u16,
    "bf16, for blocks of several rounds (filters seeded first),"
);
sampling_entry!(
    sampling_from_logits_wide_f32,
    F32,
    true,
    true,
    f32,
    "f32, for one-wave grids of blocks of several rounds (four Philox calls at a time),"
);
sampling_entry!(
    sampling_from_logits_wide_bf16,
    Bf16,
    true,
    true,
    u16,
    "bf16, for one-wave grids of blocks of several rounds (four Philox calls at a time),"
);

/// Test kernel: the largest `|gumbel_approx(w) - gumbel_from_bits(w)|` over
/// the words `w = first + i` for `i < count`, as f32 bits, max-ed into
/// `out[0]`.
///
/// # Launch
/// Any 1-D grid of 1-D blocks; no shared memory.
///
/// # Safety
/// `out` is one writable u32 in global memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gumbel_filter_error_probe(out: *mut u32, first: u32, count: u32) {
    let n = arch::grid_dim_x() * arch::block_dim_x();
    let mut i = arch::block_idx_x() * arch::block_dim_x() + arch::thread_idx_x();
    let mut worst = 0.0f32;
    while i < count {
        let w = first.wrapping_add(i);
        let d = crate::race::gumbel_approx(w) - noise::gumbel_from_bits(w);
        let d = if d < 0.0 { -d } else { d };
        if !(d <= worst) {
            worst = d; // NaN sticks
        }
        i = match i.checked_add(n) {
            Some(v) => v,
            None => break,
        };
    }
    // SAFETY: caller's contract; non-negative f32 bits order as u32 (NaN
    // above everything).
    unsafe { arch::atom_max_u32(out, worst.to_bits()) };
}

/// Bench kernel: reads `n` 16-byte words once (the read floor of every
/// memory-bound kernel) and writes one xor per block to `out`, so the loads
/// cannot be dropped.
///
/// # Launch
/// Any 1-D grid of 1-D blocks; no shared memory.
///
/// # Safety
/// `src` holds `n` 16-byte aligned words; `out` holds one u32 per block.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn read_bandwidth_probe(src: *const u32, n: u64, out: *mut u32) {
    let stride = u64::from(arch::grid_dim_x() * arch::block_dim_x());
    let mut i = u64::from(arch::block_idx_x() * arch::block_dim_x() + arch::thread_idx_x());
    let mut acc = 0u32;
    // SAFETY: i < n; the caller's contract.
    unsafe {
        while i < n {
            let v = arch::ld_global_nc_v4_u32(src.add(4 * i as usize));
            acc ^= v[0] ^ v[1] ^ v[2] ^ v[3];
            i += stride;
        }
        if acc == 0x1234_5678 {
            // Practically never taken; keeps the loads alive.
            *out.add(arch::block_idx_x() as usize) = acc;
        }
    }
}
