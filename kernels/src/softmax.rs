//! `softmax`: probabilities `softmax(x / T)` of a `[batch, vocab]` f32
//! logits tensor, in two launches over the same [`RowSplit`]:
//! `softmax_stats_f32` writes each block's partial statistics, then
//! `softmax_write_f32` has every block fold its row's partials (in block
//! order, so each row's bits depend on nothing but the row and the split,
//! which the host derives from `vocab` alone) and write its chunk.
//!
//! Semantics follow the samplers: NaN and -inf get probability 0; a row with
//! +inf entries spreads its mass evenly over them; a greedy row
//! (T <= 0 or NaN) is one-hot at its argmax (lowest index on ties); a row
//! with nothing finite is all zeros.
//!
//! # Launch
//! Both: grid `(split.ctas_per_row, split.batch)`, block [`ROW_THREADS`],
//! dynamic shared memory `(ROW_THREADS / 32 + 2) * 8` bytes.
//!
//! # Safety (caller)
//! `logits` holds `batch` rows of `row_stride` elements (`vocab` readable);
//! `probs` holds `batch` rows of `row_stride` writable elements;
//! `temperature` holds `batch` values; `stats` holds
//! `3 * batch * ctas_per_row` u64.

use crate::arch;
use crate::block::{self, Lse2};
use crate::params::{ROW_THREADS, RowSplit};
use crate::sample;

const LOG2E: f32 = core::f32::consts::LOG2_E;

/// A block's statistics of its chunk, stored as three u64:
/// `(max, sum)` bits, the count of +inf entries, and the greedy key.
struct Stats {
    lse: Lse2,
    n_inf: u32,
    greedy: u64,
}

#[inline(always)]
fn chunk_bounds(split: &RowSplit, c: u32) -> (u32, u32) {
    let lo = c * split.chunk;
    let hi = if lo + split.chunk < split.vocab {
        lo + split.chunk
    } else {
        split.vocab
    };
    (lo, hi)
}

/// # Safety
/// Every thread of the block calls it; the launch contract holds.
#[inline(always)]
unsafe fn block_stats(row_ptr: *const f32, lo: u32, hi: u32, scale: f32, smem: *mut u64) -> Stats {
    let tid = arch::thread_idx_x();
    let mut lse = Lse2::EMPTY;
    let mut n_inf = 0u32;
    let mut greedy = 0u64;
    let mut j = lo + tid;
    // SAFETY: j < hi <= vocab.
    unsafe {
        while j < hi {
            let x = arch::ld_global_nc_u32(row_ptr.add(j as usize) as *const u32);
            let x = f32::from_bits(x);
            match sample::logit_class(x) {
                1 => lse.push(x * scale),
                2 => n_inf += 1,
                _ => {}
            }
            let k = sample::greedy_key(x, j);
            if k > greedy {
                greedy = k;
            }
            j += ROW_THREADS;
        }
    }
    let lse = lse.warp_merge();
    let mut n = n_inf;
    let mut m = 16;
    while m > 0 {
        n += arch::shfl_bfly_u32(n, m);
        m >>= 1;
    }
    // SAFETY: the block-wide helpers' contract is the caller's.
    unsafe {
        let greedy = block::block_max_u64(greedy, smem);
        // Fold the warps' (lse, n) in warp order through shared memory.
        let warps = ROW_THREADS / 32;
        let lane = tid % 32;
        let w = tid / 32;
        if lane == 0 {
            *smem.add(w as usize) =
                (u64::from(lse.max.to_bits()) << 32) | u64::from(lse.sum.to_bits());
            *smem.add((warps + w) as usize) = u64::from(n);
        }
        arch::bar_sync();
        let mut total = Lse2::EMPTY;
        let mut n_total = 0u32;
        let mut i = 0;
        while i < warps {
            let v = *smem.add(i as usize);
            total = total.merge(Lse2 {
                max: f32::from_bits((v >> 32) as u32),
                sum: f32::from_bits(v as u32),
            });
            n_total += *smem.add((warps + i) as usize) as u32;
            i += 1;
        }
        arch::bar_sync();
        Stats {
            lse: total,
            n_inf: n_total,
            greedy,
        }
    }
}

/// First launch: each block's statistics of its chunk.
///
/// # Safety
/// See the module docs; shared memory of `2 * ROW_THREADS / 32 + 2` u64.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn softmax_stats_f32(
    logits: *const f32,
    temperature: *const f32,
    stats: *mut u64,
    split: RowSplit,
) {
    let c = arch::block_idx_x();
    let r = arch::block_idx_y() as usize;
    let smem = arch::dynamic_shared::<u64>();
    // SAFETY: the launch contract covers every access.
    unsafe {
        let t = *temperature.add(r);
        let scale = if sample::is_greedy(t) { 0.0 } else { LOG2E / t };
        let (lo, hi) = chunk_bounds(&split, c);
        let row_ptr = logits.add(r * split.row_stride as usize);
        let s = block_stats(row_ptr, lo, hi, scale, smem);
        if arch::thread_idx_x() == 0 {
            let p = stats.add(3 * (r * split.ctas_per_row as usize + c as usize));
            *p = (u64::from(s.lse.max.to_bits()) << 32) | u64::from(s.lse.sum.to_bits());
            *p.add(1) = u64::from(s.n_inf);
            *p.add(2) = s.greedy;
        }
    }
}

/// Second launch: folds the row's partials and writes the block's chunk.
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn softmax_write_f32(
    logits: *const f32,
    temperature: *const f32,
    stats: *const u64,
    probs: *mut f32,
    split: RowSplit,
) {
    let c = arch::block_idx_x();
    let r = arch::block_idx_y() as usize;
    let tid = arch::thread_idx_x();
    // SAFETY: the launch contract covers every access.
    unsafe {
        let t = *temperature.add(r);
        let greedy_row = sample::is_greedy(t);
        let scale = if greedy_row { 0.0 } else { LOG2E / t };
        // Every thread folds the row's partials in block order: identical
        // bits in every block of the row.
        let mut lse = Lse2::EMPTY;
        let mut n_inf = 0u32;
        let mut greedy = 0u64;
        let base = stats.add(3 * r * split.ctas_per_row as usize);
        let mut i = 0;
        while i < split.ctas_per_row as usize {
            let v = *base.add(3 * i);
            lse = lse.merge(Lse2 {
                max: f32::from_bits((v >> 32) as u32),
                sum: f32::from_bits(v as u32),
            });
            n_inf += *base.add(3 * i + 1) as u32;
            let g = *base.add(3 * i + 2);
            if g > greedy {
                greedy = g;
            }
            i += 1;
        }
        let inv_sum = 1.0 / lse.sum;
        let inv_inf = 1.0 / n_inf as f32;
        let greedy_token = if sample::is_valid(greedy) {
            sample::token(greedy)
        } else {
            u32::MAX
        };
        let (lo, hi) = chunk_bounds(&split, c);
        let row_in = logits.add(r * split.row_stride as usize);
        let row_out = probs.add(r * split.row_stride as usize);
        let mut j = lo + tid;
        while j < hi {
            let x = f32::from_bits(arch::ld_global_nc_u32(row_in.add(j as usize) as *const u32));
            let p = if greedy_row {
                if j == greedy_token { 1.0 } else { 0.0 }
            } else if n_inf > 0 {
                if x == f32::INFINITY { inv_inf } else { 0.0 }
            } else if sample::logit_class(x) == 1 {
                arch::ex2_approx_f32(x * scale - lse.max) * inv_sum
            } else {
                0.0
            };
            *row_out.add(j as usize) = p;
            j += ROW_THREADS;
        }
    }
}
