//! GPU tests of tensor-parallel fused sampling ([`TpSampler`]) against the
//! unsharded fused kernel ([`Device::fused_sample`], itself checked against
//! float64 in `tests/gpu.rs`).
//!
//! What "identical" means here: tokens and validity equal the unsharded
//! kernel's bit for bit for every split; log-normalisers and
//! log-probabilities equal them bit for bit when the split's boundaries are
//! on the kernel's tile grid ([`VocabSplit::tile_aligned`]), and are within
//! [`VocabSplit::lse_tolerance`] otherwise (non-finite values equal bit for
//! bit); every rank of a peer-to-peer or NCCL group gets the same bits.
//!
//! Without a GPU each test prints a visible `SKIPPED` line and passes; the
//! multi-GPU tests also skip (visibly, with the reason) when fewer than two
//! GPUs, no peer-to-peer path or no NCCL library are present.
//! `sanitize_tp_paths` is small and runs under compute-sanitizer in the
//! bundle.

mod common;

use std::cell::RefCell;
use std::io::Write;
use std::sync::Arc;

use common::{Coverage, Dist, Mismatches};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView};
use flashsample::{
    Device, FusedOutput, HeadElem, HeadInput, HeadShape, RowParams, TpSampler, VocabSplit,
    Workspace,
};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SHARDS: [usize; 5] = [1, 2, 3, 4, 8];

/// A random LM-head problem on the host: bf16-representable hidden states
/// and weights, an optional bias row drawn like a logits row of
/// `common::push_row` (so with NaN, -inf, +inf, ties or nothing valid),
/// per-row temperature, seed and offset.
struct Problem {
    shape: HeadShape,
    hidden: Vec<f32>,
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    temperature: Vec<f32>,
    seed: Vec<u64>,
    offset: Vec<u64>,
}

/// Scales `v` to root-mean-square `rms` and rounds it to bf16.
fn scaled_bf16(mut v: Vec<f32>, rms: f32) -> Vec<f32> {
    let now = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
    for x in &mut v {
        *x = common::bf16_round(*x * rms / now.max(1e-30));
    }
    v
}

impl Problem {
    fn random(rng: &mut StdRng, batch: usize, vocab: usize, dim: usize) -> Problem {
        let mut gaussian = |n: usize, rms: f32| {
            let mut v = Vec::with_capacity(n);
            common::push_row(rng, Dist::Gaussian, n, &mut v);
            scaled_bf16(v, rms)
        };
        // Logits of a few units: |h| ~ 1, |W| ~ 3 / sqrt(dim).
        let hidden = gaussian(batch * dim, 1.0);
        let weight = gaussian(vocab * dim, 3.0 / (dim as f32).sqrt());
        let bias = match rng.random_range(0..8) {
            0..3 => None,
            3 => Some(Dist::Special),
            4 => Some(Dist::PosInf),
            5 => Some(Dist::Invalid),
            6 => Some(Dist::FewValues),
            _ => Some(Dist::Gaussian),
        }
        .map(|dist| {
            let mut b = Vec::with_capacity(vocab);
            common::push_row(rng, dist, vocab, &mut b);
            b
        });
        Problem {
            shape: HeadShape::new(batch, vocab, dim),
            hidden,
            weight,
            bias,
            temperature: (0..batch)
                .map(|_| [0.0f32, 0.3, 1.0, 2.0, f32::NAN][rng.random_range(0..5)])
                .collect(),
            seed: (0..batch).map(|_| rng.random()).collect(),
            offset: (0..batch)
                .map(|_| rng.random_range(0..1u64 << 40))
                .collect(),
        }
    }

    fn upload<T: HeadElem>(&self, stream: &Arc<CudaStream>, to: fn(f32) -> T) -> OnDevice<T> {
        let convert = |x: &[f32]| x.iter().map(|&v| to(v)).collect::<Vec<T>>();
        OnDevice {
            shape: self.shape,
            hidden: stream.clone_htod(&convert(&self.hidden)).unwrap(),
            weight: stream.clone_htod(&convert(&self.weight)).unwrap(),
            bias: self.bias.as_ref().map(|b| stream.clone_htod(b).unwrap()),
            params: RowParams::upload(stream, &self.temperature, &self.seed, &self.offset).unwrap(),
        }
    }
}

/// A [`Problem`] on one device.
struct OnDevice<T> {
    shape: HeadShape,
    hidden: CudaSlice<T>,
    weight: CudaSlice<T>,
    bias: Option<CudaSlice<f32>>,
    params: RowParams,
}

/// Views of the hidden states, the LM-head rows and bias of `rows`.
type ShardViews<'a, T> = (CudaView<'a, T>, CudaView<'a, T>, Option<CudaView<'a, f32>>);

impl<T: HeadElem> OnDevice<T> {
    fn views(&self, rows: std::ops::Range<usize>) -> ShardViews<'_, T> {
        let d = self.shape.dim;
        (
            self.hidden.as_view(),
            self.weight.slice(rows.start * d..rows.end * d),
            self.bias.as_ref().map(|b| b.slice(rows)),
        )
    }

    fn input<'a>(&'a self, v: &'a ShardViews<'a, T>) -> HeadInput<'a, T> {
        HeadInput {
            hidden: &v.0,
            lm_head: &v.1,
            bias: v.2.as_ref(),
            params: &self.params,
        }
    }
}

/// A call's outputs, read back.
#[derive(Debug, Clone)]
struct Got {
    tokens: Vec<u32>,
    valid: Vec<u8>,
    lse: Vec<f32>,
    logprob: Vec<f32>,
}

/// Equal bit for bit (NaN log-probabilities of invalid rows included).
impl PartialEq for Got {
    fn eq(&self, o: &Got) -> bool {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        self.tokens == o.tokens
            && self.valid == o.valid
            && bits(&self.lse) == bits(&o.lse)
            && bits(&self.logprob) == bits(&o.logprob)
    }
}

/// Output buffers with every entry poisoned.
fn poisoned(stream: &Arc<CudaStream>, batch: usize) -> FusedOutput {
    let mut out = FusedOutput::new(stream, batch).unwrap();
    let s = stream;
    s.memcpy_htod(&vec![u32::MAX; batch], &mut out.tokens)
        .unwrap();
    s.memcpy_htod(&vec![7u8; batch], &mut out.valid).unwrap();
    s.memcpy_htod(&vec![f32::NAN; batch], &mut out.log_normalizer)
        .unwrap();
    s.memcpy_htod(&vec![-1.0e30f32; batch], &mut out.logprob)
        .unwrap();
    out
}

fn read(stream: &Arc<CudaStream>, out: &FusedOutput) -> Got {
    Got {
        tokens: stream.clone_dtoh(&out.tokens).unwrap(),
        valid: stream.clone_dtoh(&out.valid).unwrap(),
        lse: stream.clone_dtoh(&out.log_normalizer).unwrap(),
        logprob: stream.clone_dtoh(&out.logprob).unwrap(),
    }
}

fn unsharded<T: HeadElem>(
    dev: &Device,
    stream: &Arc<CudaStream>,
    head: &OnDevice<T>,
    ws: &mut Workspace,
) -> Got {
    let mut out = poisoned(stream, head.shape.batch);
    let v = head.views(0..head.shape.vocab);
    let i = head.input(&v);
    dev.fused_sample(
        stream, i.hidden, i.lm_head, i.bias, head.shape, i.params, &mut out, ws,
    )
    .unwrap();
    read(stream, &out)
}

/// `tp.sample` with rank `r`'s input from `heads[r % heads.len()]` (one
/// problem per device), all outputs read back.
fn sharded<T: HeadElem>(
    tp: &mut TpSampler<'_>,
    heads: &[&OnDevice<T>],
    streams: &[Arc<CudaStream>],
) -> Vec<Got> {
    let split = tp.split().clone();
    let ranks = tp.input_ranks();
    let views: Vec<_> = ranks
        .iter()
        .enumerate()
        .map(|(i, &r)| heads[i % heads.len()].views(split.range(r).unwrap()))
        .collect();
    let inputs: Vec<_> = views
        .iter()
        .enumerate()
        .map(|(i, v)| heads[i % heads.len()].input(v))
        .collect();
    let batch = heads[0].shape.batch;
    let mut outs: Vec<_> = streams.iter().map(|s| poisoned(s, batch)).collect();
    tp.sample(heads[0].shape, &inputs, &mut outs).unwrap();
    outs.iter().zip(streams).map(|(o, s)| read(s, o)).collect()
}

/// Largest |sharded - unsharded| log-normaliser and log-probability seen
/// on unaligned splits, as a fraction of the documented tolerance.
#[derive(Default)]
struct Drift {
    worst: f32,
    worst_abs: f32,
    values: usize,
}

/// Compares a sharded call's outputs under `split` with the unsharded
/// kernel's.
fn compare(
    want: &Got,
    got: &Got,
    split: &VocabSplit,
    what: &str,
    r: &mut Mismatches,
    d: &mut Drift,
) {
    let aligned = split.is_tile_aligned();
    for row in 0..want.tokens.len() {
        let (t, v) = (got.tokens[row], got.valid[row]);
        r.check(t == want.tokens[row] && v == want.valid[row], || {
            format!(
                "{what} row {row}: token {t} valid {v}, unsharded {} valid {}",
                want.tokens[row], want.valid[row]
            )
        });
        for (name, a, b) in [
            ("log-normaliser", got.lse[row], want.lse[row]),
            ("logprob", got.logprob[row], want.logprob[row]),
        ] {
            let same = a.to_bits() == b.to_bits();
            let ok = if aligned || !(a.is_finite() && b.is_finite()) {
                same
            } else {
                let diff = (a - b).abs();
                let tol = split.lse_tolerance(b);
                d.worst = d.worst.max(diff / tol);
                d.worst_abs = d.worst_abs.max(diff);
                d.values += 1;
                diff <= tol
            };
            r.check(ok, || {
                format!(
                    "{what} row {row}: {name} {a} ({:#010x}), unsharded {b} ({:#010x}){}",
                    a.to_bits(),
                    b.to_bits(),
                    if aligned {
                        " (aligned: must be equal)"
                    } else {
                        ""
                    }
                )
            });
        }
    }
}

/// The splits a problem is checked under for `n` shards: tile-aligned (when
/// there are enough tiles), even (`r V / N`) and random boundaries.
fn splits(rng: &mut StdRng, vocab: usize, n: usize) -> Vec<VocabSplit> {
    let mut out = Vec::new();
    if let Ok(s) = VocabSplit::tile_aligned(vocab, n) {
        out.push(s);
    }
    if let Ok(s) = VocabSplit::even(vocab, n)
        && !out.contains(&s)
    {
        out.push(s);
    }
    if n > 1 && vocab >= 2 * n {
        let mut cuts: Vec<usize> = Vec::new();
        while cuts.len() < n - 1 {
            let c = rng.random_range(1..vocab);
            if !cuts.contains(&c) {
                cuts.push(c);
            }
        }
        cuts.sort_unstable();
        let bounds = std::iter::once(0)
            .chain(cuts)
            .chain(std::iter::once(vocab))
            .collect();
        out.push(VocabSplit::from_bounds(bounds).unwrap());
    }
    out
}

/// A random shape: mostly small vocabularies (not multiples of any tile),
/// now and then a real one with a small hidden size; batches across the
/// three batch tiles and beyond.
fn random_shape(rng: &mut StdRng) -> (usize, usize, usize) {
    let batch = match rng.random_range(0..10) {
        0..4 => rng.random_range(1..=16),
        4..7 => rng.random_range(17..=64),
        _ => rng.random_range(65..=130),
    };
    let (vocab, dim) = match rng.random_range(0..40) {
        0 => (151_936, 8 * rng.random_range(1..=4)),
        1 => (32_000, 8 * rng.random_range(1..=8)),
        2 => (
            [1, 127, 128, 129, 255, 256, 257][rng.random_range(0..7)],
            64,
        ),
        _ => (rng.random_range(8..6000), 8 * rng.random_range(1..=40)),
    };
    (batch, vocab, dim)
}

/// The one-GPU checks' device, streams and findings.
struct OneGpu {
    dev: Device,
    stream: Arc<CudaStream>,
    /// The ranks' streams of the peer path on this GPU.
    peer_streams: Vec<Arc<CudaStream>>,
    ws: Workspace,
    report: Mismatches,
    drift: Drift,
    calls: usize,
    aligned: usize,
    peer: usize,
}

impl OneGpu {
    fn new(dev: Device, stream: Arc<CudaStream>) -> OneGpu {
        OneGpu {
            peer_streams: (0..8).map(|_| dev.new_stream().unwrap()).collect(),
            ws: Workspace::new(&stream).unwrap(),
            dev,
            stream,
            report: Mismatches::default(),
            drift: Drift::default(),
            calls: 0,
            aligned: 0,
            peer: 0,
        }
    }

    /// Uploads `problem` with operands converted by `to` and compares the
    /// unsharded kernel with the simulated shards of every split of `plan`,
    /// and with the peer-to-peer path (every rank on this GPU, so the
    /// "peer" writes are local) where the plan says so.
    fn check<T: HeadElem>(
        &mut self,
        problem: &Problem,
        to: fn(f32) -> T,
        plan: &[(VocabSplit, bool)],
        case: &str,
    ) {
        let (dev, stream) = (&self.dev, &self.stream);
        let head = problem.upload(stream, to);
        // Reads its outputs back, which synchronises `stream`: the uploads
        // are complete before the peer ranks' streams read them.
        let want = unsharded(dev, stream, &head, &mut self.ws);
        for (split, with_peer) in plan {
            let aligned = split.is_tile_aligned();
            let what = format!("{case} bounds {:?}", split.bounds());
            let mut tp = TpSampler::one_device(dev, stream, split.clone()).unwrap();
            let got = sharded(&mut tp, &[&head], std::slice::from_ref(stream));
            compare(
                &want,
                &got[0],
                split,
                &what,
                &mut self.report,
                &mut self.drift,
            );
            self.calls += 1;
            self.aligned += usize::from(aligned);
            if *with_peer {
                let streams = &self.peer_streams[..split.shards()];
                let ranks: Vec<_> = streams.iter().map(|s| (dev.clone(), s.clone())).collect();
                let mut tp = TpSampler::peer(&ranks, split.clone()).unwrap();
                for (r, got) in sharded(&mut tp, &[&head], streams).iter().enumerate() {
                    let what = format!("{what} peer rank {r}");
                    compare(&want, got, split, &what, &mut self.report, &mut self.drift);
                }
                self.peer += 1;
            }
        }
    }
}

/// On one GPU, N in {1, 2, 3, 4, 8} simulated shards (one stream each, one
/// buffer) under tile-aligned, even and random splits, and the
/// peer-to-peer path with every rank on this GPU, against the unsharded
/// kernel on every row of 1,000 random problems (one in ten with f16
/// operands).
#[test]
fn tp_one_gpu_matches_unsharded() {
    const TEST: &str = "tp_one_gpu_matches_unsharded";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut gpu = OneGpu::new(dev, stream);
    for case in 0..1000 {
        let (batch, vocab, dim) = random_shape(&mut rng);
        let problem = Problem::random(&mut rng, batch, vocab, dim);
        // The peer path once per problem, for N cycling through SHARDS.
        let peer_n = SHARDS[case % SHARDS.len()];
        let mut plan = Vec::new();
        for n in SHARDS.into_iter().filter(|&n| n <= vocab) {
            for (i, split) in splits(&mut rng, vocab, n).into_iter().enumerate() {
                plan.push((split, n == peer_n && i == 0));
            }
        }
        let what = format!("case {case} B={batch} V={vocab} d={dim}");
        if case % 10 == 9 {
            gpu.check(&problem, f16::from_f32, &plan, &format!("{what} f16"));
        } else {
            gpu.check(&problem, bf16::from_f32, &plan, &what);
        }
    }
    println!(
        "{} sharded calls ({} tile-aligned), {} peer-path calls; unaligned \
         log-normaliser/logprob drift: worst {:.3e} ({:.3} of the tolerance) over {} values",
        gpu.calls, gpu.aligned, gpu.peer, gpu.drift.worst_abs, gpu.drift.worst, gpu.drift.values
    );
    gpu.report
        .assert_none("sharded vs unsharded fused sampling");
}

/// Repeated calls reuse the buffers (and grow them for a larger batch)
/// without changing a bit; a captured CUDA graph of a one-GPU sharded call
/// (shard streams forked from and joined into the captured stream) replays
/// with the offsets written before each replay.
#[test]
fn tp_repeats_grows_and_replays_in_graphs() {
    const TEST: &str = "tp_repeats_grows_and_replays_in_graphs";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = common::rng(TEST);
    let mut ws = Workspace::new(&stream).unwrap();
    let split = VocabSplit::even(3001, 3).unwrap();
    let mut tp = TpSampler::one_device(&dev, &stream, split.clone()).unwrap();
    let streams = [stream.clone()];
    for batch in [5, 70, 5, 130] {
        let head = Problem::random(&mut rng, batch, 3001, 64).upload(&stream, bf16::from_f32);
        let want = unsharded(&dev, &stream, &head, &mut ws);
        let first = sharded(&mut tp, &[&head], &streams);
        let again = sharded(&mut tp, &[&head], &streams);
        assert_eq!(
            first, again,
            "B={batch}: a repeated call changed its outputs"
        );
        assert_eq!(first[0].tokens, want.tokens, "B={batch}: tokens");
    }

    let batch = 20;
    let problem = Problem {
        bias: None,
        ..Problem::random(&mut rng, batch, 3001, 64)
    };
    let mut head = problem.upload(&stream, bf16::from_f32);
    let out = RefCell::new(poisoned(&stream, batch));
    let mut params = std::mem::replace(
        &mut head.params,
        RowParams::upload(&stream, &[0.0], &[0], &[0]).unwrap(),
    );
    // Rows sampled at T = 1 so that the offsets matter.
    stream
        .memcpy_htod(&vec![1.0f32; batch], &mut params.temperature)
        .unwrap();
    let base = problem.offset.clone();
    common::check_graph_replays(
        &stream,
        &mut params,
        |p| &mut p.offset,
        &base,
        |p| {
            let views: Vec<_> = (0..3)
                .map(|r| head.views(split.range(r).unwrap()))
                .collect();
            let inputs: Vec<_> = views
                .iter()
                .map(|v| HeadInput {
                    hidden: &v.0,
                    lm_head: &v.1,
                    bias: v.2.as_ref(),
                    params: p,
                })
                .collect();
            tp.sample(
                head.shape,
                &inputs,
                std::slice::from_mut(&mut *out.borrow_mut()),
            )
            .unwrap();
        },
        || stream.clone_dtoh(&out.borrow().tokens).unwrap(),
        true,
    );
}

/// Wrong arguments are typed errors, reported before any launch.
#[test]
fn tp_rejects_bad_arguments() {
    const TEST: &str = "tp_rejects_bad_arguments";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(5);
    let head = Problem::random(&mut rng, 4, 1000, 16).upload(&stream, bf16::from_f32);
    let split = VocabSplit::even(1000, 2).unwrap();
    let mut tp = TpSampler::one_device(&dev, &stream, split.clone()).unwrap();
    // Shard streams: one short, and the sampler's own stream among them.
    let one = vec![dev.new_stream().unwrap()];
    assert!(matches!(
        TpSampler::one_device_on(&dev, &stream, one.clone(), split.clone()),
        Err(flashsample::Error::Shape { .. })
    ));
    assert!(
        TpSampler::one_device_on(
            &dev,
            &stream,
            vec![one[0].clone(), stream.clone()],
            split.clone()
        )
        .is_err()
    );
    let views: Vec<_> = (0..2)
        .map(|r| head.views(split.range(r).unwrap()))
        .collect();
    let inputs: Vec<_> = views.iter().map(|v| head.input(v)).collect();
    let mut outs = vec![poisoned(&stream, 4)];
    let err = |r: flashsample::Result<()>| r.expect_err("accepted bad arguments");
    // Vocabulary of another split; one input short; two outputs.
    assert!(matches!(
        err(tp.sample(HeadShape::new(4, 999, 16), &inputs, &mut outs)),
        flashsample::Error::Shape { .. }
    ));
    assert!(matches!(
        err(tp.sample(head.shape, &inputs[..1], &mut outs)),
        flashsample::Error::Shape { .. }
    ));
    let mut two = vec![poisoned(&stream, 4), poisoned(&stream, 4)];
    assert!(matches!(
        err(tp.sample(head.shape, &inputs, &mut two)),
        flashsample::Error::Shape { .. }
    ));
    // A shard's LM-head rows swapped for the other shard's (500 rows each:
    // still fine) and for too few rows.
    let short = head.weight.slice(..499 * 16);
    let bad = HeadInput {
        lm_head: &short,
        ..inputs[1]
    };
    assert!(matches!(
        err(tp.sample(head.shape, &[inputs[0], bad], &mut outs)),
        flashsample::Error::Shape {
            what: "lm_head",
            ..
        }
    ));
    // Outputs too short for the batch.
    let mut small = vec![poisoned(&stream, 3)];
    assert!(matches!(
        err(tp.sample(head.shape, &inputs, &mut small)),
        flashsample::Error::Shape { .. }
    ));
    // Peer group of the wrong size.
    let ranks = vec![(dev.clone(), stream.clone())];
    assert!(TpSampler::peer(&ranks, split).is_err());
    // Nothing was launched: the poisoned output is untouched.
    let got = read(&stream, &outs[0]);
    assert!(got.tokens.iter().all(|&t| t == u32::MAX), "{got:?}");
}

/// The GPUs of this machine (at least two) with a stream each, or `None`
/// after a visible skip line naming the reason.
fn gpus(test: &str) -> Option<Vec<(Device, Arc<CudaStream>)>> {
    common::gpu(test)?;
    let count = CudaContext::device_count().unwrap_or(0) as usize;
    if count < 2 {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: needs 2 GPUs, found {count}"
        );
        return None;
    }
    Some(
        (0..count.min(8))
            .map(|i| {
                let d = Device::new(i).unwrap();
                let s = d.new_stream().unwrap();
                (d, s)
            })
            .collect(),
    )
}

/// Checks a multi-GPU group's outputs: every rank equal to rank 0, bit for
/// bit, and rank 0 against the unsharded kernel on GPU 0.
fn check_ranks(want: &Got, outs: &[Got], split: &VocabSplit, what: &str, r: &mut Mismatches) {
    for (rank, got) in outs.iter().enumerate() {
        r.check(got == &outs[0], || {
            format!("{what}: rank {rank}'s outputs differ from rank 0's")
        });
    }
    compare(want, &outs[0], split, what, r, &mut Drift::default());
}

/// Random problems over 2 .. min(GPUs, 8) ranks.
fn multi_gpu_cases(
    test: &str,
    ranks: &[(Device, Arc<CudaStream>)],
    mut run: impl FnMut(&[(Device, Arc<CudaStream>)], VocabSplit, &[&OnDevice<bf16>]) -> Vec<Got>,
) {
    let mut rng = common::rng(test);
    let (dev0, s0) = &ranks[0];
    let mut ws = Workspace::new(s0).unwrap();
    let mut report = Mismatches::default();
    for case in 0..200 {
        let n = 2 + case % (ranks.len() - 1);
        let (batch, vocab, dim) = random_shape(&mut rng);
        if vocab < n {
            continue;
        }
        let problem = Problem::random(&mut rng, batch, vocab, dim);
        let heads: Vec<_> = ranks[..n]
            .iter()
            .map(|(_, s)| problem.upload(s, bf16::from_f32))
            .collect();
        let want = unsharded(dev0, s0, &heads[0], &mut ws);
        let refs: Vec<&OnDevice<bf16>> = heads.iter().collect();
        for split in splits(&mut rng, vocab, n) {
            let what = format!("case {case} B={batch} V={vocab} d={dim} N={n} {split:?}");
            let outs = run(&ranks[..n], split.clone(), &refs);
            check_ranks(&want, &outs, &split, &what, &mut report);
        }
    }
    report.assert_none(test);
}

/// Peer-to-peer writes between GPUs (one rank per GPU, 2 to 8 ranks).
#[test]
fn tp_peer_multi_gpu_matches_unsharded() {
    const TEST: &str = "tp_peer_multi_gpu_matches_unsharded";
    let Some(ranks) = gpus(TEST) else {
        return;
    };
    if let Err(e) = TpSampler::peer(&ranks, VocabSplit::even(4096, ranks.len()).unwrap()) {
        let _ = writeln!(std::io::stderr(), "SKIPPED {TEST}: {e}");
        return;
    }
    multi_gpu_cases(TEST, &ranks, |ranks, split, heads| {
        let streams: Vec<_> = ranks.iter().map(|(_, s)| s.clone()).collect();
        let mut tp = TpSampler::peer(ranks, split).unwrap();
        sharded(&mut tp, heads, &streams)
    });
}

/// NCCL between GPUs: one process, one communicator per GPU
/// (`Comm::from_devices`), all driven by one [`TpSampler`].
#[test]
fn tp_nccl_multi_gpu_matches_unsharded() {
    const TEST: &str = "tp_nccl_multi_gpu_matches_unsharded";
    let Some(ranks) = gpus(TEST) else {
        return;
    };
    if !flashsample::nccl_present() {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {TEST}: no NCCL library (cudarc opens libnccl.so; see nccl_present)"
        );
        return;
    }
    // One set of communicators per group size (creating one is slow).
    let mut comms: Vec<Vec<cudarc::nccl::Comm>> = Vec::new();
    for n in 2..=ranks.len() {
        let streams = ranks[..n].iter().map(|(_, s)| s.clone()).collect();
        comms.push(cudarc::nccl::Comm::from_devices(streams).unwrap());
    }
    multi_gpu_cases(TEST, &ranks, |ranks, split, heads| {
        let streams: Vec<_> = ranks.iter().map(|(_, s)| s.clone()).collect();
        let refs: Vec<_> = comms[ranks.len() - 2].iter().collect();
        let mut tp = TpSampler::nccl(&refs, split).unwrap();
        sharded(&mut tp, heads, &streams)
    });
}

/// Tiny sharded calls over every path and kernel variant (one-GPU shards
/// and the peer path on one GPU; bf16 and f16; batch tiles of 16, 32, 64
/// rows and two tiles; aligned and unaligned splits; bias), checked against
/// the unsharded kernel; run under compute-sanitizer by the bundle.
#[test]
fn sanitize_tp_paths() {
    const TEST: &str = "sanitize_tp_paths";
    let Some((dev, stream)) = common::gpu(TEST) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(17);
    let mut gpu = OneGpu::new(dev, stream);
    let mut coverage = Coverage::default();
    // (batch, vocab, dim, f16, shards, tile-aligned)
    for (batch, vocab, dim, half16, n, aligned) in [
        (1, 300, 16, false, 2, true),
        (3, 300, 8, false, 3, false),
        (17, 257, 24, false, 2, false),
        (65, 400, 16, false, 3, true),
        (9, 200, 16, true, 2, false),
        (40, 515, 8, true, 3, true),
    ] {
        let problem = Problem::random(&mut rng, batch, vocab, dim);
        let split = if aligned {
            VocabSplit::tile_aligned(vocab, n)
        } else {
            VocabSplit::even(vocab, n)
        }
        .unwrap();
        let what = format!("B={batch} V={vocab} d={dim} f16={half16}");
        let plan = [(split, true)];
        let kernel = if half16 {
            gpu.check(&problem, f16::from_f32, &plan, &what);
            common::fused_tile_kernel::<f16>(&gpu.dev, batch)
        } else {
            gpu.check(&problem, bf16::from_f32, &plan, &what);
            common::fused_tile_kernel::<bf16>(&gpu.dev, batch)
        };
        coverage.case(&[&kernel, "fused_sample_finish"]);
    }
    gpu.report.assert_none("sanitize: tensor-parallel paths");
    coverage.report(TEST);
}
