//! The Gumbel-max decision rule shared by every sampling kernel.
//!
//! A candidate is a 64-bit key `class:2 | score:32 | !index:30`, so that one
//! unsigned maximum picks the library's winner: higher class, then higher
//! score, then lower index. Classes: 0 for NaN and -inf logits (never a valid
//! token), 1 for finite logits, 2 for +inf logits (a row with +inf entries
//! samples uniformly among them: their score is the noise alone).

use crate::{noise, radix};

/// Bits of the index field: vocabularies up to 2^30 tokens.
pub const INDEX_BITS: u32 = 30;
/// Largest vocabulary a sampling kernel accepts.
pub const MAX_VOCAB: u64 = 1 << INDEX_BITS;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// Class of a logit: 0 for NaN and -inf, 1 finite, 2 for +inf.
#[inline(always)]
pub fn logit_class(x: f32) -> u32 {
    if x == f32::INFINITY {
        2
    } else if x > f32::NEG_INFINITY {
        1
    } else {
        0
    }
}

/// The key of token `index` with class `class` and score `score`.
#[inline(always)]
pub fn pack(class: u32, score: f32, index: u32) -> u64 {
    (u64::from(class) << 62)
        | (u64::from(radix::f32_key(score.to_bits())) << INDEX_BITS)
        | (INDEX_MASK - u64::from(index))
}

/// The token a key names.
#[inline(always)]
pub fn token(key: u64) -> u32 {
    (INDEX_MASK - (key & INDEX_MASK)) as u32
}

/// Whether the winning key names a valid token (its class is not 0).
#[inline(always)]
pub fn is_valid(key: u64) -> bool {
    key >> 62 != 0
}

/// Key of token `index` for a greedy row (argmax, lowest index on ties).
#[inline(always)]
pub fn greedy_key(x: f32, index: u32) -> u64 {
    let class = logit_class(x);
    pack(class, if class == 1 { x } else { 0.0 }, index)
}

/// Key of token `index` in a Gumbel-max race: `x * inv_t + G` with `G` the
/// Gumbel noise of `noise_bits` (the token's Philox word).
#[inline(always)]
pub fn gumbel_key(x: f32, inv_t: f32, noise_bits: u32, index: u32) -> u64 {
    let class = logit_class(x);
    let score = match class {
        1 => x * inv_t + noise::gumbel_from_bits(noise_bits),
        2 => noise::gumbel_from_bits(noise_bits),
        _ => 0.0,
    };
    pack(class, score, index)
}

/// Whether a row with this temperature is sampled greedily (T <= 0 or NaN).
#[inline(always)]
pub fn is_greedy(temperature: f32) -> bool {
    // NaN compares false: a NaN temperature is greedy too.
    temperature.is_nan() || temperature <= 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_class_then_score_then_low_index() {
        assert!(pack(2, -5.0, 9) > pack(1, 100.0, 0));
        assert!(pack(1, 1.0, 9) > pack(1, 0.5, 0));
        assert!(pack(1, 1.0, 3) > pack(1, 1.0, 4));
        assert!(pack(1, -1.0e30, 3) > pack(0, 0.0, 0));
        assert_eq!(token(pack(1, 2.0, 123_456)), 123_456);
        assert_eq!(token(pack(0, 0.0, (1 << 30) - 1)), (1 << 30) - 1);
        assert!(!is_valid(greedy_key(f32::NAN, 0)));
        assert!(!is_valid(greedy_key(f32::NEG_INFINITY, 0)));
        assert!(is_valid(greedy_key(f32::INFINITY, 0)));
        assert!(is_greedy(0.0) && is_greedy(-1.0) && is_greedy(f32::NAN) && !is_greedy(0.5));
    }
}
