//! GPU bench of the Qrita truncation kernels, `top_k_top_p_mask_logits`
//! (in place) and `sample_top_k_top_p`, timed with CUDA events.
//!
//! Matrix: f32 logits, V in {32000, 128256, 151936, 262144}, B in {1, 8,
//! 32, 128, 512, 1024}, (k, p) in {(50, 0.9), (1000, 0.9)}, min-p off,
//! temperature 1, on three distributions of `tests/common`: Gaussian (a
//! per-row sigma in [0.5, 8]), heavy-tailed (Student-t, 2 degrees of
//! freedom, scaled by 2: a few large logits per row) and bf16-quantised
//! (Gaussian rounded to bf16: many exact ties). Per (V, distribution), 64
//! distinct rows are drawn on the host from a fixed seed, uploaded once and
//! tiled to 1024 rows on the device. With the SmolLM2 logits corpus
//! (`FLASHSAMPLE_CORPUS`, else next to the model) a fourth distribution,
//! "real (SmolLM2 rows tiled to V)": 64 corpus rows spread over the file,
//! each 49152 logits tiled to V (so every value occurs 2 to 6 times),
//! timed the same way; without a corpus the report says so.
//!
//! Pristine inputs. The mask kernel overwrites its input, and masking an
//! already-masked row is a different, much easier workload; timing "copy +
//! mask" minus "copy" was rejected too, since the copy leaves the rows it
//! wrote in L2 and the mask would then read them from the cache. So every
//! call of a timed sample runs on its own copy of the case's logits: before
//! each sample, outside the timed region, every copy is restored from the
//! pristine rows by a device-to-device copy and L2 is flushed by reading
//! 2 x L2 of other data; every timed call then reads pristine logits from
//! HBM, as the floor assumes. The sampler, which only reads, is timed the
//! same way. One copy per call of a `harness::time_us` sample at the largest
//! case (1024 x 262144 f32, 1 GiB each) takes about 24 GiB of device memory.
//! Each measurement is one untimed warm-up sample, then the median of up to
//! 7 samples within about 80 ms of kernel time.
//!
//! First table, per case: the planned route, the floor at the read
//! bandwidth measured in this run (masking reads and writes B x V x 4
//! bytes, sampling reads them once), the kernel's median time per call
//! launched on the stream and replayed from a CUDA graph of the same calls
//! (as an engine that captures its decoding step runs them, and as the
//! issue's references were measured; pristine copies and the flush outside
//! the replay, as above), the stream time's ratio to the floor, for masking
//! the target (1.5 x floor + 5 us for B >= 8, 15 us at B = 1) and whether
//! each time meets it, and up to B = 128 the time of the other route in
//! the same run: where the planner lists chunks (`flashsample::
//! LISTED_MIN_BATCH` rows of long rows, `LISTED_MIN_BATCH_SHORT` of short
//! ones) the plain chunked passes; where it takes the chunked passes, the
//! listing passes from B = 32 and below that the cluster route of the
//! row's size, where the GPU runs it; on the cluster route, the chunked
//! passes; on the radix route (`TopkToppRoute::Radix`), at every batch,
//! the route the planner takes without it (`flashsample::
//! plan_topk_topp_route`). Last, the radix route where the call has one
//! (`flashsample::plan_topk_topp_radix`) and the planner did not take it.
//!
//! Second table, per (V, distribution, k, p): the selection statistics of
//! the portable driver the kernels run (`flashsample::kernels::pivot::
//! select_row`, as `examples/pivot_stats.rs` reports them on real logits)
//! over the first 16 rows: the sigma pre-filter's outcome, candidates
//! searched, kept count, pivot rounds; and how many of these rows the GPU
//! mask (B = 1024) kept exactly as many elements of as the driver (top-p
//! may differ by one within its 1e-6 band). With a corpus, one more line
//! per (k, p) on the 64 distinct real rows untiled (V = 49152; the GPU
//! kept counts from one untimed mask of them as a batch).
//!
//! Third table: the other truncation calls at V = 128256 on the Gaussian
//! rows (B in {1, 8, 128, 1024}, both truncations): the renormalised
//! probabilities and the kept set of f32 logits, and sampling and the
//! renormalised probabilities of the rows rounded to bf16 (widened into
//! the workspace first), against their floors.
//!
//! Prints the markdown tables and writes them to `FLASHSAMPLE_BENCH_OUT`
//! when set. Without a GPU it says it skips and exits 0.

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;
use std::sync::Arc;

use common::Dist;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use flashsample::kernels::pivot::{self, Prefilter, Selection};
use flashsample::{
    Device, Result, Rows, SampleOutput, TopkToppRoute, TruncParams, Workspace,
    plan_topk_topp_radix, plan_topk_topp_route,
};
use harness::{L2_BYTES, time_us};
use rand::SeedableRng;
use rand::rngs::StdRng;

const VOCABS: [usize; 4] = [32_000, 128_256, 151_936, 262_144];
const BATCHES: [usize; 6] = [1, 8, 32, 128, 512, 1024];
const MAX_BATCH: usize = BATCHES[BATCHES.len() - 1];
const TRUNCATIONS: [(u32, f32); 2] = [(50, 0.9), (1000, 0.9)];
const DISTS: [(Dist, &str); 3] = [
    (Dist::Gaussian, "gaussian"),
    (Dist::HeavyTail, "heavy-tail"),
    (Dist::Bf16Quantised, "bf16-quantised"),
];
const TEMPERATURE: f32 = 1.0;
/// Distinct rows per (V, distribution), tiled to `MAX_BATCH`.
const DISTINCT_ROWS: usize = 64;
/// Rows the CPU selection statistics run over.
const STAT_ROWS: usize = 16;
/// Kernel time per measurement that cuts the number of samples.
const BUDGET_US: f64 = 80_000.0;
const MAX_REPS: usize = 7;

/// Per-call copies of the logits and the L2 flush of pristine-input timing.
struct Pristine {
    /// One copy per call of a `time_us` sample, `MAX_BATCH` x max V each.
    copies: Vec<CudaSlice<f32>>,
    /// 2 x L2 of data, read before each sample.
    flush: CudaSlice<u32>,
}

impl Pristine {
    fn new(stream: &Arc<CudaStream>) -> Result<Pristine> {
        // One copy per call of a sample: count the calls of an empty one.
        let mut calls = 0;
        time_us(stream, 0, 1, |_| {
            calls += 1;
            Ok(())
        })?;
        let len = MAX_BATCH * VOCABS.iter().max().expect("vocabularies");
        Ok(Pristine {
            copies: (0..calls)
                .map(|_| stream.alloc_zeros(len))
                .collect::<Result<_, _>>()?,
            flush: stream.alloc_zeros(2 * L2_BYTES / 4)?,
        })
    }

    /// Median time per call of `f` on pristine logits `src` (call `i` of a
    /// sample on copy `i`, [`Pristine::median`]): launched on the stream,
    /// or with `replay` captured once in a CUDA graph and replayed, as an
    /// engine that captures its decoding step runs them.
    fn time(
        &mut self,
        replay: bool,
        dev: &Device,
        stream: &Arc<CudaStream>,
        ws: &mut Workspace,
        src: &CudaView<'_, f32>,
        mut f: impl FnMut(&mut CudaViewMut<'_, f32>, &mut Workspace) -> Result<()>,
    ) -> Result<f64> {
        let len = src.len();
        if !replay {
            return self.median(dev, stream, ws, src, |copies, ws| {
                time_us(stream, 0, 1, |i| f(&mut copies[i].slice_mut(..len), ws))
            });
        }
        let calls = self.copies.len();
        let graph = {
            let copies = &mut self.copies;
            harness::CallGraph::capture(stream, calls, |i| f(&mut copies[i].slice_mut(..len), ws))?
        };
        self.median(dev, stream, ws, src, |_, _| graph.time_us(stream, 1))
    }

    /// Median of `sample`'s time per call: before each sample (outside the
    /// timed region) every copy gets `src` again and L2 is flushed. One
    /// warm-up sample, then 1 to `MAX_REPS` samples within `BUDGET_US`.
    fn median(
        &mut self,
        dev: &Device,
        stream: &Arc<CudaStream>,
        ws: &mut Workspace,
        src: &CudaView<'_, f32>,
        mut sample: impl FnMut(&mut [CudaSlice<f32>], &mut Workspace) -> Result<f64>,
    ) -> Result<f64> {
        let len = src.len();
        let calls = self.copies.len() as f64;
        let mut restored = || -> Result<f64> {
            for copy in &mut self.copies {
                stream.memcpy_dtod(src, &mut copy.slice_mut(..len))?;
            }
            dev.read_once(stream, &self.flush.as_view(), ws)?;
            sample(&mut self.copies, ws)
        };
        let warm = restored()?;
        let reps = ((BUDGET_US / (warm * calls)) as usize).clamp(1, MAX_REPS);
        let mut times = (0..reps).map(|_| restored()).collect::<Result<Vec<_>>>()?;
        times.sort_by(f64::total_cmp);
        Ok(times[reps / 2])
    }
}

/// One row of the statistics table: the driver's selection on `rows`
/// against the GPU's kept counts `gpu_kept` of the same rows.
fn stats_line(rows: &[Vec<f32>], params: &pivot::RowParams, gpu_kept: &[u32]) -> String {
    let sel: Vec<Selection> = rows.iter().map(|r| pivot::select_row(r, params)).collect();
    let n = sel.len() as f64;
    let share = |what: Prefilter| sel.iter().filter(|s| s.prefilter == what).count() as f64 / n;
    let mean = |f: fn(&Selection) -> u32| sel.iter().map(|s| f64::from(f(s))).sum::<f64>() / n;
    let agree = sel
        .iter()
        .zip(gpu_kept)
        .filter(|&(s, &g)| s.kept == g)
        .count();
    format!(
        "{} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} | {agree}/{} |",
        sel.len(),
        share(Prefilter::Hit),
        share(Prefilter::HitSecondTier),
        share(Prefilter::Fallback),
        mean(|s| s.candidates),
        mean(|s| s.kept),
        mean(|s| s.topk_rounds),
        mean(|s| s.topp_rounds),
        mean(|s| s.tie_rounds),
        sel.len()
    )
}

/// The device parameters of truncation `(top_k, top_p)` for `MAX_BATCH`
/// rows (min-p off, temperature `TEMPERATURE`).
fn trunc_params(stream: &Arc<CudaStream>, top_k: u32, top_p: f32) -> Result<TruncParams> {
    TruncParams::upload(
        stream,
        &[top_k; MAX_BATCH],
        &[top_p; MAX_BATCH],
        &[0.0; MAX_BATCH],
        &[TEMPERATURE; MAX_BATCH],
        &(0..MAX_BATCH as u64).collect::<Vec<_>>(),
        &[0; MAX_BATCH],
    )
}

/// The portable driver's parameters of truncation `(top_k, top_p)`.
fn pivot_params(top_k: u32, top_p: f32) -> pivot::RowParams {
    pivot::RowParams {
        top_k,
        top_p,
        min_p: 0.0,
        temperature: TEMPERATURE,
        prefilter: true,
    }
}

/// The vocabulary of the other calls' table.
const OTHER_CALLS_VOCAB: usize = 128_256;

/// Times the truncation calls besides f32 masking and sampling on the
/// Gaussian input of `OTHER_CALLS_VOCAB` (`host` rows, their `tiled`
/// device copy) at a few batches and both truncations: the renormalised
/// probabilities and the kept set of f32 logits, and sampling and the
/// renormalised probabilities of the same rows rounded to bf16 (read-only
/// calls, each on the case's rows with L2 flushed first). Appends a line a
/// (call, case) to `table`.
fn other_calls(
    dev: &Device,
    stream: &Arc<CudaStream>,
    ws: &mut Workspace,
    pristine: &mut Pristine,
    (host, tiled): (&[Vec<f32>], &CudaSlice<f32>),
    read_bw: f64,
    table: &mut String,
) -> Result<()> {
    let vocab = OTHER_CALLS_VOCAB;
    let distinct: Vec<half::bf16> = host
        .iter()
        .flatten()
        .map(|&x| half::bf16::from_f32(x))
        .collect();
    let tiled_bf16 = harness::repeat_rows(stream, &distinct, vocab, MAX_BATCH)?;
    let mut probs: CudaSlice<f32> = stream.alloc_zeros(MAX_BATCH * vocab)?;
    let mut kept: CudaSlice<u32> = stream.alloc_zeros(MAX_BATCH)?;
    let mut indices: CudaSlice<u32> = stream.alloc_zeros(MAX_BATCH * 1024)?;
    let mut out = SampleOutput::new(stream, MAX_BATCH)?;
    for (top_k, top_p) in TRUNCATIONS {
        let params = trunc_params(stream, top_k, top_p)?;
        for batch in [1, 8, 128, 1024] {
            let case = format!("B={batch} V={vocab} k={top_k} p={top_p} gaussian");
            if !harness::selected(&case) {
                continue;
            }
            let shape = Rows::contiguous(batch, vocab);
            let src = tiled.slice(..batch * vocab);
            let half_src = tiled_bf16.slice(..batch * vocab);
            let floor = (batch * vocab * 4) as f64 / read_bw * 1e6;
            let mut line = |call: &str, floor: f64, t: f64| {
                writeln!(
                    table,
                    "| {call} | {case} | {floor:.1} | {t:.1} | {:.2} |",
                    t / floor
                )
                .ok();
                println!("{call} {case}: {t:.1} us (floor {floor:.1})");
            };
            let t = pristine.time(false, dev, stream, ws, &src, |logits, ws| {
                dev.top_k_top_p_renorm_probs(
                    stream,
                    &logits.as_view(),
                    shape,
                    &params,
                    &mut probs.as_view_mut(),
                    &mut kept,
                    ws,
                )
            })?;
            line("top_k_top_p_renorm_probs f32", 2.0 * floor, t);
            let t = pristine.time(false, dev, stream, ws, &src, |logits, ws| {
                dev.top_k_top_p_kept_set(
                    stream,
                    &logits.as_view(),
                    shape,
                    &params,
                    &mut kept,
                    &mut indices.as_view_mut(),
                    1024,
                    ws,
                )
            })?;
            line("top_k_top_p_kept_set f32", floor, t);
            // The 16-bit calls read `half_src` (the pristine copies go
            // unused); reads only, so every call sees the same rows.
            let t = pristine.time(false, dev, stream, ws, &src, |_, ws| {
                dev.sample_top_k_top_p(stream, &half_src, shape, &params, &mut out, ws)
            })?;
            line("sample_top_k_top_p bf16", floor / 2.0, t);
            let t = pristine.time(false, dev, stream, ws, &src, |_, ws| {
                dev.top_k_top_p_renorm_probs(
                    stream,
                    &half_src,
                    shape,
                    &params,
                    &mut probs.as_view_mut(),
                    &mut kept,
                    ws,
                )
            })?;
            line("top_k_top_p_renorm_probs bf16", 1.5 * floor, t);
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let Some(harness::Setup {
        dev,
        stream,
        mut ws,
        read_bw,
        ..
    }) = harness::setup("bench topk")?
    else {
        return Ok(());
    };
    let mut pristine = Pristine::new(&stream)?;
    let mut table = String::new();
    writeln!(
        table,
        "read bandwidth {:.0} GB/s (1 GiB read, same run); f32 logits, temperature {TEMPERATURE}, min_p 0; every call on pristine logits read from HBM\n",
        read_bw / 1e9
    )
    .ok();
    writeln!(
        table,
        "| case | route | floor us | kernel us | graph us | ratio | target us | ok | graph ok | other route | other us | radix route | radix us |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .ok();
    let mut stats = String::from(
        "| V | distribution | k | p | rows | pre-filter hit | 2nd tier | fallback | mean candidates | mean kept | top-k rounds | top-p rounds | tie rounds | GPU kept = CPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut rng = StdRng::seed_from_u64(11);
    let mut failures = 0;
    let mut others =
        String::from("| call | case | floor us | kernel us | ratio |\n|---|---|---|---|---|\n");
    let real = harness::real_rows(DISTINCT_ROWS);
    if real.is_empty() {
        table.insert_str(0, "no logits corpus: no real-distribution lines\n\n");
    } else {
        // Tiling repeats every value 2 to 6 times: the statistics once more
        // on the distinct real rows at their own width, masked (untimed) as
        // one batch on the GPU.
        let width = real[0].len();
        let host: Vec<f32> = real.concat();
        for (top_k, top_p) in TRUNCATIONS {
            let params = trunc_params(&stream, top_k, top_p)?;
            let mut logits = stream.clone_htod(&host)?;
            let mut kept: CudaSlice<u32> = stream.alloc_zeros(MAX_BATCH)?;
            dev.top_k_top_p_mask_logits(
                &stream,
                &mut logits.as_view_mut(),
                Rows::contiguous(real.len(), width),
                &params,
                &mut kept,
                &mut ws,
            )?;
            let gpu_kept = stream.clone_dtoh(&kept.slice(..real.len()))?;
            writeln!(
                stats,
                "| {width} | real (SmolLM2 rows, untiled) | {top_k} | {top_p} | {}",
                stats_line(&real, &pivot_params(top_k, top_p), &gpu_kept)
            )
            .ok();
        }
    }
    let caps = dev.topk_topp_caps();
    let radix_caps = dev.radix_caps()?;
    for vocab in VOCABS {
        // The cluster route of a row of this vocabulary, where the GPU runs
        // one (the other route the cases time up to B = 128).
        let cluster = plan_topk_topp_route(&Rows::contiguous(1, vocab), &caps, false);
        // Per distribution: the distinct rows (host) and MAX_BATCH rows
        // tiled from them (device); with a corpus, real rows tiled to V.
        let mut hosts: Vec<(&str, Vec<f32>)> = Vec::with_capacity(DISTS.len() + 1);
        for (dist, name) in DISTS {
            let mut host = Vec::with_capacity(DISTINCT_ROWS * vocab);
            for _ in 0..DISTINCT_ROWS {
                common::push_row(&mut rng, dist, vocab, &mut host);
            }
            hosts.push((name, host));
        }
        if !real.is_empty() {
            let host = real.iter().flat_map(|r| harness::tile(r, vocab)).collect();
            hosts.push((harness::REAL_LABEL, host));
        }
        let mut inputs = Vec::with_capacity(hosts.len());
        for (name, host) in hosts {
            let tiled = harness::repeat_rows(&stream, &host, vocab, MAX_BATCH)?;
            let rows: Vec<Vec<f32>> = host
                .chunks(vocab)
                .take(STAT_ROWS)
                .map(<[f32]>::to_vec)
                .collect();
            inputs.push((name, rows, tiled));
        }
        for (top_k, top_p) in TRUNCATIONS {
            let params = trunc_params(&stream, top_k, top_p)?;
            let mut kept: CudaSlice<u32> = stream.alloc_zeros(MAX_BATCH)?;
            let mut out = SampleOutput::new(&stream, MAX_BATCH)?;
            for (name, rows, tiled) in &inputs {
                for batch in BATCHES {
                    let case = format!("f32 B={batch} V={vocab} k={top_k} p={top_p} {name}");
                    if !harness::selected(&case) {
                        continue;
                    }
                    let shape = Rows::contiguous(batch, vocab);
                    let src = tiled.slice(..batch * vocab);
                    let floor = (batch * vocab * 4) as f64 / read_bw * 1e6;
                    let mask_floor = 2.0 * floor;
                    let target = if batch == 1 {
                        15.0
                    } else {
                        1.5 * mask_floor + 5.0
                    };
                    let planned = dev.topk_topp_route(shape, &params)?;
                    // The other route (see the module docs): up to B = 128,
                    // and at every batch the planner lists.
                    let other = match planned {
                        // The route the call takes without the radix one.
                        TopkToppRoute::Radix(_) => {
                            Some(plan_topk_topp_route(&shape, &caps, params.large_top_k))
                        }
                        TopkToppRoute::Cluster { .. } | TopkToppRoute::Listed { .. } => {
                            Some(TopkToppRoute::Chunked)
                        }
                        // From B = 32 the cluster route would take
                        // several waves: the listing passes instead.
                        TopkToppRoute::Chunked if batch >= 32 => {
                            Some(TopkToppRoute::Listed { shares_only: false })
                        }
                        TopkToppRoute::Chunked => {
                            Some(cluster).filter(|c| *c != TopkToppRoute::Chunked)
                        }
                    }
                    .filter(|_| {
                        batch <= 128
                            || matches!(
                                planned,
                                TopkToppRoute::Listed { .. } | TopkToppRoute::Radix(_)
                            )
                    });
                    // The radix route where the call has one and the
                    // planner did not take it.
                    let radix = plan_topk_topp_radix(&shape, params.top_k_bound, &radix_caps)
                        .map(TopkToppRoute::Radix)
                        .filter(|r| *r != planned);
                    // Both calls on the planned route, on the other one,
                    // on the planned route replayed from CUDA graphs and on
                    // the radix route.
                    let mut times = [[f64::NAN; 2]; 4];
                    let runs = [
                        (Some(planned), false),
                        (other, false),
                        (Some(planned), true),
                        (radix, false),
                    ];
                    for (i, (route, replay)) in runs.into_iter().enumerate() {
                        let Some(route) = route else { continue };
                        ws.force_topk_topp_route(Some(route));
                        times[i][0] =
                            pristine.time(replay, &dev, &stream, &mut ws, &src, |logits, ws| {
                                dev.top_k_top_p_mask_logits(
                                    &stream, logits, shape, &params, &mut kept, ws,
                                )
                            })?;
                        times[i][1] =
                            pristine.time(replay, &dev, &stream, &mut ws, &src, |logits, ws| {
                                dev.sample_top_k_top_p(
                                    &stream,
                                    &logits.as_view(),
                                    shape,
                                    &params,
                                    &mut out,
                                    ws,
                                )
                            })?;
                    }
                    ws.force_topk_topp_route(None);
                    let [
                        [t_mask, t_sample],
                        [o_mask, o_sample],
                        [g_mask, g_sample],
                        [r_mask, r_sample],
                    ] = times;
                    let route_name = |r: TopkToppRoute| match r {
                        TopkToppRoute::Chunked => "chunked".to_string(),
                        TopkToppRoute::Listed { shares_only: false } => "listed".to_string(),
                        TopkToppRoute::Listed { shares_only: true } => "listed shares".to_string(),
                        TopkToppRoute::Cluster { ctas } => format!("cluster {ctas}"),
                        TopkToppRoute::Radix(route) => format!("radix {route:?}"),
                    };
                    let other_name = other.map_or("-".to_string(), route_name);
                    let radix_name = radix.map_or("-".to_string(), route_name);
                    let ok = t_mask <= target;
                    failures += usize::from(!ok);
                    let yes = |ok: bool| if ok { "yes" } else { "NO" };
                    writeln!(
                        table,
                        "| top_k_top_p_mask_logits {case} | {} | {mask_floor:.1} | {t_mask:.1} | {g_mask:.1} | {:.2} | {target:.1} | {} | {} | {other_name} | {o_mask:.1} | {radix_name} | {r_mask:.1} |",
                        route_name(planned),
                        t_mask / mask_floor,
                        yes(ok),
                        yes(g_mask <= target)
                    )
                    .ok();
                    writeln!(
                        table,
                        "| sample_top_k_top_p {case} | {} | {floor:.1} | {t_sample:.1} | {g_sample:.1} | {:.2} | - | - | - | {other_name} | {o_sample:.1} | {radix_name} | {r_sample:.1} |",
                        route_name(planned),
                        t_sample / floor
                    )
                    .ok();
                    println!(
                        "{case}: {} mask {t_mask:.1} us (graph {g_mask:.1}, floor {mask_floor:.1}), sample {t_sample:.1} us (graph {g_sample:.1}, floor {floor:.1}); {other_name} mask {o_mask:.1} sample {o_sample:.1}; {radix_name} mask {r_mask:.1} sample {r_sample:.1}",
                        route_name(planned)
                    );
                }
                // `kept` holds the last mask call's counts, at MAX_BATCH.
                let gpu_kept = stream.clone_dtoh(&kept.slice(..rows.len()))?;
                writeln!(
                    stats,
                    "| {vocab} | {name} | {top_k} | {top_p} | {}",
                    stats_line(rows, &pivot_params(top_k, top_p), &gpu_kept)
                )
                .ok();
            }
        }
        if vocab == OTHER_CALLS_VOCAB {
            let (_, rows, tiled) = &inputs[0];
            other_calls(
                &dev,
                &stream,
                &mut ws,
                &mut pristine,
                (rows, tiled),
                read_bw,
                &mut others,
            )?;
        }
    }
    harness::report(&format!(
        "{table}\nSelection statistics (portable driver, first {STAT_ROWS} rows of each input; the untiled real line: all {} distinct real rows):\n\n{stats}\nThe other truncation calls, V = {OTHER_CALLS_VOCAB}, Gaussian rows, p = 0.9 (floors at this run's read bandwidth: renormalised probabilities read and write 4 bytes a logit, the kept set and 16-bit sampling read 4 and 2):\n\n{others}",
        real.len()
    ))?;
    if failures > 0 {
        println!("{failures} masking case(s) above target");
    }
    Ok(())
}
