//! GPU bench of tensor-parallel fused sampling, simulated on one GPU.
//!
//! For every LM head of `benches/fused.rs` (V, d) and B in {1, 8, 64}: the
//! unsharded fused kernel, then `TpSampler::one_device` with N in
//! {2, 3, 4, 8} tile-aligned shards (each shard's launch on its own stream,
//! sized for 1/N of the GPU, all writing one partial buffer, then the
//! finish), both timed with CUDA events in the same run, in alternating
//! samples (an unsharded one, then a sharded one, `PAIRS` times per N: the
//! added cost is the ratio of those medians, so that a drift of the clocks
//! weighs on both; the table's unsharded column is the median of all its
//! samples), calls back to back on the stream and the same calls replayed
//! from CUDA graphs (as an engine that captures its decoding step runs
//! them; the shards' fork and join are then graph edges, not stream
//! events). The difference is
//! what sharding adds on one GPU: the fork/join of the shard streams, N
//! launches instead of one, the finish over the shards' parts. Target:
//! at most 3 % over the unsharded kernel at B <= 64. (Between GPUs the
//! exchange itself adds the peer writes or the NCCL broadcasts of
//! `B * tiles * 24` bytes; this bench cannot see those.) Writes a markdown
//! table to `FLASHSAMPLE_BENCH_OUT` when set; `FLASHSAMPLE_BENCH_ONLY`
//! selects cases by name (`V=151936 d=4096 B=8`).
//!
//! Then a timeline of one sharded call per case (the second of two back to
//! back, so that the host is ahead as in the timed loop): events on the main stream
//! before and after the call and on every shard's stream after it (each
//! completes with that shard's launch), so that the report shows when the
//! first and the last shard finished and how long the finish took after the
//! last one, against the unsharded call's time.

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use flashsample::{FusedOutput, HeadInput, HeadShape, Result, RowParams, TpSampler, VocabSplit};
use half::bf16;
use harness::{gaussian_bf16, time_us};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;

const SHARDS: [usize; 4] = [2, 3, 4, 8];
const TARGET_ADDED: f64 = 0.03;
/// Calls captured in one graph by the graph-replay timing.
const GRAPH_CALLS: usize = 20;
/// Alternating (unsharded, sharded) samples per case and N.
const PAIRS: usize = 7;

fn main() -> Result<()> {
    let Some(harness::Setup {
        dev,
        stream,
        mut ws,
        read_bw,
        ..
    }) = harness::setup("bench tp")?
    else {
        return Ok(());
    };
    let mut rng = StdRng::seed_from_u64(7);
    let mut table = String::new();
    writeln!(
        table,
        "read bandwidth {:.0} GB/s (1 GiB read, same run); N shards simulated on one GPU, tile-aligned splits\n",
        read_bw / 1e9
    )
    .ok();
    let mut header = String::from("| V | d | B | unsharded us |");
    let mut rule = String::from("|---|---|---|---|");
    for n in SHARDS {
        write!(header, " N={n} us (added) |").ok();
        rule.push_str("---|");
    }
    writeln!(
        table,
        "{header} worst added | target | ok |\n{rule}---|---|---|"
    )
    .ok();
    let mut misses = 0;
    let mut timelines = String::new();
    // The same calls replayed from CUDA graphs (the shards' fork and join
    // become graph edges), as an engine that captures its decoding step
    // runs them.
    let mut graphs = format!("{header} worst added | target | ok |\n{rule}---|---|---|\n");
    for (vocab, dim) in [(151_936usize, 4096usize), (128_256, 8192), (262_144, 5376)] {
        let batches: Vec<usize> = [1usize, 8, 64]
            .into_iter()
            .filter(|b| harness::selected(&format!("V={vocab} d={dim} B={b}")))
            .collect();
        if batches.is_empty() {
            continue;
        }
        let w: CudaSlice<bf16> = stream.clone_htod(&gaussian_bf16(
            &mut rng,
            vocab * dim,
            3.0 / (dim as f32).sqrt(),
        ))?;
        let h: CudaSlice<bf16> = stream.clone_htod(&gaussian_bf16(&mut rng, 64 * dim, 1.0))?;
        for batch in batches {
            let shape = HeadShape::new(batch, vocab, dim);
            let hv = h.slice(..batch * dim);
            let wv = w.as_view();
            let params = RowParams::upload(
                &stream,
                &vec![0.8; batch],
                &(0..batch as u64).collect::<Vec<_>>(),
                &vec![0; batch],
            )?;
            let mut out = FusedOutput::new(&stream, batch)?;
            // Unsharded and sharded calls are timed in alternating samples
            // (one of each per pair, per N), so that a drift of the clocks
            // over the case (B = 64 moved by up to 8 % between runs) weighs
            // on both alike; each added cost is the ratio of its own pairs'
            // medians.
            let mut unsharded = |out: &mut FusedOutput| {
                dev.fused_sample(&stream, &hv, &wv, None, shape, &params, out, &mut ws)
            };
            let g_one = harness::CallGraph::capture(&stream, GRAPH_CALLS, |_| unsharded(&mut out))?;
            time_us(&stream, 3, 1, |_| unsharded(&mut out))?;
            // Every sharded call, replayed or not, samples these tokens.
            let want = stream.clone_dtoh(&out.tokens)?;
            let (mut ones, mut g_ones) = (Vec::new(), Vec::new());
            let (mut cells, mut g_cells) = (String::new(), String::new());
            let mut worst = f64::NEG_INFINITY;
            let mut g_worst = f64::NEG_INFINITY;
            for n in SHARDS {
                let split = VocabSplit::tile_aligned(vocab, n)?;
                let shard_streams = (0..n)
                    .map(|_| dev.new_stream())
                    .collect::<Result<Vec<_>>>()?;
                let mut tp =
                    TpSampler::one_device_on(&dev, &stream, shard_streams.clone(), split.clone())?;
                let heads: Vec<_> = (0..n)
                    .map(|r| {
                        let rows = split.range(r).unwrap_or_default();
                        w.slice(rows.start * dim..rows.end * dim)
                    })
                    .collect();
                let inputs: Vec<_> = heads
                    .iter()
                    .map(|head| HeadInput {
                        hidden: &hv,
                        lm_head: head,
                        bias: None,
                        params: &params,
                    })
                    .collect();
                let mut sharded =
                    |out: &mut FusedOutput| tp.sample(shape, &inputs, std::slice::from_mut(out));
                let g_tp =
                    harness::CallGraph::capture(&stream, GRAPH_CALLS, |_| sharded(&mut out))?;
                g_tp.time_us(&stream, 1)?;
                assert_eq!(
                    stream.clone_dtoh(&out.tokens)?,
                    want,
                    "V={vocab} d={dim} B={batch} N={n}: the replayed sharded call's tokens"
                );
                time_us(&stream, 3, 1, |_| sharded(&mut out))?;
                // [unsharded, sharded] samples, on streams and from graphs.
                let (mut stream_t, mut graph_t) = ([vec![], vec![]], [vec![], vec![]]);
                for _ in 0..PAIRS {
                    stream_t[0].push(time_us(&stream, 0, 1, |_| unsharded(&mut out))?);
                    stream_t[1].push(time_us(&stream, 0, 1, |_| sharded(&mut out))?);
                    graph_t[0].push(g_one.time_us(&stream, 1)?);
                    graph_t[1].push(g_tp.time_us(&stream, 1)?);
                }
                ones.extend(&stream_t[0]);
                g_ones.extend(&graph_t[0]);
                let [t_one_n, t_tp] = stream_t.map(harness::median);
                let [g_one_n, g_tp] = graph_t.map(harness::median);
                let g_added = g_tp / g_one_n - 1.0;
                g_worst = g_worst.max(g_added);
                write!(g_cells, " {g_tp:.1} ({:+.1} %) |", g_added * 100.0).ok();
                let ends = timeline(&stream, &shard_streams, || sharded(&mut out))?;
                writeln!(
                    timelines,
                    "| {vocab} | {dim} | {batch} | {n} | {t_one_n:.1} | {:.1} | {:.1} | {:.1} | {} |",
                    ends.first_shard,
                    ends.last_shard,
                    ends.total,
                    ends.each
                        .iter()
                        .map(|t| format!("{t:.0}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
                .ok();
                let added = t_tp / t_one_n - 1.0;
                worst = worst.max(added);
                write!(cells, " {t_tp:.1} ({:+.1} %) |", added * 100.0).ok();
                println!(
                    "V={vocab} d={dim} B={batch} N={n}: unsharded {t_one_n:.1} us, sharded {t_tp:.1} us ({:+.2} %); graphs {g_one_n:.1} us, {g_tp:.1} us ({:+.2} %)",
                    added * 100.0,
                    g_added * 100.0
                );
            }
            let mut row = format!(
                "| {vocab} | {dim} | {batch} | {:.1} |{cells}",
                harness::median(ones)
            );
            let mut g_row = format!(
                "| {vocab} | {dim} | {batch} | {:.1} |{g_cells}",
                harness::median(g_ones)
            );
            let ok = worst <= TARGET_ADDED;
            misses += usize::from(!ok);
            writeln!(
                row,
                " {:+.1} % | {:.0} % | {} |",
                worst * 100.0,
                TARGET_ADDED * 100.0,
                if ok { "yes" } else { "NO" }
            )
            .ok();
            table.push_str(&row);
            writeln!(
                g_row,
                " {:+.1} % | {:.0} % | {} |",
                g_worst * 100.0,
                TARGET_ADDED * 100.0,
                if g_worst <= TARGET_ADDED { "yes" } else { "NO" }
            )
            .ok();
            graphs.push_str(&g_row);
        }
    }
    table.push_str("\nThe same calls replayed from CUDA graphs (20 calls a graph):\n\n");
    table.push_str(&graphs);
    table.push_str(
        "\nTimeline of one sharded call, the second of two back to back (us after its start; each shard's end is an event on its stream):\n\n\
         | V | d | B | N | unsharded us | first shard done | last shard done | call done | each shard done |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    table.push_str(&timelines);
    harness::report(&table)?;
    if misses > 0 {
        println!("{misses} case(s) miss the target");
    }
    Ok(())
}

/// When the shards and the whole call of one `call` finished, in us after
/// its start.
struct Ends {
    first_shard: f64,
    last_shard: f64,
    /// Every shard's, in shard order.
    each: Vec<f64>,
    total: f64,
}

/// Runs `call` twice back to back and times the second between events on
/// `stream`, with an event on every shard stream after it: the host is
/// ahead of the device, as in the timed loop, so the shards' launches are
/// all queued when the first call's join releases them.
fn timeline(
    stream: &Arc<CudaStream>,
    shard_streams: &[Arc<CudaStream>],
    mut call: impl FnMut() -> Result<()>,
) -> Result<Ends> {
    let ctx = stream.context();
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    stream.synchronize()?;
    let start = event()?;
    let end = event()?;
    let shard_ends = shard_streams
        .iter()
        .map(|_| event())
        .collect::<std::result::Result<Vec<_>, _>>()?;
    call()?;
    start.record(stream)?;
    call()?;
    for (e, s) in shard_ends.iter().zip(shard_streams) {
        e.record(s)?;
    }
    end.record(stream)?;
    end.synchronize()?;
    let mut first = f64::INFINITY;
    let mut last = 0.0f64;
    let mut each = Vec::with_capacity(shard_ends.len());
    for e in &shard_ends {
        let t = f64::from(start.elapsed_ms(e)?) * 1000.0;
        first = first.min(t);
        last = last.max(t);
        each.push(t);
    }
    Ok(Ends {
        first_shard: first,
        last_shard: last,
        each,
        total: f64::from(start.elapsed_ms(&end)?) * 1000.0,
    })
}
