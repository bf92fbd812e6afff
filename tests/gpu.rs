//! GPU tests: every kernel against the float64 CPU reference.
//!
//! Without a GPU each test prints a visible `SKIPPED` line and passes; with
//! `FLASHSAMPLE_REQUIRE_GPU=1` (the GPU bundle) a missing GPU fails them.
//! Tests whose names start with `sanitize_` are small and cover every
//! dispatch path; the bundle also runs them under compute-sanitizer, and
//! each prints the kernels it launched ([`common::Coverage`]).

mod common;
mod corpus;

use std::sync::Arc;

use common::{Coverage, DISTS, Mismatches};
use cudarc::driver::{CudaSlice, CudaStream};
use flashsample::{Device, RowParams, Rows, SampleOutput, Workspace, reference};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TEMPERATURES: [f32; 6] = [0.0, 0.3, 1.0, 2.0, -1.0, f32::NAN];

/// A batch of rows with per-row parameters, generated on the CPU.
struct Batch {
    rows: Rows,
    logits: Vec<f32>,
    temperature: Vec<f32>,
    seed: Vec<u64>,
    offset: Vec<u64>,
}

impl Batch {
    fn random(rng: &mut StdRng, batch: usize, vocab: usize) -> Batch {
        let mut logits = Vec::with_capacity(batch * vocab);
        let mut temperature = Vec::with_capacity(batch);
        for _ in 0..batch {
            // Mostly finite distributions; the special ones a few % each.
            let dist = if rng.random_bool(0.7) {
                DISTS[rng.random_range(0..4)]
            } else {
                DISTS[rng.random_range(0..DISTS.len())]
            };
            common::push_row(rng, dist, vocab, &mut logits);
            temperature.push(TEMPERATURES[rng.random_range(0..TEMPERATURES.len())]);
        }
        Batch {
            rows: Rows::contiguous(batch, vocab),
            logits,
            temperature,
            seed: (0..batch).map(|_| rng.random()).collect(),
            offset: (0..batch)
                .map(|_| rng.random_range(0..1u64 << 40))
                .collect(),
        }
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.logits[r * self.rows.vocab..(r + 1) * self.rows.vocab]
    }

    fn params(&self, stream: &Arc<CudaStream>) -> RowParams {
        RowParams::upload(stream, &self.temperature, &self.seed, &self.offset).unwrap()
    }
}

/// Runs `sampling_from_logits` on `logits` (f32 or bf16 on the device) and
/// returns the tokens, `None` for rows flagged invalid. Outputs are poisoned
/// first so that unwritten rows show.
fn sample_on_gpu<T: flashsample::LogitElem>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    logits: &CudaSlice<T>,
    b: &Batch,
    ws: &mut Workspace,
) -> Vec<Option<u32>> {
    let params = b.params(stream);
    let mut out = SampleOutput::new(stream, b.rows.batch).unwrap();
    stream
        .memcpy_htod(&vec![u32::MAX; b.rows.batch], &mut out.tokens)
        .unwrap();
    stream
        .memcpy_htod(&vec![7u8; b.rows.batch], &mut out.valid)
        .unwrap();
    dev.sampling_from_logits(stream, &logits.as_view(), b.rows, &params, &mut out, ws)
        .unwrap();
    let tokens = stream.clone_dtoh(&out.tokens).unwrap();
    let valid = stream.clone_dtoh(&out.valid).unwrap();
    tokens
        .iter()
        .zip(&valid)
        .map(|(&t, &v)| {
            assert!(v <= 1, "valid flag not written: {v}");
            assert!(
                t < b.rows.vocab as u32,
                "token {t} outside [0, {})",
                b.rows.vocab
            );
            (v == 1).then_some(t)
        })
        .collect()
}

/// Checks GPU tokens against the float64 reference on every row, in
/// parallel over the CPU's cores.
fn check_against_reference(
    b: &Batch,
    got: &[Option<u32>],
    report: &mut Mismatches,
    widen: impl Fn(&[f32]) -> Vec<f32> + Sync,
) {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = b.rows.batch.div_ceil(threads);
    let results: Vec<Vec<(usize, Result<(), String>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let widen = &widen;
                s.spawn(move || {
                    (t * per..((t + 1) * per).min(b.rows.batch))
                        .map(|r| {
                            let row = widen(b.row(r));
                            (
                                r,
                                reference::tokens_agree(
                                    &row,
                                    b.temperature[r],
                                    b.seed[r],
                                    b.offset[r],
                                    got[r],
                                ),
                            )
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.into_iter().flatten() {
        report.check(res.is_ok(), || {
            format!(
                "V={} row {r} T={} seed={:#x} offset={}: {}",
                b.rows.vocab,
                b.temperature[r],
                b.seed[r],
                b.offset[r],
                res.unwrap_err()
            )
        });
    }
}

/// The diagnostic kernels: the approximate Gumbel noise stays within the
/// samplers' filter bound over all 2^32 words (a compute-only scan, fast
/// under compute-sanitizer too), and the read-bandwidth probe reads a
/// buffer shorter than its grid and one longer (2^20 16-byte words: two
/// grid strides on an H200).
#[test]
fn sanitize_probes() {
    const TEST: &str = "sanitize_probes";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut coverage = Coverage::default();
    let err = dev.gumbel_filter_max_error(&stream).unwrap();
    println!("max |approx - exact| Gumbel noise over all 2^32 words: {err:e}");
    assert!(
        err <= flashsample::kernels::noise::GUMBEL_APPROX_ERR,
        "approximate Gumbel noise error {err:e} exceeds the filter's bound"
    );
    coverage.case(&["gumbel_filter_error_probe"]);
    let mut ws = Workspace::new(&stream).unwrap();
    for words in [4usize, 1 << 22] {
        let data: CudaSlice<u32> = stream.alloc_zeros(words).unwrap();
        dev.read_once(&stream, &data.as_view(), &mut ws).unwrap();
        stream.synchronize().unwrap();
        coverage.case(&["read_bandwidth_probe"]);
    }
    coverage.report(TEST);
}

/// At least 10,000 rows, V from 111 to 262144, every distribution (ties,
/// +-inf, NaN, invalid rows) and temperature (greedy included).
#[test]
fn sampling_f32_matches_float64_reference() {
    let Some((dev, stream)) = common::gpu("sampling_f32_matches_float64_reference") else {
        return;
    };
    let mut rng = common::rng("sampling_f32_matches_float64_reference");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let plan = [
        (111, 3500),
        (1000, 2000),
        (4099, 2000),
        (32_000, 1500),
        (128_256, 500),
        (151_936, 300),
        (262_144, 200),
    ];
    for (vocab, batch) in plan {
        let b = Batch::random(&mut rng, batch, vocab);
        let d_logits = stream.clone_htod(&b.logits).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d_logits, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| r.to_vec());
    }
    assert!(report.checked >= 10_000);
    report.assert_none("f32 tokens vs float64 reference");
}

#[test]
fn sampling_bf16_matches_float64_reference() {
    let Some((dev, stream)) = common::gpu("sampling_bf16_matches_float64_reference") else {
        return;
    };
    let mut rng = common::rng("sampling_bf16_matches_float64_reference");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    for (vocab, batch) in [
        (111, 500),
        (1001, 500),
        (4096, 500),
        (49_152, 300),
        (151_936, 100),
    ] {
        let b = Batch::random(&mut rng, batch, vocab);
        let h: Vec<half::bf16> = b.logits.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let d_logits = stream.clone_htod(&h).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d_logits, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| {
            r.iter().map(|&x| common::bf16_round(x)).collect()
        });
    }
    report.assert_none("bf16 tokens vs float64 reference");
}

/// The same rows give the same tokens whatever the batch size (which changes
/// the number of blocks per row) and the row's position.
#[test]
fn sampling_is_independent_of_batch_and_position() {
    let Some((dev, stream)) = common::gpu("sampling_is_independent_of_batch_and_position") else {
        return;
    };
    let mut rng = common::rng("sampling_is_independent_of_batch_and_position");
    let mut ws = Workspace::new(&stream).unwrap();
    for vocab in [111usize, 32_000, 151_936] {
        let probe = Batch::random(&mut rng, 8, vocab);
        let alone = {
            let d = stream.clone_htod(&probe.logits).unwrap();
            sample_on_gpu(&dev, &stream, &d, &probe, &mut ws)
        };
        for batch in [9usize, 64, 700] {
            let mut big = Batch::random(&mut rng, batch, vocab);
            // Scatter the probe rows over the big batch, in reverse order.
            let slots: Vec<usize> = (0..8).map(|i| (batch - 1) - i * (batch / 8)).collect();
            for (i, &s) in slots.iter().enumerate() {
                big.logits[s * vocab..(s + 1) * vocab].copy_from_slice(probe.row(i));
                big.temperature[s] = probe.temperature[i];
                big.seed[s] = probe.seed[i];
                big.offset[s] = probe.offset[i];
            }
            let d = stream.clone_htod(&big.logits).unwrap();
            let got = sample_on_gpu(&dev, &stream, &d, &big, &mut ws);
            for (i, &s) in slots.iter().enumerate() {
                assert_eq!(
                    got[s], alone[i],
                    "V={vocab} B={batch}: row {i} moved to {s} changed its token"
                );
            }
        }
    }
}

/// Draws `batch * steps` tokens: `call` samples a batch of identical rows
/// with the given per-row parameters (distinct offsets for every draw) and
/// returns the tokens; checks the counts against `probs` by chi-square at
/// 99 %.
#[allow(clippy::too_many_arguments)]
fn assert_draws_follow(
    what: &str,
    stream: &Arc<CudaStream>,
    batch: usize,
    steps: u64,
    temperature: f32,
    seed: u64,
    probs: &[f64],
    mut call: impl FnMut(&RowParams) -> Vec<u32>,
) {
    let mut counts = vec![0u64; probs.len()];
    for step in 0..steps {
        let offsets: Vec<u64> = (0..batch as u64).map(|r| step * batch as u64 + r).collect();
        let params = RowParams::upload(
            stream,
            &vec![temperature; batch],
            &vec![seed; batch],
            &offsets,
        )
        .unwrap();
        for t in call(&params) {
            counts[t as usize] += 1;
        }
    }
    let p = reference::stats::chi_square(&counts, probs)
        .unwrap()
        .p_value;
    println!(
        "{what}: chi-square over {} draws, V = {}: p = {p:.4}",
        batch as u64 * steps,
        probs.len()
    );
    assert!(
        p > 0.01,
        "{what}: draws do not follow the exact distribution: p = {p}"
    );
}

/// 10^6 draws from a 16-token vocabulary against the exact softmax
/// distribution, at 99 %.
#[test]
fn sampling_chi_square_small_vocab() {
    let Some((dev, stream)) = common::gpu("sampling_chi_square_small_vocab") else {
        return;
    };
    let mut rng = common::rng("sampling_chi_square_small_vocab");
    let vocab = 16;
    let batch = 10_000;
    let row: Vec<f32> = (0..vocab).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
    let temperature = 0.9f32;
    let probs = reference::softmax(&row, temperature).unwrap();
    let logits: Vec<f32> = (0..batch).flat_map(|_| row.iter().copied()).collect();
    let d_logits = stream.clone_htod(&logits).unwrap();
    let mut ws = Workspace::new(&stream).unwrap();
    let mut out = SampleOutput::new(&stream, batch).unwrap();
    let rows = Rows::contiguous(batch, vocab);
    assert_draws_follow(
        "sampling_from_logits",
        &stream,
        batch,
        100,
        temperature,
        rng.random(),
        &probs,
        |params| {
            dev.sampling_from_logits(
                &stream,
                &d_logits.as_view(),
                rows,
                params,
                &mut out,
                &mut ws,
            )
            .unwrap();
            stream.clone_dtoh(&out.tokens).unwrap()
        },
    );
}

#[test]
fn softmax_matches_float64_reference() {
    let Some((dev, stream)) = common::gpu("softmax_matches_float64_reference") else {
        return;
    };
    let mut rng = common::rng("softmax_matches_float64_reference");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    for (vocab, batch) in [(111, 200), (8193, 100), (128_256, 40)] {
        let b = Batch::random(&mut rng, batch, vocab);
        let d_logits = stream.clone_htod(&b.logits).unwrap();
        let d_t = stream.clone_htod(&b.temperature).unwrap();
        let mut probs: CudaSlice<f32> = stream.clone_htod(&vec![f32::NAN; batch * vocab]).unwrap();
        dev.softmax(
            &stream,
            &d_logits.as_view(),
            b.rows,
            &d_t.as_view(),
            &mut probs.as_view_mut(),
            &mut ws,
        )
        .unwrap();
        let got = stream.clone_dtoh(&probs).unwrap();
        for r in 0..batch {
            let want = reference::softmax(b.row(r), b.temperature[r]).unwrap();
            for (j, (&g, &w)) in got[r * vocab..(r + 1) * vocab]
                .iter()
                .zip(&want)
                .enumerate()
            {
                let ok = (f64::from(g) - w).abs() <= 2e-5 * w + 1e-9;
                report.check(ok, || {
                    format!(
                        "V={vocab} row {r} T={} j={j}: got {g:e} ({:#010x}), want {w:e}",
                        b.temperature[r],
                        g.to_bits()
                    )
                });
            }
        }
    }
    report.assert_none("softmax vs float64 reference");
}

/// Small cases over every dispatch path (one block per row, several blocks
/// with the last-block reduction, vector and scalar loads, both dtypes,
/// ragged tails); the bundle runs these under compute-sanitizer.
#[test]
fn sanitize_sampling_paths() {
    const TEST: &str = "sanitize_sampling_paths";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(11);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut coverage = Coverage::default();
    // V <= 1024: one block per row; larger V at small B: several. Vector
    // loads where rows are 16-byte aligned and V is a multiple of the
    // vector's lanes (8192, 1000, 100000, 9000), scalar loads elsewhere.
    // Blocks of several rounds take the wide kernels while the grid fits in
    // four blocks a multiprocessor (100000 x 64: about 16672 elements a
    // block on an H200, above 8192 on any GPU of up to 260 SMs), the seeded
    // kernels past it (9000 x 1200: one block a row, more rows than four a
    // multiprocessor on any GPU of up to 299 SMs).
    for (vocab, batch, kernel) in [
        (111, 1, ""),
        (111, 3, ""),
        (4099, 3, ""),
        (8192, 1, ""),
        (1000, 700, ""),
        (20_001, 5, ""),
        (100_000, 64, "wide_"),
        (9000, 1200, "seeded_"),
    ] {
        let b = Batch::random(&mut rng, batch, vocab);
        let d = stream.clone_htod(&b.logits).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| r.to_vec());
        coverage.case(&[&format!("sampling_from_logits_{kernel}f32")]);
        let h: Vec<half::bf16> = b.logits.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let d = stream.clone_htod(&h).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| {
            r.iter().map(|&x| common::bf16_round(x)).collect()
        });
        coverage.case(&[&format!("sampling_from_logits_{kernel}bf16")]);
    }
    report.assert_none("sanitize: sampling paths");
    coverage.report(TEST);
}

/// Softmax over one block per row (V = 111) and several (8193, 20000).
#[test]
fn sanitize_softmax_paths() {
    const TEST: &str = "sanitize_softmax_paths";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(12);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut coverage = Coverage::default();
    for (vocab, batch) in [(111, 3), (8193, 2), (20_000, 1)] {
        let b = Batch::random(&mut rng, batch, vocab);
        let d = stream.clone_htod(&b.logits).unwrap();
        let t = stream.clone_htod(&b.temperature).unwrap();
        let mut p: CudaSlice<f32> = stream.alloc_zeros(batch * vocab).unwrap();
        dev.softmax(
            &stream,
            &d.as_view(),
            b.rows,
            &t.as_view(),
            &mut p.as_view_mut(),
            &mut ws,
        )
        .unwrap();
        let got = stream.clone_dtoh(&p).unwrap();
        for r in 0..batch {
            let s: f64 = got[r * vocab..(r + 1) * vocab]
                .iter()
                .map(|&x| f64::from(x))
                .sum();
            let want: f64 = reference::softmax(b.row(r), b.temperature[r])
                .unwrap()
                .iter()
                .sum();
            assert!((s - want).abs() < 1e-4, "row {r}: mass {s}, want {want}");
        }
        coverage.case(&["softmax_stats_f32", "softmax_write_f32"]);
    }
    coverage.report(TEST);
}

/// Wrong arguments are rejected before any launch, with typed errors.
#[test]
fn bad_arguments_are_rejected() {
    let Some((dev, stream)) = common::gpu("bad_arguments_are_rejected") else {
        return;
    };
    let mut ws = Workspace::new(&stream).unwrap();
    let logits: CudaSlice<f32> = stream.alloc_zeros(100).unwrap();
    let params = RowParams::upload(&stream, &[1.0; 2], &[1; 2], &[0; 2]).unwrap();
    let mut out = SampleOutput::new(&stream, 2).unwrap();
    let mut call = |rows: Rows, out: &mut SampleOutput| {
        dev.sampling_from_logits(&stream, &logits.as_view(), rows, &params, out, &mut ws)
    };
    assert!(
        call(Rows::contiguous(2, 51), &mut out).is_err(),
        "buffer too short"
    );
    assert!(
        call(Rows::contiguous(3, 10), &mut out).is_err(),
        "params too short"
    );
    assert!(
        call(Rows::contiguous(0, 10), &mut out).is_err(),
        "empty batch"
    );
    assert!(
        call(
            Rows {
                batch: 2,
                vocab: 10,
                row_stride: 5
            },
            &mut out
        )
        .is_err(),
        "stride < vocab"
    );
    let mut small = SampleOutput::new(&stream, 1).unwrap();
    assert!(
        call(Rows::contiguous(2, 10), &mut small).is_err(),
        "output too short"
    );
    assert!(call(Rows::contiguous(2, 50), &mut out).is_ok());
    let raw = flashsample::RawSampling {
        logits: 0,
        dtype: flashsample::DType::F32,
        rows: Rows::contiguous(1, 10),
        temperature: 0,
        seed: 0,
        offset: 0,
        tokens: 0,
        valid: 0,
    };
    // SAFETY: null pointers must be rejected before any launch.
    let err = unsafe { dev.sampling_from_logits_raw(&stream, &raw, &mut ws) };
    assert!(
        matches!(
            err,
            Err(flashsample::Error::InvalidParam { name: "logits", .. })
        ),
        "{err:?}"
    );
}

/// A random LM-head problem: hidden states `[batch, dim]`, weights
/// `[vocab, dim]` (bf16 values, kept widened to f32 for the reference),
/// optional bias, per-row parameters.
struct Head {
    shape: flashsample::HeadShape,
    hidden: Vec<f32>,
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    temperature: Vec<f32>,
    seed: Vec<u64>,
    offset: Vec<u64>,
}

impl Head {
    fn random(rng: &mut StdRng, batch: usize, vocab: usize, dim: usize, with_bias: bool) -> Head {
        let normal = |rng: &mut StdRng| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        };
        // Logits of a few units: |h| ~ 1, |W| ~ 3 / sqrt(dim).
        let ws = 3.0 / (dim as f32).sqrt();
        let hidden = (0..batch * dim)
            .map(|_| common::bf16_round(normal(rng)))
            .collect();
        let weight = (0..vocab * dim)
            .map(|_| common::bf16_round(ws * normal(rng)))
            .collect();
        let bias = with_bias.then(|| (0..vocab).map(|_| normal(rng)).collect());
        Head {
            shape: flashsample::HeadShape::new(batch, vocab, dim),
            hidden,
            weight,
            bias,
            temperature: (0..batch)
                .map(|_| [0.0f32, 0.3, 1.0, 2.0][rng.random_range(0..4)])
                .collect(),
            seed: (0..batch).map(|_| rng.random()).collect(),
            offset: (0..batch)
                .map(|_| rng.random_range(0..1u64 << 40))
                .collect(),
        }
    }

    fn reference(&self, r: usize) -> reference::HeadLogits {
        let d = self.shape.dim;
        reference::lm_head_logits(
            &self.hidden[r * d..(r + 1) * d],
            &self.weight,
            self.bias.as_deref(),
        )
        .unwrap()
    }
}

fn to_bf16(x: &[f32]) -> Vec<half::bf16> {
    x.iter().map(|&v| half::bf16::from_f32(v)).collect()
}

/// Runs the fused sampler on `head` with its operands converted by `to`
/// (to bf16 or f16) and returns (tokens, log normalisers, logprobs);
/// outputs poisoned first.
fn fused_on_gpu<T: flashsample::HeadElem>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    head: &Head,
    ws: &mut Workspace,
    to: fn(f32) -> T,
) -> (Vec<Option<u32>>, Vec<f32>, Vec<f32>) {
    let b = head.shape.batch;
    let convert = |x: &[f32]| x.iter().map(|&v| to(v)).collect::<Vec<T>>();
    let h = stream.clone_htod(&convert(&head.hidden)).unwrap();
    let w = stream.clone_htod(&convert(&head.weight)).unwrap();
    let bias = head.bias.as_ref().map(|b| stream.clone_htod(b).unwrap());
    let params = RowParams::upload(stream, &head.temperature, &head.seed, &head.offset).unwrap();
    let mut out = flashsample::FusedOutput::new(stream, b).unwrap();
    stream
        .memcpy_htod(&vec![u32::MAX; b], &mut out.tokens)
        .unwrap();
    stream.memcpy_htod(&vec![7u8; b], &mut out.valid).unwrap();
    stream
        .memcpy_htod(&vec![f32::NAN; b], &mut out.log_normalizer)
        .unwrap();
    let bias_view = bias.as_ref().map(|b| b.as_view());
    dev.fused_sample(
        stream,
        &h.as_view(),
        &w.as_view(),
        bias_view.as_ref(),
        head.shape,
        &params,
        &mut out,
        ws,
    )
    .unwrap();
    let tokens = stream.clone_dtoh(&out.tokens).unwrap();
    let valid = stream.clone_dtoh(&out.valid).unwrap();
    let tokens = tokens
        .iter()
        .zip(&valid)
        .map(|(&t, &v)| {
            assert!(v <= 1, "valid flag not written: {v}");
            assert!(
                t < head.shape.vocab as u32,
                "token {t} outside [0, {})",
                head.shape.vocab
            );
            (v == 1).then_some(t)
        })
        .collect();
    (
        tokens,
        stream.clone_dtoh(&out.log_normalizer).unwrap(),
        stream.clone_dtoh(&out.logprob).unwrap(),
    )
}

/// Checks every row of a fused call against the float64 reference: token
/// (within the f32-accumulation bound), log-normaliser and log-probability.
fn check_fused(head: &Head, got: &(Vec<Option<u32>>, Vec<f32>, Vec<f32>), report: &mut Mismatches) {
    for r in 0..head.shape.batch {
        let refl = head.reference(r);
        let (t, s, o) = (head.temperature[r], head.seed[r], head.offset[r]);
        let res = reference::fused_tokens_agree(&refl, t, s, o, got.0[r]);
        report.check(res.is_ok(), || {
            format!(
                "B={} V={} d={} row {r} T={t}: {}",
                head.shape.batch,
                head.shape.vocab,
                head.shape.dim,
                res.unwrap_err()
            )
        });
        // ln sum exp(logit / T) (T = 1 for greedy rows) in f64, and its
        // error bound from the logits' bounds.
        let scale = if t > 0.0 { 1.0 / f64::from(t) } else { 1.0 };
        let m = refl
            .logits
            .iter()
            .fold(f64::NEG_INFINITY, |a, &x| a.max(x * scale));
        let lse = m + refl
            .logits
            .iter()
            .map(|&x| (x * scale - m).exp())
            .sum::<f64>()
            .ln();
        let err = refl.error_bound.iter().fold(0.0f64, |a, &e| a.max(e)) * scale
            + 1e-5 * (1.0 + lse.abs());
        let ok = (f64::from(got.1[r]) - lse).abs() <= err;
        report.check(ok, || {
            format!(
                "row {r}: log-normaliser {} vs float64 {lse} (bound {err:e})",
                got.1[r]
            )
        });
        if let Some(tok) = got.0[r] {
            let lp = refl.logits[tok as usize] * scale - lse;
            let ok = (f64::from(got.2[r]) - lp).abs() <= 2.0 * err;
            report.check(ok, || {
                format!("row {r}: logprob {} vs float64 {lp}", got.2[r])
            });
        }
    }
}

/// At least 2,000 random (B, V, d) cases, V and d not multiples of any tile,
/// B from 1 to 256, temperatures {0, 0.3, 1, 2}, with and without bias.
#[test]
fn fused_matches_float64_reference() {
    let Some((dev, stream)) = common::gpu("fused_matches_float64_reference") else {
        return;
    };
    let mut rng = common::rng("fused_matches_float64_reference");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut cases = 0;
    for i in 0..2000 {
        let batch = [1usize, 2, 7, 16, 17, 33, 64, 65, 130, 256][i % 10].min(if i % 7 == 0 {
            256
        } else {
            40
        });
        let vocab = [1usize, 127, 128, 129, 1000, 2053][rng.random_range(0..6)];
        let dim = 8 * rng.random_range(1..=48);
        let head = Head::random(&mut rng, batch, vocab, dim, i % 3 == 0);
        let got = fused_on_gpu(&dev, &stream, &head, &mut ws, half::bf16::from_f32);
        check_fused(&head, &got, &mut report);
        cases += 1;
    }
    // Two cases at a real head's size.
    for (batch, vocab, dim) in [(4, 151_936, 4096), (3, 128_256, 1000)] {
        let head = Head::random(&mut rng, batch, vocab, dim, false);
        let got = fused_on_gpu(&dev, &stream, &head, &mut ws, half::bf16::from_f32);
        check_fused(&head, &got, &mut report);
        cases += 1;
    }
    println!("{cases} fused cases");
    report.assert_none("fused tokens, log-normalisers and logprobs vs float64 reference");
}

/// The portable modules on this GPU, where the build embeds them and they
/// run here: `sm_90` (the kernels and routes of GPUs newer than Hopper:
/// clusters and programmatic launches, no `wgmma`) and `sm_80` (Ampere's
/// and Ada's, whose module is the same code: no clusters), each opened
/// with [`Device::with_module`]. Sampling (one-round, seeded and wide
/// kernels) and the fused sampler's 16-, 32-, 64- and 128-row tiles against
/// the float64 reference. The module the GPU picks itself is the other
/// tests' subject.
#[test]
fn portable_modules_match_float64_reference() {
    const TEST: &str = "portable_modules_match_float64_reference";
    let Some((dev, _)) = common::gpu(TEST) else {
        return;
    };
    let (major, minor) = dev.context().compute_capability().unwrap();
    let mut rng = common::rng(TEST);
    for arch in ["sm_90", "sm_80"] {
        if arch == dev.arch() || !flashsample::module_runs_on(arch, major, minor) {
            continue;
        }
        if !Device::modules().any(|m| m == arch) {
            println!(
                "SKIPPED {TEST} for {arch}: not embedded in this build \
                 (FLASHSAMPLE_PTX_ARCHES={})",
                Device::modules().collect::<Vec<_>>().join(",")
            );
            continue;
        }
        let d = Device::with_module(0, arch).unwrap();
        assert_eq!(d.arch(), arch);
        let stream = d.new_stream().unwrap();
        let mut ws = Workspace::new(&stream).unwrap();
        let mut report = Mismatches::default();
        // One-round blocks (small rows), seeded blocks (many rows), wide
        // blocks (one wave of several rounds).
        for (vocab, batch) in [(111, 300), (4099, 200), (128_256, 32), (151_936, 300)] {
            let b = Batch::random(&mut rng, batch, vocab);
            let d_logits = stream.clone_htod(&b.logits).unwrap();
            let got = sample_on_gpu(&d, &stream, &d_logits, &b, &mut ws);
            check_against_reference(&b, &got, &mut report, |r| r.to_vec());
        }
        report.assert_none(&format!("{arch}: f32 tokens vs float64 reference"));
        let mut report = Mismatches::default();
        for (batch, vocab, dim, bias) in [
            (3, 300, 64, true),
            (20, 257, 40, false),
            (40, 300, 136, true),
            (70, 300, 24, true),
            (4, 151_936, 4096, false),
        ] {
            let head = Head::random(&mut rng, batch, vocab, dim, bias);
            let got = fused_on_gpu(&d, &stream, &head, &mut ws, half::bf16::from_f32);
            check_fused(&head, &got, &mut report);
        }
        report.assert_none(&format!("{arch}: fused sampling vs float64 reference"));
        println!("{TEST}: module {arch} checked");
    }
}

/// The fused and the unfused (cuBLAS logits + sampling_from_logits)
/// pipelines agree on at least 99.9 % of rows for the same seeds; every
/// disagreement is a near-tie within the f32 bound.
#[test]
fn fused_agrees_with_unfused_pipeline() {
    let Some((dev, stream)) = common::gpu("fused_agrees_with_unfused_pipeline") else {
        return;
    };
    let mut rng = common::rng("fused_agrees_with_unfused_pipeline");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut unfused = flashsample::Unfused::new(&stream).unwrap();
    let (mut rows, mut same) = (0usize, 0usize);
    let mut report = Mismatches::default();
    for (batch, vocab, dim) in [
        (256, 32_000, 512),
        (64, 50_000, 1024),
        (7, 151_936, 2048),
        (256, 4099, 256),
    ] {
        let head = Head::random(&mut rng, batch, vocab, dim, false);
        let fused = fused_on_gpu(&dev, &stream, &head, &mut ws, half::bf16::from_f32);
        let h = stream.clone_htod(&to_bf16(&head.hidden)).unwrap();
        let w = stream.clone_htod(&to_bf16(&head.weight)).unwrap();
        let params =
            RowParams::upload(&stream, &head.temperature, &head.seed, &head.offset).unwrap();
        let mut out = SampleOutput::new(&stream, batch).unwrap();
        unfused
            .sample(
                &dev,
                &h.as_view(),
                &w.as_view(),
                head.shape,
                &params,
                &mut out,
                &mut ws,
            )
            .unwrap();
        let tokens = stream.clone_dtoh(&out.tokens).unwrap();
        for (r, &token) in tokens.iter().enumerate().take(batch) {
            rows += 1;
            if fused.0[r] == Some(token) {
                same += 1;
            } else {
                let refl = head.reference(r);
                let res = reference::fused_tokens_agree(
                    &refl,
                    head.temperature[r],
                    head.seed[r],
                    head.offset[r],
                    Some(token),
                );
                report.check(res.is_ok(), || {
                    format!("unfused token off the reference: {}", res.unwrap_err())
                });
            }
        }
    }
    println!("fused == unfused on {same} of {rows} rows");
    report.assert_none("unfused disagreements are near-ties");
    assert!(
        same as f64 >= 0.999 * rows as f64,
        "fused and unfused agree on only {same} of {rows} rows"
    );
}

/// A row's token and log-normaliser bits do not depend on the batch (which
/// picks the batch tile of 16, 32, 64 or 128 rows and the grid) or its
/// position.
#[test]
fn fused_is_independent_of_batch_and_position() {
    let Some((dev, stream)) = common::gpu("fused_is_independent_of_batch_and_position") else {
        return;
    };
    let mut rng = common::rng("fused_is_independent_of_batch_and_position");
    let mut ws = Workspace::new(&stream).unwrap();
    let (vocab, dim) = (20_011, 264);
    let probe = Head::random(&mut rng, 4, vocab, dim, true);
    let alone = fused_on_gpu(&dev, &stream, &probe, &mut ws, half::bf16::from_f32);
    for batch in [5usize, 31, 64, 200] {
        let mut big = Head::random(&mut rng, batch, vocab, dim, true);
        big.weight.clone_from(&probe.weight);
        big.bias.clone_from(&probe.bias);
        let slots: Vec<usize> = (0..4).map(|i| batch - 1 - i * (batch / 4)).collect();
        for (i, &s) in slots.iter().enumerate() {
            big.hidden[s * dim..(s + 1) * dim]
                .copy_from_slice(&probe.hidden[i * dim..(i + 1) * dim]);
            big.temperature[s] = probe.temperature[i];
            big.seed[s] = probe.seed[i];
            big.offset[s] = probe.offset[i];
        }
        let got = fused_on_gpu(&dev, &stream, &big, &mut ws, half::bf16::from_f32);
        for (i, &s) in slots.iter().enumerate() {
            assert_eq!(
                got.0[s], alone.0[i],
                "B={batch}: row {i} at {s} changed its token"
            );
            assert_eq!(
                got.1[s].to_bits(),
                alone.1[i].to_bits(),
                "B={batch}: row {i} at {s} changed its log-normaliser"
            );
        }
    }
}

/// 10^6 fused draws from a 48-token head against the exact distribution of
/// its (float64) logits, at 99 %.
#[test]
fn fused_chi_square_small_head() {
    let Some((dev, stream)) = common::gpu("fused_chi_square_small_head") else {
        return;
    };
    let mut rng = common::rng("fused_chi_square_small_head");
    let mut ws = Workspace::new(&stream).unwrap();
    let (batch, vocab, dim) = (1000usize, 48usize, 64usize);
    let one = Head::random(&mut rng, 1, vocab, dim, false);
    let t = 1.0f32;
    let refl = one.reference(0);
    let m = refl.logits.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
    let z: f64 = refl.logits.iter().map(|&x| (x - m).exp()).sum();
    let probs: Vec<f64> = refl.logits.iter().map(|&x| (x - m).exp() / z).collect();
    let hidden: Vec<f32> = (0..batch)
        .flat_map(|_| one.hidden.iter().copied())
        .collect();
    let h = stream.clone_htod(&to_bf16(&hidden)).unwrap();
    let w = stream.clone_htod(&to_bf16(&one.weight)).unwrap();
    let mut out = flashsample::FusedOutput::new(&stream, batch).unwrap();
    let shape = flashsample::HeadShape::new(batch, vocab, dim);
    assert_draws_follow(
        "fused_sample",
        &stream,
        batch,
        1000,
        t,
        rng.random(),
        &probs,
        |params| {
            dev.fused_sample(
                &stream,
                &h.as_view(),
                &w.as_view(),
                None,
                shape,
                params,
                &mut out,
                &mut ws,
            )
            .unwrap();
            stream.clone_dtoh(&out.tokens).unwrap()
        },
    );
}

/// Small fused cases over every variant (bf16 and f16 operands, batch tiles
/// 16/32/64/128 and several batch tiles, vocabulary and k tails, bias, a
/// last step of two tiles with one); run under compute-sanitizer by the
/// bundle.
#[test]
fn sanitize_fused_paths() {
    const TEST: &str = "sanitize_fused_paths";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(13);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut coverage = Coverage::default();
    // (batch, vocab, dim, bias); B = 130 takes two tiles of 128 rows; V =
    // 300 has three tiles, so the 64- and 128-row kernels' last step has
    // one.
    for (batch, vocab, dim, bias) in [
        (1, 1, 8, false),
        (17, 129, 72, true),
        (40, 300, 136, true),
        (65, 300, 136, false),
        (130, 129, 64, true),
        (3, 1000, 64, true),
    ] {
        let head = Head::random(&mut rng, batch, vocab, dim, bias);
        let got = fused_on_gpu(&dev, &stream, &head, &mut ws, half::bf16::from_f32);
        check_fused(&head, &got, &mut report);
        coverage.case(&[
            &common::fused_tile_kernel::<half::bf16>(&dev, batch),
            "fused_sample_finish",
        ]);
    }
    // f16 operands: the same values rounded to f16 (the reference reads the
    // f16 values).
    let f16_values =
        |x: &[f32]| -> Vec<f32> { x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect() };
    for (batch, vocab, dim, bias) in [
        (9, 257, 40, false),
        (20, 130, 48, true),
        (40, 200, 24, false),
        (70, 300, 24, true),
    ] {
        let head = Head::random(&mut rng, batch, vocab, dim, bias);
        let head = Head {
            hidden: f16_values(&head.hidden),
            weight: f16_values(&head.weight),
            ..head
        };
        let got = fused_on_gpu(&dev, &stream, &head, &mut ws, half::f16::from_f32);
        check_fused(&head, &got, &mut report);
        coverage.case(&[
            &common::fused_tile_kernel::<half::f16>(&dev, batch),
            "fused_sample_finish",
        ]);
    }
    report.assert_none("sanitize: fused paths");
    coverage.report(TEST);
}

#[test]
fn samplers_replay_from_cuda_graphs() {
    use std::cell::RefCell;
    let Some((dev, stream)) = common::gpu("samplers_replay_from_cuda_graphs") else {
        return;
    };
    let mut rng = common::rng("samplers_replay_from_cuda_graphs");
    let ws = RefCell::new(Workspace::new(&stream).unwrap());
    // sampling_from_logits with several blocks per row (B = 3) and one
    // (B = 600). Broad rows (logits uniform in [0, 4), T = 1), so that an
    // advanced offset changes some token: with the random distributions
    // three peaked rows could all keep theirs (seen once on the H200).
    for batch in [3usize, 600] {
        let mut b = Batch::random(&mut rng, batch, 4099);
        b.logits
            .iter_mut()
            .for_each(|x| *x = rng.random_range(0.0f32..4.0));
        b.temperature.iter_mut().for_each(|t| *t = 1.0);
        let logits = stream.clone_htod(&b.logits).unwrap();
        let out = RefCell::new(SampleOutput::new(&stream, batch).unwrap());
        common::check_graph_replays(
            &stream,
            &mut b.params(&stream),
            |p| &mut p.offset,
            &b.offset,
            |p| {
                dev.sampling_from_logits(
                    &stream,
                    &logits.as_view(),
                    b.rows,
                    p,
                    &mut out.borrow_mut(),
                    &mut ws.borrow_mut(),
                )
                .unwrap()
            },
            || stream.clone_dtoh(&out.borrow().tokens).unwrap(),
            true,
        );
    }
    let mut head = Head::random(&mut rng, 20, 3001, 96, false);
    head.temperature.iter_mut().for_each(|t| *t = 1.0);
    let hidden = stream.clone_htod(&to_bf16(&head.hidden)).unwrap();
    let weight = stream.clone_htod(&to_bf16(&head.weight)).unwrap();
    let out = RefCell::new(flashsample::FusedOutput::new(&stream, 20).unwrap());
    common::check_graph_replays(
        &stream,
        &mut RowParams::upload(&stream, &head.temperature, &head.seed, &head.offset).unwrap(),
        |p| &mut p.offset,
        &head.offset,
        |p| {
            let (h, w) = (hidden.as_view(), weight.as_view());
            dev.fused_sample(
                &stream,
                &h,
                &w,
                None,
                head.shape,
                p,
                &mut out.borrow_mut(),
                &mut ws.borrow_mut(),
            )
            .unwrap()
        },
        || stream.clone_dtoh(&out.borrow().tokens).unwrap(),
        true,
    );
}

/// The same sampler called from four host threads on four streams at once
/// (each with its own workspace) gives the per-row results of serial calls.
#[test]
fn concurrent_calls_on_several_streams_agree_with_serial_calls() {
    const TEST: &str = "concurrent_calls_on_several_streams_agree_with_serial_calls";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let batches: Vec<Batch> = [1, 7, 64, 300]
        .into_iter()
        .map(|n| Batch::random(&mut rng, n, 32_000))
        .collect();
    common::check_concurrent(
        &dev,
        &stream,
        &batches,
        20,
        |s| Workspace::new(s).unwrap(),
        |s, ws, b| {
            let d = s.clone_htod(&b.logits).unwrap();
            sample_on_gpu(&dev, s, &d, b, ws)
        },
    );
}

/// The fused sampler called from four host threads on four streams at
/// once (each with its own workspace) gives the tokens, log-normalisers and
/// log-probabilities of serial calls, bit for bit.
#[test]
fn fused_concurrent_calls_on_several_streams_agree_with_serial_calls() {
    const TEST: &str = "fused_concurrent_calls_on_several_streams_agree_with_serial_calls";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let heads: Vec<Head> = [
        (1, 3001, 96),
        (7, 5000, 128),
        (33, 2048, 64),
        (64, 4099, 160),
    ]
    .into_iter()
    .map(|(b, v, d)| Head::random(&mut rng, b, v, d, true))
    .collect();
    common::check_concurrent(
        &dev,
        &stream,
        &heads,
        10,
        |s| Workspace::new(s).unwrap(),
        |s, ws, head| {
            let (t, lse, lp) = fused_on_gpu(&dev, s, head, ws, half::bf16::from_f32);
            // Floats as bits, so that NaN outputs compare too.
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            (t, bits(lse), bits(lp))
        },
    );
}

/// Real logits (SmolLM2-135M, 49152 tokens: heavy right tails, spikes,
/// near-ties) through sampling_from_logits (f32 and bf16) and softmax, at
/// the corpus row's own temperature and at 0.3, 1 and 2.
#[test]
fn samplers_match_float64_reference_on_real_logits() {
    let Some((dev, stream)) = common::gpu("samplers_match_float64_reference_on_real_logits") else {
        return;
    };
    let rows = corpus::spread_rows("samplers_match_float64_reference_on_real_logits", 120);
    if rows.is_empty() {
        return;
    }
    let mut rng = common::rng("samplers_match_float64_reference_on_real_logits");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let vocab = rows[0].logits.len();
    for t in [None, Some(0.3f32), Some(1.0), Some(2.0)] {
        let batch = rows.len();
        let b = Batch {
            rows: Rows::contiguous(batch, vocab),
            logits: rows.iter().flat_map(|r| r.logits.iter().copied()).collect(),
            temperature: rows.iter().map(|r| t.unwrap_or(r.temperature)).collect(),
            seed: (0..batch).map(|_| rng.random()).collect(),
            offset: (0..batch)
                .map(|_| rng.random_range(0..1u64 << 40))
                .collect(),
        };
        let d = stream.clone_htod(&b.logits).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| r.to_vec());
        let h: Vec<half::bf16> = b.logits.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let d16 = stream.clone_htod(&h).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d16, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| {
            r.iter().map(|&x| common::bf16_round(x)).collect()
        });
        let d_t = stream.clone_htod(&b.temperature).unwrap();
        let mut probs: CudaSlice<f32> = stream.alloc_zeros(batch * vocab).unwrap();
        dev.softmax(
            &stream,
            &d.as_view(),
            b.rows,
            &d_t.as_view(),
            &mut probs.as_view_mut(),
            &mut ws,
        )
        .unwrap();
        let p = stream.clone_dtoh(&probs).unwrap();
        for r in 0..batch {
            let want = reference::softmax(b.row(r), b.temperature[r]).unwrap();
            let worst = p[r * vocab..(r + 1) * vocab]
                .iter()
                .zip(&want)
                .map(|(&g, &w)| (f64::from(g) - w).abs() / (2e-5 * w + 1e-9))
                .fold(0.0f64, f64::max);
            report.check(worst <= 1.0, || {
                format!(
                    "real row {r} T={}: softmax off by {worst:.2} x its tolerance",
                    b.temperature[r]
                )
            });
        }
    }
    println!("{} real rows", rows.len());
    report.assert_none("samplers on real logits vs float64 reference");
}
