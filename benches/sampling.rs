//! GPU benches of the row kernels, timed with CUDA events.
//!
//! For every case: the read floor (the case's bytes over the read bandwidth
//! measured in this run with a 1 GiB read), the kernel's median time (calls
//! back to back on a stream), the same calls replayed from a CUDA graph (as
//! an engine that captures its decoding step runs them), their ratio, the target of the foundation issue (1.25 x floor + 5 us), and the
//! PyTorch references of `benches/torch_reference.py` when its JSON is given
//! in `FLASHSAMPLE_TORCH_REF` (the GPU bundle runs it first, in the same
//! session). Inputs rotate over enough copies to exceed twice the L2 cache.
//! Writes a markdown table to `FLASHSAMPLE_BENCH_OUT` (default stdout only).

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;

use cudarc::driver::CudaSlice;
use flashsample::{Result, RowParams, Rows, SampleOutput};
use harness::{L2_BYTES, time_us};
use rand::SeedableRng;

/// `batch` rows of Gaussian logits (64 distinct rows, repeated).
fn gaussian_rows(rng: &mut rand::rngs::StdRng, batch: usize, vocab: usize) -> Vec<f32> {
    let mut host = Vec::with_capacity(batch * vocab);
    for _ in 0..batch.min(64) {
        common::push_row(rng, common::Dist::Gaussian, vocab, &mut host);
    }
    while host.len() < batch * vocab {
        let n = (batch * vocab - host.len()).min(host.len());
        host.extend_from_within(..n);
    }
    host
}

fn main() -> Result<()> {
    let Some(harness::Setup {
        dev,
        stream,
        mut ws,
        refs,
        read_bw,
    }) = harness::setup("bench sampling")?
    else {
        return Ok(());
    };

    let mut table = String::new();
    writeln!(
        table,
        "read bandwidth {:.0} GB/s (1 GiB read, same run)\n",
        read_bw / 1e9
    )
    .ok();
    writeln!(
        table,
        "| case | floor us | kernel us | graph us | host us | ratio | target us | ok | PyTorch same run |\n|---|---|---|---|---|---|---|---|---|"
    )
    .ok();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let real = harness::real_rows(64);
    let mut failures = 0;
    for vocab in [128_256usize, 262_144] {
        for batch in [1usize, 32, 128, 256, 512, 1024] {
            if !harness::selected(&format!("B={batch} V={vocab}")) {
                continue;
            }
            let rows = Rows::contiguous(batch, vocab);
            let bytes = batch * vocab * 4;
            let copies = (2 * L2_BYTES).div_ceil(bytes).clamp(1, 256);
            let params = RowParams::upload(
                &stream,
                &vec![0.8; batch],
                &(0..batch as u64).collect::<Vec<_>>(),
                &vec![0; batch],
            )?;
            let mut out = SampleOutput::new(&stream, batch)?;
            let floor = bytes as f64 / read_bw * 1e6;
            let target = 1.25 * floor + 5.0;
            // Gaussian rows, then (with a corpus) real SmolLM2 rows (49152
            // wide) tiled to V.
            let mut inputs = vec![("", gaussian_rows(&mut rng, batch, vocab))];
            if !real.is_empty() {
                let tiled = (0..batch)
                    .flat_map(|r| harness::tile(&real[r % real.len()], vocab))
                    .collect();
                inputs.push((" real (SmolLM2 rows tiled to V)", tiled));
            }
            for (kind, host) in inputs {
                let bufs: Vec<CudaSlice<f32>> = (0..copies)
                    .map(|_| stream.clone_htod(&host))
                    .collect::<Result<_, _>>()?;
                let mut call = |i: usize| {
                    dev.sampling_from_logits(
                        &stream,
                        &bufs[i % copies].as_view(),
                        rows,
                        &params,
                        &mut out,
                        &mut ws,
                    )
                };
                let t = time_us(&stream, 5, 9, &mut call)?;
                // The same calls replayed from a graph (every copy once).
                let tg = harness::time_us_graph(&stream, copies.max(20), 2, 5, &mut call)?;
                // The host's cost of one call (the stream-launched figure
                // cannot be below it).
                let th = harness::host_us(&stream, 64, &mut call)?;
                let ok = t <= target;
                failures += usize::from(!ok);
                let case = format!("sampling_from_logits f32 B={batch} V={vocab}");
                writeln!(
                    table,
                    "| {case}{kind} | {floor:.1} | {t:.1} | {tg:.1} | {th:.1} | {:.2} | {target:.1} | {} | {} |",
                    t / floor,
                    if ok { "yes" } else { "NO" },
                    if kind.is_empty() {
                        refs.case(&case)
                    } else {
                        "-".into()
                    }
                )
                .ok();
                println!(
                    "B={batch} V={vocab}{kind}: sampling {t:.1} us, graph {tg:.1} us, host {th:.1} us a call (floor {floor:.1})"
                );
                if !kind.is_empty() {
                    continue;
                }
                // Softmax on the Gaussian rows: read + write floor.
                let mut probs: CudaSlice<f32> = stream.alloc_zeros(batch * vocab)?;
                let ts = time_us(&stream, 3, 5, |i| {
                    dev.softmax(
                        &stream,
                        &bufs[i % copies].as_view(),
                        rows,
                        &params.temperature.as_view(),
                        &mut probs.as_view_mut(),
                        &mut ws,
                    )
                })?;
                let sfloor = 2.0 * floor;
                let case = format!("softmax f32 B={batch} V={vocab}");
                writeln!(
                    table,
                    "| {case} | {sfloor:.1} | {ts:.1} | - | - | {:.2} | - | - | {} |",
                    ts / sfloor,
                    refs.case(&case)
                )
                .ok();
            }
        }
    }
    harness::report(&table)?;
    if failures > 0 {
        println!("{failures} case(s) above the 1.25 x floor + 5 us target");
    }
    Ok(())
}
