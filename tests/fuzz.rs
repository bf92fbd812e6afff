//! Host-argument fuzzing on the CPU: every public entry point that runs
//! without a GPU gets 10,000 random argument sets (shapes, strides, buffer
//! lengths, dtypes' special values, temperatures, k, p, min-p), and must
//! return a value or a typed error, never panic; and the validation layer
//! the GPU launches run first must only accept shapes the buffers can hold.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use flashsample::kernels::params::FUSED_BLOCK_V;
use flashsample::kernels::radix_select::SLAB;
use flashsample::kernels::sample::MAX_VOCAB;
use flashsample::reference::{self, SamplingParams};
use flashsample::{
    Backend, HeadShape, MAX_CLUSTER, MAX_FILTER_CLUSTER, MAX_SHARDS, RadixCaps, Route, Rows,
    VocabSplit, plan_route,
};
use rand::Rng;
use rand::rngs::StdRng;

const CASES: usize = 10_000;

/// Runs `f` on `CASES` random inputs; fails on the first panic, naming the
/// input. `f` says whether the call was accepted; both outcomes must occur
/// often enough for the fuzzing to mean something.
fn fuzz<I: std::fmt::Debug>(
    name: &str,
    mut generate: impl FnMut(&mut StdRng) -> I,
    mut f: impl FnMut(&I) -> bool,
) {
    let mut rng = common::rng(name);
    let mut accepted = 0;
    for case in 0..CASES {
        let input = generate(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| f(&input))) {
            Ok(ok) => accepted += usize::from(ok),
            Err(_) => panic!("{name}: case {case} panicked on {input:?}"),
        }
    }
    println!("{name}: {CASES} cases, {accepted} accepted, no panic");
    assert!(
        (CASES / 20..=CASES - CASES / 20).contains(&accepted),
        "{name}: {accepted} of {CASES} accepted"
    );
}

/// [`fuzz`] for an entry point that never rejects (a total function such
/// as a planner): `f` says which of `outcomes` the call gave, and every one
/// must occur in at least 1 % of the cases, so that the fuzzing reaches
/// each branch.
fn fuzz_total<I: std::fmt::Debug, const N: usize>(
    name: &str,
    outcomes: [&str; N],
    mut generate: impl FnMut(&mut StdRng) -> I,
    mut f: impl FnMut(&I) -> usize,
) {
    let mut rng = common::rng(name);
    let mut seen = [0usize; N];
    for case in 0..CASES {
        let input = generate(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| f(&input))) {
            Ok(outcome) => seen[outcome] += 1,
            Err(_) => panic!("{name}: case {case} panicked on {input:?}"),
        }
    }
    let counts: Vec<String> = outcomes
        .iter()
        .zip(&seen)
        .map(|(o, n)| format!("{n} {o}"))
        .collect();
    println!("{name}: {CASES} cases, {}, no panic", counts.join(", "));
    for (o, &n) in outcomes.iter().zip(&seen) {
        assert!(n >= CASES / 100, "{name}: only {n} of {CASES} gave {o}");
    }
}

/// A size: mostly small, sometimes 0, huge or at the edge of the types.
fn size(rng: &mut StdRng) -> usize {
    match rng.random_range(0..10) {
        0 => 0,
        1 => usize::MAX - rng.random_range(0..3),
        2 => 1 << rng.random_range(20..40),
        3 => u32::MAX as usize + rng.random_range(0..3),
        _ => rng.random_range(1..300),
    }
}

fn float(rng: &mut StdRng) -> f32 {
    match rng.random_range(0..12) {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        3 => 0.0,
        4 => -0.0,
        5 => f32::MIN_POSITIVE / 4.0,
        6 => f32::MAX,
        7 => -rng.random_range(0.0f32..2.0),
        _ => rng.random_range(0.0f32..3.0),
    }
}

fn params(rng: &mut StdRng) -> SamplingParams {
    SamplingParams {
        temperature: float(rng),
        top_k: match rng.random_range(0..4) {
            0 => 0,
            1 => u32::MAX,
            _ => rng.random_range(1..400),
        },
        top_p: float(rng),
        min_p: float(rng),
        seed: rng.random(),
        offset: rng.random(),
    }
}

fn logits(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            if rng.random_bool(0.1) {
                float(rng)
            } else {
                rng.random_range(-10.0f32..10.0)
            }
        })
        .collect()
}

#[test]
fn rows_validation_accepts_only_shapes_the_buffer_holds() {
    fuzz(
        "Rows::validate",
        |rng| {
            if rng.random_bool(0.5) {
                // Plausible: a buffer of about the size the shape needs.
                let (batch, vocab) = (rng.random_range(0..40), rng.random_range(0..5000));
                let rows = Rows {
                    batch,
                    vocab,
                    row_stride: vocab + rng.random_range(0..3),
                };
                let len = (rows.min_len() as i64 + rng.random_range(-2..3)).max(0) as usize;
                (rows, len)
            } else {
                (
                    Rows {
                        batch: size(rng),
                        vocab: size(rng),
                        row_stride: size(rng),
                    },
                    size(rng),
                )
            }
        },
        |(rows, len)| {
            let ok = rows.validate("logits", *len).is_ok();
            if ok {
                assert!(
                    rows.batch > 0
                        && rows.vocab > 0
                        && rows.vocab as u64 <= flashsample::kernels::sample::MAX_VOCAB
                );
                assert!(rows.row_stride >= rows.vocab);
                let need = (rows.batch - 1) as u128 * rows.row_stride as u128 + rows.vocab as u128;
                assert!(need <= *len as u128, "accepted {rows:?} for {len} elements");
            }
            ok
        },
    );
}

#[test]
fn head_shape_validation_accepts_only_shapes_the_buffers_hold() {
    fuzz(
        "HeadShape::validate",
        |rng| {
            if rng.random_bool(0.5) {
                // Plausible: buffers of about the sizes the shape needs.
                let (batch, vocab) = (rng.random_range(0..40), rng.random_range(0..5000));
                let dim = [8, 16, 64, 4096, 12, 0][rng.random_range(0..6)];
                let stride = dim + [0, 8, 4][rng.random_range(0..3)];
                let s = HeadShape {
                    batch,
                    vocab,
                    dim,
                    hidden_stride: stride,
                };
                let jitter = |rng: &mut StdRng, n: usize| {
                    (n as i64 + rng.random_range(-1..2)).max(0) as usize
                };
                let h = jitter(rng, batch.saturating_sub(1) * stride + dim);
                let w = jitter(rng, vocab * dim);
                let b = rng.random_bool(0.5).then(|| jitter(rng, vocab));
                (s, h, w, b)
            } else {
                let shape = HeadShape {
                    batch: size(rng),
                    vocab: size(rng),
                    dim: if rng.random_bool(0.5) {
                        8 * rng.random_range(0..40)
                    } else {
                        size(rng)
                    },
                    hidden_stride: size(rng),
                };
                let bias = rng.random_bool(0.5).then(|| size(rng));
                (shape, size(rng), size(rng), bias)
            }
        },
        |(s, h, w, b)| {
            let ok = s.validate(*h, *w, *b).is_ok();
            if ok {
                assert!(
                    s.batch > 0
                        && s.vocab > 0
                        && s.dim > 0
                        && s.dim % 8 == 0
                        && s.hidden_stride % 8 == 0
                );
                let need_h = (s.batch - 1) as u128 * s.hidden_stride as u128 + s.dim as u128;
                assert!(need_h <= *h as u128 && (s.vocab as u128 * s.dim as u128) <= *w as u128);
                assert!(b.is_none_or(|b| b >= s.vocab));
            }
            ok
        },
    );
}

#[test]
fn cpu_backend_never_panics() {
    let mut cpu = Backend::Cpu;
    fuzz(
        "Backend::Cpu::sample_from_logits",
        |rng| {
            let vocab = if rng.random_bool(0.9) {
                rng.random_range(1..200)
            } else {
                size(rng)
            };
            let batch = rng.random_range(0..5);
            let n = if rng.random_bool(0.8) {
                batch * vocab.min(200)
            } else {
                rng.random_range(0..500)
            };
            let m = |rng: &mut StdRng| {
                if rng.random_bool(0.9) {
                    batch
                } else {
                    rng.random_range(0..6)
                }
            };
            let (nt, ns, no) = (m(rng), m(rng), m(rng));
            (
                logits(rng, n),
                vocab,
                (0..nt).map(|_| float(rng)).collect::<Vec<_>>(),
                vec![7u64; ns],
                vec![1u64; no],
            )
        },
        |(l, vocab, t, s, o)| match cpu.sample_from_logits(l, *vocab, t, s, o) {
            Ok(tokens) => {
                assert_eq!(tokens.len(), t.len());
                assert!(tokens.iter().flatten().all(|&tok| (tok as usize) < *vocab));
                true
            }
            Err(_) => false,
        },
    );
}

#[test]
fn reference_batch_entry_points_never_panic() {
    fuzz(
        "reference batch entry points",
        |rng| {
            let vocab = if rng.random_bool(0.95) {
                rng.random_range(1..120)
            } else {
                size(rng)
            };
            let batch = rng.random_range(0..4);
            let n = if rng.random_bool(0.8) {
                batch * vocab.min(120)
            } else {
                rng.random_range(0..300)
            };
            let np = if rng.random_bool(0.9) {
                batch
            } else {
                rng.random_range(0..5)
            };
            (
                logits(rng, n),
                vocab,
                (0..np).map(|_| params(rng)).collect::<Vec<_>>(),
            )
        },
        |(l, vocab, p)| {
            let sets = reference::kept_sets(l, *vocab, p);
            let ok = sets.is_ok();
            if let Ok(sets) = sets {
                for (set, q) in sets.iter().zip(p) {
                    assert!(set.iter().all(|&j| (j as usize) < *vocab));
                    if q.top_k > 0 && (q.top_k as usize) < *vocab {
                        assert!(
                            set.len() <= q.top_k as usize,
                            "top-k {} kept {}",
                            q.top_k,
                            set.len()
                        );
                    }
                }
            }
            let _ = reference::masked_logits_batch(l, *vocab, p);
            if let Ok(probs) = reference::probabilities_batch(l, *vocab, p) {
                assert!(probs.iter().all(|&x| (0.0..=1.0 + 1e-12).contains(&x)));
            }
            if let Ok(tokens) = reference::sample_top_k_top_p_batch(l, *vocab, p) {
                assert!(tokens.iter().flatten().all(|&t| (t as usize) < *vocab));
            }
            let t: Vec<f32> = p.iter().map(|q| q.temperature).collect();
            let _ = reference::softmax_batch(l, *vocab, &t);
            let seeds: Vec<u64> = p.iter().map(|q| q.seed).collect();
            let offsets: Vec<u64> = p.iter().map(|q| q.offset).collect();
            let _ = reference::sample_gumbel_batch(l, *vocab, &t, &seeds, &offsets);
            ok
        },
    );
}

#[test]
fn reference_lm_head_never_panics() {
    fuzz(
        "reference::lm_head_logits / fused_tokens_agree",
        |rng| {
            let dim = rng.random_range(0..20);
            let wlen = if rng.random_bool(0.8) {
                dim * rng.random_range(0..30)
            } else {
                rng.random_range(0..100)
            };
            let nb = rng.random_range(0..40);
            let bias = rng.random_bool(0.3).then(|| logits(rng, nb));
            let tok = rng.random_bool(0.8).then(|| rng.random_range(0..50u32));
            (logits(rng, dim), logits(rng, wlen), bias, float(rng), tok)
        },
        |(h, w, b, t, tok)| match reference::lm_head_logits(h, w, b.as_deref()) {
            Ok(head) => {
                assert_eq!(head.logits.len(), head.error_bound.len());
                let _ = reference::fused_tokens_agree(&head, *t, 1, 2, *tok);
                true
            }
            Err(_) => false,
        },
    );
}

#[test]
fn arch_choice_never_panics() {
    fuzz(
        "arch_for",
        |rng| (rng.random::<i32>() % 20, rng.random::<i32>()),
        |(major, minor)| match flashsample::arch_for(*major, *minor) {
            Ok(a) => {
                assert!(flashsample::ptx::MODULES.iter().any(|(m, _)| *m == a));
                true
            }
            Err(_) => false,
        },
    );
}

/// A probability row: mostly plausible probabilities, with ties, zeros and
/// the special values (NaN, +-inf, negatives, subnormals) mixed in;
/// sometimes empty.
fn probs(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut row: Vec<f32> = Vec::with_capacity(n);
    for _ in 0..n {
        let x = match rng.random_range(0..10) {
            0 => float(rng),
            1 => 0.0,
            2 if !row.is_empty() => row[rng.random_range(0..row.len())],
            _ => rng.random_range(0.0f32..1.0),
        };
        row.push(x);
    }
    row
}

fn top_k(rng: &mut StdRng) -> u32 {
    match rng.random_range(0..10) {
        0 => 0,
        1 => 1,
        2 => u32::MAX,
        3 => SLAB + rng.random_range(0..2),
        _ => rng.random_range(1..40),
    }
}

fn top_p(rng: &mut StdRng) -> f32 {
    match rng.random_range(0..12) {
        0 => f32::NAN,
        1 => 0.0,
        2 => -rng.random_range(0.0f32..1.0),
        3 => 1.0 + rng.random_range(1e-6f32..2.0),
        4 => 1e-7,
        5 | 6 => 1.0,
        7 => float(rng),
        _ => rng.random_range(0.01f32..1.0),
    }
}

/// A GPU token to check against the reference: in range, just past the
/// row, far past it, or invalid.
fn gpu_token(rng: &mut StdRng, len: usize) -> Option<u32> {
    match rng.random_range(0..4) {
        0 => None,
        1 => Some(u32::MAX),
        _ => Some(rng.random_range(0..len as u32 + 2)),
    }
}

#[test]
fn radix_top_k_never_panics() {
    // The route planner is total: it never rejects, so its fuzzing asks
    // for every route instead of both outcomes.
    fuzz_total(
        "plan_route",
        [
            "Pivot",
            "SingleCta",
            "Cluster",
            "Cooperative",
            "Filter",
            "FilterCluster",
        ],
        |rng| {
            let (batch, vocab) = if rng.random_bool(0.7) {
                (
                    [1, 2, 4, rng.random_range(1..600)][rng.random_range(0..4)],
                    [3000, 32_768, 128_256, 151_936, rng.random_range(1..300_000)]
                        [rng.random_range(0..5)],
                )
            } else {
                (size(rng), size(rng))
            };
            let rows = Rows {
                batch,
                vocab,
                row_stride: if rng.random_bool(0.8) {
                    vocab
                } else {
                    size(rng)
                },
            };
            let max_k = match rng.random_range(0..8) {
                0 => 0,
                1 => SLAB,
                2 => SLAB + 1,
                3 => u32::MAX,
                _ => rng.random_range(1..200),
            };
            let pick = |choices: &[u32], rng: &mut StdRng| {
                if rng.random_bool(0.2) {
                    rng.random()
                } else {
                    choices[rng.random_range(0..choices.len())]
                }
            };
            let caps = RadixCaps {
                sm_count: pick(&[0, 1, 108, 132, u32::MAX], rng),
                max_cluster: pick(&[0, 0, 1, 2, 8, 8, 16, u32::MAX], rng),
                ctas_per_sm: pick(&[0, 1, 1, 2, 4, u32::MAX], rng),
                cache_elems: pick(&[0, 1, 49_792, u32::MAX], rng),
                cluster_slots: std::array::from_fn(|_| pick(&[0, 1, 16, 132, u32::MAX], rng)),
                filter_ctas_per_sm: pick(&[0, 0, 1, 2, u32::MAX], rng),
                filter_cluster_slots: std::array::from_fn(|_| {
                    pick(&[0, 0, 1, 7, 66, u32::MAX], rng)
                }),
            };
            (rows, max_k, caps)
        },
        |(rows, max_k, caps)| {
            let route = plan_route(rows, *max_k, caps);
            assert_eq!(route, plan_route(rows, *max_k, caps));
            // The pivot path exactly above SLAB.
            assert_eq!(route == Route::Pivot, *max_k > SLAB, "{route:?}");
            // Split routes: 2 to MAX_CLUSTER CTAs per row of at least 2048
            // elements each; clusters only where the GPU has them (and no
            // larger than it schedules), cooperative CTAs all resident.
            let split = |ctas: u32| {
                assert!((2..=MAX_CLUSTER).contains(&ctas), "{route:?}");
                assert!(u64::from(ctas) * 2048 <= rows.vocab as u64, "{route:?}");
            };
            match route {
                Route::Pivot => 0,
                Route::SingleCta => 1,
                // Only where the GPU runs the filter kernel.
                Route::Filter => {
                    assert!(caps.filter_ctas_per_sm > 0 && caps.sm_count > 0);
                    4
                }
                // Only where the GPU runs clusters of that many filter
                // CTAs, each with at least 2048 elements.
                Route::FilterCluster { ctas } => {
                    assert!((2..=MAX_FILTER_CLUSTER).contains(&ctas), "{route:?}");
                    assert!(u64::from(ctas) * 2048 <= rows.vocab as u64, "{route:?}");
                    assert!(caps.filter_cluster_slots[ctas as usize] > 0);
                    5
                }
                Route::Cluster { ctas } => {
                    split(ctas);
                    assert!(caps.max_cluster >= 2 && ctas <= caps.max_cluster);
                    2
                }
                Route::Cooperative { ctas } => {
                    split(ctas);
                    assert!(caps.max_cluster < 2);
                    let slots = u128::from(caps.sm_count) * u128::from(caps.ctas_per_sm);
                    assert!(rows.batch as u128 * u128::from(ctas) <= slots, "{route:?}");
                    3
                }
            }
        },
    );

    fuzz(
        "reference probability samplers (one row)",
        |rng| {
            let n = match rng.random_range(0..20) {
                0 => 0,
                1 => rng.random_range(1..1200),
                _ => rng.random_range(1..40),
            };
            (
                probs(rng, n),
                top_k(rng),
                top_p(rng),
                rng.random::<u64>(),
                rng.random::<u64>(),
                gpu_token(rng, n),
            )
        },
        |(row, k, p, seed, offset, gpu)| {
            for &x in row {
                let w = reference::prob_weight(x);
                if x > 0.0 && x.is_finite() {
                    assert_eq!(w, f64::from(x));
                } else {
                    assert_eq!(w, 0.0, "weight of {x}");
                }
            }
            // The total order: weight descending, ties by lower index.
            let before = |a: u32, b: u32| {
                let (wa, wb) = (
                    reference::prob_weight(row[a as usize]),
                    reference::prob_weight(row[b as usize]),
                );
                wa > wb || (wa == wb && a < b)
            };
            let top = reference::probs_top_k(row, *k);
            assert_eq!(top.is_ok(), *k > 0 && !row.is_empty(), "{top:?}");
            if let Ok(top) = &top {
                assert_eq!(top.len(), (*k as usize).min(row.len()));
                assert!(top.windows(2).all(|w| before(w[0], w[1])));
                // The first of the total order: nothing left out precedes
                // the last kept.
                let mut taken = vec![false; row.len()];
                for &j in top {
                    taken[j as usize] = true;
                }
                let last = *top.last().unwrap();
                assert!((0..row.len() as u32).all(|j| taken[j as usize] || before(last, j)));
            }
            let kept = reference::probs_kept_set(row, *k, *p);
            let drawn = reference::sample_probs_top_k_top_p(row, *k, *p, *seed, *offset);
            let near = reference::probs_top_p_near_boundary(row, *k, *p);
            assert_eq!(drawn.is_ok(), kept.is_ok());
            assert_eq!(near.is_ok(), kept.is_ok());
            // Whatever the GPU says, the check answers without panicking.
            let _ = reference::probs_draw_agrees(row, *k, *p, *seed, *offset, *gpu);
            let Ok(kept) = kept else {
                assert!(reference::probs_draw_agrees(row, *k, *p, *seed, *offset, None).is_err());
                return false;
            };
            let top = top.expect("a kept set of a rejected top-k");
            let mass: f64 = top
                .iter()
                .map(|&j| reference::prob_weight(row[j as usize]))
                .sum();
            // A prefix of the top-k: empty exactly when the top-k has no
            // mass, else the first entry always, the whole top-k at top-p 1.
            assert_eq!(kept[..], top[..kept.len()]);
            assert_eq!(kept.is_empty(), mass == 0.0, "{kept:?} of mass {mass}");
            if *p == 1.0 && mass > 0.0 {
                assert_eq!(kept.len(), top.len());
            }
            let drawn = drawn.unwrap();
            match drawn {
                None => assert!(kept.is_empty()),
                Some(t) => {
                    assert!(kept.contains(&t), "drew {t} outside {kept:?}");
                    assert!(reference::prob_weight(row[t as usize]) > 0.0);
                }
            }
            // The reference's own draw always agrees with itself.
            reference::probs_draw_agrees(row, *k, *p, *seed, *offset, drawn).unwrap();
            if let Some(g) = gpu
                && !top.contains(g)
            {
                assert!(
                    reference::probs_draw_agrees(row, *k, *p, *seed, *offset, Some(*g)).is_err()
                );
            }
            true
        },
    );

    fuzz(
        "reference::sample_probs_top_k_top_p_batch",
        |rng| {
            let vocab = if rng.random_bool(0.9) {
                rng.random_range(1..30)
            } else {
                size(rng)
            };
            let batch = rng.random_range(0..4);
            let n = if rng.random_bool(0.85) {
                batch * vocab.min(30)
            } else {
                rng.random_range(0..100)
            };
            let m = |rng: &mut StdRng| {
                if rng.random_bool(0.95) {
                    batch
                } else {
                    rng.random_range(0..5)
                }
            };
            let (nk, np, ns, no) = (m(rng), m(rng), m(rng), m(rng));
            let sane_k = |rng: &mut StdRng| {
                if rng.random_bool(0.9) {
                    rng.random_range(1..40)
                } else {
                    top_k(rng)
                }
            };
            let sane_p = |rng: &mut StdRng| {
                if rng.random_bool(0.85) {
                    rng.random_range(0.01f32..=1.0)
                } else {
                    top_p(rng)
                }
            };
            (
                probs(rng, n),
                vocab,
                (0..nk).map(|_| sane_k(rng)).collect::<Vec<_>>(),
                (0..np).map(|_| sane_p(rng)).collect::<Vec<_>>(),
                (0..ns).map(|_| rng.random()).collect::<Vec<u64>>(),
                (0..no).map(|_| rng.random()).collect::<Vec<u64>>(),
            )
        },
        |(probs, vocab, k, p, seed, offset)| {
            match reference::sample_probs_top_k_top_p_batch(probs, *vocab, k, p, seed, offset) {
                Ok(tokens) => {
                    // One entry per row, each the row's own draw.
                    assert_eq!(tokens.len(), k.len());
                    assert_eq!(probs.len(), k.len() * vocab);
                    for (r, t) in tokens.iter().enumerate() {
                        let row = &probs[r * vocab..(r + 1) * vocab];
                        let want = reference::sample_probs_top_k_top_p(
                            row, k[r], p[r], seed[r], offset[r],
                        );
                        assert_eq!(Ok(*t), want);
                    }
                    true
                }
                Err(_) => false,
            }
        },
    );
}

/// A shard count: 0, 1, the limit and just past it, a few, or any size.
fn shards(rng: &mut StdRng) -> usize {
    match rng.random_range(0..10) {
        0 => 0,
        1 => 1,
        2 => MAX_SHARDS,
        3 => MAX_SHARDS + 1,
        4 => size(rng),
        _ => rng.random_range(2..17),
    }
}

/// A vocabulary size: real ones, the limits, or any size.
fn vocab(rng: &mut StdRng) -> usize {
    match rng.random_range(0..10) {
        0 | 1 => size(rng),
        2 => MAX_VOCAB as usize + rng.random_range(0..2),
        3 => [151_936, 128_256, 32_000][rng.random_range(0..3)],
        4 => rng.random_range(0..4) * FUSED_BLOCK_V as usize,
        _ => rng.random_range(0..300_000),
    }
}

#[derive(Debug)]
enum SplitCall {
    Even(usize, usize),
    TileAligned(usize, usize),
    FromBounds(Vec<usize>),
}

#[test]
fn vocab_split_never_panics() {
    fuzz(
        "VocabSplit",
        |rng| {
            let call = match rng.random_range(0..3) {
                0 => SplitCall::Even(vocab(rng), shards(rng)),
                1 => SplitCall::TileAligned(vocab(rng), shards(rng)),
                _ => {
                    // Mostly increasing bounds from 0 (on the tile grid or
                    // not), then broken: unsorted, duplicated, out of
                    // range, a nonzero start, too many, too few.
                    let n = match rng.random_range(0..10) {
                        0 => rng.random_range(0..2),
                        1 => MAX_SHARDS + rng.random_range(0..3),
                        _ => rng.random_range(2..12),
                    };
                    let step = if rng.random_bool(0.3) {
                        FUSED_BLOCK_V as usize
                    } else {
                        1
                    };
                    let mut b = 0;
                    let mut bounds: Vec<usize> = (0..n)
                        .map(|i| {
                            if i > 0 {
                                b += step * rng.random_range(1..20_000);
                            }
                            b
                        })
                        .collect();
                    if !bounds.is_empty() {
                        let i = rng.random_range(0..bounds.len());
                        let j = rng.random_range(0..bounds.len());
                        match rng.random_range(0..12) {
                            0 => bounds.swap(i, j),
                            1 => bounds[i] = bounds[j],
                            2 => bounds[i] = usize::MAX - rng.random_range(0..2),
                            3 => bounds[i] = MAX_VOCAB as usize + rng.random_range(0..2),
                            4 => bounds[0] = rng.random_range(1..10),
                            5 => bounds.insert(i, bounds[i]),
                            _ => {}
                        }
                    }
                    SplitCall::FromBounds(bounds)
                }
            };
            (call, float(rng))
        },
        |(call, x)| {
            let split = match call {
                SplitCall::Even(v, n) => VocabSplit::even(*v, *n),
                SplitCall::TileAligned(v, n) => VocabSplit::tile_aligned(*v, *n),
                SplitCall::FromBounds(b) => VocabSplit::from_bounds(b.clone()),
            };
            let Ok(split) = split else { return false };
            let bounds = split.bounds();
            let n = split.shards();
            let block = FUSED_BLOCK_V as usize;
            // 0, then 1 to MAX_SHARDS strictly increasing ends (every shard
            // holds a token), the vocabulary last.
            assert_eq!(bounds.len(), n + 1);
            assert!((1..=MAX_SHARDS).contains(&n));
            assert_eq!(bounds[0], 0);
            assert_eq!(bounds[n], split.vocab());
            assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
            assert!(split.vocab() as u64 <= MAX_VOCAB);
            for r in 0..n {
                assert_eq!(split.range(r), Some(bounds[r]..bounds[r + 1]));
            }
            assert_eq!(split.range(n), None);
            assert_eq!(split.range(usize::MAX), None);
            let aligned = bounds[1..n].iter().all(|b| b % block == 0);
            assert_eq!(split.is_tile_aligned(), aligned);
            match call {
                SplitCall::Even(v, s) => {
                    assert_eq!((split.vocab(), n), (*v, *s));
                    for (r, &b) in bounds.iter().enumerate() {
                        assert_eq!(b as u128, r as u128 * *v as u128 / *s as u128);
                    }
                }
                SplitCall::TileAligned(v, s) => {
                    assert_eq!((split.vocab(), n), (*v, *s));
                    assert!(split.is_tile_aligned());
                    // At least one tile per shard, spread as evenly as
                    // possible.
                    let tiles: Vec<usize> = bounds
                        .windows(2)
                        .map(|w| w[1].div_ceil(block) - w[0] / block)
                        .collect();
                    let (lo, hi) = (tiles.iter().min().unwrap(), tiles.iter().max().unwrap());
                    assert!(*lo >= 1 && hi - lo <= 1, "{tiles:?}");
                }
                SplitCall::FromBounds(b) => assert_eq!(bounds, &b[..]),
            }
            // The tolerance: 0 when aligned, else (2 D + 1) 2^-21 +
            // 2^-20 |x| with D = 47 + ceil(parts / 256), parts the tiles
            // plus one per boundary inside a tile.
            let tol = split.lse_tolerance(*x);
            if aligned {
                assert_eq!(tol, 0.0);
            } else if x.is_finite() {
                let inside = bounds[1..n].iter().filter(|b| *b % block != 0).count();
                let parts = split.vocab().div_ceil(block) + inside;
                let depth = 47 + parts.div_ceil(256);
                let want = (2 * depth + 1) as f64 / 2_097_152.0 + f64::from(x.abs()) / 1_048_576.0;
                assert!(tol > 0.0 && (f64::from(tol) - want).abs() <= want * 1e-6);
            } else {
                assert!(tol.is_nan() || tol == f32::INFINITY, "{tol} for {x}");
            }
            true
        },
    );
}
