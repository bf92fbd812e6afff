//! Device code of flashsample, written in Rust and compiled to PTX by
//! `cargo xtask build-ptx`, and the portable math it shares with the host.
//!
//! The portable modules ([`philox`], [`noise`], [`radix`], [`sample`],
//! [`params`]) build for every target and are unit-tested on the CPU; the
//! host crate's CPU backend calls the very same functions, so the device and
//! the CPU draw bit-identical random numbers. The kernels themselves (and the
//! `arch` wrappers of single PTX instructions) exist only when compiling
//! for `nvptx64-nvidia-cuda`.
#![no_std]
#![allow(internal_features)]
#![feature(core_intrinsics)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        abi_ptx,
        stdarch_nvptx,
        asm_experimental_arch,
        gpu_launch_sized_workgroup_mem,
        gpu_intrinsics
    )
)]

#[cfg(target_arch = "nvptx64")]
mod block;
pub mod cover;
pub mod float16;
pub mod mma_layout;
pub mod noise;
pub mod params;
pub mod philox;
pub mod pivot;
pub mod radix;
pub mod radix_select;
pub mod sample;

#[cfg(target_arch = "nvptx64")]
pub mod arch;
#[cfg(target_arch = "nvptx64")]
mod convert;
#[cfg(target_arch = "nvptx64")]
mod fused_lm_head;
#[cfg(target_arch = "nvptx64")]
mod race;
#[cfg(target_arch = "nvptx64")]
mod radix_topk;
#[cfg(target_arch = "nvptx64")]
mod sampling;
#[cfg(target_arch = "nvptx64")]
mod softmax;
#[cfg(target_arch = "nvptx64")]
mod topk_topp;

/// Entry points every PTX module must define (checked by `xtask build-ptx`
/// and loaded by the host).
pub const ENTRY_POINTS: &[&str] = &[
    "sampling_from_logits_f32",
    "sampling_from_logits_bf16",
    "sampling_from_logits_seeded_f32",
    "sampling_from_logits_seeded_bf16",
    "sampling_from_logits_wide_f32",
    "sampling_from_logits_wide_bf16",
    "softmax_stats_f32",
    "softmax_write_f32",
    "gumbel_filter_error_probe",
    "read_bandwidth_probe",
    "fused_sample_bf16_b16",
    "fused_sample_bf16_b32",
    "fused_sample_bf16_b64",
    "fused_sample_bf16_b128",
    "fused_sample_f16_b16",
    "fused_sample_f16_b32",
    "fused_sample_f16_b64",
    "fused_sample_f16_b128",
    "fused_sample_finish",
    "topk_topp_stats_f32",
    "topk_topp_stats_listed_f32",
    "topk_topp_plan_f32",
    "topk_topp_plan_listed_f32",
    "topk_topp_filter_f32",
    "topk_topp_filter_grouped_f32",
    "topk_topp_mask_f32",
    "topk_topp_mask_listed_f32",
    "topk_topp_apply_f32",
    "topk_topp_renorm_f32",
    "topk_topp_kept_count_f32",
    "topk_topp_kept_write_f32",
    "widen_rows_bf16",
    "widen_rows_f16",
    "narrow_rows_bf16",
    "narrow_rows_f16",
    "topk_topp_sample_f32",
    "topk_topp_sample_listed_f32",
    "topk_topp_cluster_mask_f32",
    "topk_topp_cluster_sample_f32",
    "topk_topp_slab_mask_f32",
    "topk_topp_slab_apply_f32",
    "topk_topp_slab_sample_f32",
    "radix_topk_cluster_f32",
    "radix_topk_coop_f32",
    "radix_topk_filter_f32",
    "radix_topk_filter_small_f32",
    "radix_topk_cluster_logits_f32",
    "radix_topk_cluster_mask_logits_f32",
    "radix_topk_cluster_sample_logits_f32",
    "radix_topk_filter_logits_f32",
    "radix_topk_filter_small_logits_f32",
    "radix_probs_to_logits_f32",
];

/// Launch bounds of a kernel: the PTX directives `.maxntid max_threads, 1,
/// 1` and `.minnctapersm min_blocks_per_sm`, which make ptxas fit the
/// registers to that many resident blocks (CUDA C++'s `__launch_bounds__`;
/// rustc has no attribute for them, so the PTX build writes them in).
pub struct LaunchBounds {
    pub kernel: &'static str,
    pub max_threads: u32,
    pub min_blocks_per_sm: u32,
    /// The modules whose kernel of that name these bounds are for.
    pub modules: Modules,
}

/// A set of PTX modules, by architecture name.
#[derive(Clone, Copy)]
pub enum Modules {
    All,
    /// The sm_90a module alone (its fused 64- and 128-row kernels are the
    /// warp-specialised ones).
    Sm90a,
    /// Every module but sm_90a.
    NotSm90a,
}

impl Modules {
    /// Whether the module of architecture `arch` (`sm_80`, ...) is in the
    /// set.
    pub fn includes(self, arch: &str) -> bool {
        match self {
            Modules::All => true,
            Modules::Sm90a => arch == "sm_90a",
            Modules::NotSm90a => arch != "sm_90a",
        }
    }
}

/// Kernel parameters that hold a `CUtensorMap` ([`params::TensorMap`]) in
/// the sm_90a module (the warp-specialised fused kernels' hidden-state and
/// LM-head maps). The copy engine reads them in parameter space, 64-byte
/// aligned; rustc's kernel ABI declares at most 16-byte alignment (it stops
/// with an internal error above that), so the PTX build raises these
/// parameters' `.align` to 64.
pub const TENSOR_MAP_PARAMS: &[&str] = &[
    "fused_sample_bf16_b64_param_0",
    "fused_sample_bf16_b64_param_1",
    "fused_sample_bf16_b128_param_0",
    "fused_sample_bf16_b128_param_1",
    "fused_sample_f16_b64_param_0",
    "fused_sample_f16_b64_param_1",
    "fused_sample_f16_b128_param_0",
    "fused_sample_f16_b128_param_1",
];

/// Kernels whose register count would otherwise cost resident blocks: the
/// sampling kernels at [`params::SAMPLING_BLOCKS_PER_SM`] blocks of
/// [`params::ROW_THREADS`] per multiprocessor (ptxas: 80 registers, no
/// spills) and the Qrita pre-filter pass at
/// [`params::TOPK_TOPP_FILTER_BLOCKS_PER_SM`] (64 registers; one word
/// spilled on sm_90 in the top-p-only scan, see `xtask`'s `SPILL_ALLOW`),
/// and the fused sampler at [`params::fused_blocks_per_sm`]
/// (two blocks, at most 128 registers, for batch tiles of up to 32 rows;
/// one above; on sm_90a the 64- and 128-row kernels are warp-specialised:
/// one block of [`params::FUSED_WS_THREADS`], at most 120 registers).
pub const LAUNCH_BOUNDS: &[LaunchBounds] = &[
    LaunchBounds {
        kernel: "sampling_from_logits_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::SAMPLING_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "sampling_from_logits_bf16",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::SAMPLING_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "sampling_from_logits_seeded_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::SAMPLING_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "sampling_from_logits_seeded_bf16",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::SAMPLING_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "sampling_from_logits_wide_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::SAMPLING_WIDE_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "sampling_from_logits_wide_bf16",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::SAMPLING_WIDE_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_stats_listed_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::TOPK_TOPP_STATS_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_filter_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::TOPK_TOPP_FILTER_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_filter_grouped_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: params::TOPK_TOPP_FILTER_BLOCKS_PER_SM,
        modules: Modules::All,
    },
    // Two selection blocks per SM (shared memory allows three): at most
    // 128 registers (the sampler had reached 142 while the refinement was
    // written, one block per SM).
    LaunchBounds {
        kernel: "topk_topp_mask_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: 2,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_mask_listed_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: 2,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_sample_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: 2,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_sample_listed_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: 2,
        modules: Modules::All,
    },
    // Two cluster CTAs per SM (their registers; shared memory allows three):
    // a row's cluster of up to 16 spreads over 8 SMs at least.
    LaunchBounds {
        kernel: "topk_topp_cluster_mask_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: 2,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "topk_topp_cluster_sample_f32",
        max_threads: params::ROW_THREADS,
        min_blocks_per_sm: 2,
        modules: Modules::All,
    },
    // One filter CTA per SM (its candidate buffer): ptxas may use up to 128
    // registers, for two rounds of loads in flight.
    LaunchBounds {
        kernel: "radix_topk_filter_f32",
        max_threads: radix_select::RADIX_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "radix_topk_filter_small_f32",
        max_threads: radix_select::RADIX_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "radix_topk_filter_logits_f32",
        max_threads: radix_select::RADIX_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "radix_topk_filter_small_logits_f32",
        max_threads: radix_select::RADIX_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "fused_sample_bf16_b16",
        max_threads: params::fused_threads(16),
        min_blocks_per_sm: params::fused_blocks_per_sm(16),
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "fused_sample_bf16_b32",
        max_threads: params::fused_threads(32),
        min_blocks_per_sm: params::fused_blocks_per_sm(32),
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "fused_sample_bf16_b64",
        max_threads: params::fused_threads(64),
        min_blocks_per_sm: params::fused_blocks_per_sm(64),
        modules: Modules::NotSm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_bf16_b64",
        max_threads: params::FUSED_WS_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::Sm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_bf16_b128",
        max_threads: params::fused_threads(128),
        min_blocks_per_sm: params::fused_blocks_per_sm(128),
        modules: Modules::NotSm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_bf16_b128",
        max_threads: params::FUSED_WS_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::Sm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_f16_b16",
        max_threads: params::fused_threads(16),
        min_blocks_per_sm: params::fused_blocks_per_sm(16),
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "fused_sample_f16_b32",
        max_threads: params::fused_threads(32),
        min_blocks_per_sm: params::fused_blocks_per_sm(32),
        modules: Modules::All,
    },
    LaunchBounds {
        kernel: "fused_sample_f16_b64",
        max_threads: params::fused_threads(64),
        min_blocks_per_sm: params::fused_blocks_per_sm(64),
        modules: Modules::NotSm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_f16_b64",
        max_threads: params::FUSED_WS_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::Sm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_f16_b128",
        max_threads: params::fused_threads(128),
        min_blocks_per_sm: params::fused_blocks_per_sm(128),
        modules: Modules::NotSm90a,
    },
    LaunchBounds {
        kernel: "fused_sample_f16_b128",
        max_threads: params::FUSED_WS_THREADS,
        min_blocks_per_sm: 1,
        modules: Modules::Sm90a,
    },
];

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Unreachable in well-formed kernels: `xtask build-ptx` rejects any
    // module that still references a panic path.
    unsafe { core::arch::asm!("trap;", options(noreturn)) }
}
