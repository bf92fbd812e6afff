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

/// Resident blocks per multiprocessor the sampling kernels are built for
/// (their launch bounds) and the host's split fills: 4 blocks of 64
/// registers. (3 blocks of 80 registers with two Philox chains in lockstep
/// measured 10 % slower: the lost warps cost more than the gained overlap.)
pub const SAMPLING_BLOCKS_PER_SM: u32 = 4;

const _: () = assert!(core::mem::size_of::<RowSplit>() == 24);
const _: () = assert!(core::mem::align_of::<RowSplit>() == 8);

/// Parameters of the fused LM-head sampler (`fused_sample_*`): logits
/// `hidden [batch, dim] . lm_head[vocab, dim]^T (+ bias)`, never stored.
///
/// The same launch serves a vocabulary shard (tensor parallelism): row `i`
/// of `lm_head` (and of `bias`) is token `vocab_offset + i` of the full
/// vocabulary, which the noise and the sampled key use. Tiles follow the
/// full vocabulary's grid: tile `t` of the launch covers tokens
/// `[(vocab_offset / FUSED_BLOCK_V + t) * FUSED_BLOCK_V, + FUSED_BLOCK_V)`,
/// tokens outside the shard count as absent, and its partial is the row's
/// part `part_offset + t`. Unsharded: `vocab_offset = 0`,
/// `part_offset = 0`, `parts = tiles`, `peers = 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusedParams {
    /// Rows of `hidden`.
    pub batch: u32,
    /// Rows of the LM head (of the shard).
    pub vocab: u32,
    /// Hidden size, a multiple of 8.
    pub dim: u32,
    /// Vocabulary tiles of this launch: those of the full vocabulary's grid
    /// that meet `[vocab_offset, vocab_offset + vocab)`.
    pub tiles: u32,
    /// Elements between consecutive rows of `hidden` (>= `dim`, a multiple
    /// of 8).
    pub hidden_stride: u64,
    /// 1 when a bias `[vocab]` (f32) is added to the logits.
    pub has_bias: u32,
    /// Index in the full vocabulary of the LM head's row 0.
    pub vocab_offset: u32,
    /// Part (partial position in a row) of this launch's first tile.
    pub part_offset: u32,
    /// Parts per row over all shards: what `fused_sample_finish` folds.
    pub parts: u32,
    /// Peer partial buffers the launch also writes (peer-to-peer exchange):
    /// the length of the kernel's `peer_partial` table.
    pub peers: u32,
    /// Reserved, 0.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<FusedParams>() == 48);
const _: () = assert!(core::mem::align_of::<FusedParams>() == 8);

/// Vocabulary rows per tile of the fused sampler (eight warps of 16).
pub const FUSED_BLOCK_V: u32 = 128;
/// Hidden-dimension elements per pipeline stage.
pub const FUSED_BLOCK_K: u32 = 64;
/// Pipeline stages (`cp.async` groups in flight: `FUSED_STAGES - 1`).
pub const FUSED_STAGES: u32 = 3;
/// Threads per block of the fused sampler.
pub const FUSED_THREADS: u32 = 256;
/// Words of one row of the logits staging tile (padded against bank
/// conflicts).
pub const FUSED_CS_STRIDE: u32 = FUSED_BLOCK_V + 4;
/// u64 words per (row, part) partial: best key, base-2 log-sum-exp
/// `(max, sum)`, scaled logit of the best token. Partials are stored part
/// major: that of (row, part) at word `(part * batch + row) *
/// FUSED_PARTIAL_WORDS`, so a shard's parts form one contiguous range.
pub const FUSED_PARTIAL_WORDS: u32 = 3;

/// Bytes of one pipeline stage for a batch tile of `block_b` rows.
pub const fn fused_stage_bytes(block_b: u32) -> u32 {
    (FUSED_BLOCK_V + block_b) * FUSED_BLOCK_K * 2
}

/// Dynamic shared memory of `fused_sample_*_b{block_b}`.
pub const fn fused_smem_bytes(block_b: u32) -> u32 {
    FUSED_STAGES * fused_stage_bytes(block_b) + block_b * FUSED_CS_STRIDE * 4
}

/// Candidates of the top-k/top-p kernels (`topk_topp_*`) compacted into
/// shared memory after the pre-filter: per warp of [`ROW_THREADS`], a
/// segment of this many (key, index) pairs.
pub const TOPK_TOPP_SEGMENT: u32 = 2048;

/// Dynamic shared memory of the `topk_topp_*` kernels: 1 KiB of reduction
/// slots, the candidate segments (8 bytes a candidate) and one count per
/// warp.
pub const TOPK_TOPP_SMEM_BYTES: u32 = 1024 + (ROW_THREADS / 32) * TOPK_TOPP_SEGMENT * 8 + 64;
