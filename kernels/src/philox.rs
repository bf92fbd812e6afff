//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
//! SC'11), bit-compatible with Random123's `philox4x32_10`.
//!
//! Every random number in flashsample comes from this one function, on the
//! device and in the CPU reference, so both draw identical bits.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Counter word 1 of the per-token noise stream (Gumbel noise of token `j`).
pub const STREAM_TOKEN_NOISE: u32 = 0;
/// Counter word 1 of the per-row uniform stream (inverse-CDF draws).
pub const STREAM_ROW_UNIFORM: u32 = 1;

/// `(hi, lo)` of the 64-bit product. Written as two 32-bit products (the
/// high one from a 64-bit multiply, which LLVM turns into `mul.hi.u32`),
/// not as halves of one 64-bit value: with those, LLVM kept Philox's words
/// in 64-bit registers and ptxas spent an add on every high word, a third
/// of the kernels' Philox instructions.
#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    (((a as u64 * b as u64) >> 32) as u32, a.wrapping_mul(b))
}

#[inline(always)]
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo(M0, c[0]);
    let (hi1, lo1) = mulhilo(M1, c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x32 with 10 rounds: four random words for `counter` under `key`.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    let mut i = 0;
    while i < 10 {
        if i > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        c = round(c, k);
        i += 1;
    }
    c
}

/// The key of a row's stream: its 64-bit seed split into two words.
#[inline(always)]
pub fn seed_key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The four noise words of tokens `4g .. 4g + 4` of a row at `offset`:
/// the counter is (g, stream, offset_lo, offset_hi), so the noise of token
/// `j` is word `j % 4` of group `j / 4`, whichever thread or tile asks.
#[inline(always)]
pub fn token_noise_group(key: [u32; 2], offset: u64, group: u32) -> [u32; 4] {
    philox4x32_10(
        [
            group,
            STREAM_TOKEN_NOISE,
            offset as u32,
            (offset >> 32) as u32,
        ],
        key,
    )
}

/// The noise word of token `j` (one Philox call; prefer
/// [`token_noise_group`] when four neighbours are needed).
#[inline(always)]
pub fn token_noise(key: [u32; 2], offset: u64, j: u32) -> u32 {
    let r = token_noise_group(key, offset, j >> 2);
    // Selected without indexing: a dynamic index puts the array in local
    // memory on the GPU.
    match j & 3 {
        0 => r[0],
        1 => r[1],
        2 => r[2],
        _ => r[3],
    }
}

/// The `i`-th uniform word of a row's per-row stream at `offset` (for
/// inverse-CDF draws and pivot sampling).
#[inline(always)]
pub fn row_uniform_bits(key: [u32; 2], offset: u64, i: u32) -> u32 {
    philox4x32_10(
        [
            i >> 2,
            STREAM_ROW_UNIFORM,
            offset as u32,
            (offset >> 32) as u32,
        ],
        key,
    )[(i & 3) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors from Random123's kat_vectors (philox4x32_10).
    #[test]
    fn random123_known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn token_noise_is_addressed_by_index() {
        let key = seed_key(0x0123_4567_89ab_cdef);
        for j in [0u32, 1, 2, 3, 4, 5, 1023, 151_935] {
            let g = token_noise_group(key, 7, j >> 2);
            assert_eq!(token_noise(key, 7, j), g[(j & 3) as usize]);
        }
        assert_ne!(token_noise(key, 7, 5), token_noise(key, 8, 5));
        assert_ne!(token_noise(key, 7, 5), row_uniform_bits(key, 7, 5));
    }
}
