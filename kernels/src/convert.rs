//! Row copies between 16-bit and f32 logits. The Qrita kernels read f32
//! rows, so a call on bf16 or f16 logits widens them into the workspace
//! first (exactly), and masking writes its result back narrowed (exactly:
//! every kept value was widened, and -inf is a 16-bit value).
//!
//! # Launch
//! Block [`CONVERT_THREADS`]; grid `(ceil(vocab / (CONVERT_THREADS *
//! CONVERT_PER_THREAD)), min(batch, 65535), 1)`, no shared memory.
//!
//! # Safety (caller)
//! `src` holds `batch` rows `src_stride` elements apart with `vocab`
//! readable elements each, `dst` as many writable ones `dst_stride` apart,
//! the two not overlapping.

use crate::arch;
use crate::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::params::{CONVERT_PER_THREAD, CONVERT_THREADS};

/// `dst[r][j] = f(src[r][j])` over the launch's rows and this block's
/// segment of them, coalesced (thread `t` takes every
/// [`CONVERT_THREADS`]-th element of the segment).
///
/// # Safety
/// The module's launch contract.
#[inline(always)]
unsafe fn copy_rows<S: Copy, D: Copy>(
    src: *const S,
    dst: *mut D,
    vocab: u32,
    src_stride: u64,
    dst_stride: u64,
    batch: u32,
    f: impl Fn(S) -> D,
) {
    let seg = CONVERT_THREADS * CONVERT_PER_THREAD;
    let first = arch::block_idx_x() * seg + arch::thread_idx_x();
    let mut r = arch::block_idx_y();
    while r < batch {
        // SAFETY: elements below vocab of row r < batch (caller's contract).
        unsafe {
            let s = src.add(r as usize * src_stride as usize);
            let d = dst.add(r as usize * dst_stride as usize);
            let mut j = first;
            let mut e = 0;
            while e < CONVERT_PER_THREAD {
                if j < vocab {
                    *d.add(j as usize) = f(*s.add(j as usize));
                }
                j += CONVERT_THREADS;
                e += 1;
            }
        }
        r += arch::grid_dim_y();
    }
}

/// bfloat16 rows to f32 rows.
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn widen_rows_bf16(
    src: *const u16,
    dst: *mut f32,
    vocab: u32,
    src_stride: u64,
    dst_stride: u64,
    batch: u32,
) {
    // SAFETY: the launch contract.
    unsafe { copy_rows(src, dst, vocab, src_stride, dst_stride, batch, bf16_to_f32) }
}

/// binary16 rows to f32 rows.
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn widen_rows_f16(
    src: *const u16,
    dst: *mut f32,
    vocab: u32,
    src_stride: u64,
    dst_stride: u64,
    batch: u32,
) {
    // SAFETY: the launch contract.
    unsafe { copy_rows(src, dst, vocab, src_stride, dst_stride, batch, f16_to_f32) }
}

/// f32 rows to bfloat16 rows (nearest, ties to even).
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn narrow_rows_bf16(
    src: *const f32,
    dst: *mut u16,
    vocab: u32,
    src_stride: u64,
    dst_stride: u64,
    batch: u32,
) {
    // SAFETY: the launch contract.
    unsafe { copy_rows(src, dst, vocab, src_stride, dst_stride, batch, f32_to_bf16) }
}

/// f32 rows to binary16 rows (nearest, ties to even).
///
/// # Safety
/// See the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn narrow_rows_f16(
    src: *const f32,
    dst: *mut u16,
    vocab: u32,
    src_stride: u64,
    dst_stride: u64,
    batch: u32,
) {
    // SAFETY: the launch contract.
    unsafe { copy_rows(src, dst, vocab, src_stride, dst_stride, batch, f32_to_f16) }
}
