//! Portable heart of the Qrita top-k / top-p / min-p truncation (issue 4):
//! the Gaussian sigma pre-filter table and the exact quaternary pivot
//! search, written so that the GPU kernel calls the very functions the CPU
//! driver [`select_row`] runs here.
//!
//! # Order and keys
//!
//! Elements are compared through [`f32_key`]: NaN ranks with -inf, -0.0
//! just below +0.0. The total order is key descending, then index
//! ascending. Every filter keeps a prefix of that order, described by a
//! [`Cut`]: all elements with a key above `cut.key`, plus those with key
//! `cut.key` and an index below `cut.index_end`.
//!
//! # Pre-filter derivation
//!
//! With `mu`, `sigma` the mean and standard deviation of the row's finite
//! logits, the pre-filter keeps `x >= t = mu + delta * sigma`; it is a
//! speed device only: whenever it could have dropped a kept element the
//! driver falls back to the whole row, so the kept set never depends on it.
//!
//! - **top-k**: for Gaussian logits the count above `t` is
//!   `Binomial(V, q)` with `q = 1 - Phi(delta)`. Asking for an expected count
//!   `m(k) = 2k + 6 sqrt(k) + 16` (so `m - k >= sqrt(m) * max(5, ...)`: the
//!   Poisson/normal tail `P(count < k)` is below about `1e-6` for every
//!   `k`, e.g. `m = 24` for `k = 1`, `P = e^-24`) gives
//!   `delta = Phi^-1(1 - m(k) / V)`, looked up in [`UPPER_QUANTILE`] and
//!   rounded *down* (more survivors). The estimation error of `mu` and
//!   `sigma` (relative `1 / sqrt(2V)`) is far inside that margin.
//! - **top-p** (no top-k): for Gaussian scaled logits `y ~ N(mu, s^2)` the
//!   softmax weights `e^y` tilt the distribution to `N(mu + s^2, s^2)`
//!   (exponential tilting), so by the law of large numbers the fraction of
//!   the mass above `mu + delta s` is `1 - Phi(delta - s)`, and the top-p
//!   set ends at `delta = s - Phi^-1(p)`. We use
//!   `delta = s - Phi^-1(p) - 0.5` (`Phi^-1(p)` rounded *up*), capped at
//!   the top-k delta for 16 elements. Assumptions: the law of large numbers
//!   needs the effective sample size `V e^{-s^2}` of the weights to be
//!   large (`s` up to about 2.5 for `V = 150k`); for larger `s` the mass
//!   sits on the few largest logits, which the cap keeps. When the
//!   survivors' mass falls short of `p` times the row's mass the driver
//!   falls back to the whole row (exact, only slower).
//! - `V` is the number of *finite* entries (NaN and -inf are outside the
//!   Gaussian model; rows with +inf skip the pre-filter), and `t` never
//!   exceeds the row's max (rows of few distinct values then still hit when
//!   the max repeats often enough).
//! - **Second tier**: the same pass also counts above a looser threshold
//!   ([`SECOND_TIER_FACTOR`] times the expected survivors for top-k,
//!   [`TOP_P_SECOND_TIER_DROP`] lower for top-p), used when the first falls
//!   short: heavy tails inflate `sigma` and push `t` too high.
//!
//! # Pivot search
//!
//! [`QuadSearch`] finds, over a candidate set, the key where the cumulative
//! measure (count for top-k, softmax mass for top-p) taken from the top
//! first reaches a target. Each round splits the current key interval by
//! three pivots ([`Pivots`]; interpolated in value space, or quartering the
//! key space when value interpolation made little progress or a bound is
//! infinite), accumulates per sub-interval count, measure and min / max key
//! ([`QuadAcc`]; a block reduction in the kernel), then narrows to the
//! crossing sub-interval tightened to the keys present in it. It stops when
//! that sub-interval holds a single key or its measure reaches the target
//! exactly. Ties at the boundary key are resolved by the same search over
//! `!index` (lowest indices first), so exactly `k` elements are kept.
//!
//! No function here panics on any input (lengths, k, p, NaN); the functions
//! meant for the kernel index arrays only with masked indices.

use core::intrinsics::fmaf32;

use crate::cover::effective_k;
use crate::radix::{f32_from_key, f32_key};

// ---------------------------------------------------------------------------
// Normal quantile (const, f64) and the pre-filter table.
// ---------------------------------------------------------------------------

/// `ln x` for finite `x > 0` in a `const fn` (f64, about 1e-16 relative):
/// `x = 2^e m`, `ln m = 2 atanh((m - 1) / (m + 1))`. Returns -inf for
/// `x <= 0` and NaN for NaN.
pub const fn const_ln(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if x == f64::INFINITY {
        return f64::INFINITY;
    }
    let mut x = x;
    let mut e: i64 = 0;
    // Subnormals: scale into the normal range first.
    if x < f64::MIN_POSITIVE {
        x *= 18_014_398_509_481_984.0; // 2^54
        e -= 54;
    }
    let bits = x.to_bits();
    e += ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    // 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...), |s| <= 0.1716, z <= 0.0295.
    let mut sum = 0.0;
    let mut i = 25;
    while i >= 1 {
        sum = sum * z + 1.0 / (2 * i - 1) as f64;
        i -= 1;
    }
    2.0 * s * sum + e as f64 * core::f64::consts::LN_2
}

/// `sqrt x` for `x >= 0` in a `const fn` (Newton's method from an exponent
/// halving guess, correct to about one ulp); NaN for negative or NaN `x`.
pub const fn const_sqrt(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 || x == f64::INFINITY {
        return x;
    }
    if x < f64::MIN_POSITIVE {
        // Subnormal: 2^108 x is normal, its root 2^54 sqrt(x).
        return const_sqrt(x * 3.245_185_536_584_267_3e32) * 5.551_115_123_125_783e-17;
    }
    // Halve the biased exponent: within a factor 2 of the root.
    let mut y = f64::from_bits((x.to_bits() >> 1) + (0x3ff0_0000_0000_0000 >> 1));
    let mut i = 0;
    while i < 8 {
        y = 0.5 * (y + x / y);
        i += 1;
    }
    y
}

/// `Phi^-1(1 - q)`, the standard normal upper quantile, for `q` in `(0, 1)`
/// (Acklam's rational approximation, relative error below `1.2e-9`,
/// evaluated in the lower tail directly so small `q` keep full precision).
/// `+inf` for `q <= 0`, `-inf` for `q >= 1`, NaN for NaN.
pub const fn normal_upper_quantile(q: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const P_LOW: f64 = 0.02425;
    if q.is_nan() {
        return f64::NAN;
    }
    if q <= 0.0 {
        return f64::INFINITY;
    }
    if q >= 1.0 {
        return f64::NEG_INFINITY;
    }
    // Tail formula: Phi^-1(u) for small u (negative result).
    const fn tail(u: f64) -> f64 {
        let r = const_sqrt(-2.0 * const_ln(u));
        (((((C[0] * r + C[1]) * r + C[2]) * r + C[3]) * r + C[4]) * r + C[5])
            / ((((D[0] * r + D[1]) * r + D[2]) * r + D[3]) * r + 1.0)
    }
    if q < P_LOW {
        -tail(q)
    } else if q > 1.0 - P_LOW {
        tail(1.0 - q)
    } else {
        // Central region: Phi^-1(1 - q) = -Phi^-1(q).
        let u = q - 0.5;
        let r = u * u;
        let x = (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * u
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0);
        -x
    }
}

/// Grid points per octave of [`UPPER_QUANTILE`].
pub const QUANTILE_STEPS: usize = 8;
/// Octaves of [`UPPER_QUANTILE`]: `q` from `2^-QUANTILE_OCTAVES` to 1.
pub const QUANTILE_OCTAVES: usize = 32;
/// Entries of [`UPPER_QUANTILE`].
pub const QUANTILE_LEN: usize = QUANTILE_STEPS * QUANTILE_OCTAVES + 1;

/// Grid point `i` of [`UPPER_QUANTILE`]:
/// `q_i = 2^(i / 8 - 32) (1 + (i % 8) / 8)`, so `q_256 = 1`.
pub const fn quantile_grid(i: usize) -> f64 {
    let e = (i / QUANTILE_STEPS) as i32 - QUANTILE_OCTAVES as i32;
    let m = 1.0 + (i % QUANTILE_STEPS) as f64 / QUANTILE_STEPS as f64;
    let mut p = 1.0;
    let mut j = 0;
    while j < -e {
        p *= 0.5;
        j += 1;
    }
    p * m
}

/// `Phi^-1(1 - q_i)` on the log-spaced grid [`quantile_grid`] (eight
/// points per octave of `q`, from `2^-32` to 1; the last entry is -inf),
/// computed at compile time by [`normal_upper_quantile`].
pub const UPPER_QUANTILE: [f32; QUANTILE_LEN] = {
    let mut t = [0.0f32; QUANTILE_LEN];
    let mut i = 0;
    while i < QUANTILE_LEN {
        t[i] = normal_upper_quantile(quantile_grid(i)) as f32;
        i += 1;
    }
    t
};

/// Grid cell of a positive `q < 1`: the index `i` with
/// `q_i <= q < q_(i+1)`, from the bits of `q` (exponent and top three
/// mantissa bits); `None` below `2^-32` or at / above 1 (or NaN).
#[inline(always)]
fn quantile_cell(q: f32) -> Option<usize> {
    if !(2.328_306_4e-10..1.0).contains(&q) {
        return None;
    }
    let bits = q.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127; // -32..=-1
    let m = ((bits >> 20) & 7) as i32;
    let i = (e + QUANTILE_OCTAVES as i32) * QUANTILE_STEPS as i32 + m;
    if (0..(QUANTILE_LEN - 1) as i32).contains(&i) {
        Some(i as usize)
    } else {
        None
    }
}

/// A lower bound on `Phi^-1(1 - q)` from the table (the value at the upper
/// end of `q`'s cell): the first entry (6.23) below the grid, `-inf` for
/// `q >= 1` and NaN (no filtering).
#[inline(always)]
pub fn upper_quantile_floor(q: f32) -> f32 {
    if q.is_nan() || q >= 1.0 {
        return f32::NEG_INFINITY;
    }
    match quantile_cell(q) {
        // q_(i+1) > q: its quantile is smaller.
        Some(i) => UPPER_QUANTILE
            .get(i + 1)
            .copied()
            .unwrap_or(f32::NEG_INFINITY),
        // Below the grid: the first entry is smaller than the true value.
        None => UPPER_QUANTILE[0],
    }
}

/// An upper bound on `Phi^-1(1 - q)` from the table (the value at the
/// lower end of `q`'s cell): `+inf` below the grid (`q < 2^-32`, or
/// `q <= 0`, or NaN), `-inf` for `q >= 1`.
#[inline(always)]
pub fn upper_quantile_ceil(q: f32) -> f32 {
    if q >= 1.0 {
        return f32::NEG_INFINITY;
    }
    match quantile_cell(q) {
        Some(i) => UPPER_QUANTILE.get(i).copied().unwrap_or(f32::INFINITY),
        None => f32::INFINITY,
    }
}

/// Expected pre-filter survivors asked for `k` (see the module docs):
/// `2k + 6 sqrt(k) + 16`.
#[inline(always)]
pub fn prefilter_target_count(k: u32) -> f32 {
    let k = k as f32;
    2.0 * k + 6.0 * core::intrinsics::sqrtf32(k) + 16.0
}

/// The pre-filter `delta` for top-k: `Phi^-1(1 - m(k) / V)` rounded down,
/// `m(k)` = [`prefilter_target_count`]. `-inf` (no filtering) when
/// `m(k) >= V`, `k == 0` or `vocab == 0`.
#[inline(always)]
pub fn prefilter_delta_for_k(k: u32, vocab: u32) -> f32 {
    if k == 0 || vocab == 0 {
        return f32::NEG_INFINITY;
    }
    upper_quantile_floor(prefilter_target_count(k) / vocab as f32)
}

/// How many times more expected survivors the pre-filter's second tier
/// asks for than the first ([`prefilter_delta_second_tier_for_k`]).
pub const SECOND_TIER_FACTOR: f32 = 8.0;

/// The second-tier `delta` for top-k: as [`prefilter_delta_for_k`] with
/// [`SECOND_TIER_FACTOR`] times the expected survivors. The pre-filter
/// pass counts both tiers, so a row whose sigma outliers inflated (heavy
/// tails) still avoids the full-row fallback.
#[inline(always)]
pub fn prefilter_delta_second_tier_for_k(k: u32, vocab: u32) -> f32 {
    if k == 0 || vocab == 0 {
        return f32::NEG_INFINITY;
    }
    upper_quantile_floor(SECOND_TIER_FACTOR * prefilter_target_count(k) / vocab as f32)
}

/// How much lower (in standard deviations) the top-p second tier lies than
/// [`prefilter_delta_for_p`].
pub const TOP_P_SECOND_TIER_DROP: f32 = 1.0;

/// Safety margin (in standard deviations) of [`prefilter_delta_for_p`].
pub const TOP_P_SAFETY: f32 = 0.5;

/// The pre-filter `delta` for top-p alone: `s - Phi^-1(p) - 0.5` with `s`
/// the standard deviation of the *scaled* logits (`sigma / T`) and
/// `Phi^-1(p)` rounded up, capped at [`prefilter_delta_for_k`]`(16, V)`.
/// `-inf` (no filtering) for `p >= 1`, NaN `p` or `s`, or `s <= 0`.
#[inline(always)]
pub fn prefilter_delta_for_p(p: f32, scaled_sigma: f32, vocab: u32) -> f32 {
    if p.is_nan() || p >= 1.0 || scaled_sigma.is_nan() || scaled_sigma <= 0.0 {
        return f32::NEG_INFINITY;
    }
    // Phi^-1(p) = Phi^-1(1 - (1 - p)) (upper bound) for p >= 1/2,
    // = -Phi^-1(1 - p) (upper bound: minus a lower bound) below.
    let z = if p >= 0.5 {
        upper_quantile_ceil(1.0 - p)
    } else {
        -upper_quantile_floor(p)
    };
    let d = scaled_sigma - z - TOP_P_SAFETY;
    let cap = prefilter_delta_for_k(16, vocab);
    if d > cap { cap } else { d }
}

// ---------------------------------------------------------------------------
// Row statistics, weights and min-p.
// ---------------------------------------------------------------------------

/// Per-thread (and, merged, per-row) statistics of the first pass: max key,
/// +inf count, and count, sum and sum of squares of the finite logits minus
/// a row-wide shift (the row's first logit when finite, else 0), which keeps
/// the variance free of cancellation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// Largest key of the row ([`f32_key`]).
    pub max_key: u32,
    /// Number of +inf entries.
    pub n_posinf: u32,
    /// Number of finite entries.
    pub n_finite: u32,
    /// Sum of `x - shift` over finite `x`.
    pub sum: f32,
    /// Sum of `(x - shift)^2` over finite `x`.
    pub sum_sq: f32,
}

impl RowStats {
    /// The empty statistics.
    pub const EMPTY: RowStats = RowStats {
        max_key: 0,
        n_posinf: 0,
        n_finite: 0,
        sum: 0.0,
        sum_sq: 0.0,
    };

    /// The shift every thread of a row must use: `first` when finite, else 0.
    #[inline(always)]
    pub fn shift_of(first: f32) -> f32 {
        if first.is_finite() { first } else { 0.0 }
    }

    /// Adds one logit.
    #[inline(always)]
    pub fn add(&mut self, x: f32, shift: f32) {
        let key = f32_key(x.to_bits());
        if key > self.max_key {
            self.max_key = key;
        }
        if x == f32::INFINITY {
            self.n_posinf += 1;
        } else if x.is_finite() {
            let d = x - shift;
            self.n_finite += 1;
            self.sum += d;
            self.sum_sq = fmaf32(d, d, self.sum_sq);
        }
    }

    /// Adds four logits in order, with the same result as four calls of
    /// [`RowStats::add`] in that order, in fewer operations when all four are
    /// finite: one test instead of four for the sums, and the largest key
    /// from the largest value (`maxnum` skips NaN, whose key is -inf's;
    /// only a largest value of zero, whose sign `maxnum` may drop, takes the
    /// four keys).
    #[inline(always)]
    pub fn add4(&mut self, q: [f32; 4], shift: f32) {
        let d = [q[0] - shift, q[1] - shift, q[2] - shift, q[3] - shift];
        // Finite only when every difference is (an infinite or NaN logit
        // makes it infinite or NaN; so may finite ones that overflow,
        // which then take the general path too).
        let all = (d[0] + d[1]) + (d[2] + d[3]);
        if all.abs() < f32::INFINITY {
            let top = q[0].max(q[1]).max(q[2].max(q[3]));
            if top == 0.0 {
                for x in q {
                    self.max_key = self.max_key.max(f32_key(x.to_bits()));
                }
            } else {
                // `f32_key` of a number (no NaN test): flip every bit of a
                // negative one, the sign bit of a positive one.
                let b = top.to_bits();
                let key = b ^ (((b as i32 >> 31) as u32) | 0x8000_0000);
                self.max_key = self.max_key.max(key);
            }
            self.n_finite += 4;
            for d in d {
                self.sum += d;
                self.sum_sq = fmaf32(d, d, self.sum_sq);
            }
        } else {
            for x in q {
                self.add(x, shift);
            }
        }
    }

    /// Merges another thread's statistics (same shift).
    #[inline(always)]
    pub fn merge(&mut self, o: &RowStats) {
        if o.max_key > self.max_key {
            self.max_key = o.max_key;
        }
        self.n_posinf += o.n_posinf;
        self.n_finite += o.n_finite;
        self.sum += o.sum;
        self.sum_sq += o.sum_sq;
    }

    /// The row's largest logit (NaN rows give -inf).
    #[inline(always)]
    pub fn max(&self) -> f32 {
        f32::from_bits(f32_from_key(self.max_key))
    }

    /// Whether the row has a valid entry (finite or +inf).
    #[inline(always)]
    pub fn is_valid(&self) -> bool {
        self.n_finite + self.n_posinf > 0
    }

    /// `(mean, standard deviation)` of the finite logits (0 sd for fewer
    /// than two).
    #[inline(always)]
    pub fn mean_sd(&self, shift: f32) -> (f32, f32) {
        if self.n_finite == 0 {
            return (shift, 0.0);
        }
        let n = self.n_finite as f32;
        let m = self.sum / n;
        let var = self.sum_sq / n - m * m;
        let sd = if var > 0.0 {
            core::intrinsics::sqrtf32(var)
        } else {
            0.0
        };
        (shift + m, sd)
    }
}

/// `e^y` for any f32 `y`, within about two ulps (0 below -104, +inf above
/// 88.8, NaN for NaN): `2^n e^r` with `|r| <= ln 2 / 2` and a degree-7
/// Taylor polynomial, scaled in two steps so subnormal results are right.
#[inline(always)]
pub fn exp_f32(y: f32) -> f32 {
    if y.is_nan() {
        return y;
    }
    if y < -104.0 {
        return 0.0;
    }
    if y > 88.8 {
        return f32::INFINITY;
    }
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let t = y * core::f32::consts::LOG2_E;
    // Round to nearest integer (|t| < 2^22).
    let n = (t + 12_582_912.0) - 12_582_912.0;
    let r = fmaf32(-n, LN2_HI, y);
    let r = fmaf32(-n, LN2_LO, r);
    let mut p = 1.0 / 5040.0;
    p = fmaf32(p, r, 1.0 / 720.0);
    p = fmaf32(p, r, 1.0 / 120.0);
    p = fmaf32(p, r, 1.0 / 24.0);
    p = fmaf32(p, r, 1.0 / 6.0);
    p = fmaf32(p, r, 0.5);
    p = fmaf32(p, r, 1.0);
    p = fmaf32(p, r, 1.0);
    let n = n as i32; // -151..=129
    let n1 = n / 2;
    let n2 = n - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    p * s1 * s2
}

/// The row's softmax weights and min-p rule after temperature: weight
/// `w(x) = e^((x - max) / T)` for finite `x` (largest weight 1), 0 for NaN
/// and -inf; in a row with +inf entries `w = 1` on them and 0 elsewhere.
/// min-p keeps `w(x) >= min_p` as `(x - max) / T >= ln(min_p)` evaluated
/// in f64 (the float64 reference's `e^((x - max) / T) >= min_p` up to the
/// f64 rounding of `ln` and `exp`), monotone in `x`, so it keeps a prefix
/// of the total order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weights {
    /// The row's largest logit.
    pub max: f32,
    /// Temperature (> 0).
    pub temperature: f32,
    /// `min_p` in `(0, 1]`; 0 when min-p is off (keeps NaN and -inf too).
    pub min_p: f32,
}

impl Weights {
    /// Weights of a row with maximum `max`, temperature `temperature` (> 0)
    /// and `min_p` (0, negative or NaN is off).
    #[inline(always)]
    pub fn new(max: f32, temperature: f32, min_p: f32) -> Weights {
        Weights {
            max,
            temperature,
            min_p: if min_p > 1.0 {
                1.0
            } else if min_p > 0.0 {
                min_p
            } else {
                0.0
            },
        }
    }

    /// The weight of logit `x`.
    #[inline(always)]
    pub fn weight(&self, x: f32) -> f32 {
        if self.max == f32::INFINITY {
            if x == f32::INFINITY { 1.0 } else { 0.0 }
        } else if x > f32::NEG_INFINITY {
            exp_f32((x - self.max) / self.temperature)
        } else {
            0.0
        }
    }

    /// The smallest key min-p keeps: `min_p_keeps(x)` exactly when
    /// `f32_key(x.to_bits()) >= min_p_key()`, since the test is monotone in
    /// `x` (and NaN has the key of -inf, which the test treats alike). A
    /// binary search over the keys from -inf to +inf, once per row, so that
    /// a pass tests an integer per element instead of dividing by the
    /// temperature.
    pub fn min_p_key(&self) -> u32 {
        let ln_min_p = self.ln_min_p();
        if self.keeps_with(f32::NEG_INFINITY, ln_min_p) {
            return 0;
        }
        let (mut lo, mut hi) = (
            f32_key(f32::NEG_INFINITY.to_bits()),
            f32_key(f32::INFINITY.to_bits()),
        );
        if !self.keeps_with(f32::INFINITY, ln_min_p) {
            // Nothing is kept; no element has a key above that of +inf.
            return hi.saturating_add(1);
        }
        // Invariant: keeps(lo) is false, keeps(hi) is true.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.keeps_with(f32::from_bits(f32_from_key(mid)), ln_min_p) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// Whether min-p keeps logit `x` (one `ln` per call: passes over a row
    /// test `min_p_key` instead).
    #[inline(always)]
    pub fn min_p_keeps(&self, x: f32) -> bool {
        self.keeps_with(x, self.ln_min_p())
    }

    /// `ln(min_p)` in f64; -inf when min-p is off.
    #[inline(always)]
    fn ln_min_p(&self) -> f64 {
        const_ln(f64::from(self.min_p))
    }

    /// [`Weights::min_p_keeps`] given `ln_min_p = self.ln_min_p()`: the
    /// difference of two f32 is exact in f64, and the division by the
    /// temperature rounds monotonically.
    #[inline(always)]
    fn keeps_with(&self, x: f32, ln_min_p: f64) -> bool {
        if ln_min_p == f64::NEG_INFINITY {
            true
        } else if self.max == f32::INFINITY {
            x == f32::INFINITY
        } else {
            (f64::from(x) - f64::from(self.max)) / f64::from(self.temperature) >= ln_min_p
        }
    }
}

// ---------------------------------------------------------------------------
// Cuts of the total order.
// ---------------------------------------------------------------------------

/// A prefix of the total order: every element with key above `key`, plus
/// those with key `key` and index below `index_end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The boundary key.
    pub key: u32,
    /// Elements with key `key` are kept iff their index is below this.
    pub index_end: u32,
}

impl Cut {
    /// The empty prefix (no element has key `u32::MAX`).
    pub const NONE: Cut = Cut {
        key: u32::MAX,
        index_end: 0,
    };
    /// The whole row.
    pub const ALL: Cut = Cut {
        key: 0,
        index_end: u32::MAX,
    };

    /// Every element with key `>= key`.
    #[inline(always)]
    pub const fn at_least(key: u32) -> Cut {
        Cut {
            key,
            index_end: u32::MAX,
        }
    }

    /// Whether the prefix holds the element with key `key` at `index`.
    #[inline(always)]
    pub fn keeps(&self, key: u32, index: u32) -> bool {
        key > self.key || (key == self.key && index < self.index_end)
    }

    /// The shorter of two prefixes.
    #[inline(always)]
    pub fn tighter(self, o: Cut) -> Cut {
        if self.key > o.key || (self.key == o.key && self.index_end <= o.index_end) {
            self
        } else {
            o
        }
    }
}

/// The search key of an index for tie resolution: larger for lower
/// indices, so the lowest indices come first.
#[inline(always)]
pub fn index_key(index: u32) -> u32 {
    !index
}

// ---------------------------------------------------------------------------
// The quaternary pivot search.
// ---------------------------------------------------------------------------

/// What a search accumulates per element: a count (top-k, ties) or a
/// softmax mass (top-p).
pub trait Measure: Copy + PartialOrd {
    /// The empty measure.
    const ZERO: Self;
    /// Sum of two measures.
    fn plus(self, o: Self) -> Self;
}

impl Measure for u32 {
    const ZERO: u32 = 0;
    #[inline(always)]
    fn plus(self, o: u32) -> u32 {
        self.wrapping_add(o)
    }
}

impl Measure for f64 {
    const ZERO: f64 = 0.0;
    #[inline(always)]
    fn plus(self, o: f64) -> f64 {
        self + o
    }
}

/// Three pivots splitting the key interval `[lo, hi]` into sub-intervals
/// `[lo, p0)`, `[p0, p1)`, `[p1, p2)`, `[p2, hi]`, with
/// `lo < p0 <= p1 <= p2 <= hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pivots {
    /// Lowest key of the interval.
    pub lo: u32,
    /// Highest key of the interval.
    pub hi: u32,
    /// The pivots, non-decreasing.
    pub p: [u32; 3],
}

impl Pivots {
    /// Whether `key` lies in the interval (elements outside are ignored).
    #[inline(always)]
    pub fn contains(&self, key: u32) -> bool {
        key >= self.lo && key <= self.hi
    }

    /// Sub-interval (0..4) of a key in the interval.
    #[inline(always)]
    pub fn bin(&self, key: u32) -> usize {
        (key >= self.p[0]) as usize + (key >= self.p[1]) as usize + (key >= self.p[2]) as usize
    }

    /// Pivots quartering the key range (`lo < hi`).
    #[inline(always)]
    fn by_keys(lo: u32, hi: u32) -> Pivots {
        let span = u64::from(hi - lo);
        let at = |i: u64| lo + ((span * i).div_ceil(4)) as u32;
        Pivots {
            lo,
            hi,
            p: [at(1), at(2), at(3)],
        }
    }

    /// Pivots interpolated in value space between the floats of `lo` and
    /// `hi` (`lo < hi`), clamped into `(lo, hi]`; `None` when a bound is
    /// infinite.
    #[inline(always)]
    fn by_values(lo: u32, hi: u32) -> Option<Pivots> {
        let vlo = f32::from_bits(f32_from_key(lo));
        let vhi = f32::from_bits(f32_from_key(hi));
        if !(vlo.is_finite() && vhi.is_finite()) {
            return None;
        }
        let mut p = [0u32; 3];
        let mut prev = lo + 1;
        let mut f = 0.0f32;
        for pi in p.iter_mut() {
            f += 0.25;
            let v = vlo * (1.0 - f) + vhi * f;
            let k = f32_key(v.to_bits()).max(prev).min(hi);
            *pi = k;
            prev = k;
        }
        Some(Pivots { lo, hi, p })
    }
}

/// Per-sub-interval sums of one round: count, measure, min and max key.
/// Zeroed by [`QuadAcc::new`], filled by [`QuadAcc::add`] (one thread's
/// elements), combined by [`QuadAcc::merge`] (the block reduction).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuadAcc<M> {
    /// Elements per sub-interval.
    pub count: [u32; 4],
    /// Measure per sub-interval.
    pub measure: [M; 4],
    /// Smallest key per sub-interval (`u32::MAX` when empty).
    pub min_key: [u32; 4],
    /// Largest key per sub-interval (0 when empty).
    pub max_key: [u32; 4],
}

impl<M: Measure> Default for QuadAcc<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: Measure> QuadAcc<M> {
    /// The empty accumulator.
    #[inline(always)]
    pub fn new() -> Self {
        QuadAcc {
            count: [0; 4],
            measure: [M::ZERO; 4],
            min_key: [u32::MAX; 4],
            max_key: [0; 4],
        }
    }

    /// Adds one candidate (ignored when outside the pivots' interval).
    #[inline(always)]
    pub fn add(&mut self, pivots: &Pivots, key: u32, m: M) {
        if !pivots.contains(key) {
            return;
        }
        let bin = pivots.bin(key);
        // Constant indices only (the loop unrolls), so on the GPU the four
        // sub-interval sums stay in registers instead of local memory.
        for b in 0..4 {
            if bin == b {
                self.count[b] = self.count[b].wrapping_add(1);
                self.measure[b] = self.measure[b].plus(m);
                if key < self.min_key[b] {
                    self.min_key[b] = key;
                }
                if key > self.max_key[b] {
                    self.max_key[b] = key;
                }
            }
        }
    }

    /// Merges another accumulator of the same round.
    #[inline(always)]
    pub fn merge(&mut self, o: &QuadAcc<M>) {
        for i in 0..4 {
            self.count[i] = self.count[i].wrapping_add(o.count[i]);
            self.measure[i] = self.measure[i].plus(o.measure[i]);
            if o.min_key[i] < self.min_key[i] {
                self.min_key[i] = o.min_key[i];
            }
            if o.max_key[i] > self.max_key[i] {
                self.max_key[i] = o.max_key[i];
            }
        }
    }
}

/// Rounds after which [`QuadSearch::advance`] stops whatever the
/// accumulators say (a well-formed search needs at most 33).
pub const MAX_ROUNDS: u32 = 64;

/// Where a search ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Found<M> {
    /// The cumulative measure crosses the target at the single key `key`:
    /// candidates above it measure `above` (< target), `count` candidates
    /// have this key; the caller keeps a tie-resolved part of them.
    Boundary {
        /// The boundary key.
        key: u32,
        /// Measure of the candidates with a larger key.
        above: M,
        /// Candidates with this key.
        count: u32,
    },
    /// Keep every candidate with a key `>= key` (the target is met exactly
    /// there, or never met: then `key` is the lowest candidate key;
    /// `u32::MAX` for no candidate at all).
    AtLeast(u32),
}

/// A quaternary pivot search over a candidate set's keys for the key where
/// the cumulative measure, taken from the largest key down, first reaches
/// `target` (> 0). Drive it with [`QuadSearch::pivots`], a round of
/// [`QuadAcc::add`] over the candidates, and [`QuadSearch::advance`] until
/// [`QuadSearch::found`] returns the result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuadSearch<M> {
    lo: u32,
    hi: u32,
    above: M,
    target: M,
    rounds: u32,
    float_keys: bool,
    by_values: bool,
    found: Option<Found<M>>,
}

impl<M: Measure> QuadSearch<M> {
    /// A search for `target` over candidates whose keys lie in `[lo, hi]`
    /// (bounds need not be tight), `count` of them with total `measure`.
    /// `float_keys` allows value-space pivots ([`f32_key`] keys).
    #[inline(always)]
    pub fn new(target: M, lo: u32, hi: u32, count: u32, measure: M, float_keys: bool) -> Self {
        let found = if count == 0 || lo > hi {
            Some(Found::AtLeast(u32::MAX))
        } else if measure <= target {
            Some(Found::AtLeast(lo))
        } else if lo == hi {
            Some(Found::Boundary {
                key: lo,
                above: M::ZERO,
                count,
            })
        } else {
            None
        };
        QuadSearch {
            lo,
            hi,
            above: M::ZERO,
            target,
            rounds: 0,
            float_keys,
            by_values: float_keys,
            found,
        }
    }

    /// The pivots of the next round; `None` when the search is over.
    #[inline(always)]
    pub fn pivots(&self) -> Option<Pivots> {
        if self.found.is_some() || self.lo >= self.hi {
            return None;
        }
        if self.by_values
            && let Some(p) = Pivots::by_values(self.lo, self.hi)
        {
            return Some(p);
        }
        Some(Pivots::by_keys(self.lo, self.hi))
    }

    /// Narrows the interval by a round's merged accumulator (made with the
    /// pivots [`QuadSearch::pivots`] returned).
    #[inline(always)]
    pub fn advance(&mut self, acc: &QuadAcc<M>) {
        if self.found.is_some() {
            return;
        }
        self.rounds += 1;
        let old_span = self.hi - self.lo;
        let mut lowest = u32::MAX;
        // Sub-intervals from the top, written out rather than looped: a loop
        // indexed the accumulator's arrays at run time, which put them in
        // local memory on the GPU.
        if self.settle(acc, 3, old_span, &mut lowest)
            || self.settle(acc, 2, old_span, &mut lowest)
            || self.settle(acc, 1, old_span, &mut lowest)
            || self.settle(acc, 0, old_span, &mut lowest)
        {
            return;
        }
        // The target was never reached (rounding, or an empty round).
        self.found = Some(Found::AtLeast(lowest));
    }

    /// One sub-interval `b` of [`QuadSearch::advance`], taken from the top:
    /// returns whether the round is decided (the target crossed inside it).
    #[inline(always)]
    fn settle(&mut self, acc: &QuadAcc<M>, b: usize, old_span: u32, lowest: &mut u32) -> bool {
        if acc.count[b] == 0 {
            return false;
        }
        *lowest = acc.min_key[b];
        let cum = self.above.plus(acc.measure[b]);
        if cum < self.target {
            self.above = cum;
            return false;
        }
        // Intersected with the interval: a malformed accumulator can never
        // widen it.
        let lo = acc.min_key[b].max(self.lo);
        let hi = acc.max_key[b].min(self.hi);
        if cum == self.target {
            self.found = Some(Found::AtLeast(lo));
        } else if lo >= hi || hi - lo >= old_span || self.rounds >= MAX_ROUNDS {
            // (The last two only for malformed accumulators: a round of
            // well-formed ones always shrinks the interval, at least fourfold
            // every second round.)
            self.found = Some(Found::Boundary {
                key: lo,
                above: self.above,
                count: acc.count[b],
            });
        } else {
            self.lo = lo;
            self.hi = hi;
            // Value pivots again only if they at least halved the span.
            self.by_values = self.float_keys && (hi - lo) <= old_span / 2;
        }
        true
    }

    /// The result, once the search is over.
    #[inline(always)]
    pub fn found(&self) -> Option<Found<M>> {
        self.found
    }

    /// Rounds run so far.
    #[inline(always)]
    pub fn rounds(&self) -> u32 {
        self.rounds
    }
}

/// How many of the `count` tied candidates at a top-p boundary key with
/// weight `w` top-p keeps: those whose exclusive mass `above + i w` is below
/// `target` (at least 1, at most `count`).
#[inline(always)]
pub fn top_p_ties(above: f64, w: f32, target: f64, count: u32) -> u32 {
    let w = f64::from(w);
    if w.is_nan() || w <= 0.0 {
        return count;
    }
    let n = (target - above) / w;
    if n.is_nan() || n <= 0.0 {
        return 1.min(count);
    }
    let f = n as u32; // saturating
    let take = if (f as f64) < n {
        f.saturating_add(1)
    } else {
        f
    };
    take.clamp(1, count.max(1))
}

// ---------------------------------------------------------------------------
// The CPU driver.
// ---------------------------------------------------------------------------

/// Per-row truncation parameters (the host validates them; out-of-range
/// values here never panic: `top_p` NaN or `>= 1` is off, `<= 0` keeps one
/// element; `min_p` NaN or `<= 0` is off).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowParams {
    /// Keep the `top_k` first elements; 0 or `>= V` is off.
    pub top_k: u32,
    /// top-p on the mass left by min-p and top-k; 1 is off.
    pub top_p: f32,
    /// Keep `p_i >= min_p * p_max`; 0 is off.
    pub min_p: f32,
    /// Temperature; `<= 0` or NaN is greedy (keeps the argmax).
    pub temperature: f32,
    /// Whether to use the Gaussian pre-filter (else the full row).
    pub prefilter: bool,
}

/// A row's truncation decided from its statistics (the first pass): the
/// effective top-k and top-p (temperature <= 0 or NaN is greedy: top-1),
/// the weights after temperature and min-p, and the pre-filter's two
/// thresholds. Shared by [`select_row`] and the GPU kernels.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Elements top-k keeps (`n` when off).
    pub k: u32,
    /// Whether top-k cuts (`k < n`).
    pub topk: bool,
    /// The top-p mass fraction, in `(0, 1]`.
    pub top_p: f32,
    /// Whether top-p cuts.
    pub topp: bool,
    /// Softmax weights and the min-p test.
    pub weights: Weights,
    /// Whether the pre-filter is used.
    pub prefiltered: bool,
    /// Keys of the pre-filter's tight tier and second tier (0 without the
    /// pre-filter: every element is a candidate).
    pub t1: u32,
    pub t2: u32,
}

/// The parameter part of a [`Plan`]: the effective top-k and top-p
/// (temperature <= 0 or NaN is greedy: top-1) and the weights after
/// temperature and min-p, from the row's largest logit alone. Shared by
/// [`Plan::new`] and the GPU kernels that know a row's largest logit
/// without its statistics (the radix select's slab).
#[derive(Clone, Copy, Debug)]
pub struct Truncation {
    /// Elements top-k keeps (`n` when off).
    pub k: u32,
    /// Whether top-k cuts (`k < n`).
    pub topk: bool,
    /// The top-p mass fraction, in `(0, 1]`.
    pub top_p: f32,
    /// Whether top-p cuts.
    pub topp: bool,
    /// Softmax weights and the min-p test.
    pub weights: Weights,
}

impl Truncation {
    /// The truncation of a row of `n` elements whose largest logit is
    /// `max` ([`RowStats::max`]) under `params` (`prefilter` unused).
    #[inline(always)]
    pub fn new(max: f32, n: u32, params: &RowParams) -> Truncation {
        let greedy = params.temperature.is_nan() || params.temperature <= 0.0;
        let k = effective_k(params.top_k, params.temperature, n);
        let top_p = if params.top_p.is_nan() {
            1.0
        } else if params.top_p > 0.0 {
            params.top_p
        } else {
            f32::MIN_POSITIVE
        };
        let min_p = if greedy { 0.0 } else { params.min_p };
        let temperature = if greedy { 1.0 } else { params.temperature };
        Truncation {
            k,
            topk: k < n,
            top_p,
            topp: !greedy && top_p < 1.0,
            weights: Weights::new(max, temperature, min_p),
        }
    }
}

impl Plan {
    /// The plan of a row of `n` elements with statistics `stats` (taken
    /// with `shift`) under `params`.
    #[inline(always)]
    pub fn new(stats: &RowStats, shift: f32, n: u32, params: &RowParams) -> Plan {
        let Truncation {
            k,
            topk,
            top_p,
            topp,
            weights,
        } = Truncation::new(stats.max(), n, params);
        let temperature = weights.temperature;

        // Pre-filter thresholds: the tight one and a looser second tier, for
        // rows whose sigma is inflated by outliers.
        let (mu, sd) = stats.mean_sd(shift);
        let use_pf =
            params.prefilter && stats.n_posinf == 0 && stats.n_finite >= 2 && (topk || topp);
        let (delta1, delta2) = if !use_pf {
            (f32::NEG_INFINITY, f32::NEG_INFINITY)
        } else if topk {
            // The Gaussian model describes the finite entries (the others are
            // NaN or -inf here: rows with +inf skip the pre-filter).
            (
                prefilter_delta_for_k(k, stats.n_finite),
                prefilter_delta_second_tier_for_k(k, stats.n_finite),
            )
        } else {
            let d = prefilter_delta_for_p(top_p, sd / temperature, stats.n_finite);
            (d, d - TOP_P_SECOND_TIER_DROP)
        };
        let threshold_key = |delta: f32| {
            // Never above the row's max: then its ties alone may suffice.
            let t = (mu + delta * sd).min(stats.max());
            if delta == f32::NEG_INFINITY || t.is_nan() {
                0
            } else {
                f32_key(t.to_bits())
            }
        };
        let (t1, t2) = (threshold_key(delta1), threshold_key(delta2));
        Plan {
            k,
            topk,
            top_p,
            topp,
            weights,
            prefiltered: use_pf,
            t1,
            t2,
        }
    }
}

/// Count, key range and softmax mass of a set of elements (a pre-filter
/// tier, the top-k survivors, the kept set).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    pub n: u32,
    pub min: u32,
    pub max: u32,
    pub mass: f64,
}

impl Group {
    pub const EMPTY: Group = Group {
        n: 0,
        min: u32::MAX,
        max: 0,
        mass: 0.0,
    };

    /// Adds an element of key `key` and weight `w`.
    #[inline(always)]
    pub fn add(&mut self, key: u32, w: f64) {
        self.n = self.n.wrapping_add(1);
        if key < self.min {
            self.min = key;
        }
        if key > self.max {
            self.max = key;
        }
        self.mass += w;
    }

    /// The union of two disjoint sets.
    #[inline(always)]
    pub fn join(self, o: Group) -> Group {
        Group {
            n: self.n.wrapping_add(o.n),
            min: if o.min < self.min { o.min } else { self.min },
            max: if o.max > self.max { o.max } else { self.max },
            mass: self.mass + o.mass,
        }
    }
}

impl Plan {
    /// The candidates the selection works on, from the pre-filter's nested
    /// sets of min-p's survivors `s1` (keys `>= t1`), `s2` (`>= t2`) and
    /// `all`: the first that suffices (every survivor, or k of them for
    /// top-k, or more than the top-p threshold's mass for top-p alone),
    /// its least key (0 for `all`) and the tier it came from. The masses
    /// are needed only for top-p alone.
    #[inline(always)]
    pub fn candidates(&self, s1: Group, s2: Group, all: Group) -> (u32, Group, Prefilter) {
        let target_p = f64::from(self.top_p) * all.mass;
        let enough = |g: Group| {
            g.n == all.n
                || if self.topk {
                    g.n >= self.k
                } else {
                    self.topp && g.mass >= target_p * (1.0 + 1.0e-9)
                }
        };
        if enough(s1) {
            (self.t1, s1, Prefilter::Hit)
        } else if enough(s2) {
            (self.t2, s2, Prefilter::HitSecondTier)
        } else {
            (0, all, Prefilter::Fallback)
        }
    }
}

/// What the pre-filter did on a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefilter {
    /// Not used (off, no top-k or top-p, +inf row, fewer than 2 finite).
    Unused,
    /// Its survivors held the whole kept set.
    Hit,
    /// The tight tier fell short, the second tier's survivors sufficed.
    HitSecondTier,
    /// Too few survivors: the full row was searched.
    Fallback,
}

/// The result of [`select_row`]: the kept prefix and how it was found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Selection {
    /// The kept set: the elements this cut keeps.
    pub cut: Cut,
    /// Its size.
    pub kept: u32,
    /// What the pre-filter did.
    pub prefilter: Prefilter,
    /// Candidates the searches ran over (pre-filter survivors or the row's
    /// min-p survivors).
    pub candidates: u32,
    /// Pivot rounds of the top-k search.
    pub topk_rounds: u32,
    /// Pivot rounds of the top-p search.
    pub topp_rounds: u32,
    /// Pivot rounds of tie resolution (index searches).
    pub tie_rounds: u32,
}

/// Sequential pass-by-pass run of a search over the candidates of `row`
/// (`keep(key, index, x)`), each round one pass; returns the result and
/// adds the rounds to `rounds`.
fn run_search<M: Measure>(
    row: &[f32],
    mut search: QuadSearch<M>,
    key_of: impl Fn(u32, u32) -> u32,
    measure: impl Fn(f32) -> M,
    keep: impl Fn(u32, u32, f32) -> bool,
    rounds: &mut u32,
) -> Found<M> {
    while let Some(p) = search.pivots() {
        let mut acc = QuadAcc::<M>::new();
        for (i, &x) in row.iter().enumerate() {
            let key = f32_key(x.to_bits());
            if keep(key, i as u32, x) {
                acc.add(&p, key_of(key, i as u32), measure(x));
            }
        }
        search.advance(&acc);
    }
    *rounds += search.rounds();
    search.found().unwrap_or(Found::AtLeast(u32::MAX))
}

/// The cut that keeps the first `take` (by index) of the `count`
/// candidates with key `key`, found by an index search.
fn tie_cut(
    row: &[f32],
    key: u32,
    take: u32,
    count: u32,
    keep: impl Fn(u32, u32, f32) -> bool,
    rounds: &mut u32,
) -> Cut {
    if take >= count {
        return Cut::at_least(key);
    }
    if take == 0 {
        // Keep none of the ties: everything above `key` only.
        return Cut { key, index_end: 0 };
    }
    let n = row.len().min(u32::MAX as usize) as u32;
    let lo = index_key(n.saturating_sub(1));
    let search = QuadSearch::<u32>::new(take, lo, u32::MAX, count, count, false);
    let found = run_search(
        row,
        search,
        |_, i| index_key(i),
        |_| 1u32,
        |k, i, x| k == key && keep(k, i, x),
        rounds,
    );
    let ik = match found {
        Found::Boundary { key, .. } | Found::AtLeast(key) => key,
    };
    Cut {
        key,
        index_end: (!ik).saturating_add(1),
    }
}

/// Runs the whole truncation (temperature, min-p, top-k, top-p) on one row
/// sequentially, pass by pass as the kernel would: statistics, pre-filter
/// (with fallback), top-k pivot search with tie resolution, then top-p
/// pivot search on the survivors. Never panics; an empty row or one with
/// nothing valid keeps nothing.
pub fn select_row(row: &[f32], params: &RowParams) -> Selection {
    let mut out = Selection {
        cut: Cut::NONE,
        kept: 0,
        prefilter: Prefilter::Unused,
        candidates: 0,
        topk_rounds: 0,
        topp_rounds: 0,
        tie_rounds: 0,
    };
    let n = row.len().min(u32::MAX as usize) as u32;
    let row = row.get(..n as usize).unwrap_or(row);
    // Pass 1: statistics.
    let shift = RowStats::shift_of(row.first().copied().unwrap_or(0.0));
    let mut stats = RowStats::EMPTY;
    for &x in row {
        stats.add(x, shift);
    }
    if !stats.is_valid() {
        return out;
    }
    let plan = Plan::new(&stats, shift, n, params);
    let Plan {
        k,
        topk,
        top_p,
        topp,
        weights: w,
        prefiltered: use_pf,
        t1,
        t2,
    } = plan;

    // Pass 2: min-p's survivors by tier: `>= t1`, `[t2, t1)`, `< t2`.
    let min_key = w.min_p_key();
    let mut tiers = [Group::EMPTY; 3];
    for &x in row {
        let key = f32_key(x.to_bits());
        if key < min_key {
            continue;
        }
        let mass = if topp && !topk {
            f64::from(w.weight(x))
        } else {
            0.0
        };
        tiers[(key < t1) as usize + (key < t2) as usize].add(key, mass);
    }
    let [g1, g2, g3] = tiers;
    let (s1, s2) = (g1, g1.join(g2));
    let all = s2.join(g3);
    let total_mass = all.mass;
    let (floor, cand, tier) = plan.candidates(s1, s2, all);
    if use_pf {
        out.prefilter = tier;
    }
    out.candidates = cand.n;
    let is_cand = |key: u32, _: f32| key >= floor && key >= min_key;

    // Top-k.
    let mut cut = Cut::at_least(cand.min);
    if topk && cand.n > k {
        let search = QuadSearch::<u32>::new(k, cand.min, cand.max, cand.n, cand.n, true);
        let found = run_search(
            row,
            search,
            |key, _| key,
            |_| 1u32,
            |key, _, x| is_cand(key, x),
            &mut out.topk_rounds,
        );
        cut = match found {
            Found::AtLeast(key) => Cut::at_least(key),
            Found::Boundary { key, above, count } => tie_cut(
                row,
                key,
                k.saturating_sub(above),
                count,
                |key, _, x| is_cand(key, x),
                &mut out.tie_rounds,
            ),
        };
    }

    // Top-p on the survivors of min-p and top-k.
    if topp {
        let kcut = cut;
        let in_k = |key: u32, i: u32, x: f32| is_cand(key, x) && kcut.keeps(key, i);
        let (count, mass) = if topk {
            // The kernel sums this over the top-k survivors.
            let mut count = 0u32;
            let mut mass = 0.0f64;
            for (i, &x) in row.iter().enumerate() {
                if in_k(f32_key(x.to_bits()), i as u32, x) {
                    count += 1;
                    mass += f64::from(w.weight(x));
                }
            }
            (count, mass)
        } else {
            (cand.n, cand.mass)
        };
        let target = f64::from(top_p) * if topk { mass } else { total_mass };
        let search = QuadSearch::<f64>::new(target, kcut.key, cand.max, count, mass, true);
        let found = run_search(
            row,
            search,
            |key, _| key,
            |x| f64::from(w.weight(x)),
            in_k,
            &mut out.topp_rounds,
        );
        let pcut = match found {
            Found::AtLeast(key) => Cut::at_least(key),
            Found::Boundary { key, above, count } => {
                let wk = w.weight(f32::from_bits(f32_from_key(key)));
                let take = top_p_ties(above, wk, target, count);
                tie_cut(row, key, take, count, in_k, &mut out.tie_rounds)
            }
        };
        cut = pcut.tighter(kcut);
    }
    out.cut = cut;
    out.kept = row
        .iter()
        .enumerate()
        .filter(|&(i, &x)| cut.keeps(f32_key(x.to_bits()), i as u32))
        .count() as u32;
    out
}

#[cfg(test)]
mod tests {
    //! The CPU driver against a plain sort-based float64 oracle (value desc,
    //! index asc) on thousands of random rows, plus the quantile table, the
    //! exponential, pre-filter hit rates and pivot-round counts.
    extern crate std;
    use std::vec::Vec;
    use std::{format, println, vec};

    use super::*;

    #[test]
    fn min_p_key_matches_min_p_keeps() {
        let mut rng = Rng(0x5eed_0007);
        let specials = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -0.0,
            0.0,
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
        ];
        for case in 0..2000 {
            let max = match case % 7 {
                0 => f32::INFINITY,
                1 => 0.0,
                _ => ((rng.unit() - 0.5) * 200.0) as f32,
            };
            let temperature = [1.0e-3f32, 0.3, 0.8, 1.0, 2.0, 50.0][case % 6];
            let min_p = [0.0f32, 1.0e-6, 0.05, 0.5, 1.0, -1.0, f32::NAN][(case / 6) % 7];
            let w = Weights::new(max, temperature, min_p);
            let key = w.min_p_key();
            for i in 0..200 {
                let x = if i < specials.len() {
                    specials[i]
                } else if i % 3 == 0 && max.is_finite() {
                    // Near the threshold.
                    max + (const_ln(f64::from(w.min_p)) as f32)
                        * temperature
                        * (1.0 + ((rng.unit() - 0.5) * 1e-5) as f32)
                } else {
                    ((rng.unit() - 0.5) * 400.0) as f32
                };
                assert_eq!(
                    w.min_p_keeps(x),
                    f32_key(x.to_bits()) >= key,
                    "max {max} T {temperature} min_p {min_p} x {x}"
                );
            }
        }
    }

    /// `add4` gives the bits of four `add`s in order: rows of specials
    /// (NaN, both infinities, both zeros, sums that overflow) mixed with
    /// ordinary values and small integers (largest values of zero), with
    /// every kind of shift.
    #[test]
    fn add4_is_four_adds() {
        let mut rng = Rng(0x5eed_0a44);
        let specials = [
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
            -0.0,
            0.0,
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            3.0e38,
        ];
        let bits = |s: &RowStats| {
            (
                s.max_key,
                s.n_posinf,
                s.n_finite,
                s.sum.to_bits(),
                s.sum_sq.to_bits(),
            )
        };
        for case in 0..4000 {
            let n = 4 * (1 + rng.below(16));
            let rare = [0.0, 0.02, 0.3, 1.0][case % 4];
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    if rng.unit() < rare {
                        rng.pick(&specials)
                    } else if case % 5 == 0 {
                        // Zeros and small integers: maxima of zero.
                        rng.below(3) as f32 - 2.0
                    } else {
                        (rng.normal() * 3.0) as f32
                    }
                })
                .collect();
            let shift = RowStats::shift_of(row[0]);
            let (mut one, mut four) = (RowStats::EMPTY, RowStats::EMPTY);
            for &x in &row {
                one.add(x, shift);
            }
            for q in row.chunks_exact(4) {
                four.add4([q[0], q[1], q[2], q[3]], shift);
            }
            assert_eq!(bits(&one), bits(&four), "case {case}: {row:?}");
        }
    }

    /// min-p agrees with the float64 reference's rule (in f64,
    /// `e^((x - max) / T) >= min_p`) on logits within a few f32 ulps of the
    /// threshold, where an f32 evaluation of `(x - max) / T >= ln(min_p)`
    /// can fall on either side (session 17: one row of a GPU test kept one
    /// element more than the reference).
    #[test]
    fn min_p_agrees_with_the_float64_rule_at_its_threshold() {
        let mut rng = Rng(0x5eed_0017);
        let mut near = 0;
        for case in 0..4000 {
            let max = ((rng.unit() - 0.5) * 40.0) as f32;
            let temperature = [0.3f32, 0.7, 1.0, 1.3, 2.0][case % 5];
            let min_p = [0.05f32, 0.1, 0.01, 0.3, 1.0e-4][(case / 5) % 5];
            let w = Weights::new(max, temperature, min_p);
            let key = w.min_p_key();
            let t = f64::from(max) + f64::from(temperature) * f64::from(min_p).ln();
            let mut x = t as f32;
            for _ in 0..8 {
                x = f32::from_bits(x.to_bits().wrapping_sub(1));
            }
            for _ in 0..16 {
                let d = (f64::from(x) - f64::from(max)) / f64::from(temperature);
                let want = d.exp() >= f64::from(min_p);
                assert_eq!(
                    w.min_p_keeps(x),
                    want,
                    "max {max} T {temperature} min_p {min_p} x {x}"
                );
                assert_eq!(f32_key(x.to_bits()) >= key, want);
                near += usize::from(want);
                x = f32::from_bits(x.to_bits().wrapping_add(1));
            }
        }
        assert!(near > 0);
    }

    /// splitmix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn unit(&mut self) -> f64 {
            ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn normal(&mut self) -> f64 {
            let (u, v) = (self.unit(), self.unit());
            (-2.0 * u.ln()).sqrt() * (2.0 * core::f64::consts::PI * v).cos()
        }
        fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
            xs[self.below(xs.len())]
        }
    }

    fn bf16(x: f32) -> f32 {
        if !x.is_finite() {
            return x;
        }
        let b = x.to_bits();
        let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        f32::from_bits(r & 0xffff_0000)
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Dist {
        Gaussian,
        HeavyTailed,
        Bf16,
        AllEqual,
        FewValues,
        Specials,
        Invalid,
    }
    const DISTS: [Dist; 7] = [
        Dist::Gaussian,
        Dist::HeavyTailed,
        Dist::Bf16,
        Dist::AllEqual,
        Dist::FewValues,
        Dist::Specials,
        Dist::Invalid,
    ];

    fn gaussian_row(rng: &mut Rng, v: usize) -> Vec<f32> {
        let mu = rng.unit() * 10.0 - 5.0;
        let sd = 0.5 + rng.unit() * 3.5;
        (0..v).map(|_| (mu + sd * rng.normal()) as f32).collect()
    }

    fn make_row(rng: &mut Rng, dist: Dist, v: usize) -> Vec<f32> {
        match dist {
            Dist::Gaussian => gaussian_row(rng, v),
            Dist::HeavyTailed => {
                let sd = 0.5 + rng.unit() * 2.0;
                (0..v)
                    .map(|_| {
                        // Student-t with 2 degrees of freedom, plus spikes.
                        let t = rng.normal() / (rng.unit().max(1e-12)).sqrt();
                        let spike = if rng.below(500) == 0 { 30.0 } else { 0.0 };
                        (sd * t + spike) as f32
                    })
                    .collect()
            }
            Dist::Bf16 => gaussian_row(rng, v).into_iter().map(bf16).collect(),
            Dist::AllEqual => {
                let c = rng.pick(&[0.0f32, 1.5, -3.25, 7.0]);
                (0..v)
                    .map(|_| {
                        if c == 0.0 && rng.below(2) == 0 {
                            -0.0
                        } else {
                            c
                        }
                    })
                    .collect()
            }
            Dist::FewValues => {
                let m = 1 + rng.below(6);
                (0..v)
                    .map(|_| match rng.below(m + 1) {
                        0 if rng.below(4) == 0 => -0.0,
                        j => j as f32 * 0.5,
                    })
                    .collect()
            }
            Dist::Specials => {
                let mut row = gaussian_row(rng, v);
                let mode = rng.below(4);
                for x in row.iter_mut() {
                    let r = rng.below(100);
                    *x = match (mode, r) {
                        (0, 0..=4) => f32::NAN,
                        (0, 5..=9) => f32::NEG_INFINITY,
                        (1, 0) => f32::INFINITY,
                        (1, 1..=20) => f32::NAN,
                        (2, 0..=89) => f32::NEG_INFINITY,
                        (3, 0..=49) => bf16(*x),
                        (3, 50..=59) => -f32::NAN,
                        _ => *x,
                    };
                }
                if mode == 1 && rng.below(2) == 0 {
                    let j = rng.below(v);
                    row[j] = f32::INFINITY;
                }
                row
            }
            Dist::Invalid => (0..v)
                .map(|_| {
                    if rng.below(2) == 0 {
                        f32::NAN
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect(),
        }
    }

    /// The float64 oracle: the row's total order, and the kept-set sizes
    /// `(exact, lowest, highest)` top-p may give with its threshold within
    /// `1 +- 1e-6`.
    fn oracle(row: &[f32], p: &RowParams) -> (Vec<u32>, usize, usize, usize) {
        let mut order: Vec<u32> = (0..row.len() as u32).collect();
        order.sort_by_key(|&j| (core::cmp::Reverse(f32_key(row[j as usize].to_bits())), j));
        let valid = |x: f32| x > f32::NEG_INFINITY; // finite or +inf
        if order.is_empty() || !valid(row[order[0] as usize]) {
            return (order, 0, 0, 0);
        }
        let greedy = p.temperature.is_nan() || p.temperature <= 0.0;
        if greedy {
            return (order, 1, 1, 1);
        }
        let max = row[order[0] as usize];
        let w: Vec<f64> = row
            .iter()
            .map(|&x| {
                if max == f32::INFINITY {
                    if x == f32::INFINITY { 1.0 } else { 0.0 }
                } else if x > f32::NEG_INFINITY {
                    ((f64::from(x) - f64::from(max)) / f64::from(p.temperature)).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let min_w = f64::from(p.min_p);
        let mut s = order
            .iter()
            .take_while(|&&j| w[j as usize] >= min_w)
            .count();
        if p.top_k != 0 {
            s = s.min(p.top_k as usize);
        }
        let len = |scale: f64| {
            if p.top_p >= 1.0 {
                return s;
            }
            let mass: f64 = order[..s].iter().map(|&j| w[j as usize]).sum();
            let th = f64::from(p.top_p) * mass * scale;
            let mut before = 0.0;
            order[..s]
                .iter()
                .take_while(|&&j| {
                    let keep = before < th;
                    before += w[j as usize];
                    keep
                })
                .count()
        };
        let (exact, lo, hi) = (len(1.0), len(1.0 - 1.0e-6), len(1.0 + 1.0e-6));
        (order, exact, lo, hi)
    }

    /// Checks the driver on one row; returns its selection.
    fn check(row: &[f32], p: &RowParams, what: &str) -> Selection {
        let sel = select_row(row, p);
        let (order, exact, lo, hi) = oracle(row, p);
        let kept: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| sel.cut.keeps(f32_key(row[i as usize].to_bits()), i))
            .collect();
        assert_eq!(kept.len(), sel.kept as usize, "{what}: kept count");
        let n = kept.len();
        let ok = n >= lo.min(exact) && n <= hi.max(exact);
        let detail = || {
            format!(
                "{what}: V={} {p:?}: kept {n}, oracle {exact} (band {lo}..={hi}), cut {:?}, sel {sel:?}",
                row.len(),
                sel.cut
            )
        };
        assert!(ok, "{}", detail());
        let mut prefix = order[..n].to_vec();
        prefix.sort_unstable();
        assert_eq!(kept, prefix, "{}", detail());
        sel
    }

    #[test]
    fn quantile_matches_known_values() {
        // (q, Phi^-1(1 - q)) from high-precision tables.
        let known = [
            (0.5, 0.0),
            (0.158_655_253_931_457_05, 1.0),
            (0.1, 1.281_551_565_544_600_4),
            (0.05, 1.644_853_626_951_472_2),
            (0.025, 1.959_963_984_540_054),
            (0.01, 2.326_347_874_040_840_8),
            (0.001, 3.090_232_306_167_814),
            (1.0e-6, 4.753_424_308_822_899),
            (1.0e-9, 5.997_807_015_007_686),
            (0.9, -1.281_551_565_544_600_4),
            (0.99, -2.326_347_874_040_840_8),
            (0.999_999, -4.753_424_308_822_899),
        ];
        for (q, z) in known {
            let got = normal_upper_quantile(q);
            assert!(
                (got - z).abs() <= 1.2e-9 * z.abs().max(1.0),
                "q = {q}: {got} vs {z}"
            );
        }
        assert_eq!(normal_upper_quantile(0.0), f64::INFINITY);
        assert_eq!(normal_upper_quantile(1.0), f64::NEG_INFINITY);
        assert!(normal_upper_quantile(f64::NAN).is_nan());
        // Const helpers against std.
        for x in [1e-300, 1e-10, 0.3, 1.0, 2.0, 7.5, 1e10, 5e-324] {
            assert!(
                (const_ln(x) - x.ln()).abs() <= 1e-15 * x.ln().abs().max(1.0),
                "{x}"
            );
            assert!((const_sqrt(x) - x.sqrt()).abs() <= 2e-16 * x.sqrt(), "{x}");
        }
        // The table: decreasing, on its grid, matching the function.
        for i in 0..QUANTILE_LEN {
            let want = normal_upper_quantile(quantile_grid(i)) as f32;
            assert_eq!(UPPER_QUANTILE[i], want);
            if i > 0 {
                assert!(UPPER_QUANTILE[i] < UPPER_QUANTILE[i - 1]);
            }
        }
        assert_eq!(quantile_grid(QUANTILE_LEN - 1), 1.0);
        assert_eq!(quantile_grid(0), 2.0f64.powi(-32));
        // Floor / ceil bracket the exact quantile.
        let mut rng = Rng(7);
        for _ in 0..100_000 {
            let q = (2.0f64.powf(-34.0 * rng.unit())) as f32;
            let exact = normal_upper_quantile(f64::from(q));
            let (f, c) = (upper_quantile_floor(q), upper_quantile_ceil(q));
            assert!(
                f64::from(f) <= exact + 1e-6 && exact <= f64::from(c) + 1e-6,
                "{q}"
            );
        }
    }

    #[test]
    fn exp_is_accurate() {
        let mut worst = 0.0f64;
        let mut y = -103.9f32;
        while y < 88.0 {
            let want = f64::from(y).exp();
            let got = f64::from(exp_f32(y));
            if want > f64::from(f32::MIN_POSITIVE) {
                worst = worst.max((got - want).abs() / (want * f64::from(f32::EPSILON)));
            } else {
                assert!((got - want).abs() <= 1.5e-45, "{y}");
            }
            y += 0.000_731;
        }
        assert!(worst < 2.0, "exp_f32 worst {worst} ulps");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn prefilter_deltas() {
        assert_eq!(prefilter_delta_for_k(0, 1000), f32::NEG_INFINITY);
        assert_eq!(prefilter_delta_for_k(50, 100), f32::NEG_INFINITY);
        let d = prefilter_delta_for_k(50, 151_936);
        let m = f64::from(prefilter_target_count(50));
        let exact = normal_upper_quantile(m / 151_936.0);
        assert!(
            f64::from(d) <= exact && f64::from(d) > exact - 0.1,
            "{d} {exact}"
        );
        assert!(prefilter_delta_for_k(1, 151_936) > prefilter_delta_for_k(1000, 151_936));
        assert_eq!(prefilter_delta_for_p(1.0, 2.0, 1000), f32::NEG_INFINITY);
        assert_eq!(
            prefilter_delta_for_p(f32::NAN, 2.0, 1000),
            f32::NEG_INFINITY
        );
        assert_eq!(
            prefilter_delta_for_p(0.9, f32::NAN, 1000),
            f32::NEG_INFINITY
        );
        let d = prefilter_delta_for_p(0.9, 2.0, 151_936);
        assert!((d - (2.0 - 1.2816 - TOP_P_SAFETY)).abs() < 0.05, "{d}");
        // Small p and huge sigma: capped.
        assert!(prefilter_delta_for_p(1e-6, 50.0, 151_936) <= prefilter_delta_for_k(16, 151_936));
    }

    #[test]
    fn kept_sets_equal_the_sorted_reference() {
        let mut rng = Rng(2026);
        let vocabs = [1usize, 2, 3, 7, 64, 999, 1000, 1001, 2048, 4096];
        let ps = [1e-6f32, 0.5, 0.9, 0.99, 1.0];
        let mut checks = 0usize;
        let mut band = 0usize;
        for r in 0..3500 {
            let dist = DISTS[r % DISTS.len()];
            let v = rng.pick(&vocabs);
            let row = make_row(&mut rng, dist, v);
            let vv = v as u32;
            for _ in 0..6 {
                let k = rng.pick(&[0, 1, 2, 50, 1000, vv.saturating_sub(1), vv, vv + 5]);
                let temperature = match rng.below(12) {
                    0 => 0.0,
                    1 => 0.4,
                    2 => 1.7,
                    _ => 1.0,
                };
                let p = RowParams {
                    top_k: k,
                    top_p: rng.pick(&ps),
                    min_p: rng.pick(&[0.0, 0.05]),
                    temperature,
                    prefilter: rng.below(8) != 0,
                };
                let sel = check(&row, &p, &format!("row {r} {dist:?}"));
                let (_, exact, _, _) = oracle(&row, &p);
                band += usize::from(sel.kept as usize != exact);
                checks += 1;
            }
        }
        println!("{checks} checks, {band} top-p boundary-band differences");
    }

    #[test]
    fn ties_across_the_boundary_keep_the_lowest_indices() {
        // 10 values 3.0 at scattered indices, 5 above: k = 8 keeps the 5 and
        // the three lowest-index 3.0s.
        let mut row = vec![1.0f32; 100];
        for j in [90usize, 3, 50, 7, 70, 20, 11, 99, 40, 60] {
            row[j] = 3.0;
        }
        for j in [5usize, 95, 33, 66, 1] {
            row[j] = 4.0;
        }
        let p = RowParams {
            top_k: 8,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            prefilter: true,
        };
        let sel = check(&row, &p, "ties");
        assert_eq!(sel.cut.key, f32_key(3.0f32.to_bits()));
        // Keeps the 3.0s at 3, 7 and 11.
        assert_eq!(sel.cut.index_end, 12);
        // -0.0 ranks below +0.0.
        let row = [-0.0f32, 0.0, -0.0, 0.0];
        let p = RowParams { top_k: 3, ..p };
        let sel = check(&row, &p, "zeros");
        assert_eq!(sel.kept, 3);
        assert!(!sel.cut.keeps(f32_key((-0.0f32).to_bits()), 2));
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let p = RowParams {
            top_k: 5,
            top_p: 0.9,
            min_p: 0.05,
            temperature: 1.0,
            prefilter: true,
        };
        assert_eq!(select_row(&[], &p).kept, 0);
        for params in [
            p,
            RowParams {
                top_p: f32::NAN,
                ..p
            },
            RowParams { top_p: -1.0, ..p },
            RowParams { top_p: 7.0, ..p },
            RowParams {
                min_p: f32::NAN,
                ..p
            },
            RowParams { min_p: 3.0, ..p },
            RowParams { min_p: 1e-45, ..p },
            RowParams {
                temperature: f32::INFINITY,
                ..p
            },
            RowParams {
                temperature: 1e-45,
                ..p
            },
            RowParams {
                temperature: f32::NAN,
                ..p
            },
            RowParams {
                top_k: u32::MAX,
                ..p
            },
        ] {
            for row in [
                vec![f32::NAN],
                vec![1.0],
                vec![f32::MAX, f32::MIN, 0.0, f32::MIN_POSITIVE, -1e-45],
                vec![f32::INFINITY, f32::NEG_INFINITY, f32::NAN],
            ] {
                let sel = select_row(&row, &params);
                assert!(sel.kept as usize <= row.len());
            }
        }
        // A malformed accumulator cannot make a search loop forever.
        let mut s = QuadSearch::<u32>::new(3, 10, 1000, 100, 100, false);
        let mut acc = QuadAcc::new();
        acc.count = [100, 0, 0, 0];
        acc.min_key = [0, u32::MAX, u32::MAX, u32::MAX];
        acc.max_key = [u32::MAX, 0, 0, 0];
        for _ in 0..100 {
            s.advance(&acc);
        }
        assert!(s.found().is_some());
    }

    #[test]
    fn prefilter_hit_rates_and_pivot_rounds() {
        let mut rng = Rng(99);
        // Hit rate on Gaussian rows.
        for (v, rows) in [(32_000usize, 50usize), (151_936, 6)] {
            for k in [1u32, 50, 1000] {
                let (mut hits, mut cands) = (0, 0u64);
                for _ in 0..rows {
                    let row = gaussian_row(&mut rng, v);
                    let p = RowParams {
                        top_k: k,
                        top_p: 0.9,
                        min_p: 0.0,
                        temperature: 1.0,
                        prefilter: true,
                    };
                    let sel = select_row(&row, &p);
                    hits += usize::from(sel.prefilter == Prefilter::Hit);
                    cands += u64::from(sel.candidates);
                }
                println!(
                    "gaussian V={v} top-k={k}: pre-filter hit rate {:.3}, mean survivors {:.0}",
                    hits as f64 / rows as f64,
                    cands as f64 / rows as f64
                );
                assert!(hits * 100 >= rows * 99, "top-k {k} hit rate {hits}/{rows}");
            }
            for sd in [1.0f64, 2.0, 3.0] {
                for top_p in [0.5f32, 0.9, 0.99] {
                    let (mut hits, mut cands) = (0, 0u64);
                    for _ in 0..rows {
                        let row: Vec<f32> = (0..v).map(|_| (sd * rng.normal()) as f32).collect();
                        let p = RowParams {
                            top_k: 0,
                            top_p,
                            min_p: 0.0,
                            temperature: 1.0,
                            prefilter: true,
                        };
                        let sel = select_row(&row, &p);
                        hits += usize::from(sel.prefilter == Prefilter::Hit);
                        cands += u64::from(sel.candidates);
                    }
                    println!(
                        "gaussian V={v} sd={sd} top-p={top_p} alone: pre-filter hit rate {:.3}, mean survivors {:.0}",
                        hits as f64 / rows as f64,
                        cands as f64 / rows as f64
                    );
                }
            }
        }
        // Pivot rounds per distribution, V = 32000, k = 50 and 1000, p = 0.9.
        for dist in [
            Dist::Gaussian,
            Dist::HeavyTailed,
            Dist::Bf16,
            Dist::FewValues,
            Dist::AllEqual,
            Dist::Specials,
        ] {
            for k in [50u32, 1000] {
                let rows = 30;
                let (mut kr, mut pr, mut tr, mut hits, mut hits2, mut used) = (0, 0, 0, 0, 0, 0);
                for _ in 0..rows {
                    let row = make_row(&mut rng, dist, 32_000);
                    let p = RowParams {
                        top_k: k,
                        top_p: 0.9,
                        min_p: 0.0,
                        temperature: 1.0,
                        prefilter: true,
                    };
                    let sel = check(&row, &p, &format!("{dist:?}"));
                    kr += sel.topk_rounds;
                    pr += sel.topp_rounds;
                    tr += sel.tie_rounds;
                    hits += usize::from(sel.prefilter == Prefilter::Hit);
                    hits2 += usize::from(sel.prefilter == Prefilter::HitSecondTier);
                    used += usize::from(sel.prefilter != Prefilter::Unused);
                }
                let f = |x: u32| f64::from(x) / rows as f64;
                println!(
                    "{dist:?} V=32000 k={k} p=0.9: rounds top-k {:.2}, top-p {:.2}, ties {:.2}; pre-filter hits {hits}/{used} (+{hits2} second tier)",
                    f(kr),
                    f(pr),
                    f(tr)
                );
            }
        }
    }
}
