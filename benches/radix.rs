//! GPU bench of the cluster radix top-k and sparse top-p sampler (issue 5):
//! `top_k_top_p_sampling_from_probs` and `top_k_to_slab`, timed with CUDA
//! events.
//!
//! Matrix of the issue: f32 probabilities (softmax of Gaussian logits,
//! per-row sigma in [0.5, 8]; 64 distinct rows per V drawn from a fixed
//! seed, tiled on the device), V in {32768, 128256, 151936, 262144}, B in
//! {1, 2, 4, 8, 16, 32, 64, 128}, k in {10, 50, 1000}, p = 0.9. L2 is
//! flushed before each call: every timed call is preceded, outside its
//! events, by a read of 2 x L2 of other data, so it reads its rows from
//! HBM as the floor assumes. Each case: 3 untimed calls, then the median of
//! 15 timed ones.
//!
//! First table, per case: the route taken, the read floor (B x V x 4 bytes
//! at the read bandwidth measured in this run), the kernel's median time,
//! their ratio, the target (1.25 x floor + 4 us for B >= 2; 8 us at
//! B = 1, V = 128256, k = 50; none for the other B = 1 cases) and whether
//! it is met. Then stage 1 alone (`top_k_to_slab`) at a few shapes, and a
//! calibration table: every route (one CTA per row, cooperative, each
//! cluster size) at three shapes, against which the route planner's cost
//! model (`flashsample::plan_route`) is to be tuned.
//!
//! For scale, FlashInfer 0.7.4's cake route on this H200 (from the issue):
//! 11.8 us (B = 1, V = 128256, k = 50), 25.9 us (B = 128, k = 50), 34.9 us
//! (B = 128, k = 1000), 50.9 us (B = 128, V = 262144, k = 1000).
//!
//! Prints the markdown tables and writes them to `FLASHSAMPLE_BENCH_OUT`
//! when set. Without a GPU it says it skips and exits 0.

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use flashsample::reference;
use flashsample::{
    Device, RadixWorkspace, Result, Route, Rows, SampleOutput, Slab, TopKTopPParams, Workspace,
};
use harness::L2_BYTES;
use rand::SeedableRng;
use rand::rngs::StdRng;

const VOCABS: [usize; 4] = [32_768, 128_256, 151_936, 262_144];
const BATCHES: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
const MAX_BATCH: usize = 128;
const KS: [u32; 3] = [10, 50, 1000];
const TOP_P: f32 = 0.9;
const DISTINCT_ROWS: usize = 64;
const WARMUP: usize = 3;
const REPS: usize = 15;

/// What every timed call needs besides its own arguments.
struct Timer<'a> {
    dev: &'a Device,
    stream: &'a Arc<CudaStream>,
    ws: &'a mut Workspace,
    /// 2 x L2 of data, read before each timed call.
    flush: CudaSlice<u32>,
}

impl Timer<'_> {
    /// Median time of `f` in microseconds, L2 flushed before every call
    /// (outside the events; the flush keeps the GPU busy while the call is
    /// queued, so the events time the kernels alone).
    fn time(&mut self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        for _ in 0..WARMUP {
            f()?;
        }
        let ctx = self.stream.context();
        let mut events = Vec::with_capacity(REPS);
        for _ in 0..REPS {
            let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            self.dev
                .read_once(self.stream, &self.flush.as_view(), self.ws)?;
            start.record(self.stream)?;
            f()?;
            end.record(self.stream)?;
            events.push((start, end));
        }
        self.stream.synchronize()?;
        let mut times = events
            .iter()
            .map(|(s, e)| Ok(f64::from(s.elapsed_ms(e)?) * 1000.0))
            .collect::<Result<Vec<f64>>>()?;
        times.sort_by(f64::total_cmp);
        Ok(times[REPS / 2])
    }
}

/// `MAX_BATCH` rows of probabilities of width `vocab` (64 distinct rows
/// of softmax(Gaussian logits), tiled).
fn probability_rows(rng: &mut StdRng, vocab: usize) -> Vec<f32> {
    let mut distinct = Vec::with_capacity(DISTINCT_ROWS * vocab);
    for _ in 0..DISTINCT_ROWS {
        let mut logits = Vec::with_capacity(vocab);
        common::push_row(rng, common::Dist::Gaussian, vocab, &mut logits);
        let p = reference::softmax(&logits, 1.0).expect("a valid row");
        distinct.extend(p.into_iter().map(|x| x as f32));
    }
    distinct.repeat(MAX_BATCH / DISTINCT_ROWS)
}

fn main() -> Result<()> {
    let Some(harness::Setup {
        dev,
        stream,
        mut ws,
        read_bw,
        ..
    }) = harness::setup("bench radix")?
    else {
        return Ok(());
    };
    let caps = dev.radix_caps()?;
    let mut timer = Timer {
        dev: &dev,
        stream: &stream,
        ws: &mut ws,
        flush: stream.alloc_zeros(2 * L2_BYTES / 4)?,
    };
    let mut rws = RadixWorkspace::new(&stream)?;
    let mut out = SampleOutput::new(&stream, MAX_BATCH)?;
    let mut slab = Slab::new(&stream, MAX_BATCH)?;
    let seeds: Vec<u64> = (0..MAX_BATCH as u64).collect();
    let offsets = vec![0u64; MAX_BATCH];
    let mut rng = StdRng::seed_from_u64(13);

    let mut table = format!(
        "read bandwidth {:.0} GB/s (1 GiB read, same run); {caps:?}; f32 probabilities, p = {TOP_P}, L2 flushed before every call\n\n",
        read_bw / 1e9
    );
    table += "| case | route | floor us | kernel us | ratio | target us | ok |\n|---|---|---|---|---|---|---|\n";
    let mut stage1 = String::from(
        "| top_k_to_slab | route | floor us | kernel us | ratio |\n|---|---|---|---|---|\n",
    );
    let mut calibration =
        String::from("| case | route | kernel us | planned |\n|---|---|---|---|\n");
    let mut failures = 0;
    for vocab in VOCABS {
        let probs = stream.clone_htod(&probability_rows(&mut rng, vocab))?;
        for k in KS {
            let params = TopKTopPParams::upload(
                &stream,
                &[k; MAX_BATCH],
                &[TOP_P; MAX_BATCH],
                &seeds,
                &offsets,
            )?;
            for batch in BATCHES {
                let rows = Rows::contiguous(batch, vocab);
                let view = probs.slice(..batch * vocab);
                let floor = (batch * vocab * 4) as f64 / read_bw * 1e6;
                let target = match (batch, vocab, k) {
                    (1, 128_256, 50) => Some(8.0),
                    (1, _, _) => None,
                    _ => Some(1.25 * floor + 4.0),
                };
                let route = dev.route(rows, k)?;
                let t = timer.time(|| {
                    dev.top_k_top_p_sampling_from_probs(
                        &stream, &view, rows, &params, &mut out, &mut rws,
                    )
                    .map(|_| ())
                })?;
                let ok = target.is_none_or(|x| t <= x);
                failures += usize::from(!ok);
                let case = format!("B={batch} V={vocab} k={k}");
                writeln!(
                    table,
                    "| {case} | {route:?} | {floor:.1} | {t:.1} | {:.2} | {} | {} |",
                    t / floor,
                    target.map_or("-".into(), |x| format!("{x:.1}")),
                    match target {
                        None => "-",
                        Some(_) if ok => "yes",
                        Some(_) => "NO",
                    }
                )
                .ok();
                println!("{case}: {route:?} {t:.1} us (floor {floor:.1})");
                if vocab == 128_256 && [1, 128].contains(&batch) {
                    let ts = timer.time(|| {
                        dev.top_k_to_slab(&stream, &view, rows, &params, &mut slab, &mut rws)
                            .map(|_| ())
                    })?;
                    writeln!(
                        stage1,
                        "| {case} | {route:?} | {floor:.1} | {ts:.1} | {:.2} |",
                        ts / floor
                    )
                    .ok();
                }
                if vocab == 128_256 && k == 50 && [1, 16, 128].contains(&batch) {
                    let mut all = vec![Route::SingleCta];
                    all.extend((2..=8).map(|ctas| Route::Cooperative { ctas }));
                    all.extend((2..=caps.max_cluster).map(|ctas| Route::Cluster { ctas }));
                    for r in all {
                        rws.force_route(Some(r));
                        let tr = timer.time(|| {
                            dev.top_k_top_p_sampling_from_probs(
                                &stream, &view, rows, &params, &mut out, &mut rws,
                            )
                            .map(|_| ())
                        });
                        rws.force_route(None);
                        // A cooperative grid too large for the GPU is
                        // rejected: not a result.
                        if let Ok(tr) = tr {
                            writeln!(
                                calibration,
                                "| {case} | {r:?} | {tr:.1} | {} |",
                                if r == route { "yes" } else { "" }
                            )
                            .ok();
                        }
                    }
                }
            }
        }
    }
    harness::report(&format!(
        "{table}\nStage 1 alone:\n\n{stage1}\nEvery route (cost-model calibration):\n\n{calibration}"
    ))?;
    if failures > 0 {
        println!("{failures} case(s) above target");
    }
    Ok(())
}
