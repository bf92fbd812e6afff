//! Kernel parameter structs: defined once here, passed by value to the
//! kernels and filled by the host, with their layout pinned by `const`
//! asserts.

/// How a `[batch, vocab]` row-major tensor is split over a grid of
/// `(ctas_per_row, batch)` thread blocks: block `(c, r)` owns elements
/// `[c * chunk, min((c + 1) * chunk, vocab))` of row `r`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowSplit {
    /// Rows.
    pub batch: u32,
    /// Elements per row.
    pub vocab: u32,
    /// Elements between the starts of consecutive rows (>= `vocab`).
    pub row_stride: u64,
    /// Thread blocks per row (the grid's x dimension).
    pub ctas_per_row: u32,
    /// Elements per thread block, a multiple of [`CHUNK_ALIGN`].
    pub chunk: u32,
}

/// Chunks are multiples of this many elements, so that a block's first
/// element keeps the row's 16-byte alignment for f32 and bf16 alike.
pub const CHUNK_ALIGN: u32 = 8;

/// Threads per block of the row kernels (sampling, softmax).
pub const ROW_THREADS: u32 = 256;

const _: () = assert!(core::mem::size_of::<RowSplit>() == 24);
const _: () = assert!(core::mem::align_of::<RowSplit>() == 8);
