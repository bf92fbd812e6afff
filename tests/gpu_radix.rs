//! GPU tests of the cluster radix top-k and sparse top-p sampler
//! (`top_k_to_slab`, `top_k_top_p_sampling_from_probs`, issue 5) against
//! the float64 reference and, bit for bit, against the portable emulation
//! of the kernels (`flashsample::kernels::radix_select`).
//!
//! Without a GPU each GPU test prints a visible `SKIPPED` line and passes;
//! with `FLASHSAMPLE_REQUIRE_GPU=1` (the GPU bundle) a missing GPU fails
//! them. `sanitize_radix_paths` is small, launches every radix entry point
//! and prints its coverage line; the bundle also runs it under
//! compute-sanitizer. `cpu_emulation_passes_the_gpu_checks` runs without a
//! GPU: it puts the emulation through the very checks the GPU results go
//! through, so CI exercises the generators, the checks and their
//! tolerances.

mod common;

use std::sync::Arc;

use common::{Coverage, Mismatches};
use cudarc::driver::CudaStream;
use flashsample::kernels::radix_select::{
    self, FILTER_DIRECT_KEYS, FILTER_SMALL_MAX_K, SLAB, composite_bits, composite_index, prob_bits,
    select_slab, slab_len,
};
use flashsample::kernels::{noise, philox};
use flashsample::reference::{self, SamplingParams};
use flashsample::{
    Device, MAX_FILTER_CLUSTER, RadixWorkspace, Route, Rows, SampleOutput, Slab, TopKTopPParams,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KS: [u32; 5] = [1, 10, 50, 1000, 1024];
const TOP_P: [f32; 5] = [1e-6, 0.5, 0.9, 0.99, 1.0];

/// Shapes of probability rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// softmax of Gaussian or heavy-tailed logits, temperature 0.5 to 2.
    Softmax,
    /// softmax at temperature 0.05: most entries underflow to exactly 0.
    Peaked,
    /// softmax rounded to bf16: many exact ties.
    Bf16,
    /// Three values (0 among them): ties everywhere.
    FewValues,
    /// softmax with NaN, negative, -0 and +inf entries.
    Bad,
    /// Nothing positive and finite: an invalid row.
    Invalid,
    /// Ties straddling the k-th position.
    TiesAtK,
    /// Values in a narrow band: the first pass's crossing bucket is
    /// crowded, later passes refine it.
    Crowded,
    /// Dyadic masses with top-p exactly on, just inside and just outside
    /// the 1e-6 band of a cumulative mass.
    Boundary,
}

const KINDS: [Kind; 9] = [
    Kind::Softmax,
    Kind::Peaked,
    Kind::Bf16,
    Kind::FewValues,
    Kind::Bad,
    Kind::Invalid,
    Kind::TiesAtK,
    Kind::Crowded,
    Kind::Boundary,
];

/// `softmax(logits / t)` of one row, rounded to f32.
fn softmax_f32(logits: &[f32], t: f32) -> Vec<f32> {
    reference::softmax(logits, t)
        .unwrap()
        .into_iter()
        .map(|p| p as f32)
        .collect()
}

/// One row of `kind` and its top-p (the boundary rows choose their own).
fn make_row(rng: &mut StdRng, kind: Kind, vocab: usize, k: u32, top_p: f32) -> (Vec<f32>, f32) {
    let logits = |rng: &mut StdRng| {
        let mut l = Vec::with_capacity(vocab);
        let d = if rng.random_bool(0.7) {
            common::Dist::Gaussian
        } else {
            common::Dist::HeavyTail
        };
        common::push_row(rng, d, vocab, &mut l);
        l
    };
    let row = match kind {
        Kind::Softmax => {
            let t = [0.5, 1.0, 2.0][rng.random_range(0..3)];
            softmax_f32(&logits(rng), t)
        }
        Kind::Peaked => softmax_f32(&logits(rng), 0.05),
        Kind::Bf16 => softmax_f32(&logits(rng), 1.0)
            .into_iter()
            .map(common::bf16_round)
            .collect(),
        Kind::FewValues => (0..vocab)
            .map(|_| [0.0, 0.1, 0.2][rng.random_range(0..3)])
            .collect(),
        Kind::Bad => {
            let mut r = softmax_f32(&logits(rng), 1.0);
            for _ in 0..rng.random_range(1..8) {
                let i = rng.random_range(0..vocab);
                r[i] = [f32::NAN, -0.5, -0.0, f32::INFINITY, f32::NEG_INFINITY]
                    [rng.random_range(0..5)];
            }
            r
        }
        Kind::Invalid => (0..vocab)
            .map(|_| [0.0, f32::NAN, -1.0, f32::INFINITY, -0.0][rng.random_range(0..5)])
            .collect(),
        Kind::TiesAtK => {
            let k = (k as usize).clamp(1, vocab);
            let mut r: Vec<f32> = (0..vocab).map(|_| rng.random_range(0.0..1.0e-4)).collect();
            let m = rng.random_range(0..k);
            let ties = (k - m + rng.random_range(1..6)).min(vocab - m);
            let mut idx: Vec<usize> = (0..vocab).collect();
            for i in 0..m + ties {
                let j = rng.random_range(i..vocab);
                idx.swap(i, j);
            }
            for (n, &j) in idx[..m].iter().enumerate() {
                r[j] = 0.01 + n as f32 * 1.0e-3;
            }
            for &j in &idx[m..m + ties] {
                r[j] = 5.0e-3;
            }
            r
        }
        Kind::Crowded => (0..vocab)
            .map(|_| 0.5 + rng.random_range(0..4096) as f32 * 1.0e-7)
            .collect(),
        Kind::Boundary => {
            let r: Vec<f32> = (0..vocab)
                .map(|_| rng.random_range(0..16) as f32 / 64.0)
                .collect();
            let order = reference::probs_top_k(&r, k).unwrap();
            let w: Vec<f64> = order.iter().map(|&j| f64::from(r[j as usize])).collect();
            let total: f64 = w.iter().sum();
            let j = rng.random_range(1..w.len().max(2)).min(w.len());
            let cum: f64 = w[..j].iter().sum();
            let factor = [1.0, 1.0 + 4.0e-6, 1.0 - 4.0e-6, 1.0 + 5.0e-7][rng.random_range(0..4)];
            let p = (cum / total * factor) as f32;
            let p = if total > 0.0 && p > 0.0 && p < 1.0 {
                p
            } else {
                1.0
            };
            return (r, p);
        }
    };
    (row, top_p)
}

/// A batch of probability rows (rows `row_stride` apart; the gaps hold
/// 1e30, which would win every top-k if a kernel read it) with per-row
/// parameters.
struct Batch {
    rows: Rows,
    probs: Vec<f32>,
    top_k: Vec<u32>,
    top_p: Vec<f32>,
    seed: Vec<u64>,
    offset: Vec<u64>,
    kind: Vec<Kind>,
}

impl Batch {
    fn random(rng: &mut StdRng, batch: usize, vocab: usize, row_stride: usize) -> Batch {
        let mut b = Batch {
            rows: Rows {
                batch,
                vocab,
                row_stride,
            },
            probs: vec![1.0e30; (batch - 1) * row_stride + vocab],
            top_k: Vec::with_capacity(batch),
            top_p: Vec::with_capacity(batch),
            seed: Vec::with_capacity(batch),
            offset: Vec::with_capacity(batch),
            kind: Vec::with_capacity(batch),
        };
        for r in 0..batch {
            let mut ks = KS.to_vec();
            if vocab <= SLAB as usize {
                ks.extend([vocab as u32, vocab as u32 - 1]);
            }
            let k = ks[rng.random_range(0..ks.len())].max(1);
            let kind = KINDS[rng.random_range(0..KINDS.len())];
            let top_p = TOP_P[rng.random_range(0..TOP_P.len())];
            let (row, p) = make_row(rng, kind, vocab, k, top_p);
            b.probs[r * row_stride..r * row_stride + vocab].copy_from_slice(&row);
            b.top_k.push(k);
            b.top_p.push(p);
            b.seed.push(rng.random());
            b.offset.push(rng.random_range(0..1 << 40));
            b.kind.push(kind);
        }
        b
    }

    fn row(&self, r: usize) -> &[f32] {
        let at = r * self.rows.row_stride;
        &self.probs[at..at + self.rows.vocab]
    }

    fn upload(&self, stream: &Arc<CudaStream>) -> TopKTopPParams {
        TopKTopPParams::upload(stream, &self.top_k, &self.top_p, &self.seed, &self.offset).unwrap()
    }

    fn what(&self, r: usize) -> String {
        format!(
            "V={} row {r} ({:?}) k={} p={:e} seed={} offset={}",
            self.rows.vocab,
            self.kind[r],
            self.top_k[r],
            self.top_p[r],
            self.seed[r],
            self.offset[r]
        )
    }

    /// Row `r`'s slab and token from the GPU against the references.
    fn check(&self, r: usize, slab: &HostSlab, tokens: &[Option<u32>]) -> Result<(), String> {
        let (row, k) = (self.row(r), self.top_k[r]);
        check_slab_row(row, k, slab.row(r)).map_err(|e| format!("slab: {e}"))?;
        check_token_row(
            row,
            k,
            self.top_p[r],
            self.seed[r],
            self.offset[r],
            tokens[r],
        )
        .map_err(|e| format!("token: {e}"))
    }
}

/// The kernels' draw on the CPU: the emulated slab, stage 2 and the token.
fn emulate(row: &[f32], k: u32, p: f32, seed: u64, offset: u64) -> Option<u32> {
    let slab = select_slab(row, k, 1).slab;
    let u = noise::uniform_open(philox::row_uniform_bits(philox::seed_key(seed), offset, 0));
    radix_select::draw_from_slab(&slab, p, u).map(|d| composite_index(slab[d.position as usize]))
}

/// One row's slab against the float64 reference: the count, the top-k in
/// order with its clean values bit for bit, the padding.
fn check_slab_row(
    row: &[f32],
    k: u32,
    (values, indices, count): (&[u32], &[u32], u32),
) -> Result<(), String> {
    let want = reference::probs_top_k(row, k).map_err(|e| e.to_string())?;
    if count as usize != want.len() || count != slab_len(k, row.len() as u32) {
        return Err(format!("count {count}, reference {}", want.len()));
    }
    if let Some(i) = (0..want.len()).find(|&i| indices[i] != want[i]) {
        return Err(format!(
            "slab position {i}: index {} ({:#010x}), reference {} ({:#010x})",
            indices[i],
            row.get(indices[i] as usize).map_or(0, |x| x.to_bits()),
            want[i],
            row[want[i] as usize].to_bits()
        ));
    }
    if let Some(i) = (0..want.len()).find(|&i| values[i] != prob_bits(row[want[i] as usize])) {
        return Err(format!("slab position {i}: value {:#010x}", values[i]));
    }
    let pad = (want.len()..SLAB as usize).all(|i| values[i] == 0 && indices[i] == u32::MAX);
    if !pad {
        return Err("padding after the top-k was not written".into());
    }
    Ok(())
}

/// One row's token: equal to the emulation's bit for bit, agreeing with
/// the float64 reference (`probs_draw_agrees`), and the emulated top-p cut
/// equal to the reference's outside its 1e-6 band.
fn check_token_row(
    row: &[f32],
    k: u32,
    p: f32,
    seed: u64,
    offset: u64,
    got: Option<u32>,
) -> Result<(), String> {
    let emulated = emulate(row, k, p, seed, offset);
    if got != emulated {
        return Err(format!("token {got:?}, emulation {emulated:?}"));
    }
    reference::probs_draw_agrees(row, k, p, seed, offset, got)?;
    let near = reference::probs_top_p_near_boundary(row, k, p).map_err(|e| e.to_string())?;
    if !near {
        let slab = select_slab(row, k, 1).slab;
        let kept = radix_select::draw_from_slab(&slab, p, 0.5).map_or(0, |d| d.kept as usize);
        let want = reference::probs_kept_set(row, k, p).map_err(|e| e.to_string())?;
        if kept != want.len() {
            return Err(format!(
                "emulated top-p keeps {kept}, reference {}",
                want.len()
            ));
        }
    }
    Ok(())
}

/// `f(r)` for every row on all CPU cores, results in row order.
fn par_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(4, |t| t.get());
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, part) in out.chunks_mut(per).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (i, slot) in part.iter_mut().enumerate() {
                    *slot = Some(f(c * per + i));
                }
            });
        }
    });
    out.into_iter()
        .map(|x| x.expect("every row mapped"))
        .collect()
}

/// A slab read back from the GPU (values as bit patterns).
#[derive(Debug, PartialEq, Eq)]
struct HostSlab {
    values: Vec<u32>,
    indices: Vec<u32>,
    counts: Vec<u32>,
}

impl HostSlab {
    /// Row `r`: (value bits, indices, count).
    fn row(&self, r: usize) -> (&[u32], &[u32], u32) {
        let s = SLAB as usize;
        (
            &self.values[r * s..(r + 1) * s],
            &self.indices[r * s..(r + 1) * s],
            self.counts[r],
        )
    }
}

/// Slab of the batch by `route` on the GPU (outputs poisoned first).
fn slab_on_gpu(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    route: Route,
    ws: &mut RadixWorkspace,
) -> HostSlab {
    let d = stream.clone_htod(&b.probs).unwrap();
    let params = b.upload(stream);
    let n = b.rows.batch * SLAB as usize;
    let mut slab = Slab {
        values: stream.clone_htod(&vec![f32::NAN; n]).unwrap(),
        indices: stream.clone_htod(&vec![7u32; n]).unwrap(),
        counts: stream.clone_htod(&vec![u32::MAX; b.rows.batch]).unwrap(),
    };
    ws.force_route(Some(route));
    let taken = dev.top_k_to_slab(stream, &d.as_view(), b.rows, &params, &mut slab, ws);
    ws.force_route(None);
    assert_eq!(taken.unwrap(), route);
    HostSlab {
        values: stream
            .clone_dtoh(&slab.values)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        indices: stream.clone_dtoh(&slab.indices).unwrap(),
        counts: stream.clone_dtoh(&slab.counts).unwrap(),
    }
}

/// Tokens of the batch by `route` on the GPU (`None` where flagged
/// invalid; outputs poisoned first).
fn tokens_on_gpu(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    route: Route,
    ws: &mut RadixWorkspace,
) -> Vec<Option<u32>> {
    let d = stream.clone_htod(&b.probs).unwrap();
    let params = b.upload(stream);
    let mut out = SampleOutput::new(stream, b.rows.batch).unwrap();
    stream
        .memcpy_htod(&vec![u32::MAX; b.rows.batch], &mut out.tokens)
        .unwrap();
    stream
        .memcpy_htod(&vec![7u8; b.rows.batch], &mut out.valid)
        .unwrap();
    ws.force_route(Some(route));
    let taken =
        dev.top_k_top_p_sampling_from_probs(stream, &d.as_view(), b.rows, &params, &mut out, ws);
    ws.force_route(None);
    assert_eq!(taken.unwrap(), route);
    let tokens = stream.clone_dtoh(&out.tokens).unwrap();
    let valid = stream.clone_dtoh(&out.valid).unwrap();
    tokens
        .iter()
        .zip(&valid)
        .map(|(&t, &v)| {
            assert!(v <= 1, "valid flag not written: {v}");
            assert!(
                v == 0 || t < b.rows.vocab as u32,
                "token {t} outside the vocabulary"
            );
            (v == 1).then_some(t)
        })
        .collect()
}

/// The routes to compare on this GPU for `rows`: the planned one, one CTA
/// per row, a cooperative launch, clusters of 2, 3 (a size that is not a
/// power of two: the crossing's slices then end unevenly) and of the
/// largest size where the GPU has clusters, and the filter route where it
/// runs.
fn routes(dev: &Device, rows: Rows) -> Vec<Route> {
    let caps = dev.radix_caps().unwrap();
    let mut v = vec![
        dev.route(rows, SLAB).unwrap(),
        Route::SingleCta,
        Route::Cooperative { ctas: 3 },
    ];
    if caps.max_cluster >= 2 {
        v.push(Route::Cluster { ctas: 2 });
        v.push(Route::Cluster {
            ctas: caps.max_cluster.min(3),
        });
        v.push(Route::Cluster {
            ctas: caps.max_cluster,
        });
    }
    if caps.filter_ctas_per_sm > 0 {
        v.push(Route::Filter);
    }
    // Rows split over clusters of filter CTAs, where the GPU runs them.
    for ctas in 2..=MAX_FILTER_CLUSTER {
        if caps.filter_cluster_slots[ctas as usize] > 0 {
            v.push(Route::FilterCluster { ctas });
        }
    }
    let mut unique = Vec::new();
    for r in v {
        if !unique.contains(&r) {
            unique.push(r);
        }
    }
    unique
}

/// Every row of `b` through both entry points and every route, against the
/// references; the routes must agree bit for bit.
fn check_batch(
    dev: &Device,
    stream: &Arc<CudaStream>,
    b: &Batch,
    ws: &mut RadixWorkspace,
    report: &mut Mismatches,
) {
    let mut first: Option<(HostSlab, Vec<Option<u32>>)> = None;
    for route in routes(dev, b.rows) {
        let slab = slab_on_gpu(dev, stream, b, route, ws);
        let tokens = tokens_on_gpu(dev, stream, b, route, ws);
        if let Some((slab0, tokens0)) = &first {
            report.check(&slab == slab0, || {
                format!(
                    "V={}: {route:?} slab differs from the first route's",
                    b.rows.vocab
                )
            });
            report.check(&tokens == tokens0, || {
                format!(
                    "V={}: {route:?} tokens differ from the first route's",
                    b.rows.vocab
                )
            });
            continue;
        }
        let results = par_map(b.rows.batch, |r| b.check(r, &slab, &tokens));
        for (r, res) in results.into_iter().enumerate() {
            report.check(res.is_ok(), || {
                format!("{} {route:?}: {}", b.what(r), res.unwrap_err())
            });
        }
        first = Some((slab, tokens));
    }
}

#[test]
fn radix_matches_float64_reference() {
    const TEST: &str = "radix_matches_float64_reference";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut rows = 0;
    // Rows of a small `k` whose gathered keys exceed what their sort takes
    // (a crowded crossing bucket): the cluster and cooperative routes
    // narrow them by a local select on the row's first CTA before the
    // sort.
    let mut narrowed = 0;
    // 10,400 rows, every kind, k in {1, 10, 50, 1000, 1024} (and V, V - 1
    // for V <= 1024), every route of the GPU; one strided shape.
    for (vocab, stride, batch, repeats) in [
        (111, 111, 1000, 3),
        (1000, 1003, 1000, 2),
        (4099, 4099, 1000, 2),
        (32_768, 32_768, 1000, 3),
        (151_936, 151_936, 200, 2),
    ] {
        for _ in 0..repeats {
            let b = Batch::random(&mut rng, batch, vocab, stride);
            check_batch(&dev, &stream, &b, &mut ws, &mut report);
            rows += batch;
            narrowed += par_map(batch, |r| {
                slab_len(b.top_k[r], vocab as u32) <= FILTER_DIRECT_KEYS
                    && select_slab(b.row(r), b.top_k[r], 1).gathered > FILTER_DIRECT_KEYS
            })
            .into_iter()
            .filter(|&n| n)
            .count();
        }
    }
    assert!(rows >= 10_000);
    assert!(
        narrowed >= 1000,
        "only {narrowed} rows exercise the gathered keys' narrowing"
    );
    report.assert_none(&format!(
        "radix slab and sampling, {rows} rows ({narrowed} narrowed before the sort)"
    ));
}

/// The same rows alone, in batches of every size and position, by every
/// route, twice: bit-identical slabs and tokens.
#[test]
fn radix_results_do_not_depend_on_batch_or_run() {
    const TEST: &str = "radix_results_do_not_depend_on_batch_or_run";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let vocab = 32_768;
    let rows = Batch::random(&mut rng, 48, vocab, vocab);
    let planned = dev.route(rows.rows, SLAB).unwrap();
    let base = tokens_on_gpu(&dev, &stream, &rows, planned, &mut ws);
    let base_slab = slab_on_gpu(&dev, &stream, &rows, planned, &mut ws);
    let again = tokens_on_gpu(&dev, &stream, &rows, planned, &mut ws);
    report.check(base == again, || "tokens differ between two runs".into());
    // Batches of 1, 7 and 300 rows with the 48 rows at random positions
    // among other rows.
    for batch in [1usize, 7, 300] {
        for _ in 0..4 {
            let mut b = Batch::random(&mut rng, batch, vocab, vocab);
            let mut placed = Vec::new();
            for _ in 0..batch.min(12) {
                let (src, dst) = (rng.random_range(0..48), rng.random_range(0..batch));
                b.probs[dst * vocab..(dst + 1) * vocab].copy_from_slice(rows.row(src));
                b.top_k[dst] = rows.top_k[src];
                b.top_p[dst] = rows.top_p[src];
                b.seed[dst] = rows.seed[src];
                b.offset[dst] = rows.offset[src];
                placed.retain(|&(_, d)| d != dst);
                placed.push((src, dst));
            }
            for route in routes(&dev, b.rows) {
                let t = tokens_on_gpu(&dev, &stream, &b, route, &mut ws);
                let slab = slab_on_gpu(&dev, &stream, &b, route, &mut ws);
                for &(src, dst) in &placed {
                    report.check(t[dst] == base[src], || {
                        format!(
                            "B={batch} {route:?}: row {src} at {dst}: {:?}, alone-in-48 {:?}",
                            t[dst], base[src]
                        )
                    });
                    report.check(slab.row(dst) == base_slab.row(src), || {
                        format!("B={batch} {route:?}: slab of row {src} at {dst} differs")
                    });
                }
            }
        }
    }
    report.assert_none("radix batch and run invariance");
}

/// Every route captured once into a CUDA graph and replayed: the same
/// offsets reproduce the tokens bit for bit, offsets advanced in device
/// memory between replays give the tokens of a direct call with them.
#[test]
fn radix_sampler_replays_from_cuda_graphs() {
    use std::cell::RefCell;
    const TEST: &str = "radix_sampler_replays_from_cuda_graphs";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let ws = RefCell::new(RadixWorkspace::new(&stream).unwrap());
    for batch in [3usize, 200] {
        let b = Batch::random(&mut rng, batch, 32_768, 32_768);
        let probs = stream.clone_htod(&b.probs).unwrap();
        let out = RefCell::new(SampleOutput::new(&stream, batch).unwrap());
        for route in routes(&dev, b.rows) {
            ws.borrow_mut().force_route(Some(route));
            // Three random rows may all have one candidate (k = 1, a tiny
            // top-p, a one-hot or invalid row); of 200, some draw.
            common::check_graph_replays(
                &stream,
                &mut b.upload(&stream),
                |p| p.offset_mut(),
                &b.offset,
                |p| {
                    let taken = dev
                        .top_k_top_p_sampling_from_probs(
                            &stream,
                            &probs.as_view(),
                            b.rows,
                            p,
                            &mut out.borrow_mut(),
                            &mut ws.borrow_mut(),
                        )
                        .unwrap();
                    assert_eq!(taken, route);
                },
                || stream.clone_dtoh(&out.borrow().tokens).unwrap(),
                batch >= 8,
            );
        }
        ws.borrow_mut().force_route(None);
    }
}

/// The sampler called from four host threads on four streams at once, each
/// with its own workspace, gives the tokens of serial calls.
#[test]
fn radix_concurrent_calls_on_several_streams_agree_with_serial_calls() {
    const TEST: &str = "radix_concurrent_calls_on_several_streams_agree_with_serial_calls";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let batches: Vec<Batch> = [1usize, 7, 64, 300]
        .iter()
        .map(|&n| Batch::random(&mut rng, n, 32_768, 32_768))
        .collect();
    common::check_concurrent(
        &dev,
        &stream,
        &batches,
        20,
        |s| RadixWorkspace::new(s).unwrap(),
        |s, ws, b| {
            let route = dev.route(b.rows, SLAB).unwrap();
            tokens_on_gpu(&dev, s, b, route, ws)
        },
    );
}

/// Rows whose top-p threshold lies exactly on a cumulative mass, inside
/// the 1e-6 band and outside it on both sides: the token is always the
/// emulation's and inside the reference's kept set (widened only inside
/// the band), and the boundary entry is drawn when, and only when, the
/// threshold is past it.
#[test]
fn radix_top_p_boundary_band() {
    const TEST: &str = "radix_top_p_boundary_band";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let row = [0.5f32, 0.25, 0.25, 0.0];
    let draws = 4000;
    // (top_p, whether index 2 may be drawn): exactly at 0.75 the exclusive
    // mass 0.75 is not below the threshold.
    for (top_p, third) in [(0.75f32, false), (0.750_003, true), (0.749_997, false)] {
        let b = Batch {
            rows: Rows::contiguous(draws, 4),
            probs: row.repeat(draws),
            top_k: vec![4; draws],
            top_p: vec![top_p; draws],
            seed: vec![99; draws],
            offset: (0..draws as u64).collect(),
            kind: vec![Kind::Boundary; draws],
        };
        let tokens = tokens_on_gpu(&dev, &stream, &b, dev.route(b.rows, 4).unwrap(), &mut ws);
        let hits = tokens.iter().filter(|&&t| t == Some(2)).count();
        report.check((hits > 0) == third, || {
            format!("top_p {top_p}: index 2 drawn {hits} times")
        });
        for (r, &t) in tokens.iter().enumerate() {
            let res = check_token_row(&row, 4, top_p, 99, r as u64, t);
            report.check(res.is_ok(), || {
                format!("top_p {top_p} offset {r}: {}", res.unwrap_err())
            });
        }
    }
    report.assert_none("radix top-p boundary band");
}

/// The probability that a Binomial(n, p) count exceeds `t`.
fn binomial_tail(n: u64, p: f64, t: u64) -> f64 {
    let mut term = (1.0 - p).powi(n as i32);
    let mut cdf = term;
    for i in 0..t.min(n) {
        term *= (n - i) as f64 / (i + 1) as f64 * p / (1.0 - p);
        cdf += term;
    }
    (1.0 - cdf).max(0.0)
}

/// 10^6 draws per row from two rows (a softmax row, k = 50, p = 0.9; a row
/// of few tied values, k = 10, p = 0.7): never outside the kept set, and
/// each kept token's count inside the 99 % binomial band of the exact
/// renormalised distribution, up to as many misses as 99 % bands allow
/// with probability 1 - 1e-4.
#[test]
fn radix_draws_follow_the_exact_distribution() {
    const TEST: &str = "radix_draws_follow_the_exact_distribution";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let vocab = 4096;
    let per_row = 10_000;
    let steps = 100u64;
    let (soft, _) = make_row(&mut rng, Kind::Softmax, vocab, 50, 0.9);
    let ties: Vec<f32> = (0..vocab)
        .map(|j| [0.3, 0.2, 0.2, 0.1][j % 4] * 1.0e-3)
        .collect();
    let cases = [(soft, 50u32, 0.9f32), (ties, 10, 0.7)];
    let batch = per_row * cases.len();
    let mut probs = Vec::with_capacity(batch * vocab);
    for (row, _, _) in &cases {
        for _ in 0..per_row {
            probs.extend_from_slice(row);
        }
    }
    let d = stream.clone_htod(&probs).unwrap();
    let rows = Rows::contiguous(batch, vocab);
    let top_k: Vec<u32> = cases.iter().flat_map(|c| vec![c.1; per_row]).collect();
    let top_p: Vec<f32> = cases.iter().flat_map(|c| vec![c.2; per_row]).collect();
    let mut out = SampleOutput::new(&stream, batch).unwrap();
    let mut counts = vec![vec![0u64; vocab]; cases.len()];
    let seed = rng.random();
    for step in 0..steps {
        let offsets: Vec<u64> = (0..batch as u64).map(|r| step * batch as u64 + r).collect();
        let params =
            TopKTopPParams::upload(&stream, &top_k, &top_p, &vec![seed; batch], &offsets).unwrap();
        dev.top_k_top_p_sampling_from_probs(
            &stream,
            &d.as_view(),
            rows,
            &params,
            &mut out,
            &mut ws,
        )
        .unwrap();
        let tokens = stream.clone_dtoh(&out.tokens).unwrap();
        let valid = stream.clone_dtoh(&out.valid).unwrap();
        for (r, (&t, &v)) in tokens.iter().zip(&valid).enumerate() {
            assert_eq!(v, 1, "row {r} flagged invalid");
            counts[r / per_row][t as usize] += 1;
        }
    }
    let n = per_row as u64 * steps;
    for (c, (row, k, p)) in cases.iter().enumerate() {
        let kept = reference::probs_kept_set(row, *k, *p).unwrap();
        let mass: f64 = kept
            .iter()
            .map(|&j| reference::prob_weight(row[j as usize]))
            .sum();
        let outside: u64 = (0..vocab as u32)
            .filter(|j| !kept.contains(j))
            .map(|j| counts[c][j as usize])
            .sum();
        assert_eq!(outside, 0, "case {c}: {outside} draws outside the kept set");
        let mut misses = Vec::new();
        for &j in &kept {
            let q = reference::prob_weight(row[j as usize]) / mass;
            let band = reference::stats::binomial_band_99(n, q).unwrap();
            if !band.contains(&counts[c][j as usize]) {
                misses.push(format!(
                    "token {j}: {} not in {band:?}",
                    counts[c][j as usize]
                ));
            }
        }
        let m = kept.len() as u64;
        let allowed = (0..=m)
            .find(|&t| binomial_tail(m, 0.01, t) < 1e-4)
            .unwrap_or(m);
        println!(
            "case {c}: {n} draws over {m} kept tokens, {} outside their 99 % band (allowed {allowed})",
            misses.len()
        );
        assert!(misses.len() as u64 <= allowed, "case {c}: {misses:?}");
    }
}

/// Whether a pivot-route token that differs from the reference's is a
/// near tie: inside the reference's kept set widened by 1e-5 when top-p is
/// in its band, else inside it with its cumulative window (the reference's
/// renormalised probabilities, in its order) reaching `u` within 1e-6.
fn pivot_draw_near_tie(logits: &[f32], p: &SamplingParams, t: u32) -> bool {
    if reference::top_p_near_boundary(logits, p).unwrap() {
        let wider = SamplingParams {
            top_p: (p.top_p * (1.0 + 1e-5)).min(1.0),
            ..*p
        };
        return reference::kept_set(logits, &wider).unwrap().contains(&t);
    }
    let probs = reference::probabilities(logits, p).unwrap();
    let kept = reference::kept_set(logits, p).unwrap();
    let u = f64::from(noise::uniform_open(philox::row_uniform_bits(
        philox::seed_key(p.seed),
        p.offset,
        0,
    )));
    kept.iter().position(|&j| j == t).is_some_and(|pos| {
        let before: f64 = kept[..pos].iter().map(|&j| probs[j as usize]).sum();
        before <= u + 1e-6 && before + probs[t as usize] >= u - 1e-6
    })
}

/// `k > SLAB` takes the pivot path on `ln p`: tokens agree with the float64
/// reference of the Qrita sampler on those logits.
#[test]
fn radix_large_k_takes_the_pivot_path() {
    const TEST: &str = "radix_large_k_takes_the_pivot_path";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let vocab = 8192;
    let mut b = Batch::random(&mut rng, 300, vocab, vocab);
    for k in b.top_k.iter_mut() {
        *k = [1025, 2000, 8191, 9000][rng.random_range(0..4)];
    }
    let rows = b.rows;
    assert_eq!(dev.route(rows, 2000).unwrap(), Route::Pivot);
    let tokens = tokens_on_gpu(&dev, &stream, &b, Route::Pivot, &mut ws);
    for (r, &t) in tokens.iter().enumerate() {
        let logits: Vec<f32> = b
            .row(r)
            .iter()
            .map(|&x| radix_select::prob_logit(prob_bits(x)))
            .collect();
        let p = SamplingParams {
            temperature: 1.0,
            top_k: b.top_k[r],
            top_p: b.top_p[r],
            min_p: 0.0,
            seed: b.seed[r],
            offset: b.offset[r],
        };
        let want = reference::sample_top_k_top_p(&logits, &p).unwrap();
        let ok = t == want || t.is_some_and(|t| pivot_draw_near_tie(&logits, &p, t));
        report.check(ok, || {
            format!("{}: GPU {t:?}, reference {want:?}", b.what(r))
        });
    }
    report.assert_none("pivot route for k > SLAB");
}

#[test]
fn radix_bad_arguments_are_rejected() {
    let Some((dev, stream)) = common::gpu("radix_bad_arguments_are_rejected") else {
        return;
    };
    let up = |k: &[u32], p: &[f32]| {
        let n = k.len();
        TopKTopPParams::upload(&stream, k, p, &vec![0; n], &vec![0; n])
    };
    assert!(up(&[1], &[0.5]).is_ok());
    for (k, p) in [(&[0u32][..], &[0.5f32][..]), (&[], &[]), (&[1, 2], &[0.5])] {
        assert!(up(k, p).is_err(), "top_k {k:?} top_p {p:?}");
    }
    for p in [0.0, -0.5, 1.5, f32::NAN] {
        assert!(up(&[5], &[p]).is_err(), "top_p {p}");
    }
    let small = up(&[5, 5], &[0.9, 0.9]).unwrap();
    let big = up(&[5, 2000], &[0.9, 0.9]).unwrap();
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let d = stream.alloc_zeros::<f32>(20).unwrap();
    let ok = Rows::contiguous(2, 10);
    // (route, params, rows, slab rows, output rows) -> (slab call, sample call) succeeded.
    let mut calls =
        |route: Option<Route>, params: &TopKTopPParams, rows: Rows, slab_rows, out_rows| {
            ws.force_route(route);
            let mut slab = Slab::new(&stream, slab_rows).unwrap();
            let mut out = SampleOutput::new(&stream, out_rows).unwrap();
            let v = d.as_view();
            (
                dev.top_k_to_slab(&stream, &v, rows, params, &mut slab, &mut ws)
                    .is_ok(),
                dev.top_k_top_p_sampling_from_probs(&stream, &v, rows, params, &mut out, &mut ws)
                    .is_ok(),
            )
        };
    assert_eq!(calls(None, &small, ok, 2, 2), (true, true));
    // Too-short outputs; k above the slab (sampling takes the pivot path).
    assert_eq!(calls(None, &small, ok, 1, 1), (false, false));
    assert_eq!(calls(None, &big, ok, 2, 2), (false, true));
    assert_eq!(
        calls(Some(Route::SingleCta), &big, ok, 2, 2),
        (false, false)
    );
    assert_eq!(calls(Some(Route::Filter), &big, ok, 2, 2), (false, false));
    assert_eq!(calls(Some(Route::Pivot), &small, ok, 2, 2), (false, true));
    for rows in [
        Rows::contiguous(2, 11),
        Rows::contiguous(3, 10),
        Rows::contiguous(0, 10),
        Rows::contiguous(2, 0),
    ] {
        assert_eq!(calls(None, &small, rows, 3, 3), (false, false), "{rows:?}");
    }
    let caps = dev.radix_caps().unwrap();
    for route in [
        Route::Cluster {
            ctas: caps.max_cluster + 1,
        },
        Route::Cluster { ctas: 0 },
        Route::Cooperative { ctas: 0 },
        Route::Cooperative { ctas: 1 << 20 },
    ] {
        assert_eq!(
            calls(Some(route), &small, ok, 2, 2),
            (false, false),
            "{route:?}"
        );
    }
    stream.synchronize().unwrap();
}

/// Every radix entry point on tiny inputs: both modes, every route (one
/// CTA, cooperative, clusters, filter), misaligned strided rows, multi-pass
/// and invalid rows, and the pivot route; the bundle runs this under
/// compute-sanitizer ([`sanitize_radix_filter_long_rows`] has the filter
/// route's long rows, in a process of their own: racecheck over both in
/// one did not finish in 100 s).
#[test]
fn sanitize_radix_paths() {
    const TEST: &str = "sanitize_radix_paths";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(29);
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut coverage = Coverage::default();
    for (vocab, stride, batch) in [
        (1, 1, 3),
        (7, 9, 2),
        (111, 113, 5),
        (1029, 1031, 3),
        (5000, 5000, 2),
    ] {
        let mut b = Batch::random(&mut rng, batch, vocab, stride);
        // A crowded row (several passes) and an invalid one in every batch.
        for (r, kind) in [(0, Kind::Crowded), (batch - 1, Kind::Invalid)] {
            let (row, _) = make_row(&mut rng, kind, vocab, b.top_k[r], 1.0);
            b.probs[r * stride..r * stride + vocab].copy_from_slice(&row);
            b.kind[r] = kind;
        }
        for route in routes(&dev, b.rows) {
            let slab = slab_on_gpu(&dev, &stream, &b, route, &mut ws);
            let tokens = tokens_on_gpu(&dev, &stream, &b, route, &mut ws);
            let kernel = match route {
                Route::Cooperative { .. } => "radix_topk_coop_f32",
                Route::Filter | Route::FilterCluster { .. } => filter_kernel(&b),
                _ => "radix_topk_cluster_f32",
            };
            coverage.case(&[kernel]);
            coverage.case(&[kernel]);
            for r in 0..batch {
                let res = b.check(r, &slab, &tokens);
                report.check(res.is_ok(), || {
                    format!("{} {route:?}: {}", b.what(r), res.unwrap_err())
                });
            }
        }
    }
    // k > SLAB: ln p, then the Qrita sampler.
    let mut b = Batch::random(&mut rng, 2, 1100, 1101);
    b.top_k = vec![1100, 1050];
    let tokens = tokens_on_gpu(&dev, &stream, &b, Route::Pivot, &mut ws);
    coverage.case(&["radix_probs_to_logits_f32", "topk_topp_sample_f32"]);
    for (r, t) in tokens.iter().enumerate() {
        let kept: Vec<u32> = reference::probs_top_k(b.row(r), b.top_k[r]).unwrap();
        let inside = t.is_none_or(|t| {
            kept.contains(&t) && reference::prob_weight(b.row(r)[t as usize]) > 0.0
        });
        report.check(inside, || {
            format!("pivot row {r}: token {t:?} outside the top-k")
        });
    }
    report.assert_none("sanitize: radix paths");
    coverage.report(TEST);
}

/// The filter route over several rounds, under compute-sanitizer in the
/// bundle: compactions after the first round and whenever the buffer fills
/// (the ascending row: after every round but the last). Five rounds: the
/// staged kernel (sm_90 on) refills each of its four stages, and its
/// compactions borrow them. Rows starting at every offset mod 4 (strides
/// 40005 and 40003) and ending inside a 16-byte group (its partial first
/// and last groups read by threads, the rest by bulk copies); rows of 8193
/// to 8196 slots (a last round of one partial group: no bulk copy, or of
/// one 16-byte group); more rows than CTAs (the stages' barriers carried
/// across rows). (The 1000-row batches of `radix_matches_float64_reference`
/// loop the CTAs over many rows too.)
#[test]
fn sanitize_radix_filter_long_rows() {
    const TEST: &str = "sanitize_radix_filter_long_rows";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(31);
    let mut ws = RadixWorkspace::new(&stream).unwrap();
    let mut report = Mismatches::default();
    let mut coverage = Coverage::default();
    if dev.radix_caps().unwrap().filter_ctas_per_sm == 0 {
        println!("{TEST}: this GPU runs no filter CTA; nothing to check");
        coverage.report(TEST);
        return;
    }
    for (vocab, stride, batch) in [
        (40_003, 40_005, 3),
        (40_001, 40_003, 4),
        (8193, 8195, 4),
        (9000, 9001, 300),
    ] {
        let mut b = Batch::random(&mut rng, batch, vocab, stride);
        let mut row: Vec<f32> = b.row(1).to_vec();
        row.sort_by_key(|x| prob_bits(*x));
        b.probs[stride..stride + vocab].copy_from_slice(&row);
        b.top_k[1] = 50;
        // The whole rows on one CTA, then (where the GPU runs them)
        // split over clusters of 2 and of the most filter CTAs: parts
        // starting inside a 16-byte group, the merge through
        // distributed shared memory.
        let caps = dev.radix_caps().unwrap();
        let mut routes = vec![Route::Filter];
        for ctas in [2, MAX_FILTER_CLUSTER] {
            let split = Route::FilterCluster { ctas };
            if caps.filter_cluster_slots[ctas as usize] > 0
                && vocab >= 2048 * ctas as usize
                && !routes.contains(&split)
            {
                routes.push(split);
            }
        }
        // Each shape of a few rows twice: as drawn (the kernel for any k),
        // then every k at most FILTER_SMALL_MAX_K (the small-k kernel).
        for small in [false, true] {
            if small {
                if batch > 4 {
                    break;
                }
                for k in b.top_k.iter_mut() {
                    *k = (*k).min(FILTER_SMALL_MAX_K);
                }
            }
            for &route in &routes {
                let slab = slab_on_gpu(&dev, &stream, &b, route, &mut ws);
                let tokens = tokens_on_gpu(&dev, &stream, &b, route, &mut ws);
                coverage.case(&[filter_kernel(&b)]);
                coverage.case(&[filter_kernel(&b)]);
                for r in 0..batch {
                    let res = b.check(r, &slab, &tokens);
                    report.check(res.is_ok(), || {
                        format!("{} {route:?}, long rows: {}", b.what(r), res.unwrap_err())
                    });
                }
            }
        }
    }
    report.assert_none("sanitize: radix filter, long rows");
    coverage.report(TEST);
}

/// The filter kernel a launch of `b`'s rows runs: the small-`k` one when
/// every row's `k` is at most `FILTER_SMALL_MAX_K` (the host's choice).
fn filter_kernel(b: &Batch) -> &'static str {
    if b.top_k.iter().all(|&k| k <= FILTER_SMALL_MAX_K) {
        "radix_topk_filter_small_f32"
    } else {
        "radix_topk_filter_f32"
    }
}

/// The emulation of the kernels through the GPU checks, without a GPU:
/// slabs against the float64 top-k, tokens against the reference.
#[test]
fn cpu_emulation_passes_the_gpu_checks() {
    let mut rng = common::rng("cpu_emulation_passes_the_gpu_checks");
    let mut report = Mismatches::default();
    for (vocab, batch) in [(1, 20), (111, 400), (1029, 200), (4099, 200), (32_768, 30)] {
        let b = Batch::random(&mut rng, batch, vocab, vocab);
        let results = par_map(batch, |r| {
            let (row, k) = (b.row(r), b.top_k[r]);
            let slab = select_slab(row, k, 1 + (r % 8) as u32).slab;
            let mut values = vec![0u32; SLAB as usize];
            let mut indices = vec![u32::MAX; SLAB as usize];
            for (i, &key) in slab.iter().enumerate() {
                values[i] = composite_bits(key);
                indices[i] = composite_index(key);
            }
            check_slab_row(row, k, (&values, &indices, slab.len() as u32))?;
            let token = emulate(row, k, b.top_p[r], b.seed[r], b.offset[r]);
            check_token_row(row, k, b.top_p[r], b.seed[r], b.offset[r], token)
        });
        for (r, res) in results.into_iter().enumerate() {
            report.check(res.is_ok(), || {
                format!("{}: {}", b.what(r), res.unwrap_err())
            });
        }
    }
    report.assert_none("CPU emulation through the GPU checks");
}
