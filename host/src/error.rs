//! The library's one error type.

use cudarc::driver::DriverError;

/// Everything that can go wrong in a flashsample call. Wrong arguments are
/// reported before any launch; nothing panics on user input.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CUDA driver library (`libcuda.so`) could not be loaded.
    #[error("no CUDA driver library (libcuda) found on this machine")]
    NoDriver,
    /// The cuBLAS library (used by the unfused reference pipeline) could not
    /// be loaded.
    #[error("no cuBLAS library found (put CUDA's lib64 on LD_LIBRARY_PATH)")]
    NoCublas,
    /// A cuBLAS call failed.
    #[error("cuBLAS error: {0:?}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    /// The driver loaded but has no device with this ordinal.
    #[error("no CUDA device with ordinal {ordinal} ({count} present)")]
    NoDevice { ordinal: usize, count: usize },
    /// The GPU is older than the oldest embedded PTX target (sm_80).
    #[error("unsupported GPU: compute capability {major}.{minor}; flashsample needs 8.0 or newer")]
    UnsupportedArch { major: i32, minor: i32 },
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    /// A tensor or buffer has the wrong size or shape.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        what: &'static str,
        expected: String,
        got: String,
    },
    /// A parameter is outside its domain.
    #[error("invalid parameter {name} = {value}")]
    InvalidParam { name: &'static str, value: String },
    /// A CPU reference-backend call was given wrong arguments.
    #[error(transparent)]
    Reference(#[from] crate::reference::ReferenceError),
    /// A buffer does not belong to the device or stream it is used with.
    #[error("{what} belongs to another CUDA context")]
    WrongContext { what: &'static str },
    /// A GPU of a peer-to-peer group cannot map another's memory.
    #[error("GPU {from} cannot access the memory of GPU {to} (no peer-to-peer path)")]
    NoPeerAccess { from: usize, to: usize },
    /// An NCCL call failed.
    #[error("NCCL error: {:?}", .0.0)]
    Nccl(cudarc::nccl::result::NcclError),
}

/// `Result` with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn shape(what: &'static str, expected: impl ToString, got: impl ToString) -> Error {
    Error::Shape {
        what,
        expected: expected.to_string(),
        got: got.to_string(),
    }
}

pub(crate) fn param(name: &'static str, value: impl std::fmt::Debug) -> Error {
    Error::InvalidParam {
        name,
        value: format!("{value:?}"),
    }
}
