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
/// (their launch bounds): 4 blocks of at most 64 registers, their next
/// rounds staged in shared memory ([`SAMPLING_STAGES`]); 3 to 13 % faster
/// than 3 blocks of 80 registers holding the next round in registers from
/// B = 512 up (H200, session 15), up to 4 % slower at B <= 128. (Earlier:
/// eight vectors a round measured 20 to 40 % slower, and two Philox chains
/// in lockstep 10 % slower.)
pub const SAMPLING_BLOCKS_PER_SM: u32 = 4;

/// Resident blocks per multiprocessor the wide sampling kernels
/// (`sampling_from_logits_wide_*`) are built for; the host gives them the
/// grids of multi-round blocks that fit in one wave of the seeded kernels
/// ([`SAMPLING_BLOCKS_PER_SM`] a multiprocessor), where few warps a
/// scheduler leave a single Philox chain latency-bound. Their threads make
/// four groups' Philox calls at a time in up to 128 registers.
pub const SAMPLING_WIDE_BLOCKS_PER_SM: u32 = 2;

/// 16-byte vectors a thread of the sampling kernels loads a round.
pub const SAMPLING_ROUND_VECTORS: u32 = 4;

/// Rounds of the sampling kernels' loads a block stages in shared memory
/// (`cp.async`, each thread into its own slots): the round being visited
/// and `SAMPLING_STAGES - 1` ahead of it, in flight without holding
/// registers.
pub const SAMPLING_STAGES: u32 = 3;

/// Bytes of the sampling kernels' shared words before their stages (the
/// block's maxima and running score; see `row_launch` on the host).
pub const SAMPLING_STAGE_OFFSET: u32 = 256;

/// Dynamic shared memory of a sampling launch: the small words, then
/// [`SAMPLING_STAGES`] rounds of every thread's vectors.
pub const SAMPLING_SMEM_BYTES: u32 =
    SAMPLING_STAGE_OFFSET + SAMPLING_STAGES * SAMPLING_ROUND_VECTORS * ROW_THREADS * 16;
const _: () = assert!((2 * ROW_THREADS / 32 + 2) * 8 <= SAMPLING_STAGE_OFFSET);

/// Whether a sampling launch whose blocks take `chunk` elements of
/// `elem_bytes` bytes uses the seeded kernels (`sampling_from_logits_seeded_*`):
/// blocks of more than one round.
pub const fn sampling_seeded(chunk: u32, elem_bytes: u32) -> bool {
    chunk as u64 * elem_bytes as u64 > (SAMPLING_ROUND_VECTORS * ROW_THREADS * 16) as u64
}

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

/// Vocabulary rows per tile of the fused sampler (eight warps of 16): the
/// unit of its parts (one partial per row and tile), whatever the batch
/// tile.
pub const FUSED_BLOCK_V: u32 = 128;
/// Hidden-dimension elements per pipeline stage.
pub const FUSED_BLOCK_K: u32 = 64;
/// Vocabulary tiles one step of `fused_sample_*_b{block_b}` computes (each
/// warp's 16 rows in every one of them): 1 for batch tiles of up to 32
/// rows, 2 above. Two tiles per step read the batch tile's hidden states
/// from L2 half as often per LM-head row and load each of their B
/// fragments once for two A fragments; at 64 rows and more, re-reading the
/// hidden states per 128-row tile and 2.5 KiB of `ldmatrix` per eight
/// `mma` kept the kernel at about 5.5 TB/s of L2 traffic, 2.2 to 3.2 x
/// cuBLAS.
pub const fn fused_mtiles(block_b: u32) -> u32 {
    if block_b <= 32 { 1 } else { 2 }
}
/// Pipeline stages of `fused_sample_*_b{block_b}` (`cp.async` groups in
/// flight: one fewer): for batch tiles of 16 / 32 rows, as many as leave
/// two blocks per SM in shared memory (5 / 4: 99 / 98 KiB), so that small
/// batches, which only stream the LM head, keep 128 / 96 KiB of it in
/// flight per SM instead of 64; for 64 / 128 rows (two tiles a step, one
/// block per SM) 4 (161 / 193 KiB; 3 was no faster at 128 rows).
pub const fn fused_stages(block_b: u32) -> u32 {
    if block_b <= 16 { 5 } else { 4 }
}
/// Threads per block of `fused_sample_*_b{block_b}`: groups of eight
/// warps, each group covering every vocabulary row of a step and its share
/// of the batch tile. One group for one tile a step; two for two (16
/// warps, one block per SM: at eight, the tensor pipes idled about half
/// the time on the fixed latency between dependent `mma`s and on the
/// epilogue).
pub const fn fused_threads(block_b: u32) -> u32 {
    256 * fused_mtiles(block_b)
}
/// Resident blocks per SM `fused_sample_*_b{block_b}`'s registers are
/// fitted to (its launch bounds): two for one tile a step (at most 128
/// registers), one for two tiles a step (their accumulators alone take 64
/// or 128 registers; shared memory holds one block anyway).
pub const fn fused_blocks_per_sm(block_b: u32) -> u32 {
    if fused_mtiles(block_b) == 1 { 2 } else { 1 }
}
/// Largest `dim` and `hidden_stride` (elements) of the fused sampler: it
/// forms the offsets of its copies inside a step's tiles in 32 bits,
/// `2 * FUSED_BLOCK_V * stride + dim < 2^32`.
pub const FUSED_MAX_STRIDE: u32 = 1 << 23;
const _: () = assert!((2 * FUSED_BLOCK_V as u64 + 1) * FUSED_MAX_STRIDE as u64 <= u32::MAX as u64);
// Shared memory per SM of sm_90 is 228 KiB, 1 KiB of it reserved per block.
const _: () = assert!(2 * (fused_smem_bytes(16) + 1024) <= 228 * 1024);
const _: () = assert!(2 * (fused_smem_bytes(32) + 1024) <= 228 * 1024);
const _: () = assert!(fused_smem_bytes(64) + 1024 <= 228 * 1024);
const _: () = assert!(fused_smem_bytes(128) + 1024 <= 228 * 1024);
/// Words of one row of the logits staging tile (padded against bank
/// conflicts).
pub const FUSED_CS_STRIDE: u32 = FUSED_BLOCK_V + 4;
/// u64 words per (row, part) partial: best key, base-2 log-sum-exp
/// `(max, sum)`, scaled logit of the best token. Partials are stored part
/// major: that of (row, part) at word `(part * batch + row) *
/// FUSED_PARTIAL_WORDS`, so a shard's parts form one contiguous range.
pub const FUSED_PARTIAL_WORDS: u32 = 3;

/// Bytes of one pipeline stage for a batch tile of `block_b` rows: the
/// step's LM-head rows, then the batch tile's hidden-state rows.
pub const fn fused_stage_bytes(block_b: u32) -> u32 {
    (FUSED_BLOCK_V * fused_mtiles(block_b) + block_b) * FUSED_BLOCK_K * 2
}

/// Pipeline stages of the warp-specialised fused kernels (sm_90a, batch
/// tiles of 64 and 128 rows): a producer warp keeps every stage the
/// consumers have released loading through the bulk copy engine, during
/// the epilogue too (both kernels stage their logits beside the ring).
pub const FUSED_WS_STAGES: u32 = 4;
/// Consumer threads of the warp-specialised fused kernels: 16 warps (four
/// warpgroups issuing `wgmma`): at 64 rows one group over two tiles a step,
/// at 128 rows two groups of eight warps taking turns (see
/// [`fused_ws_step_tiles`]).
pub const FUSED_WS_CONSUMERS: u32 = 512;
/// Threads of the warp-specialised fused kernels: the consumers and a
/// producer warpgroup (registers move between warpgroups, `setmaxnreg`;
/// one thread of it issues the copies). With 20 warps, five a scheduler,
/// a block starts at 96 registers a thread; the producer keeps
/// [`FUSED_WS_PRODUCER_REGS`] and the consumers take
/// [`FUSED_WS_CONSUMER_REGS`] (the block holds 640 x 96 registers: 128 x 24 + 512 x 112 of them).
pub const FUSED_WS_THREADS: u32 = FUSED_WS_CONSUMERS + 128;
/// Registers a thread of the producer warpgroup keeps.
pub const FUSED_WS_PRODUCER_REGS: u32 = 24;
/// Registers a consumer thread takes.
pub const FUSED_WS_CONSUMER_REGS: u32 = 112;

/// Whether `fused_sample_*_b{block_b}` is warp-specialised on sm_90a
/// (batch tiles of 64 and 128 rows).
pub const fn fused_ws(block_b: u32) -> bool {
    fused_mtiles(block_b) == 2
}

/// Vocabulary tiles a step of the warp-specialised
/// `fused_sample_*_b{block_b}` (sm_90a): two at 64 rows (all 16 consumer
/// warps on one step, both tiles staged at once beside the ring); one at
/// 128 rows, where two groups of eight warps take turns (ping-pong): one
/// group's epilogue runs while the other's `wgmma` consume the ring, so
/// the LM head keeps streaming (one group's 128 x 128 accumulators are 64
/// registers a thread, as two tiles' of 64 rows are).
pub const fn fused_ws_step_tiles(block_b: u32) -> u32 {
    if block_b > 64 { 1 } else { 2 }
}

/// Bytes of one ring stage of the warp-specialised
/// `fused_sample_*_b{block_b}`: a k-block of the step's LM-head rows, then
/// of the batch tile's hidden-state rows (128-byte rows, swizzled).
pub const fn fused_ws_stage_bytes(block_b: u32) -> u32 {
    (FUSED_BLOCK_V * fused_ws_step_tiles(block_b) + block_b) * FUSED_BLOCK_K * 2
}

/// Byte offset (from the aligned stages) of the logits staging of the
/// warp-specialised `fused_sample_*_b{block_b}`: after the ring.
pub const fn fused_ws_staging_offset(block_b: u32) -> u32 {
    FUSED_WS_STAGES * fused_ws_stage_bytes(block_b)
}

/// Bytes of the logits staging of the warp-specialised
/// `fused_sample_*_b{block_b}`: a step's tiles, rows of [`FUSED_BLOCK_V`]
/// words (swizzled, unpadded).
pub const fn fused_ws_staging_bytes(block_b: u32) -> u32 {
    fused_ws_step_tiles(block_b) * block_b * FUSED_BLOCK_V * 4
}

/// Byte offset (from the aligned stages) of the `mbarrier`s of the
/// warp-specialised `fused_sample_*_b{block_b}`: a full and an empty one a
/// stage.
pub const fn fused_ws_barrier_offset(block_b: u32) -> u32 {
    fused_ws_staging_offset(block_b) + fused_ws_staging_bytes(block_b)
}

/// Byte offset (from the aligned stages) of the roles' filter words of the
/// warp-specialised `fused_sample_*_b{block_b}`.
pub const fn fused_ws_filter_offset(block_b: u32) -> u32 {
    fused_ws_barrier_offset(block_b) + 16 * FUSED_WS_STAGES
}

/// Bytes of the roles' filter words of the warp-specialised
/// `fused_sample_*_b{block_b}`: one f32 a role, `block_b * 4` roles (four
/// slots a row) for each of two tiles (64 rows: the step's two tiles; 128
/// rows: the two consumer groups' tiles), 512 in all at 64 rows, 1024 at
/// 128.
pub const fn fused_ws_filter_bytes(block_b: u32) -> u32 {
    4 * 2 * 4 * block_b
}

/// Dynamic shared memory of the warp-specialised `fused_sample_*_b{block_b}`
/// (sm_90a; its base is 1024-byte aligned): the ring, the staging, the
/// barriers and the roles' filter words.
pub const fn fused_ws_smem_bytes(block_b: u32) -> u32 {
    fused_ws_filter_offset(block_b) + fused_ws_filter_bytes(block_b)
}
// The warp-specialised kernels' layout: every stage starts 1024-byte
// aligned (the 128-byte swizzle of the copies and descriptors) and the
// barriers after the ring and staging 8-byte aligned.
const _: () = assert!(fused_ws_stage_bytes(64).is_multiple_of(1024));
const _: () = assert!(fused_ws_stage_bytes(128).is_multiple_of(1024));
const _: () = assert!(fused_ws_barrier_offset(64).is_multiple_of(8));
const _: () = assert!(fused_ws_barrier_offset(128).is_multiple_of(8));
const _: () = assert!(fused_ws_smem_bytes(64) <= 227 * 1024);
const _: () = assert!(fused_ws_smem_bytes(128) <= 227 * 1024);
const _: () = assert!(fused_ws_filter_bytes(64) == FUSED_FILTER_BYTES);

/// A CUDA tensor map (`CUtensorMap`: 128 opaque bytes) passed by value to
/// the warp-specialised fused kernels, whose copy engine reads it in
/// parameter space, 64-byte aligned: rustc's kernel ABI takes at most
/// 16-byte alignment, so the PTX build raises these parameters' (see
/// `TENSOR_MAP_PARAMS`).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct TensorMap(pub [u64; 16]);

/// Bytes of the logits staging tile of one vocabulary tile.
pub const fn fused_staging_bytes(block_b: u32) -> u32 {
    block_b * FUSED_CS_STRIDE * 4
}

/// Dynamic shared memory of `fused_sample_*_b{block_b}`: one tile a step
/// stages its logits after the pipeline stages (the next step's copies
/// fill the stages during the epilogue); two tiles a step stage both
/// tiles' logits in the stages, idle until the next step. Both align the
/// stages to 1024 bytes.
pub const fn fused_smem_bytes(block_b: u32) -> u32 {
    // 1024 bytes to align the stages to (wgmma's swizzle).
    1024 + fused_filter_offset(block_b) + FUSED_FILTER_BYTES
}

/// Byte offset (from the aligned stages) of the epilogue roles' filter
/// words of `fused_sample_*_b{block_b}`: after the stages and the staging
/// tile.
pub const fn fused_filter_offset(block_b: u32) -> u32 {
    let stages = fused_stages(block_b) * fused_stage_bytes(block_b);
    let staged =
        fused_staging_offset(block_b) + fused_mtiles(block_b) * fused_staging_bytes(block_b);
    if stages > staged { stages } else { staged }
}

/// Byte offset (from the aligned stages) of the logits staging of
/// `fused_sample_*_b{block_b}`: after the stages for one tile a step (the
/// next step's copies fill them during the epilogue); in the stages, idle
/// until the next step, for two.
pub const fn fused_staging_offset(block_b: u32) -> u32 {
    if fused_mtiles(block_b) == 1 {
        fused_stages(block_b) * fused_stage_bytes(block_b)
    } else {
        0
    }
}

/// Bytes of the epilogue roles' filter words (one f32 a role, at most 512
/// roles a block): each role's race filter, carried from one step of the
/// block to the next.
pub const FUSED_FILTER_BYTES: u32 = 4 * 512;

/// Threads of a block of the 16-bit <-> f32 row copies (`widen_rows_*`,
/// `narrow_rows_*`).
pub const CONVERT_THREADS: u32 = 256;
/// Elements each thread of a row copy converts: a block covers
/// `CONVERT_THREADS * CONVERT_PER_THREAD` elements of a row.
pub const CONVERT_PER_THREAD: u32 = 4;

/// Elements of a row one block of the chunked `topk_topp_*` passes
/// (statistics, pre-filter, masking) covers: eight 16-byte loads per thread
/// of [`ROW_THREADS`]. A row of V elements has `ceil(V / 8192)` chunks,
/// fixed by V alone, so the order of every partial sum (and so every
/// result bit) depends on the row and never on the batch.
pub const TOPK_TOPP_CHUNK: u32 = 8 * 4 * ROW_THREADS;

/// Pre-filter candidates a row's selection block holds in shared memory
/// (8 bytes each); each chunk may list `TOPK_TOPP_LIST_CAP / chunks` of
/// them (at least [`TOPK_TOPP_CHUNK_LIST_MIN`]), and a row whose
/// candidates do not fit is selected from the row itself (correct,
/// slower).
pub const TOPK_TOPP_LIST_CAP: u32 = 8192;

/// Candidates a chunk may list at least (the lists of a row may then hold
/// more than [`TOPK_TOPP_LIST_CAP`] in all; the selection uses them when
/// they add up to at most that). Real logits crowd their candidates into a
/// few chunks (the tokenizer's frequent tokens sit together): on the
/// SmolLM2 corpus at k = 1000 the fullest chunk holds up to 783 of about
/// 3000, which an even split of 8192 (512 a chunk at V = 128256) sent to
/// the row path in two rows of three. About 1 byte of workspace per logit.
pub const TOPK_TOPP_CHUNK_LIST_MIN: u32 = 1024;

/// Rows of more chunks than this (V above 2^21) are selected from the row:
/// the selection block keeps an offset per chunk.
pub const TOPK_TOPP_MAX_LISTED_CHUNKS: u32 = ROW_THREADS;

/// Dynamic shared memory of the selection kernels (`topk_topp_mask_f32`,
/// `topk_topp_sample_f32`): 1 KiB of reduction slots, an offset per chunk
/// (at most [`ROW_THREADS`] chunks) and the candidates.
pub const TOPK_TOPP_SMEM_BYTES: u32 = 1024 + ROW_THREADS * 4 + TOPK_TOPP_LIST_CAP * 8;

/// Dynamic shared memory of the chunked passes: 1 KiB of reduction slots
/// and a bit per element of the chunk (the masking pass's kept set).
pub const TOPK_TOPP_CHUNK_SMEM_BYTES: u32 = 1024 + TOPK_TOPP_CHUNK / 8;

/// Resident blocks per multiprocessor the pre-filter pass
/// (`topk_topp_filter_f32`) is compiled for: it streams the logits, so it
/// needs the warps in flight more than the registers.
pub const TOPK_TOPP_FILTER_BLOCKS_PER_SM: u32 = 4;

/// Resident blocks per multiprocessor the statistics pass
/// (`topk_topp_stats_f32`) is compiled for: it holds its chunk in
/// registers (a key a slot) from its loads to its list.
pub const TOPK_TOPP_STATS_BLOCKS_PER_SM: u32 = 4;

/// Bytes of one chunk's statistics partial (`pivot::RowStats`).
pub const TOPK_TOPP_STATS_SLOT_BYTES: usize = 24;
/// Bytes of one chunk's pre-filter tiers partial (three count, key range
/// and mass groups).
pub const TOPK_TOPP_TIERS_SLOT_BYTES: usize = 72;
/// Bytes of one row's plan as the pre-filter and selection passes read it.
pub const TOPK_TOPP_PLAN_SLOT_BYTES: usize = 56;

/// Where the `topk_topp_*` kernels keep their per-call state in the
/// workspace, in 8-byte words: per (row, chunk) a statistics partial, a
/// tiers partial, a candidate count, a list of up to `cap` candidates
/// (key in the low half, index in the high half), a kept count and a chunk
/// floor; per row the cut and the plan.
/// Host and kernels compute the same layout from (batch, vocab).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopkToppLayout {
    /// Chunks per row.
    pub chunks: u32,
    /// Candidates each chunk's list holds.
    pub cap: u32,
    pub stats: usize,
    pub tiers: usize,
    pub counts: usize,
    pub lists: usize,
    /// Per (row, chunk): the chunk's kept count (u32; the kept-set passes).
    pub kept_counts: usize,
    /// Per (row, chunk): the floor of the chunk's list from the statistics
    /// pass (u32: `crate::cover`).
    pub floors: usize,
    /// Per row: `[key, index_end, mode, mass]` as u32 (mode 1: the masking
    /// pass works from the lists, 0: from the row; mass: the kept weights'
    /// sum as f32 bits when the selection was asked for it, else 0).
    pub cuts: usize,
    /// Per row: the pre-filter's thresholds and weights.
    pub plans: usize,
    /// Words in all.
    pub words: usize,
}

impl TopkToppLayout {
    /// The layout for `batch` rows of `vocab >= 1` elements.
    pub const fn new(batch: u32, vocab: u32) -> TopkToppLayout {
        let chunks = vocab.div_ceil(TOPK_TOPP_CHUNK);
        let chunks = if chunks == 0 { 1 } else { chunks };
        let cap = if chunks > TOPK_TOPP_MAX_LISTED_CHUNKS {
            0
        } else if TOPK_TOPP_LIST_CAP / chunks > TOPK_TOPP_CHUNK_LIST_MIN {
            TOPK_TOPP_LIST_CAP / chunks
        } else {
            TOPK_TOPP_CHUNK_LIST_MIN
        };
        let slots = batch as usize * chunks as usize;
        let stats = 0;
        let tiers = stats + slots * TOPK_TOPP_STATS_SLOT_BYTES / 8;
        let counts = tiers + slots * TOPK_TOPP_TIERS_SLOT_BYTES / 8;
        let lists = counts + slots.div_ceil(2);
        let kept_counts = lists + slots * cap as usize;
        let floors = kept_counts + slots.div_ceil(2);
        let cuts = floors + slots.div_ceil(2);
        TopkToppLayout {
            chunks,
            cap,
            stats,
            tiers,
            counts,
            lists,
            kept_counts,
            floors,
            cuts,
            plans: cuts + 2 * batch as usize,
            words: cuts + 2 * batch as usize + batch as usize * TOPK_TOPP_PLAN_SLOT_BYTES / 8,
        }
    }
}
