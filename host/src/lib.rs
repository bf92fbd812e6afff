//! flashsample: exact, deterministic token sampling for LLM decoding, with
//! GPU kernels written in Rust (compiled to PTX by rustc's NVPTX backend) and
//! launched through `cudarc`.
//!
//! Every sampler keeps the contracts of the design: a row's result is a pure
//! function of that row (logits, parameters, seed, offset), never of batch
//! size, position or launch shape; random numbers come from Philox4x32-10
//! addressed by (seed, offset, vocabulary index); ties go to the lowest
//! index; NaN counts as -inf; a row with nothing to sample is reported
//! invalid. The [`reference`](mod@reference) module is the float64 CPU oracle of the same
//! semantics and a usable CPU backend.

mod backend;
mod device;
mod error;
mod fused_lm_head;
mod radix_topk;
mod rows;
mod sampling;
mod topk_topp;
mod tp;
mod unfused;

pub mod reference;

/// The element types the kernels read. The public element traits
/// ([`LogitElem`], [`HeadElem`], [`TruncElem`]) extend [`sealed::Sealed`], so no other
/// type can claim one of them and be read as something it is not.
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// The PTX modules embedded at build time, one per architecture.
pub mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx_modules.rs"));
}

pub use backend::Backend;
pub use device::{Device, arch_for, driver_present, module_runs_on};
pub use error::{Error, Result};
pub use fused_lm_head::{FusedOutput, HeadElem, HeadInput, HeadShape};
pub use radix_topk::{
    MAX_CLUSTER, MAX_FILTER_CLUSTER, RadixCaps, RadixWorkspace, Route, Slab, TopKTopPParams,
    plan_route,
};
pub use rows::{DType, LogitElem, RowParams, Rows};
pub use sampling::{RawSampling, SampleOutput, Workspace};
pub use topk_topp::{
    Half, LISTED_MIN_BATCH, LISTED_MIN_BATCH_SHORT, LISTED_MIN_CHUNKS, MAX_TOPK_TOPP_CLUSTER,
    TopkToppCaps, TopkToppRoute, TruncElem, TruncParams, plan_topk_topp_radix,
    plan_topk_topp_route,
};
pub use tp::{MAX_SHARDS, TpSampler, VocabSplit, nccl_present};
pub use unfused::Unfused;

/// The shared device/CPU math (Philox, noise, keys), re-exported.
pub use flashsample_kernels as kernels;
