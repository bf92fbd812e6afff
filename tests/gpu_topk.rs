//! GPU tests of the Qrita top-k / top-p / min-p kernels (`topk_topp_*`)
//! against the float64 sorted reference.
//!
//! Without a GPU each test prints a visible `SKIPPED` line and passes; with
//! `FLASHSAMPLE_REQUIRE_GPU=1` (the GPU bundle) a missing GPU fails them.
//! Tests whose names start with `sanitize_` are small and cover every
//! path; the bundle also runs them under compute-sanitizer, and each prints
//! the kernels it launched ([`common::Coverage`]).

mod common;

use std::sync::Arc;

use common::{Coverage, DISTS, Dist, Mismatches};
use cudarc::driver::{CudaSlice, CudaStream};
use flashsample::kernels::params::TopkToppLayout;
use flashsample::kernels::radix_select::{self, FILTER_DIRECT_KEYS, FILTER_SMALL_MAX_K};
use flashsample::reference::{self, SamplingParams};
use flashsample::{
    Device, MAX_FILTER_CLUSTER, Route, Rows, SampleOutput, TopkToppRoute, TruncParams, Workspace,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TOP_P: [f32; 5] = [1e-6, 0.5, 0.9, 0.99, 1.0];
const MIN_P: [f32; 2] = [0.0, 0.05];

/// A batch of rows with per-row truncation parameters.
struct Batch {
    rows: Rows,
    logits: Vec<f32>,
    params: Vec<SamplingParams>,
    what: Vec<&'static str>,
}

/// A row whose k-th value repeats across the top-k boundary: `m < k`
/// distinct large values, then `k - m + extra` copies of one value, the
/// rest below it.
fn push_tie_row(rng: &mut StdRng, vocab: usize, k: usize, out: &mut Vec<f32>) {
    let start = out.len();
    out.extend((0..vocab).map(|_| -1.0 - rng.random_range(0.0f32..4.0)));
    let k = k.clamp(1, vocab);
    let m = rng.random_range(0..k);
    let ties = (k - m + rng.random_range(1..6)).min(vocab - m);
    let mut idx: Vec<usize> = (0..vocab).collect();
    for i in 0..(m + ties) {
        let j = rng.random_range(i..vocab);
        idx.swap(i, j);
    }
    for (n, &j) in idx[..m].iter().enumerate() {
        out[start + j] = 10.0 + n as f32 * 0.125;
    }
    for &j in &idx[m..m + ties] {
        out[start + j] = 5.0;
    }
}

/// Parameters of `batch` rows at temperature 1 cycling through `trunc`'s
/// (top_k, top_p, min_p), with random seeds and offsets.
fn cycled_params(rng: &mut StdRng, batch: usize, trunc: &[(u32, f32, f32)]) -> Vec<SamplingParams> {
    (0..batch)
        .map(|r| {
            let (top_k, top_p, min_p) = trunc[r % trunc.len()];
            SamplingParams {
                temperature: 1.0,
                top_k,
                top_p,
                min_p,
                seed: rng.random(),
                offset: rng.random_range(0..1 << 40),
            }
        })
        .collect()
}

impl Batch {
    fn random(rng: &mut StdRng, batch: usize, vocab: usize) -> Batch {
        let v = vocab as u32;
        let ks = [1u32, 2, 50, 1000, v - 1, v, 0];
        let mut logits = Vec::with_capacity(batch * vocab);
        let mut params = Vec::with_capacity(batch);
        let mut what = Vec::with_capacity(batch);
        for _ in 0..batch {
            let top_k = ks[rng.random_range(0..ks.len())];
            if rng.random_bool(0.12) {
                push_tie_row(rng, vocab, top_k.max(1) as usize, &mut logits);
                what.push("ties at k");
            } else {
                let dist = if rng.random_bool(0.7) {
                    DISTS[rng.random_range(0..4)]
                } else {
                    DISTS[rng.random_range(0..DISTS.len())]
                };
                common::push_row(rng, dist, vocab, &mut logits);
                what.push(dist_name(dist));
            }
            let temperature = match rng.random_range(0..12) {
                0 => 0.0,
                1 => 0.5,
                2 => 2.0,
                _ => 1.0,
            };
            params.push(SamplingParams {
                temperature,
                top_k,
                top_p: TOP_P[rng.random_range(0..TOP_P.len())],
                min_p: MIN_P[rng.random_range(0..MIN_P.len())],
                seed: rng.random(),
                offset: rng.random_range(0..1 << 40),
            });
        }
        Batch {
            rows: Rows::contiguous(batch, vocab),
            logits,
            params,
            what,
        }
    }

    /// Rows that keep many tokens under every truncation, so that a new
    /// offset changes some draws: logits uniform in [0, 4), temperature 1,
    /// top-k, top-p and min-p alone and together.
    fn broad(rng: &mut StdRng, batch: usize, vocab: usize) -> Batch {
        const TRUNC: [(u32, f32, f32); 4] = [
            (50, 1.0, 0.0),
            (0, 0.9, 0.0),
            (0, 1.0, 0.05),
            (1000, 0.9, 0.05),
        ];
        let logits = (0..batch * vocab)
            .map(|_| rng.random_range(0.0f32..4.0))
            .collect();
        let params = cycled_params(rng, batch, &TRUNC);
        Batch {
            rows: Rows::contiguous(batch, vocab),
            logits,
            params,
            what: vec!["uniform"; batch],
        }
    }

    /// Rows whose candidates crowd into the first chunk of 8192: logits
    /// uniform in [-4, 0) and 4000 draws of the first 8192 set in [5, 6)
    /// (about 3160 distinct), so that the pre-filter's first tier holds
    /// more than one chunk may list (at least 1024, 2730 at V = 20001) and
    /// the selection reads the row instead of the lists.
    fn crowded(rng: &mut StdRng, batch: usize, vocab: usize) -> Batch {
        const TRUNC: [(u32, f32, f32); 4] = [
            (1000, 0.9, 0.0),
            (50, 1.0, 0.0),
            (0, 0.9, 0.0),
            (1200, 0.99, 0.05),
        ];
        let mut logits = Vec::with_capacity(batch * vocab);
        for _ in 0..batch {
            let start = logits.len();
            logits.extend((0..vocab).map(|_| rng.random_range(-4.0f32..0.0)));
            for _ in 0..4000 {
                let j = rng.random_range(0..vocab.min(8192));
                logits[start + j] = rng.random_range(5.0f32..6.0);
            }
        }
        let params = cycled_params(rng, batch, &TRUNC);
        Batch {
            rows: Rows::contiguous(batch, vocab),
            logits,
            params,
            what: vec!["crowded first chunk"; batch],
        }
    }

    /// Student-t rows (two degrees of freedom) under top-k 1000 or 2000:
    /// the Gaussian pre-filter's first tier misses on many of them (too
    /// few above its threshold, or more than the lists hold), so the
    /// selection refines the threshold from a histogram of the row's keys
    /// before it lists the candidates.
    fn heavy(rng: &mut StdRng, batch: usize, vocab: usize) -> Batch {
        const TRUNC: [(u32, f32, f32); 4] = [
            (1000, 0.9, 0.0),
            (1000, 1.0, 0.0),
            (2000, 0.99, 0.05),
            (2000, 1.0, 0.0),
        ];
        let mut logits = Vec::with_capacity(batch * vocab);
        for _ in 0..batch {
            common::push_row(rng, Dist::HeavyTail, vocab, &mut logits);
        }
        let params = cycled_params(rng, batch, &TRUNC);
        Batch {
            rows: Rows::contiguous(batch, vocab),
            logits,
            params,
            what: vec!["heavy tail, k >= 1000"; batch],
        }
    }

    /// This batch's rows followed by `other`'s.
    fn then(mut self, other: Batch) -> Batch {
        self.logits.extend_from_slice(&other.logits);
        self.params.extend_from_slice(&other.params);
        self.what.extend_from_slice(&other.what);
        self.rows = Rows::contiguous(self.params.len(), self.rows.vocab);
        self
    }

    /// This batch with every row's top-k in `1..=min(1024, V - 1)` (the
    /// radix route's calls): top-k outside it (off, 0, V - 1 and above
    /// 1024) replaced by one of 1, 50, 1000 and that largest.
    fn slab_top_k(self, rng: &mut StdRng) -> Batch {
        self.slab_top_k_up_to(rng, 1024)
    }

    /// [`Batch::slab_top_k`] with `cap` (at most 1024) in place of 1024:
    /// top-k in `1..=min(cap, V - 1)`, outside it one of 1, 50, 1000 (each
    /// at most that largest) and that largest.
    fn slab_top_k_up_to(mut self, rng: &mut StdRng, cap: u32) -> Batch {
        let most = cap.min(self.rows.vocab as u32 - 1);
        let ks = [1, 50.min(most), 1000.min(most), most];
        for p in &mut self.params {
            if p.top_k == 0 || p.top_k > most {
                p.top_k = ks[rng.random_range(0..ks.len())];
            }
        }
        self
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.logits[r * self.rows.vocab..(r + 1) * self.rows.vocab]
    }

    fn upload(&self, stream: &Arc<CudaStream>) -> TruncParams {
        let p = &self.params;
        TruncParams::upload(
            stream,
            &p.iter().map(|p| p.top_k).collect::<Vec<_>>(),
            &p.iter().map(|p| p.top_p).collect::<Vec<_>>(),
            &p.iter().map(|p| p.min_p).collect::<Vec<_>>(),
            &p.iter().map(|p| p.temperature).collect::<Vec<_>>(),
            &p.iter().map(|p| p.seed).collect::<Vec<_>>(),
            &p.iter().map(|p| p.offset).collect::<Vec<_>>(),
        )
        .unwrap()
    }
}

fn dist_name(d: Dist) -> &'static str {
    match d {
        Dist::Gaussian => "gaussian",
        Dist::HeavyTail => "heavy tail",
        Dist::Bf16Quantised => "bf16",
        Dist::FewValues => "few values",
        Dist::Special => "special",
        Dist::Invalid => "invalid",
        Dist::PosInf => "+inf",
    }
}

/// Masks a copy of the batch on the GPU: (masked logits, kept counts).
/// The kept counts are poisoned first.
fn mask_on_gpu(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    params: &TruncParams,
    ws: &mut Workspace,
) -> (Vec<f32>, Vec<u32>) {
    let mut d = stream.clone_htod(&b.logits).unwrap();
    let mut kept = stream.clone_htod(&vec![u32::MAX; b.rows.batch]).unwrap();
    dev.top_k_top_p_mask_logits(stream, &mut d.as_view_mut(), b.rows, params, &mut kept, ws)
        .unwrap();
    (
        stream.clone_dtoh(&d).unwrap(),
        stream.clone_dtoh(&kept).unwrap(),
    )
}

/// Samples the batch on the GPU: a token per row, `None` where flagged
/// invalid. Outputs are poisoned first.
fn sample_on_gpu(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    params: &TruncParams,
    ws: &mut Workspace,
) -> Vec<Option<u32>> {
    let d = stream.clone_htod(&b.logits).unwrap();
    let mut out = SampleOutput::new(stream, b.rows.batch).unwrap();
    stream
        .memcpy_htod(&vec![u32::MAX; b.rows.batch], &mut out.tokens)
        .unwrap();
    stream
        .memcpy_htod(&vec![7u8; b.rows.batch], &mut out.valid)
        .unwrap();
    dev.sample_top_k_top_p(stream, &d.as_view(), b.rows, params, &mut out, ws)
        .unwrap();
    let tokens = stream.clone_dtoh(&out.tokens).unwrap();
    let valid = stream.clone_dtoh(&out.valid).unwrap();
    tokens
        .iter()
        .zip(&valid)
        .map(|(&t, &v)| {
            assert!(v <= 1, "valid flag not written: {v}");
            assert!(t < b.rows.vocab as u32, "token {t} outside the vocabulary");
            (v == 1).then_some(t)
        })
        .collect()
}

/// Runs `check(r)` over every row on all CPU cores; returns (row, result).
fn par_rows(
    batch: usize,
    check: impl Fn(usize) -> Result<(), String> + Sync,
) -> Vec<(usize, Result<(), String>)> {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = batch.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let check = &check;
                s.spawn(move || {
                    (t * per..((t + 1) * per).min(batch))
                        .map(|r| (r, check(r)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// One masked row against the reference: kept entries keep their bits,
/// every other entry is -inf, the kept set (its entries that are not -inf
/// in the input) equals the reference's, exactly or, when top-p is within
/// its 1e-6 band, as `kept_sets_agree` allows; the kept count matches.
fn check_masked_row(
    row: &[f32],
    p: &SamplingParams,
    masked: &[f32],
    kept: u32,
) -> Result<(), String> {
    let neg_inf = f32::NEG_INFINITY.to_bits();
    let mut gpu = Vec::new();
    for (j, (&x, &m)) in row.iter().zip(masked).enumerate() {
        if m.to_bits() != neg_inf {
            if m.to_bits() != x.to_bits() {
                return Err(format!(
                    "index {j}: kept {x:e} ({:#010x}) came back as {m:e} ({:#010x})",
                    x.to_bits(),
                    m.to_bits()
                ));
            }
            gpu.push(j as u32);
        }
    }
    let near = reference::top_p_near_boundary(row, p).map_err(|e| e.to_string())?;
    if near {
        // top-p < 1 is active: its kept set has positive weights only.
        reference::kept_sets_agree(row, p, &gpu)?;
        if kept as usize != gpu.len() {
            return Err(format!("kept count {kept}, {} entries kept", gpu.len()));
        }
        return Ok(());
    }
    let want = reference::kept_set(row, p).map_err(|e| e.to_string())?;
    if kept as usize != want.len() {
        return Err(format!("kept count {kept}, reference {}", want.len()));
    }
    let mut want: Vec<u32> = want
        .into_iter()
        .filter(|&j| row[j as usize].to_bits() != neg_inf)
        .collect();
    want.sort_unstable();
    if want != gpu {
        // Reuse the reference's detailed report.
        reference::kept_sets_agree(row, p, &gpu)?;
        return Err(format!(
            "kept sets differ ({} reference entries that are not -inf, {} GPU)",
            want.len(),
            gpu.len()
        ));
    }
    Ok(())
}

/// One sampled token against the reference: valid iff the row is; the token
/// in the kept set; equal to `reference::sample_top_k_top_p`'s unless the
/// cumulative kept mass at the GPU token's interval lies within rounding
/// of `u`, or top-p is in its 1e-6 band (then in the slightly larger set).
fn check_sampled_row(row: &[f32], p: &SamplingParams, got: Option<u32>) -> Result<(), String> {
    let want = reference::sample_top_k_top_p(row, p).map_err(|e| e.to_string())?;
    let (Some(g), Some(w)) = (got, want) else {
        return if got.is_none() && want.is_none() {
            Ok(())
        } else {
            Err(format!("GPU {got:?}, reference {want:?}"))
        };
    };
    if g == w {
        return Ok(());
    }
    let near = reference::top_p_near_boundary(row, p).map_err(|e| e.to_string())?;
    let kept = if near {
        let wider = SamplingParams {
            top_p: (p.top_p * (1.0 + 1e-5)).min(1.0),
            ..*p
        };
        reference::kept_set(row, &wider).map_err(|e| e.to_string())?
    } else {
        reference::kept_set(row, p).map_err(|e| e.to_string())?
    };
    let Some(pos) = kept.iter().position(|&j| j == g) else {
        return Err(format!("token {g} outside the kept set (reference {w})"));
    };
    if near {
        return Ok(());
    }
    // Cumulative mass of the kept set in the total order, as the reference.
    let max = row[kept[0] as usize];
    let greedy = p.temperature.is_nan() || p.temperature <= 0.0;
    let weight = |x: f32| -> f64 {
        if greedy {
            1.0
        } else if max == f32::INFINITY {
            f64::from(u8::from(x == f32::INFINITY))
        } else if x > f32::NEG_INFINITY {
            ((f64::from(x) - f64::from(max)) / f64::from(p.temperature)).exp()
        } else {
            0.0
        }
    };
    let ws: Vec<f64> = kept.iter().map(|&j| weight(row[j as usize])).collect();
    let mass: f64 = ws.iter().sum();
    let before: f64 = ws[..pos].iter().sum::<f64>() / mass;
    let after = before + ws[pos] / mass;
    let u = f64::from(flashsample::kernels::noise::uniform_open(
        flashsample::kernels::philox::row_uniform_bits(
            flashsample::kernels::philox::seed_key(p.seed),
            p.offset,
            0,
        ),
    ));
    let eps = 1e-6;
    if before <= u + eps && after >= u - eps {
        Ok(())
    } else {
        Err(format!(
            "token {g} (cumulative {before:.9}..{after:.9}), reference {w}, u = {u:.9}"
        ))
    }
}

fn report_rows(b: &Batch, results: Vec<(usize, Result<(), String>)>, report: &mut Mismatches) {
    for (r, res) in results {
        report.check(res.is_ok(), || {
            format!(
                "V={} row {r} ({}) {:?}: {}",
                b.rows.vocab,
                b.what[r],
                b.params[r],
                res.unwrap_err()
            )
        });
    }
}

/// Masks `b` twice, checks the runs are bit-identical and every row against
/// the reference.
fn check_mask_batch(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    ws: &mut Workspace,
    report: &mut Mismatches,
) {
    let params = b.upload(stream);
    let (masked, kept) = mask_on_gpu(dev, stream, b, &params, ws);
    let (masked2, kept2) = mask_on_gpu(dev, stream, b, &params, ws);
    report.check(kept == kept2, || {
        format!("V={}: kept counts differ between runs", b.rows.vocab)
    });
    let same = masked
        .iter()
        .zip(&masked2)
        .all(|(a, c)| a.to_bits() == c.to_bits());
    report.check(same, || {
        format!("V={}: masked logits differ between runs", b.rows.vocab)
    });
    let v = b.rows.vocab;
    let results = par_rows(b.rows.batch, |r| {
        check_masked_row(b.row(r), &b.params[r], &masked[r * v..(r + 1) * v], kept[r])
    });
    report_rows(b, results, report);
}

/// Samples `b` twice, checks the runs agree and every row against the
/// reference.
fn check_sample_batch(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    ws: &mut Workspace,
    report: &mut Mismatches,
) {
    let params = b.upload(stream);
    let got = sample_on_gpu(dev, stream, b, &params, ws);
    let got2 = sample_on_gpu(dev, stream, b, &params, ws);
    report.check(got == got2, || {
        format!("V={}: tokens differ between runs", b.rows.vocab)
    });
    let results = par_rows(b.rows.batch, |r| {
        check_sampled_row(b.row(r), &b.params[r], got[r])
    });
    report_rows(b, results, report);
}

#[test]
fn topk_mask_matches_float64_reference() {
    let Some((dev, stream)) = common::gpu("topk_mask_matches_float64_reference") else {
        return;
    };
    let mut rng = common::rng("topk_mask_matches_float64_reference");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut rows = 0;
    // 10,300 rows in all.
    for (vocab, batch, repeats) in [
        (111, 1000, 4),
        (4099, 1000, 4),
        (32_000, 500, 4),
        (151_936, 100, 3),
    ] {
        for _ in 0..repeats {
            let b = Batch::random(&mut rng, batch, vocab);
            check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
            rows += batch;
        }
    }
    assert!(rows >= 10_000);
    report.assert_none(&format!("top-k/top-p mask, {rows} rows"));
}

#[test]
fn topk_sample_matches_float64_reference() {
    let Some((dev, stream)) = common::gpu("topk_sample_matches_float64_reference") else {
        return;
    };
    let mut rng = common::rng("topk_sample_matches_float64_reference");
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    for (vocab, batch) in [(111, 2000), (4099, 2000), (32_000, 500), (151_936, 100)] {
        let b = Batch::random(&mut rng, batch, vocab);
        check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
    }
    report.assert_none("top-k/top-p sampling");
}

/// Rows whose pre-filter candidates overflow the lists (selection from the
/// row) next to rows that fit, at V = 151936 (19 chunks) and 262144:
/// masked sets and draws equal the reference.
#[test]
fn topk_rows_whose_candidates_overflow_the_lists_match_float64_reference() {
    const TEST: &str = "topk_rows_whose_candidates_overflow_the_lists_match_float64_reference";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    for vocab in [151_936, 262_144] {
        let b = Batch::crowded(&mut rng, 8, vocab).then(Batch::random(&mut rng, 8, vocab));
        check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
        check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
    }
    // Heavy tails: the refined threshold (or the row, when its lists
    // overflow too).
    for vocab in [32_000, 128_256] {
        let b = Batch::heavy(&mut rng, 16, vocab);
        check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
        check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
        check_renorm_kept_batch(&dev, &stream, &b, &mut ws, &mut report);
    }
    report.assert_none("top-k/top-p rows that overflow the lists");
}

/// The renormalised probabilities, the kept sets and the masked logits of
/// one batch, each from its own call: `(probs, kept counts of the renorm
/// call, kept counts of the kept-set call, indices with `capacity` a row)`.
/// Outputs are poisoned first.
fn renorm_and_kept_on_gpu(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    params: &TruncParams,
    capacity: usize,
    ws: &mut Workspace,
) -> (Vec<f32>, Vec<u32>, Vec<u32>, Vec<u32>) {
    let d = stream.clone_htod(&b.logits).unwrap();
    let (batch, vocab) = (b.rows.batch, b.rows.vocab);
    let mut probs = stream.clone_htod(&vec![f32::NAN; batch * vocab]).unwrap();
    let mut kept_r = stream.clone_htod(&vec![u32::MAX; batch]).unwrap();
    dev.top_k_top_p_renorm_probs(
        stream,
        &d.as_view(),
        b.rows,
        params,
        &mut probs.as_view_mut(),
        &mut kept_r,
        ws,
    )
    .unwrap();
    let mut kept_s = stream.clone_htod(&vec![u32::MAX; batch]).unwrap();
    let mut indices = stream
        .clone_htod(&vec![u32::MAX; batch * capacity])
        .unwrap();
    dev.top_k_top_p_kept_set(
        stream,
        &d.as_view(),
        b.rows,
        params,
        &mut kept_s,
        &mut indices.as_view_mut(),
        capacity,
        ws,
    )
    .unwrap();
    let logits_after = stream.clone_dtoh(&d).unwrap();
    assert!(
        logits_after
            .iter()
            .zip(&b.logits)
            .all(|(a, c)| a.to_bits() == c.to_bits()),
        "the renorm and kept-set calls wrote the logits"
    );
    (
        stream.clone_dtoh(&probs).unwrap(),
        stream.clone_dtoh(&kept_r).unwrap(),
        stream.clone_dtoh(&kept_s).unwrap(),
        stream.clone_dtoh(&indices).unwrap(),
    )
}

/// One row's renormalised probabilities and kept set against the float64
/// reference: the kept set (ascending, all of it when `capacity` holds it,
/// else its first `capacity`) equals the reference's (as
/// `kept_sets_agree` allows in top-p's 1e-6 band); both calls report its
/// size; the probabilities sum to 1 (1e-4) and, where the kept set is the
/// reference's, are exactly 0 outside it and within 2e-5 (relative) plus
/// 1e-12 of the reference's inside it.
fn check_renorm_kept_row(
    row: &[f32],
    p: &SamplingParams,
    probs: &[f32],
    (kept_r, kept_s): (u32, u32),
    indices: &[u32],
) -> Result<(), String> {
    if kept_r != kept_s {
        return Err(format!("kept count {kept_r} (renorm), {kept_s} (kept set)"));
    }
    let n = kept_s as usize;
    let written = &indices[..n.min(indices.len())];
    if !written.windows(2).all(|w| w[0] < w[1]) {
        return Err("kept indices not ascending".into());
    }
    let near = reference::top_p_near_boundary(row, p).map_err(|e| e.to_string())?;
    let mut want = reference::kept_set(row, p).map_err(|e| e.to_string())?;
    want.sort_unstable();
    if n <= indices.len() {
        if near {
            reference::kept_sets_agree(row, p, written)?;
        } else if written != want.as_slice() {
            reference::kept_sets_agree(row, p, written)?;
            return Err(format!(
                "kept sets differ ({} reference, {n} GPU)",
                want.len()
            ));
        }
    } else if !near && (n != want.len() || written != &want[..indices.len()]) {
        return Err(format!(
            "first {} of {n} kept indices differ from the reference's {}",
            indices.len(),
            want.len()
        ));
    }
    let total: f64 = probs.iter().map(|&g| f64::from(g)).sum();
    if n > 0 && (total - 1.0).abs() > 1e-4 {
        return Err(format!("probabilities sum to {total}"));
    }
    // Values where the GPU kept set is known to be the reference's (in
    // top-p's band a different set has another mass).
    let whole = n <= indices.len();
    if (whole && written != want.as_slice()) || (!whole && near) {
        return Ok(());
    }
    let reference = reference::probabilities(row, p).map_err(|e| e.to_string())?;
    for (j, (&g, &r)) in probs.iter().zip(&reference).enumerate() {
        if want.binary_search(&(j as u32)).is_err() {
            if g.to_bits() != 0 {
                return Err(format!("index {j} outside the kept set: {g:e}, not 0"));
            }
        } else if (f64::from(g) - r).abs() > 2e-5 * r + 1e-12 {
            return Err(format!("index {j}: probability {g:e}, reference {r:e}"));
        }
    }
    Ok(())
}

/// Renormalised probabilities and kept sets of `b` (kept-set capacity the
/// vocabulary, then 3), each twice: bit-identical runs, kept counts equal
/// to the masking call's, every row against the reference.
fn check_renorm_kept_batch(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    ws: &mut Workspace,
    report: &mut Mismatches,
) {
    let v = b.rows.vocab;
    let params = b.upload(stream);
    let (_, mask_kept) = mask_on_gpu(dev, stream, b, &params, ws);
    for capacity in [v, 3] {
        let first = renorm_and_kept_on_gpu(dev, stream, b, &params, capacity, ws);
        let again = renorm_and_kept_on_gpu(dev, stream, b, &params, capacity, ws);
        let (probs, kept_r, kept_s, indices) = &first;
        let same = probs
            .iter()
            .zip(&again.0)
            .all(|(a, c)| a.to_bits() == c.to_bits())
            && (kept_r, kept_s, indices) == (&again.1, &again.2, &again.3);
        report.check(same, || format!("V={v}: results differ between runs"));
        report.check(*kept_s == mask_kept, || {
            format!("V={v}: kept counts differ from the masking call's")
        });
        let results = par_rows(b.rows.batch, |r| {
            check_renorm_kept_row(
                b.row(r),
                &b.params[r],
                &probs[r * v..(r + 1) * v],
                (kept_r[r], kept_s[r]),
                &indices[r * capacity..(r + 1) * capacity],
            )
        });
        report_rows(b, results, report);
    }
}

/// Renormalised probabilities and kept sets (`top_k_top_p_renorm_probs`,
/// `top_k_top_p_kept_set`) against the float64 reference on random rows of
/// every distribution and parameter mix, rows whose candidates overflow
/// the lists, and a kept-set capacity smaller than most kept sets; both
/// bit-identical across runs; the kept counts equal the masking call's.
#[test]
fn topk_renorm_probs_and_kept_sets_match_float64_reference() {
    const TEST: &str = "topk_renorm_probs_and_kept_sets_match_float64_reference";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut batches = Vec::new();
    for (vocab, batch) in [(111, 1000), (4099, 500), (32_000, 200), (151_936, 40)] {
        batches.push(Batch::random(&mut rng, batch, vocab));
    }
    batches.push(Batch::crowded(&mut rng, 8, 151_936).then(Batch::random(&mut rng, 8, 151_936)));
    for b in &batches {
        check_renorm_kept_batch(&dev, &stream, b, &mut ws, &mut report);
    }
    report.assert_none("top-k/top-p renormalised probabilities and kept sets");
}

/// The host-memory entry points of `Backend` on the GPU (renormalised
/// probabilities, kept sets, samples) against the float64 reference, as
/// the device calls are held to it.
#[test]
fn topk_backend_calls_on_the_gpu_match_float64_reference() {
    const TEST: &str = "topk_backend_calls_on_the_gpu_match_float64_reference";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut report = Mismatches::default();
    let workspace = Workspace::new(&stream).unwrap();
    let mut gpu = flashsample::Backend::Gpu {
        device: dev,
        stream,
        workspace,
    };
    for (vocab, batch) in [(111, 300), (4099, 100), (32_000, 20)] {
        let b = Batch::random(&mut rng, batch, vocab);
        let probs = gpu
            .top_k_top_p_renorm_probs(&b.logits, vocab, &b.params)
            .unwrap();
        let sets = gpu
            .top_k_top_p_kept_sets(&b.logits, vocab, &b.params)
            .unwrap();
        let tokens = gpu.sample_top_k_top_p(&b.logits, vocab, &b.params).unwrap();
        let results = par_rows(batch, |r| {
            let n = sets[r].len();
            let mut indices = sets[r].clone();
            indices.resize(vocab, u32::MAX);
            check_renorm_kept_row(
                b.row(r),
                &b.params[r],
                &probs[r * vocab..(r + 1) * vocab],
                (n as u32, n as u32),
                &indices,
            )?;
            check_sampled_row(b.row(r), &b.params[r], tokens[r])
        });
        report_rows(&b, results, &mut report);
    }
    report.assert_none("Backend calls on the GPU");
}

/// The 16-bit logit types, as the `half` crate converts them.
trait HalfValue: flashsample::TruncElem + cudarc::driver::ValidAsZeroBits {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl HalfValue for half::bf16 {
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl HalfValue for half::f16 {
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// Every truncation call on `b`'s logits rounded to a 16-bit format `H`
/// against the same call on their exact f32 widening (which the f32 tests
/// hold to the reference): masked logits (narrowed back), tokens,
/// renormalised probabilities and kept sets bit for bit; the kernels see
/// the same f32 rows either way.
fn check_half_batch<H: HalfValue>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    ws: &mut Workspace,
    report: &mut Mismatches,
) {
    let (narrow, widen) = (H::from_f32, H::to_f32);
    let (batch, v) = (b.rows.batch, b.rows.vocab);
    let half: Vec<H> = b.logits.iter().map(|&x| narrow(x)).collect();
    let wide = Batch {
        rows: b.rows,
        logits: half.iter().map(|&h| widen(h)).collect(),
        params: b.params.clone(),
        what: b.what.clone(),
    };
    let params = wide.upload(stream);
    let name = std::any::type_name::<H>();
    // Masking in place.
    let (masked, kept) = mask_on_gpu(dev, stream, &wide, &params, ws);
    let mut d = stream.clone_htod(&half).unwrap();
    let mut kept_h = stream.clone_htod(&vec![u32::MAX; batch]).unwrap();
    dev.top_k_top_p_mask_logits(
        stream,
        &mut d.as_view_mut(),
        b.rows,
        &params,
        &mut kept_h,
        ws,
    )
    .unwrap();
    let masked_h = stream.clone_dtoh(&d).unwrap();
    let same = masked_h
        .iter()
        .zip(&masked)
        .all(|(&h, &x)| widen(h).to_bits() == x.to_bits());
    report.check(same, || {
        format!("{name} V={v}: masked logits differ from f32's")
    });
    report.check(stream.clone_dtoh(&kept_h).unwrap() == kept, || {
        format!("{name} V={v}: kept counts differ from f32's")
    });
    // Sampling.
    let tokens = sample_on_gpu(dev, stream, &wide, &params, ws);
    let d = stream.clone_htod(&half).unwrap();
    let mut out = SampleOutput::new(stream, batch).unwrap();
    dev.sample_top_k_top_p(stream, &d.as_view(), b.rows, &params, &mut out, ws)
        .unwrap();
    let (t, valid) = (
        stream.clone_dtoh(&out.tokens).unwrap(),
        stream.clone_dtoh(&out.valid).unwrap(),
    );
    let tokens_h: Vec<Option<u32>> = t
        .iter()
        .zip(&valid)
        .map(|(&t, &v)| (v == 1).then_some(t))
        .collect();
    report.check(tokens_h == tokens, || {
        format!("{name} V={v}: tokens differ from f32's")
    });
    // Renormalised probabilities and kept sets.
    let (probs, kept_r, _, indices) = renorm_and_kept_on_gpu(dev, stream, &wide, &params, v, ws);
    let mut probs_h = stream.alloc_zeros::<f32>(batch * v).unwrap();
    let mut kept_hr = stream.alloc_zeros::<u32>(batch).unwrap();
    let mut kept_hs = stream.alloc_zeros::<u32>(batch).unwrap();
    let mut indices_h = stream.alloc_zeros::<u32>(batch * v).unwrap();
    dev.top_k_top_p_renorm_probs(
        stream,
        &d.as_view(),
        b.rows,
        &params,
        &mut probs_h.as_view_mut(),
        &mut kept_hr,
        ws,
    )
    .unwrap();
    dev.top_k_top_p_kept_set(
        stream,
        &d.as_view(),
        b.rows,
        &params,
        &mut kept_hs,
        &mut indices_h.as_view_mut(),
        v,
        ws,
    )
    .unwrap();
    let probs_h = stream.clone_dtoh(&probs_h).unwrap();
    let same = probs_h
        .iter()
        .zip(&probs)
        .all(|(a, c)| a.to_bits() == c.to_bits());
    report.check(same, || {
        format!("{name} V={v}: probabilities differ from f32's")
    });
    let (kept_hr, kept_hs) = (
        stream.clone_dtoh(&kept_hr).unwrap(),
        stream.clone_dtoh(&kept_hs).unwrap(),
    );
    report.check(kept_hr == kept_r && kept_hs == kept_r, || {
        format!("{name} V={v}: renorm or kept-set counts differ from f32's")
    });
    let indices_h = stream.clone_dtoh(&indices_h).unwrap();
    let same = (0..batch).all(|r| {
        let n = (kept_r[r] as usize).min(v);
        indices_h[r * v..r * v + n] == indices[r * v..r * v + n]
    });
    report.check(same, || {
        format!("{name} V={v}: kept sets differ from f32's")
    });
}

/// bf16 and f16 logits (widened exactly into the workspace, masked results
/// narrowed back) give the f32 calls' results on the widened values, bit
/// for bit, on random rows (of odd lengths too, whose widened copy's rows
/// are padded to a multiple of 4) and rows that overflow the lists.
#[test]
fn topk_bf16_and_f16_logits_match_their_f32_widening() {
    const TEST: &str = "topk_bf16_and_f16_logits_match_their_f32_widening";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    for (vocab, batch) in [(111, 200), (4099, 100), (32_000, 40), (151_937, 8)] {
        let b = Batch::random(&mut rng, batch, vocab);
        check_half_batch::<half::bf16>(&dev, &stream, &b, &mut ws, &mut report);
        check_half_batch::<half::f16>(&dev, &stream, &b, &mut ws, &mut report);
    }
    let b = Batch::crowded(&mut rng, 4, 151_936);
    check_half_batch::<half::bf16>(&dev, &stream, &b, &mut ws, &mut report);
    check_half_batch::<half::f16>(&dev, &stream, &b, &mut ws, &mut report);
    report.assert_none("top-k/top-p on 16-bit logits");
}

/// The cluster route (one launch, a cluster of blocks per row) gives the
/// chunked passes' results bit for bit, whatever the cluster's size, and
/// both equal the reference: random rows, crowded rows (the selection
/// reads the row) and bf16 ties at V = 32000, 151936 (19 chunks, uneven
/// over 16 blocks) and 262144. A cluster size the GPU does not run is
/// skipped with a message.
#[test]
fn topk_cluster_route_matches_the_chunked_passes() {
    const TEST: &str = "topk_cluster_route_matches_the_chunked_passes";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let caps = dev.topk_topp_caps();
    for vocab in [32_000, 151_936, 262_144] {
        let b = Batch::crowded(&mut rng, 4, vocab)
            .then(Batch::heavy(&mut rng, 4, vocab))
            .then(Batch::random(&mut rng, 24, vocab));
        let params = b.upload(&stream);
        ws.force_topk_topp_route(Some(TopkToppRoute::Chunked));
        let want_mask = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
        let want_tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
        // The listing passes (the planner's from LISTED_MIN_BATCH rows),
        // forced on this small batch: the same bits as the plain passes.
        ws.force_topk_topp_route(Some(TopkToppRoute::Listed { shares_only: false }));
        let (masked, kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
        report.check(kept == want_mask.1, || {
            format!("V={vocab} listed: kept counts differ from the chunked passes")
        });
        let same = masked
            .iter()
            .zip(&want_mask.0)
            .all(|(a, c)| a.to_bits() == c.to_bits());
        report.check(same, || {
            format!("V={vocab} listed: masked logits differ from the chunked passes")
        });
        let tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
        report.check(tokens == want_tokens, || {
            format!("V={vocab} listed: tokens differ from the chunked passes")
        });
        check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
        check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
        let planned = dev
            .topk_topp_route(Rows::contiguous(1, vocab), &params)
            .unwrap();
        let mut sizes = vec![1, 2, 3, 16];
        if let TopkToppRoute::Cluster { ctas } = planned {
            sizes.push(ctas);
        }
        for ctas in sizes {
            if caps.cluster_slots[ctas as usize] == 0 {
                println!("{TEST}: V={vocab}: clusters of {ctas} not run on this GPU, skipped");
                continue;
            }
            ws.force_topk_topp_route(Some(TopkToppRoute::Cluster { ctas }));
            let (masked, kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
            report.check(kept == want_mask.1, || {
                format!("V={vocab} cluster of {ctas}: kept counts differ from the chunked passes")
            });
            let same = masked
                .iter()
                .zip(&want_mask.0)
                .all(|(a, c)| a.to_bits() == c.to_bits());
            report.check(same, || {
                format!("V={vocab} cluster of {ctas}: masked logits differ from the chunked passes")
            });
            let tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
            report.check(tokens == want_tokens, || {
                format!("V={vocab} cluster of {ctas}: tokens differ from the chunked passes")
            });
        }
        // The planned route of the whole batch against the reference.
        ws.force_topk_topp_route(None);
        check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
        check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
        // And a cluster route explicitly, when the GPU runs clusters.
        if let TopkToppRoute::Cluster { ctas } = planned {
            ws.force_topk_topp_route(Some(TopkToppRoute::Cluster { ctas }));
            check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
            check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
        }
    }
    // A forced cluster the GPU cannot run is an error, not a launch.
    ws.force_topk_topp_route(Some(TopkToppRoute::Cluster { ctas: 17 }));
    let b = Batch::random(&mut rng, 2, 4099);
    let params = b.upload(&stream);
    let mut d = stream.clone_htod(&b.logits).unwrap();
    let mut kept = stream.alloc_zeros::<u32>(2).unwrap();
    let err = dev.top_k_top_p_mask_logits(
        &stream,
        &mut d.as_view_mut(),
        b.rows,
        &params,
        &mut kept,
        &mut ws,
    );
    report.check(err.is_err(), || "a cluster of 17 was accepted".to_string());
    report.assert_none("top-k/top-p cluster route against the chunked passes");
}

/// Rows of `b` whose gather the radix cluster kernel's first CTA narrows
/// before the sort (a top-k of at most `FILTER_DIRECT_KEYS`, more keys
/// gathered), as the CPU emulation of its select counts them: the masking
/// form then writes -inf over the keys the narrowing drops.
fn narrowed_rows(b: &Batch) -> usize {
    let v = b.rows.vocab;
    b.params
        .iter()
        .enumerate()
        .filter(|(r, p)| {
            let row = &b.logits[r * b.rows.row_stride..][..v];
            p.top_k <= FILTER_DIRECT_KEYS
                && !radix_select::filter_direct(
                    radix_select::select_logit_slab(row, p.top_k, 1).gathered,
                )
        })
        .count()
}

/// The radix route (each row's top-k by radix select into a slab, then
/// min-p and top-p cut from it) gives the chunked passes' results bit for
/// bit on every radix route the GPU runs, and equals the reference: random
/// rows (every distribution, ties at k, greedy rows, +-inf, NaN, invalid
/// rows), rows crowding the first chunk (the passes select from the row)
/// and heavy-tailed rows (the passes refine their threshold first), top-k
/// from 1 to 1024 and from 1 to 64 (the filter route's select masks such
/// rows in place), at V = 111 to 262144. The route refuses calls whose
/// top-k bound it cannot serve and the cooperative route.
#[test]
fn topk_radix_route_matches_the_chunked_passes() {
    const TEST: &str = "topk_radix_route_matches_the_chunked_passes";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let caps = dev.radix_caps().unwrap();
    let mut routes = vec![Route::SingleCta];
    for ctas in [2, 4, 8, 16] {
        if caps.cluster_slots[ctas as usize] > 0 {
            routes.push(Route::Cluster { ctas });
        }
    }
    if caps.filter_ctas_per_sm > 0 {
        routes.push(Route::Filter);
    }
    for ctas in 2..=MAX_FILTER_CLUSTER {
        if caps.filter_cluster_slots[ctas as usize] > 0 {
            routes.push(Route::FilterCluster { ctas });
        }
    }
    println!("{TEST}: radix routes {routes:?}");
    // Each size twice: top-k up to 1024, then up to 64, where the filter
    // route's select masks the rows in place (sm_90 and newer).
    let sizes = [
        (111, 64),
        (4099, 64),
        (32_000, 48),
        (151_936, 40),
        (262_144, 24),
    ];
    let mut narrowed = 0;
    for (vocab, batch, cap) in sizes
        .into_iter()
        .flat_map(|(vocab, batch)| [(vocab, batch, 1024), (vocab, batch / 2, 64)])
    {
        let b = Batch::random(&mut rng, batch, vocab)
            .then(Batch::crowded(&mut rng, 4, vocab))
            .then(Batch::heavy(&mut rng, 4, vocab))
            .slab_top_k_up_to(&mut rng, cap);
        narrowed += narrowed_rows(&b);
        let params = b.upload(&stream);
        assert!((1..=cap).contains(&params.top_k_bound));
        ws.force_topk_topp_route(Some(TopkToppRoute::Chunked));
        let (want_masked, want_kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
        let want_tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
        let want_renorm = renorm_and_kept_on_gpu(&dev, &stream, &b, &params, 1024, &mut ws);
        for &route in &routes {
            ws.force_topk_topp_route(Some(TopkToppRoute::Radix(route)));
            let (masked, kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
            report.check(kept == want_kept, || {
                format!(
                    "V={vocab} k<={cap} radix {route:?}: kept counts differ from the chunked passes"
                )
            });
            let same = masked
                .iter()
                .zip(&want_masked)
                .all(|(a, c)| a.to_bits() == c.to_bits());
            report.check(same, || {
                format!("V={vocab} k<={cap} radix {route:?}: masked logits differ from the chunked passes")
            });
            let tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
            report.check(tokens == want_tokens, || {
                format!("V={vocab} k<={cap} radix {route:?}: tokens differ from the chunked passes")
            });
            let (probs, kept_r, kept_s, indices) =
                renorm_and_kept_on_gpu(&dev, &stream, &b, &params, 1024, &mut ws);
            let same_probs = probs
                .iter()
                .zip(&want_renorm.0)
                .all(|(a, c)| a.to_bits() == c.to_bits());
            report.check(same_probs && kept_r == want_renorm.1, || {
                format!(
                    "V={vocab} k<={cap} radix {route:?}: renormalised probabilities differ from the chunked passes"
                )
            });
            report.check(kept_s == want_renorm.2 && indices == want_renorm.3, || {
                format!(
                    "V={vocab} k<={cap} radix {route:?}: kept sets differ from the chunked passes"
                )
            });
        }
        // Against the reference (and run to run) on the last route.
        check_mask_batch(&dev, &stream, &b, &mut ws, &mut report);
        check_sample_batch(&dev, &stream, &b, &mut ws, &mut report);
    }
    // The cluster kernel's masking form writes -inf over the keys its
    // narrowing drops on these rows (52 of the 440 with this test's seed).
    assert!(narrowed >= 40, "{narrowed} rows narrowed");
    // Refused before any launch: a bound the slab cannot hold, no bound,
    // and the cooperative route (no logits kernel).
    let b = Batch::random(&mut rng, 2, 4099).slab_top_k(&mut rng);
    let mut params = b.upload(&stream);
    for (bound, route) in [
        (1025, Route::SingleCta),
        (0, Route::SingleCta),
        (4099, Route::SingleCta),
        (50, Route::Cooperative { ctas: 2 }),
        (50, Route::Pivot),
    ] {
        params.top_k_bound = bound;
        ws.force_topk_topp_route(Some(TopkToppRoute::Radix(route)));
        let d = stream.clone_htod(&b.logits).unwrap();
        let mut out = SampleOutput::new(&stream, 2).unwrap();
        let err = dev.sample_top_k_top_p(&stream, &d.as_view(), b.rows, &params, &mut out, &mut ws);
        report.check(err.is_err(), || {
            format!("radix route {route:?} with top-k bound {bound} was accepted")
        });
    }
    // A bound that lies (rows with top-k off or above the slab while it
    // claims 1000): those rows come out invalid, every other row as on the
    // chunked passes.
    let mut b = Batch::random(&mut rng, 16, 4099).slab_top_k(&mut rng);
    for (r, p) in b.params.iter_mut().enumerate() {
        p.temperature = 1.0;
        match r % 4 {
            0 => p.top_k = 0,
            1 => p.top_k = 2000,
            _ => p.top_k = p.top_k.min(1000),
        }
    }
    let mut params = b.upload(&stream);
    ws.force_topk_topp_route(Some(TopkToppRoute::Chunked));
    let (want_masked, want_kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
    let want_tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
    params.top_k_bound = 1000;
    ws.force_topk_topp_route(Some(TopkToppRoute::Radix(Route::SingleCta)));
    let (masked, kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws);
    let tokens = sample_on_gpu(&dev, &stream, &b, &params, &mut ws);
    let vocab = b.rows.vocab;
    for r in 0..b.rows.batch {
        let row = &masked[r * vocab..(r + 1) * vocab];
        let want_row = &want_masked[r * vocab..(r + 1) * vocab];
        let ok = if r % 4 < 2 {
            kept[r] == 0 && tokens[r].is_none() && row.iter().all(|&x| x == f32::NEG_INFINITY)
        } else {
            kept[r] == want_kept[r]
                && tokens[r] == want_tokens[r]
                && row
                    .iter()
                    .zip(want_row)
                    .all(|(a, c)| a.to_bits() == c.to_bits())
        };
        report.check(ok, || {
            format!(
                "radix route, bound 1000, row {r} top_k {}: kept {} tokens {:?} (chunked: kept {} token {:?})",
                b.params[r].top_k, kept[r], tokens[r], want_kept[r], want_tokens[r]
            )
        });
    }
    ws.force_topk_topp_route(None);
    report.assert_none("top-k/top-p radix route against the chunked passes");
}

/// Masks the rows of `b` (V = 4099) laid 5000 apart on the GPU and checks
/// each row against the reference and that the gaps between rows keep
/// their NaN; returns the strided logits (before masking) and their shape.
fn check_strided_mask(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    ws: &mut Workspace,
    report: &mut Mismatches,
    what: &str,
) -> (Vec<f32>, Rows) {
    let (batch, vocab, stride) = (b.rows.batch, b.rows.vocab, 5000);
    let mut logits = vec![f32::NAN; (batch - 1) * stride + vocab];
    for r in 0..batch {
        logits[r * stride..r * stride + vocab].copy_from_slice(b.row(r));
    }
    let params = b.upload(stream);
    let mut d = stream.clone_htod(&logits).unwrap();
    let mut kept = stream.alloc_zeros::<u32>(batch).unwrap();
    let rows = Rows {
        batch,
        vocab,
        row_stride: stride,
    };
    dev.top_k_top_p_mask_logits(stream, &mut d.as_view_mut(), rows, &params, &mut kept, ws)
        .unwrap();
    let masked = stream.clone_dtoh(&d).unwrap();
    let kept = stream.clone_dtoh(&kept).unwrap();
    for r in 0..batch {
        let m = &masked[r * stride..r * stride + vocab];
        let res = check_masked_row(b.row(r), &b.params[r], m, kept[r]);
        report.check(res.is_ok(), || format!("{what}: strided row {r}: {res:?}"));
        if r + 1 < batch {
            let gap = &masked[r * stride + vocab..(r + 1) * stride];
            report.check(gap.iter().all(|x| x.is_nan()), || {
                format!("{what}: strided row {r}: the gap after the row was written")
            });
        }
    }
    (logits, rows)
}

/// Masking and sampling over tiny, small and large vocabularies and a
/// strided view; the bundle runs this under compute-sanitizer.
#[test]
fn sanitize_topk_paths() {
    const TEST: &str = "sanitize_topk_paths";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(23);
    let mut ws = Workspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut coverage = Coverage::default();
    const MASK: [&str; 5] = [
        "topk_topp_stats_f32",
        "topk_topp_plan_f32",
        "topk_topp_filter_f32",
        "topk_topp_mask_f32",
        "topk_topp_apply_f32",
    ];
    const SAMPLE: [&str; 4] = [
        "topk_topp_stats_f32",
        "topk_topp_plan_f32",
        "topk_topp_filter_f32",
        "topk_topp_sample_f32",
    ];
    const RENORM_KEPT: [&str; 7] = [
        "topk_topp_stats_f32",
        "topk_topp_plan_f32",
        "topk_topp_filter_f32",
        "topk_topp_mask_f32",
        "topk_topp_renorm_f32",
        "topk_topp_kept_count_f32",
        "topk_topp_kept_write_f32",
    ];
    const LISTED_MASK: [&str; 5] = [
        "topk_topp_stats_listed_f32",
        "topk_topp_plan_listed_f32",
        "topk_topp_filter_grouped_f32",
        "topk_topp_mask_listed_f32",
        "topk_topp_apply_f32",
    ];
    const LISTED_SAMPLE: [&str; 4] = [
        "topk_topp_stats_listed_f32",
        "topk_topp_plan_listed_f32",
        "topk_topp_filter_grouped_f32",
        "topk_topp_sample_listed_f32",
    ];
    let mut batches: Vec<Batch> = [(1, 4), (2, 8), (111, 40), (4099, 24), (20_001, 6)]
        .into_iter()
        .map(|(vocab, batch)| Batch::random(&mut rng, batch, vocab))
        .collect();
    // Candidates that overflow a chunk's list: the selection reads the row.
    batches.push(Batch::crowded(&mut rng, 4, 20_001));
    // Heavy tails: the threshold refined from a histogram (over a
    // cluster's blocks on the cluster route).
    batches.push(Batch::heavy(&mut rng, 4, 20_001));
    // Every batch on the chunked passes, on the listing passes, on a
    // cluster of one and on the largest cluster its row has blocks for (a
    // block per chunk; where the GPU runs it).
    let caps = dev.topk_topp_caps();
    for b in &batches {
        let chunks = TopkToppLayout::new(1, b.rows.vocab as u32).chunks;
        let mut routes = vec![
            TopkToppRoute::Chunked,
            TopkToppRoute::Listed { shares_only: false },
            TopkToppRoute::Listed { shares_only: true },
            TopkToppRoute::Cluster { ctas: 1 },
        ];
        if chunks > 1 && caps.cluster_slots[chunks as usize] > 0 {
            routes.push(TopkToppRoute::Cluster { ctas: chunks });
        }
        for route in routes {
            ws.force_topk_topp_route(Some(route));
            check_mask_batch(&dev, &stream, b, &mut ws, &mut report);
            check_sample_batch(&dev, &stream, b, &mut ws, &mut report);
            if route == TopkToppRoute::Chunked {
                coverage.case(&MASK);
                coverage.case(&SAMPLE);
                // The renormalised probabilities and kept sets (the
                // chunked passes but on the radix route, below).
                check_renorm_kept_batch(&dev, &stream, b, &mut ws, &mut report);
                coverage.case(&RENORM_KEPT);
            } else if matches!(route, TopkToppRoute::Listed { .. }) {
                coverage.case(&LISTED_MASK);
                coverage.case(&LISTED_SAMPLE);
            } else {
                coverage.case(&["topk_topp_cluster_mask_f32"]);
                coverage.case(&["topk_topp_cluster_sample_f32"]);
            }
        }
    }
    // The radix route, its top-k bounded by 1024: one CTA a row, a
    // cluster of two and the filter routes (where the GPU runs them).
    let radix = dev.radix_caps().unwrap();
    let mut radix_routes = vec![(Route::SingleCta, "radix_topk_cluster_logits_f32")];
    if radix.cluster_slots[2] > 0 {
        radix_routes.push((Route::Cluster { ctas: 2 }, "radix_topk_cluster_logits_f32"));
    }
    if radix.filter_ctas_per_sm > 0 {
        radix_routes.push((Route::Filter, "radix_topk_filter_logits_f32"));
    }
    if radix.filter_cluster_slots[2] > 0 {
        radix_routes.push((
            Route::FilterCluster { ctas: 2 },
            "radix_topk_filter_logits_f32",
        ));
    }
    let mut slab_batches: Vec<Batch> = [(2, 8), (111, 40), (4099, 24), (20_001, 6)]
        .into_iter()
        .map(|(vocab, batch)| Batch::random(&mut rng, batch, vocab).slab_top_k(&mut rng))
        .collect();
    slab_batches.push(Batch::crowded(&mut rng, 4, 20_001).slab_top_k(&mut rng));
    slab_batches.push(Batch::heavy(&mut rng, 4, 20_001).slab_top_k(&mut rng));
    // Small top-k on 16-byte aligned rows: the filter select's in-place
    // masking with vector stores.
    slab_batches.push(Batch::random(&mut rng, 6, 20_000).slab_top_k_up_to(&mut rng, 64));
    // Rows whose gather the cluster kernel's first CTA narrows before the
    // sort, so that the sanitizers see the masking form's -inf writes over
    // the keys the narrowing drops: 7 of these 92 rows with this seed
    // (counted offline, `narrowed_rows`).
    let narrowed: usize = slab_batches.iter().map(narrowed_rows).sum();
    assert!(
        narrowed >= 5,
        "{narrowed} rows of the radix batches narrowed"
    );
    for b in &slab_batches {
        for &(route, kernel) in &radix_routes {
            ws.force_topk_topp_route(Some(TopkToppRoute::Radix(route)));
            check_mask_batch(&dev, &stream, b, &mut ws, &mut report);
            check_sample_batch(&dev, &stream, b, &mut ws, &mut report);
            // The small filter kernel where every top-k is small.
            let small = b.params.iter().all(|p| p.top_k <= FILTER_SMALL_MAX_K);
            let kernel = if small && kernel == "radix_topk_filter_logits_f32" {
                "radix_topk_filter_small_logits_f32"
            } else {
                kernel
            };
            if kernel == "radix_topk_cluster_logits_f32" {
                // The cluster route masks and samples in one launch.
                coverage.case(&["radix_topk_cluster_mask_logits_f32"]);
                coverage.case(&["radix_topk_cluster_sample_logits_f32"]);
            } else {
                // The apply runs unless the filter route's select masked
                // the rows in place (small top-k, one wave, sm_90 and
                // newer).
                coverage.case(&[
                    kernel,
                    "topk_topp_slab_mask_f32",
                    "topk_topp_slab_apply_f32",
                ]);
                coverage.case(&[kernel, "topk_topp_slab_sample_f32"]);
            }
            if route == Route::SingleCta {
                check_renorm_kept_batch(&dev, &stream, b, &mut ws, &mut report);
                coverage.case(&[
                    kernel,
                    "topk_topp_slab_mask_f32",
                    "topk_topp_renorm_f32",
                    "topk_topp_kept_count_f32",
                    "topk_topp_kept_write_f32",
                ]);
            }
        }
    }
    // A strided view (rows 5000 apart, 4099 used) and 16-bit logits on the
    // radix route's filter kernel: it reads the rows in place or the
    // widened copy.
    if radix.filter_ctas_per_sm > 0 {
        ws.force_topk_topp_route(Some(TopkToppRoute::Radix(Route::Filter)));
        let b = Batch::random(&mut rng, 3, 4099).slab_top_k(&mut rng);
        check_strided_mask(&dev, &stream, &b, &mut ws, &mut report, "radix route");
        let b = Batch::random(&mut rng, 5, 4099).slab_top_k(&mut rng);
        check_half_batch::<half::bf16>(&dev, &stream, &b, &mut ws, &mut report);
        let filter = if b.params.iter().all(|p| p.top_k <= FILTER_SMALL_MAX_K) {
            "radix_topk_filter_small_logits_f32"
        } else {
            "radix_topk_filter_logits_f32"
        };
        coverage.case(&[
            filter,
            "topk_topp_slab_mask_f32",
            "topk_topp_slab_apply_f32",
        ]);
        coverage.case(&[filter, "widen_rows_bf16", "narrow_rows_bf16"]);
    }
    ws.force_topk_topp_route(None);
    // A strided view: rows 5000 apart, 4099 used.
    let b = Batch::random(&mut rng, 3, 4099);
    let (logits, rows) = check_strided_mask(&dev, &stream, &b, &mut ws, &mut report, "planned");
    let params = b.upload(&stream);
    let strided_route = dev.topk_topp_route(rows, &params).unwrap();
    coverage.case(&[match strided_route {
        TopkToppRoute::Chunked | TopkToppRoute::Listed { .. } => "topk_topp_apply_f32",
        TopkToppRoute::Cluster { .. } => "topk_topp_cluster_mask_f32",
        TopkToppRoute::Radix(Route::Cluster { .. } | Route::SingleCta) => {
            "radix_topk_cluster_mask_logits_f32"
        }
        TopkToppRoute::Radix(_) => "topk_topp_slab_apply_f32",
    }]);
    // The same strided rows into contiguous probabilities and kept sets.
    let d = stream.clone_htod(&logits).unwrap();
    let mut probs = stream.alloc_zeros::<f32>(3 * 4099).unwrap();
    let mut kept_r = stream.alloc_zeros::<u32>(3).unwrap();
    let mut kept_s = stream.alloc_zeros::<u32>(3).unwrap();
    let mut indices = stream.alloc_zeros::<u32>(3 * 4099).unwrap();
    let view = d.as_view();
    dev.top_k_top_p_renorm_probs(
        &stream,
        &view,
        rows,
        &params,
        &mut probs.as_view_mut(),
        &mut kept_r,
        &mut ws,
    )
    .unwrap();
    dev.top_k_top_p_kept_set(
        &stream,
        &view,
        rows,
        &params,
        &mut kept_s,
        &mut indices.as_view_mut(),
        4099,
        &mut ws,
    )
    .unwrap();
    let (probs, indices) = (
        stream.clone_dtoh(&probs).unwrap(),
        stream.clone_dtoh(&indices).unwrap(),
    );
    let (kept_r, kept_s) = (
        stream.clone_dtoh(&kept_r).unwrap(),
        stream.clone_dtoh(&kept_s).unwrap(),
    );
    for r in 0..3 {
        let res = check_renorm_kept_row(
            b.row(r),
            &b.params[r],
            &probs[r * 4099..(r + 1) * 4099],
            (kept_r[r], kept_s[r]),
            &indices[r * 4099..(r + 1) * 4099],
        );
        report.check(res.is_ok(), || {
            format!("strided row {r}, renorm and kept set: {res:?}")
        });
    }
    // The renormalised probabilities and kept sets take the radix route
    // where the planner does, else the chunked passes.
    if matches!(strided_route, TopkToppRoute::Radix(_)) {
        coverage.case(&[
            "topk_topp_slab_mask_f32",
            "topk_topp_renorm_f32",
            "topk_topp_kept_count_f32",
            "topk_topp_kept_write_f32",
        ]);
    } else {
        coverage.case(&RENORM_KEPT);
    }
    // 16-bit logits: widened into the workspace, masked results narrowed
    // back.
    let b = Batch::random(&mut rng, 5, 4099);
    check_half_batch::<half::bf16>(&dev, &stream, &b, &mut ws, &mut report);
    check_half_batch::<half::f16>(&dev, &stream, &b, &mut ws, &mut report);
    coverage.case(&["widen_rows_bf16", "narrow_rows_bf16"]);
    coverage.case(&["widen_rows_f16", "narrow_rows_f16"]);
    report.assert_none("sanitize: top-k/top-p paths");
    coverage.report(TEST);
}

#[test]
fn topk_bad_arguments_are_rejected() {
    let Some((dev, stream)) = common::gpu("topk_bad_arguments_are_rejected") else {
        return;
    };
    let up = |k: &[u32], p: &[f32], m: &[f32]| {
        let n = k.len();
        TruncParams::upload(&stream, k, p, m, &vec![1.0; n], &vec![0; n], &vec![0; n])
    };
    assert!(up(&[1], &[0.5], &[0.0]).is_ok());
    for (p, m) in [
        (0.0, 0.0),
        (-0.5, 0.0),
        (1.5, 0.0),
        (f32::NAN, 0.0),
        (0.5, -0.1),
        (0.5, 1.1),
        (0.5, f32::NAN),
    ] {
        assert!(up(&[1], &[p], &[m]).is_err(), "top_p {p} min_p {m}");
    }
    assert!(up(&[1, 2], &[0.5], &[0.0, 0.0]).is_err());
    let params = up(&[5, 5], &[0.9, 0.9], &[0.0, 0.0]).unwrap();
    let mut ws = Workspace::new(&stream).unwrap();
    let mut d = stream.alloc_zeros::<f32>(20).unwrap();
    let mut kept = stream.alloc_zeros::<u32>(2).unwrap();
    let mut short = stream.alloc_zeros::<u32>(1).unwrap();
    let ok = Rows::contiguous(2, 10);
    assert!(
        dev.top_k_top_p_mask_logits(
            &stream,
            &mut d.as_view_mut(),
            ok,
            &params,
            &mut kept,
            &mut ws
        )
        .is_ok()
    );
    for rows in [
        Rows::contiguous(2, 11),
        Rows::contiguous(3, 10),
        Rows::contiguous(0, 10),
        Rows::contiguous(2, 0),
    ] {
        assert!(
            dev.top_k_top_p_mask_logits(
                &stream,
                &mut d.as_view_mut(),
                rows,
                &params,
                &mut kept,
                &mut ws
            )
            .is_err(),
            "{rows:?}"
        );
    }
    assert!(
        dev.top_k_top_p_mask_logits(
            &stream,
            &mut d.as_view_mut(),
            ok,
            &params,
            &mut short,
            &mut ws
        )
        .is_err()
    );
    let mut out = SampleOutput::new(&stream, 1).unwrap();
    assert!(
        dev.sample_top_k_top_p(&stream, &d.as_view(), ok, &params, &mut out, &mut ws)
            .is_err()
    );
    let mut out = SampleOutput::new(&stream, 2).unwrap();
    assert!(
        dev.sample_top_k_top_p(&stream, &d.as_view(), ok, &params, &mut out, &mut ws)
            .is_ok()
    );
    // Renormalised probabilities: `probs` of batch * vocab, `kept` of batch.
    let mut probs = stream.alloc_zeros::<f32>(20).unwrap();
    let mut renorm = |rows: Rows, probs_len: usize, kept: &mut CudaSlice<u32>| {
        dev.top_k_top_p_renorm_probs(
            &stream,
            &d.as_view(),
            rows,
            &params,
            &mut probs.slice_mut(..probs_len),
            kept,
            &mut ws,
        )
        .is_ok()
    };
    assert!(renorm(ok, 20, &mut kept));
    assert!(!renorm(ok, 19, &mut kept));
    assert!(!renorm(ok, 20, &mut short));
    assert!(!renorm(Rows::contiguous(3, 10), 20, &mut kept));
    // Kept sets: capacity at least 1, `indices` of batch * capacity.
    let mut indices = stream.alloc_zeros::<u32>(8).unwrap();
    let mut kept_set = |capacity: usize, len: usize, kept: &mut CudaSlice<u32>| {
        dev.top_k_top_p_kept_set(
            &stream,
            &d.as_view(),
            ok,
            &params,
            kept,
            &mut indices.slice_mut(..len),
            capacity,
            &mut ws,
        )
        .is_ok()
    };
    assert!(kept_set(4, 8, &mut kept));
    assert!(!kept_set(0, 8, &mut kept));
    assert!(!kept_set(4, 7, &mut kept));
    assert!(!kept_set(4, 8, &mut short));
    stream.synchronize().unwrap();
}

/// `sample_top_k_top_p` and `top_k_top_p_mask_logits`, each captured once
/// into a CUDA graph and replayed, with a few rows (B = 3) and many
/// (B = 600). Sampling: the same offsets reproduce the tokens bit for bit,
/// advanced offsets give new draws, those of a direct call. Masking works
/// in place, so the graph restores its input itself (a device-to-device
/// copy from a pristine buffer, captured before the mask, as the forward
/// pass rewrites the logits in an engine's graph): every replay, over
/// poisoned logits and kept counts, gives the direct call's masked logits
/// bit for bit and its kept counts.
#[test]
fn topk_samplers_replay_from_cuda_graphs() {
    use std::cell::RefCell;
    const TEST: &str = "topk_samplers_replay_from_cuda_graphs";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let ws = RefCell::new(Workspace::new(&stream).unwrap());
    for batch in [3usize, 600] {
        let b = Batch::broad(&mut rng, batch, 32_000);
        let logits = stream.clone_htod(&b.logits).unwrap();
        let out = RefCell::new(SampleOutput::new(&stream, batch).unwrap());
        let base: Vec<u64> = b.params.iter().map(|p| p.offset).collect();
        common::check_graph_replays(
            &stream,
            &mut b.upload(&stream),
            |p| &mut p.row.offset,
            &base,
            |p| {
                dev.sample_top_k_top_p(
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

        let b = Batch::random(&mut rng, batch, 32_000);
        let params = b.upload(&stream);
        let (direct, direct_kept) = mask_on_gpu(&dev, &stream, &b, &params, &mut ws.borrow_mut());
        let pristine = stream.clone_htod(&b.logits).unwrap();
        let mut work = stream.alloc_zeros::<f32>(b.logits.len()).unwrap();
        let mut kept = stream.alloc_zeros::<u32>(batch).unwrap();
        let graph = common::capture_graph(&stream, || {
            stream.memcpy_dtod(&pristine, &mut work).unwrap();
            dev.top_k_top_p_mask_logits(
                &stream,
                &mut work.as_view_mut(),
                b.rows,
                &params,
                &mut kept,
                &mut ws.borrow_mut(),
            )
            .unwrap();
        });
        let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let poison = vec![f32::NAN; b.logits.len()];
        for replay in 0..3 {
            stream.memcpy_htod(&poison, &mut work).unwrap();
            stream
                .memcpy_htod(&vec![u32::MAX; batch], &mut kept)
                .unwrap();
            graph.launch().unwrap();
            assert!(
                bits(&stream.clone_dtoh(&work).unwrap()) == bits(&direct),
                "B={batch}: mask replay {replay} differs from the direct call"
            );
            assert_eq!(
                stream.clone_dtoh(&kept).unwrap(),
                direct_kept,
                "B={batch}: mask replay {replay} changed the kept counts"
            );
        }
    }
}

/// Both Qrita samplers called from four host threads on four streams at
/// once (each with its own workspace), twenty times each, give the per-row
/// results of serial calls: the same tokens, the same masked logits bit for
/// bit, the same kept counts.
#[test]
fn topk_concurrent_calls_on_several_streams_agree_with_serial_calls() {
    const TEST: &str = "topk_concurrent_calls_on_several_streams_agree_with_serial_calls";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let batches: Vec<Batch> = [1, 7, 64, 300]
        .into_iter()
        .map(|batch| Batch::random(&mut rng, batch, 32_000))
        .collect();
    // (tokens, masked logits' bits, kept counts)
    common::check_concurrent(
        &dev,
        &stream,
        &batches,
        20,
        |s| Workspace::new(s).unwrap(),
        |s, ws, b| {
            let params = b.upload(s);
            let tokens = sample_on_gpu(&dev, s, b, &params, ws);
            let (masked, kept) = mask_on_gpu(&dev, s, b, &params, ws);
            let masked: Vec<u32> = masked.iter().map(|x| x.to_bits()).collect();
            (tokens, masked, kept)
        },
    );
}

/// The CPU driver `pivot::select_row` (the algorithm the kernels run, pass
/// by pass) through the very checks the GPU results go through: runs
/// without a GPU, so CI exercises the generators, the checks and their
/// tolerances. Sampling is emulated as the kernel draws: f32 weights, the
/// first kept element in the total order whose cumulative mass exceeds
/// `u * mass`.
#[test]
fn cpu_driver_passes_the_gpu_checks() {
    use flashsample::kernels::pivot::{self, Weights};
    use flashsample::kernels::radix::f32_key;
    let mut rng = common::rng("cpu_driver_passes_the_gpu_checks");
    let mut report = Mismatches::default();
    for (vocab, batch) in [(1, 20), (111, 600), (4099, 300), (32_000, 40)] {
        let b = Batch::random(&mut rng, batch, vocab);
        let results = par_rows(batch, |r| {
            let row = b.row(r);
            let p = &b.params[r];
            let sel = pivot::select_row(
                row,
                &pivot::RowParams {
                    top_k: p.top_k,
                    top_p: p.top_p,
                    min_p: p.min_p,
                    temperature: p.temperature,
                    prefilter: true,
                },
            );
            let keeps = |j: usize| sel.cut.keeps(f32_key(row[j].to_bits()), j as u32);
            let masked: Vec<f32> = (0..vocab)
                .map(|j| if keeps(j) { row[j] } else { f32::NEG_INFINITY })
                .collect();
            check_masked_row(row, p, &masked, sel.kept)?;
            // Sampling as the kernel does it.
            let mut kept: Vec<u32> = (0..vocab as u32).filter(|&j| keeps(j as usize)).collect();
            kept.sort_by_key(|&j| (std::cmp::Reverse(f32_key(row[j as usize].to_bits())), j));
            let token = kept.first().map(|_| {
                let greedy = p.temperature.is_nan() || p.temperature <= 0.0;
                let max = row[kept[0] as usize];
                let w = if greedy {
                    Weights::new(max, 1.0, 0.0)
                } else {
                    Weights::new(max, p.temperature, p.min_p)
                };
                let ws: Vec<f64> = kept
                    .iter()
                    .map(|&j| f64::from(w.weight(row[j as usize])))
                    .collect();
                let mass: f64 = ws.iter().sum();
                let u = f64::from(flashsample::kernels::noise::uniform_open(
                    flashsample::kernels::philox::row_uniform_bits(
                        flashsample::kernels::philox::seed_key(p.seed),
                        p.offset,
                        0,
                    ),
                ));
                let mut cum = 0.0;
                for (i, &wi) in ws.iter().enumerate() {
                    cum += wi;
                    if cum > u * mass {
                        return kept[i];
                    }
                }
                kept[kept.len() - 1]
            });
            check_sampled_row(row, p, token)
        });
        report_rows(&b, results, &mut report);
    }
    report.assert_none("CPU driver through the GPU checks");
}
