//! GPU bench of tensor-parallel fused sampling, simulated on one GPU.
//!
//! For every LM head of `benches/fused.rs` (V, d) and B in {1, 8, 64}: the
//! unsharded fused kernel, then `TpSampler::one_device` with N in
//! {2, 3, 4, 8} tile-aligned shards (each shard's launch on its own stream,
//! sized for 1/N of the GPU, all writing one partial buffer, then the
//! finish), both timed with CUDA events in the same run. The difference is
//! what sharding adds on one GPU: the fork/join of the shard streams, N
//! launches instead of one, the finish over the shards' parts. Target:
//! at most 3 % over the unsharded kernel at B <= 64. (Between GPUs the
//! exchange itself adds the peer writes or the NCCL broadcasts of
//! `B * tiles * 24` bytes; this bench cannot see those.) Writes a markdown
//! table to `FLASHSAMPLE_BENCH_OUT` when set; `FLASHSAMPLE_BENCH_ONLY`
//! selects cases by name (`V=151936 d=4096 B=8`).

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;

use cudarc::driver::CudaSlice;
use flashsample::{FusedOutput, HeadInput, HeadShape, Result, RowParams, TpSampler, VocabSplit};
use half::bf16;
use harness::{gaussian_bf16, time_us};
use rand::SeedableRng;
use rand::rngs::StdRng;

const SHARDS: [usize; 4] = [2, 3, 4, 8];
const TARGET_ADDED: f64 = 0.03;

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
            let t_one = time_us(&stream, 3, 5, |_| {
                dev.fused_sample(&stream, &hv, &wv, None, shape, &params, &mut out, &mut ws)
            })?;
            let mut row = format!("| {vocab} | {dim} | {batch} | {t_one:.1} |");
            let mut worst = f64::NEG_INFINITY;
            for n in SHARDS {
                let split = VocabSplit::tile_aligned(vocab, n)?;
                let mut tp = TpSampler::one_device(&dev, &stream, split.clone())?;
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
                let outs = std::slice::from_mut(&mut out);
                let t_tp = time_us(&stream, 3, 5, |_| tp.sample(shape, &inputs, outs))?;
                let added = t_tp / t_one - 1.0;
                worst = worst.max(added);
                write!(row, " {t_tp:.1} ({:+.1} %) |", added * 100.0).ok();
                println!(
                    "V={vocab} d={dim} B={batch} N={n}: unsharded {t_one:.1} us, sharded {t_tp:.1} us ({:+.2} %)",
                    added * 100.0
                );
            }
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
        }
    }
    harness::report(&table)?;
    if misses > 0 {
        println!("{misses} case(s) miss the target");
    }
    Ok(())
}
