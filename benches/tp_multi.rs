//! GPU bench of tensor-parallel fused sampling over real GPUs (issue 9).
//!
//! On a machine with G >= 2 GPUs, for TP = every power of two from 2 to G,
//! (V, d) in {(151936, 4096), (128256, 8192)}, B in {1, 16, 64, 256}, bf16
//! weights (allocated once per (V, d) on every GPU, the same deterministic
//! values everywhere), the time per step of:
//!
//! 1. the unsharded `fused_sample` on GPU 0 (the whole head);
//! 2. fused sharded sampling over GPUs 0 .. TP (each rank's tile-aligned
//!    shard, `VocabSplit::tile_aligned`) with `TpSampler::peer`, and with
//!    `TpSampler::nccl` when NCCL can be loaded and its communicators
//!    created (`Comm::from_devices`, one process driving every rank);
//! 3. the conventional path: each rank's f32 logits shard (`V / TP` rows,
//!    cuBLAS through `Unfused::logits`), an NCCL all-gather of the shards
//!    into a `[TP, B, V / TP]` buffer on every rank, its rearrangement into
//!    the `[B, V]` logits on rank 0 (one 2D copy per shard, what frameworks'
//!    all-gather along the last dimension does), then
//!    `sampling_from_logits` on rank 0. Without NCCL, rank 0 gathers the
//!    shards by peer copies instead (marked `(peer gather)`).
//!
//! All timed with CUDA events on rank 0's stream (`harness::time_us_joined`:
//! the other ranks' streams are forked from the start event and joined back
//! before the end event, so every rank's work is inside the timed region;
//! median of 5 samples of 20 back-to-back steps). The sharded paths' tokens
//! are checked against the unsharded kernel's (bit for bit on every rank).
//! Reports the speedup of the faster sharded path over the conventional one,
//! the scaling efficiency `unsharded / (TP x sharded)`, and the issue's
//! target: sharded >= 1.25 x faster than conventional at B = 64. Writes a
//! markdown table to `FLASHSAMPLE_BENCH_OUT` when set;
//! `FLASHSAMPLE_BENCH_ONLY` selects cases by name (`V=151936 d=4096 B=64`).

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUmemorytype};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut};
use cudarc::nccl::Comm;
use cudarc::nccl::result::{group_end, group_start};
use flashsample::{
    Device, Error, FusedOutput, HeadInput, HeadShape, Result, RowParams, Rows, SampleOutput,
    TpSampler, Unfused, VocabSplit, Workspace,
};
use half::bf16;
use harness::{gaussian_bf16, time_us, time_us_joined};
use rand::SeedableRng;
use rand::rngs::StdRng;

const HEADS: [(usize, usize); 2] = [(151_936, 4096), (128_256, 8192)];
const BATCHES: [usize; 4] = [1, 16, 64, 256];
const MAX_BATCH: usize = 256;
const TARGET_BATCH: usize = 64;
const TARGET_SPEEDUP: f64 = 1.25;

type Rank = (Device, Arc<CudaStream>);

fn main() -> Result<()> {
    let Some(harness::Setup {
        dev,
        stream,
        mut ws,
        read_bw,
        ..
    }) = harness::setup("bench tp_multi")?
    else {
        return Ok(());
    };
    let count = CudaContext::device_count()? as usize;
    if count < 2 {
        eprintln!("SKIPPED bench tp_multi: needs 2 GPUs, found {count}");
        return Ok(());
    }
    let mut ranks: Vec<Rank> = vec![(dev, stream)];
    for ordinal in 1..count {
        let d = Device::new(ordinal)?;
        let s = d.new_stream()?;
        ranks.push((d, s));
    }
    let tps: Vec<usize> = std::iter::successors(Some(2usize), |t| Some(t * 2))
        .take_while(|&t| t <= count)
        .collect();

    // One set of communicators per group size (creating one is slow); the
    // fused NCCL path and the conventional all-gather share them.
    let nccl = flashsample::nccl_present();
    let comms: Vec<Option<Vec<Comm>>> = tps
        .iter()
        .map(|&tp| {
            if !nccl {
                return None;
            }
            let streams = ranks[..tp].iter().map(|(_, s)| s.clone()).collect();
            Comm::from_devices(streams)
                .map_err(|e| println!("TP={tp}: no NCCL communicators ({e:?})"))
                .ok()
        })
        .collect();
    let mut blas: Vec<Unfused> = ranks
        .iter()
        .map(|(_, s)| Unfused::new(s))
        .collect::<Result<_>>()?;

    let mut table = String::new();
    writeln!(
        table,
        "{count} GPUs ({}), GPU 0 read bandwidth {:.0} GB/s (same run); sharded: tile-aligned splits; \
         conventional: cuBLAS f32 logits shards, {}, [TP, B, V/TP] -> [B, V] on rank 0, \
         sampling_from_logits on rank 0; speedup and efficiency use the faster sharded path\n",
        ranks[0].0.name()?,
        read_bw / 1e9,
        if nccl {
            "NCCL all-gather"
        } else {
            "no NCCL: peer-copy gather to rank 0"
        },
    )
    .ok();
    writeln!(
        table,
        "| V | d | B | TP | unsharded us | sharded peer us | sharded nccl us | conventional us | speedup sharded/conventional | scaling efficiency | target | ok |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .ok();

    let mut rng = StdRng::seed_from_u64(9);
    let mut misses = 0;
    for (vocab, dim) in HEADS {
        let batches: Vec<usize> = BATCHES
            .into_iter()
            .filter(|b| harness::selected(&format!("V={vocab} d={dim} B={b}")))
            .collect();
        if batches.is_empty() {
            continue;
        }
        // The whole head and the hidden states on every GPU, the same
        // values everywhere; each rank slices its shard.
        let w_host = gaussian_bf16(&mut rng, vocab * dim, 3.0 / (dim as f32).sqrt());
        let h_host = gaussian_bf16(&mut rng, MAX_BATCH * dim, 1.0);
        let mut bufs: Vec<(CudaSlice<bf16>, CudaSlice<bf16>)> = Vec::new();
        for (_, s) in &ranks {
            bufs.push((s.clone_htod(&w_host)?, s.clone_htod(&h_host)?));
        }
        drop(w_host);
        for batch in batches {
            let shape = HeadShape::new(batch, vocab, dim);
            let params = ranks
                .iter()
                .map(|(_, s)| {
                    RowParams::upload(
                        s,
                        &vec![0.8; batch],
                        &(0..batch as u64).collect::<Vec<_>>(),
                        &vec![0; batch],
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let hidden: Vec<CudaView<'_, bf16>> =
                bufs.iter().map(|b| b.1.slice(..batch * dim)).collect();

            let (dev0, s0) = &ranks[0];
            let mut one = FusedOutput::new(s0, batch)?;
            let t_one = time_us(s0, 3, 5, |_| {
                dev0.fused_sample(
                    s0,
                    &hidden[0],
                    &bufs[0].0.as_view(),
                    None,
                    shape,
                    &params[0],
                    &mut one,
                    &mut ws,
                )
            })?;
            let want = s0.clone_dtoh(&one.tokens)?;

            for (&tp, comms) in tps.iter().zip(&comms) {
                let group = &ranks[..tp];
                let others: Vec<Arc<CudaStream>> =
                    group[1..].iter().map(|(_, s)| s.clone()).collect();
                let split = VocabSplit::tile_aligned(vocab, tp)?;
                let heads: Vec<CudaView<'_, bf16>> = (0..tp)
                    .map(|r| {
                        let rows = split.range(r).unwrap_or_default();
                        bufs[r].0.slice(rows.start * dim..rows.end * dim)
                    })
                    .collect();
                let inputs: Vec<HeadInput<'_, bf16>> = (0..tp)
                    .map(|r| HeadInput {
                        hidden: &hidden[r],
                        lm_head: &heads[r],
                        bias: None,
                        params: &params[r],
                    })
                    .collect();
                let mut outs = group
                    .iter()
                    .map(|(_, s)| FusedOutput::new(s, batch))
                    .collect::<Result<Vec<_>>>()?;
                let mut same = true;

                let t_peer = match TpSampler::peer(group, split.clone()) {
                    Ok(mut sampler) => {
                        let t = time_us_joined(s0, &others, 3, 5, |_| {
                            sampler.sample(shape, &inputs, &mut outs)
                        })?;
                        same &= same_tokens(group, &outs, &want)?;
                        Some(t)
                    }
                    Err(e) => {
                        println!("TP={tp}: no peer path ({e})");
                        None
                    }
                };
                let t_nccl = match comms {
                    Some(comms) => {
                        let refs: Vec<&Comm> = comms.iter().collect();
                        let mut sampler = TpSampler::nccl(&refs, split.clone())?;
                        let t = time_us_joined(s0, &others, 3, 5, |_| {
                            sampler.sample(shape, &inputs, &mut outs)
                        })?;
                        same &= same_tokens(group, &outs, &want)?;
                        Some(t)
                    }
                    None => None,
                };

                let (t_conv, agree) = if vocab.is_multiple_of(tp) {
                    let (t, tokens) = conventional(
                        group,
                        &mut blas[..tp],
                        comms.as_deref(),
                        &hidden,
                        &bufs,
                        shape,
                        &params[0],
                        &mut ws,
                    )?;
                    let agree = tokens.iter().zip(&want).filter(|(a, b)| a == b).count();
                    (Some(t), agree)
                } else {
                    (None, 0)
                };

                let sharded = match (t_peer, t_nccl) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let speedup = sharded.zip(t_conv).map(|(s, c)| c / s);
                let efficiency = sharded.map(|s| t_one / (tp as f64 * s));
                let targeted = batch == TARGET_BATCH;
                let ok = same
                    && sharded.is_some()
                    && (!targeted || speedup.is_some_and(|s| s >= TARGET_SPEEDUP));
                misses += usize::from(!ok);
                let us = |t: Option<f64>| t.map_or("-".into(), |t| format!("{t:.1}"));
                let conv_cell = match (t_conv, comms) {
                    (Some(t), None) => format!("{t:.1} (peer gather)"),
                    (t, _) => us(t),
                };
                writeln!(
                    table,
                    "| {vocab} | {dim} | {batch} | {tp} | {t_one:.1} | {} | {} | {conv_cell} | {} | {} | {} | {} |",
                    us(t_peer),
                    us(t_nccl),
                    speedup.map_or("-".into(), |s| format!("{s:.2} x")),
                    efficiency.map_or("-".into(), |e| format!("{:.0} %", e * 100.0)),
                    if targeted {
                        format!(">= {TARGET_SPEEDUP} x")
                    } else {
                        "-".into()
                    },
                    match (ok, same) {
                        (true, _) => "yes",
                        (false, false) => "NO (tokens differ)",
                        (false, true) => "NO",
                    },
                )
                .ok();
                println!(
                    "V={vocab} d={dim} B={batch} TP={tp}: unsharded {t_one:.1} us, peer {} us, nccl {} us, \
                     conventional {} us ({agree}/{batch} tokens as the fused kernel's), sharded tokens {}",
                    us(t_peer),
                    us(t_nccl),
                    us(t_conv),
                    if same { "identical" } else { "DIFFER" },
                );
            }
        }
    }
    harness::report(&table)?;
    if misses > 0 {
        println!("{misses} case(s) miss the target or the unsharded tokens");
    }
    Ok(())
}

/// Whether every rank's tokens are `want`.
fn same_tokens(group: &[Rank], outs: &[FusedOutput], want: &[u32]) -> Result<bool> {
    for ((_, s), out) in group.iter().zip(outs) {
        if s.clone_dtoh(&out.tokens)? != want {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Times the conventional path over `group` (even split of the vocabulary,
/// `vocab % TP == 0`): per rank cuBLAS f32 logits of its shard, the gather
/// (NCCL all-gather on every rank with `comms`, else peer copies to rank 0),
/// the `[TP, B, V/TP] -> [B, V]` rearrangement and `sampling_from_logits`
/// on rank 0. Returns the time per step and the last step's tokens.
#[allow(clippy::too_many_arguments)]
fn conventional(
    group: &[Rank],
    blas: &mut [Unfused],
    comms: Option<&[Comm]>,
    hidden: &[CudaView<'_, bf16>],
    bufs: &[(CudaSlice<bf16>, CudaSlice<bf16>)],
    shape: HeadShape,
    params: &RowParams,
    ws: &mut Workspace,
) -> Result<(f64, Vec<u32>)> {
    let tp = group.len();
    let (batch, vocab, dim) = (shape.batch, shape.vocab, shape.dim);
    let rows = vocab / tp;
    let piece = batch * rows;
    let shard = HeadShape::new(batch, rows, dim);
    let (dev0, s0) = &group[0];
    let heads: Vec<CudaView<'_, bf16>> = (0..tp)
        .map(|r| bufs[r].0.slice(r * rows * dim..(r + 1) * rows * dim))
        .collect();
    // With NCCL every rank receives all shards; without, rank 0 only.
    let mut gathered = match comms {
        Some(_) => group
            .iter()
            .map(|(_, s)| s.alloc_zeros::<f32>(tp * piece))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![s0.alloc_zeros::<f32>(tp * piece)?],
    };
    let mut full: CudaSlice<f32> = s0.alloc_zeros(batch * vocab)?;
    // Peer gather: a rank's next logits overwrite what rank 0 may still be
    // copying; they wait for the copies of the previous step.
    let copied = dev0.context().new_event(None)?;
    copied.record(s0)?;
    let mut out = SampleOutput::new(s0, batch)?;
    let others: Vec<Arc<CudaStream>> = group[1..].iter().map(|(_, s)| s.clone()).collect();
    let t = time_us_joined(s0, &others, 3, 5, |_| {
        let mut logits = Vec::with_capacity(tp);
        for (r, (u, (_, s))) in blas.iter_mut().zip(group).enumerate() {
            if comms.is_none() && r > 0 {
                s.wait(&copied)?;
            }
            logits.push(u.logits(&hidden[r], &heads[r], shard)?);
        }
        match comms {
            Some(comms) => {
                group_start().map_err(Error::Nccl)?;
                let sent: Result<()> = logits
                    .iter()
                    .zip(comms)
                    .zip(gathered.iter_mut())
                    .try_for_each(|((l, c), g)| c.all_gather(l, g).map(drop).map_err(Error::Nccl));
                let ended = group_end().map_err(Error::Nccl);
                sent?;
                ended?;
            }
            None => {
                for (r, l) in logits.iter().enumerate() {
                    s0.memcpy_dtod(l, &mut gathered[0].slice_mut(r * piece..(r + 1) * piece))?;
                }
                copied.record(s0)?;
            }
        }
        drop(logits);
        rearrange(s0, &gathered[0], &mut full, batch, rows, tp)?;
        dev0.sampling_from_logits(
            s0,
            &full.as_view(),
            Rows::contiguous(batch, vocab),
            params,
            &mut out,
            ws,
        )
    })?;
    Ok((t, s0.clone_dtoh(&out.tokens)?))
}

/// `full[b, r * rows + j] = gathered[r, b, j]`: one 2D copy per shard on
/// `stream`.
fn rearrange(
    stream: &Arc<CudaStream>,
    gathered: &CudaSlice<f32>,
    full: &mut CudaSlice<f32>,
    batch: usize,
    rows: usize,
    tp: usize,
) -> Result<()> {
    let f32_bytes = std::mem::size_of::<f32>();
    let (src, _rs) = gathered.device_ptr(stream);
    let (dst, _rd) = full.device_ptr_mut(stream);
    stream.context().bind_to_thread()?;
    for r in 0..tp {
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src + (r * batch * rows * f32_bytes) as u64,
            srcArray: std::ptr::null_mut(),
            srcPitch: rows * f32_bytes,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst + (r * rows * f32_bytes) as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: tp * rows * f32_bytes,
            WidthInBytes: rows * f32_bytes,
            Height: batch,
        };
        // SAFETY: both ranges lie inside `gathered` (`tp * batch * rows`
        // values) and `full` (`batch * tp * rows`), allocated in the bound
        // context and kept alive by the guards until the copy is enqueued
        // on `stream`, which orders every later use.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }.result()?;
    }
    Ok(())
}
