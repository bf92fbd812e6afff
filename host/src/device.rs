//! A GPU: its CUDA context, the PTX module chosen for its compute capability
//! (loaded once per process and device), and its kernels.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, sys};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};
use crate::ptx;

/// The kernels of one loaded module.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub sampling_f32: CudaFunction,
    pub sampling_bf16: CudaFunction,
    pub sampling_seeded_f32: CudaFunction,
    pub sampling_seeded_bf16: CudaFunction,
    pub softmax_stats_f32: CudaFunction,
    pub softmax_write_f32: CudaFunction,
    pub gumbel_probe: CudaFunction,
    pub read_probe: CudaFunction,
    /// `fused_sample_bf16_b{16,32,64,128}`, in `FUSED_BATCH_TILES` order.
    pub fused_bf16: [CudaFunction; 4],
    /// `fused_sample_f16_b{16,32,64,128}`, in `FUSED_BATCH_TILES` order.
    pub fused_f16: [CudaFunction; 4],
    pub fused_finish: CudaFunction,
    pub topk_topp_stats_f32: CudaFunction,
    pub topk_topp_plan_f32: CudaFunction,
    pub topk_topp_filter_f32: CudaFunction,
    pub topk_topp_mask_f32: CudaFunction,
    pub topk_topp_apply_f32: CudaFunction,
    pub topk_topp_sample_f32: CudaFunction,
}

/// A multiprocessor's shared memory: what its resident blocks share, and
/// what the driver reserves of it for each block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SmemPerSm {
    pub total: u32,
    pub reserved_per_block: u32,
}

impl SmemPerSm {
    /// Blocks of `bytes` of dynamic shared memory each that fit at once.
    pub fn blocks(self, bytes: u32) -> u32 {
        self.total / (bytes + self.reserved_per_block)
    }
}

#[derive(Debug)]
struct Inner {
    ctx: Arc<CudaContext>,
    arch: &'static str,
    sm_count: u32,
    smem: SmemPerSm,
    kernels: Kernels,
    _module: Arc<CudaModule>,
}

/// A CUDA device with flashsample's kernels loaded. Cheap to clone; every
/// [`Device::new`] for the same ordinal in a process shares one context and
/// one loaded module.
///
/// Buffers allocated through this device's context are not tracked by
/// cudarc's per-buffer events (they cost microseconds on every launch):
/// as with the CUDA runtime, a buffer written on one stream and read on
/// another needs the caller's ordering (`CudaStream::join` or events).
#[derive(Debug, Clone)]
pub struct Device(Arc<Inner>);

/// Whether the CUDA driver library can be loaded on this machine (cudarc
/// panics on first use when it cannot, so every entry point checks this).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the driver library by its usual names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The embedded PTX module for a compute capability: sm_90a on Hopper
/// (9.0), the sm_90 module on later GPUs (JIT-compiled by the driver), sm_89
/// on Ada, sm_80 on other Ampere GPUs.
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    Ok(match (major, minor) {
        (9, 0) => "sm_90a",
        (m, _) if m >= 9 => "sm_90",
        (8, n) if n >= 9 => "sm_89",
        (8, _) => "sm_80",
        _ => return Err(Error::UnsupportedArch { major, minor }),
    })
}

impl Device {
    /// Opens GPU `ordinal` (0 for the first). Errors, never panics, when
    /// there is no driver, no such device, or the GPU is too old.
    pub fn new(ordinal: usize) -> Result<Device> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        static CACHE: OnceLock<Mutex<HashMap<usize, Device>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = cache.get(&ordinal) {
            return Ok(d.clone());
        }
        let count = CudaContext::device_count()? as usize;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: flashsample orders all of its work on the stream each call
        // is given, as raw CUDA does; buffers used on several streams are
        // the caller's to order (see the type's docs). cudarc's per-buffer
        // event tracking would add event records and waits to every launch:
        // 15 us per B = 1 sampling call on the H200, 30 times the kernel.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        let arch = arch_for(major, minor)?;
        let src = ptx::MODULES
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, s)| *s)
            .ok_or(Error::UnsupportedArch { major, minor })?;
        let module = ctx.load_module(Ptx::from_src(src))?;
        let f = |name: &str| module.load_function(name);
        let kernels = Kernels {
            sampling_f32: f("sampling_from_logits_f32")?,
            sampling_bf16: f("sampling_from_logits_bf16")?,
            sampling_seeded_f32: f("sampling_from_logits_seeded_f32")?,
            sampling_seeded_bf16: f("sampling_from_logits_seeded_bf16")?,
            softmax_stats_f32: f("softmax_stats_f32")?,
            softmax_write_f32: f("softmax_write_f32")?,
            gumbel_probe: f("gumbel_filter_error_probe")?,
            read_probe: f("read_bandwidth_probe")?,
            fused_bf16: [
                f("fused_sample_bf16_b16")?,
                f("fused_sample_bf16_b32")?,
                f("fused_sample_bf16_b64")?,
                f("fused_sample_bf16_b128")?,
            ],
            fused_f16: [
                f("fused_sample_f16_b16")?,
                f("fused_sample_f16_b32")?,
                f("fused_sample_f16_b64")?,
                f("fused_sample_f16_b128")?,
            ],
            fused_finish: f("fused_sample_finish")?,
            topk_topp_stats_f32: f("topk_topp_stats_f32")?,
            topk_topp_plan_f32: f("topk_topp_plan_f32")?,
            topk_topp_filter_f32: f("topk_topp_filter_f32")?,
            topk_topp_mask_f32: f("topk_topp_mask_f32")?,
            topk_topp_apply_f32: f("topk_topp_apply_f32")?,
            topk_topp_sample_f32: f("topk_topp_sample_f32")?,
        };
        crate::fused_lm_head::configure(arch, &kernels.fused_bf16, &kernels.fused_f16)?;
        crate::topk_topp::configure(&kernels.topk_topp_mask_f32, &kernels.topk_topp_sample_f32)?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let smem = SmemPerSm {
            total: ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )? as u32,
            reserved_per_block: ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            )? as u32,
        };
        let dev = Device(Arc::new(Inner {
            ctx,
            arch,
            sm_count,
            smem,
            kernels,
            _module: module,
        }));
        cache.insert(ordinal, dev.clone());
        Ok(dev)
    }

    /// The CUDA context (shared with cudarc users: candle, mistral.rs).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.0.ctx
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.0.ctx.new_stream()?)
    }

    /// The embedded PTX module in use (`"sm_90a"`, `"sm_80"`, ...).
    pub fn arch(&self) -> &'static str {
        self.0.arch
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.0.sm_count
    }

    /// Shared memory of one multiprocessor.
    pub(crate) fn smem_per_sm(&self) -> SmemPerSm {
        self.0.smem
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String> {
        Ok(self.0.ctx.name()?)
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.0.kernels
    }

    /// Checks that `stream` belongs to this device's context.
    pub(crate) fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if Arc::ptr_eq(stream.context(), &self.0.ctx) {
            Ok(())
        } else {
            Err(Error::WrongContext { what: "stream" })
        }
    }

    /// Launches `func` on `stream` through `cuLaunchKernelEx`, after the
    /// stream's previous kernel as usual, or, when `after_pass` and the
    /// module has the `griddepcontrol` instructions (sm_90), with a
    /// programmatic dependency on it: the kernel's blocks may start while
    /// the previous kernel drains and wait for it in `griddepcontrol.wait`,
    /// which hides most of a launch's latency between the passes of one
    /// call.
    ///
    /// # Safety
    /// `args` point to values of the kernel's parameter types, in order;
    /// `cfg` satisfies the kernel's launch contract; with `after_pass`, the
    /// kernel executes `griddepcontrol.wait` before it reads anything the
    /// previous kernel on the stream writes.
    pub(crate) unsafe fn launch_pass(
        &self,
        stream: &CudaStream,
        func: &CudaFunction,
        cfg: LaunchConfig,
        after_pass: bool,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        stream.context().bind_to_thread()?;
        // SAFETY: an all-zero attribute is a valid (ignored) attribute.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let dependent = after_pass && self.0.arch.starts_with("sm_90");
        let launch = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(dependent),
        };
        // SAFETY: the caller's contract; `launch` and `attr` outlive the
        // call.
        unsafe {
            sys::cuLaunchKernelEx(
                &launch,
                func.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()?
        };
        Ok(())
    }
}

/// A kernel parameter's address, as `cuLaunchKernelEx` takes it.
pub(crate) fn kernel_arg<T>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_choice_follows_compute_capability() {
        assert_eq!(arch_for(9, 0).unwrap(), "sm_90a");
        assert_eq!(arch_for(10, 0).unwrap(), "sm_90");
        assert_eq!(arch_for(8, 9).unwrap(), "sm_89");
        assert_eq!(arch_for(8, 6).unwrap(), "sm_80");
        assert!(matches!(
            arch_for(7, 5),
            Err(Error::UnsupportedArch { major: 7, minor: 5 })
        ));
        for (a, _) in ptx::MODULES {
            assert!(["sm_80", "sm_89", "sm_90", "sm_90a"].contains(a));
        }
        // All four unless the build was restricted (the GPU bundle's).
        if option_env!("FLASHSAMPLE_PTX_ARCHES").is_none() {
            assert_eq!(ptx::MODULES.len(), 4);
        }
    }
}
