//! Warp- and block-wide reductions used by the row kernels.

use crate::radix_select::bitonic_pair;
use crate::{arch, radix};

/// Maximum of `v` over the warp; every lane gets it.
#[inline(always)]
pub fn warp_max_u64(mut v: u64) -> u64 {
    let mut m = 16;
    while m > 0 {
        let o = shfl_bfly_u64(v, m);
        if o > v {
            v = o;
        }
        m >>= 1;
    }
    v
}

/// Writes the `n` elements at `out` (element `l` of a chunk whose kept
/// elements are the set bits of the shared-memory bitmap `bits`, bit
/// `l % 32` of word `l / 32`): `fill` where the bit is clear, `kept(l)`
/// where it is set and that is `Some` (else the element keeps its bits).
/// 16-byte stores where the chunk allows. Ends with a block barrier.
///
/// # Safety
/// Every thread of the block (of `threads`) calls it; `out` holds `n`
/// writable f32; `bits` holds the chunk's bitmap, complete.
#[inline(always)]
pub unsafe fn write_chunk(
    out: *mut f32,
    n: u32,
    bits: *const u32,
    fill: f32,
    kept: impl Fn(u32) -> Option<f32>,
    threads: u32,
) {
    let tid = arch::thread_idx_x();
    let bit = |l: u32| {
        // SAFETY: l below the chunk's length (callers), inside the bitmap.
        unsafe { (*bits.add((l / 32) as usize) >> (l % 32)) & 1 }
    };
    // SAFETY: elements below n (caller's contract).
    unsafe {
        if (out as usize).is_multiple_of(16) && n.is_multiple_of(4) {
            let mut v = tid;
            while v < n / 4 {
                let l = 4 * v;
                let mask = (*bits.add((l / 32) as usize) >> (l % 32)) & 0xf;
                let p = out.add(l as usize);
                if mask == 0 {
                    arch::st_global_v4_u32(p as *mut u32, [fill.to_bits(); 4]);
                } else {
                    for e in 0..4 {
                        if mask & (1 << e) == 0 {
                            *p.add(e) = fill;
                        } else if let Some(x) = kept(l + e as u32) {
                            *p.add(e) = x;
                        }
                    }
                }
                v += threads;
            }
        } else {
            let mut l = tid;
            while l < n {
                if bit(l) == 0 {
                    *out.add(l as usize) = fill;
                } else if let Some(x) = kept(l) {
                    *out.add(l as usize) = x;
                }
                l += threads;
            }
        }
        arch::bar_sync();
    }
}

/// Maximum of `v` over the block, valid in thread 0 only (one barrier).
///
/// # Safety
/// Every thread of the block calls it; `smem` points to at least
/// `block_dim / 32` u64 of shared memory no one else uses until the next
/// barrier after the call.
#[inline(always)]
pub unsafe fn block_max_u64_to_first(v: u64, smem: *mut u64) -> u64 {
    let tid = arch::thread_idx_x();
    let warps = arch::block_dim_x() / 32;
    let v = warp_max_u64(v);
    // SAFETY: indices below `warps` are inside `smem` (caller's contract).
    unsafe {
        if tid % 32 == 0 {
            *smem.add((tid / 32) as usize) = v;
        }
        arch::bar_sync();
        let mut r = if tid < warps {
            *smem.add(tid as usize)
        } else {
            0
        };
        if tid < 32 {
            r = warp_max_u64(r);
        }
        r
    }
}

/// Maximum of `v` over the block; every thread gets it.
///
/// # Safety
/// Every thread of the block calls it; `smem` points to at least
/// `block_dim / 32 + 1` u64 of shared memory no one else uses meanwhile.
#[inline(always)]
pub unsafe fn block_max_u64(v: u64, smem: *mut u64) -> u64 {
    let tid = arch::thread_idx_x();
    let warps = arch::block_dim_x() / 32;
    // SAFETY: the caller's contract covers the slots.
    unsafe {
        let r = block_max_u64_to_first(v, smem);
        if tid == 0 {
            *smem.add(warps as usize) = r;
        }
        arch::bar_sync();
        let out = *smem.add(warps as usize);
        arch::bar_sync();
        out
    }
}

/// Sorts the first `n` words of `buf` descending, `n` at most the block's
/// `threads` and the words distinct: word `e` is taken by `s` consecutive
/// threads (`s` the largest power of two up to `2^MAX_SHIFT`, at most 8,
/// with `n s <= threads`), each counting the words above it among every
/// `s`-th word from its own offset (the `s` threads of a word read `s`
/// adjacent words at once, one shared-memory wavefront; the threads of
/// other words read the same ones), their counts summed by butterfly
/// shuffles; the first stores the word at its rank. Three block barriers in all, where a bitonic network
/// over 256 words takes 36 steps of a compare-exchange each (ncu, session
/// 14: 42 % of the k = 50 selection kernel's samples, most of them at its
/// barriers); `s` threads a word cut each thread's reads from `n` to
/// `n / s` (every warp runs the loop: the block's issue slots, not one
/// thread's latency, bound it). Starts and ends with a block barrier.
///
/// Measured on the H200 (session 24, V = 128256, k = 50): with up to 8
/// threads a word the radix kernels (512 threads, gathers of about 50 to
/// 200 keys) are 0.5 to 0.9 us faster on every route from B = 1 to 128.
/// The Qrita selection kernels (256 threads) were 0.5 to 1 us slower on
/// the cluster route and 1 to 2 % slower at B >= 512, although their lists
/// of about 170 candidates take one thread a word either way: the loss
/// came with the code's shape in kernels at their 128-register bound, not
/// with the arithmetic. They sort with `MAX_SHIFT = 0`, the loop they had.
///
/// # Safety
/// Every thread of a block of `threads` (a multiple of 32) calls it; `n`
/// is at most `threads`; `buf` is shared memory of at least `n` distinct
/// words, which no one else touches meanwhile.
#[inline(always)]
pub unsafe fn rank_sort_desc<const MAX_SHIFT: u32>(buf: *mut u64, n: u32, threads: u32) {
    let tid = arch::thread_idx_x();
    // log2 of the threads a word (uniform over the block).
    let shift = if MAX_SHIFT >= 3 && 8 * n <= threads {
        3
    } else if MAX_SHIFT >= 2 && 4 * n <= threads {
        2
    } else if MAX_SHIFT >= 1 && 2 * n <= threads {
        1
    } else {
        0
    };
    let s = 1u32 << shift;
    let (e, c) = (tid >> shift, tid & (s - 1));
    // SAFETY: reads and writes below n (caller's contract); every read of
    // the words is between the first two barriers, every write after the
    // second.
    unsafe {
        arch::bar_sync();
        let mine = if e < n { *buf.add(e as usize) } else { 0 };
        let mut rank = 0u32;
        let mut j = c;
        while j + 3 * s < n {
            let w = [
                *buf.add(j as usize),
                *buf.add((j + s) as usize),
                *buf.add((j + 2 * s) as usize),
                *buf.add((j + 3 * s) as usize),
            ];
            rank += u32::from(w[0] > mine)
                + u32::from(w[1] > mine)
                + u32::from(w[2] > mine)
                + u32::from(w[3] > mine);
            j += 4 * s;
        }
        while j < n {
            rank += u32::from(*buf.add(j as usize) > mine);
            j += s;
        }
        // The word's threads are lanes `e s .. e s + s` of one warp (s
        // divides 32); every lane of every warp shuffles.
        if shift >= 1 {
            rank += arch::shfl_bfly_u32(rank, 1);
        }
        if shift >= 2 {
            rank += arch::shfl_bfly_u32(rank, 2);
        }
        if shift >= 3 {
            rank += arch::shfl_bfly_u32(rank, 4);
        }
        arch::bar_sync();
        if e < n && c == 0 {
            *buf.add(rank as usize) = mine;
        }
        arch::bar_sync();
    }
}

/// `v` of lane `lane ^ mask` (a butterfly shuffle of both halves).
#[inline(always)]
fn shfl_bfly_u64(v: u64, mask: u32) -> u64 {
    let lo = arch::shfl_bfly_u32(v as u32, mask);
    let hi = arch::shfl_bfly_u32((v >> 32) as u32, mask);
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Where word `p` of [`bitonic_sort_desc_regs`]'s network lies in shared
/// memory: `p` with its low `log2 E` bits flipped by the bits above its
/// 16-word line. Thread `t` holds words `E t .. E t + E`, so its `e`-th
/// words of one half-warp lie `E` words apart, at `16 / E` of a line's 16
/// eight-byte bank pairs (an `E`-way conflict); flipped, they take all 16.
/// Steps of stride `32 E` and more keep the flip (it moves bits below
/// `log2 E`, the stride's are above `E^2` as `E <= 16`), and any 16
/// consecutive positions stay on 16 bank pairs.
#[inline(always)]
fn swizzled<const E: usize>(p: u32) -> usize {
    (p ^ ((p >> 4) & (E as u32 - 1))) as usize
}

/// The step of stride `S` (below `E` and `size`; none otherwise) of a
/// bitonic network's block of `size` over a thread's own words `v`, the
/// first of them word `first`.
#[inline(always)]
fn own_step<const E: usize, const S: usize>(v: &mut [u64; E], first: u32, size: u32) {
    if S >= E || S as u32 >= size {
        return;
    }
    for e in 0..E {
        if e & S == 0 {
            let f = e | S;
            let desc = (first + e as u32) & size == 0;
            let (a, b) = (v[e], v[f]);
            if (a < b) == desc {
                v[e] = b;
                v[f] = a;
            }
        }
    }
}

/// Sorts the first `n` words of `buf` descending, `n <= E threads` (best
/// above `E threads / 2`): the bitonic network over `E threads` words
/// (those after `n` padded with 0, which must be below every word
/// sorted), thread `t` holding words `E t .. E t + E` in registers.
/// - Strides below `E`: a thread's own words.
/// - Strides `E` to `16 E`: with those of lane `t ^ stride / E`, two
///   shuffles a word.
/// - Strides `32 E` and more (6 of the 78 steps of 4096 words, 10 of the
///   55 of 1024): in shared memory, at [`swizzled`] positions (free of
///   bank conflicts). A run of them starts with every thread storing its
///   words; in each step a thread compare-exchanges `E / 2` pairs (their
///   loads all issued at once), a block barrier after it; the run ends
///   with every thread loading its words back.
///
/// The words start anywhere (a network sorts any order), so they are read
/// in the block's coalesced order, and the sorted words go out through
/// their swizzled positions (for `E >= 8`, where that beats the conflicts
/// of storing them in place).
///
/// A network over shared memory alone, one compare-exchange a thread at a
/// time, moves every word through it at every step, each pair a dependent
/// load, compare and store: measured 0.6 to 0.8 us a step at 4096 words
/// and 256 threads (session 13), 78 steps.
///
/// # Safety
/// Every thread of a block of `threads` (a multiple of 32) calls it; `buf`
/// is shared memory of at least `E threads` words, which no one else
/// touches meanwhile. Starts and ends with a block barrier.
#[inline(always)]
pub unsafe fn bitonic_sort_desc_regs<const E: usize>(buf: *mut u64, n: u32, threads: u32) {
    const { assert!(E.is_power_of_two() && E >= 2 && E <= 16) };
    let tid = arch::thread_idx_x();
    let e_words = E as u32;
    let words = e_words * threads;
    let first = tid * e_words;
    let mut v = [0u64; E];
    // SAFETY: positions below `words` (caller's contract); the first
    // barrier orders the caller's writes before the loads; every store to
    // a position follows a barrier after the last load of it by another
    // thread, and every load of another thread's store a barrier after it;
    // a step's pairs are disjoint.
    unsafe {
        arch::bar_sync();
        for (e, w) in v.iter_mut().enumerate() {
            let p = e as u32 * threads + tid;
            *w = if p < n { *buf.add(p as usize) } else { 0 };
        }
        // Every load above before any store below.
        arch::bar_sync();
        let mut size = 2;
        while size <= words {
            let mut stride = size / 2;
            // Strides of 32 E and more: in shared memory. A thread's own
            // positions are read by no other thread between runs, so a run
            // stores them without a barrier first.
            let desc = first & size == 0;
            if stride >= 32 * e_words {
                for (e, w) in v.iter().enumerate() {
                    *buf.add(swizzled::<E>(first + e as u32)) = *w;
                }
                arch::bar_sync();
                while stride >= 32 * e_words {
                    // The step's E / 2 pairs of this thread (arrays of E:
                    // a length cannot be computed from E), loaded first.
                    let mut pairs = [(0usize, 0usize, false); E];
                    let mut loaded = [(0u64, 0u64); E];
                    for j in 0..E / 2 {
                        let (lo, hi, desc) = bitonic_pair(j as u32 * threads + tid, size, stride);
                        pairs[j] = (swizzled::<E>(lo), swizzled::<E>(hi), desc);
                        loaded[j] = (*buf.add(pairs[j].0), *buf.add(pairs[j].1));
                    }
                    for j in 0..E / 2 {
                        let ((lo, hi, desc), (a, b)) = (pairs[j], loaded[j]);
                        if (a < b) == desc {
                            *buf.add(lo) = b;
                            *buf.add(hi) = a;
                        }
                    }
                    arch::bar_sync();
                    stride /= 2;
                }
                for (e, w) in v.iter_mut().enumerate() {
                    *w = *buf.add(swizzled::<E>(first + e as u32));
                }
            }
            // Strides E to 16 E: the partner is lane `t ^ stride / E`, the
            // same slot. This thread keeps the larger word when its words
            // are the lower half of a descending block or the upper half
            // of an ascending one.
            while stride >= e_words {
                let lane_mask = stride / e_words;
                let lower = tid & lane_mask == 0;
                for w in v.iter_mut() {
                    let o = shfl_bfly_u64(*w, lane_mask);
                    *w = if (o > *w) == (lower == desc) { o } else { *w };
                }
                stride /= 2;
            }
            // Strides below E (those below `size`): this thread's own
            // words, one step a constant stride, so that every index is a
            // constant and the words stay in registers.
            own_step::<E, 8>(&mut v, first, size);
            own_step::<E, 4>(&mut v, first, size);
            own_step::<E, 2>(&mut v, first, size);
            own_step::<E, 1>(&mut v, first, size);
            size *= 2;
        }
        // The last run's loads were of this thread's own positions.
        if E >= 8 {
            for (e, w) in v.iter().enumerate() {
                *buf.add(swizzled::<E>(first + e as u32)) = *w;
            }
            arch::bar_sync();
            for (e, w) in v.iter_mut().enumerate() {
                *w = *buf.add(swizzled::<E>(e as u32 * threads + tid));
            }
            arch::bar_sync();
            for (e, w) in v.iter().enumerate() {
                *buf.add((e as u32 * threads + tid) as usize) = *w;
            }
        } else {
            for (e, w) in v.iter().enumerate() {
                *buf.add((first + e as u32) as usize) = *w;
            }
        }
        arch::bar_sync();
    }
}

/// The largest `v` offered so far by any warp of the block, this one's
/// included: a warp-wide maximum folded into `slot` by one shared atomic.
/// Orders like `f32` (NaN as -inf); every lane gets the result.
///
/// # Safety
/// Every lane of the warp calls it; `slot` is a 4-byte aligned shared
/// address of the block (see [`arch::smem_addr`]) that held 0 (below every
/// key) or earlier offers, and that only this function touches meanwhile.
#[inline(always)]
pub unsafe fn block_running_max_f32(v: f32, slot: u32) -> f32 {
    // One `redux.sync` for the warp's maximum (five shuffles and compares
    // before: about a sixth of the sampling kernel's per-round overhead).
    let k = arch::redux_max_u32(radix::f32_key(v.to_bits()));
    let mut r = k;
    if arch::thread_idx_x() % 32 == 0 {
        // SAFETY: the caller's contract.
        let old = unsafe { arch::atom_max_shared_u32(slot, k) };
        if old > r {
            r = old;
        }
    }
    f32::from_bits(radix::f32_from_key(arch::shfl_idx_u32(r, 0)))
}

/// Online log-sum-exp state in base 2: `sum = Σ 2^(x - max)`.
#[derive(Clone, Copy)]
pub struct Lse2 {
    pub max: f32,
    pub sum: f32,
}

impl Lse2 {
    pub const EMPTY: Lse2 = Lse2 {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };

    /// Adds one finite value.
    #[inline(always)]
    pub fn push(&mut self, x: f32) {
        if x > self.max {
            self.sum = self.sum * arch::ex2_approx_f32(self.max - x) + 1.0;
            self.max = x;
        } else {
            self.sum += arch::ex2_approx_f32(x - self.max);
        }
    }

    /// Merges another state (either may be empty).
    #[inline(always)]
    pub fn merge(self, o: Lse2) -> Lse2 {
        if o.sum == 0.0 {
            return self;
        }
        if self.sum == 0.0 {
            return o;
        }
        let max = if o.max > self.max { o.max } else { self.max };
        Lse2 {
            max,
            sum: self.sum * arch::ex2_approx_f32(self.max - max)
                + o.sum * arch::ex2_approx_f32(o.max - max),
        }
    }

    /// Merges the states of the warp (butterfly: every lane gets the same
    /// bits, since `merge` is symmetric).
    #[inline(always)]
    pub fn warp_merge(mut self) -> Lse2 {
        let mut m = 16;
        while m > 0 {
            let o = Lse2 {
                max: f32::from_bits(arch::shfl_bfly_u32(self.max.to_bits(), m)),
                sum: f32::from_bits(arch::shfl_bfly_u32(self.sum.to_bits(), m)),
            };
            self = self.merge(o);
            m >>= 1;
        }
        self
    }
}
