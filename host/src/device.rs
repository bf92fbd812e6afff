//! A GPU: its CUDA context, the PTX module chosen for its compute capability
//! (loaded once per process and device), and its kernels.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, sys};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result, param};
use crate::ptx;
use crate::topk_topp::TopkToppCaps;

/// The kernels of one loaded module.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub sampling_f32: CudaFunction,
    pub sampling_bf16: CudaFunction,
    pub sampling_seeded_f32: CudaFunction,
    pub sampling_seeded_bf16: CudaFunction,
    pub sampling_wide_f32: CudaFunction,
    pub sampling_wide_bf16: CudaFunction,
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
    pub topk_topp_stats_listed_f32: CudaFunction,
    pub topk_topp_plan_f32: CudaFunction,
    pub topk_topp_plan_listed_f32: CudaFunction,
    pub topk_topp_filter_f32: CudaFunction,
    pub topk_topp_filter_grouped_f32: CudaFunction,
    pub topk_topp_mask_f32: CudaFunction,
    pub topk_topp_mask_listed_f32: CudaFunction,
    pub topk_topp_apply_f32: CudaFunction,
    pub topk_topp_renorm_f32: CudaFunction,
    pub topk_topp_kept_count_f32: CudaFunction,
    pub topk_topp_kept_write_f32: CudaFunction,
    pub widen_rows_bf16: CudaFunction,
    pub widen_rows_f16: CudaFunction,
    pub narrow_rows_bf16: CudaFunction,
    pub narrow_rows_f16: CudaFunction,
    pub topk_topp_sample_f32: CudaFunction,
    pub topk_topp_sample_listed_f32: CudaFunction,
    pub topk_topp_cluster_mask_f32: CudaFunction,
    pub topk_topp_cluster_sample_f32: CudaFunction,
    pub topk_topp_slab_mask_f32: CudaFunction,
    pub topk_topp_slab_apply_f32: CudaFunction,
    pub topk_topp_slab_sample_f32: CudaFunction,
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
    topk_topp: TopkToppCaps,
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

/// Whether the embedded module `arch` runs on a GPU of compute capability
/// `major.minor`: `sm_90a` on 9.0 only, `sm_XY` on X.Y and newer.
pub fn module_runs_on(arch: &str, major: i32, minor: i32) -> bool {
    if arch == "sm_90a" {
        return (major, minor) == (9, 0);
    }
    arch.strip_prefix("sm_")
        .and_then(|cc| cc.parse::<i32>().ok())
        .is_some_and(|cc| major * 10 + minor >= cc)
}

impl Device {
    /// Opens GPU `ordinal` (0 for the first). Errors, never panics, when
    /// there is no driver, no such device, or the GPU is too old.
    pub fn new(ordinal: usize) -> Result<Device> {
        Device::open(ordinal, None)
    }

    /// Opens GPU `ordinal` with the embedded PTX module `arch` (one of
    /// [`Device::modules`]) instead of the one its compute capability picks
    /// ([`arch_for`]): on a Hopper GPU, `"sm_90"` runs the kernels and
    /// routes of newer GPUs (no `wgmma`) and `"sm_80"` those of Ampere (no
    /// clusters), which is how the GPU tests cover them. Errors when the
    /// module is not embedded or does not run on the GPU
    /// ([`module_runs_on`]).
    ///
    /// ```no_run
    /// let dev = flashsample::Device::with_module(0, "sm_80")?;
    /// assert_eq!(dev.arch(), "sm_80");
    /// # Ok::<(), flashsample::Error>(())
    /// ```
    pub fn with_module(ordinal: usize, arch: &str) -> Result<Device> {
        Device::open(ordinal, Some(arch))
    }

    /// The embedded PTX modules, by architecture (all four unless the build
    /// was restricted with `FLASHSAMPLE_PTX_ARCHES`, as the GPU bundle's).
    pub fn modules() -> impl Iterator<Item = &'static str> {
        ptx::MODULES.iter().map(|(a, _)| *a)
    }

    fn open(ordinal: usize, module: Option<&str>) -> Result<Device> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        /// Opened devices by ordinal and requested module (`None`: the
        /// compute capability's).
        type Opened = Mutex<HashMap<(usize, Option<String>), Device>>;
        static CACHE: OnceLock<Opened> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        let key = (ordinal, module.map(str::to_string));
        if let Some(d) = cache.get(&key) {
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
        // The compute capability's own module always runs on it.
        let wanted = match module {
            Some(m) => m,
            None => arch_for(major, minor)?,
        };
        let (arch, src) = ptx::MODULES
            .iter()
            .find(|(a, _)| *a == wanted && module_runs_on(a, major, minor))
            .copied()
            .ok_or_else(|| match module {
                None => Error::UnsupportedArch { major, minor },
                Some(m) => {
                    let embedded: Vec<_> = Device::modules().collect();
                    param(
                        "arch",
                        format_args!("{m} (embedded: {embedded:?}; GPU {major}.{minor})"),
                    )
                }
            })?;
        let module = ctx.load_module(Ptx::from_src(src))?;
        let f = |name: &str| module.load_function(name);
        let kernels = Kernels {
            sampling_f32: f("sampling_from_logits_f32")?,
            sampling_bf16: f("sampling_from_logits_bf16")?,
            sampling_seeded_f32: f("sampling_from_logits_seeded_f32")?,
            sampling_seeded_bf16: f("sampling_from_logits_seeded_bf16")?,
            sampling_wide_f32: f("sampling_from_logits_wide_f32")?,
            sampling_wide_bf16: f("sampling_from_logits_wide_bf16")?,
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
            topk_topp_stats_listed_f32: f("topk_topp_stats_listed_f32")?,
            topk_topp_plan_f32: f("topk_topp_plan_f32")?,
            topk_topp_plan_listed_f32: f("topk_topp_plan_listed_f32")?,
            topk_topp_filter_f32: f("topk_topp_filter_f32")?,
            topk_topp_filter_grouped_f32: f("topk_topp_filter_grouped_f32")?,
            topk_topp_mask_f32: f("topk_topp_mask_f32")?,
            topk_topp_mask_listed_f32: f("topk_topp_mask_listed_f32")?,
            topk_topp_apply_f32: f("topk_topp_apply_f32")?,
            topk_topp_renorm_f32: f("topk_topp_renorm_f32")?,
            topk_topp_kept_count_f32: f("topk_topp_kept_count_f32")?,
            topk_topp_kept_write_f32: f("topk_topp_kept_write_f32")?,
            widen_rows_bf16: f("widen_rows_bf16")?,
            widen_rows_f16: f("widen_rows_f16")?,
            narrow_rows_bf16: f("narrow_rows_bf16")?,
            narrow_rows_f16: f("narrow_rows_f16")?,
            topk_topp_sample_f32: f("topk_topp_sample_f32")?,
            topk_topp_sample_listed_f32: f("topk_topp_sample_listed_f32")?,
            topk_topp_cluster_mask_f32: f("topk_topp_cluster_mask_f32")?,
            topk_topp_cluster_sample_f32: f("topk_topp_cluster_sample_f32")?,
            topk_topp_slab_mask_f32: f("topk_topp_slab_mask_f32")?,
            topk_topp_slab_apply_f32: f("topk_topp_slab_apply_f32")?,
            topk_topp_slab_sample_f32: f("topk_topp_slab_sample_f32")?,
        };
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        crate::sampling::configure(&[
            &kernels.sampling_seeded_f32,
            &kernels.sampling_seeded_bf16,
            &kernels.sampling_wide_f32,
            &kernels.sampling_wide_bf16,
        ])?;
        crate::fused_lm_head::configure(arch, &kernels.fused_bf16, &kernels.fused_f16)?;
        let topk_topp = crate::topk_topp::configure(&ctx, arch, sm_count, &kernels)?;
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
            topk_topp,
            _module: module,
        }));
        cache.insert(key, dev.clone());
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

    /// What the top-k/top-p route planner knows of this GPU.
    pub fn topk_topp_caps(&self) -> TopkToppCaps {
        self.0.topk_topp
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
    /// which hides most of a launch's latency, between the passes of one
    /// call or after whatever kernel the caller ran before (the sampling
    /// kernels: 1 to 2 us a call, session 43).
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
        // SAFETY: an all-zero attribute is a valid (ignored) attribute.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let dependent = after_pass && self.0.arch.starts_with("sm_90");
        let attrs = if dependent {
            std::slice::from_mut(&mut attr)
        } else {
            &mut []
        };
        // SAFETY: the caller's contract.
        unsafe { launch_ex(stream, func.cu_function(), cfg, attrs, args) }
    }

    /// Launches `func` on `stream` in thread block clusters of `ctas`
    /// blocks along x (the grid's x a multiple of it), after the stream's
    /// previous work as usual.
    ///
    /// # Safety
    /// As [`Device::launch_pass`]; the GPU runs clusters of `ctas` blocks
    /// of `func` with this configuration ([`max_active_clusters`] > 0).
    pub(crate) unsafe fn launch_cluster(
        &self,
        stream: &CudaStream,
        func: &CudaFunction,
        cfg: LaunchConfig,
        ctas: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let mut attr = cluster_attr(ctas);
        // SAFETY: the caller's contract.
        unsafe {
            launch_ex(
                stream,
                func.cu_function(),
                cfg,
                std::slice::from_mut(&mut attr),
                args,
            )
        }
    }
}

/// Launches `func` through `cuLaunchKernelEx` with launch attributes
/// `attrs`.
///
/// # Safety
/// `args` point to values of the kernel's parameter types, in order;
/// `cfg` and `attrs` satisfy the kernel's launch contract.
pub(crate) unsafe fn launch_ex(
    stream: &CudaStream,
    func: sys::CUfunction,
    cfg: LaunchConfig,
    attrs: &mut [sys::CUlaunchAttribute],
    args: &mut [*mut c_void],
) -> Result<()> {
    stream.context().bind_to_thread()?;
    let launch = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: if attrs.is_empty() {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: the caller's contract; `launch` and `attrs` outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(&launch, func, args.as_mut_ptr(), std::ptr::null_mut()).result()?
    };
    Ok(())
}

/// A thread block cluster of `ctas` blocks along x, as a launch attribute.
pub(crate) fn cluster_attr(ctas: u32) -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute is a valid (ignored) attribute.
    let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    a.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: ctas,
        y: 1,
        z: 1,
    };
    a
}

/// Clusters of `ctas` blocks of `threads` threads and `smem` bytes of
/// dynamic shared memory each of `f` that the GPU runs at once (an error
/// where it runs none of that size).
pub(crate) fn max_active_clusters(
    ctx: &Arc<CudaContext>,
    f: sys::CUfunction,
    ctas: u32,
    threads: u32,
    smem: u32,
) -> Result<u32> {
    ctx.bind_to_thread()?;
    let mut attr = cluster_attr(ctas);
    let cfg = sys::CUlaunchConfig {
        gridDimX: ctas,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: std::ptr::null_mut(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    let mut n = 0;
    // SAFETY: a loaded function and a complete configuration.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f, &cfg).result()? };
    Ok(n.max(0) as u32)
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

    #[test]
    fn modules_run_on_their_gpus_and_newer() {
        for (arch, major, minor) in [
            ("sm_80", 8, 0),
            ("sm_80", 8, 6),
            ("sm_80", 9, 0),
            ("sm_89", 8, 9),
            ("sm_89", 9, 0),
            ("sm_90", 9, 0),
            ("sm_90", 10, 0),
            ("sm_90a", 9, 0),
        ] {
            assert!(
                module_runs_on(arch, major, minor),
                "{arch} on {major}.{minor}"
            );
        }
        for (arch, major, minor) in [
            ("sm_89", 8, 6),
            ("sm_90", 8, 9),
            ("sm_90a", 10, 0),
            ("sm_90a", 8, 9),
            ("sm_75", 7, 0),
            ("compute_90", 9, 0),
            ("", 9, 0),
        ] {
            assert!(
                !module_runs_on(arch, major, minor),
                "{arch} on {major}.{minor}"
            );
        }
        // `Device::open` relies on it: the module a GPU picks runs there.
        for (major, minor) in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
            let arch = arch_for(major, minor).unwrap();
            assert!(
                module_runs_on(arch, major, minor),
                "{arch} on {major}.{minor}"
            );
        }
    }
}
