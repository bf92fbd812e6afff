//! GPU tests: every kernel against the float64 CPU reference.
//!
//! Without a GPU each test prints a visible `SKIPPED` line and passes; with
//! `FLASHSAMPLE_REQUIRE_GPU=1` (the GPU bundle) a missing GPU fails them.
//! Tests whose names start with `sanitize_` are small and cover every
//! dispatch path; the bundle also runs them under compute-sanitizer.

mod common;

use std::sync::Arc;

use common::{DISTS, Mismatches};
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

#[test]
fn gumbel_filter_error_is_within_its_bound() {
    let Some((dev, stream)) = common::gpu("gumbel_filter_error_is_within_its_bound") else {
        return;
    };
    let err = dev.gumbel_filter_max_error(&stream).unwrap();
    println!("max |approx - exact| Gumbel noise over all 2^32 words: {err:e}");
    assert!(
        err <= flashsample::kernels::noise::GUMBEL_APPROX_ERR,
        "approximate Gumbel noise error {err:e} exceeds the filter's bound"
    );
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
    let seed: u64 = rng.random();
    let mut counts = vec![0u64; vocab];
    for step in 0..100u64 {
        let offsets: Vec<u64> = (0..batch as u64).map(|r| step * batch as u64 + r).collect();
        let params = RowParams::upload(
            &stream,
            &vec![temperature; batch],
            &vec![seed; batch],
            &offsets,
        )
        .unwrap();
        dev.sampling_from_logits(
            &stream,
            &d_logits.as_view(),
            Rows::contiguous(batch, vocab),
            &params,
            &mut out,
            &mut ws,
        )
        .unwrap();
        for t in stream.clone_dtoh(&out.tokens).unwrap() {
            counts[t as usize] += 1;
        }
    }
    let p = reference::stats::chi_square(&counts, &probs)
        .unwrap()
        .p_value;
    println!("chi-square over 10^6 draws, V = {vocab}: p = {p:.4}");
    assert!(p > 0.01, "draws do not follow softmax(x / T): p = {p}");
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
    let Some((dev, stream)) = common::gpu("sanitize_sampling_paths") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(11);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    for (vocab, batch) in [
        (111, 1),
        (111, 3),
        (4099, 3),
        (8192, 1),
        (1000, 700),
        (20_001, 5),
    ] {
        let b = Batch::random(&mut rng, batch, vocab);
        let d = stream.clone_htod(&b.logits).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| r.to_vec());
        let h: Vec<half::bf16> = b.logits.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let d = stream.clone_htod(&h).unwrap();
        let got = sample_on_gpu(&dev, &stream, &d, &b, &mut ws);
        check_against_reference(&b, &got, &mut report, |r| {
            r.iter().map(|&x| common::bf16_round(x)).collect()
        });
    }
    report.assert_none("sanitize: sampling paths");
}

#[test]
fn sanitize_softmax_paths() {
    let Some((dev, stream)) = common::gpu("sanitize_softmax_paths") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(12);
    let mut ws = Workspace::new(&stream).unwrap();
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
    }
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
