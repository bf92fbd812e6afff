//! The plain two-step pipeline the fused sampler replaces: cuBLAS writes the
//! `[batch, vocab]` logits, then [`Device::sampling_from_logits`] samples
//! them. It is the fused kernel's reference in tests and benches (same
//! noise, same tie rule), and a usable fallback.

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::fused_lm_head::{HeadElem, HeadShape};
use crate::rows::{RowParams, Rows};
use crate::sampling::{SampleOutput, Workspace};

/// cuBLAS logits (f32 or the input's 16-bit type) plus the library's
/// sampler. Holds the cuBLAS handle (bound to one stream) and the logits
/// buffer.
#[derive(Debug)]
pub struct Unfused {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    logits: CudaSlice<f32>,
}

impl Unfused {
    /// A cuBLAS handle on `stream`; fails with [`Error::NoCublas`] when the
    /// cuBLAS library cannot be loaded.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Unfused> {
        // SAFETY: only tries to dlopen cuBLAS by its usual names (cudarc
        // panics on first use when it is missing).
        if !unsafe { blas_sys::is_culib_present() } {
            return Err(Error::NoCublas);
        }
        Ok(Unfused {
            blas: CudaBlas::new(stream.clone())?,
            stream: stream.clone(),
            logits: stream.alloc_zeros(1)?,
        })
    }

    /// `logits[b, v] = hidden[b] . lm_head[v]` in f32 (f32 accumulation) into
    /// the internal buffer, returned as a view of `batch * vocab` values.
    pub fn logits<T: HeadElem>(
        &mut self,
        hidden: &CudaView<'_, T>,
        lm_head: &CudaView<'_, T>,
        shape: HeadShape,
    ) -> Result<CudaView<'_, f32>> {
        shape.validate(hidden.len(), lm_head.len(), None)?;
        let n = shape.batch * shape.vocab;
        if self.logits.len() < n {
            self.logits = self.stream.alloc_zeros(n)?;
        }
        let (c, _g) = self.logits.device_ptr_mut(&self.stream);
        gemm_into(
            &self.blas,
            &self.stream,
            hidden,
            lm_head,
            shape,
            blas_sys::cudaDataType_t::CUDA_R_32F,
            c,
        )?;
        drop(_g);
        Ok(self.logits.slice(..n))
    }

    /// The cuBLAS product alone with a 16-bit output like the inputs' (what
    /// `h @ W.T` costs in a framework): the bench's matmul reference.
    /// `out` holds `batch * vocab` elements.
    pub fn matmul_16bit<T: HeadElem>(
        &mut self,
        hidden: &CudaView<'_, T>,
        lm_head: &CudaView<'_, T>,
        shape: HeadShape,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        shape.validate(hidden.len(), lm_head.len(), None)?;
        if out.len() < shape.batch * shape.vocab {
            return Err(crate::error::shape(
                "out",
                shape.batch * shape.vocab,
                out.len(),
            ));
        }
        let (c, _g) = out.device_ptr_mut(&self.stream);
        gemm_into(
            &self.blas,
            &self.stream,
            hidden,
            lm_head,
            shape,
            elem_type::<T>(),
            c,
        )
    }

    /// cuBLAS f32 logits, then [`Device::sampling_from_logits`].
    #[allow(clippy::too_many_arguments)]
    pub fn sample<T: HeadElem>(
        &mut self,
        device: &Device,
        hidden: &CudaView<'_, T>,
        lm_head: &CudaView<'_, T>,
        shape: HeadShape,
        params: &RowParams,
        out: &mut SampleOutput,
        ws: &mut Workspace,
    ) -> Result<()> {
        let stream = self.stream.clone();
        let logits = self.logits(hidden, lm_head, shape)?;
        device.sampling_from_logits(
            &stream,
            &logits,
            Rows::contiguous(shape.batch, shape.vocab),
            params,
            out,
            ws,
        )
    }
}

fn elem_type<T: HeadElem>() -> blas_sys::cudaDataType_t {
    if T::IS_BF16 {
        blas_sys::cudaDataType_t::CUDA_R_16BF
    } else {
        blas_sys::cudaDataType_t::CUDA_R_16F
    }
}

/// Column-major view: `C[vocab, batch] = W^T(as [dim, vocab])^T . H([dim,
/// batch])`, i.e. row-major `logits[batch, vocab]`.
#[allow(clippy::too_many_arguments)]
fn gemm_into<T: HeadElem>(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    hidden: &CudaView<'_, T>,
    lm_head: &CudaView<'_, T>,
    shape: HeadShape,
    out_type: blas_sys::cudaDataType_t,
    c: u64,
) -> Result<()> {
    let to_int =
        |name: &'static str, v: usize| i32::try_from(v).map_err(|_| crate::error::param(name, v));
    let (m, n, k) = (
        to_int("vocab", shape.vocab)?,
        to_int("batch", shape.batch)?,
        to_int("dim", shape.dim)?,
    );
    let ldb = to_int("hidden_stride", shape.hidden_stride)?;
    let (h, _g1) = hidden.device_ptr(stream);
    let (w, _g2) = lm_head.device_ptr(stream);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let t = elem_type::<T>();
    // SAFETY: shapes and lengths were validated (lm_head holds vocab *
    // dim, hidden batch rows of hidden_stride, c batch * vocab elements of
    // out_type); the handle is bound to the stream the buffers use.
    unsafe {
        blas::gemm_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            (&alpha) as *const f32 as *const _,
            w as *const _,
            t,
            k,
            h as *const _,
            t,
            ldb,
            (&beta) as *const f32 as *const _,
            c as *mut _,
            out_type,
            m,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}
