//! Shared bench machinery: CUDA-event timing, the read-bandwidth floor and
//! the same-run PyTorch references.
#![allow(dead_code)] // each bench binary uses its own subset

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream};
use flashsample::{Device, Result, Workspace};
use half::bf16;
use rand::rngs::StdRng;

pub const L2_BYTES: usize = 60 << 20;

/// Calls back to back between one pair of events: the stream stays full,
/// so the time per call is the GPU's, not the host's launch latency.
const CALLS_PER_SAMPLE: usize = 20;

/// Median over `reps` samples of the time per call of `f(i)` (i = rotation
/// index), each sample timing [`CALLS_PER_SAMPLE`] calls between two events,
/// after `warmup` untimed calls, in microseconds.
pub fn time_us(
    stream: &Arc<CudaStream>,
    warmup: usize,
    reps: usize,
    f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    time_us_joined(stream, &[], warmup, reps, f)
}

/// [`time_us`] for calls that also run on `others` (other ranks' streams,
/// on any device): the events are on `stream`; each sample forks `others`
/// from its start event and joins them back before its end event, so that
/// every stream's work of the sample lies between the two.
pub fn time_us_joined(
    stream: &Arc<CudaStream>,
    others: &[Arc<CudaStream>],
    warmup: usize,
    reps: usize,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    for i in 0..warmup {
        f(i)?;
    }
    for s in others {
        s.synchronize()?;
    }
    let ctx = stream.context();
    let mut times = Vec::with_capacity(reps);
    let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let mut i = warmup;
    for _ in 0..reps {
        start.record(stream)?;
        for s in others {
            s.wait(&start)?;
        }
        for _ in 0..CALLS_PER_SAMPLE {
            f(i)?;
            i += 1;
        }
        for s in others {
            stream.join(s)?;
        }
        end.record(stream)?;
        end.synchronize()?;
        times.push(f64::from(start.elapsed_ms(&end)?) * 1000.0 / CALLS_PER_SAMPLE as f64);
    }
    Ok(median(times))
}

/// Host time to submit one call of `f(i)`, in microseconds: `calls` calls
/// issued back to back with no synchronisation between them, timed on the
/// host's clock (few enough that the launch queue never fills), then the
/// stream drained. When it exceeds the per-call time of [`time_us`], the
/// stream-launched figure is the host's launch cost, not the GPU's.
pub fn host_us(
    stream: &Arc<CudaStream>,
    calls: usize,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    stream.synchronize()?;
    let t0 = std::time::Instant::now();
    for i in 0..calls {
        f(i)?;
    }
    let host = t0.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64;
    stream.synchronize()?;
    Ok(host)
}

/// Median over `reps` replays of one CUDA graph of the calls `f(0)` to
/// `f(calls - 1)` ([`CallGraph`]), per call, in microseconds, after
/// `warmup` replays: how an engine that captures its decoding step runs a
/// sampler (the launch gaps of a graph, not of a stream fed by the host).
pub fn time_us_graph(
    stream: &Arc<CudaStream>,
    calls: usize,
    warmup: usize,
    reps: usize,
    f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let graph = CallGraph::capture(stream, calls, f)?;
    for _ in 0..warmup {
        graph.graph.launch()?;
    }
    graph.time_us(stream, reps)
}

/// One CUDA graph of `calls` calls, timed by replays.
pub struct CallGraph {
    graph: CudaGraph,
    calls: usize,
}

impl CallGraph {
    /// Captures the calls `f(0)` to `f(calls - 1)` on `stream`. `f(0)` runs
    /// once directly first, so that every workspace is sized before the
    /// capture; `calls` should cover every rotated input, or the replays
    /// read them from L2.
    pub fn capture(
        stream: &Arc<CudaStream>,
        calls: usize,
        mut f: impl FnMut(usize) -> Result<()>,
    ) -> Result<CallGraph> {
        let calls = calls.max(1);
        f(0)?;
        stream.synchronize()?;
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = (0..calls).try_for_each(&mut f);
        let graph = stream.end_capture(
            CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        )?;
        captured?;
        let graph = graph.ok_or_else(|| flashsample::Error::InvalidParam {
            name: "calls",
            value: "the capture recorded no launch".into(),
        })?;
        Ok(CallGraph { graph, calls })
    }

    /// Median over `reps` replays of the time per call, in microseconds.
    pub fn time_us(&self, stream: &Arc<CudaStream>, reps: usize) -> Result<f64> {
        let ctx = stream.context();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            start.record(stream)?;
            self.graph.launch()?;
            end.record(stream)?;
            end.synchronize()?;
            times.push(f64::from(start.elapsed_ms(&end)?) * 1000.0 / self.calls as f64);
        }
        Ok(median(times))
    }
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `n` bf16 values of root-mean-square `rms`: a Gaussian row of up to 16 Mi
/// values (`common::push_row`), tiled.
pub fn gaussian_bf16(rng: &mut StdRng, n: usize, rms: f32) -> Vec<bf16> {
    let mut pattern = Vec::new();
    crate::common::push_row(
        rng,
        crate::common::Dist::Gaussian,
        n.min(1 << 24),
        &mut pattern,
    );
    let now = (pattern.iter().map(|x| x * x).sum::<f32>() / pattern.len() as f32).sqrt();
    let scale = rms / now;
    pattern
        .iter()
        .cycle()
        .take(n)
        .map(|&x| bf16::from_f32(x * scale))
        .collect()
}

/// Whether the case named `case` runs: every case, unless
/// `FLASHSAMPLE_BENCH_ONLY` is set, then only those whose name contains one
/// of its `|`-separated texts (for profiling one case, e.g. under Nsight
/// Compute, or timing a few in one process: `B=128 V|B=256 V`).
pub fn selected(case: &str) -> bool {
    std::env::var("FLASHSAMPLE_BENCH_ONLY")
        .map_or(true, |only| only.split('|').any(|text| case.contains(text)))
}

fn torch_refs() -> serde_free::Json {
    serde_free::Json::load(std::env::var("FLASHSAMPLE_TORCH_REF").ok())
}

/// A tiny reader for the flat `{"case": {"name": number}}` JSON the torch
/// script writes (no JSON crate in the dependency tree).
pub mod serde_free {
    pub struct Json(String);
    impl Json {
        pub fn load(path: Option<String>) -> Json {
            Json(
                path.and_then(|p| std::fs::read_to_string(p).ok())
                    .unwrap_or_default(),
            )
        }
        /// `name: value` pairs recorded for `case`, as text.
        pub fn case(&self, case: &str) -> String {
            let key = format!("\"{case}\"");
            let Some(at) = self.0.find(&key) else {
                return "-".into();
            };
            let rest = &self.0[at + key.len()..];
            let (Some(open), Some(close)) = (rest.find('{'), rest.find('}')) else {
                return "-".into();
            };
            rest[open + 1..close]
                .split(',')
                .map(|kv| {
                    kv.trim()
                        .replace('"', "")
                        .replace("_us", "")
                        .replace(": ", " ")
                        + " us"
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// Read bandwidth of the device in bytes/s: 1 GiB of non-zero data read
/// once by `read_bandwidth_probe`, median of five.
fn read_bandwidth(dev: &Device, stream: &Arc<CudaStream>, ws: &mut Workspace) -> Result<f64> {
    let mut words = vec![0u32; 1 << 28];
    for (i, w) in words.iter_mut().enumerate() {
        *w = (i as u32).wrapping_mul(2_654_435_761);
    }
    let gib: CudaSlice<u32> = stream.clone_htod(&words)?;
    drop(words);
    let t_read = time_us(stream, 3, 5, |_| dev.read_once(stream, &gib.as_view(), ws))?;
    let read_bw = (1u64 << 30) as f64 / (t_read * 1e-6);
    println!(
        "read bandwidth: {:.0} GB/s (1 GiB in {t_read:.1} us)",
        read_bw / 1e9
    );
    Ok(read_bw)
}

/// Prints the bench's markdown table and writes it to
/// `FLASHSAMPLE_BENCH_OUT` when set.
pub fn report(table: &str) -> Result<()> {
    println!("\n{table}");
    if let Ok(path) = std::env::var("FLASHSAMPLE_BENCH_OUT") {
        std::fs::write(&path, table).map_err(|e| flashsample::Error::InvalidParam {
            name: "FLASHSAMPLE_BENCH_OUT",
            value: format!("{path}: {e}"),
        })?;
    }
    Ok(())
}

/// What every bench starts from: the device, a stream, a workspace, the
/// same-run PyTorch references and the read bandwidth measured now. `None`
/// (after the visible skip of `common::gpu`) without a GPU.
pub struct Setup {
    pub dev: Device,
    pub stream: Arc<CudaStream>,
    pub ws: Workspace,
    pub refs: serde_free::Json,
    pub read_bw: f64,
}

/// Opens the GPU for bench `name` and measures the read bandwidth.
pub fn setup(name: &str) -> Result<Option<Setup>> {
    let Some((dev, stream)) = crate::common::gpu(name) else {
        return Ok(None);
    };
    println!(
        "device: {} ({}, {} SMs)",
        dev.name()?,
        dev.arch(),
        dev.sm_count()
    );
    let mut ws = Workspace::new(&stream)?;
    let read_bw = read_bandwidth(&dev, &stream, &mut ws)?;
    Ok(Some(Setup {
        dev,
        stream,
        ws,
        refs: torch_refs(),
        read_bw,
    }))
}

// The SmolLM2 logits corpus, for the benches' real-distribution lines. A
// bench that also includes it itself gets a second copy, which is harmless.
#[allow(clippy::duplicate_mod)]
#[path = "../tests/corpus/mod.rs"]
mod corpus;

/// Width of the SmolLM2 corpus's logits rows.
pub const REAL_VOCAB: usize = 49_152;

/// Label of the real distribution in the bench reports.
pub const REAL_LABEL: &str = "real (SmolLM2 rows tiled to V)";

/// About `n` logits rows of the SmolLM2 corpus (`corpus::spread_rows`:
/// `FLASHSAMPLE_CORPUS`, else the full corpus next to the model, every
/// `count / n`-th row rounded up, so every prompt and temperature),
/// [`REAL_VOCAB`] wide; none, after a visible note, when there is no
/// readable corpus.
pub fn real_rows(n: usize) -> Vec<Vec<f32>> {
    let rows: Vec<Vec<f32>> = corpus::spread_rows("bench", n)
        .into_iter()
        .map(|r| r.logits)
        .collect();
    match rows.first() {
        Some(r) => println!(
            "logits corpus: {} real rows of {} logits",
            rows.len(),
            r.len()
        ),
        None => println!(
            "no logits corpus (cargo xtask logits-corpus, or FLASHSAMPLE_CORPUS): no real-distribution lines"
        ),
    }
    rows
}

/// `row` repeated (tiled) to `vocab` entries: the real rows are only
/// [`REAL_VOCAB`] wide, so at larger V every value occurs 2 to 6 times.
pub fn tile(row: &[f32], vocab: usize) -> impl Iterator<Item = f32> + '_ {
    row.iter().copied().cycle().take(vocab)
}

/// `count` rows of width `vocab` on the device: the rows of `distinct`
/// (any number of them, each `vocab` wide) repeated in order until `count`
/// rows are filled, copied on the device so the host holds only one set.
pub fn repeat_rows<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    distinct: &[T],
    vocab: usize,
    count: usize,
) -> Result<CudaSlice<T>> {
    let once = stream.clone_htod(distinct)?;
    let mut rows: CudaSlice<T> = stream.alloc_zeros(count * vocab)?;
    let total = count * vocab;
    let mut at = 0;
    while at < total {
        let n = distinct.len().min(total - at);
        if n == 0 {
            break;
        }
        stream.memcpy_dtod(&once.slice(..n), &mut rows.slice_mut(at..at + n))?;
        at += n;
    }
    Ok(rows)
}
