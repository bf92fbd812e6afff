//! Test and bench support: the GPU gate, logits generators, mismatch
//! reports, the kernel coverage of the sanitize tests, the CUDA-graph
//! replay check.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream};
use flashsample::Device;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The GPU and a stream, or `None` after a visible skip message when there
/// is no usable GPU. With `FLASHSAMPLE_REQUIRE_GPU=1` (set by the GPU
/// bundle) a missing GPU fails the test instead.
pub fn gpu(test: &str) -> Option<(Device, Arc<CudaStream>)> {
    match Device::new(0).and_then(|d| Ok((d.new_stream()?, d))) {
        Ok((s, d)) => Some((d, s)),
        Err(e) => {
            if std::env::var("FLASHSAMPLE_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("FLASHSAMPLE_REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            // Written straight to stderr so that the test harness does not
            // capture it: skips must be visible.
            let _ = writeln!(std::io::stderr(), "SKIPPED {test}: no GPU ({e})");
            None
        }
    }
}

/// A seeded RNG; the seed is printed so a failure can be replayed
/// (`FLASHSAMPLE_TEST_SEED` overrides it).
pub fn rng(test: &str) -> StdRng {
    let seed = std::env::var("FLASHSAMPLE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("{test}: seed {seed} (FLASHSAMPLE_TEST_SEED to replay)");
    StdRng::seed_from_u64(seed)
}

/// Shapes of logits rows the tests and benches draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    /// N(0, sigma) with sigma in [0.5, 8].
    Gaussian,
    /// Student-t with 2 degrees of freedom, scaled: a heavy right tail.
    HeavyTail,
    /// Gaussian rounded to bf16: many exact ties.
    Bf16Quantised,
    /// A few values only: ties everywhere, at the maximum too.
    FewValues,
    /// Gaussian with NaN, -inf, +inf, +-0 sprinkled in.
    Special,
    /// Entirely NaN / -inf (invalid rows).
    Invalid,
    /// One +inf entry or several.
    PosInf,
}

pub const DISTS: [Dist; 7] = [
    Dist::Gaussian,
    Dist::HeavyTail,
    Dist::Bf16Quantised,
    Dist::FewValues,
    Dist::Special,
    Dist::Invalid,
    Dist::PosInf,
];

fn normal(rng: &mut StdRng) -> f32 {
    // Box-Muller; rand_distr is not a dependency.
    let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

pub fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Appends one row of `vocab` logits of distribution `dist` to `out`.
pub fn push_row(rng: &mut StdRng, dist: Dist, vocab: usize, out: &mut Vec<f32>) {
    let sigma = rng.random_range(0.5f32..8.0);
    let start = out.len();
    match dist {
        Dist::Gaussian => out.extend((0..vocab).map(|_| sigma * normal(rng))),
        Dist::HeavyTail => out.extend((0..vocab).map(|_| {
            let z = normal(rng);
            let c = normal(rng).powi(2) + normal(rng).powi(2);
            2.0 * z / (c / 2.0).sqrt().max(1e-3)
        })),
        Dist::Bf16Quantised => out.extend((0..vocab).map(|_| bf16_round(sigma * normal(rng)))),
        Dist::FewValues => {
            let k = rng.random_range(1..4);
            out.extend((0..vocab).map(|_| rng.random_range(0..k) as f32));
        }
        Dist::Special => {
            out.extend((0..vocab).map(|_| sigma * normal(rng)));
            for _ in 0..rng.random_range(1..8) {
                let i = start + rng.random_range(0..vocab);
                out[i] = match rng.random_range(0..4) {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => 0.0,
                    _ => -0.0,
                };
            }
        }
        Dist::Invalid => out.extend((0..vocab).map(|i| {
            if i % 3 == 0 {
                f32::NAN
            } else {
                f32::NEG_INFINITY
            }
        })),
        Dist::PosInf => {
            out.extend((0..vocab).map(|_| sigma * normal(rng)));
            for _ in 0..rng.random_range(1..4) {
                let i = start + rng.random_range(0..vocab);
                out[i] = f32::INFINITY;
            }
        }
    }
}

/// Collects mismatches and reports the first few, with bit patterns.
#[derive(Default)]
pub struct Mismatches {
    pub count: usize,
    pub checked: usize,
    pub first: Vec<String>,
}

impl Mismatches {
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.count += 1;
            if self.first.len() < 8 {
                self.first.push(what());
            }
        }
    }

    pub fn assert_none(&self, what: &str) {
        assert!(
            self.count == 0,
            "{what}: {} of {} checks failed; first:\n  {}",
            self.count,
            self.checked,
            self.first.join("\n  ")
        );
        println!("{what}: {} checks, all passed", self.checked);
    }
}

/// The kernel entry points a `sanitize_*` test launched, and its number of
/// cases. The GPU bundle's sanitizer step collects the line that
/// [`Coverage::report`] prints from every sanitize test and fails unless
/// together they launched every entry point of
/// `flashsample::kernels::ENTRY_POINTS`.
#[derive(Default)]
pub struct Coverage {
    kernels: BTreeSet<&'static str>,
    cases: usize,
}

impl Coverage {
    /// Records one case that launched `kernels`: entry-point names, as the
    /// host's launch wrappers pick them.
    pub fn case(&mut self, kernels: &[&str]) {
        for &k in kernels {
            let name = flashsample::kernels::ENTRY_POINTS
                .iter()
                .find(|&&e| e == k)
                .unwrap_or_else(|| panic!("`{k}` is not a kernel entry point"));
            self.kernels.insert(name);
        }
        self.cases += 1;
    }

    /// Prints `sanitize coverage: <test>: kernels <k1>,<k2>,...; cases <n>`,
    /// straight to stdout so that the test harness does not capture it.
    pub fn report(&self, test: &str) {
        let kernels: Vec<&str> = self.kernels.iter().copied().collect();
        let _ = writeln!(
            std::io::stdout(),
            "sanitize coverage: {test}: kernels {}; cases {}",
            kernels.join(","),
            self.cases
        );
    }
}

/// Captures `launch` once into a CUDA graph on `stream` and instantiates
/// it. Every buffer `launch` uses must exist and every workspace be sized
/// beforehand (a direct call does that), so that the capture allocates
/// nothing.
pub fn capture_graph(stream: &Arc<CudaStream>, launch: impl FnOnce()) -> CudaGraph {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    launch();
    stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("the capture recorded the launches")
}

/// The same sampler from several host threads at once: `call(stream,
/// workspace, item)` runs for every item serially on `stream` (one
/// workspace), then from one thread per item, all at once, each on its own
/// stream of `dev` with its own workspace (`new_ws`), `repeats` times; each
/// thread's repeats must agree and equal the serial result (so no scratch
/// is shared between streams).
pub fn check_concurrent<I: Sync, W, R: PartialEq + Send>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    items: &[I],
    repeats: usize,
    new_ws: impl Fn(&Arc<CudaStream>) -> W + Sync,
    call: impl Fn(&Arc<CudaStream>, &mut W, &I) -> R + Sync,
) {
    let mut ws = new_ws(stream);
    let serial: Vec<R> = items.iter().map(|i| call(stream, &mut ws, i)).collect();
    let concurrent: Vec<R> = std::thread::scope(|s| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| {
                let (new_ws, call) = (&new_ws, &call);
                s.spawn(move || {
                    let stream = dev.new_stream().unwrap();
                    let mut ws = new_ws(&stream);
                    let first = call(&stream, &mut ws, item);
                    for _ in 1..repeats {
                        assert!(
                            call(&stream, &mut ws, item) == first,
                            "repeated calls on one stream disagree"
                        );
                    }
                    first
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (n, (s, c)) in serial.iter().zip(&concurrent).enumerate() {
        assert!(
            s == c,
            "item {n}: concurrent calls on several streams changed the results"
        );
    }
}

/// Captures `launch` once into a CUDA graph and replays it: the same
/// offsets reproduce the tokens bit for bit, advanced offsets (written into
/// the device buffer `offset(params)` between replays, as an engine does)
/// give the tokens of a direct call with those offsets. `tokens` reads the
/// call's output. With `must_change`, the advanced offsets must change some
/// token (the replay reads them from device memory): callers whose rows
/// might all have one candidate (k = 1, a tiny top-p, greedy, invalid),
/// which keeps its token whatever the offset, pass false.
pub fn check_graph_replays<P>(
    stream: &Arc<CudaStream>,
    params: &mut P,
    offset: impl Fn(&mut P) -> &mut CudaSlice<u64>,
    base: &[u64],
    mut launch: impl FnMut(&P),
    tokens: impl Fn() -> Vec<u32>,
    must_change: bool,
) {
    let shifted: Vec<u64> = base.iter().map(|o| o + 1).collect();
    stream.memcpy_htod(&shifted, offset(params)).unwrap();
    launch(params);
    let direct_shifted = tokens();
    stream.memcpy_htod(base, offset(params)).unwrap();
    launch(params); // also sizes the workspace, so that capture allocates nothing
    let direct = tokens();
    let graph = capture_graph(stream, || launch(params));
    let mut replay = |offs: &[u64]| {
        stream.memcpy_htod(offs, offset(params)).unwrap();
        graph.launch().unwrap();
        tokens()
    };
    let first = replay(base);
    assert_eq!(first, direct, "the replay differs from the direct call");
    assert_eq!(
        replay(base),
        first,
        "a replay with the same offsets changed the tokens"
    );
    assert_eq!(
        replay(&shifted),
        direct_shifted,
        "a replay with advanced offsets differs from a direct call"
    );
    assert!(
        !must_change || direct != direct_shifted,
        "advancing the offsets changed no token"
    );
}

/// The tile kernel `fused_sample` launches on `dev` for `batch` rows of
/// `T` operands (host/src/fused_lm_head.rs): that of the smallest batch
/// tile of 16, 32, 64 or 128 rows that holds the batch, 128 for larger
/// batches, and at least 64 rows in the sm_90a module.
pub fn fused_tile_kernel<T: flashsample::HeadElem>(dev: &Device, batch: usize) -> String {
    let dtype = if T::IS_BF16 { "bf16" } else { "f16" };
    let rows = if dev.arch() == "sm_90a" {
        batch.max(64)
    } else {
        batch
    };
    let tile = match rows {
        0..=16 => 16,
        17..=32 => 32,
        33..=64 => 64,
        _ => 128,
    };
    format!("fused_sample_{dtype}_b{tile}")
}
