//! `fused_sample`: the LM-head matmul with a Gumbel-max epilogue
//! (FlashSampling). Logits `h . W^T (+ bias)` are computed tile by tile on
//! tensor cores (f32 accumulation: `wgmma` m64nNk16 from shared memory on
//! sm_90a, `mma.sync` m16n8k16 elsewhere), scaled by 1/T,
//! raced with the Gumbel noise of the row's Philox stream at the **global**
//! vocabulary index, and reduced to one (key, log-sum-exp) partial per row
//! and vocabulary tile; the `[batch, vocab]` logits never reach memory.
//! `fused_sample_finish` folds the tiles' partials into the token, its
//! validity, the row's log-normaliser and the token's log-probability.
//!
//! Tensor parallelism (see [`FusedParams`]): a launch may cover one
//! vocabulary shard, with the tokens' global indices in the noise and the
//! keys and the full vocabulary's tile grid, writing its partials into its
//! own parts (partial positions) of a buffer shared with the other shards,
//! and, for the peer-to-peer exchange, into the same parts of every peer's
//! buffer as each tile finishes. When shard boundaries are multiples of
//! [`FUSED_BLOCK_V`] the parts are exactly the unsharded launch's tiles, so
//! the finish sees the same partials in the same places and writes the same
//! bits; otherwise a boundary tile is split over two parts (two partials of
//! the same tile), which changes only the log-sum-exp's rounding.
//!
//! Determinism: every logit is the same sequence of `wgmma` (sm_90a) or
//! `mma` (other modules) operations in k order whatever the batch tile, so
//! its bits depend on the module, never on the batch; each tile's partial
//! is reduced by a
//! fixed tree (four slots of 32 tokens); the finish folds parts in a fixed
//! order. So tokens (exact maxima) and the log-normaliser bits depend only on
//! the row, its parameters, `vocab` and `dim` (and, for the log-normaliser,
//! on shard boundaries off the tile grid): not on batch size, position,
//! grid or the number of shards.
//!
//! # Launch (`fused_sample_{bf16,f16}_b{16,32,64,128}`)
//! Grid `(ceil(batch / B), ctas)` (x: batch tile of `B` rows, y: vocabulary
//! CTAs, each looping over steps `y, y + ctas, ...` of
//! [`fused_mtiles`]`(B)` consecutive tiles), block
//! [`fused_threads`]`(B)`, dynamic shared memory [`fused_smem_bytes`]`(B)`
//! (above 48 KiB: the host raises the function's limit).
//!
//! In the sm_90a module the 64- and 128-row kernels are warp-specialised
//! (`fused_sample_ws` at 64 rows, two tiles a step; `fused_sample_pp` at
//! 128, one tile a step in two consumer groups taking turns): block
//! `params::FUSED_WS_THREADS`, grid `(ceil(batch / B), ctas)` over steps of
//! `params::fused_ws_step_tiles(B)` tiles, dynamic shared memory
//! `params::fused_ws_smem_bytes(B)`, and the first two parameters are
//! `params::TensorMap`s of the hidden states and the LM head (passed by
//! value, 64-byte aligned in parameter space) instead of their addresses.
//!
//! Every entry point (and `fused_sample_finish`) first executes
//! `griddepcontrol.wait`, so on sm_90 the host may launch it with a
//! programmatic dependency on the stream's previous kernel: its blocks are
//! dispatched while that kernel drains and touch no memory before it has
//! completed. The one-device `fused_sample` launches both of its kernels
//! that way (2.2 to 3.3 us off each back-to-back call on an H100, session
//! 44); the tensor-parallel launches, ordered by events across streams,
//! launch plainly.
//!
//! # Safety (caller)
//! `hidden` holds `batch` rows of `hidden_stride` elements (`dim` readable),
//! `weight` `vocab * dim` elements; both 16-byte aligned with `dim` and
//! `hidden_stride` multiples of 8; `bias` is null or holds `vocab` f32;
//! `temperature`, `seed`, `offset` hold `batch` values; `partial` and the
//! `peers` buffers listed in `peer_partial` each hold `batch * parts *
//! FUSED_PARTIAL_WORDS` u64 (peer buffers mapped into this context), with
//! `part_offset + tiles <= parts`.

use crate::arch;
use crate::block::Lse2;
use crate::mma_layout::{CHUNKS, ROW_BYTES, c_pos, swz};
#[cfg(not(target_feature = "sm_90a"))]
use crate::mma_layout::{a_row, b_row};
use crate::params::{
    FUSED_BLOCK_K, FUSED_BLOCK_V, FUSED_CS_STRIDE, FUSED_FILTER_BYTES, FUSED_PARTIAL_WORDS,
    FusedParams, fused_filter_offset, fused_mtiles, fused_stage_bytes, fused_stages,
    fused_staging_offset, fused_threads,
};
#[cfg(target_feature = "sm_90a")]
use crate::params::{
    FUSED_WS_CONSUMER_REGS, FUSED_WS_CONSUMERS, FUSED_WS_PRODUCER_REGS, FUSED_WS_STAGES, TensorMap,
    fused_ws, fused_ws_barrier_offset, fused_ws_filter_offset, fused_ws_stage_bytes,
    fused_ws_staging_offset, fused_ws_step_tiles,
};
use crate::race::Race;
use crate::sample;

const _: () = assert!(FUSED_BLOCK_K * 2 == ROW_BYTES);

const LOG2E: f32 = core::f32::consts::LOG2_E;
const LN2: f32 = core::f32::consts::LN_2;
/// Epilogue threads per batch row, each owning 32 consecutive tokens of a
/// tile (fixed, so the log-sum-exp tree does not depend on the batch tile).
const SLOTS: u32 = 4;
const SLOT_TOKENS: u32 = FUSED_BLOCK_V / SLOTS;

/// A (row, tile) partial: the best key, the scaled logit of its token, and
/// the base-2 log-sum-exp of the tile; stored as [`FUSED_PARTIAL_WORDS`]
/// words `key, (max << 32 | sum), xs`.
#[derive(Clone, Copy)]
struct Partial {
    key: u64,
    xs: f32,
    lse: Lse2,
}

impl Partial {
    const EMPTY: Partial = Partial {
        key: 0,
        xs: f32::NAN,
        lse: Lse2::EMPTY,
    };

    /// Symmetric: both butterfly partners compute the same bits.
    #[inline(always)]
    fn merge(self, o: Partial) -> Partial {
        let (key, xs) = if o.key > self.key {
            (o.key, o.xs)
        } else {
            (self.key, self.xs)
        };
        Partial {
            key,
            xs,
            lse: self.lse.merge(o.lse),
        }
    }

    /// Merges over lanes `lane ^ m` for `m = first, first / 2, ..., 1` (a
    /// fixed tree); every lane of the warp must call it.
    #[inline(always)]
    fn butterfly(mut self, first: u32) -> Partial {
        let mut m = first;
        while m > 0 {
            let o = Partial {
                key: (u64::from(arch::shfl_bfly_u32((self.key >> 32) as u32, m)) << 32)
                    | u64::from(arch::shfl_bfly_u32(self.key as u32, m)),
                xs: f32::from_bits(arch::shfl_bfly_u32(self.xs.to_bits(), m)),
                lse: Lse2 {
                    max: f32::from_bits(arch::shfl_bfly_u32(self.lse.max.to_bits(), m)),
                    sum: f32::from_bits(arch::shfl_bfly_u32(self.lse.sum.to_bits(), m)),
                },
            };
            self = self.merge(o);
            m >>= 1;
        }
        self
    }

    /// # Safety
    /// `p` holds [`FUSED_PARTIAL_WORDS`] writable words.
    #[inline(always)]
    unsafe fn store(self, p: *mut u64) {
        // SAFETY: the caller's contract.
        unsafe {
            *p = self.key;
            *p.add(1) =
                (u64::from(self.lse.max.to_bits()) << 32) | u64::from(self.lse.sum.to_bits());
            *p.add(2) = u64::from(self.xs.to_bits());
        }
    }

    /// [`Partial::load`] from global memory by read-only loads issued where
    /// they stand ([`arch::ld_global_nc_u64`]: none moved under a later
    /// comparison).
    ///
    /// # Safety
    /// As [`Partial::load`], in global memory no thread writes during the
    /// kernel.
    #[inline(always)]
    unsafe fn load_global(p: *const u64) -> Partial {
        // SAFETY: the caller's contract.
        let (key, l, xs) = unsafe {
            (
                arch::ld_global_nc_u64(p),
                arch::ld_global_nc_u64(p.add(1)),
                arch::ld_global_nc_u64(p.add(2)),
            )
        };
        Partial::from_words(key, l, xs)
    }

    /// The partial of its words `(key, lse, xs)`.
    #[inline(always)]
    fn from_words(key: u64, l: u64, xs: u64) -> Partial {
        Partial {
            key,
            xs: f32::from_bits(xs as u32),
            lse: Lse2 {
                max: f32::from_bits((l >> 32) as u32),
                sum: f32::from_bits(l as u32),
            },
        }
    }

    /// # Safety
    /// `p` holds [`FUSED_PARTIAL_WORDS`] readable words written by `store`.
    #[inline(always)]
    unsafe fn load(p: *const u64) -> Partial {
        // SAFETY: the caller's contract.
        let (key, l, xs) = unsafe { (*p, *p.add(1), *p.add(2)) };
        Partial::from_words(key, l, xs)
    }
}

/// A 16-byte aligned unit of shared memory.
#[repr(C, align(16))]
struct Align16([u8; 16]);

/// A 1024-byte aligned unit of shared memory.
#[cfg(target_feature = "sm_90a")]
#[repr(C, align(1024))]
struct Align1024([u8; 1024]);

/// Tensor-core operand type.
trait Mma {
    /// `mma.sync` m16n8k16 (sm_90a runs [`Mma::wgmma`] instead).
    #[cfg(not(target_feature = "sm_90a"))]
    fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];

    /// `wgmma` m64 x 8NT x k16 (NT 2, 4, 8 or 16) into `d`, laid out as NT
    /// m16n8 accumulator fragments (the layouts agree).
    ///
    /// # Safety
    /// As the `arch::wgmma_m64n*k16_*` functions.
    #[cfg(target_feature = "sm_90a")]
    unsafe fn wgmma<const NT: usize>(d: &mut [[f32; 4]; NT], a: u64, b: u64);
}

/// `arch::operand_fence_*` over the NT (2, 4, 8 or 16) fragments of `d`.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
fn fence_acc<const NT: usize>(d: &mut [[f32; 4]; NT]) {
    let p = d.as_mut_ptr() as *mut f32;
    // SAFETY: `d` is 4 NT contiguous f32 (other NT never reach here, as
    // in Mma::wgmma).
    unsafe {
        if NT == 16 {
            arch::operand_fence_64(&mut *(p as *mut [f32; 64]))
        } else if NT == 8 {
            arch::operand_fence_32(&mut *(p as *mut [f32; 32]))
        } else if NT == 4 {
            arch::operand_fence_16(&mut *(p as *mut [f32; 16]))
        } else if NT == 2 {
            arch::operand_fence_8(&mut *(p as *mut [f32; 8]))
        }
    }
}

/// [`fence_acc`] over the step's `MT` tiles' accumulators.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
fn fence_step_acc<const NT: usize, const MT: usize>(acc: &mut [[[f32; 4]; NT]; MT]) {
    fence_acc(&mut acc[0]);
    if MT > 1 {
        fence_acc(&mut acc[1 % MT]);
    }
}
struct Bf16;
struct F16;

macro_rules! mma_impl {
    ($ty:ident, $mma:ident, $wg16:ident, $wg32:ident, $wg64:ident, $wg128:ident) => {
        impl Mma for $ty {
            #[cfg(not(target_feature = "sm_90a"))]
            #[inline(always)]
            fn mma(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
                arch::$mma(a, b, c)
            }

            #[cfg(target_feature = "sm_90a")]
            #[inline(always)]
            unsafe fn wgmma<const NT: usize>(d: &mut [[f32; 4]; NT], a: u64, b: u64) {
                let p = d.as_mut_ptr() as *mut f32;
                // SAFETY: `d` is 4 NT contiguous f32; the caller's
                // contract for the rest. (Other NT never reach here:
                // the kernels assert NT is 2, 4, 8 or 16.)
                unsafe {
                    if NT == 16 {
                        arch::$wg128(&mut *(p as *mut [f32; 64]), a, b)
                    } else if NT == 8 {
                        arch::$wg64(&mut *(p as *mut [f32; 32]), a, b)
                    } else if NT == 4 {
                        arch::$wg32(&mut *(p as *mut [f32; 16]), a, b)
                    } else if NT == 2 {
                        arch::$wg16(&mut *(p as *mut [f32; 8]), a, b)
                    }
                }
            }
        }
    };
}
mma_impl!(
    Bf16,
    mma_m16n8k16_bf16,
    wgmma_m64n16k16_bf16,
    wgmma_m64n32k16_bf16,
    wgmma_m64n64k16_bf16,
    wgmma_m64n128k16_bf16
);
mma_impl!(
    F16,
    mma_m16n8k16_f16,
    wgmma_m64n16k16_f16,
    wgmma_m64n32k16_f16,
    wgmma_m64n64k16_f16,
    wgmma_m64n128k16_f16
);

/// Rows one pass of a block of `threads` covers with its copies: each
/// thread copies one 16-byte chunk of a row, [`CHUNKS`] threads per row.
const fn pass_rows(threads: u32) -> u32 {
    threads / CHUNKS
}

/// A thread's `cp.async` copies of one staged tile (the LM-head rows of a
/// vocabulary tile, or the hidden-state rows of the batch tile): chunk
/// column `tid % CHUNKS` of tile rows `r0, r0 + P, ..` (`N` of them,
/// `P = pass_rows(T)` for a block of `T` threads), `r0 = tid / CHUNKS`. Addresses and row bounds are formed once
/// (per tile for the LM head, per launch for the hidden states), so a
/// k-block's copy costs an add, a compare and the `cp.async`; formed per
/// copy (an index division, bounds tests, 64-bit address products) they
/// took about 23 instructions each, 140 issue slots per thread and stage.
#[derive(Clone, Copy)]
struct RowCopies<const N: u32, const T: u32> {
    /// Shared byte offset, inside a stage, of copy 0's chunk.
    dst: u32,
    /// Global address of the tile's row 0, column 0 (block-uniform; formed
    /// with wrapping arithmetic: row 0 may lie outside the source).
    base: *const u16,
    /// Elements from `base` to copy 0's chunk at k = 0.
    off: u32,
    /// Elements between the rows of consecutive copies.
    step: u32,
    /// Bit `i`: copy `i`'s row lies in the tile (else it is not issued).
    present: u32,
    /// Bit `i`: copy `i`'s row lies in the source (else it zero-fills).
    inside: u32,
    /// The chunk's first column inside a k-block.
    col: u32,
}

impl<const N: u32, const T: u32> RowCopies<N, T> {
    /// The copies of tile rows `0 .. rows` (global rows `first ..`) into
    /// the stage region at byte offset `region`, where `src` holds rows
    /// `lo .. lo + count` `stride` elements apart. Offsets inside a step
    /// are 32-bit (a step spans at most 256 rows of a stride of at most
    /// 2^23 elements); the step's base is the same for the whole block, so
    /// each thread keeps one 32-bit offset instead of 64-bit addresses.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn new(
        region: u32,
        src: *const u16,
        rows: u32,
        first: u32,
        lo: u32,
        count: u32,
        stride: u32,
    ) -> Self {
        let tid = arch::thread_idx_x();
        // `% pass` tells the compiler r0 < pass (the block has T
        // threads), so full tiles fold `present` away.
        let pass = pass_rows(T);
        let (r0, c) = ((tid / CHUNKS) % pass, tid % CHUNKS);
        let (mut present, mut inside) = (0, 0);
        let mut i = 0;
        while i < N {
            let r = r0 + i * pass;
            if r < rows {
                present |= 1 << i;
                if (first + r).wrapping_sub(lo) < count {
                    inside |= 1 << i;
                }
            }
            i += 1;
        }
        let row0 = src.wrapping_sub(lo as usize * stride as usize);
        RowCopies {
            dst: region + swz(r0, c),
            base: row0.wrapping_add(first as usize * stride as usize),
            off: r0 * stride + c * 8,
            step: pass * stride,
            present,
            inside,
            col: c * 8,
        }
    }

    /// Issues the copies of k-block columns `k0 .. k0 + FUSED_BLOCK_K`
    /// into the stage at shared address `stage`; columns at or past `dim`
    /// and rows outside the source zero-fill, reading from `fallback`
    /// nothing.
    ///
    /// # Safety
    /// The source of [`RowCopies::new`] holds its rows with `dim` readable
    /// (16-byte aligned, `dim` a multiple of 8); `fallback` is readable;
    /// the stage region has room for the tile.
    #[inline(always)]
    unsafe fn issue(&self, stage: u32, k0: u32, dim: u32, fallback: *const u16) {
        let k_ok = k0 + self.col < dim;
        let mut i = 0;
        while i < N {
            if (self.present >> i) & 1 != 0 {
                let ok = k_ok && (self.inside >> i) & 1 != 0;
                let from = if ok {
                    self.base
                        .wrapping_add((self.off + i * self.step + k0) as usize)
                } else {
                    fallback
                };
                // SAFETY: in bounds when `ok` (the row lies in the source,
                // k0 + col + 8 <= dim); otherwise 0 bytes are read.
                unsafe {
                    arch::cp_async_cg_16(
                        stage + self.dst + i * pass_rows(T) * ROW_BYTES,
                        from as *const u8,
                        if ok { 16 } else { 0 },
                    )
                };
            }
            i += 1;
        }
    }
}

/// What a step's copies need besides its LM-head copies (`WC` a thread):
/// the pipeline's shape and the batch tile's hidden-state copies (`HC` a
/// thread).
#[derive(Clone, Copy)]
struct Pipeline<const WC: u32, const HC: u32, const T: u32> {
    /// Shared address of stage 0.
    smem0: u32,
    stages: u32,
    stage_bytes: u32,
    /// k-blocks of a tile.
    nk: u32,
    dim: u32,
    h: RowCopies<HC, T>,
    weight: *const u16,
    hidden: *const u16,
}

impl<const WC: u32, const HC: u32, const T: u32> Pipeline<WC, HC, T> {
    /// Issues k-block `kb` of the tile of LM-head copies `w` (and of the
    /// hidden states) into the stage at shared address `stage`.
    ///
    /// # Safety
    /// As [`RowCopies::issue`], for `weight` and `hidden`.
    #[inline(always)]
    unsafe fn load(&self, w: &RowCopies<WC, T>, stage: u32, kb: u32) {
        let k0 = kb * FUSED_BLOCK_K;
        // SAFETY: forwarded.
        unsafe {
            w.issue(stage, k0, self.dim, self.weight);
            self.h.issue(stage, k0, self.dim, self.hidden);
        }
    }

    /// Issues a tile's first `stages - 1` k-blocks into stages
    /// `0 .. stages - 1`, one commit group each (empty past `nk`).
    ///
    /// # Safety
    /// As [`Pipeline::load`].
    #[inline(always)]
    unsafe fn prologue(&self, w: &RowCopies<WC, T>) {
        let mut s = 0;
        while s < self.stages - 1 {
            if s < self.nk {
                // SAFETY: forwarded.
                unsafe { self.load(w, self.smem0 + s * self.stage_bytes, s) };
            }
            arch::cp_async_commit_group();
            s += 1;
        }
    }
}

/// `$body` with `$i` bound to each constant `0 .. $n` in turn (`$n <= 8`,
/// known after monomorphisation, so the untaken copies fold away).
macro_rules! unroll8 {
    ($n:expr, $i:ident => $body:block) => {
        unroll8!(@each $n, $i, $body, 0 1 2 3 4 5 6 7)
    };
    (@each $n:expr, $i:ident, $body:block, $($k:literal)*) => {{
        const { assert!($n <= 8) };
        $(if $k < $n {
            let $i: usize = $k;
            $body
        })*
    }};
}

/// The warp's place in a block of `T` threads: its 16 vocabulary rows of
/// every tile (`warp % 8`) and its `8 * NT` batch rows (from
/// `8 * NT * (warp / 8)`).
#[inline(always)]
fn warp_place<const NT: usize, const T: u32>() -> (u32, u32) {
    let warp = arch::thread_idx_x() / 32;
    if T == 256 {
        (warp, 0)
    } else {
        (warp % 8, 8 * NT as u32 * (warp / 8))
    }
}

/// One k-block of the warp's 16 x 8NT logits in each of the step's `MT`
/// tiles: four k16 steps, an A fragment of 16 vocabulary rows per tile and
/// `NT / 2` B fragments of 16 batch rows, each used by every tile (on
/// sm_90a, [`wgmma_stage`] instead).
///
/// # Safety
/// `stage` holds a complete k-block; every lane of the warp calls it; on
/// sm_90a as [`wgmma_stage`].
#[inline(always)]
unsafe fn mma_stage<M: Mma, const NT: usize, const MT: usize, const T: u32>(
    stage: u32,
    acc: &mut [[[f32; 4]; NT]; MT],
) {
    // sm_90a: every tile size on the warpgroup path, so that a logit's
    // bits do not depend on the batch tile.
    #[cfg(target_feature = "sm_90a")]
    {
        let (warp, wb) = warp_place::<NT, T>();
        // SAFETY: forwarded.
        unsafe { wgmma_stage::<M, NT, MT>(stage, acc, warp, wb) };
    }
    #[cfg(not(target_feature = "sm_90a"))]
    {
        let lane = arch::thread_idx_x() % 32;
        let (warp, wb) = warp_place::<NT, T>();
        let hs = stage + (MT as u32 * FUSED_BLOCK_V + wb) * ROW_BYTES;
        let mut kk = 0;
        while kk < FUSED_BLOCK_K / 16 {
            let (r, c) = a_row(warp, lane, kk);
            // SAFETY: rows < MT * FUSED_BLOCK_V and chunks < CHUNKS of this
            // stage (the row's swizzle depends on r % 8 only).
            let a: [[u32; 4]; MT] = core::array::from_fn(|m| unsafe {
                arch::ldmatrix_x4(stage + swz(r + m as u32 * FUSED_BLOCK_V, c))
            });
            // Unrolled by hand: at 128 batch rows LLVM kept this loop over
            // eight pairs, and the accumulators it indexes went to local memory.
            unroll8!(NT / 2, pair => {
                let (n, c) = b_row(lane, pair as u32, kk);
                // SAFETY: wb + n < NB rows and chunk < CHUNKS of this stage
                // (wb is a multiple of 8: the swizzle is that of row n).
                let b = unsafe { arch::ldmatrix_x4(hs + swz(n, c)) };
                for (am, acc) in a.iter().zip(acc.iter_mut()) {
                    let (i, j) = ((2 * pair) % NT, (2 * pair + 1) % NT);
                    acc[i] = M::mma(*am, [b[0], b[1]], acc[i]);
                    acc[j] = M::mma(*am, [b[2], b[3]], acc[j]);
                }
            });
            kk += 1;
        }
    }
}

/// [`mma_stage`] on sm_90a: each warpgroup (four consecutive warps, the
/// same place in every tile of the step) issues one `wgmma.m64n(8NT)k16`
/// per tile and k16 step: its 64 vocabulary rows (`warp / 4` of the warp's
/// place `warp` in the tile, see [`warp_place`]) against its `8 * NT` batch
/// rows from `wb`, both operands read
/// from the stage through 128-byte-swizzle descriptors (the stages' own
/// layout), then waits for them. The accumulators come out in the warps'
/// `mma.sync` layout, so staging and epilogue are shared.
///
/// # Safety
/// As [`mma_stage`]; the stage is 1024-byte aligned and its copies were
/// made visible to the async proxy (`fence.proxy.async`) before the
/// block's barrier.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
unsafe fn wgmma_stage<M: Mma, const NT: usize, const MT: usize>(
    stage: u32,
    acc: &mut [[[f32; 4]; NT]; MT],
    warp: u32,
    wb: u32,
) {
    let a0 = stage + (warp / 4) * 64 * ROW_BYTES;
    let b0 = stage + (MT as u32 * FUSED_BLOCK_V + wb) * ROW_BYTES;
    arch::wgmma_fence();
    fence_step_acc(acc);
    // Unrolled by hand, as in mma_stage (as a loop, the accumulators went
    // to local memory).
    let (a, b) = (
        arch::wgmma_desc_k_major_sw128(a0),
        arch::wgmma_desc_k_major_sw128(b0),
    );
    unroll8!(FUSED_BLOCK_K as usize / 16, kk => {
        // A k16 step is 32 bytes into every 128-byte row.
        let k = 32 * kk as u32;
        let bk = arch::wgmma_desc_offset(b, k);
        // SAFETY: the caller's contract; both warpgroup-uniform.
        unsafe {
            M::wgmma(&mut acc[0], arch::wgmma_desc_offset(a, k), bk);
            if MT > 1 {
                M::wgmma(
                    &mut acc[1 % MT],
                    arch::wgmma_desc_offset(a, FUSED_BLOCK_V * ROW_BYTES + k),
                    bk,
                );
            }
        }
    });
    arch::wgmma_commit_wait::<0>();
}

/// After the main loop on sm_90a: every `wgmma` complete and the
/// accumulators fenced, so that the staging reads their final values.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
fn wgmma_drain<const NT: usize, const MT: usize>(acc: &mut [[[f32; 4]; NT]; MT]) {
    arch::wgmma_wait_all();
    fence_step_acc(acc);
}

/// Word of the staging tile holding batch row `b`, token `v` of a
/// vocabulary tile: rows of [`FUSED_CS_STRIDE`] words (padded against bank
/// conflicts), or with `SW` rows of [`FUSED_BLOCK_V`] words whose 16-byte
/// chunks are XOR-swizzled by `b % 8` (the same conflict-free accesses,
/// 3 % less shared memory: the 64-row warp-specialised kernel stages both
/// tiles beside its ring). Four consecutive tokens from a multiple of 4
/// stay consecutive.
#[inline(always)]
const fn cs_at<const SW: bool>(b: u32, v: u32) -> u32 {
    if SW {
        b * FUSED_BLOCK_V + (v ^ ((b & 7) << 2))
    } else {
        b * FUSED_CS_STRIDE + v
    }
}

/// Stages one vocabulary tile's logits of the calling warp (`warp`: its
/// place in the tile, `warp_place`; `tile_acc`: its 16 rows of the tile by
/// its `8 NT` batch rows, which land on staging rows `wr ..`) into the staging tile `cs` transposed, `cs[b][v]`, plus the
/// bias of the tile whose first token is `vt`.
///
/// # Safety
/// `cs` holds rows `wr .. wr + 8 NT` of [`FUSED_CS_STRIDE`] words; `bias_g`
/// is the kernel's bias indexed by global token (read only inside the
/// shard, and only when `p.has_bias`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stage_tile<const NT: usize, const SW: bool>(
    warp: u32,
    lane: u32,
    tile_acc: &[[f32; 4]; NT],
    cs: *mut f32,
    wr: u32,
    vt: u32,
    lo: u32,
    bias_g: *const f32,
    p: &FusedParams,
) {
    // A lane's logits lie on two vocabulary rows (c_pos: i / 2 picks one),
    // so it reads two bias values.
    let bias_v: [f32; 2] = core::array::from_fn(|h| {
        let (v, _) = c_pos(warp, lane, 0, 2 * h as u32);
        if p.has_bias != 0 && (vt + v).wrapping_sub(lo) < p.vocab {
            // SAFETY: the token lies in the shard (the caller's contract).
            unsafe { *bias_g.wrapping_add((vt + v) as usize) }
        } else {
            0.0
        }
    });
    // Unrolled (a constant pair index), so that the accumulators stay in
    // registers (as loops, ptxas put them in local memory).
    unroll8!(NT / 2, pair => {
        let mut h = 0;
        while h < 2 {
            let nt = 2 * pair + h;
            for (i, &x) in tile_acc[nt % NT].iter().enumerate() {
                let (v, b) = c_pos(warp, lane, nt as u32, i as u32);
                // SAFETY: row wr + b < wr + 8 NT, column v < FUSED_BLOCK_V.
                unsafe { *cs.add(cs_at::<SW>(wr + b, v) as usize) = x + bias_v[i / 2] };
            }
            h += 1;
        }
    });
}

/// A thread's epilogue role: batch row `eb` of the tile, token slot `slot`
/// of every vocabulary tile, the row's race and log-sum-exp scale, and the
/// role's word of shared memory that carries the race's filter from one
/// step to the next.
struct Role {
    active: bool,
    eb: u32,
    slot: u32,
    row: u32,
    has_row: bool,
    race: Race,
    lse_scale: f32,
    filter: *mut f32,
}

impl Role {
    /// Role `e` of the thread of index `at` among `threads` (the block's,
    /// or a group's), for a batch tile of `nb` rows from row `b0`:
    /// `(eb, slot) = (at / SLOTS + e * threads / SLOTS, at % SLOTS)`, its
    /// race's filter raised to what the role's word `filters[at + e *
    /// threads]` carries (see [`init_filters`] and [`epilogue`]).
    ///
    /// # Safety
    /// `temperature`, `seed` and `offset` hold `batch` values; `filters`
    /// holds the block's [`init_filters`] words.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn new(
        at: u32,
        e: u32,
        threads: u32,
        nb: u32,
        b0: u32,
        batch: u32,
        temperature: *const f32,
        seed: *const u64,
        offset: *const u64,
        filters: *mut f32,
    ) -> Role {
        let eb = at / SLOTS + e * (threads / SLOTS);
        let active = eb < nb;
        let row = b0 + eb;
        let has_row = active && row < batch;
        // SAFETY: row < batch.
        let (t, s, o) = if has_row {
            unsafe {
                (
                    *temperature.add(row as usize),
                    *seed.add(row as usize),
                    *offset.add(row as usize),
                )
            }
        } else {
            (0.0, 0, 0)
        };
        let mut race = Race::new(t, s, o);
        let lse_scale = if race.is_greedy() { LOG2E } else { LOG2E / t };
        // SAFETY: the role's own word (the caller's contract).
        let filter = unsafe { filters.add((at + e * threads) as usize) };
        // SAFETY: as above; written by this thread only.
        race.raise(unsafe { *filter });
        Role {
            active,
            eb,
            slot: at % SLOTS,
            row,
            has_row,
            race,
            lse_scale,
            filter,
        }
    }
}

/// Sets the role words of the thread of index `at` among `threads` (the
/// block's, or a group's) in the filter array `filters` (one f32 a role,
/// `roles` of them a thread, `threads` apart) to -inf: no filter before the
/// block's first tile of each row. Each word is only ever read and written
/// by its own thread, so no barrier orders them.
///
/// # Safety
/// `filters` holds `roles * threads` words.
#[inline(always)]
unsafe fn init_filters(filters: *mut f32, at: u32, roles: u32, threads: u32) {
    let mut e = 0;
    while e < roles {
        // SAFETY: the caller's contract.
        unsafe { *filters.add((at + e * threads) as usize) = f32::NEG_INFINITY };
        e += 1;
    }
}

/// The fused sampler for a batch tile of `NB` rows in a block of `T`
/// threads (`T / 256` groups of eight warps, each group `8 * NT` of the
/// rows), `MT` vocabulary tiles a step, `WC` / `HC` copies a thread of the
/// step's LM-head rows / the batch tile's hidden states, `ER` epilogue
/// roles a thread (`NB * SLOTS / T`, at least 1).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn fused_sample<
    M: Mma,
    const NB: u32,
    const NT: usize,
    const MT: usize,
    const WC: u32,
    const HC: u32,
    const ER: usize,
    const T: u32,
>(
    hidden: *const u16,
    weight: *const u16,
    bias: *const f32,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    partial: *mut u64,
    peer_partial: *const *mut u64,
    p: FusedParams,
) {
    const { assert!(T == fused_threads(NB) && NT as u32 * 8 * (T / 256) == NB) };
    const { assert!(MT as u32 == fused_mtiles(NB)) };
    const { assert!(WC * pass_rows(T) == MT as u32 * FUSED_BLOCK_V && NB <= HC * pass_rows(T)) };
    const { assert!(MT <= 2 && ER <= 2 && ER as u32 * T >= NB * SLOTS) };
    // The warpgroup path (sm_90a) has m64n16 / m64n32 / m64n64.
    const { assert!(NT == 2 || NT == 4 || NT == 8) };
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let (warp, wb) = warp_place::<NT, T>();
    let b0 = arch::block_idx_x() * NB;
    // 16-byte alignment for cp.async and ldmatrix (the dynamic shared
    // memory symbol takes the largest alignment any kernel asks for).
    let raw = arch::dynamic_shared::<Align16>() as *mut u8;
    // The stages 1024-byte aligned, as the 128-byte swizzle of `wgmma`'s
    // descriptors needs (the launch adds 1024 bytes).
    let skip = arch::smem_addr(raw).wrapping_neg() % 1024;
    // SAFETY: inside the dynamic shared memory (fused_smem_bytes).
    let smem = unsafe { raw.add(skip as usize) };
    let smem0 = arch::smem_addr(smem);
    let stage_bytes = fused_stage_bytes(NB);
    let stages = fused_stages(NB);
    let overlap = NB <= 32;
    // SAFETY: the staging tile lies inside the dynamic shared memory the
    // launch provides (fused_smem_bytes).
    let cs = unsafe { smem.add(fused_staging_offset(NB) as usize) } as *mut f32;
    let nk = p.dim.div_ceil(FUSED_BLOCK_K);
    // SAFETY: the filter words follow the stages and staging
    // (fused_smem_bytes); ER * T <= 512 of them.
    let filters = unsafe { smem.add(fused_filter_offset(NB) as usize) } as *mut f32;
    const { assert!(ER as u32 * T * 4 <= FUSED_FILTER_BYTES) };
    // SAFETY: as above.
    unsafe { init_filters(filters, tid, ER as u32, T) };

    // The shard's tokens `[lo, lo + vocab)`, on the full vocabulary's tile
    // grid; the bias indexed by global token (read only inside the shard):
    // the unsharded kernel's address math, where indexing it relative to
    // the shard took ptxas from 127 to 168 registers at B = 64.
    let lo = p.vocab_offset;
    let bias_g = bias.wrapping_sub(lo as usize);
    let first_tile = lo / FUSED_BLOCK_V;
    let step_rows = MT as u32 * FUSED_BLOCK_V;
    let steps = p.tiles.div_ceil(MT as u32);
    // The batch tile's hidden-state rows, the same for every step.
    let h_copy = RowCopies::<HC, T>::new(
        step_rows * ROW_BYTES,
        hidden,
        NB,
        b0,
        0,
        p.batch,
        // At most FUSED_MAX_STRIDE (the host checks).
        p.hidden_stride as u32,
    );
    let pipe = Pipeline {
        smem0,
        stages,
        stage_bytes,
        nk,
        dim: p.dim,
        h: h_copy,
        weight,
        hidden,
    };
    let mut step = arch::block_idx_y();
    while step < steps {
        // The step's first tile and the global index of its first token.
        let tile0 = step * MT as u32;
        let v0 = (first_tile + tile0) * FUSED_BLOCK_V;
        let w_copy = RowCopies::<WC, T>::new(0, weight, step_rows, v0, lo, p.vocab, p.dim);
        let mut acc = [[[0.0f32; 4]; NT]; MT];
        // SAFETY: stages lie inside the dynamic shared memory; the launch
        // contract covers the global reads.
        unsafe {
            // The step's first k-blocks, one commit group each (issued
            // during the previous step's epilogue where `overlap`).
            if !overlap || step == arch::block_idx_y() {
                pipe.prologue(&w_copy);
            }
            let mut kb = 0;
            while kb < nk {
                // All but the newest `stages - 2` groups
                // complete: k-block `kb` has landed (constants, so this
                // folds to one instruction).
                match stages {
                    5 => arch::cp_async_wait_group::<3>(),
                    4 => arch::cp_async_wait_group::<2>(),
                    3 => arch::cp_async_wait_group::<1>(),
                    _ => arch::cp_async_wait_group::<0>(),
                }
                // wgmma reads the stage through the async proxy.
                #[cfg(target_feature = "sm_90a")]
                arch::fence_proxy_async_shared();
                arch::bar_sync();
                mma_stage::<M, NT, MT, T>(smem0 + (kb % stages) * stage_bytes, &mut acc);
                // Into the stage of k-block kb - 1, whose
                // readers every thread has waited for before the barrier.
                let next = kb + stages - 1;
                if next < nk {
                    pipe.load(&w_copy, smem0 + (next % stages) * stage_bytes, next);
                }
                arch::cp_async_commit_group();
                kb += 1;
            }
            arch::cp_async_wait_group::<0>();
            #[cfg(target_feature = "sm_90a")]
            wgmma_drain(&mut acc);

            // The step's second tile, unless the step is past the shard's
            // last tile (its rows zero-filled; it has no part).
            let second = MT > 1 && tile0 + 1 < p.tiles;
            // Two tiles a step stage the second tile's logits in the
            // pipeline's stages, idle until the next step: all their
            // accumulators leave registers before the epilogue (kept
            // across it, the second tile's spilled at 128 rows). First every
            // warp is past its last read of the stages.
            let cs1 = cs.add((NB * FUSED_CS_STRIDE) as usize);
            if MT > 1 {
                arch::bar_sync();
            }
            // Stage each tile's logits transposed, cs[b][v] (+ bias).
            stage_tile::<NT, false>(warp, lane, &acc[0], cs, wb, v0, lo, bias_g, &p);
            if second {
                stage_tile::<NT, false>(
                    warp,
                    lane,
                    &acc[1 % MT],
                    cs1,
                    wb,
                    v0 + FUSED_BLOCK_V,
                    lo,
                    bias_g,
                    &p,
                );
            }
            arch::bar_sync();

            // Every warp is past its last read of the stages: the next
            // step's first k-blocks stream in during this epilogue instead
            // of after it. (Only for one tile a step of up to 32 batch
            // rows, which stream more than they compute: at 64 rows the
            // copies' registers, kept across the epilogue, spilled.)
            let next = step + arch::grid_dim_y();
            if overlap && next < steps {
                let v_next = (first_tile + next * MT as u32) * FUSED_BLOCK_V;
                let w_next =
                    RowCopies::<WC, T>::new(0, weight, step_rows, v_next, lo, p.vocab, p.dim);
                pipe.prologue(&w_next);
            }

            // Every role races and sums each staged tile (the role index a
            // constant, so that the races stay in registers). The roles are
            // formed here, their rows' parameters read again each step:
            // kept across the main loop, two roles' races spilled at 128
            // rows.
            // SAFETY: the launch contract covers the parameter reads.
            let mut roles: [Role; ER] = core::array::from_fn(|e| {
                Role::new(
                    tid,
                    e as u32,
                    T,
                    NB,
                    b0,
                    p.batch,
                    temperature,
                    seed,
                    offset,
                    filters,
                )
            });
            let mut m = 0;
            while m < 2 {
                if m == 0 || second {
                    let (tile, vt) = (tile0 + m, v0 + m * FUSED_BLOCK_V);
                    let src = if m == 0 { cs } else { cs1 };
                    epilogue::<false>(&mut roles[0], src, vt, tile, lo, partial, peer_partial, &p);
                    if ER > 1 {
                        epilogue::<false>(
                            &mut roles[1 % ER],
                            src,
                            vt,
                            tile,
                            lo,
                            partial,
                            peer_partial,
                            &p,
                        );
                    }
                }
                m += 1;
            }
            if MT > 1 {
                // The next step's copies overwrite the second tile's logits.
                arch::bar_sync();
            }
        }
        step += arch::grid_dim_y();
    }
}

/// The producer of the warp-specialised fused samplers (sm_90a): one thread
/// walks the consumers' sequence of uses of the ring (the block's steps
/// `y, y + ctas, ..` in order, every k-block of each) and loads each use
/// with the bulk tensor copy engine: a k-block of the step's `MT` tiles of
/// LM-head rows, then of the batch tile's hidden-state rows (elements
/// outside either tensor zero-filled; L2 policies evict-first for the LM
/// head and evict-last for the hidden states), once the stage's previous
/// use has been released.
///
/// # Safety
/// `hmap` and `wmap` as in [`fused_sample_ws`]; the barriers are
/// initialised; `full(s)` and `empty(s)` are the stages' barriers.
#[cfg(target_feature = "sm_90a")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn ws_produce<const MT: u32>(
    hmap: u64,
    wmap: u64,
    smem0: u32,
    stage_bytes: u32,
    bars: u32,
    nk: u32,
    b0: u32,
    p: &FusedParams,
) {
    let stages = FUSED_WS_STAGES;
    let (full, empty) = (|s: u32| bars + 8 * s, |s: u32| bars + 8 * (stages + s));
    let lo = p.vocab_offset;
    let first_tile = lo / FUSED_BLOCK_V;
    let steps = p.tiles.div_ceil(MT);
    // The LM head streams through L2 (read by each batch tile's block at
    // about the same time), the hidden states are read by every block of
    // the batch tile, every step: the LM head's lines go first, the hidden
    // states' last (session 31: 1 to 2 % faster at B = 64, the same at
    // B = 128 and 256).
    let (w_policy, h_policy) = (arch::l2_evict_first(), arch::l2_evict_last());
    let mut use_ = 0u32;
    let mut step = arch::block_idx_y();
    while step < steps {
        // The step's first LM-head row, relative to the shard's first
        // (negative for a boundary tile starting before it).
        let row = ((first_tile + step * MT) * FUSED_BLOCK_V).wrapping_sub(lo) as i32;
        let mut kb = 0;
        while kb < nk {
            let s = use_ % stages;
            let stage = smem0 + s * stage_bytes;
            let k = (kb * FUSED_BLOCK_K) as i32;
            // SAFETY: the stage lies in the ring; the maps describe the
            // launch's tensors (the caller's contract).
            unsafe {
                // Free once every consumer warp released its previous use
                // (the first use passes at once).
                arch::mbarrier_wait_parity(empty(s), (use_ / stages + 1) & 1);
                arch::mbarrier_arrive_expect_tx(full(s), stage_bytes);
                arch::cp_async_bulk_tensor_2d(stage, wmap, k, row, full(s), w_policy);
                arch::cp_async_bulk_tensor_2d(
                    stage + MT * FUSED_BLOCK_V * ROW_BYTES,
                    hmap,
                    k,
                    b0 as i32,
                    full(s),
                    h_policy,
                );
            }
            use_ += 1;
            kb += 1;
        }
        step += arch::grid_dim_y();
    }
}

/// Initialises the warp-specialised kernels' barriers (thread 0: a full
/// barrier of one arrival and an empty one of `consumer_warps` a stage)
/// and waits for the block.
///
/// # Safety
/// Every thread of the block calls it once, first; `bars` is the barrier
/// region ([`fused_ws_barrier_offset`]).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
unsafe fn ws_init_barriers(bars: u32, consumer_warps: u32) {
    let stages = FUSED_WS_STAGES;
    if arch::thread_idx_x() == 0 {
        let mut s = 0;
        while s < stages {
            // SAFETY: 8-byte aligned barriers inside the dynamic shared
            // memory, initialised before any use (the barrier below).
            unsafe {
                arch::mbarrier_init(bars + 8 * s, 1);
                arch::mbarrier_init(bars + 8 * (stages + s), consumer_warps);
            }
            s += 1;
        }
        arch::fence_mbarrier_init();
    }
    arch::bar_sync();
}

/// The warp-specialised fused sampler (sm_90a) for a batch tile of 64 rows
/// (two vocabulary tiles a step, `NT = NB / 16` n-tiles a warp). Warps
/// 0-15 are the consumers of the two-tiles-a-step layout of
/// [`fused_sample`] (the same `wgmma` in the same order, the same staging
/// and epilogue, so the same logits and partials, bit for bit); warps 16-19
/// are the producer warpgroup, which gives its registers to the consumers
/// and one thread of which loads every k-block of every step
/// ([`ws_produce`]) into a ring of [`FUSED_WS_STAGES`] stages. Each stage
/// has a full barrier (the producer's arrival and the copies' bytes) and an
/// empty one (one arrival a consumer warp once its `wgmma` reading the
/// stage have completed: the consumers wait for each k-block's before the
/// next, so three stages of the LM head stay in flight).
///
/// The epilogue stages both tiles at once beside the ring (rows of 128
/// words, 16-byte chunks XOR-swizzled, [`cs_at`]; the dynamic shared
/// memory is 1024-byte aligned, so no slack), so the producer loads the
/// next step during the epilogue, which runs one role a thread (tile 0 on
/// threads 0-255, tile 1 on 256-511).
///
/// # Safety
/// As [`fused_sample`], with the hidden states and LM head read through
/// `hmap` and `wmap`: the generic addresses of 2D tensor maps (128-byte
/// swizzle) of the hidden states (`batch` rows of `dim`, `hidden_stride`
/// apart, boxes of 64 columns by `NB` rows) and of the launch's LM head
/// (`vocab` rows of `dim`, boxes of 64 columns by
/// [`fused_ws_step_tiles`]`(NB) * FUSED_BLOCK_V` rows).
#[cfg(target_feature = "sm_90a")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn fused_sample_ws<M: Mma, const NB: u32, const NT: usize>(
    hmap: u64,
    wmap: u64,
    bias: *const f32,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    partial: *mut u64,
    peer_partial: *const *mut u64,
    p: FusedParams,
) {
    const MT: usize = 2;
    const T: u32 = FUSED_WS_CONSUMERS;
    const { assert!(fused_ws(NB) && fused_ws_step_tiles(NB) == MT as u32 && NT as u32 * 16 == NB) };
    const { assert!(fused_ws_stage_bytes(NB) == (MT as u32 * FUSED_BLOCK_V + NB) * ROW_BYTES) };
    const { assert!(NB * SLOTS * MT as u32 == T) };
    let tid = arch::thread_idx_x();
    // The stages 1024-byte aligned (the 128-byte swizzle): asking for that
    // alignment makes the module's dynamic shared memory symbol `.align
    // 1024`, so no slack is needed.
    let smem = arch::dynamic_shared::<Align1024>() as *mut u8;
    let smem0 = arch::smem_addr(smem);
    let stage_bytes = fused_ws_stage_bytes(NB);
    let stages = FUSED_WS_STAGES;
    // SAFETY: the staging tiles lie after the ring (fused_ws_smem_bytes).
    let cs = unsafe { smem.add(fused_ws_staging_offset(NB) as usize) } as *mut f32;
    // Stage s's full barrier at `bars + 8 s`, its empty one at
    // `bars + 8 (stages + s)`, after the ring and the staging.
    let bars = smem0 + fused_ws_barrier_offset(NB);
    // SAFETY: the filter words follow the barriers (fused_ws_smem_bytes).
    let filters = unsafe { smem.add(fused_ws_filter_offset(NB) as usize) } as *mut f32;
    let (full, empty) = (|s: u32| bars + 8 * s, |s: u32| bars + 8 * (stages + s));
    // SAFETY: every thread, first.
    unsafe { ws_init_barriers(bars, T / 32) };

    let nk = p.dim.div_ceil(FUSED_BLOCK_K);
    let lo = p.vocab_offset;
    let first_tile = lo / FUSED_BLOCK_V;
    let steps = p.tiles.div_ceil(MT as u32);
    let b0 = arch::block_idx_x() * NB;
    if tid >= T {
        arch::setmaxnreg_dec::<FUSED_WS_PRODUCER_REGS>();
        if tid == T {
            // SAFETY: the caller's contract; the barriers are initialised.
            unsafe {
                ws_produce::<{ MT as u32 }>(hmap, wmap, smem0, stage_bytes, bars, nk, b0, &p)
            };
        }
        return;
    }

    // The consumers.
    arch::setmaxnreg_inc::<FUSED_WS_CONSUMER_REGS>();
    // SAFETY: T words (one role a consumer thread).
    unsafe { init_filters(filters, tid, 1, T) };
    let lane = tid % 32;
    let (warp, wb) = warp_place::<NT, T>();
    let bias_g = bias.wrapping_sub(lo as usize);
    let mut use_ = 0u32;
    let mut step = arch::block_idx_y();
    while step < steps {
        let tile0 = step * MT as u32;
        let v0 = (first_tile + tile0) * FUSED_BLOCK_V;
        let mut acc = [[[0.0f32; 4]; NT]; MT];
        let mut kb = 0;
        while kb < nk {
            let s = use_ % stages;
            // SAFETY: the full barrier's phase for this use completes once
            // the stage's copies have landed (visible to wgmma's async
            // proxy: they were written by it).
            unsafe {
                arch::mbarrier_wait_parity(full(s), (use_ / stages) & 1);
                let (w, b) = warp_place::<NT, T>();
                wgmma_stage::<M, NT, MT>(smem0 + s * stage_bytes, &mut acc, w, b);
            }
            // The k-block's `wgmma` have completed: its stage goes back to
            // the producer.
            if lane == 0 {
                // SAFETY: an initialised barrier.
                unsafe { arch::mbarrier_arrive(empty(s)) };
            }
            use_ += 1;
            kb += 1;
        }
        wgmma_drain(&mut acc);

        // The step's second tile, unless it is past the shard's last tile.
        let second = tile0 + 1 < p.tiles;
        // Both tiles staged at once (swizzled rows, beside the ring), then
        // threads 0-255 race and sum tile 0 and threads 256-511 tile 1 (one
        // role each, its filter word by tile).
        // SAFETY: the warp's rows of both tiles lie in the staging.
        let cs1 = unsafe { cs.add((NB * FUSED_BLOCK_V) as usize) };
        unsafe {
            stage_tile::<NT, true>(warp, lane, &acc[0], cs, wb, v0, lo, bias_g, &p);
            if second {
                stage_tile::<NT, true>(
                    warp,
                    lane,
                    &acc[1],
                    cs1,
                    wb,
                    v0 + FUSED_BLOCK_V,
                    lo,
                    bias_g,
                    &p,
                );
            }
        }
        arch::bar_sync_named::<1, T>();
        let (m, t) = (tid / (NB * SLOTS), tid % (NB * SLOTS));
        if m == 0 || second {
            let (tile, vt) = (tile0 + m, v0 + m * FUSED_BLOCK_V);
            let src = if m == 0 { cs } else { cs1 };
            // SAFETY: the launch contract covers the reads; the filter
            // words of tile m's roles.
            let mut role = unsafe {
                Role::new(
                    t,
                    0,
                    NB * SLOTS,
                    NB,
                    b0,
                    p.batch,
                    temperature,
                    seed,
                    offset,
                    filters.add((m * NB * SLOTS) as usize),
                )
            };
            // SAFETY: the role's staged row lies in the tile.
            unsafe { epilogue::<true>(&mut role, src, vt, tile, lo, partial, peer_partial, &p) };
        }
        // The staging is rewritten next step.
        arch::bar_sync_named::<1, T>();
        step += arch::grid_dim_y();
    }
}

/// The warp-specialised fused sampler (sm_90a) for a batch tile of 128
/// rows, one vocabulary tile a step, in two consumer groups of eight warps
/// that take turns (ping-pong): group `g` (warps `8g .. 8g + 7`) runs the
/// block's steps `2 n + g` (`y + (2 n + g) ctas`), each warp its 16
/// vocabulary rows of the tile against all 128 batch rows (each warpgroup
/// one `wgmma.m64n128k16` a k16 step: 64 accumulator registers a thread,
/// laid out as 16 `mma.sync` fragments, so the staging and epilogue of
/// [`fused_sample`] apply). The producer ([`ws_produce`], one tile a step)
/// fills the ring in step order; while one group stages its tile beside the
/// ring and runs the epilogue (two roles a thread), the other's `wgmma`
/// consume the ring, so the LM head streams during every epilogue (the
/// 128-row kernel of two tiles a step staged in the ring itself and
/// stopped the producer for the epilogue). The staging passes from group
/// to group in step order through two named barriers (the releasing group
/// arrives, the next one syncs).
///
/// # Safety
/// As [`fused_sample_ws`].
#[cfg(target_feature = "sm_90a")]
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn fused_sample_pp<M: Mma, const NB: u32>(
    hmap: u64,
    wmap: u64,
    bias: *const f32,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    partial: *mut u64,
    peer_partial: *const *mut u64,
    p: FusedParams,
) {
    const T: u32 = FUSED_WS_CONSUMERS;
    const { assert!(fused_ws(NB) && fused_ws_step_tiles(NB) == 1 && NB == 128) };
    const { assert!(fused_ws_stage_bytes(NB) == (FUSED_BLOCK_V + NB) * ROW_BYTES) };
    let tid = arch::thread_idx_x();
    // As in fused_sample_ws.
    let smem = arch::dynamic_shared::<Align1024>() as *mut u8;
    let smem0 = arch::smem_addr(smem);
    let bars = smem0 + fused_ws_barrier_offset(NB);
    // SAFETY: every thread, first; one consumer group (8 warps) uses a
    // stage.
    unsafe { ws_init_barriers(bars, T / 2 / 32) };
    let nk = p.dim.div_ceil(FUSED_BLOCK_K);
    let b0 = arch::block_idx_x() * NB;
    if tid >= T {
        arch::setmaxnreg_dec::<FUSED_WS_PRODUCER_REGS>();
        if tid == T {
            let stage_bytes = fused_ws_stage_bytes(NB);
            // SAFETY: the caller's contract; the barriers are initialised.
            unsafe { ws_produce::<1>(hmap, wmap, smem0, stage_bytes, bars, nk, b0, &p) };
        }
        return;
    }
    arch::setmaxnreg_inc::<FUSED_WS_CONSUMER_REGS>();
    let a = PpArgs {
        smem,
        bars,
        nk,
        b0,
        bias,
        temperature,
        seed,
        offset,
        partial,
        peer_partial,
    };
    // Group 0 hands the tensor cores over on named barrier 5 and the
    // staging on 3, and takes them back on 6 and 4; group 1 the other way
    // round.
    // SAFETY: forwarded.
    unsafe {
        if tid < T / 2 {
            pp_group::<M, NB, 0, 1, 3, 4, 5, 6>(&a, &p);
        } else {
            pp_group::<M, NB, 1, 2, 4, 3, 6, 5>(&a, &p);
        }
    }
}

/// What a consumer group of [`fused_sample_pp`] needs (the block's shared
/// memory, barriers and the launch's pointers).
#[cfg(target_feature = "sm_90a")]
struct PpArgs {
    smem: *mut u8,
    bars: u32,
    nk: u32,
    b0: u32,
    bias: *const f32,
    temperature: *const f32,
    seed: *const u64,
    offset: *const u64,
    partial: *mut u64,
    peer_partial: *const *mut u64,
}

/// Consumer group `G` of [`fused_sample_pp`], per step of the block: its
/// `wgmma` from the ring, begun once the other group's of the previous
/// step are done (named barrier `MMA_TAKE`; released on `MMA_GIVE`), so
/// that the groups take the ring in step order and no group waits on a
/// stage's full barrier more than one phase ahead of it (a parity wait
/// cannot tell further phases apart); then the staging, taken once the
/// other group's epilogue of the previous step is done with it (`TAKE`;
/// released on `GIVE`), the group's own named barrier `OWN`, and two roles
/// a thread. A group releases only when the other group has a next step.
///
/// # Safety
/// As [`fused_sample_ws`]; every thread of the group calls it.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
unsafe fn pp_group<
    M: Mma,
    const NB: u32,
    const G: u32,
    const OWN: u32,
    const GIVE: u32,
    const TAKE: u32,
    const MMA_GIVE: u32,
    const MMA_TAKE: u32,
>(
    a: &PpArgs,
    p: &FusedParams,
) {
    const NT: usize = 16;
    const GT: u32 = FUSED_WS_CONSUMERS / 2;
    const { assert!(NB == 8 * NT as u32 && NB * SLOTS == 2 * GT) };
    let at = arch::thread_idx_x() - G * GT;
    let (warp, lane) = (at / 32, at % 32);
    let stages = FUSED_WS_STAGES;
    let stage_bytes = fused_ws_stage_bytes(NB);
    let smem0 = arch::smem_addr(a.smem);
    let (full, empty) = (|s: u32| a.bars + 8 * s, |s: u32| a.bars + 8 * (stages + s));
    // SAFETY: the staging and this group's filter words (2 GT of them)
    // lie in the dynamic shared memory (fused_ws_smem_bytes).
    let (cs, filters) = unsafe {
        (
            a.smem.add(fused_ws_staging_offset(NB) as usize) as *mut f32,
            (a.smem.add(fused_ws_filter_offset(NB) as usize) as *mut f32)
                .add((2 * GT * G) as usize),
        )
    };
    // SAFETY: this thread's two role words.
    unsafe { init_filters(filters, at, 2, GT) };
    let lo = p.vocab_offset;
    let first_tile = lo / FUSED_BLOCK_V;
    let bias_g = a.bias.wrapping_sub(lo as usize);
    let ctas = arch::grid_dim_y();
    // The block's step index n (its uses of the ring are n nk .. (n + 1) nk)
    // and the step (tile) it is.
    let mut n = G;
    let mut step = arch::block_idx_y() + G * ctas;
    while step < p.tiles {
        let v0 = (first_tile + step) * FUSED_BLOCK_V;
        // The other group's next step (step n + 1).
        let hands_over = step + ctas < p.tiles;
        if n > 0 {
            arch::bar_sync_named::<MMA_TAKE, { FUSED_WS_CONSUMERS }>();
        }
        let mut acc = [[[0.0f32; 4]; NT]; 1];
        let mut kb = 0;
        while kb < a.nk {
            let u = n * a.nk + kb;
            let s = u % stages;
            // SAFETY: as in fused_sample_ws.
            unsafe {
                arch::mbarrier_wait_parity(full(s), (u / stages) & 1);
                wgmma_stage::<M, NT, 1>(smem0 + s * stage_bytes, &mut acc, warp, 0);
            }
            if lane == 0 {
                // SAFETY: an initialised barrier.
                unsafe { arch::mbarrier_arrive(empty(s)) };
            }
            kb += 1;
        }
        if hands_over {
            arch::bar_arrive_named::<MMA_GIVE, { FUSED_WS_CONSUMERS }>();
        }
        wgmma_drain(&mut acc);
        // The staging, once the other group's epilogue of step n - 1 is
        // done with it.
        if n > 0 {
            arch::bar_sync_named::<TAKE, { FUSED_WS_CONSUMERS }>();
        }
        // SAFETY: rows 0 .. 128 of the staging (rows of FUSED_BLOCK_V words).
        unsafe { stage_tile::<NT, true>(warp, lane, &acc[0], cs, 0, v0, lo, bias_g, p) };
        arch::bar_sync_named::<OWN, GT>();
        let mut e = 0;
        while e < 2 {
            // SAFETY: the launch contract covers the reads; the role's
            // staged row lies in the tile.
            unsafe {
                let mut role = Role::new(
                    at,
                    e,
                    GT,
                    NB,
                    a.b0,
                    p.batch,
                    a.temperature,
                    a.seed,
                    a.offset,
                    filters,
                );
                epilogue::<true>(&mut role, cs, v0, step, lo, a.partial, a.peer_partial, p);
            }
            e += 1;
        }
        // The other group takes the staging for step n + 1.
        if hands_over {
            arch::bar_arrive_named::<GIVE, { FUSED_WS_CONSUMERS }>();
        }
        n += 2;
        step += 2 * ctas;
    }
}

/// One role's share of a tile's epilogue: its row's 32 tokens of slot
/// `slot` from the staged logits `cs`, raced and summed, folded over the
/// row's four slots (consecutive lanes) by a fixed butterfly and stored as
/// the (row, tile) partial. Whole warps are active or idle (`NB * SLOTS` is
/// a multiple of 32), so the shuffles see full warps.
///
/// # Safety
/// `cs` holds the tile's staged logits; `partial` (and every peer buffer)
/// holds the launch's parts.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn epilogue<const SW: bool>(
    role: &mut Role,
    cs: *const f32,
    vt: u32,
    tile: u32,
    lo: u32,
    partial: *mut u64,
    peer_partial: *const *mut u64,
    p: &FusedParams,
) {
    if !role.active {
        return;
    }
    let mut lse = Lse2::EMPTY;
    // SAFETY: the caller's contract covers every access.
    unsafe {
        let j0 = vt + role.slot * SLOT_TOKENS;
        let mut i = 0;
        while i < SLOT_TOKENS {
            let q = *(cs.add(cs_at::<SW>(role.eb, role.slot * SLOT_TOKENS + i) as usize)
                as *const [f32; 4]);
            // Tokens outside the shard (the vocabulary tail, the
            // neighbours' rows of a boundary tile) are absent.
            let j = j0 + i;
            let r = j.wrapping_sub(lo);
            let x = [
                if r < p.vocab { q[0] } else { f32::NEG_INFINITY },
                if r.wrapping_add(1) < p.vocab {
                    q[1]
                } else {
                    f32::NEG_INFINITY
                },
                if r.wrapping_add(2) < p.vocab {
                    q[2]
                } else {
                    f32::NEG_INFINITY
                },
                if r.wrapping_add(3) < p.vocab {
                    q[3]
                } else {
                    f32::NEG_INFINITY
                },
            ];
            for &x in &x {
                if sample::logit_class(x) == 1 {
                    lse.push(x * role.lse_scale);
                }
            }
            role.race.visit4(x, j);
            i += 4;
        }
        let (key, xs) = role.race.take_best();
        let part = Partial { key, xs, lse }.butterfly(SLOTS / 2);
        // The row's best approximate score so far, over its four slots (a
        // token's, so a valid filter for every slot of the row), raises
        // each slot's filter for the row's next tiles, in this step and
        // (through the role's word) the block's next steps: the first
        // tokens of a tile then rarely pass it. Tokens, validity and the
        // log-normaliser do not change; only partials whose tile holds
        // nothing above the row's filter become empty (key 0).
        let mut a = role.race.top_score();
        let mut m = SLOTS / 2;
        while m > 0 {
            let o = f32::from_bits(arch::shfl_bfly_u32(a.to_bits(), m));
            if o > a {
                a = o;
            }
            m >>= 1;
        }
        role.race.raise(a);
        *role.filter = a;
        if role.has_row && role.slot == 0 {
            // Part major: (part, row) at (part * batch + row).
            let at = ((p.part_offset + tile) as usize * p.batch as usize + role.row as usize)
                * FUSED_PARTIAL_WORDS as usize;
            part.store(partial.add(at));
            // Peer-to-peer exchange: the same words into every peer's
            // buffer now, while the other tiles compute.
            let mut i = 0;
            while i < p.peers {
                part.store((*peer_partial.add(i as usize)).add(at));
                i += 1;
            }
        }
    }
}

/// Hidden-state copies a thread issues per stage for a batch tile of
/// `block_b` rows: the passes of the block that cover at least 64 rows
/// (smaller tiles leave copies absent, which fold away; with exactly one
/// copy the 16-row kernel's code came out different).
const fn hidden_copies(block_b: u32) -> u32 {
    let rows = if block_b > 64 { block_b } else { 64 };
    rows.div_ceil(pass_rows(fused_threads(block_b)))
}

/// A `fused_sample` entry point for a batch tile of `$nb` rows, its
/// shape parameters derived from the tile (see [`fused_sample`]).
macro_rules! fused_entry {
    ($name:ident, $mma:ty, $nb:literal) => {
        /// `fused_sample` (see the module docs) for a batch tile of
        #[doc = concat!(stringify!($nb), " rows.")]
        ///
        /// # Safety
        /// See the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            hidden: *const u16,
            weight: *const u16,
            bias: *const f32,
            temperature: *const f32,
            seed: *const u64,
            offset: *const u64,
            partial: *mut u64,
            peer_partial: *const *mut u64,
            p: FusedParams,
        ) {
            // Before any memory access (programmatic launch on sm_90).
            arch::griddepcontrol_wait();
            // SAFETY: forwarded launch contract.
            unsafe {
                fused_sample::<
                    $mma,
                    $nb,
                    { $nb / 8 / (fused_threads($nb) / 256) as usize },
                    { fused_mtiles($nb) as usize },
                    { fused_mtiles($nb) * FUSED_BLOCK_V / pass_rows(fused_threads($nb)) },
                    { hidden_copies($nb) },
                    { (($nb * SLOTS).div_ceil(fused_threads($nb))) as usize },
                    { fused_threads($nb) },
                >(
                    hidden,
                    weight,
                    bias,
                    temperature,
                    seed,
                    offset,
                    partial,
                    peer_partial,
                    p,
                )
            }
        }
    };
}

/// The warp-specialised `fused_sample` entry point (sm_90a) for a batch
/// tile of `$nb` rows, running `$kernel` ([`fused_sample_ws`] at 64 rows,
/// [`fused_sample_pp`] at 128): the hidden states and the
/// LM head come as tensor maps passed by value, which the copy engine reads
/// in parameter space.
#[cfg(target_feature = "sm_90a")]
macro_rules! fused_ws_entry {
    ($name:ident, $kernel:expr, $nb:literal) => {
        /// `fused_sample` (see the module docs), warp-specialised, for a
        #[doc = concat!("batch tile of ", stringify!($nb), " rows.")]
        ///
        /// # Safety
        /// See the module docs and [`fused_sample_ws`].
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            _hidden_map: TensorMap,
            _weight_map: TensorMap,
            bias: *const f32,
            temperature: *const f32,
            seed: *const u64,
            offset: *const u64,
            partial: *mut u64,
            peer_partial: *const *mut u64,
            p: FusedParams,
        ) {
            // Before any memory access (programmatic launch on sm_90).
            arch::griddepcontrol_wait();
            let (h, w): (u64, u64);
            // SAFETY: reads the parameter-space addresses of this entry's
            // first two parameters.
            unsafe {
                core::arch::asm!(
                    concat!("mov.b64 {h}, ", stringify!($name), "_param_0;"),
                    concat!("mov.b64 {w}, ", stringify!($name), "_param_1;"),
                    h = out(reg64) h, w = out(reg64) w, options(pure, nomem, nostack)
                )
            };
            // SAFETY: forwarded launch contract.
            unsafe {
                $kernel(
                    arch::cvta_param(h),
                    arch::cvta_param(w),
                    bias,
                    temperature,
                    seed,
                    offset,
                    partial,
                    peer_partial,
                    p,
                )
            }
        }
    };
}

fused_entry!(fused_sample_bf16_b16, Bf16, 16);
fused_entry!(fused_sample_bf16_b32, Bf16, 32);
#[cfg(not(target_feature = "sm_90a"))]
fused_entry!(fused_sample_bf16_b64, Bf16, 64);
#[cfg(not(target_feature = "sm_90a"))]
fused_entry!(fused_sample_bf16_b128, Bf16, 128);
fused_entry!(fused_sample_f16_b16, F16, 16);
fused_entry!(fused_sample_f16_b32, F16, 32);
#[cfg(not(target_feature = "sm_90a"))]
fused_entry!(fused_sample_f16_b64, F16, 64);
#[cfg(not(target_feature = "sm_90a"))]
fused_entry!(fused_sample_f16_b128, F16, 128);
#[cfg(target_feature = "sm_90a")]
fused_ws_entry!(fused_sample_bf16_b64, fused_sample_ws::<Bf16, 64, 4>, 64);
#[cfg(target_feature = "sm_90a")]
fused_ws_entry!(fused_sample_bf16_b128, fused_sample_pp::<Bf16, 128>, 128);
#[cfg(target_feature = "sm_90a")]
fused_ws_entry!(fused_sample_f16_b64, fused_sample_ws::<F16, 64, 4>, 64);
#[cfg(target_feature = "sm_90a")]
fused_ws_entry!(fused_sample_f16_b128, fused_sample_pp::<F16, 128>, 128);

/// Partials a thread of `fused_sample_finish` loads before merging them.
const FINISH_LOADS: usize = 4;

/// Folds a row's partials (in part order, by a fixed tree) into its
/// token, validity, log-normaliser `ln sum exp(x / T)` (T = 1 for greedy
/// rows) and the token's log-probability. A row with nothing valid gets
/// token 0, valid 0, log-normaliser -inf and log-probability NaN; a token
/// drawn among +inf logits gets log-normaliser +inf and log-probability NaN.
///
/// # Launch
/// Grid `(batch)`, block 256, dynamic shared memory 8 x 3 x 8 bytes.
///
/// # Safety
/// `partial` holds the `batch * parts * FUSED_PARTIAL_WORDS` words the
/// main kernel's launches wrote (every part of every row); `tokens`,
/// `valid` hold `batch` elements; `lse` and `logprob` are null or hold
/// `batch` f32.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fused_sample_finish(
    partial: *const u64,
    tokens: *mut u32,
    valid: *mut u8,
    lse_out: *mut f32,
    logprob_out: *mut f32,
    p: FusedParams,
) {
    // Before any memory access (programmatic launch on sm_90).
    arch::griddepcontrol_wait();
    let tid = arch::thread_idx_x();
    let row = arch::block_idx_x();
    let smem = arch::dynamic_shared::<u64>();
    // SAFETY: the launch contract covers every access.
    unsafe {
        let base = partial.add((row * FUSED_PARTIAL_WORDS) as usize);
        let stride = p.batch as usize * FUSED_PARTIAL_WORDS as usize;
        // Up to FINISH_LOADS partials in flight a thread, merged in the
        // order of one at a time (parts tid, tid + 256, ..: the same bits);
        // each load issued before any merge (LLVM sank a plain load of `xs`
        // under the key comparison, a second round trip a partial).
        let mut part = Partial::EMPTY;
        let mut t = tid;
        while t < p.parts {
            let mut loaded = [Partial::EMPTY; FINISH_LOADS];
            let mut j = 0;
            while j < FINISH_LOADS {
                let u = t + j as u32 * 256;
                if u < p.parts {
                    loaded[j] = Partial::load_global(base.add(u as usize * stride));
                }
                j += 1;
            }
            let mut j = 0;
            while j < FINISH_LOADS {
                if t + (j as u32) * 256 < p.parts {
                    part = part.merge(loaded[j]);
                }
                j += 1;
            }
            t += FINISH_LOADS as u32 * 256;
        }
        let part = part.butterfly(16);
        let warp = tid / 32;
        if tid % 32 == 0 {
            part.store(smem.add((FUSED_PARTIAL_WORDS * warp) as usize));
        }
        arch::bar_sync();
        if tid == 0 {
            let mut part = Partial::EMPTY;
            let mut w = 0;
            while w < 8 {
                part = part.merge(Partial::load(smem.add((FUSED_PARTIAL_WORDS * w) as usize)));
                w += 1;
            }
            let Partial { key, xs, lse } = part;
            let r = row as usize;
            let ok = sample::is_valid(key);
            *tokens.add(r) = if ok { sample::token(key) } else { 0 };
            *valid.add(r) = u8::from(ok);
            let class = key >> 62;
            let ln_z = if lse.sum > 0.0 {
                (lse.max + arch::lg2_approx_f32(lse.sum)) * LN2
            } else {
                f32::NEG_INFINITY
            };
            let (ln_z, logprob) = match class {
                1 => (ln_z, xs - ln_z),
                2 => (f32::INFINITY, f32::NAN),
                _ => (f32::NEG_INFINITY, f32::NAN),
            };
            if !lse_out.is_null() {
                *lse_out.add(r) = ln_z;
            }
            if !logprob_out.is_null() {
                *logprob_out.add(r) = logprob;
            }
        }
    }
}
