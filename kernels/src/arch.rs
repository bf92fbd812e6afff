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
pub fn grid_dim_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { nvptx::_grid_dim_y() as u32 }
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

/// `bar.warp.sync` over the full warp: every lane must reach it; the
/// lanes' memory accesses before it are ordered before their accesses
/// after it (a block barrier for one warp's shared-memory exchanges).
#[inline(always)]
pub fn bar_warp_sync() {
    // SAFETY: a warp-wide barrier; callers reach it with every lane.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
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

macro_rules! redux_u32 {
    ($name:ident, $op:literal, $doc:literal) => {
        #[doc = $doc]
        /// over the full warp (sm_80), to every lane; every lane must
        /// execute it (not `pure`, see [`shfl_bfly_u32`]).
        #[inline(always)]
        pub fn $name(x: u32) -> u32 {
            let r: u32;
            // SAFETY: register-only instruction; all 32 lanes participate.
            unsafe {
                asm!(concat!("redux.sync.", $op, ".u32 {r}, {x}, 0xffffffff;"),
                     r = out(reg32) r, x = in(reg32) x, options(nostack))
            };
            r
        }
    };
}

redux_u32!(
    redux_add_u32,
    "add",
    "`redux.sync.add.u32`: the wrapping sum of `x`"
);
redux_u32!(redux_min_u32, "min", "`redux.sync.min.u32`: the least `x`");
redux_u32!(
    redux_max_u32,
    "max",
    "`redux.sync.max.u32`: the largest `x`"
);

/// `shfl.sync.idx.b32` over the full warp: lane `src`'s `x`; every lane
/// must execute it (not `pure`, see [`shfl_bfly_u32`]).
#[inline(always)]
pub fn shfl_idx_u32(x: u32, src: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only instruction; all 32 lanes participate.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {x}, {s}, 0x1f, 0xffffffff;",
             r = out(reg32) r, x = in(reg32) x, s = in(reg32) src,
             options(nostack))
    };
    r
}

/// `vote.sync.ballot.b32` over the full warp: bit `i` set iff lane `i`'s
/// `pred` is true; every lane must execute it (not `pure`, see
/// [`shfl_bfly_u32`]).
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let r: u32;
    // SAFETY: register-only instruction; all 32 lanes participate.
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, 0xffffffff; }}",
             r = out(reg32) r, x = in(reg32) u32::from(pred), options(nostack))
    };
    r
}

/// `ld.global.v4.u32`: a 16-byte load through the coherent path (for data
/// the kernel may write later, where `.nc` is not allowed).
///
/// # Safety
/// `p` is a 16-byte aligned global address of 16 readable bytes.
#[inline(always)]
pub unsafe fn ld_global_v4_u32(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) p, options(readonly, nostack))
    };
    [a, b, c, d]
}

/// `st.global.v4.u32`: one 16-byte store.
///
/// # Safety
/// `p` is a 16-byte aligned global address writable by this thread.
#[inline(always)]
pub unsafe fn st_global_v4_u32(p: *mut u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2],
             d = in(reg32) v[3], options(nostack))
    };
}

/// `fma.rn.f32`: `a * b + c` rounded once.
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only instruction.
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a,
             b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack))
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

/// `ld.global.nc.u64`: an 8-byte read-only load, issued where it stands
/// (not `pure`: LLVM neither sinks it into a branch nor drops it).
///
/// # Safety
/// As [`ld_global_nc_u32`], for 8 bytes.
#[inline(always)]
pub unsafe fn ld_global_nc_u64(p: *const u64) -> u64 {
    let a: u64;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.global.nc.u64 {a}, [{p}];", a = out(reg64) a, p = in(reg64) p,
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

/// `fence.acq_rel.cluster`: orders this thread's memory accesses at
/// cluster scope (sm_90; a GPU-wide `MEMBAR` in SASS).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn fence_acq_rel_cluster() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.cluster;", options(nostack)) };
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

/// `atom.relaxed.gpu.global.max.u64`: returns nothing (a reduction).
///
/// # Safety
/// `p` is an 8-byte aligned global address.
#[inline(always)]
pub unsafe fn red_max_relaxed_gpu_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("red.relaxed.gpu.global.max.u64 [{p}], {v};",
             p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}

/// `atom.relaxed.gpu.global.exch.b64`: stores `v`, returns the old value.
///
/// # Safety
/// `p` is an 8-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_exch_relaxed_gpu_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.relaxed.gpu.global.exch.b64 {o}, [{p}], {v};",
             o = out(reg64) old, p = in(reg64) p, v = in(reg64) v, options(nostack))
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

/// `atom.shared.max.u32` (relaxed): returns the old value.
///
/// # Safety
/// `addr` is a 4-byte aligned shared address of the block (see
/// [`smem_addr`]).
#[inline(always)]
pub unsafe fn atom_max_shared_u32(addr: u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.shared.max.u32 {o}, [{a}], {v};",
             o = out(reg32) old, a = in(reg32) addr, v = in(reg32) v, options(nostack))
    };
    old
}

/// The block's dynamic shared memory, viewed as `T`.
#[inline(always)]
pub fn dynamic_shared<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}

/// The shared-space address of a generic pointer into shared memory
/// (`cvta.to.shared.u64`), as the 32-bit operand of shared-memory
/// instructions.
#[inline(always)]
pub fn smem_addr<T>(p: *const T) -> u32 {
    let a: u64;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvta.to.shared.u64 {a}, {p};", a = out(reg64) a, p = in(reg64) p,
             options(pure, nomem, nostack))
    };
    a as u32
}

/// `cp.async.cg.shared.global` of 16 bytes, of which the first `src_bytes`
/// (0 or 16) are read and the rest zero-filled.
///
/// # Safety
/// `dst` is a 16-byte aligned shared address of the block; when
/// `src_bytes > 0`, `src` is a 16-byte aligned readable global address.
#[inline(always)]
pub unsafe fn cp_async_cg_16(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees both addresses.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes, options(nostack))
    };
}

/// `cp.async.commit_group`.
#[inline(always)]
pub fn cp_async_commit_group() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group N`: waits until at most `N` groups are pending.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    // SAFETY: no memory operands.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8x8 b16 matrices, lane
/// `i` giving the row address of matrix `i / 8`, row `i % 8`. Every lane
/// must execute it.
///
/// # Safety
/// `addr` is a 16-byte aligned shared address with 16 readable bytes.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg32) addr, options(nostack))
    };
    [a, b, c, d]
}

macro_rules! mma_m16n8k16 {
    ($name:ident, $ty:literal) => {
        #[doc = concat!("`mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32`: `d = a b + c`.")]
        /// Every lane must execute it.
        #[inline(always)]
        pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            let (d0, d1, d2, d3): (f32, f32, f32, f32);
            // SAFETY: register-only warp-wide instruction.
            unsafe {
                asm!(concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};"),
                     d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
                     a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                     b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                     c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
                     options(nostack))
            };
            [d0, d1, d2, d3]
        }
    };
}

mma_m16n8k16!(mma_m16n8k16_bf16, "bf16");
mma_m16n8k16!(mma_m16n8k16_f16, "f16");

// ---------------------------------------------------------------------------
// Radix top-k (issue 5): scans, votes, shared-memory counters, and the
// thread-block-cluster instructions of Hopper (distributed shared memory).
// ---------------------------------------------------------------------------

/// `shfl.sync.up.b32` over the full warp: lane `i` gets lane `i - delta`'s
/// `x` (its own when `i < delta`); every lane must execute it (not `pure`,
/// see [`shfl_bfly_u32`]).
#[inline(always)]
pub fn shfl_up_u32(x: u32, delta: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only instruction; all 32 lanes participate.
    unsafe {
        asm!("shfl.sync.up.b32 {r}, {x}, {d}, 0, 0xffffffff;",
             r = out(reg32) r, x = in(reg32) x, d = in(reg32) delta,
             options(nostack))
    };
    r
}

/// `red.shared.add.u32`: adds `v` at a shared address, no result.
///
/// # Safety
/// `addr` is a 4-byte aligned shared address of the block (see
/// [`smem_addr`]).
#[inline(always)]
pub unsafe fn red_shared_add_u32(addr: u32, v: u32) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("red.shared.add.u32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v,
             options(nostack))
    };
}

/// `atom.shared.add.u32` (relaxed): returns the old value.
///
/// # Safety
/// As [`red_shared_add_u32`].
#[inline(always)]
pub unsafe fn atom_shared_add_u32(addr: u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.shared.add.u32 {o}, [{a}], {v};",
             o = out(reg32) old, a = in(reg32) addr, v = in(reg32) v, options(nostack))
    };
    old
}

/// Programmatic dependent launch, the dependent side (`griddepcontrol.wait`,
/// sm_90): waits until every grid this one depends on programmatically has
/// completed and its writes are visible; returns at once in a grid launched
/// without such a dependency. Before it a kernel may not read what the
/// previous kernel of its stream writes. (Nothing on GPUs before sm_90,
/// where the host never launches with the dependency.)
#[inline(always)]
pub fn griddepcontrol_wait() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: an ordering instruction.
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack))
    };
}

/// Programmatic dependent launch, the primary side
/// (`griddepcontrol.launch_dependents`, sm_90): the next kernel of the
/// stream, when launched with a programmatic dependency, may start once
/// every block of this grid has executed this (its blocks then wait in
/// [`griddepcontrol_wait`] for this grid to complete). Nothing before sm_90.
#[inline(always)]
pub fn griddepcontrol_launch_dependents() {
    #[cfg(target_feature = "sm_90")]
    // SAFETY: a scheduling hint; no memory effect.
    unsafe {
        asm!("griddepcontrol.launch_dependents;", options(nostack))
    };
}

/// `%cluster_ctarank`: this block's rank in its cluster (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn cluster_ctarank() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe {
        asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r,
             options(pure, nomem, nostack))
    };
    r
}

/// `%cluster_nctarank`: blocks in this block's cluster (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn cluster_nctarank() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe {
        asm!("mov.u32 {r}, %cluster_nctarank;", r = out(reg32) r,
             options(pure, nomem, nostack))
    };
    r
}

/// `barrier.cluster.arrive` (release semantics): every thread of every
/// block of the cluster must arrive before any passes
/// [`barrier_cluster_wait`] (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn barrier_cluster_arrive() {
    // SAFETY: a barrier has no operands; callers reach it uniformly.
    unsafe { asm!("barrier.cluster.arrive;", options(nostack)) };
}

/// `barrier.cluster.wait` (acquire semantics): waits for the cluster's
/// arrivals (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn barrier_cluster_wait() {
    // SAFETY: a barrier has no operands; callers reach it uniformly.
    unsafe { asm!("barrier.cluster.wait;", options(nostack)) };
}

/// [`barrier_cluster_arrive`] then [`barrier_cluster_wait`]: a barrier
/// over every thread of the cluster, with release and acquire semantics at
/// cluster scope (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn cluster_sync() {
    barrier_cluster_arrive();
    barrier_cluster_wait();
}

/// `barrier.cluster.arrive.relaxed`: arrives without ordering this
/// thread's earlier memory accesses (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn barrier_cluster_arrive_relaxed() {
    // SAFETY: a barrier has no operands; callers reach it uniformly.
    unsafe { asm!("barrier.cluster.arrive.relaxed;", options(nostack)) };
}

/// A cluster barrier with release and acquire semantics at cluster scope
/// whose release fence one thread of each block makes, after a block
/// barrier that orders the block's other threads' accesses before it (the
/// fence is cumulative, as in cooperative groups' grid barrier): one
/// GPU-wide `MEMBAR` a block where [`cluster_sync`]'s release arrive makes
/// one a warp (sm_90). Measured on the H200 (session 24): the Qrita
/// cluster kernels, whose blocks exchange through global memory, 0.2 to
/// 0.3 us faster a call at B = 1 and 8; the radix cluster kernel, whose
/// exchanges are in shared memory, 0.3 to 0.5 us slower (the extra block
/// barrier), so it keeps [`cluster_sync`].
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn cluster_sync_cumulative() {
    bar_sync();
    if thread_idx_x() == 0 {
        fence_acq_rel_cluster();
    }
    barrier_cluster_arrive_relaxed();
    barrier_cluster_wait();
}

/// `mapa.shared::cluster.u32`: the distributed-shared-memory address of
/// shared address `addr` in the cluster's block `rank` (sm_90).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn mapa_shared_cluster(addr: u32, rank: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only address translation.
    unsafe {
        asm!("mapa.shared::cluster.u32 {r}, {a}, {k};",
             r = out(reg32) r, a = in(reg32) addr, k = in(reg32) rank,
             options(pure, nomem, nostack))
    };
    r
}

macro_rules! ld_shared_v4_u32 {
    ($(#[$attr:meta])* $name:ident, $op:literal) => {
        $(#[$attr])*
        #[inline(always)]
        pub unsafe fn $name(addr: u32) -> [u32; 4] {
            let (a, b, c, d): (u32, u32, u32, u32);
            // SAFETY: the caller guarantees the address.
            unsafe {
                asm!(concat!($op, " {{{a}, {b}, {c}, {d}}}, [{p}];"),
                     a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
                     p = in(reg32) addr, options(readonly, nostack))
            };
            [a, b, c, d]
        }
    };
}

ld_shared_v4_u32!(
    /// `ld.shared.v4.u32`: 16 bytes of this block's shared memory.
    ///
    /// # Safety
    /// `addr` is a 16-byte aligned shared address of the block with 16
    /// readable bytes.
    ld_shared_v4_u32,
    "ld.shared.v4.u32"
);

ld_shared_v4_u32!(
    /// `ld.shared::cluster.v4.u32`: 16 bytes of another block's shared
    /// memory (sm_90).
    ///
    /// # Safety
    /// `addr` comes from [`mapa_shared_cluster`] of a 16-byte aligned shared
    /// address, and the block it names is running.
    #[cfg(target_feature = "sm_90")]
    ld_shared_cluster_v4_u32,
    "ld.shared::cluster.v4.u32"
);

/// `st.shared::cluster.u64`: 8 bytes into another block's shared memory
/// (sm_90).
///
/// # Safety
/// `addr` comes from [`mapa_shared_cluster`] of an 8-byte aligned shared
/// address, and the block it names is running.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn st_shared_cluster_u64(addr: u32, v: u64) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("st.shared::cluster.u64 [{p}], {v};", p = in(reg32) addr, v = in(reg64) v,
             options(nostack))
    };
}

/// `atom.shared::cluster.add.u32` (relaxed): adds `v` in another block's
/// shared memory and returns the old value (sm_90).
///
/// # Safety
/// As [`st_shared_cluster_u64`], for a 4-byte aligned address.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn atom_shared_cluster_add_u32(addr: u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("atom.shared::cluster.add.u32 {o}, [{p}], {v};",
             o = out(reg32) old, p = in(reg32) addr, v = in(reg32) v, options(nostack))
    };
    old
}

// ---------------------------------------------------------------------------
// Warpgroup matrix multiply (sm_90a): `wgmma.mma_async` with both operands
// in shared memory, described by matrix descriptors.
// ---------------------------------------------------------------------------

/// The `wgmma` descriptor of a K-major operand tile in shared memory at
/// shared address `addr` (1024-byte aligned up to the k offset), laid out
/// in 128-byte rows (64 bf16 / f16 of k) with the 128-byte swizzle (16-byte
/// chunk `c` of row `r` at chunk `c ^ (r % 8)`), eight-row groups 1024
/// bytes apart: start address and strides in 16-byte units, swizzle mode 1
/// (128 bytes) in bits 62-63.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn wgmma_desc_k_major_sw128(addr: u32) -> u64 {
    let start = ((addr & 0x3ffff) >> 4) as u64;
    let leading = 1u64; // unused by swizzled K-major layouts
    let stride = 1024u64 >> 4;
    start | (leading << 16) | (stride << 32) | (1u64 << 62)
}

/// `desc` ([`wgmma_desc_k_major_sw128`]) moved `bytes` (a multiple of 16)
/// further into shared memory: the low word's start-address field alone
/// changes (shared addresses below 256 KiB fill its 14 bits without a
/// carry out of them), so that one descriptor's arithmetic serves every k16
/// step and tile of a stage (an add instead of forming each descriptor from
/// its address).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn wgmma_desc_offset(desc: u64, bytes: u32) -> u64 {
    let lo = (desc as u32).wrapping_add(bytes >> 4);
    (desc & !0xffff_ffff) | u64::from(lo)
}

/// `wgmma.fence.sync.aligned`: every thread of the warpgroup executes it
/// before the first `wgmma` that reads registers written since (the
/// accumulators: fence them with [`operand_fence_32`] after it).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn wgmma_fence() {
    // SAFETY: a warpgroup-wide ordering instruction.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// `wgmma.commit_group.sync.aligned` then `wgmma.wait_group.sync.aligned
/// N`: every `wgmma` group this thread committed but the newest `N` has
/// completed (its accumulators written, its shared-memory reads done).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn wgmma_commit_wait<const N: u32>() {
    // SAFETY: warpgroup-wide ordering instructions.
    unsafe {
        asm!("wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned {n};",
             n = const N, options(nostack))
    };
}

/// `wgmma.wait_group.sync.aligned 0`: every `wgmma` this thread issued has
/// completed, its accumulators written (fence them with
/// [`operand_fence_32`] before reading them).
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn wgmma_wait_all() {
    // SAFETY: a warpgroup-wide ordering instruction.
    unsafe { asm!("wgmma.wait_group.sync.aligned 0;", options(nostack)) };
}

/// `fence.proxy.async.shared::cta`: this thread's earlier accesses to
/// shared memory (`st.shared`, completed `cp.async`) are ordered before
/// later accesses of the async proxy: `wgmma` reading its operands, bulk
/// copies overwriting what the thread wrote (a block barrier after the
/// fence orders every thread's accesses before the copy its issuer starts).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: an ordering instruction.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

#[cfg(target_feature = "sm_90a")]
macro_rules! operand_fence {
    ($name:ident, $len:literal, [$($d:ident = $i:literal),*]) => {
        #[doc = concat!("An empty `asm` that reads and writes the ", stringify!($len), " registers of `d`:")]
        /// the compiler may not move an access to them across it, nor
        /// across the `wgmma` fences and waits next to it (CUTLASS's
        /// `warpgroup_fence_operand`).
        #[inline(always)]
        pub fn $name(d: &mut [f32; $len]) {
            // SAFETY: no instruction; each register is its own operand.
            unsafe {
                asm!(concat!("//" $(, " {", stringify!($d), "}")*),
                     $($d = inout(reg32) d[$i],)* options(nostack))
            };
        }
    };
}

#[cfg(target_feature = "sm_90a")]
macro_rules! wgmma_m64k16 {
    ($name:ident, $n:literal, $ty:literal, $len:literal, [$d0:ident = $i0:literal $(, $d:ident = $i:literal)*]) => {
        #[doc = concat!("`wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, "`: `d += a b`")]
        /// for the 64 x 16 A tile and 16 x N B tile (both K-major) the
        /// descriptors `a` and `b` describe; asynchronous until
        /// [`wgmma_commit_wait`].
        ///
        /// # Safety
        /// Every thread of the warpgroup executes it with the same
        /// descriptors, after [`wgmma_fence`]; the tiles lie in this
        /// block's shared memory and stay unwritten until the wait.
        #[inline(always)]
        pub unsafe fn $name(d: &mut [f32; $len], a: u64, b: u64) {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, {one}, 0; wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty,
                             " {{{", stringify!($d0), "}" $(, ", {", stringify!($d), "}")*, "}}, {a}, {b}, p, 1, 1, 0, 0; }}"),
                     $d0 = inout(reg32) d[$i0], $($d = inout(reg32) d[$i],)*
                     a = in(reg64) a, b = in(reg64) b, one = in(reg32) 1u32, options(nostack))
            };
        }
    };
}

/// The `wgmma` variants of one accumulator size (`$len` registers, n =
/// `$n`): bf16 and f16 operands, and its [`operand_fence_32`]-style fence.
#[cfg(target_feature = "sm_90a")]
macro_rules! wgmma_size {
    ($len:literal, $n:literal, $bf16:ident, $f16:ident, $fence:ident, $regs:tt) => {
        wgmma_m64k16!($bf16, $n, "bf16", $len, $regs);
        wgmma_m64k16!($f16, $n, "f16", $len, $regs);
        operand_fence!($fence, $len, $regs);
    };
}

#[cfg(target_feature = "sm_90a")]
wgmma_size! { 8, "16", wgmma_m64n16k16_bf16, wgmma_m64n16k16_f16, operand_fence_8, [d0 = 0, d1 = 1, d2 = 2, d3 = 3, d4 = 4, d5 = 5, d6 = 6, d7 = 7] }
#[cfg(target_feature = "sm_90a")]
wgmma_size! { 16, "32", wgmma_m64n32k16_bf16, wgmma_m64n32k16_f16, operand_fence_16, [d0 = 0, d1 = 1, d2 = 2, d3 = 3, d4 = 4, d5 = 5, d6 = 6, d7 = 7, d8 = 8, d9 = 9, d10 = 10, d11 = 11, d12 = 12, d13 = 13, d14 = 14, d15 = 15] }
#[cfg(target_feature = "sm_90a")]
wgmma_size! { 32, "64", wgmma_m64n64k16_bf16, wgmma_m64n64k16_f16, operand_fence_32, [d0 = 0, d1 = 1, d2 = 2, d3 = 3, d4 = 4, d5 = 5, d6 = 6, d7 = 7, d8 = 8, d9 = 9, d10 = 10, d11 = 11, d12 = 12, d13 = 13, d14 = 14, d15 = 15, d16 = 16, d17 = 17, d18 = 18, d19 = 19, d20 = 20, d21 = 21, d22 = 22, d23 = 23, d24 = 24, d25 = 25, d26 = 26, d27 = 27, d28 = 28, d29 = 29, d30 = 30, d31 = 31] }
#[cfg(target_feature = "sm_90a")]
wgmma_size! { 64, "128", wgmma_m64n128k16_bf16, wgmma_m64n128k16_f16, operand_fence_64, [d0 = 0, d1 = 1, d2 = 2, d3 = 3, d4 = 4, d5 = 5, d6 = 6, d7 = 7, d8 = 8, d9 = 9, d10 = 10, d11 = 11, d12 = 12, d13 = 13, d14 = 14, d15 = 15, d16 = 16, d17 = 17, d18 = 18, d19 = 19, d20 = 20, d21 = 21, d22 = 22, d23 = 23, d24 = 24, d25 = 25, d26 = 26, d27 = 27, d28 = 28, d29 = 29, d30 = 30, d31 = 31, d32 = 32, d33 = 33, d34 = 34, d35 = 35, d36 = 36, d37 = 37, d38 = 38, d39 = 39, d40 = 40, d41 = 41, d42 = 42, d43 = 43, d44 = 44, d45 = 45, d46 = 46, d47 = 47, d48 = 48, d49 = 49, d50 = 50, d51 = 51, d52 = 52, d53 = 53, d54 = 54, d55 = 55, d56 = 56, d57 = 57, d58 = 58, d59 = 59, d60 = 60, d61 = 61, d62 = 62, d63 = 63] }

// ---------------------------------------------------------------------------
// mbarrier pipelines and the bulk copy engine (sm_90: the staged radix
// filter; sm_90a: the warp-specialised fused kernels' tensor copies).

/// `mbarrier.init.shared::cta.b64`: the barrier at shared address `addr`
/// expects `count` arrivals a phase.
///
/// # Safety
/// `addr` is an 8-byte aligned shared address of the block that no thread
/// uses as a barrier yet.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn mbarrier_init(addr: u32, count: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{a}], {c};", a = in(reg32) addr, c = in(reg32) count,
             options(nostack))
    };
}

/// `fence.mbarrier_init.release.cluster`: this thread's `mbarrier.init`s
/// become visible to the async proxy (the bulk copies that complete on
/// them); a block barrier after it publishes them to the other threads.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: an ordering instruction.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64`: one arrival on the barrier
/// at `addr`, and `bytes` more bytes of asynchronous copies its current
/// phase waits for.
///
/// # Safety
/// `addr` is an initialised barrier of the block.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(addr: u32, bytes: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{a}], {n};", a = in(reg32) addr,
             n = in(reg32) bytes, options(nostack))
    };
}

/// `mbarrier.arrive.shared::cta.b64`: one arrival on the barrier at `addr`
/// (release: this thread's earlier accesses happen before the phase
/// completes).
///
/// # Safety
/// `addr` is an initialised barrier of the block.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn mbarrier_arrive(addr: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("mbarrier.arrive.shared::cta.b64 _, [{a}];", a = in(reg32) addr, options(nostack))
    };
}

/// Waits (`mbarrier.try_wait.parity`, acquire) until the phase of parity
/// `parity` of the barrier at `addr` has completed: the current phase if it
/// has that parity, else the one before it, which has.
///
/// # Safety
/// `addr` is an initialised barrier of the block.
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn mbarrier_wait_parity(addr: u32, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: the caller's contract.
        unsafe {
            asm!("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{a}], {ph}; selp.u32 {d}, 1, 0, p; }}",
                 a = in(reg32) addr, ph = in(reg32) parity, d = out(reg32) done, options(nostack))
        };
        if done != 0 {
            break;
        }
    }
}

/// The generic address of a kernel parameter (`cvta.param`) from its
/// parameter-space address: a `CUtensorMap` passed by value is read by the
/// copy engine from there.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn cvta_param(addr: u64) -> u64 {
    let g: u64;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvta.param.u64 {g}, {a};", g = out(reg64) g, a = in(reg64) addr,
             options(pure, nomem, nostack))
    };
    g
}

/// `cp.async.bulk.tensor.2d` (tile mode) from global to shared memory: the
/// box of the 2D tensor map at generic address `map` whose first element is
/// at coordinates `(c0, c1)` (innermost first; elements outside the tensor
/// read as zero) into shared address `dst`, completing `box bytes` of
/// transactions on the barrier at `bar`, under the L2 cache policy `policy`
/// ([`l2_evict_first`], [`l2_evict_last`]) for the lines it reads.
///
/// # Safety
/// `map` addresses a valid tensor map (kernel parameter or global memory)
/// whose tensor is readable; `dst` has room for the box, aligned as the
/// map's swizzle needs (1024 bytes for 128-byte swizzle); `bar` is an
/// initialised barrier of the block expecting the bytes.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub unsafe fn cp_async_bulk_tensor_2d(dst: u32, map: u64, c0: i32, c1: i32, bar: u32, policy: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{x}, {y}}}], [{b}], {p};",
             d = in(reg32) dst, m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1,
             b = in(reg32) bar, p = in(reg64) policy, options(nostack))
    };
}

/// An L2 cache policy (`createpolicy.fractional`) that evicts the lines an
/// access reads first: for data read once.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn l2_evict_first() -> u64 {
    let p: u64;
    // SAFETY: computes a value; no memory access.
    unsafe {
        asm!("createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;", p = out(reg64) p,
             options(pure, nomem, nostack))
    };
    p
}

/// An L2 cache policy (`createpolicy.fractional`) that keeps the lines an
/// access reads last: for data read again by other blocks.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn l2_evict_last() -> u64 {
    let p: u64;
    // SAFETY: computes a value; no memory access.
    unsafe {
        asm!("createpolicy.fractional.L2::evict_last.b64 {p}, 1.0;", p = out(reg64) p,
             options(pure, nomem, nostack))
    };
    p
}

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`: a
/// bulk copy of `bytes` contiguous bytes from global address `src` to shared
/// address `dst` of this block, by the copy engine (no registers, no
/// thread waits for it), completing `bytes` of transactions on the barrier
/// at `bar` (sm_90).
///
/// # Safety
/// `src` is a 16-byte aligned global address of `bytes` readable bytes no
/// thread writes during the kernel; `dst` is a 16-byte aligned shared
/// address of this block with `bytes` bytes of room that no thread
/// accesses until the barrier's phase completes (and whose earlier
/// generic writes are fenced, [`fence_proxy_async_shared`]); `bytes` is a
/// nonzero multiple of 16; `bar` is an initialised barrier of the block
/// whose current phase expects the bytes
/// ([`mbarrier_arrive_expect_tx`]).
#[cfg(target_feature = "sm_90")]
#[inline(always)]
pub unsafe fn cp_async_bulk_shared_global(dst: u32, src: *const u8, bytes: u32, bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, b = in(reg32) bar,
             options(nostack))
    };
}

/// `bar.sync ID, COUNT`: a named barrier of `COUNT` threads (whole warps),
/// for the warps of a block that take part in it.
#[inline(always)]
pub fn bar_sync_named<const ID: u32, const COUNT: u32>() {
    // SAFETY: a barrier; callers reach it uniformly per warp.
    unsafe { asm!("bar.sync {i}, {n};", i = const ID, n = const COUNT, options(nostack)) };
}

/// `bar.arrive ID, COUNT`: this thread arrives at named barrier `ID`
/// without waiting (release: its earlier memory accesses happen before the
/// accesses of the threads that then complete the barrier with
/// [`bar_sync_named`]). `COUNT` counts both sides.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn bar_arrive_named<const ID: u32, const COUNT: u32>() {
    // SAFETY: a barrier; callers reach it uniformly per warp.
    unsafe { asm!("bar.arrive {i}, {n};", i = const ID, n = const COUNT, options(nostack)) };
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: this warpgroup gives registers
/// back to the block's pool, keeping `N` a thread (24 to 256, a multiple of
/// 8). Every thread of the warpgroup executes it.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn setmaxnreg_dec<const N: u32>() {
    // SAFETY: a register-allocation instruction.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

/// `setmaxnreg.inc.sync.aligned.u32 N`: this warpgroup takes registers
/// from the block's pool, up to `N` a thread (waiting until the pool has
/// them). Every thread of the warpgroup executes it.
#[cfg(target_feature = "sm_90a")]
#[inline(always)]
pub fn setmaxnreg_inc<const N: u32>() {
    // SAFETY: a register-allocation instruction.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}
