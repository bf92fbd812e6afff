//! Tensor-parallel fused sampling: an LM head split by vocabulary over N
//! shards, each running the fused kernel on its own rows, exchanging only
//! the per-(row, tile) partials (never logits), and reducing them exactly.
//!
//! Each shard's launch uses the tokens' **global** indices in the Gumbel
//! noise and in the keys, and the full vocabulary's tile grid (see
//! `FusedParams` in the kernels crate), writing its partials into its own
//! parts of a `[parts, batch]` buffer. The exchange fills every rank's
//! buffer with all the parts; the unsharded finishing kernel then folds
//! them. Hence:
//!
//! - **Tokens** (and validity) are those of the unsharded kernel, bit for
//!   bit, for every split and every N: the maximum of exact keys does not
//!   depend on how the vocabulary is partitioned.
//! - **Log-normaliser and log-probability** are bit-identical to the
//!   unsharded kernel's when every shard boundary is a multiple of
//!   [`FUSED_BLOCK_V`] ([`VocabSplit::tile_aligned`]): the parts are then
//!   exactly the unsharded tiles, in the same places. A boundary inside a
//!   tile splits that tile's log-sum-exp over two parts and shifts the
//!   later parts' positions in the finishing tree; only the rounding
//!   changes, within [`VocabSplit::lse_tolerance`].
//! - Every rank gets the same bits: all ranks fold the same buffer with the
//!   same kernel.
//!
//! Exchanges (one [`TpSampler`] API over all three):
//!
//! - [`TpSampler::one_device`]: all N shards on one GPU, each on its own
//!   stream, writing into one buffer; one finish. For tests, and for
//!   engines with one GPU per process that want to exercise their wiring.
//! - [`TpSampler::peer`]: one rank per device (in this process), partials
//!   written by each CTA straight into every peer's buffer through
//!   peer-mapped memory as its tile finishes, overlapping the exchange with
//!   the remaining matmul; each rank then finishes on its own buffer.
//!   Ranks may share a device (then the "peer" writes are local).
//! - [`TpSampler::nccl`]: the caller's NCCL communicators (one per rank
//!   this process drives); each rank's parts are broadcast in place (an
//!   all-gather of uneven pieces, grouped), then each rank finishes.
//!
//! The exchanged bytes are the partials: `batch * tiles_of_the_shard * 24`
//! per rank (for V = 151936, N = 8, B = 64: 224 KiB per rank), against
//! `batch * V / N * 4` for an all-gather of f32 logits (4.6 MiB).

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, result,
};
use cudarc::nccl::Comm;
use cudarc::nccl::result::{group_end, group_start};
use flashsample_kernels::params::{FUSED_BLOCK_V, FUSED_PARTIAL_WORDS, FusedParams};
use flashsample_kernels::sample::MAX_VOCAB;

use crate::device::Device;
use crate::error::{Error, Result, param, shape};
use crate::fused_lm_head::{
    FusedOutput, HeadElem, HeadInput, HeadShape, Shard, Slot, partial_words,
};

/// Most shards a [`VocabSplit`] may have.
pub const MAX_SHARDS: usize = 1024;

/// Whether the NCCL library can be loaded on this machine (cudarc opens
/// `libnccl.so`, or `libnccl.so.N` for N in 13, 12, 11, 10, 9 and 1, not
/// NCCL 2's `libnccl.so.2`: link that as `libnccl.so` on the loader's path):
/// cudarc panics when a communicator is created without it, so check this
/// first.
pub fn nccl_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the NCCL library by its usual names.
    *PRESENT.get_or_init(|| unsafe { cudarc::nccl::sys::is_culib_present() })
}

/// How a vocabulary is split over N shards: shard `r` holds the LM-head
/// rows (tokens) `[bounds[r], bounds[r + 1])`; every shard holds at least
/// one.
///
/// ```
/// use flashsample::VocabSplit;
/// # fn main() -> flashsample::Result<()> {
/// let even = VocabSplit::even(151_936, 3)?;
/// assert_eq!(even.range(1), Some(50_645..101_290));
/// assert!(!even.is_tile_aligned());
/// let aligned = VocabSplit::tile_aligned(151_936, 3)?;
/// assert_eq!(aligned.range(1), Some(50_560..101_248));
/// assert!(aligned.is_tile_aligned());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabSplit {
    bounds: Vec<usize>,
}

impl VocabSplit {
    /// The usual tensor-parallel split: shard `r` holds
    /// `[r * vocab / shards, (r + 1) * vocab / shards)` (uneven when
    /// `shards` does not divide `vocab`).
    pub fn even(vocab: usize, shards: usize) -> Result<VocabSplit> {
        check_shards(vocab, shards)?;
        VocabSplit::from_bounds((0..=shards).map(|r| r * vocab / shards).collect())
    }

    /// Boundaries on the fused kernel's tile grid (multiples of
    /// [`FUSED_BLOCK_V`]), the tiles spread as evenly as possible: the split
    /// under which sharded log-normalisers and log-probabilities are
    /// bit-identical to the unsharded kernel's. Needs at least one tile per
    /// shard.
    pub fn tile_aligned(vocab: usize, shards: usize) -> Result<VocabSplit> {
        check_shards(vocab, shards)?;
        let block = FUSED_BLOCK_V as usize;
        let tiles = vocab.div_ceil(block);
        if tiles < shards {
            return Err(param(
                "shards",
                format_args!("{shards} (only {tiles} tiles of {block} tokens to split)"),
            ));
        }
        let bounds = (0..=shards)
            .map(|r| {
                if r == shards {
                    vocab
                } else {
                    r * tiles / shards * block
                }
            })
            .collect();
        VocabSplit::from_bounds(bounds)
    }

    /// Explicit boundaries: `0 = bounds[0] < bounds[1] < ... < bounds[N] =
    /// vocab`.
    pub fn from_bounds(bounds: Vec<usize>) -> Result<VocabSplit> {
        let (Some(&first), Some(&vocab)) = (bounds.first(), bounds.last()) else {
            return Err(param("bounds", &bounds));
        };
        if bounds.len() < 2 || bounds.len() > MAX_SHARDS + 1 || first != 0 {
            return Err(param(
                "bounds",
                format_args!("{bounds:?} (0, then 1 to {MAX_SHARDS} increasing ends)"),
            ));
        }
        if bounds.windows(2).any(|w| w[0] >= w[1]) {
            return Err(param(
                "bounds",
                format_args!("{bounds:?} (every shard needs at least one token)"),
            ));
        }
        if vocab as u64 > MAX_VOCAB {
            return Err(param("vocab", vocab));
        }
        Ok(VocabSplit { bounds })
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Size of the whole vocabulary.
    pub fn vocab(&self) -> usize {
        self.bounds[self.bounds.len() - 1]
    }

    /// The tokens (LM-head rows) of shard `rank`; `None` past the last.
    pub fn range(&self, rank: usize) -> Option<Range<usize>> {
        Some(*self.bounds.get(rank)?..*self.bounds.get(rank + 1)?)
    }

    /// The boundaries, `0` first and the vocabulary size last.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }

    /// Whether every boundary between shards is a multiple of
    /// [`FUSED_BLOCK_V`] (then log-normalisers are bit-identical to the
    /// unsharded kernel's).
    pub fn is_tile_aligned(&self) -> bool {
        let inner = &self.bounds[1..self.bounds.len() - 1];
        inner
            .iter()
            .all(|b| b.is_multiple_of(FUSED_BLOCK_V as usize))
    }

    /// The largest difference between a finite log-normaliser or
    /// log-probability `x` of the unsharded kernel and the same output of a
    /// sharded call under this split: 0 (the same bits) when the split is
    /// tile aligned, else `(2 D + 1) 2^-21 + 2^-20 |x|`, with `D = 47 +
    /// ceil(parts / 256)` the depth of the log-sum-exp folds (`parts`: the
    /// tiles plus one per boundary inside a tile). Tokens never differ.
    ///
    /// Why: both calls fold the same terms `2^(x_j - m)` in f32 with each
    /// step (an `ex2.approx` rescale, a product, a sum) within 2^-21
    /// relative: 32 sequential pushes and 2 butterfly levels per epilogue
    /// slot, `ceil(parts / 256)` sequential merges per finishing thread, 5
    /// butterfly levels and 8 warp merges; only the trees differ (a boundary
    /// tile split in two, later parts moved in the finishing tree), so the
    /// two sums are within `2 D 2^-21` of each other relatively, which is
    /// their log's difference; `lg2.approx` adds twice its 2^-22, and the
    /// final `(max + lg2 sum) ln 2` and `xs - ln_z` round at 2^-24 |x| each.
    /// A worst case: the rounding errors of real rows mostly cancel.
    pub fn lse_tolerance(&self, x: f32) -> f32 {
        if self.is_tile_aligned() {
            return 0.0;
        }
        let depth = 47 + self.layout().1.div_ceil(256);
        (2 * depth + 1) as f32 * (1.0 / 2_097_152.0) + x.abs() * (1.0 / 1_048_576.0)
    }

    /// Each shard's launch (rows, tiles, parts) and the parts per row: a
    /// shard's parts follow the previous shard's, so a boundary inside a
    /// tile gives that tile two parts.
    fn layout(&self) -> (Vec<Shard>, usize) {
        let mut next = 0;
        let shards = self
            .bounds
            .windows(2)
            .map(|w| {
                let s = Shard::new(w[0], w[1] - w[0], next);
                next += s.tiles;
                s
            })
            .collect();
        (shards, next)
    }
}

fn check_shards(vocab: usize, shards: usize) -> Result<()> {
    if vocab as u64 > MAX_VOCAB {
        return Err(param("vocab", vocab));
    }
    if shards == 0 || shards > MAX_SHARDS || shards > vocab {
        return Err(param(
            "shards",
            format_args!("{shards} (1 to {MAX_SHARDS}, at most one per token of {vocab})"),
        ));
    }
    Ok(())
}

/// Tensor-parallel fused LM-head sampling: the call of
/// [`Device::fused_sample`] for an LM head split by vocabulary
/// ([`VocabSplit`]), with the same tokens as the unsharded kernel for the
/// same seeds whatever the number of shards (see the module docs for the
/// log-normaliser). Built once for a split and an exchange — N streams of
/// one device, a peer-to-peer group, or the caller's NCCL communicators —
/// then called once per step with each rank's operands; it keeps the
/// partial buffers (grown on demand: run a call before capturing a CUDA
/// graph, so that capture allocates nothing).
///
/// ```no_run
/// use flashsample::{Device, FusedOutput, HeadInput, HeadShape, RowParams, TpSampler, VocabSplit};
/// use half::bf16;
/// # fn main() -> flashsample::Result<()> {
/// // Two ranks on two GPUs of this process, peer to peer.
/// let (batch, vocab, dim) = (8, 151_936, 4096);
/// let split = VocabSplit::tile_aligned(vocab, 2)?;
/// let mut ranks = Vec::new();
/// for ordinal in 0..2 {
///     let dev = Device::new(ordinal)?;
///     let stream = dev.new_stream()?;
///     ranks.push((dev, stream));
/// }
/// let mut tp = TpSampler::peer(&ranks, split.clone())?;
/// let (mut bufs, mut outs) = (Vec::new(), Vec::new());
/// for (r, (_, stream)) in ranks.iter().enumerate() {
///     let rows = split.range(r).unwrap_or_default().len();
///     let hidden = stream.alloc_zeros::<bf16>(batch * dim)?; // replicated hidden states
///     let head = stream.alloc_zeros::<bf16>(rows * dim)?; // this rank's LM-head rows
///     let params = RowParams::upload(stream, &[0.7; 8], &[42; 8], &[0; 8])?;
///     bufs.push((hidden, head, params));
///     outs.push(FusedOutput::new(stream, batch)?);
/// }
/// let views: Vec<_> = bufs.iter().map(|b| (b.0.as_view(), b.1.as_view())).collect();
/// let inputs: Vec<HeadInput<'_, bf16>> = views
///     .iter()
///     .zip(&bufs)
///     .map(|((h, w), b)| HeadInput { hidden: h, lm_head: w, bias: None, params: &b.2 })
///     .collect();
/// tp.sample(HeadShape::new(batch, vocab, dim), &inputs, &mut outs)?;
/// // Every rank's outs[r].tokens holds the same global token ids.
/// # Ok(())
/// # }
/// ```
pub struct TpSampler<'c> {
    split: VocabSplit,
    shards: Vec<Shard>,
    parts: usize,
    exchange: Exchange<'c>,
}

enum Exchange<'c> {
    OneDevice(OneDevice),
    Peer(PeerGroup),
    Nccl(Vec<NcclRank<'c>>),
}

/// N shards on one device: forked from the caller's stream onto shard
/// streams, joined back before the finish.
struct OneDevice {
    device: Device,
    stream: Arc<CudaStream>,
    shard_streams: Vec<Arc<CudaStream>>,
    partial: CudaSlice<u64>,
    fork: CudaEvent,
    joins: Vec<CudaEvent>,
}

/// Peer-to-peer ranks. Each rank's fused launch writes its parts into every
/// rank's buffer; `written[r]` marks the end of rank r's launch (the other
/// ranks' finishes wait for it), `read[r]` the end of rank r's finish (the
/// other ranks' next launches, which overwrite r's buffer, wait for it).
struct PeerGroup {
    ranks: Vec<PeerRank>,
}

struct PeerRank {
    device: Device,
    stream: Arc<CudaStream>,
    partial: Option<PeerBuffer>,
    /// The other ranks' partial buffers, in rank order.
    table: CudaSlice<u64>,
    written: CudaEvent,
    read: CudaEvent,
    /// This rank among the group's ranks on its device.
    slot: Slot,
}

/// One rank of the caller's NCCL communicators.
struct NcclRank<'c> {
    comm: &'c Comm,
    device: Device,
    stream: Arc<CudaStream>,
    partial: CudaSlice<u64>,
}

/// Device memory from `cuMemAlloc`, not from the stream-ordered pool that
/// cudarc allocates from: `cuCtxEnablePeerAccess` maps such memory into
/// the peers' contexts, while pool memory would need the pool's access
/// changed, for every other user of the pool too.
struct PeerBuffer {
    device: Device,
    ptr: CUdeviceptr,
    words: usize,
}

impl PeerBuffer {
    fn new(device: &Device, words: usize) -> Result<PeerBuffer> {
        device.context().bind_to_thread()?;
        // SAFETY: a plain allocation in the bound context, freed once, in
        // `Drop`, after every stream that used it was synchronised.
        let ptr = unsafe { result::malloc_sync(words * 8) }?;
        Ok(PeerBuffer {
            device: device.clone(),
            ptr,
            words,
        })
    }
}

impl Drop for PeerBuffer {
    fn drop(&mut self) {
        if self.device.context().bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_sync` in this context; its owner
            // (`PeerGroup`) synchronises every rank's stream before any
            // buffer is dropped, so no launch still uses it.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

impl PeerGroup {
    fn synchronize(&self) -> Result<()> {
        for r in &self.ranks {
            r.stream.synchronize()?;
        }
        Ok(())
    }
}

impl Drop for PeerGroup {
    fn drop(&mut self) {
        // Launches in flight may still write into any rank's buffer.
        let _ = self.synchronize();
    }
}

/// Lets `from`'s kernels access `to`'s `cuMemAlloc` memory (nothing to do
/// on the same device).
fn enable_peer_access(from: &Device, to: &Device) -> Result<()> {
    let (a, b) = (from.context(), to.context());
    if Arc::ptr_eq(a, b) {
        return Ok(());
    }
    let mut can = 0;
    // SAFETY: writes one int; both device handles belong to live contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.cu_device(), b.cu_device()) }.result()?;
    if can == 0 {
        return Err(Error::NoPeerAccess {
            from: a.ordinal(),
            to: b.ordinal(),
        });
    }
    a.bind_to_thread()?;
    // SAFETY: `b` is a live context (held by `to`); the flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(b.cu_ctx(), 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        e => Err(DriverError(e).into()),
    }
}

impl TpSampler<'static> {
    /// All `split.shards()` shards on `device`: each shard's launch runs on
    /// a stream of its own, forked from `stream` and joined back into it,
    /// writing into one buffer; the finish runs on `stream`. A call takes
    /// one input per shard (all on `device`) and one output.
    pub fn one_device(
        device: &Device,
        stream: &Arc<CudaStream>,
        split: VocabSplit,
    ) -> Result<TpSampler<'static>> {
        let shard_streams = (0..split.shards())
            .map(|_| device.new_stream())
            .collect::<Result<Vec<_>>>()?;
        TpSampler::one_device_on(device, stream, shard_streams, split)
    }

    /// [`TpSampler::one_device`] on the caller's shard streams (one per
    /// shard, all on `device`, none of them `stream`): for engines that
    /// choose their streams' priorities, and for timelines (an event
    /// recorded on shard `r`'s stream after [`TpSampler::sample`] completes
    /// with shard `r`'s launch).
    pub fn one_device_on(
        device: &Device,
        stream: &Arc<CudaStream>,
        shard_streams: Vec<Arc<CudaStream>>,
        split: VocabSplit,
    ) -> Result<TpSampler<'static>> {
        device.check_stream(stream)?;
        let n = split.shards();
        if shard_streams.len() != n {
            return Err(shape("shard_streams", n, shard_streams.len()));
        }
        for s in &shard_streams {
            device.check_stream(s)?;
            if Arc::ptr_eq(s, stream) {
                return Err(param(
                    "shard_streams",
                    "a shard stream is the sampler's own stream (shards must fork from it)",
                ));
            }
        }
        let joins = (0..n)
            .map(|_| device.context().new_event(None))
            .collect::<Result<Vec<_>, _>>()?;
        let exchange = Exchange::OneDevice(OneDevice {
            device: device.clone(),
            stream: stream.clone(),
            shard_streams,
            partial: stream.alloc_zeros(1)?,
            fork: device.context().new_event(None)?,
            joins,
        });
        Ok(TpSampler::with(split, exchange))
    }

    /// One rank per `(device, stream)` of `ranks` (rank `r` holds shard
    /// `r`): enables peer access between every two devices (an error, before
    /// anything else, when a pair has no peer-to-peer path); each rank's
    /// launch writes its partials into every rank's buffer as its tiles
    /// finish, then each rank finishes on its own stream. Ranks may share a
    /// device. A call takes one input and one output per rank, each on its
    /// rank's device and ordered on its rank's stream.
    pub fn peer(
        ranks: &[(Device, Arc<CudaStream>)],
        split: VocabSplit,
    ) -> Result<TpSampler<'static>> {
        if ranks.len() != split.shards() {
            return Err(shape("ranks", split.shards(), ranks.len()));
        }
        for (dev, stream) in ranks {
            dev.check_stream(stream)?;
        }
        for (a, _) in ranks {
            for (b, _) in ranks {
                enable_peer_access(a, b)?;
            }
        }
        let mut group = PeerGroup { ranks: Vec::new() };
        for (i, (dev, stream)) in ranks.iter().enumerate() {
            let same =
                |(d, _): &&(Device, Arc<CudaStream>)| Arc::ptr_eq(d.context(), dev.context());
            let slot = Slot {
                index: ranks[..i].iter().filter(same).count() as u32,
                of: ranks.iter().filter(same).count() as u32,
            };
            group.ranks.push(PeerRank {
                device: dev.clone(),
                stream: stream.clone(),
                partial: None,
                table: stream.alloc_zeros(ranks.len().max(2) - 1)?,
                written: dev.context().new_event(None)?,
                read: dev.context().new_event(None)?,
                slot,
            });
        }
        Ok(TpSampler::with(split, Exchange::Peer(group)))
    }
}

impl<'c> TpSampler<'c> {
    /// The ranks of the caller's NCCL communicators that this process
    /// drives (one per rank, each on its own device; all of the world, or
    /// only some): rank `comm.rank()` holds shard `comm.rank()` of `split`,
    /// whose size must be the world size. Each rank's launch and finish run
    /// on its communicator's stream, which must come from this library's
    /// [`Device`] for that GPU; the partials are exchanged by broadcasts in
    /// place (one per rank, grouped). A call takes one input and one output
    /// per communicator, in `comms` order.
    pub fn nccl(comms: &[&'c Comm], split: VocabSplit) -> Result<TpSampler<'c>> {
        if comms.is_empty() {
            return Err(shape("comms", "at least one communicator", 0));
        }
        let mut ranks = Vec::new();
        for (i, &comm) in comms.iter().enumerate() {
            if comm.world_size() != split.shards() {
                return Err(shape(
                    "communicator world size",
                    split.shards(),
                    comm.world_size(),
                ));
            }
            if comm.rank() >= split.shards() || comms[..i].iter().any(|c| c.rank() == comm.rank()) {
                return Err(param(
                    "comms",
                    format_args!("rank {} (twice, or past the world)", comm.rank()),
                ));
            }
            let device = Device::new(comm.ordinal())?;
            let stream = comm.stream();
            device.check_stream(&stream)?;
            ranks.push(NcclRank {
                comm,
                partial: stream.alloc_zeros(1)?,
                device,
                stream,
            });
        }
        Ok(TpSampler::with(split, Exchange::Nccl(ranks)))
    }

    fn with(split: VocabSplit, exchange: Exchange<'c>) -> TpSampler<'c> {
        let (shards, parts) = split.layout();
        TpSampler {
            split,
            shards,
            parts,
            exchange,
        }
    }

    /// The vocabulary split.
    pub fn split(&self) -> &VocabSplit {
        &self.split
    }

    /// The shard (rank) of each input a call takes, in order: `0 .. N` for
    /// one device and peer groups, the communicators' ranks for NCCL.
    pub fn input_ranks(&self) -> Vec<usize> {
        match &self.exchange {
            Exchange::OneDevice(_) | Exchange::Peer(_) => (0..self.split.shards()).collect(),
            Exchange::Nccl(ranks) => ranks.iter().map(|r| r.comm.rank()).collect(),
        }
    }

    /// Outputs a call writes: 1 for one device, one per rank otherwise.
    pub fn outputs(&self) -> usize {
        match &self.exchange {
            Exchange::OneDevice(_) => 1,
            Exchange::Peer(g) => g.ranks.len(),
            Exchange::Nccl(ranks) => ranks.len(),
        }
    }

    /// Samples one token per row of the hidden states from the whole
    /// vocabulary: `inputs[i]` holds rank [`TpSampler::input_ranks`]`()[i]`'s
    /// operands (its LM-head rows and their bias, `split.range(rank)`; the
    /// same hidden states and row parameters on every rank), `shape` the
    /// batch, the whole vocabulary and the hidden size. Writes global token
    /// ids, validity, log-normaliser and log-probability to every output
    /// ([`TpSampler::outputs`]), each on its rank's stream. Every argument is
    /// checked before anything is launched.
    pub fn sample<T: HeadElem>(
        &mut self,
        shape: HeadShape,
        inputs: &[HeadInput<'_, T>],
        outs: &mut [FusedOutput],
    ) -> Result<()> {
        self.check(&shape, inputs, outs)?;
        let words = partial_words(shape.batch, self.parts);
        let launch = Launch {
            shape,
            shards: &self.shards,
            parts: self.parts,
        };
        match &mut self.exchange {
            Exchange::OneDevice(x) => x.run(&launch, words, inputs, outs),
            Exchange::Peer(g) => g.run(&launch, words, inputs, outs),
            Exchange::Nccl(ranks) => nccl_run(ranks, &launch, words, inputs, outs),
        }
    }

    /// The device and stream of each input (by position).
    fn input_streams(&self) -> Vec<(&Device, &Arc<CudaStream>)> {
        match &self.exchange {
            Exchange::OneDevice(x) => x.shard_streams.iter().map(|s| (&x.device, s)).collect(),
            Exchange::Peer(g) => g.ranks.iter().map(|r| (&r.device, &r.stream)).collect(),
            Exchange::Nccl(ranks) => ranks.iter().map(|r| (&r.device, &r.stream)).collect(),
        }
    }

    fn check<T: HeadElem>(
        &self,
        head: &HeadShape,
        inputs: &[HeadInput<'_, T>],
        outs: &[FusedOutput],
    ) -> Result<()> {
        if head.vocab != self.split.vocab() {
            return Err(shape(
                "vocab (the whole vocabulary)",
                self.split.vocab(),
                head.vocab,
            ));
        }
        let streams = self.input_streams();
        if inputs.len() != streams.len() {
            return Err(shape("inputs", streams.len(), inputs.len()));
        }
        if outs.len() != self.outputs() {
            return Err(shape("outputs", self.outputs(), outs.len()));
        }
        for ((input, (dev, stream)), rank) in inputs.iter().zip(streams).zip(self.input_ranks()) {
            let shard = HeadShape {
                vocab: self.shards[rank].vocab,
                ..*head
            };
            dev.check_head_input(stream, input, &shard)?;
        }
        let out_devices: Vec<&Device> = match &self.exchange {
            Exchange::OneDevice(x) => vec![&x.device],
            Exchange::Peer(g) => g.ranks.iter().map(|r| &r.device).collect(),
            Exchange::Nccl(ranks) => ranks.iter().map(|r| &r.device).collect(),
        };
        for (out, dev) in outs.iter().zip(out_devices) {
            out.check(head.batch, dev.context())?;
        }
        Ok(())
    }
}

/// What every shard launch of a call shares.
struct Launch<'a> {
    shape: HeadShape,
    shards: &'a [Shard],
    parts: usize,
}

impl Launch<'_> {
    /// The parameters of rank `r`'s launch.
    fn params(&self, r: usize, has_bias: bool, peers: usize) -> FusedParams {
        let s = &self.shards[r];
        let shape = HeadShape {
            vocab: s.vocab,
            ..self.shape
        };
        s.params(&shape, has_bias, self.parts, peers)
    }

    /// The parameters of the finish (it reads only `batch` and `parts`).
    fn finish(&self) -> FusedParams {
        self.params(0, false, 0)
    }

    /// The words of rank `r`'s parts in a part-major buffer.
    fn words_of(&self, r: usize) -> Range<usize> {
        let s = &self.shards[r];
        let row = self.shape.batch * FUSED_PARTIAL_WORDS as usize;
        s.part_offset * row..(s.part_offset + s.tiles) * row
    }
}

impl OneDevice {
    fn run<T: HeadElem>(
        &mut self,
        l: &Launch<'_>,
        words: usize,
        inputs: &[HeadInput<'_, T>],
        outs: &mut [FusedOutput],
    ) -> Result<()> {
        let (dev, stream) = (&self.device, &self.stream);
        if self.partial.len() < words {
            self.partial = stream.alloc_zeros(words)?;
        }
        let (part, _g) = self.partial.device_ptr_mut(stream);
        // The shards start after the caller's work on `stream` (the
        // inputs, the previous call's finish that read the buffer).
        self.fork.record(stream)?;
        let n = self.shard_streams.len() as u32;
        for (r, ((s, input), join)) in self
            .shard_streams
            .iter()
            .zip(inputs)
            .zip(&self.joins)
            .enumerate()
        {
            s.wait(&self.fork)?;
            let p = l.params(r, input.bias.is_some(), 0);
            dev.launch_fused_tiles(
                s,
                input,
                &p,
                part,
                0,
                Slot {
                    index: r as u32,
                    of: n,
                },
                false,
            )?;
            join.record(s)?;
        }
        for join in &self.joins {
            stream.wait(join)?;
        }
        dev.launch_fused_finish(stream, part, &l.finish(), &mut outs[0], false)
    }
}

impl PeerGroup {
    fn run<T: HeadElem>(
        &mut self,
        l: &Launch<'_>,
        words: usize,
        inputs: &[HeadInput<'_, T>],
        outs: &mut [FusedOutput],
    ) -> Result<()> {
        self.reserve(words)?;
        let n = self.ranks.len();
        for (r, input) in inputs.iter().enumerate() {
            // Rank r overwrites every rank's buffer: each must have
            // finished reading it in the previous call.
            self.wait_for_others(r, |o| &o.read)?;
            let rank = &self.ranks[r];
            let part = rank.partial.as_ref().map_or(0, |b| b.ptr);
            let (table, _g) = rank.table.device_ptr(&rank.stream);
            let p = l.params(r, input.bias.is_some(), n - 1);
            rank.device.launch_fused_tiles(
                &rank.stream,
                input,
                &p,
                part,
                table,
                rank.slot,
                false,
            )?;
            rank.written.record(&rank.stream)?;
        }
        for (r, out) in outs.iter_mut().enumerate() {
            self.wait_for_others(r, |o| &o.written)?;
            let rank = &self.ranks[r];
            let part = rank.partial.as_ref().map_or(0, |b| b.ptr);
            rank.device
                .launch_fused_finish(&rank.stream, part, &l.finish(), out, false)?;
            rank.read.record(&rank.stream)?;
        }
        Ok(())
    }

    /// Makes rank `r`'s stream wait for `event` of every other rank.
    fn wait_for_others(&self, r: usize, event: impl Fn(&PeerRank) -> &CudaEvent) -> Result<()> {
        for (q, other) in self.ranks.iter().enumerate() {
            if q != r {
                self.ranks[r].stream.wait(event(other))?;
            }
        }
        Ok(())
    }

    /// Grows every rank's buffer to `words` and rewrites the peer tables.
    /// Any rank's launch may be writing into any buffer: all streams are
    /// synchronised before the old buffers go (this allocates, so it is not
    /// for CUDA graph capture).
    fn reserve(&mut self, words: usize) -> Result<()> {
        if self
            .ranks
            .iter()
            .all(|r| r.partial.as_ref().is_some_and(|b| b.words >= words))
        {
            return Ok(());
        }
        self.synchronize()?;
        for r in &mut self.ranks {
            r.partial = None;
            r.partial = Some(PeerBuffer::new(&r.device, words)?);
        }
        let addrs: Vec<u64> = self
            .ranks
            .iter()
            .map(|r| r.partial.as_ref().map_or(0, |b| b.ptr))
            .collect();
        for (i, r) in self.ranks.iter_mut().enumerate() {
            let peers: Vec<u64> = (0..addrs.len())
                .filter(|&q| q != i)
                .map(|q| addrs[q])
                .collect();
            if !peers.is_empty() {
                r.stream.memcpy_htod(&peers, &mut r.table)?;
            }
        }
        Ok(())
    }
}

fn nccl_run<T: HeadElem>(
    ranks: &mut [NcclRank<'_>],
    l: &Launch<'_>,
    words: usize,
    inputs: &[HeadInput<'_, T>],
    outs: &mut [FusedOutput],
) -> Result<()> {
    for (rank, input) in ranks.iter_mut().zip(inputs) {
        if rank.partial.len() < words {
            rank.partial = rank.stream.alloc_zeros(words)?;
        }
        let (part, _g) = rank.partial.device_ptr_mut(&rank.stream);
        let p = l.params(rank.comm.rank(), input.bias.is_some(), 0);
        rank.device
            .launch_fused_tiles(&rank.stream, input, &p, part, 0, Slot::ALONE, false)?;
    }
    // An all-gather of uneven pieces: rank q broadcasts its parts in place
    // into the same words of every rank's buffer. Grouped, so that one
    // thread may drive several ranks.
    group_start().map_err(Error::Nccl)?;
    let sent: Result<()> = (|| {
        for rank in ranks.iter_mut() {
            for q in 0..l.shards.len() {
                let mut piece = rank.partial.slice_mut(l.words_of(q));
                rank.comm
                    .broadcast_in_place(&mut piece, q as i32)
                    .map_err(Error::Nccl)?;
            }
        }
        Ok(())
    })();
    let ended = group_end().map_err(Error::Nccl);
    sent?;
    ended?;
    for (rank, out) in ranks.iter_mut().zip(outs) {
        let (part, _g) = rank.partial.device_ptr_mut(&rank.stream);
        rank.device
            .launch_fused_finish(&rank.stream, part, &l.finish(), out, false)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_the_vocabulary() {
        for vocab in [1usize, 5, 127, 128, 129, 1000, 32_000, 151_936, 262_144] {
            for n in [1usize, 2, 3, 4, 7, 8] {
                for split in [
                    VocabSplit::even(vocab, n),
                    VocabSplit::tile_aligned(vocab, n),
                ] {
                    let Ok(split) = split else {
                        assert!(n > vocab.div_ceil(128) || n > vocab, "V={vocab} N={n}");
                        continue;
                    };
                    assert_eq!(split.shards(), n);
                    assert_eq!(split.vocab(), vocab);
                    let mut next = 0;
                    for r in 0..n {
                        let range = split.range(r).unwrap();
                        assert_eq!(range.start, next);
                        assert!(!range.is_empty());
                        next = range.end;
                    }
                    assert_eq!(next, vocab);
                    assert_eq!(split.range(n), None);
                }
                if n <= vocab.div_ceil(128) {
                    assert!(
                        VocabSplit::tile_aligned(vocab, n)
                            .unwrap()
                            .is_tile_aligned()
                    );
                }
            }
        }
        assert!(VocabSplit::even(10, 0).is_err());
        assert!(VocabSplit::even(3, 4).is_err());
        assert!(VocabSplit::even(1 << 20, MAX_SHARDS + 1).is_err());
        assert!(VocabSplit::even(usize::MAX, 3).is_err());
        assert!(VocabSplit::tile_aligned(usize::MAX, 3).is_err());
        assert!(
            VocabSplit::tile_aligned(300, 4).is_err(),
            "3 tiles, 4 shards"
        );
        assert!(VocabSplit::from_bounds(vec![]).is_err());
        assert!(VocabSplit::from_bounds(vec![0]).is_err());
        assert!(VocabSplit::from_bounds(vec![1, 5]).is_err());
        assert!(VocabSplit::from_bounds(vec![0, 5, 5, 9]).is_err());
        assert!(VocabSplit::from_bounds(vec![0, (1 << 30) + 1]).is_err());
        assert!(
            VocabSplit::from_bounds(vec![0, 256, 300])
                .unwrap()
                .is_tile_aligned()
        );
        assert!(
            !VocabSplit::from_bounds(vec![0, 200, 300])
                .unwrap()
                .is_tile_aligned()
        );
    }

    /// Aligned splits give the unsharded launch's tiles as parts, in place;
    /// a boundary inside a tile gives that tile two parts.
    #[test]
    fn aligned_layouts_are_the_unsharded_tiles() {
        let whole = Shard::new(0, 151_936, 0);
        for n in [1, 2, 3, 4, 8] {
            let (shards, parts) = VocabSplit::tile_aligned(151_936, n).unwrap().layout();
            assert_eq!(parts, whole.tiles);
            for s in &shards {
                assert_eq!(s.part_offset * 128, s.offset, "part = global tile");
            }
            assert_eq!(shards.iter().map(|s| s.tiles).sum::<usize>(), whole.tiles);
        }
        let (shards, parts) = VocabSplit::from_bounds(vec![0, 100, 300, 301])
            .unwrap()
            .layout();
        // Tiles 0 | 0, 1, 2 | 2: five parts for three tiles.
        assert_eq!(parts, 5);
        let got: Vec<_> = shards.iter().map(|s| (s.part_offset, s.tiles)).collect();
        assert_eq!(got, [(0, 1), (1, 3), (4, 1)]);
        let p = Launch {
            shape: HeadShape::new(2, 301, 8),
            shards: &shards,
            parts,
        };
        assert_eq!(p.words_of(1), 6..24);
        let k = p.params(1, true, 3);
        assert_eq!(
            (
                k.vocab,
                k.vocab_offset,
                k.tiles,
                k.part_offset,
                k.parts,
                k.peers
            ),
            (200, 100, 3, 1, 5, 3)
        );
    }

    #[test]
    fn tolerance_is_zero_when_aligned_and_grows_with_magnitude_and_depth() {
        let aligned = VocabSplit::tile_aligned(151_936, 3).unwrap();
        assert_eq!(aligned.lse_tolerance(12.5), 0.0);
        let even = VocabSplit::even(151_936, 3).unwrap();
        // 1189 parts: D = 47 + 5.
        assert_eq!(even.layout().1, 1189);
        let t0 = even.lse_tolerance(0.0);
        assert!((t0 - 105.0 / 2_097_152.0).abs() < 1e-9, "{t0}");
        assert!(even.lse_tolerance(-1000.0) > even.lse_tolerance(10.0));
        let big = VocabSplit::even(1 << 21, 3).unwrap();
        assert!(big.lse_tolerance(0.0) > t0);
        assert!(big.lse_tolerance(1000.0) < 2e-3);
    }
}
