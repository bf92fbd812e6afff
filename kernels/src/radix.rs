//! Order-preserving integer keys for floating-point values, NaN mapped to
//! the key of -inf (the library treats NaN logits as -inf).

/// Key of an f32 bit pattern: `a < b` as floats iff `key(a) < key(b)`;
/// `-0.0` and `+0.0` get adjacent keys; NaN gets the key of -inf.
#[inline(always)]
pub fn f32_key(bits: u32) -> u32 {
    let bits = if bits & 0x7fff_ffff > 0x7f80_0000 {
        0xff80_0000
    } else {
        bits
    };
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The f32 bit pattern of a key made by [`f32_key`] (NaN comes back as -inf).
#[inline(always)]
pub fn f32_from_key(key: u32) -> u32 {
    if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    }
}

/// Key of a bf16 bit pattern (same order as its f32 widening).
#[inline(always)]
pub fn bf16_key(bits: u16) -> u16 {
    (f32_key(u32::from(bits) << 16) >> 16) as u16
}

/// Key of an IEEE f16 bit pattern.
#[inline(always)]
pub fn f16_key(bits: u16) -> u16 {
    let bits = if bits & 0x7fff > 0x7c00 { 0xfc00 } else { bits };
    if bits & 0x8000 != 0 {
        !bits
    } else {
        bits | 0x8000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_keys_follow_float_order() {
        let xs = [
            f32::NEG_INFINITY,
            -3.0e38,
            -1.0,
            -1.0e-40,
            -0.0,
            0.0,
            1.0e-40,
            1.0,
            2.5,
            3.0e38,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(f32_key(w[0].to_bits()) < f32_key(w[1].to_bits()), "{w:?}");
        }
        assert_eq!(
            f32_key(f32::NAN.to_bits()),
            f32_key(f32::NEG_INFINITY.to_bits())
        );
        assert_eq!(
            f32_key((-f32::NAN).to_bits()),
            f32_key(f32::NEG_INFINITY.to_bits())
        );
        for x in xs {
            assert_eq!(f32_from_key(f32_key(x.to_bits())), x.to_bits());
        }
    }

    #[test]
    fn half_keys_follow_float_order() {
        // bf16: -inf, -1, -0, +0, 1, +inf
        let bf = [0xff80u16, 0xbf80, 0x8000, 0x0000, 0x3f80, 0x7f80];
        for w in bf.windows(2) {
            assert!(bf16_key(w[0]) < bf16_key(w[1]));
        }
        assert_eq!(bf16_key(0x7fc1), bf16_key(0xff80));
        // f16: -inf, -1, -0, +0, 1, +inf
        let h = [0xfc00u16, 0xbc00, 0x8000, 0x0000, 0x3c00, 0x7c00];
        for w in h.windows(2) {
            assert!(f16_key(w[0]) < f16_key(w[1]));
        }
        assert_eq!(f16_key(0x7e00), f16_key(0xfc00));
    }
}
