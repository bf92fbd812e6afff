//! Random words to uniforms, exponentials and Gumbel noise.
//!
//! Every function here uses only IEEE-754 operations that are correctly
//! rounded on both the CPU and the GPU (`+`, `*`, `/`, fused multiply-add,
//! integer conversions), so the device and the CPU reference compute the very
//! same bits. The approximate hardware logarithm the kernels use to *filter*
//! candidates lives in the device code; the value that decides a token is
//! always the one computed here.

use core::intrinsics::fmaf32;

// ln 2 split so that `e * LN2_HI` is exact for every exponent (the hex
// values are the exact f32 bit patterns).
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0.693145751953125
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // ln 2 - LN2_HI
const SQRT2: f32 = core::f32::consts::SQRT_2;

/// A uniform number in the open interval (0, 1) from one random word:
/// `(2m + 1) / 2^24` with `m` the word's top 23 bits, exactly representable
/// (24 significant bits), never 0 and never 1.
#[inline(always)]
pub fn uniform_open(bits: u32) -> f32 {
    (((bits >> 9) << 1) | 1) as f32 * (1.0 / 16_777_216.0)
}

/// Natural logarithm of a positive, finite, normal `x`, to about one ulp.
///
/// `ln x = e ln 2 + 2 atanh(f / (2 + f))` with `x = 2^e (1 + f)` and
/// `1 + f` in `[sqrt(1/2), sqrt(2))`.
#[inline(always)]
pub fn ln_f32(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > SQRT2 {
        m *= 0.5;
        e += 1;
    }
    let f = m - 1.0; // exact (Sterbenz)
    let s = f / (2.0 + f);
    let z = s * s;
    // 2 atanh(s) = 2s + 2s (z/3 + z^2/5 + ...), |s| <= 0.1716
    let p = fmaf32(z, 1.0 / 11.0, 1.0 / 9.0);
    let p = fmaf32(z, p, 1.0 / 7.0);
    let p = fmaf32(z, p, 1.0 / 5.0);
    let p = fmaf32(z, p, 1.0 / 3.0);
    let two_s = s + s;
    let ln_m = fmaf32(two_s * z, p, two_s);
    let ef = e as f32;
    fmaf32(ef, LN2_HI, fmaf32(ef, LN2_LO, ln_m))
}

/// `ln(1 - t)` for `t` in `[0, 1/2]`, accurate also for tiny `t`:
/// `-2 atanh(t / (2 - t))`.
#[inline(always)]
pub fn ln_1m_f32(t: f32) -> f32 {
    let s = t / (2.0 - t); // s <= 1/3
    let z = s * s;
    let p = fmaf32(z, 1.0 / 17.0, 1.0 / 15.0);
    let p = fmaf32(z, p, 1.0 / 13.0);
    let p = fmaf32(z, p, 1.0 / 11.0);
    let p = fmaf32(z, p, 1.0 / 9.0);
    let p = fmaf32(z, p, 1.0 / 7.0);
    let p = fmaf32(z, p, 1.0 / 5.0);
    let p = fmaf32(z, p, 1.0 / 3.0);
    let two_s = s + s;
    -fmaf32(two_s * z, p, two_s)
}

/// The word's distance from the nearer end of the unit interval:
/// `t = (min(x, !x) + 1/2) / 2^32` in `(0, 1/2]`, and whether the word is in
/// the upper half (`u = 1 - t`) rather than the lower (`u = t`), where
/// `u = (x + 1/2) / 2^32`.
#[inline(always)]
pub fn split_unit(bits: u32) -> (f32, bool) {
    let upper = bits >= 0x8000_0000;
    let m = if upper { !bits } else { bits };
    ((m as f32 + 0.5) * (1.0 / 4_294_967_296.0), upper)
}

/// A standard exponential `E = -ln u` with `u = (x + 1/2) / 2^32`, using all
/// 32 bits: the small values of `E` (large `u`), which decide Gumbel-max, keep
/// full relative precision down to `E = 2^-33`.
#[inline(always)]
pub fn exponential_from_bits(bits: u32) -> f32 {
    let (t, upper) = split_unit(bits);
    if upper { -ln_1m_f32(t) } else { -ln_f32(t) }
}

/// Standard Gumbel noise `-ln(-ln u)` from one random word; within
/// `[-3.2, 23.0]`.
#[inline(always)]
pub fn gumbel_from_bits(bits: u32) -> f32 {
    -ln_f32(exponential_from_bits(bits))
}

/// Largest value [`gumbel_from_bits`] can return (`-ln(-ln(1 - 2^-33))`,
/// rounded up): no token whose scaled logit is below the current best minus
/// this can win a Gumbel-max race.
pub const GUMBEL_MAX: f32 = 22.88;

/// An upper bound on [`gumbel_from_bits`]: `0.37` for words in the lower
/// half (`u < 1/2`, where `G = -ln(-ln u) < -ln(ln 2) = 0.3665`), else
/// `(1 + clz(!bits)) ln 2`: with `s = (!bits + 1/2) / 2^32` the distance of
/// `u` from 1, `-ln u >= s`, so `G <= -ln s <= 32 ln 2 - ln(!bits)`, and
/// `!bits >= 2^(31 - clz(!bits))` (for `!bits = 0`, `s = 2^-33` and the bound
/// is `33 ln 2`). In particular every word with `!bits >= 2^24` has
/// `G <= 8 ln 2` ([`GUMBEL_BOUND_COMMON`]): the kernels' one-compare test.
#[inline(always)]
pub fn gumbel_upper_bound(bits: u32) -> f32 {
    if bits < 0x8000_0000 {
        GUMBEL_BOUND_LOWER
    } else {
        gumbel_clz_bound(bits)
    }
}

/// `(1 + clz(!bits)) ln 2`, the upper half's bound of
/// [`gumbel_upper_bound`], which bounds the lower half's noise too (`ln 2`
/// there, above `0.37`): branch free and non-decreasing in `bits`, so its
/// value at the largest of several words bounds the noise of all of them
/// (the sampling kernels' one test per Philox group).
#[inline(always)]
pub fn gumbel_clz_bound(bits: u32) -> f32 {
    (1 + (!bits).leading_zeros()) as f32 * LN2_UP
}

/// `ln 2` rounded up, so that multiples of it stay upper bounds.
pub const LN2_UP: f32 = 0.693_148;

/// [`gumbel_from_bits`] of every word in the lower half (`bits < 2^31`) is
/// at most this (see [`gumbel_upper_bound`]).
pub const GUMBEL_BOUND_LOWER: f32 = 0.37;

/// Words with `!bits >= COMMON_WORD_MIN` (all but one in 256) have Gumbel
/// noise at most [`GUMBEL_BOUND_COMMON`].
pub const COMMON_WORD_MIN: u32 = 1 << 24;
/// `8 ln 2` rounded up: the bound of [`gumbel_upper_bound`] for every word
/// with `!bits >= 2^24`.
pub const GUMBEL_BOUND_COMMON: f32 = 8.0 * LN2_UP;

/// Upper bound on the error of the kernels' approximate Gumbel noise (from
/// `lg2.approx`) against [`gumbel_from_bits`], over all 2^32 words: the
/// kernels' candidate filter keeps a margin of twice this. The GPU test suite
/// checks it exhaustively with the `gumbel_filter_error_probe` kernel.
pub const GUMBEL_APPROX_ERR: f32 = 2.0e-5;

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        let ulp = f64::from(f32::EPSILON) * b.abs().max(f64::from(f32::MIN_POSITIVE));
        (f64::from(a) - b).abs() / ulp
    }

    #[test]
    fn gumbel_upper_bound_holds() {
        let check = |w: u32| {
            let (g, ub) = (gumbel_from_bits(w), gumbel_upper_bound(w));
            assert!(g <= ub, "word {w:#010x}: G = {g} above its bound {ub}");
            assert!(ub <= gumbel_clz_bound(w), "word {w:#010x}");
            if !w >= COMMON_WORD_MIN {
                assert!(
                    g <= GUMBEL_BOUND_COMMON,
                    "word {w:#010x}: G = {g} above the common bound"
                );
            }
        };
        // Exhaustively where G is largest (u within 2^-8 of 1), sampled
        // elsewhere, and around the half-way and 2^24 boundaries.
        for w in (u32::MAX - (1 << 24))..=u32::MAX {
            check(w);
        }
        for w in (0..=u32::MAX).step_by(257) {
            check(w);
        }
        for w in
            (0x7fff_ff00..=0x8000_00ff).chain((!COMMON_WORD_MIN - 256)..=(!COMMON_WORD_MIN + 256))
        {
            check(w);
        }
        assert!(gumbel_upper_bound(u32::MAX) >= GUMBEL_MAX - 0.01);
        // Non-decreasing: constant between the powers of two of `!bits`.
        for n in 0..32 {
            let w = !((1u32 << (31 - n)) - 1);
            assert!(gumbel_clz_bound(w - 1) <= gumbel_clz_bound(w), "{w:#x}");
        }
    }

    #[test]
    fn uniform_is_open() {
        assert!(uniform_open(0) > 0.0);
        assert!(uniform_open(u32::MAX) < 1.0);
        assert_eq!(uniform_open(0), 1.0 / 16_777_216.0);
        assert_eq!(uniform_open(u32::MAX), 1.0 - 1.0 / 16_777_216.0);
    }

    #[test]
    fn ln_is_accurate() {
        let mut worst = 0.0f64;
        let mut x = 1.0e-12f32;
        while x < 1.0e12 {
            worst = worst.max(ulps(ln_f32(x), f64::from(x).ln()));
            x *= 1.000_173;
        }
        // Around 1, where the result is small.
        for i in 1..20_000 {
            let x = 1.0 + (i as f32 - 10_000.0) * 1.0e-6;
            worst = worst.max(ulps(ln_f32(x), f64::from(x).ln()));
        }
        assert!(worst < 4.0, "ln_f32 worst error {worst} ulps");
    }

    #[test]
    fn ln_1m_is_accurate() {
        let mut worst = 0.0f64;
        let mut t = 1.0e-10f32;
        while t <= 0.5 {
            worst = worst.max(ulps(ln_1m_f32(t), (-f64::from(t)).ln_1p()));
            t *= 1.000_31;
        }
        assert!(worst < 4.0, "ln_1m_f32 worst error {worst} ulps");
    }

    #[test]
    fn exponential_and_gumbel_match_f64() {
        let mut worst_e = 0.0f64;
        let mut worst_g = 0.0f64;
        let mut x: u32 = 1;
        for _ in 0..2_000_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            for bits in [x, !x, x >> 20, !(x >> 20)] {
                let u = (f64::from(bits) + 0.5) / 4_294_967_296.0;
                let e = -u.ln();
                worst_e = worst_e.max(ulps(exponential_from_bits(bits), e));
                let g = -e.ln();
                // Absolute error for the Gumbel value: it is added to logits.
                worst_g = worst_g.max((f64::from(gumbel_from_bits(bits)) - g).abs());
            }
        }
        assert!(worst_e < 4.0, "exponential worst error {worst_e} ulps");
        assert!(worst_g < 4.0e-6, "gumbel worst abs error {worst_g}");
        assert!(gumbel_from_bits(u32::MAX) <= GUMBEL_MAX);
        assert!(gumbel_from_bits(u32::MAX) > GUMBEL_MAX - 0.01);
    }
}
