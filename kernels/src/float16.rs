//! 16-bit floats (IEEE binary16 and bfloat16) to and from f32, by bits:
//! widening is exact; narrowing rounds to nearest, ties to even, with
//! overflow to infinity and subnormal results, and keeps a NaN a NaN of
//! the same sign and top payload bits (so every 16-bit value, NaNs
//! included, survives the round trip bit for bit). The kernels that take 16-bit logits widen them with these,
//! and write f32 results back with them (exactly, for values that were
//! widened); the host's tests hold them to the `half` crate.

/// The f32 value of bfloat16 bits (exact: bfloat16 is f32's top half).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The f32 value of binary16 bits (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exp = u32::from(bits >> 10) & 0x1f;
    let man = u32::from(bits & 0x3ff);
    let mag = if exp == 0x1f {
        // Infinity, or NaN with its payload.
        0x7f80_0000 | (man << 13)
    } else if exp != 0 {
        ((exp + 112) << 23) | (man << 13)
    } else if man == 0 {
        0
    } else {
        // Subnormal: man * 2^-24, exact in f32.
        (man as f32 * f32::from_bits(0x3380_0000)).to_bits()
    };
    f32::from_bits(sign | mag)
}

/// `x` rounded to bfloat16 bits (nearest, ties to even; NaN stays NaN, see
/// the module docs).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        // The payload's top bits (exact for a widened NaN), quieted only
        // where they would leave infinity.
        let t = (b >> 16) as u16;
        return if t & 0x7f == 0 { t | 0x0040 } else { t };
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// `x` rounded to binary16 bits (nearest, ties to even; above the largest
/// finite half-way point infinity; NaN stays NaN, see the module docs).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        // As for bfloat16: the payload's top bits, quieted only where they
        // would leave infinity.
        let m = ((a >> 13) & 0x3ff) as u16;
        return sign | 0x7c00 | if m == 0 { 0x0200 } else { m };
    }
    if a >= 0x4780_0000 {
        // 2^16 and above (infinity included): infinity.
        return sign | 0x7c00;
    }
    let e = (a >> 23) as i32 - 127;
    let full = (a & 0x007f_ffff) | 0x0080_0000;
    // The result in units of its last place, and the bits dropped.
    let (kept, shift) = if e >= -14 {
        // Normal: the exponent field above 10 mantissa bits (a carry out of
        // the mantissa raises the exponent, up to infinity).
        (((e + 15) as u32) << 10 | ((a & 0x007f_ffff) >> 13), 13u32)
    } else if e >= -25 {
        // Subnormal: full * 2^(e - 23) in units of 2^-24.
        let shift = (-e - 1) as u32;
        (full >> shift, shift)
    } else {
        // Below half the smallest subnormal: zero.
        return sign;
    };
    let rem = full & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && kept & 1 == 1);
    sign | (kept + u32::from(up)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of binary16 bits from its definition, in f64.
    fn f16_value(bits: u16) -> f64 {
        let s = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((bits >> 10) & 0x1f);
        let m = f64::from(bits & 0x3ff);
        match e {
            0 => s * m * 2f64.powi(-24),
            31 if m == 0.0 => s * f64::INFINITY,
            31 => f64::NAN,
            _ => s * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        }
    }

    #[test]
    fn every_f16_widens_to_its_value_and_narrows_back() {
        for bits in 0..=u16::MAX {
            let x = f16_to_f32(bits);
            let v = f16_value(bits);
            if v.is_nan() {
                assert!(x.is_nan(), "{bits:#06x}");
                assert_eq!(f32_to_f16(x), bits, "{bits:#06x}");
            } else {
                assert_eq!(f64::from(x), v, "{bits:#06x}");
                assert_eq!(x.is_sign_negative(), bits & 0x8000 != 0, "{bits:#06x}");
                assert_eq!(f32_to_f16(x), bits, "{bits:#06x}");
            }
        }
    }

    #[test]
    fn every_bf16_widens_exactly_and_narrows_back() {
        for bits in 0..=u16::MAX {
            let x = bf16_to_f32(bits);
            assert_eq!(x.to_bits() >> 16, u32::from(bits));
            assert_eq!(f32_to_bf16(x), bits, "{bits:#06x}");
        }
    }

    #[test]
    fn narrowing_rounds_to_nearest_even() {
        // Every f32 between two consecutive f16 values of several binades,
        // subnormals and the largest finite pair included, against the nearer
        // neighbour (the even one on ties).
        for lo in [
            0x0000u16, 0x0001, 0x03fe, 0x03ff, 0x0400, 0x3bff, 0x3c00, 0x7bfe,
        ] {
            for sign in [0u16, 0x8000] {
                let (a, b) = (lo | sign, (lo + 1) | sign);
                let (xa, xb) = (f64::from(f16_to_f32(a)), f64::from(f16_to_f32(b)));
                let (ba, bb) = (f16_to_f32(a).to_bits(), f16_to_f32(b).to_bits());
                let (first, last) = (ba.min(bb), ba.max(bb));
                let step = ((last - first) / 4096).max(1);
                let mut t = first;
                while t <= last {
                    let x = f32::from_bits(t);
                    let (da, db) = ((f64::from(x) - xa).abs(), (f64::from(x) - xb).abs());
                    let want = if da < db || (da == db && a & 1 == 0) {
                        a
                    } else {
                        b
                    };
                    assert_eq!(f32_to_f16(x), want, "{x:e} between {a:#06x} and {b:#06x}");
                    t += step;
                }
            }
        }
        // Half-way past the largest finite value and beyond: infinity.
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.996), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(-1e30), 0xfc00);
        // Half the smallest subnormal ties to zero; just above it, up.
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
        assert_eq!(f32_to_f16(f32::from_bits(2f32.powi(-25).to_bits() + 1)), 1);
        assert_eq!(f32_to_f16(1e-30), 0);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        // NaNs whose payload lies below the 16-bit one stay NaN.
        assert_eq!(f32_to_bf16(f32::from_bits(0xff80_0001)), 0xffc0);
        assert_eq!(f32_to_f16(f32::from_bits(0x7f80_0001)), 0x7e00);
    }
}
