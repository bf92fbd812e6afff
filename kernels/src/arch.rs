//! One `#[inline(always)]` wrapper per PTX instruction the kernels use, named
//! after the instruction, so the rest of the device code reads as Rust.

use core::arch::asm;
use core::arch::nvptx;

#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_x() as u32 }
}

#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_idx_y() as u32 }
}

#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_block_dim_x() as u32 }
}

#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `bar.sync 0`: every thread of the block must reach it.
#[inline(always)]
pub fn bar_sync() {
    // SAFETY: a block-wide barrier; callers reach it uniformly.
    unsafe { nvptx::_syncthreads() }
}

/// `shfl.sync.bfly.b32` over the full warp: every lane must execute it.
///
/// Deliberately not `pure`: a pure `asm!` may be sunk by LLVM into a branch
/// that uses its result (it does not know the instruction is convergent),
/// which leaves a full-warp shuffle executed by one lane, a hang.
#[inline(always)]
pub fn shfl_bfly_u32(x: u32, lane_mask: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only instruction; all 32 lanes participate.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {x}, {m}, 0x1f, 0xffffffff;",
             r = out(reg32) r, x = in(reg32) x, m = in(reg32) lane_mask,
             options(nostack))
    };
    r
}

/// `lg2.approx.ftz.f32`: base-2 logarithm, maximum relative error 2^-22
/// for normal inputs (PTX ISA); only used to filter candidates.
#[inline(always)]
pub fn lg2_approx_f32(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only instruction.
    unsafe {
        asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    r
}

/// `ex2.approx.ftz.f32`: 2^x, maximum relative error 2^-22 (PTX ISA).
#[inline(always)]
pub fn ex2_approx_f32(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only instruction.
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    r
}

/// `ld.global.nc.L1::no_allocate.v4.u32`: a 16-byte read-only streaming load.
///
/// # Safety
/// `p` is a 16-byte aligned global address of 16 readable bytes that no
/// thread writes during the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_v4_u32(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) p, options(readonly, nostack))
    };
    [a, b, c, d]
}

/// `ld.global.nc.u32`: a 4-byte read-only load.
///
/// # Safety
/// `p` is an aligned global address of 4 readable bytes no thread writes
/// during the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_u32(p: *const u32) -> u32 {
    let a: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.global.nc.u32 {a}, [{p}];", a = out(reg32) a, p = in(reg64) p,
             options(readonly, nostack))
    };
    a
}

/// `ld.global.nc.u16`: a 2-byte read-only load.
///
/// # Safety
/// As [`ld_global_nc_u32`], for 2 bytes.
#[inline(always)]
pub unsafe fn ld_global_nc_u16(p: *const u16) -> u16 {
    let a: u16;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.global.nc.u16 {a}, [{p}];", a = out(reg16) a, p = in(reg64) p,
             options(readonly, nostack))
    };
    a
}

/// `ld.relaxed.gpu.global.u64`: a load that sees other blocks' stores made
/// visible by a release at GPU scope (bypasses a stale L1 line).
///
/// # Safety
/// `p` is an 8-byte aligned global address of 8 readable bytes.
#[inline(always)]
pub unsafe fn ld_relaxed_gpu_u64(p: *const u64) -> u64 {
    let a: u64;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.relaxed.gpu.global.u64 {a}, [{p}];", a = out(reg64) a, p = in(reg64) p,
             options(readonly, nostack))
    };
    a
}

/// `ld.relaxed.gpu.global.u32`, as [`ld_relaxed_gpu_u64`] for 4 bytes.
///
/// # Safety
/// `p` is a 4-byte aligned global address of 4 readable bytes.
#[inline(always)]
pub unsafe fn ld_relaxed_gpu_u32(p: *const u32) -> u32 {
    let a: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.relaxed.gpu.global.u32 {a}, [{p}];", a = out(reg32) a, p = in(reg64) p,
             options(readonly, nostack))
    };
    a
}

/// `fence.acq_rel.gpu`: orders this thread's memory accesses at GPU scope.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `atom.acq_rel.gpu.global.add.u32`: returns the old value.
///
/// # Safety
/// `p` is a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_add_acq_rel_gpu_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {o}, [{p}], {v};",
             o = out(reg32) old, p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
    old
}

/// `atom.global.max.u32` (relaxed): returns the old value.
///
/// # Safety
/// `p` is a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_max_u32(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.global.max.u32 {o}, [{p}], {v};",
             o = out(reg32) old, p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
    old
}

/// The block's dynamic shared memory, viewed as `T`.
#[inline(always)]
pub fn dynamic_shared<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}
