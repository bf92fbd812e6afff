//! Portable heart of the cluster radix top-k and sparse top-p sampler
//! (issue 5, FlashInfer's "cake" route): the keys, the radix select's
//! decisions, the sorting network and the exact integer masses, shared by
//! the kernels (`radix_topk`) and the CPU emulation [`select_slab`] /
//! [`draw_from_slab`] that the tests hold the GPU to bit for bit.
//!
//! # Keys and order
//!
//! A probability counts through its *clean bits* ([`prob_bits`]): the f32
//! bit pattern of a finite positive value, 0 for everything else (NaN,
//! negative, +-0, +inf), so bad values weigh nothing. Positive floats order
//! like their bit patterns, so the 31-bit clean bits are a radix key. An
//! element's **composite key** ([`composite`]) is `bits << 32 | !index`:
//! larger for larger values, and for equal values larger for lower
//! indices; keys are unique, and the library's total order (value
//! descending, index ascending) is key descending.
//!
//! # Stage 1: radix select into a slab
//!
//! The top `k' = min(k, V, SLAB)` keys of a row are found by a radix select
//! over the 63-bit keys, [`DIGIT_BITS`] bits per pass from the top
//! ([`RadixSelect`]): each pass histograms the keys still in range into
//! [`BUCKETS`] buckets (per CTA, then summed over the CTAs of the row),
//! finds the bucket where the count from the top reaches `k'`
//! ([`crossing_in_group`]), and stops as soon as the keys at or above that
//! bucket fit the gather buffer ([`GATHER_CAP`]): every key `>=` the
//! bucket's lowest key is then gathered, sorted by a bitonic network
//! ([`bitonic_pair`]) and the first `k'` form the slab. One pass suffices
//! unless the crossing bucket is crowded (ties, underflowed zeros); a
//! bucket after the fifth pass holds at most 256 keys, so at most
//! [`MAX_PASSES`] passes run, and the boundary ties are resolved by the
//! index bits of the key like any other bits.
//!
//! # Stage 2: sparse top-p and the draw
//!
//! Over the sorted slab, masses are exact integers ([`fixed_mass`]): each
//! value scaled by a power of two fixed by the slab's largest value, so
//! that sums do not depend on their order and the GPU's parallel scan gives
//! the very integers of a sequential sum. top-p keeps the shortest prefix
//! whose exclusive mass is below `top_p * topk_mass`
//! ([`top_p_threshold`], [`top_p_keeps`]); the token is the first kept
//! element whose inclusive mass exceeds `u * kept_mass`
//! ([`draw_target`], [`before_draw`]), `u` the row's first per-row uniform
//! (the draw of the Qrita sampler `topk_topp_sample_f32`).

/// Slab entries per row: the largest `k` the radix route serves.
pub const SLAB: u32 = 1024;
/// Bits of a radix digit.
pub const DIGIT_BITS: u32 = 11;
/// Buckets of a pass's histogram.
pub const BUCKETS: u32 = 1 << DIGIT_BITS;
const DIGIT_MASK: u64 = BUCKETS as u64 - 1;
/// Significant bits of a composite key (31 value bits, 32 index bits).
pub const KEY_BITS: u32 = 63;
/// Keys a row's gather buffer holds: the pass loop stops once the keys at
/// or above the crossing bucket fit.
pub const GATHER_CAP: u32 = 2048;
/// Most passes a row needs: after the fifth (shift 8) the crossing bucket
/// holds at most 256 keys, and fewer than `SLAB` lie above it.
pub const MAX_PASSES: u32 = 5;
/// Left shift of the slab's largest value in [`fixed_mass`]: `2^24 << 30`
/// times [`SLAB`] stays below `2^64`.
pub const MASS_SHIFT: i32 = 30;

#[cfg(not(target_arch = "nvptx64"))]
extern crate alloc;
#[cfg(not(target_arch = "nvptx64"))]
use alloc::vec::Vec;

const _: () = assert!(KEY_BITS - MAX_PASSES * DIGIT_BITS <= 8);
const _: () = assert!(SLAB - 1 + (1 << (KEY_BITS - MAX_PASSES * DIGIT_BITS)) <= GATHER_CAP);
const _: () = assert!(SLAB - 1 + (1 << (DIGIT_BITS - 1)) <= GATHER_CAP);

/// The clean bits of a probability: its bit pattern when it is finite and
/// positive, else 0 (NaN, negative values, +-0 and +inf weigh nothing).
#[inline(always)]
pub fn prob_bits(x: f32) -> u32 {
    if x > 0.0 && x < f32::INFINITY {
        x.to_bits()
    } else {
        0
    }
}

/// The composite key of clean bits `bits` at `index`.
#[inline(always)]
pub fn composite(bits: u32, index: u32) -> u64 {
    (u64::from(bits) << 32) | u64::from(!index)
}

/// The clean bits of a composite key.
#[inline(always)]
pub fn composite_bits(key: u64) -> u32 {
    (key >> 32) as u32
}

/// The index of a composite key.
#[inline(always)]
pub fn composite_index(key: u64) -> u32 {
    !(key as u32)
}

/// The composite key of a logit's [`f32_key`] `key` (all 32 bits carry
/// order) at `index` (below 2^31; rows hold at most
/// [`crate::sample::MAX_VOCAB`] elements): the key above 31 index bits, so
/// that it keeps to the [`KEY_BITS`] of [`composite`]'s, whose passes,
/// digits and [`RadixSelect`] it shares. Orders as [`composite`]: larger
/// key first, then lower index.
///
/// [`f32_key`]: crate::radix::f32_key
#[inline(always)]
pub fn logit_composite(key: u32, index: u32) -> u64 {
    (u64::from(key) << 31) | u64::from(!index & 0x7fff_ffff)
}

/// The [`crate::radix::f32_key`] of a [`logit_composite`] key.
#[inline(always)]
pub fn logit_composite_key(c: u64) -> u32 {
    (c >> 31) as u32
}

/// The index of a [`logit_composite`] key.
#[inline(always)]
pub fn logit_composite_index(c: u64) -> u32 {
    !(c as u32) & 0x7fff_ffff
}

/// Bits 63..32 of a composite key of either kind ([`composite`]'s clean
/// bits, [`logit_composite`]'s key but its last bit): what
/// [`first_digit`] and [`RadixSelect::within_bits`] read.
#[inline(always)]
pub fn high_word(c: u64) -> u32 {
    (c >> 32) as u32
}

/// The first pass's digit of any key whose [`high_word`] is `high`: the
/// top [`DIGIT_BITS`] of the key (for probabilities value bits 30..20,
/// for logits key bits 31..21; the streaming pass needs no index).
#[inline(always)]
pub fn first_digit(high: u32) -> u32 {
    high >> (KEY_BITS - DIGIT_BITS - 32)
}

/// The logit the pivot route samples for a probability: `ln` of its clean
/// value (subnormals included), -inf for a clean value of 0.
#[inline(always)]
pub fn prob_logit(bits: u32) -> f32 {
    let x = f32::from_bits(bits);
    if bits == 0 {
        f32::NEG_INFINITY
    } else if x < f32::MIN_POSITIVE {
        // 2^64 scaling keeps `ln_f32` on normal numbers.
        crate::noise::ln_f32(x * 18_446_744_073_709_551_616.0) - 64.0 * core::f32::consts::LN_2
    } else {
        crate::noise::ln_f32(x)
    }
}

/// The `k'` a row selects: `top_k` clamped into `1 ..= min(vocab, SLAB)`.
#[inline(always)]
pub fn slab_len(top_k: u32, vocab: u32) -> u32 {
    let cap = if vocab < SLAB { vocab } else { SLAB };
    top_k.clamp(1, cap.max(1))
}

/// Where a pass's count from the top reaches the keys still needed: the
/// digit of the crossing bucket, the in-range keys in higher buckets, and
/// the keys in the crossing bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crossing {
    pub digit: u32,
    pub above: u32,
    pub count: u32,
}

/// The crossing inside digit group `group` (digits `4 group .. 4 group +
/// 3`, with counts `counts`), given `above` in-range keys in the digits
/// above the group and `need` (>= 1) keys still to select; `None` when the
/// crossing lies in another group.
#[inline(always)]
pub fn crossing_in_group(counts: [u32; 4], group: u32, above: u32, need: u32) -> Option<Crossing> {
    if above >= need {
        return None;
    }
    // Written out from the top digit down: constant indices keep the
    // counts in registers on the GPU.
    let mut acc = above;
    let mut step = |d: u32, c: u32| {
        if acc.saturating_add(c) >= need {
            Some(Crossing {
                digit: 4 * group + d,
                above: acc,
                count: c,
            })
        } else {
            acc += c;
            None
        }
    };
    let (c0, c1, c2, c3) = (counts[0], counts[1], counts[2], counts[3]);
    step(3, c3)
        .or_else(|| step(2, c2))
        .or_else(|| step(1, c1))
        .or_else(|| step(0, c0))
}

/// The state of one row's radix select: `k` keys to select, `above` found
/// in higher buckets so far, and the digits fixed by earlier passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RadixSelect {
    k: u32,
    above: u32,
    prefix: u64,
    shift: u32,
    passes: u32,
}

impl RadixSelect {
    /// A select of the top `k` (>= 1) keys.
    #[inline(always)]
    pub fn new(k: u32) -> RadixSelect {
        RadixSelect {
            k,
            above: 0,
            prefix: 0,
            shift: KEY_BITS - DIGIT_BITS,
            passes: 0,
        }
    }

    /// A select of the top `k` (>= 1) among keys whose [`high_word`]s all
    /// lie in `lo_bits..=hi_bits`: the leading key bits both bounds share are
    /// fixed, and the first pass counts the [`DIGIT_BITS`] below them.
    /// Those keys spread over many buckets where [`RadixSelect::new`]'s
    /// first digit (value bits 30..20) puts a filter buffer's keys, all
    /// within a few octaves, in a dozen crowded ones. The passes end as
    /// [`RadixSelect::advance_within`] says; the last one (`shift` below
    /// [`DIGIT_BITS`]) has buckets of at most `2^(DIGIT_BITS - 1)` keys, so
    /// `k` up to [`SLAB`] keeps at most `SLAB - 1 + 2^(DIGIT_BITS - 1) <=`
    /// [`GATHER_CAP`] keys at or above it.
    #[inline(always)]
    pub fn within_bits(k: u32, lo_bits: u32, hi_bits: u32) -> RadixSelect {
        let lo = u64::from(lo_bits) << 32;
        let hi = (u64::from(hi_bits) << 32) | u64::from(u32::MAX);
        // Leading bits of the 63-bit keys both share (bit 63 is 0 in both).
        let common = ((lo ^ hi).leading_zeros() - 1).min(KEY_BITS - DIGIT_BITS);
        let shift = KEY_BITS - DIGIT_BITS - common;
        RadixSelect {
            k,
            above: 0,
            prefix: hi >> (shift + DIGIT_BITS),
            shift,
            passes: 0,
        }
    }

    /// The digit of `key` in this pass, `None` when earlier passes ruled the
    /// key out (its higher digits differ from the fixed ones).
    #[inline(always)]
    pub fn digit(&self, key: u64) -> Option<u32> {
        if key >> (self.shift + DIGIT_BITS) == self.prefix {
            Some(((key >> self.shift) & DIGIT_MASK) as u32)
        } else {
            None
        }
    }

    /// Keys still to select in the current range (>= 1).
    #[inline(always)]
    pub fn need(&self) -> u32 {
        self.k - self.above
    }

    /// Passes run so far.
    #[inline(always)]
    pub fn passes(&self) -> u32 {
        self.passes
    }

    /// Ends a pass at its crossing: `Some(threshold)` when the keys `>=
    /// threshold` (the crossing bucket's lowest key) fit the gather buffer,
    /// else `None` and the next pass refines the crossing bucket.
    #[inline(always)]
    pub fn advance(&mut self, c: Crossing) -> Option<u64> {
        self.advance_within(c, GATHER_CAP)
    }

    /// [`RadixSelect::advance`] to at most `fit` keys at or above the
    /// threshold (`k <= fit <= GATHER_CAP`), or the last pass's crossing
    /// bucket.
    #[inline(always)]
    pub fn advance_within(&mut self, c: Crossing, fit: u32) -> Option<u64> {
        self.passes += 1;
        self.above += c.above;
        let bucket = (self.prefix << DIGIT_BITS) | u64::from(c.digit);
        if self.above + c.count <= fit || self.shift < DIGIT_BITS {
            Some(bucket << self.shift)
        } else {
            self.prefix = bucket;
            self.shift -= DIGIT_BITS;
            None
        }
    }
}

/// Step `(size, stride)` of a bitonic sorting network, compare-exchange `i`
/// (of `n / 2`): the two positions it compares and whether their block
/// is sorted descending (larger first). Runs `size = 2, 4, .., n`, and for
/// each `stride = size / 2, .., 1`, sort `n` (a power of two) entries
/// descending. `stride` is a power of two below `size`.
#[inline(always)]
pub fn bitonic_pair(i: u32, size: u32, stride: u32) -> (u32, u32, bool) {
    let lo = ((i & !(stride - 1)) << 1) | (i & (stride - 1));
    (lo, lo + stride, lo & size == 0)
}

/// `(mantissa, biased exponent)` of positive clean bits, subnormals with
/// exponent 1 and no implicit bit, so the value is `m 2^(e - 150)`.
#[inline(always)]
fn mantissa_exponent(bits: u32) -> (u64, i32) {
    let e = (bits >> 23) as i32;
    let m = u64::from(bits & 0x007f_ffff);
    if e == 0 { (m, 1) } else { (m | 0x0080_0000, e) }
}

/// The exact integer mass of clean bits `bits` in a slab whose largest
/// clean bits are `top`: the value times `2^(MASS_SHIFT + 150 - e_top)`,
/// truncated (exact for values within `2^30` of the largest; smaller ones
/// lose at most one unit, `2^-53` of the largest). Sums of up to [`SLAB`]
/// masses fit a `u64`.
#[inline(always)]
pub fn fixed_mass(bits: u32, top: u32) -> u64 {
    if bits == 0 {
        return 0;
    }
    let (m, e) = mantissa_exponent(bits);
    let (_, e_top) = mantissa_exponent(top);
    let sh = e - e_top + MASS_SHIFT;
    if sh >= 0 {
        m << sh.min(MASS_SHIFT)
    } else if sh > -24 {
        m >> -sh
    } else {
        0
    }
}

/// The top-p threshold over a top-k mass `total`: element `i` of the slab
/// is kept iff [`top_p_keeps`]. `top_p` NaN or `>= 1` keeps the whole slab
/// (+inf), `<= 0` its first element only.
#[inline(always)]
pub fn top_p_threshold(top_p: f32, total: u64) -> f64 {
    if top_p.is_nan() || top_p >= 1.0 {
        f64::INFINITY
    } else if top_p <= 0.0 {
        0.0
    } else {
        f64::from(top_p) * total as f64
    }
}

/// Whether top-p keeps slab element `i` with exclusive mass `exclusive`:
/// the first always, the others while the mass before them is below the
/// threshold.
#[inline(always)]
pub fn top_p_keeps(i: u32, exclusive: u64, threshold: f64) -> bool {
    i == 0 || (exclusive as f64) < threshold
}

/// The inverse-CDF target of a draw with uniform `u` in (0, 1) over a kept
/// mass `kept_mass`: strictly below `kept_mass` when it is positive.
#[inline(always)]
pub fn draw_target(u: f32, kept_mass: u64) -> f64 {
    f64::from(u) * kept_mass as f64
}

/// Whether a kept element with inclusive mass `inclusive` lies before the
/// drawn one (the drawn one is the first whose inclusive mass exceeds the
/// target).
#[inline(always)]
pub fn before_draw(inclusive: u64, target: f64) -> bool {
    (inclusive as f64) <= target
}

/// The result of stage 2 on one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drawn {
    /// Slab entries top-p keeps (>= 1).
    pub kept: u32,
    /// Slab position of the drawn token (< `kept`).
    pub position: u32,
}

/// Stage 2 over a sorted slab of composite keys, sequentially: the top-p
/// cut and the position of the token drawn with uniform `u`; `None` for a
/// row with no positive mass (invalid). The kernel computes the same
/// integers with a parallel scan, so it draws the same position.
pub fn draw_from_slab(slab: &[u64], top_p: f32, u: f32) -> Option<Drawn> {
    let top = composite_bits(*slab.first()?);
    let masses = || slab.iter().map(|&key| fixed_mass(composite_bits(key), top));
    let total = masses().fold(0u64, u64::wrapping_add);
    if total == 0 {
        return None;
    }
    let threshold = top_p_threshold(top_p, total);
    let mut exclusive = 0u64;
    let mut kept = 0u32;
    let mut kept_mass = 0u64;
    for (i, w) in (0u32..).zip(masses()) {
        if !top_p_keeps(i, exclusive, threshold) {
            break;
        }
        exclusive = exclusive.wrapping_add(w);
        kept = i + 1;
        kept_mass = exclusive;
    }
    let target = draw_target(u, kept_mass);
    let mut inclusive = 0u64;
    let position = (0u32..kept)
        .zip(masses())
        .take_while(|&(_, w)| {
            inclusive = inclusive.wrapping_add(w);
            before_draw(inclusive, target)
        })
        .count() as u32;
    Some(Drawn {
        kept,
        position: position.min(kept - 1),
    })
}

/// What [`select_slab`] found.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuSelect {
    /// The sorted slab: `slab_len(top_k, V)` composite keys.
    pub slab: Vec<u64>,
    /// Radix passes run.
    pub passes: u32,
    /// Keys gathered after the last pass (at most [`GATHER_CAP`]).
    pub gathered: u32,
}

/// The crossing of a pass from its whole histogram, as the kernels find it
/// group by group from the top (all zeros when no bucket holds it: a
/// crossing always exists for a range of at least `need` keys, and this is
/// the kernels' default otherwise).
#[cfg(not(target_arch = "nvptx64"))]
fn crossing_of(hist: &[u32; BUCKETS as usize], need: u32) -> Crossing {
    let mut above = 0u32;
    for g in (0..BUCKETS / 4).rev() {
        let c = [0, 1, 2, 3].map(|d| hist[(4 * g + d) as usize]);
        if let Some(x) = crossing_in_group(c, g, above, need) {
            return x;
        }
        above += c.iter().sum::<u32>();
    }
    Crossing {
        digit: 0,
        above: 0,
        count: 0,
    }
}

/// Stage 1 run on the CPU as the kernels run it: the row split into
/// `ctas` chunks whose histograms are summed, the passes of
/// [`RadixSelect`] with the crossing found group by group, the gather and
/// the bitonic sort. Tests hold the GPU's slab to it bit for bit.
#[cfg(not(target_arch = "nvptx64"))]
pub fn select_slab(row: &[f32], top_k: u32, ctas: u32) -> CpuSelect {
    select_keys(
        row.len(),
        |j| composite(prob_bits(row[j as usize]), j),
        top_k,
        ctas,
    )
}

/// [`select_slab`] over f32 logits, keyed as the logits kernels key them
/// ([`logit_composite`] of [`crate::radix::f32_key`]: NaN as -inf): the
/// slab of `radix_topk_cluster_logits_f32` and how many keys its gather
/// leaves (more than [`FILTER_DIRECT_KEYS`] for a `top_k` of at most that:
/// the row's first CTA narrows them before the sort).
#[cfg(not(target_arch = "nvptx64"))]
pub fn select_logit_slab(row: &[f32], top_k: u32, ctas: u32) -> CpuSelect {
    let key = |j: u32| logit_composite(crate::radix::f32_key(row[j as usize].to_bits()), j);
    select_keys(row.len(), key, top_k, ctas)
}

/// [`select_slab`] over the composite keys `key(j)` of a row of `len`
/// elements.
#[cfg(not(target_arch = "nvptx64"))]
fn select_keys(len: usize, key: impl Fn(u32) -> u64, top_k: u32, ctas: u32) -> CpuSelect {
    let vocab = len.min(crate::sample::MAX_VOCAB as usize) as u32;
    let k = slab_len(top_k, vocab);
    let chunk = vocab.div_ceil(ctas.max(1)).max(1);
    let mut sel = RadixSelect::new(k);
    let threshold = loop {
        let mut hist = [0u32; BUCKETS as usize];
        // Per-CTA histograms, summed: the order of the sum is immaterial.
        for c in 0..vocab.div_ceil(chunk) {
            for j in c * chunk..((c + 1) * chunk).min(vocab) {
                if let Some(d) = sel.digit(key(j)) {
                    hist[d as usize] += 1;
                }
            }
        }
        if let Some(t) = sel.advance(crossing_of(&hist, sel.need())) {
            break t;
        }
    };
    let mut buf: Vec<u64> = (0..vocab).map(key).filter(|&x| x >= threshold).collect();
    let gathered = buf.len() as u32;
    let n = buf.len().max(2).next_power_of_two() as u32;
    buf.resize(n as usize, 0);
    let mut size = 2;
    while size <= n {
        let mut stride = size / 2;
        while stride > 0 {
            for i in 0..n / 2 {
                let (lo, hi, desc) = bitonic_pair(i, size, stride);
                let (a, b) = (buf[lo as usize], buf[hi as usize]);
                if (a < b) == desc && a != b {
                    buf.swap(lo as usize, hi as usize);
                }
            }
            stride /= 2;
        }
        size *= 2;
    }
    buf.truncate(k as usize);
    CpuSelect {
        slab: buf,
        passes: sel.passes(),
        gathered,
    }
}

/// Kernel parameters of `radix_topk_*` (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RadixArgs {
    /// Rows.
    pub batch: u32,
    /// Elements per row.
    pub vocab: u32,
    /// Elements between the starts of consecutive rows (>= `vocab`).
    pub row_stride: u64,
    /// Elements per CTA of a row: CTA `c` owns `[c chunk, (c + 1) chunk)`.
    pub chunk: u32,
    /// u32 slots of each CTA's shared-memory copy of its chunk (a multiple
    /// of 4; slots past it are read again from global memory); for
    /// `radix_topk_filter_f32`, its candidate buffer's capacity in keys (at
    /// least [`FILTER_MIN_CAP`]).
    pub cache_slots: u32,
    /// [`MODE_SLAB`] and / or [`MODE_SAMPLE`], or [`MODE_SLAB`] and
    /// [`MODE_MASK`].
    pub mode: u32,
    /// Reserved, 0.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<RadixArgs>() == 32);
const _: () = assert!(core::mem::align_of::<RadixArgs>() == 8);

/// `RadixArgs::mode` bit: write the slab (values, indices, count).
pub const MODE_SLAB: u32 = 1;
/// `RadixArgs::mode` bit: top-p and one draw per row (tokens, valid).
pub const MODE_SAMPLE: u32 = 2;
/// `RadixArgs::mode` bit, with [`MODE_SLAB`], for the staged filter kernels
/// over logits (sm_90 and newer, one CTA a row, `vocab` at most
/// [`FILTER_MASK_MAX_VOCAB`]): after writing a row's slab, write -inf in
/// place over every logit of the row outside it (the slab's elements keep
/// their bits), so that masking needs no pass of its own over the rows.
pub const MODE_MASK: u32 = 4;

/// Threads per CTA of the radix kernels.
pub const RADIX_THREADS: u32 = 512;

/// Bytes of a CTA's reduced histogram slice in a cluster of at least two
/// (at most half of the [`BUCKETS`] counts).
pub const RADIX_SLICE_BYTES: u32 = BUCKETS / 2 * 4;

/// Dynamic shared memory of a radix CTA before its chunk cache: two
/// histograms, the gather buffer, 512 bytes of reduction scratch and the
/// reduced histogram slice.
pub const RADIX_FIXED_SMEM: u32 = 2 * BUCKETS * 4 + GATHER_CAP * 8 + 512 + RADIX_SLICE_BYTES;

/// Dynamic shared memory of a radix CTA caching `cache_slots` elements.
pub const fn radix_smem_bytes(cache_slots: u32) -> u32 {
    RADIX_FIXED_SMEM + 4 * cache_slots
}

// ---------------------------------------------------------------------------
// The filter route: one CTA per row, one streaming pass, a running threshold.
// ---------------------------------------------------------------------------

/// 16-byte vectors each thread of the filter kernel loads per round.
pub const FILTER_ROUND_VECS: u32 = 4;
/// 16-byte groups (four elements) of the row one filter round covers.
pub const FILTER_ROUND_GROUPS: u32 = FILTER_ROUND_VECS * RADIX_THREADS;
/// Keys one filter round can push: every element of the round.
pub const FILTER_ROUND_KEYS: u32 = 4 * FILTER_ROUND_GROUPS;
/// Smallest candidate buffer (keys) of the filter kernel: a compaction
/// leaves at most [`GATHER_CAP`] keys, and a round must fit after it.
pub const FILTER_MIN_CAP: u32 = GATHER_CAP + FILTER_ROUND_KEYS;
/// Largest candidate buffer the host asks for (128 KiB of keys): twice a
/// round, so that the first compaction (after the first round) is the only
/// one a row in random order needs.
pub const FILTER_MAX_CAP: u32 = 2 * FILTER_ROUND_KEYS;
/// Dynamic shared memory of a filter CTA before its candidate buffer: the
/// radix layout without the cluster slice (the buffer starts where the
/// slice would).
pub const FILTER_FIXED_SMEM: u32 = RADIX_FIXED_SMEM - RADIX_SLICE_BYTES;

/// Bytes of a filter round's elements (f32): one stage of the staged
/// filter kernel (sm_90 and newer), which streams the row into shared
/// memory with bulk copies instead of registers.
pub const FILTER_STAGE_BYTES: u32 = 4 * FILTER_ROUND_KEYS;
/// Stages of the staged filter kernel: rounds in flight while one is
/// filtered (`FILTER_STAGES - 1` of them, 96 KiB).
pub const FILTER_STAGES: u32 = 4;
/// Largest vocabulary of a [`MODE_MASK`] launch: the row's bitmap of slab
/// elements fills the stages but the work space's (which holds the sorted
/// slab) at a row's end, when no round is in flight.
pub const FILTER_MASK_MAX_VOCAB: u32 = (FILTER_STAGES - 1) * FILTER_STAGE_BYTES * 8;
/// The part of the radix layout the selects over the candidate buffer and
/// the end of a row use as work space (the two histograms and the gather
/// buffer): the staged kernel puts it in a stage that holds no round at
/// the time (the stage of the round just filtered, before its refill).
pub const FILTER_WORK_BYTES: u32 = 2 * BUCKETS * 4 + GATHER_CAP * 8;
const _: () = assert!(FILTER_WORK_BYTES <= FILTER_STAGE_BYTES);
/// Dynamic shared memory of a staged filter CTA before its candidate
/// buffer: the stages, then the radix layout's scratch (its work space in
/// the stages).
pub const FILTER_STAGED_FIXED_SMEM: u32 =
    FILTER_STAGES * FILTER_STAGE_BYTES + FILTER_FIXED_SMEM - FILTER_WORK_BYTES;

/// The whole 16-byte groups of a row (of `end` slots, the first
/// `misalign` before the row: see [`filter_select`]), `lo..hi`: every
/// group but a first one the row starts inside and a last one it ends
/// inside.
#[inline(always)]
pub fn filter_whole_groups(misalign: u32, end: u32) -> (u32, u32) {
    (u32::from(misalign != 0), end / 4)
}

/// The groups the staged filter kernel bulk-copies for round `r` of such a
/// row: `a..b`, the round's whole groups (none when `a >= b`), 16-byte
/// aligned in global memory, copied to their places in the round's stage
/// (group `a` at byte `16 (a - r FILTER_ROUND_GROUPS)`). The round's other
/// groups inside the row are read slot by slot by their threads.
#[inline(always)]
pub fn filter_bulk_groups(misalign: u32, end: u32, r: u32) -> (u32, u32) {
    let (lo, hi) = filter_whole_groups(misalign, end);
    let first = r * FILTER_ROUND_GROUPS;
    (first.max(lo), (first + FILTER_ROUND_GROUPS).min(hi))
}

/// Dynamic shared memory of a filter CTA with a buffer of `cap` keys:
/// `staged` for the kernel of the sm_90 and newer modules (bulk copies
/// into [`FILTER_STAGES`] stages), else the kernel of the sm_80 and sm_89
/// modules (the row through registers).
pub const fn filter_smem_bytes(cap: u32, staged: bool) -> u32 {
    let fixed = if staged {
        FILTER_STAGED_FIXED_SMEM
    } else {
        FILTER_FIXED_SMEM
    };
    fixed + 8 * cap
}

/// Largest `top_k` of the small-`k` filter kernel (`radix_topk_filter_small_f32`,
/// the host's choice when every row's `k` is at most this): the seed of
/// [`seed_by_maxima`], the late compaction of [`filter_compaction`] and the
/// direct end of [`filter_direct`]. Kept out of the kernel for any `k`,
/// whose code for `k = 1000` they made 0.5 to 1.9 us slower on the H200
/// (session 26), though none of them runs there.
pub const FILTER_SMALL_MAX_K: u32 = 64;
const _: () = assert!(2 * FILTER_SMALL_MAX_K <= FILTER_DIRECT_KEYS);

/// Most keys the end of a filter row sorts as they are, without a final
/// select over its candidate buffer. Measured on the H200 (session 26,
/// k = 50): sorting 160 to 450 keys so cost 1 to 11 us more than the
/// select and a sort of about 50; 60 to 100 keys cost no more.
pub const FILTER_DIRECT_KEYS: u32 = 128;

/// Rounds before a row's end of the filter kernel's late compaction
/// ([`filter_compaction`]): the compaction after round `rounds -
/// FILTER_LATE_ROUNDS` runs while the staged kernel's later rounds (a full
/// ring, `FILTER_STAGES - 1` of them) are in flight.
pub const FILTER_LATE_ROUNDS: u32 = FILTER_STAGES;

/// Keys the late compaction of a row's top `k` leaves at most: `2 k`, at
/// least 64 (its select refines its crossing bucket until the keys at or
/// above it fit, so that the end of the row sorts few keys; at most
/// [`FILTER_DIRECT_KEYS`] for the `k` it runs for).
#[inline(always)]
pub fn filter_late_fit(k: u32) -> u32 {
    (2 * k).max(64)
}

/// The filter kernel's compaction of its candidate buffer after round
/// `round` (of `rounds`), holding `count` keys in a buffer of `cap`
/// (`compacted`: whether it compacted before in this row) for the top `k`
/// (`late`: in the small-`k` kernel): `Some(fit)` when it compacts, its
/// select refining its crossing bucket until the keys at or above it
/// number at most `fit` ([`RadixSelect::advance_within`]). It compacts when the next round might
/// not fit (`count > cap - FILTER_ROUND_KEYS`) and once early, as soon as
/// more than [`GATHER_CAP`] keys were seen, so that the threshold becomes
/// selective after the first round (both to [`GATHER_CAP`]); and late,
/// after round `rounds - FILTER_LATE_ROUNDS`, for `k` whose
/// [`filter_late_fit`] is at most [`FILTER_DIRECT_KEYS`] (up to 64), when
/// the buffer holds more than that fit, to that many, so that the few keys
/// the last rounds push leave a short buffer the row's end sorts without a final
/// select ([`filter_direct`]): that select then runs while the last
/// rounds stream in instead of after them. Never after the last round
/// (the final select follows).
#[inline(always)]
pub fn filter_compaction(
    round: u32,
    rounds: u32,
    count: u32,
    cap: u32,
    compacted: bool,
    k: u32,
    late: bool,
) -> Option<u32> {
    let fit = filter_late_fit(k);
    if round + 1 >= rounds {
        None
    } else if late
        && round + FILTER_LATE_ROUNDS == rounds
        && fit <= FILTER_DIRECT_KEYS
        && count > fit
    {
        Some(fit)
    } else if count > cap.saturating_sub(FILTER_ROUND_KEYS) || (!compacted && count > GATHER_CAP) {
        Some(GATHER_CAP)
    } else {
        None
    }
}

/// Keys the final select of a filter row leaves at most: `k` rounded up to
/// a power of two, at least [`FILTER_DIRECT_KEYS`] (its select refines its
/// crossing bucket until the keys at or above it fit, or to the last
/// pass's bucket), so that the row's end sorts the next power of two
/// above `k` (1024 keys at `k = 1000`, where [`GATHER_CAP`] left 1000 to
/// 1400 keys on most rows of Gaussian logits, a network over 2048).
#[inline(always)]
pub fn filter_final_fit(k: u32) -> u32 {
    k.next_power_of_two().clamp(FILTER_DIRECT_KEYS, GATHER_CAP)
}

/// Whether the end of a filter row sorts its `count` candidates as they
/// are (they hold the row's top keys, and keys below them) instead of
/// selecting among them first.
#[inline(always)]
pub fn filter_direct(count: u32) -> bool {
    count <= FILTER_DIRECT_KEYS
}

/// Whether the filter kernel's seed histograms only each thread's largest
/// element of the first round (one key a thread, [`RADIX_THREADS`] of
/// them) instead of all of the round's elements: for `k` up to the
/// threads. At least `k` of those maxima lie in the crossing bucket or
/// above it, and they are distinct elements of the round, so the seed's
/// threshold still never exceeds the row's `k`-th key. The top `k` of the
/// maxima are nearly those of the round (they differ where one thread
/// holds two of them), so the threshold is about as selective, for a
/// histogram of 512 keys instead of 8192 (the seed was about 2.2 us of
/// the first round's 3 us at B = 128 on the H200, session 25).
#[inline(always)]
pub fn seed_by_maxima(k: u32) -> bool {
    k <= RADIX_THREADS
}

/// The filter kernel's first threshold of a row from the crossing digit
/// of a first pass over its first round: that digit's lowest key, 0 for
/// the zero digit (the round has fewer than `k` positive values).
#[inline(always)]
pub fn seed_threshold(digit: u32) -> u64 {
    u64::from(digit) << (KEY_BITS - DIGIT_BITS)
}

/// Whether the filter kernel pushes the element at `index` with bit
/// pattern `raw` (as stored) against its running threshold `t`. While `t`
/// has no value bits, exactly when its key is `>= t`; after, when its
/// clean bits are at least `t`'s (`raw` in `[t >> 32, f32::MAX]`, two
/// integer operations): every key `>= t`, and the keys of equal value
/// bits below it, which is harmless (the buffer keeps every key `>= t` it
/// saw, and only keys of the row). Bad values and zeros never pass then.
#[inline(always)]
pub fn filter_pushes(raw: u32, index: u32, t: u64) -> bool {
    let t_bits = composite_bits(t);
    if t_bits == 0 {
        composite(prob_bits(f32::from_bits(raw)), index) >= t
    } else {
        // Clean bits of at most f32::MAX: `t_bits <= 0x7f7f_ffff`.
        raw.wrapping_sub(t_bits) <= 0x7f7f_ffffu32.wrapping_sub(t_bits)
    }
}

/// What [`filter_select`] found.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterStats {
    /// The sorted slab: `slab_len(top_k, V)` composite keys.
    pub slab: Vec<u64>,
    /// Compactions during the streaming pass.
    pub compactions: u32,
    /// Radix passes: the first round's seed, compactions and the final
    /// select (none when [`filter_direct`]).
    pub passes: u32,
    /// Keys pushed into the buffer over the row.
    pub pushed: u32,
    /// Most keys the buffer held (at most its capacity when `cap >=
    /// FILTER_MIN_CAP`).
    pub peak: u32,
    /// Most keys a compaction kept (at most [`GATHER_CAP`]).
    pub max_kept: u32,
    /// Keys gathered for the sort.
    pub gathered: u32,
}

/// The filter kernel's stage 1 run on the CPU: the row streamed in rounds
/// of [`FILTER_ROUND_GROUPS`] 16-byte groups (the row starting `misalign`
/// elements past a 16-byte boundary, as the kernel's groups do), the keys
/// [`filter_pushes`] passes pushed into a buffer of `cap` keys,
/// compactions where [`filter_compaction`] says (the radix select of
/// [`RadixSelect`] over the buffer; the threshold rises to its result and
/// the buffer keeps the keys at or above it), the final select and the
/// gather (unless [`filter_direct`]) and the sort; `small`: as the
/// small-`k` filter kernel runs it (the seed of [`seed_by_maxima`], the
/// late compaction and the direct end), else as the kernel for any `k`.
/// Its slab equals [`select_slab`]'s; the statistics say what the kernel
/// does on a row.
/// `cap` is at least [`FILTER_MIN_CAP`] (the host's guarantee; below it the
/// emulation still runs, and `peak` says by how much the kernel's buffer
/// would overflow).
#[cfg(not(target_arch = "nvptx64"))]
pub fn filter_select(row: &[f32], top_k: u32, cap: u32, misalign: u32, small: bool) -> FilterStats {
    let vocab = row.len().min(crate::sample::MAX_VOCAB as usize) as u32;
    let misalign = misalign % 4;
    let key = |j: u32| composite(prob_bits(row[j as usize]), j);
    let k = slab_len(top_k, vocab);
    let groups = (misalign + vocab).div_ceil(4);
    let rounds = groups.div_ceil(FILTER_ROUND_GROUPS);
    let mut buf: Vec<u64> = Vec::new();
    let mut stats = FilterStats {
        slab: Vec::new(),
        compactions: 0,
        passes: 0,
        pushed: 0,
        peak: 0,
        max_kept: 0,
        gathered: 0,
    };
    // The radix select over the buffer: its threshold (at most `fit` keys
    // of the buffer at or above it, or the last pass's bucket).
    let narrow = |buf: &[u64], passes: &mut u32, fit: u32| -> u64 {
        let mut sel = if small {
            RadixSelect::new(k)
        } else {
            let lo = buf.iter().map(|&x| composite_bits(x)).min().unwrap_or(0);
            let hi = buf.iter().map(|&x| composite_bits(x)).max().unwrap_or(0);
            RadixSelect::within_bits(k, lo, hi)
        };
        loop {
            let mut hist = [0u32; BUCKETS as usize];
            for &x in buf {
                if let Some(d) = sel.digit(x) {
                    hist[d as usize] += 1;
                }
            }
            *passes += 1;
            if let Some(t) = sel.advance_within(crossing_of(&hist, sel.need()), fit) {
                break t;
            }
        }
    };
    let mut t = 0u64;
    let mut compacted = false;
    for r in 0..rounds {
        // Slots of the round: slot s is element s - misalign.
        let first = r * FILTER_ROUND_GROUPS * 4;
        let last = ((r + 1) * FILTER_ROUND_GROUPS * 4).min(misalign + vocab);
        if r == 0 {
            // The seed: one pass over the round's first digits, or over
            // those of each thread's largest element (thread `t` holds the
            // slots of groups `t + j RADIX_THREADS`, j < FILTER_ROUND_VECS;
            // a thread without a slot in the row counts a zero).
            let mut hist = [0u32; BUCKETS as usize];
            let inside = |s: u32| s >= misalign && s < last;
            let bits = |s: u32| prob_bits(row[(s - misalign) as usize]);
            if small && seed_by_maxima(k) {
                for t in 0..RADIX_THREADS {
                    let top = (0..FILTER_ROUND_VECS)
                        .flat_map(|j| (0..4).map(move |e| 4 * (t + j * RADIX_THREADS) + e))
                        .filter(|&s| inside(s))
                        .map(bits)
                        .max()
                        .unwrap_or(0);
                    hist[first_digit(top) as usize] += 1;
                }
            } else {
                for s in first.max(misalign)..last {
                    hist[first_digit(bits(s)) as usize] += 1;
                }
            }
            stats.passes += 1;
            t = seed_threshold(crossing_of(&hist, k).digit);
        }
        for s in first.max(misalign)..last {
            let j = s - misalign;
            if filter_pushes(row[j as usize].to_bits(), j, t) {
                buf.push(key(j));
                stats.pushed += 1;
            }
        }
        stats.peak = stats.peak.max(buf.len() as u32);
        if let Some(fit) = filter_compaction(r, rounds, buf.len() as u32, cap, compacted, k, small)
        {
            t = narrow(&buf, &mut stats.passes, fit).max(t);
            buf.retain(|&x| x >= t);
            stats.max_kept = stats.max_kept.max(buf.len() as u32);
            stats.compactions += 1;
            compacted = true;
        }
    }
    if !(small && filter_direct(buf.len() as u32)) {
        let threshold = narrow(&buf, &mut stats.passes, filter_final_fit(k)).max(t);
        buf.retain(|&x| x >= threshold);
    }
    stats.gathered = buf.len() as u32;
    buf.sort_unstable_by(|a, b| b.cmp(a));
    buf.truncate(k as usize);
    stats.slab = buf;
    stats
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// A tiny deterministic generator (no dependencies in this crate).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) as u32
        }
        fn below(&mut self, n: u32) -> u32 {
            self.next() % n
        }
    }

    /// The top `k'` composite keys by sorting.
    fn sorted_top(row: &[f32], top_k: u32) -> Vec<u64> {
        let mut keys: Vec<u64> = (0..row.len() as u32)
            .map(|j| composite(prob_bits(row[j as usize]), j))
            .collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        keys.truncate(slab_len(top_k, row.len() as u32) as usize);
        keys
    }

    fn row(rng: &mut Lcg, kind: u32, vocab: usize) -> Vec<f32> {
        (0..vocab)
            .map(|_| match kind {
                // Softmax-like: exponents spread over many octaves.
                0 => f32::from_bits(0x2000_0000 + rng.below(0x1f00_0000)),
                // Few distinct values: ties everywhere.
                1 => (rng.below(3) as f32) * 0.25,
                // Mostly zero (underflowed), some bad values.
                2 => match rng.below(10) {
                    0 => f32::NAN,
                    1 => -0.5,
                    2 => f32::INFINITY,
                    3 => 1.0e-3 * (1 + rng.below(5)) as f32,
                    4 => f32::from_bits(rng.below(0x0080_0000)),
                    _ => 0.0,
                },
                // A narrow band of values: crowded buckets.
                _ => 0.5 + (rng.below(1 << 12) as f32) * 1.0e-7,
            })
            .collect()
    }

    #[test]
    fn logit_keys_fit_the_passes_and_follow_value_then_index() {
        use crate::radix::{f32_from_key, f32_key};
        let mut rng = Lcg(0x5eed);
        let specials = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            1.0e-45,
            -1.0e-45,
            1.0,
            -1.0,
        ];
        let mut values: Vec<f32> = specials.to_vec();
        values.extend((0..2000).map(|_| f32::from_bits(rng.next() << 1 | rng.next() & 1)));
        let max_index = (crate::sample::MAX_VOCAB - 1) as u32;
        for (i, &a) in values.iter().enumerate() {
            let key = f32_key(a.to_bits());
            let index = if i % 2 == 0 {
                rng.below(1 << 20)
            } else {
                max_index
            };
            let c = logit_composite(key, index);
            assert!(c < 1 << KEY_BITS, "{a}");
            assert_eq!(logit_composite_key(c), key);
            assert_eq!(logit_composite_index(c), index);
            assert_eq!(f32_from_key(logit_composite_key(c)), f32_from_key(key));
            let digit = first_digit(high_word(c));
            assert!(digit < BUCKETS);
            assert_eq!(RadixSelect::new(1).digit(c), Some(digit));
            // Against the next value: larger value first (NaN as -inf,
            // -0.0 below +0.0 as the keys order them), then lower index.
            let b = values[(i + 1) % values.len()];
            let other = logit_composite(f32_key(b.to_bits()), index ^ 1);
            let (ka, kb) = (f32_key(a.to_bits()), f32_key(b.to_bits()));
            let want = ka.cmp(&kb).then((index ^ 1).cmp(&index));
            assert_eq!(
                c.cmp(&other),
                want,
                "{a} at {index} vs {b} at {}",
                index ^ 1
            );
            if !a.is_nan() && !b.is_nan() && a != b {
                assert_eq!(c > other, a > b, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn keys_follow_the_total_order() {
        assert_eq!(prob_bits(f32::NAN), 0);
        assert_eq!(prob_bits(-1.0), 0);
        assert_eq!(prob_bits(-0.0), 0);
        assert_eq!(prob_bits(f32::INFINITY), 0);
        assert_eq!(prob_bits(1.0e-45), 1);
        assert!(composite(prob_bits(0.5), 7) > composite(prob_bits(0.25), 0));
        assert!(composite(5, 3) > composite(5, 4));
        assert_eq!(composite_index(composite(9, 123_456)), 123_456);
        assert_eq!(composite_bits(composite(9, 4)), 9);
        assert!(composite(0x7f7f_ffff, 0) < 1 << KEY_BITS);
        for bits in [0u32, 1, 0x0010_0000, 0x3f80_0000, 0x7f7f_ffff] {
            let d = RadixSelect::new(1).digit(composite(bits, 77));
            assert_eq!(d, Some(first_digit(bits)));
        }
        assert_eq!(slab_len(0, 10), 1);
        assert_eq!(slab_len(50, 10), 10);
        assert_eq!(slab_len(5000, 1 << 20), SLAB);
    }

    #[test]
    fn bitonic_network_sorts_descending() {
        let mut rng = Lcg(3);
        for n in [2u32, 4, 8, 64, 1024, 2048] {
            let mut v: Vec<u64> = (0..n).map(|_| u64::from(rng.below(50))).collect();
            let mut want = v.clone();
            want.sort_unstable_by(|a, b| b.cmp(a));
            let mut size = 2;
            while size <= n {
                let mut stride = size / 2;
                while stride > 0 {
                    let mut touched = std::vec![false; n as usize];
                    for i in 0..n / 2 {
                        let (lo, hi, desc) = bitonic_pair(i, size, stride);
                        assert!(!touched[lo as usize] && !touched[hi as usize]);
                        touched[lo as usize] = true;
                        touched[hi as usize] = true;
                        let (a, b) = (v[lo as usize], v[hi as usize]);
                        if (a < b) == desc && a != b {
                            v.swap(lo as usize, hi as usize);
                        }
                    }
                    stride /= 2;
                }
                size *= 2;
            }
            assert_eq!(v, want, "n = {n}");
        }
    }

    #[test]
    fn crossing_is_found_in_exactly_one_group() {
        let mut rng = Lcg(5);
        for _ in 0..2000 {
            let hist: Vec<u32> = (0..BUCKETS)
                .map(|_| if rng.below(4) == 0 { rng.below(9) } else { 0 })
                .collect();
            let total: u32 = hist.iter().sum();
            if total == 0 {
                continue;
            }
            let need = 1 + rng.below(total);
            let mut above = 0;
            let mut found = Vec::new();
            for g in (0..BUCKETS / 4).rev() {
                let c = [0, 1, 2, 3].map(|d| hist[(4 * g + d) as usize]);
                if let Some(x) = crossing_in_group(c, g, above, need) {
                    found.push(x);
                }
                above += c.iter().sum::<u32>();
            }
            assert_eq!(found.len(), 1);
            let x = found[0];
            let higher: u32 = hist[x.digit as usize + 1..].iter().sum();
            assert_eq!((x.above, x.count), (higher, hist[x.digit as usize]));
            assert!(x.above < need && x.above + x.count >= need);
        }
    }

    #[test]
    fn cpu_select_matches_sorting() {
        let mut rng = Lcg(11);
        let mut passes = [0u32; MAX_PASSES as usize + 1];
        for case in 0..400 {
            let vocab = [1usize, 3, 111, 1024, 4099, 20_000][case % 6];
            let kind = rng.below(4);
            let r = row(&mut rng, kind, vocab);
            for top_k in [1, 10, 50, 1000, 1024, vocab as u32] {
                let ctas = 1 + rng.below(8);
                let s = select_slab(&r, top_k, ctas);
                assert_eq!(
                    s.slab,
                    sorted_top(&r, top_k),
                    "V={vocab} kind {kind} k={top_k}"
                );
                assert!((1..=MAX_PASSES).contains(&s.passes));
                assert!(s.gathered <= GATHER_CAP && s.gathered as usize >= s.slab.len());
                passes[s.passes as usize] += 1;
            }
        }
        // Crowded rows take a second or third pass, rows of many ties the
        // fifth (index bits 18..8; the fourth, index bits 29..19, only
        // splits vocabularies above 2^19).
        assert!([1, 2, 3, 5].iter().all(|&p| passes[p] > 0), "{passes:?}");
    }

    #[test]
    fn cpu_logit_select_matches_sorting() {
        use crate::radix::f32_key;
        let mut rng = Lcg(12);
        let mut narrowed = 0;
        for case in 0..300 {
            let vocab = [1usize, 3, 111, 1024, 4099, 20_000][case % 6];
            let kind = rng.below(4);
            // Logits of either sign, -inf and NaN among them.
            let r: Vec<f32> = row(&mut rng, kind, vocab)
                .into_iter()
                .map(|x| if rng.below(2) == 0 { x } else { -x })
                .collect();
            for top_k in [1, 10, 50, 128, 1000, vocab as u32] {
                let s = select_logit_slab(&r, top_k, 1 + rng.below(8));
                let mut keys: Vec<u64> = (0..vocab as u32)
                    .map(|j| logit_composite(f32_key(r[j as usize].to_bits()), j))
                    .collect();
                keys.sort_unstable_by(|a, b| b.cmp(a));
                keys.truncate(slab_len(top_k, vocab as u32) as usize);
                assert_eq!(s.slab, keys, "V={vocab} kind {kind} k={top_k}");
                assert!(s.gathered <= GATHER_CAP && s.gathered as usize >= s.slab.len());
                narrowed += u32::from(top_k <= FILTER_DIRECT_KEYS && !filter_direct(s.gathered));
            }
        }
        // Crowded and tied rows gather more keys than a small top-k needs.
        assert!(narrowed > 0);
    }

    #[test]
    fn select_within_the_keys_bits_finds_the_top_keys() {
        let mut rng = Lcg(23);
        for case in 0..300 {
            let n = 1 + rng.below(5000) as usize;
            let kind = rng.below(4);
            let r = row(&mut rng, kind, n);
            let keys: Vec<u64> = (0..n as u32)
                .map(|j| composite(prob_bits(r[j as usize]), j))
                .collect();
            let lo = keys.iter().map(|&x| composite_bits(x)).min().unwrap_or(0);
            let hi = keys.iter().map(|&x| composite_bits(x)).max().unwrap_or(0);
            let k = 1 + rng.below(n.min(SLAB as usize) as u32);
            let fit = [k, k.next_power_of_two(), GATHER_CAP][case % 3].max(k);
            let mut sel = RadixSelect::within_bits(k, lo, hi);
            let t = loop {
                let mut hist = [0u32; BUCKETS as usize];
                for &x in &keys {
                    if let Some(d) = sel.digit(x) {
                        hist[d as usize] += 1;
                    }
                }
                if let Some(t) = sel.advance_within(crossing_of(&hist, sel.need()), fit) {
                    break t;
                }
            };
            let mut sorted = keys.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let at_or_above = keys.iter().filter(|&&x| x >= t).count() as u32;
            assert!(
                sorted[k as usize - 1] >= t,
                "case {case}: the k-th key is below t"
            );
            assert!(at_or_above <= GATHER_CAP, "case {case}: {at_or_above} keys");
            assert!(sel.passes() <= MAX_PASSES, "case {case}");
        }
    }

    #[test]
    fn filter_select_matches_sorting() {
        let mut rng = Lcg(17);
        let mut compactions = 0;
        for case in 0..240 {
            let vocab = [1usize, 3, 111, 2049, 8193, 20_000, 40_000][case % 7];
            let kind = rng.below(6);
            let mut r = row(&mut rng, kind.min(3), vocab);
            // Adversarial orders: ascending (every round beats the
            // threshold) and descending.
            match kind {
                4 => r.sort_by_key(|a| prob_bits(*a)),
                5 => r.sort_by_key(|a| core::cmp::Reverse(prob_bits(*a))),
                _ => {}
            }
            for top_k in [1, 10, 50, 1000, 1024, vocab as u32] {
                // The smallest buffer, the H200's staged one (227 KiB
                // less the stages) and the largest.
                for cap in [FILTER_MIN_CAP, 12_608, FILTER_MAX_CAP] {
                    let misalign = rng.below(4);
                    let small = top_k <= FILTER_SMALL_MAX_K && case % 2 == 1;
                    let f = filter_select(&r, top_k, cap, misalign, small);
                    assert_eq!(
                        f.slab,
                        sorted_top(&r, top_k),
                        "V={vocab} kind {kind} k={top_k} cap {cap} misalign {misalign}"
                    );
                    assert!(f.peak <= cap, "V={vocab} kind {kind}: peak {}", f.peak);
                    assert!(f.max_kept <= GATHER_CAP && f.gathered <= GATHER_CAP);
                    assert!(f.gathered as usize >= f.slab.len());
                    compactions += f.compactions;
                }
            }
        }
        assert!(compactions > 0);
    }

    #[test]
    fn filter_layouts() {
        // A round of f32 per stage, 16-byte groups; the work space fits a
        // stage; the staged layout (three rounds in flight) with the
        // smallest buffer fits the 227 KiB a CTA of sm_90 can have.
        assert_eq!(FILTER_STAGE_BYTES, 32_768);
        assert_eq!(FILTER_STAGE_BYTES, 16 * FILTER_ROUND_GROUPS);
        assert_eq!(FILTER_WORK_BYTES, FILTER_STAGE_BYTES);
        assert_eq!((FILTER_STAGES - 1) * FILTER_STAGE_BYTES, 96 * 1024);
        assert_eq!(FILTER_STAGED_FIXED_SMEM, 4 * 32_768 + 512);
        assert_eq!(filter_smem_bytes(FILTER_MIN_CAP, true), 213_504);
        assert!(filter_smem_bytes(FILTER_MIN_CAP, true) <= 232_448);
        assert_eq!(filter_smem_bytes(FILTER_MAX_CAP, false), 164_352);
        // The candidate buffer starts 16-byte aligned in both layouts.
        assert_eq!(filter_smem_bytes(0, true) % 16, 0);
        assert_eq!(filter_smem_bytes(0, false) % 16, 0);
    }

    #[test]
    fn filter_bulk_copies_cover_each_element_once() {
        // Every slot of the row, round by round, either in the round's bulk
        // copy (whole groups only, inside the round and the row) or read
        // by its thread slot by slot (the other groups below `groups`,
        // slots inside the row), exactly once; nothing outside the row.
        for misalign in 0..4u32 {
            for vocab in [
                1u32, 2, 3, 4, 5, 7, 8, 9, 8188, 8189, 8191, 8192, 8193, 8195, 16_380, 16_383,
                16_384, 16_385, 40_003, 128_256, 151_936,
            ] {
                let end = misalign + vocab;
                let groups = end.div_ceil(4);
                let rounds = groups.div_ceil(FILTER_ROUND_GROUPS);
                let (lo, hi) = filter_whole_groups(misalign, end);
                let mut seen = std::vec![0u8; end as usize];
                for r in 0..rounds {
                    let first = r * FILTER_ROUND_GROUPS;
                    let (a, b) = filter_bulk_groups(misalign, end, r);
                    if a < b {
                        assert!(a >= first && b <= first + FILTER_ROUND_GROUPS);
                        assert!(4 * a >= misalign && 4 * b <= end);
                        assert!(16 * (b - a) <= FILTER_STAGE_BYTES);
                    }
                    for g in first..first + FILTER_ROUND_GROUPS {
                        let copied = g >= a && g < b;
                        // The thread's choice (filter_stage_load).
                        assert_eq!(copied, g >= lo && g < hi, "V={vocab} m={misalign} g={g}");
                        for e in 0..4 {
                            let slot = 4 * g + e;
                            let inside = slot >= misalign && slot < end;
                            if copied {
                                assert!(inside);
                                seen[slot as usize] += 1;
                            } else if g < groups && inside {
                                seen[slot as usize] += 1;
                            }
                        }
                    }
                }
                assert!(seen[..misalign as usize].iter().all(|&n| n == 0));
                assert!(
                    seen[misalign as usize..].iter().all(|&n| n == 1),
                    "V={vocab} m={misalign}"
                );
            }
        }
    }

    #[test]
    fn filter_seeds_once_on_rows_in_random_order() {
        // V = 128256, k = 50, values in random order. Values over many
        // octaves: the first round's seed settles, and the late compaction
        // (four rounds before the end) is the only one; the buffer is then
        // sorted without a final select. A narrow band of 4096 values: the
        // seed's bucket holds the whole first round, which is pushed, and
        // the compaction after it makes the threshold selective.
        let mut rng = Lcg(23);
        // (kind, compactions, most pushes in 1000 elements of the row)
        for (kind, compactions, per_mille) in [(0, 1, 10), (3, 2, 100)] {
            let r = row(&mut rng, kind, 128_256);
            let f = filter_select(&r, 50, FILTER_MAX_CAP, 0, true);
            assert_eq!(f.slab, sorted_top(&r, 50));
            std::println!(
                "kind {kind}: compactions {}, passes {}, pushed {}, peak {}, gathered {}",
                f.compactions,
                f.passes,
                f.pushed,
                f.peak,
                f.gathered
            );
            assert_eq!(f.compactions, compactions);
            // The end sorts the buffer as it is, a few keys past the fit.
            assert!(f.gathered <= filter_late_fit(50) + 50, "{}", f.gathered);
            assert!(f.pushed * 1000 < per_mille * 128_256, "{}", f.pushed);
        }
        // The seed by the threads' maxima is selective: about k keys of
        // each later round pass it (k = 50, 16 rounds: under 1.5 k a round).
        assert!(seed_by_maxima(50) && !seed_by_maxima(RADIX_THREADS + 1));
        let r = row(&mut rng, 0, 128_256);
        let f = filter_select(&r, 50, FILTER_MAX_CAP, 0, true);
        assert!(f.pushed < 16 * 75, "{}", f.pushed);
        // Ascending: the seed settles on the first round, then every
        // round's keys pass: a compaction after every round but the first
        // and the last.
        let mut r = row(&mut rng, 0, 128_256);
        r.sort_by_key(|a| prob_bits(*a));
        let f = filter_select(&r, 50, FILTER_MAX_CAP, 0, true);
        assert_eq!(f.slab, sorted_top(&r, 50));
        assert_eq!(f.compactions, 128_256u32.div_ceil(FILTER_ROUND_KEYS) - 2);
        let compacts = |round, rounds, count, compacted, k| {
            filter_compaction(round, rounds, count, FILTER_MAX_CAP, compacted, k, true)
        };
        assert_eq!(compacts(0, 1, FILTER_MAX_CAP, false, 50), None);
        assert_eq!(compacts(0, 2, GATHER_CAP + 1, false, 50), Some(GATHER_CAP));
        assert_eq!(compacts(0, 2, GATHER_CAP + 1, true, 50), None);
        let full = FILTER_MAX_CAP - FILTER_ROUND_KEYS + 1;
        assert_eq!(compacts(3, 9, full, true, 1000), Some(GATHER_CAP));
        // The late compaction: four rounds before the end, for a buffer
        // longer than its fit, for k up to a quarter of the direct sort.
        let late = |round, count, k| compacts(round, 16, count, true, k);
        assert_eq!(filter_late_fit(1), 64);
        assert_eq!(filter_late_fit(50), 100);
        assert_eq!(late(12, 101, 50), Some(100));
        assert_eq!(late(12, full, 50), Some(100));
        assert_eq!(late(12, 100, 50), None);
        assert_eq!(
            late(12, 1000, FILTER_DIRECT_KEYS / 2),
            Some(FILTER_DIRECT_KEYS)
        );
        assert_eq!(late(12, 1000, FILTER_DIRECT_KEYS / 2 + 1), None);
        assert_eq!((late(11, 1000, 50), late(13, 1000, 50)), (None, None));
        assert!(filter_direct(FILTER_DIRECT_KEYS) && !filter_direct(FILTER_DIRECT_KEYS + 1));
        // The push test: exact without value bits in the threshold, by
        // value bits (ties included) with them; bad values never.
        let t0 = composite(0, 10);
        assert!(filter_pushes(0, 10, t0) && !filter_pushes(0, 11, t0));
        assert!(filter_pushes(f32::NAN.to_bits(), 3, t0));
        let t = composite(0.5f32.to_bits(), 10);
        assert!(filter_pushes(0.5f32.to_bits(), 11, t));
        assert!(filter_pushes(f32::MAX.to_bits(), 11, t));
        assert!(!filter_pushes(0.25f32.to_bits(), 0, t));
        for bad in [f32::NAN, f32::INFINITY, -1.0, -0.0, 0.0] {
            assert!(!filter_pushes(bad.to_bits(), 0, t), "{bad}");
        }
    }

    #[test]
    fn fixed_masses_are_exact_near_the_top_and_sum_without_overflow() {
        let top = 1.5f32.to_bits();
        assert_eq!(fixed_mass(top, top), 0x00c0_0000 << MASS_SHIFT);
        assert_eq!(
            fixed_mass(0.75f32.to_bits(), top),
            0x00c0_0000 << (MASS_SHIFT - 1)
        );
        assert_eq!(fixed_mass(0, top), 0);
        // 2^-40 of the top is truncated, 2^-60 vanishes.
        assert_eq!(
            fixed_mass((1.5f32 * 2f32.powi(-40)).to_bits(), top),
            0x00c0_0000 >> 10
        );
        assert_eq!(fixed_mass((1.5f32 * 2f32.powi(-60)).to_bits(), top), 0);
        // Subnormals: 2^-149 against 2^-100 is 2^-49 of the top's 2^53.
        assert_eq!(fixed_mass(1, 1), 1 << MASS_SHIFT);
        assert_eq!(fixed_mass(1, 2f32.powi(-100).to_bits()), 1 << 4);
        let big = f32::MAX.to_bits();
        let total = (0..SLAB).fold(0u64, |s, _| s.checked_add(fixed_mass(big, big)).unwrap());
        assert!(total > 0);
        // Relative to f64 the masses agree to 2^-53 of the largest.
        let mut rng = Lcg(7);
        for _ in 0..1000 {
            let t = f32::from_bits(0x3000_0000 + rng.below(0x1000_0000));
            let x = t * (rng.below(1000) as f32 / 1000.0);
            let w = fixed_mass(prob_bits(x), t.to_bits()) as f64;
            let scale = 2f64.powi(MASS_SHIFT + 150 - (t.to_bits() >> 23) as i32);
            let exact = f64::from(x) * scale;
            assert!(w <= exact && exact - w < 1.0, "{x} {t}");
        }
    }

    #[test]
    fn draws_follow_the_cut_and_the_uniform() {
        let slab: Vec<u64> = [0.5f32, 0.25, 0.125, 0.125, 0.0]
            .iter()
            .enumerate()
            .map(|(j, &x)| composite(prob_bits(x), j as u32))
            .collect();
        // Exclusive masses 0, .5, .75, .875, 1 (of 1): top-p 0.75 keeps
        // exactly two (the third's exclusive mass equals the threshold).
        let d = draw_from_slab(&slab, 0.75, 0.1).unwrap();
        assert_eq!(
            d,
            Drawn {
                kept: 2,
                position: 0
            }
        );
        // Renormalised over 0.75: u = 0.7 lands in the second (0.5 / 0.75
        // = 0.667).
        assert_eq!(draw_from_slab(&slab, 0.75, 0.7).unwrap().position, 1);
        assert_eq!(draw_from_slab(&slab, 0.76, 0.9999).unwrap().kept, 3);
        // top-p 1 keeps the zero too, which is never drawn.
        let all = draw_from_slab(&slab, 1.0, 0.999_999).unwrap();
        assert_eq!(
            all,
            Drawn {
                kept: 5,
                position: 3
            }
        );
        assert_eq!(draw_from_slab(&slab, 1.0e-9, 0.999).unwrap().kept, 1);
        assert_eq!(draw_from_slab(&[composite(0, 0)], 0.5, 0.5), None);
        assert_eq!(draw_from_slab(&[], 0.5, 0.5), None);
    }

    #[test]
    fn prob_logits_are_monotone() {
        let xs = [1.0e-45f32, 1.0e-40, 1.0e-38, 1.0e-10, 0.1, 0.5, 1.0];
        for w in xs.windows(2) {
            assert!(prob_logit(prob_bits(w[0])) < prob_logit(prob_bits(w[1])));
        }
        assert_eq!(prob_logit(0), f32::NEG_INFINITY);
        assert!((prob_logit(prob_bits(0.5)) - 0.5f32.ln()).abs() < 1e-6);
        let smallest = f64::from(f32::from_bits(1)).ln() as f32;
        assert!((prob_logit(1) - smallest).abs() < 1e-4);
    }
}
