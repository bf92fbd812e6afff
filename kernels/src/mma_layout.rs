//! Index math of the fused sampler's tensor-core tiles, shared by the kernel
//! and a CPU emulation test of `ldmatrix` and `mma.sync` (PTX ISA fragment
//! layouts), so a wrong lane mapping shows up on the CPU, not as a wrong
//! token on the GPU.
//!
//! Shared-memory tiles hold rows of [`ROW_BYTES`] (64 b16 values of the k
//! dimension) in 16-byte chunks, XOR-swizzled by row so that the eight row
//! addresses of one `ldmatrix` matrix fall in eight different bank groups.

/// Bytes of one staged row (`FUSED_BLOCK_K` b16 values).
pub const ROW_BYTES: u32 = 128;
/// 16-byte chunks per staged row.
pub const CHUNKS: u32 = ROW_BYTES / 16;

/// Byte offset of 16-byte chunk `c` of staged row `r`.
#[inline(always)]
pub const fn swz(r: u32, c: u32) -> u32 {
    r * ROW_BYTES + ((c ^ (r & 7)) * 16)
}

/// (row, chunk) whose address lane `lane` of warp `warp` gives to the
/// `ldmatrix.x4` loading the A fragment (16 vocabulary rows x 16 k) of k16
/// step `kk`: lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15,
/// so the four matrices are (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15),
/// (8-15, 8-15): registers a0..a3 of `mma.m16n8k16` `.row`.
#[inline(always)]
pub const fn a_row(warp: u32, lane: u32, kk: u32) -> (u32, u32) {
    (16 * warp + (lane % 16), 2 * kk + lane / 16)
}

/// (batch row, chunk) whose address lane `lane` gives to the `ldmatrix.x4`
/// loading the B fragments of batch columns `16 pair .. 16 pair + 16` at k16
/// step `kk`: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
/// (n 8-15, k 8-15), i.e. registers b0, b1 of n-tile `2 pair` then of
/// n-tile `2 pair + 1` (`.col` B stored as rows of batch, k contiguous).
#[inline(always)]
pub const fn b_row(lane: u32, pair: u32, kk: u32) -> (u32, u32) {
    let m = lane / 8;
    (16 * pair + (lane % 8) + 8 * (m / 2), 2 * kk + (m % 2))
}

/// (vocabulary row within the tile, batch column within the batch tile) of
/// accumulator `i` (0..4) of n-tile `nt` held by lane `lane` of warp `warp`
/// (`mma.m16n8k16` C layout: c0, c1 at row g, columns 2t, 2t+1; c2, c3 at
/// row g + 8).
#[inline(always)]
pub const fn c_pos(warp: u32, lane: u32, nt: u32, i: u32) -> (u32, u32) {
    let (g, t) = (lane / 4, lane % 4);
    (16 * warp + g + 8 * (i / 2), 8 * nt + 2 * t + (i % 2))
}

#[cfg(test)]
mod tests {
    //! Emulates a warp's `ldmatrix.x4` and `mma.m16n8k16.row.col` by the PTX
    //! ISA's fragment layouts and checks the tile index math against a
    //! plain matrix product.
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;

    /// A staged tile: `rows` rows of 64 values (exact small integers, so
    /// f32 products and sums are exact), stored swizzled as the kernel's
    /// cp.async does.
    fn stage(rows: u32, value: impl Fn(u32, u32) -> f32) -> Vec<f32> {
        let mut smem = vec![f32::NAN; (rows * ROW_BYTES / 2) as usize];
        for r in 0..rows {
            for k in 0..64 {
                let byte = swz(r, k / 8) + 2 * (k % 8);
                smem[(byte / 2) as usize] = value(r, k);
            }
        }
        smem
    }

    /// `ldmatrix.x4`: lane `8 q + i` gives the address of row `i` of matrix
    /// `q`; lane `t` receives, in register `q`, elements `2 (t % 4)` and
    /// `2 (t % 4) + 1` of row `t / 4` of matrix `q`.
    fn ldmatrix_x4(smem: &[f32], addr: impl Fn(u32) -> u32) -> [[[f32; 2]; 4]; 32] {
        let mut regs = [[[0.0; 2]; 4]; 32];
        for (t, reg) in regs.iter_mut().enumerate() {
            for (q, r) in reg.iter_mut().enumerate() {
                let row_addr = addr(8 * q as u32 + t as u32 / 4);
                let e = row_addr / 2 + 2 * (t as u32 % 4);
                *r = [smem[e as usize], smem[e as usize + 1]];
            }
        }
        regs
    }

    /// `mma.m16n8k16.row.col`: rebuilds A (16 x 16) and B (16 x 8) from the
    /// lanes' fragments by the PTX layouts, returns each lane's D fragment.
    fn mma(a: &[[[f32; 2]; 4]; 32], b: &[[[f32; 2]; 2]; 32], c: &[[f32; 4]; 32]) -> [[f32; 4]; 32] {
        let mut am = [[f32::NAN; 16]; 16];
        let mut bm = [[f32::NAN; 8]; 16];
        for t in 0..32 {
            let (g, q) = (t / 4, t % 4);
            for e in 0..2 {
                am[g][2 * q + e] = a[t][0][e];
                am[g + 8][2 * q + e] = a[t][1][e];
                am[g][2 * q + 8 + e] = a[t][2][e];
                am[g + 8][2 * q + 8 + e] = a[t][3][e];
                bm[2 * q + e][g] = b[t][0][e];
                bm[2 * q + 8 + e][g] = b[t][1][e];
            }
        }
        let mut d = *c;
        for (t, dt) in d.iter_mut().enumerate() {
            let (g, q) = (t / 4, t % 4);
            for (i, di) in dt.iter_mut().enumerate() {
                let (row, col) = (g + 8 * (i / 2), 2 * q + (i % 2));
                *di += (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f32>();
            }
        }
        d
    }

    #[test]
    fn tile_index_math_matches_a_plain_product() {
        const NB: u32 = 64;
        let w = |v: u32, k: u32| ((v * 7 + k * 3) % 11) as f32 - 5.0;
        let h = |b: u32, k: u32| ((b * 5 + k * 13) % 7) as f32 - 3.0;
        let ws = stage(128, w);
        let hs = stage(NB, h);
        let mut out = vec![f32::NAN; (128 * NB) as usize];
        for warp in 0..8 {
            let mut acc = [[[0.0f32; 4]; 32]; (NB / 8) as usize];
            for kk in 0..4 {
                let a = ldmatrix_x4(&ws, |lane| {
                    let (r, c) = a_row(warp, lane, kk);
                    swz(r, c)
                });
                for pair in 0..NB / 16 {
                    let b = ldmatrix_x4(&hs, |lane| {
                        let (n, c) = b_row(lane, pair, kk);
                        swz(n, c)
                    });
                    for half in 0..2 {
                        let nt = (2 * pair + half) as usize;
                        let frag: [[[f32; 2]; 2]; 32] = core::array::from_fn(|t| {
                            [b[t][2 * half as usize], b[t][2 * half as usize + 1]]
                        });
                        acc[nt] = mma(&a, &frag, &acc[nt]);
                    }
                }
            }
            for (nt, tile) in acc.iter().enumerate() {
                for (lane, regs) in tile.iter().enumerate() {
                    for (i, &x) in regs.iter().enumerate() {
                        let (v, b) = c_pos(warp, lane as u32, nt as u32, i as u32);
                        out[(b * 128 + v) as usize] = x;
                    }
                }
            }
        }
        for b in 0..NB {
            for v in 0..128 {
                let want: f32 = (0..64).map(|k| w(v, k) * h(b, k)).sum();
                assert_eq!(
                    out[(b * 128 + v) as usize],
                    want,
                    "logit (batch {b}, vocab {v})"
                );
            }
        }
    }

    #[test]
    fn ldmatrix_rows_hit_distinct_bank_groups() {
        // The eight row addresses of each matrix of an ldmatrix: distinct
        // 16-byte bank groups (byte offset / 16 mod 8).
        for kk in 0..4 {
            for q in 0..4 {
                let groups: Vec<u32> = (0..8)
                    .map(|i| (swz(a_row(0, 8 * q + i, kk).0, a_row(0, 8 * q + i, kk).1) / 16) % 8)
                    .collect();
                let mut sorted = groups.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), 8, "A kk={kk} matrix {q}: {groups:?}");
                let groups: Vec<u32> = (0..8)
                    .map(|i| {
                        let (n, c) = b_row(8 * q + i, 1, kk);
                        (swz(n, c) / 16) % 8
                    })
                    .collect();
                let mut sorted = groups.clone();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), 8, "B kk={kk} matrix {q}: {groups:?}");
            }
        }
    }
}
