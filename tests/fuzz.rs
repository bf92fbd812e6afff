//! Host-argument fuzzing on the CPU: every public entry point that runs
//! without a GPU gets 10,000 random argument sets (shapes, strides, buffer
//! lengths, dtypes' special values, temperatures, k, p, min-p), and must
//! return a value or a typed error, never panic; and the validation layer
//! the GPU launches run first must only accept shapes the buffers can hold.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};

use flashsample::reference::{self, SamplingParams};
use flashsample::{Backend, HeadShape, Rows};
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
