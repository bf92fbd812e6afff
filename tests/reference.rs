//! CPU tests of the float64 reference itself (`flashsample::reference`):
//! hand-checked rows for every rule, the truncation order, chi-square tests
//! of both samplers against the exact distributions, determinism and batch
//! independence, and the statistics helpers against known values.

mod common;

use approx::{assert_abs_diff_eq, assert_relative_eq};
use common::{DISTS, Mismatches, push_row};
use flashsample::kernels::noise::gumbel_from_bits;
use flashsample::kernels::philox::{seed_key, token_noise};
use flashsample::kernels::sample::{MAX_VOCAB, greedy_key, gumbel_key, is_greedy, is_valid, token};
use flashsample::reference::stats::{
    binomial_band_99, chi_square, chi_square_p_value, regularized_upper_gamma,
};
use flashsample::reference::{
    ReferenceError, SamplingParams, argmax, gumbel_scores, kept_set, kept_sets, kept_sets_agree,
    masked_logits, masked_logits_batch, probabilities, probabilities_batch, sample_gumbel,
    sample_gumbel_batch, sample_top_k_top_p, sample_top_k_top_p_batch, softmax, softmax_batch,
    tokens_agree, top_p_near_boundary,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const INF: f32 = f32::INFINITY;
const NINF: f32 = f32::NEG_INFINITY;
const NAN: f32 = f32::NAN;

type TestResult = Result<(), ReferenceError>;

/// A seeded RNG. Unlike `common::rng` the default seed is fixed: the
/// chi-square tests here run on the CPU at every `cargo test` and must not
/// fail one run in a hundred. `FLASHSAMPLE_TEST_SEED` picks another seed.
fn rng(test: &str) -> StdRng {
    const DEFAULT_SEED: u64 = 0x5eed_f1a5;
    let seed = std::env::var("FLASHSAMPLE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    println!("{test}: seed {seed} (FLASHSAMPLE_TEST_SEED to replay)");
    StdRng::seed_from_u64(seed)
}

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        ..SamplingParams::default()
    }
}

/// Logits whose softmax at T = 1 is `probs` (to f32 rounding).
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn total_order_is_value_desc_then_index_asc() -> TestResult {
    // +inf first; ties by index; +0.0 above -0.0; NaN ranks with -inf.
    let row = [1.0, 3.0, 3.0, NINF, NAN, 0.0, -0.0, INF];
    assert_eq!(kept_set(&row, &params(1.0))?, vec![7, 1, 2, 0, 5, 6, 3, 4]);
    let row = [1.0, NAN, NINF, NAN];
    assert_eq!(kept_set(&row, &params(1.0))?, vec![0, 1, 2, 3]);
    // A row with no valid entry keeps nothing.
    assert!(kept_set(&[NAN, NINF, NAN, NINF], &params(1.0))?.is_empty());
    let zeros = [-0.0, 0.0, -0.0, 0.0];
    assert_eq!(kept_set(&zeros, &params(1.0))?, vec![1, 3, 0, 2]);
    assert_eq!(argmax(&zeros)?, Some(1));
    // The two zeros carry the same mass.
    assert_eq!(softmax(&zeros, 1.0)?, vec![0.25; 4]);
    Ok(())
}

#[test]
fn top_k_keeps_exactly_k_with_ties_to_low_indices() -> TestResult {
    let row = [1.0, 3.0, 3.0, 2.0, 3.0];
    let top_k = |k| {
        kept_set(
            &row,
            &SamplingParams {
                top_k: k,
                ..params(1.0)
            },
        )
    };
    assert_eq!(top_k(1)?, vec![1]);
    assert_eq!(top_k(2)?, vec![1, 2]);
    assert_eq!(top_k(3)?, vec![1, 2, 4]);
    assert_eq!(top_k(4)?, vec![1, 2, 4, 3]); // V - 1
    for off in [0, 5, 6, u32::MAX] {
        assert_eq!(top_k(off)?, vec![1, 2, 4, 3, 0], "k = {off} is off");
    }
    let p = SamplingParams {
        top_k: 2,
        ..params(1.0)
    };
    assert_eq!(
        bits(&masked_logits(&row, &p)?),
        bits(&[NINF, 3.0, 3.0, NINF, NINF])
    );
    assert_eq!(probabilities(&row, &p)?, vec![0.0, 0.5, 0.5, 0.0, 0.0]);
    let third = 1.0 / 3.0;
    assert_eq!(
        probabilities(&row, &SamplingParams { top_k: 3, ..p })?,
        vec![0.0, third, third, 0.0, third]
    );
    // Fewer valid entries than k: the order continues into -inf and NaN,
    // which keep their value in the masked logits but get no mass.
    let row = [NAN, 2.0, NINF, 1.0];
    let p = SamplingParams {
        top_k: 3,
        ..params(1.0)
    };
    assert_eq!(kept_set(&row, &p)?, vec![1, 3, 0]);
    assert_eq!(
        bits(&masked_logits(&row, &p)?),
        bits(&[NAN, 2.0, NINF, 1.0])
    );
    assert_eq!(probabilities(&row, &p)?[0], 0.0);
    Ok(())
}

#[test]
fn top_p_keeps_the_shortest_prefix_with_exclusive_mass_below_p() -> TestResult {
    // Masses 0.4, 0.3, 0.2, 0.1, 0: exclusive cumulative masses 0, .4, .7, .9, 1.
    let mut row = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    row.push(NINF);
    let top_p = |p| {
        kept_set(
            &row,
            &SamplingParams {
                top_p: p,
                ..params(1.0)
            },
        )
    };
    assert_eq!(top_p(1e-6)?, vec![0]);
    assert_eq!(top_p(0.35)?, vec![0]);
    assert_eq!(top_p(0.5)?, vec![0, 1]);
    assert_eq!(top_p(0.75)?, vec![0, 1, 2]);
    assert_eq!(top_p(0.95)?, vec![0, 1, 2, 3]);
    assert_eq!(
        top_p(1.0 - f32::EPSILON / 2.0)?,
        vec![0, 1, 2, 3],
        "zero-mass entries follow the full mass"
    );
    assert_eq!(top_p(1.0)?, vec![0, 1, 2, 3, 4], "p = 1 is off");
    let p = SamplingParams {
        top_p: 0.75,
        ..params(1.0)
    };
    let probs = probabilities(&row, &p)?;
    for (got, want) in probs
        .iter()
        .zip([0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0, 0.0])
    {
        assert_abs_diff_eq!(*got, want, epsilon = 1e-6);
    }
    assert_relative_eq!(probs.iter().sum::<f64>(), 1.0, max_relative = 1e-15);
    Ok(())
}

#[test]
fn near_boundary_flags_cuts_within_1e6_of_the_threshold() -> TestResult {
    let row = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    let near = |p| {
        top_p_near_boundary(
            &row,
            &SamplingParams {
                top_p: p,
                ..params(1.0)
            },
        )
    };
    // Exclusive masses .4, .7 and .9 are thresholds; f32 rounding of the
    // logits moves them by ~1e-7, well inside the band.
    for p in [0.4, 0.7, 0.9] {
        assert!(near(p)?, "p = {p}");
    }
    for p in [1e-6, 0.39, 0.41, 0.5, 0.75, 0.95, 1.0] {
        assert!(!near(p)?, "p = {p}");
    }
    // Greedy rows and invalid rows have no cut.
    assert!(!top_p_near_boundary(
        &row,
        &SamplingParams {
            top_p: 0.4,
            ..params(0.0)
        }
    )?);
    assert!(!top_p_near_boundary(
        &[NAN, NINF],
        &SamplingParams {
            top_p: 0.4,
            ..params(1.0)
        }
    )?);
    Ok(())
}

#[test]
fn min_p_keeps_tokens_with_p_at_least_min_p_times_p_max() -> TestResult {
    let mut row = logits_of(&[0.4, 0.3, 0.2, 0.1]); // p / p_max = 1, .75, .5, .25
    row.push(NINF);
    let min_p = |m, t| {
        kept_set(
            &row,
            &SamplingParams {
                min_p: m,
                ..params(t)
            },
        )
    };
    assert_eq!(min_p(0.0, 1.0)?, vec![0, 1, 2, 3, 4], "min_p = 0 is off");
    assert_eq!(min_p(1e-30, 1.0)?, vec![0, 1, 2, 3]);
    assert_eq!(min_p(0.3, 1.0)?, vec![0, 1, 2]);
    assert_eq!(min_p(0.6, 1.0)?, vec![0, 1]);
    assert_eq!(min_p(1.0, 1.0)?, vec![0]);
    // Temperature first: at T = 2 the ratios are sqrt(1, .75, .5, .25).
    assert_eq!(min_p(0.6, 2.0)?, vec![0, 1, 2]);
    // Ties at the maximum all survive min_p = 1.
    assert_eq!(
        kept_set(
            &[2.0, 2.0, 1.0],
            &SamplingParams {
                min_p: 1.0,
                ..params(1.0)
            }
        )?,
        vec![0, 1]
    );
    Ok(())
}

#[test]
fn truncation_order_is_temperature_min_p_top_k_top_p() -> TestResult {
    let row = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    let kept = |p: SamplingParams| kept_set(&row, &p);
    let base = params(1.0);
    // Each filter alone keeps {0, 1}.
    let min_p = SamplingParams { min_p: 0.6, ..base };
    let top_k = SamplingParams { top_k: 2, ..base };
    let top_p = SamplingParams { top_p: 0.5, ..base };
    for p in [min_p, top_k, top_p] {
        assert_eq!(kept(p)?, vec![0, 1]);
    }
    // top-p then measures only the surviving mass 0.7: threshold 0.35 < 0.4.
    // (SGLang's order, min-p after top-p over the whole row, keeps {0, 1}.)
    assert_eq!(
        kept(SamplingParams {
            top_p: 0.5,
            ..min_p
        })?,
        vec![0]
    );
    assert_eq!(
        kept(SamplingParams {
            top_p: 0.5,
            ..top_k
        })?,
        vec![0]
    );
    // min-p and top-k commute: the kept set is the shorter prefix.
    assert_eq!(
        kept(SamplingParams {
            top_k: 3,
            min_p: 0.6,
            ..base
        })?,
        vec![0, 1]
    );
    assert_eq!(
        kept(SamplingParams {
            top_k: 1,
            min_p: 0.3,
            ..base
        })?,
        vec![0]
    );
    // Temperature before everything: at T = 4 the masses are flatter, so
    // the same min-p and top-p keep more.
    assert_eq!(
        kept(SamplingParams {
            temperature: 4.0,
            top_p: 0.9,
            ..min_p
        })?,
        vec![0, 1, 2, 3]
    );
    // Renormalisation over what min-p kept.
    let probs = probabilities(&row, &min_p)?;
    for (got, want) in probs.iter().zip([0.4 / 0.7, 0.3 / 0.7, 0.0, 0.0]) {
        assert_abs_diff_eq!(*got, want, epsilon = 1e-6);
    }
    Ok(())
}

#[test]
fn greedy_rows_take_the_argmax() -> TestResult {
    for t in [0.0, -0.0, -1.0, NAN, NINF] {
        let row = [2.0, 5.0, 5.0, NAN];
        let p = SamplingParams {
            top_k: 3,
            top_p: 0.5,
            min_p: 0.5,
            seed: 9,
            offset: 4,
            temperature: t,
        };
        assert_eq!(sample_gumbel(&row, t, 9, 4)?, Some(1), "T = {t}");
        assert_eq!(sample_top_k_top_p(&row, &p)?, Some(1));
        assert_eq!(kept_set(&row, &p)?, vec![1]);
        assert_eq!(
            kept_set(&row, &params(t))?,
            vec![1],
            "greedy ignores disabled filters too"
        );
        assert_eq!(probabilities(&row, &p)?, vec![0.0, 1.0, 0.0, 0.0]);
        assert_eq!(softmax(&row, t)?, vec![0.0, 1.0, 0.0, 0.0]);
        assert_eq!(
            bits(&masked_logits(&row, &p)?),
            bits(&[NINF, 5.0, NINF, NINF])
        );
        assert_eq!(
            gumbel_scores(&row, t, 9, 4)?,
            vec![2.0, 5.0, 5.0, f64::NEG_INFINITY]
        );
        assert_eq!(sample_gumbel(&[NAN, 1.0, INF, INF], t, 9, 4)?, Some(2));
        assert_eq!(sample_gumbel(&[NAN, NINF], t, 9, 4)?, None);
        assert_eq!(sample_gumbel(&[-0.0, 0.0], t, 9, 4)?, Some(1));
    }
    // The smallest positive temperature samples; here it is certain anyway.
    assert_eq!(
        sample_gumbel(&[0.0, 1.0], f32::from_bits(1), 9, 4)?,
        Some(1)
    );
    Ok(())
}

#[test]
fn softmax_matches_hand_values() -> TestResult {
    let p = softmax(&logits_of(&[1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]), 1.0)?;
    for (got, want) in p.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
        assert_abs_diff_eq!(*got, want, epsilon = 1e-7);
    }
    let p = softmax(&[0.0, 4.0f32.ln(), NINF, NAN], 2.0)?;
    assert_abs_diff_eq!(p[0], 1.0 / 3.0, epsilon = 1e-7);
    assert_abs_diff_eq!(p[1], 2.0 / 3.0, epsilon = 1e-7);
    assert_eq!(&p[2..], &[0.0, 0.0]);
    // Extreme logits neither overflow nor lose the maximum.
    let p = softmax(&[f32::MAX, -f32::MAX, f32::MAX], 1e-30)?;
    assert_eq!(p, vec![0.5, 0.0, 0.5]);
    assert_eq!(
        softmax(&[1.0, INF, 2.0, INF, NAN], 0.5)?,
        vec![0.0, 0.5, 0.0, 0.5, 0.0]
    );
    assert_eq!(softmax(&[NAN, NINF, NAN], 1.0)?, vec![0.0; 3]);
    Ok(())
}

#[test]
fn invalid_rows_report_themselves() -> TestResult {
    for row in [vec![NAN; 5], vec![NINF; 5], vec![NAN, NINF, NAN]] {
        for p in [
            params(1.0),
            params(0.0),
            SamplingParams {
                top_k: 1,
                top_p: 0.5,
                min_p: 0.5,
                ..params(0.7)
            },
        ] {
            assert!(kept_set(&row, &p)?.is_empty());
            assert_eq!(
                bits(&masked_logits(&row, &p)?),
                bits(&vec![NINF; row.len()])
            );
            assert_eq!(probabilities(&row, &p)?, vec![0.0; row.len()]);
            assert_eq!(sample_top_k_top_p(&row, &p)?, None);
            assert_eq!(sample_gumbel(&row, p.temperature, 1, 2)?, None);
            assert_eq!(tokens_agree(&row, p.temperature, 1, 2, None), Ok(()));
            assert!(tokens_agree(&row, p.temperature, 1, 2, Some(0)).is_err());
            assert_eq!(kept_sets_agree(&row, &p, &[]), Ok(()));
            assert!(kept_sets_agree(&row, &p, &[0]).is_err());
        }
    }
    Ok(())
}

#[test]
fn plus_inf_entries_share_the_row_uniformly() -> TestResult {
    let mut rng = rng("plus_inf_entries_share_the_row_uniformly");
    let row = [1.0, INF, 2.0, INF, NAN, 1e30];
    let kept = |p: SamplingParams| kept_set(&row, &p);
    assert_eq!(kept(params(1.0))?, vec![1, 3, 5, 2, 0, 4]);
    assert_eq!(
        kept(SamplingParams {
            top_k: 1,
            ..params(1.0)
        })?,
        vec![1]
    );
    assert_eq!(
        kept(SamplingParams {
            top_k: 2,
            ..params(1.0)
        })?,
        vec![1, 3]
    );
    assert_eq!(
        kept(SamplingParams {
            top_p: 0.5,
            ..params(1.0)
        })?,
        vec![1]
    );
    assert_eq!(
        kept(SamplingParams {
            top_p: 0.6,
            ..params(1.0)
        })?,
        vec![1, 3]
    );
    assert_eq!(
        kept(SamplingParams {
            min_p: 0.5,
            ..params(1.0)
        })?,
        vec![1, 3]
    );
    let draws = 40_000u64;
    let band = binomial_band_99(draws, 0.5)?;
    for t in [1.0, 1e-3, 1e3] {
        let seed = rng.random();
        let mut gumbel = [0u64; 6];
        let mut inverse_cdf = [0u64; 6];
        for offset in 0..draws {
            if let Some(j) = sample_gumbel(&row, t, seed, offset)? {
                gumbel[j as usize] += 1;
            }
            let p = SamplingParams {
                seed,
                offset,
                ..params(t)
            };
            if let Some(j) = sample_top_k_top_p(&row, &p)? {
                inverse_cdf[j as usize] += 1;
            }
        }
        for counts in [gumbel, inverse_cdf] {
            assert_eq!(counts[1] + counts[3], draws, "T = {t}: {counts:?}");
            assert!(
                band.contains(&counts[1]),
                "T = {t}: {counts:?} outside {band:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn gumbel_scores_use_the_shared_noise() -> TestResult {
    let mut rng = rng("gumbel_scores_use_the_shared_noise");
    let vocab = 37; // not a multiple of the 4-token noise groups
    let mut row: Vec<f32> = (0..vocab).map(|_| rng.random_range(-20.0..20.0)).collect();
    row[3] = INF;
    row[8] = NAN;
    row[13] = NINF;
    row[21] = -0.0;
    let seed: u64 = rng.random();
    for offset in [0, 1, rng.random::<u64>() | (1 << 40)] {
        let scores = gumbel_scores(&row, 0.75, seed, offset)?;
        for (j, (&x, &s)) in row.iter().zip(&scores).enumerate() {
            let g = f64::from(gumbel_from_bits(token_noise(
                seed_key(seed),
                offset,
                j as u32,
            )));
            let want = match x {
                INF => g,
                x if x > NINF => f64::from(x) / 0.75 + g,
                _ => f64::NEG_INFINITY,
            };
            assert_eq!(s.to_bits(), want.to_bits(), "token {j}");
        }
        // +inf at index 3 is the only token of the top class.
        assert_eq!(sample_gumbel(&row, 0.75, seed, offset)?, Some(3));
        row[3] = 1.0;
        let scores = gumbel_scores(&row, 0.75, seed, offset)?;
        let best = (0..vocab)
            .filter(|&j| scores[j] > f64::NEG_INFINITY)
            .fold(0, |b, j| if scores[j] > scores[b] { j } else { b });
        assert_eq!(sample_gumbel(&row, 0.75, seed, offset)?, Some(best as u32));
        row[3] = INF;
    }
    Ok(())
}

#[test]
fn tokens_agree_accepts_only_rounding_ties() -> TestResult {
    let mut rng = rng("tokens_agree_accepts_only_rounding_ties");
    let (seed, offset) = (rng.random(), rng.random());
    let g = |j| f64::from(gumbel_from_bits(token_noise(seed_key(seed), offset, j)));
    // Token 1's logit cancels the noise difference up to f32 rounding:
    // s_1 = x_1 + g_1 is within an ulp of s_0 = g_0.
    let x1 = (g(0) - g(1)) as f32;
    let tie = [0.0, x1];
    assert_eq!(tokens_agree(&tie, 1.0, seed, offset, Some(0)), Ok(()));
    assert_eq!(tokens_agree(&tie, 1.0, seed, offset, Some(1)), Ok(()));
    // A gap far beyond rounding.
    let apart = [0.0, x1 - 1e-3];
    assert_eq!(sample_gumbel(&apart, 1.0, seed, offset)?, Some(0));
    let err = tokens_agree(&apart, 1.0, seed, offset, Some(1)).unwrap_err();
    assert!(err.contains("exceeds"), "{err}");
    // Classes never mix; +inf entries and greedy rows must agree exactly.
    assert!(
        tokens_agree(&[1.0, INF], 1.0, seed, offset, Some(0))
            .unwrap_err()
            .contains("class")
    );
    let two_inf = [INF, INF];
    let winner = sample_gumbel(&two_inf, 1.0, seed, offset)?.unwrap_or(0);
    assert!(tokens_agree(&two_inf, 1.0, seed, offset, Some(1 - winner)).is_err());
    assert!(
        tokens_agree(&[1.0, 1.0], 0.0, seed, offset, Some(1))
            .unwrap_err()
            .contains("greedy")
    );
    assert_eq!(
        tokens_agree(&[1.0, 1.0], 0.0, seed, offset, Some(0)),
        Ok(())
    );
    // Validity and range.
    assert!(tokens_agree(&tie, 1.0, seed, offset, None).is_err());
    assert!(
        tokens_agree(&tie, 1.0, seed, offset, Some(7))
            .unwrap_err()
            .contains("outside")
    );
    assert!(tokens_agree(&[], 1.0, seed, offset, None).is_err());
    Ok(())
}

#[test]
fn kept_sets_agree_allows_one_boundary_element() -> TestResult {
    let row = logits_of(&[0.4, 0.3, 0.2, 0.1]);
    let away = SamplingParams {
        top_p: 0.5,
        ..params(1.0)
    };
    assert_eq!(kept_sets_agree(&row, &away, &[1, 0]), Ok(()), "any order");
    for wrong in [&[0][..], &[0, 1, 2], &[0, 1, 1], &[0, 9]] {
        let err = kept_sets_agree(&row, &away, wrong).unwrap_err();
        assert!(err.contains("kept sets differ"), "{wrong:?}: {err}");
    }
    // The exclusive mass of token 2 is 0.7 up to rounding.
    let boundary = SamplingParams {
        top_p: 0.7,
        ..params(1.0)
    };
    assert!(top_p_near_boundary(&row, &boundary)?);
    assert_eq!(kept_sets_agree(&row, &boundary, &[0, 1]), Ok(()));
    assert_eq!(kept_sets_agree(&row, &boundary, &[0, 1, 2]), Ok(()));
    assert!(kept_sets_agree(&row, &boundary, &[0]).is_err());
    assert!(kept_sets_agree(&row, &boundary, &[0, 1, 2, 3]).is_err());
    assert!(
        kept_sets_agree(
            &row,
            &SamplingParams {
                top_p: 2.0,
                ..boundary
            },
            &[0]
        )
        .is_err()
    );
    Ok(())
}

#[test]
fn arguments_are_validated() {
    let row = [1.0f32, 2.0, 3.0];
    let invalid = |name: &str, e: ReferenceError| matches!(e, ReferenceError::InvalidParam { name: n, .. } if n == name);
    for top_p in [0.0, -0.1, 1.000_001, NAN, INF] {
        let p = SamplingParams {
            top_p,
            ..params(1.0)
        };
        assert!(invalid("top_p", kept_set(&row, &p).unwrap_err()));
        assert!(invalid("top_p", masked_logits(&row, &p).unwrap_err()));
        assert!(invalid("top_p", probabilities(&row, &p).unwrap_err()));
        assert!(invalid("top_p", sample_top_k_top_p(&row, &p).unwrap_err()));
        assert!(invalid("top_p", top_p_near_boundary(&row, &p).unwrap_err()));
        assert!(p.validate().is_err());
    }
    for min_p in [-0.1, 1.000_001, NAN, NINF] {
        let p = SamplingParams {
            min_p,
            ..params(0.0)
        };
        assert!(invalid("min_p", kept_set(&row, &p).unwrap_err()));
    }
    // Every temperature and every k is valid.
    for temperature in [NAN, INF, NINF, 0.0, 1e-45, 1e30] {
        let p = SamplingParams {
            temperature,
            top_k: u32::MAX,
            ..SamplingParams::default()
        };
        assert!(sample_top_k_top_p(&row, &p).is_ok());
        assert!(sample_gumbel(&row, temperature, 0, 0).is_ok());
    }
    assert!(invalid("vocab", kept_set(&[], &params(1.0)).unwrap_err()));
    assert!(invalid("vocab", argmax(&[]).unwrap_err()));
    assert!(invalid("vocab", softmax(&[], 1.0).unwrap_err()));
    assert!(invalid("vocab", gumbel_scores(&[], 1.0, 0, 0).unwrap_err()));
    assert!(invalid("vocab", sample_gumbel(&[], 1.0, 0, 0).unwrap_err()));

    let logits = [0.0f32; 6];
    let two = [params(1.0); 2];
    assert_eq!(
        kept_sets(&logits[..5], 3, &two).unwrap_err(),
        ReferenceError::Shape {
            what: "logits",
            expected: 6,
            got: 5
        }
    );
    assert!(invalid("vocab", kept_sets(&logits, 0, &two).unwrap_err()));
    assert!(invalid(
        "vocab",
        kept_sets(&[], MAX_VOCAB as usize + 1, &[]).unwrap_err()
    ));
    assert!(masked_logits_batch(&logits, 2, &two).is_err());
    assert!(probabilities_batch(&logits, 4, &two).is_err());
    assert!(sample_top_k_top_p_batch(&logits, 3, &[params(1.0)]).is_err());
    assert!(softmax_batch(&logits, 3, &[1.0; 3]).is_err());
    assert_eq!(
        sample_gumbel_batch(&logits, 3, &[1.0; 2], &[0], &[0; 2]).unwrap_err(),
        ReferenceError::Shape {
            what: "seed",
            expected: 2,
            got: 1
        }
    );
    assert_eq!(
        sample_gumbel_batch(&logits, 3, &[1.0; 2], &[0; 2], &[0; 3]).unwrap_err(),
        ReferenceError::Shape {
            what: "offset",
            expected: 2,
            got: 3
        }
    );
    assert_eq!(kept_sets(&[], 4, &[]), Ok(vec![]));
    let bad = SamplingParams {
        top_p: 1.5,
        ..params(1.0)
    };
    assert!(invalid(
        "top_p",
        kept_sets(&logits, 3, &[params(1.0), bad]).unwrap_err()
    ));
    // Messages name the argument and its value.
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "invalid parameter top_p = 1.5"
    );
    assert_eq!(
        kept_sets(&logits[..5], 3, &two).unwrap_err().to_string(),
        "logits: expected 6 elements, got 5"
    );
}

/// Counts of `draws` samples of `sample(offset)` for offsets `0..draws`.
fn histogram(
    vocab: usize,
    draws: u64,
    mut sample: impl FnMut(u64) -> Result<Option<u32>, ReferenceError>,
) -> Result<Vec<u64>, ReferenceError> {
    let mut counts = vec![0u64; vocab];
    for offset in 0..draws {
        let token = sample(offset)?.expect("a valid row yields a token");
        counts[token as usize] += 1;
    }
    Ok(counts)
}

const DRAWS: u64 = 1_000_000;

#[test]
fn gumbel_max_draws_follow_the_softmax() -> TestResult {
    let mut rng = rng("gumbel_max_draws_follow_the_softmax");
    let vocab = 32;
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| 1.5 * rng.random_range(-2.0f32..2.0))
        .collect();
    row[5] = NAN;
    row[17] = NINF;
    row[30] = -0.0;
    let (t, seed) = (0.7, rng.random());
    let counts = histogram(vocab, DRAWS, |offset| sample_gumbel(&row, t, seed, offset))?;
    let probs = softmax(&row, t)?;
    assert_eq!((counts[5], counts[17]), (0, 0), "NaN / -inf drawn");
    let fit = chi_square(&counts, &probs)?;
    println!("Gumbel-max, V = {vocab}, {DRAWS} draws: {fit:?}");
    assert!(
        fit.p_value > 0.01,
        "{fit:?}\ncounts {counts:?}\nprobs {probs:?}"
    );
    // The most likely token's count, on its own.
    let top = argmax(&row)?.unwrap_or(0) as usize;
    let band = binomial_band_99(DRAWS, probs[top])?;
    assert!(
        band.contains(&counts[top]),
        "token {top}: {} outside {band:?}",
        counts[top]
    );
    Ok(())
}

#[test]
fn inverse_cdf_draws_follow_the_kept_distribution() -> TestResult {
    let mut rng = rng("inverse_cdf_draws_follow_the_kept_distribution");
    let vocab = 48;
    let row: Vec<f32> = (0..vocab)
        .map(|_| 2.0 * rng.random_range(-2.0f32..2.0))
        .collect();
    let base = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.02,
        seed: rng.random(),
        offset: 0,
    };
    let kept = kept_set(&row, &base)?;
    println!("kept {} of {vocab}: {kept:?}", kept.len());
    assert!(
        kept.len() > 4 && kept.len() < 20,
        "the filters should bite: {kept:?}"
    );
    assert!(!top_p_near_boundary(&row, &base)?);
    let counts = histogram(vocab, DRAWS, |offset| {
        sample_top_k_top_p(&row, &SamplingParams { offset, ..base })
    })?;
    let outside: Vec<usize> = (0..vocab)
        .filter(|&j| counts[j] > 0 && !kept.contains(&(j as u32)))
        .collect();
    assert!(
        outside.is_empty(),
        "tokens outside the kept set drawn: {outside:?}"
    );
    let probs = probabilities(&row, &base)?;
    let fit = chi_square(&counts, &probs)?;
    println!("inverse CDF, {DRAWS} draws: {fit:?}");
    assert_eq!(fit.dof, kept.len() - 1);
    assert!(
        fit.p_value > 0.01,
        "{fit:?}\ncounts {counts:?}\nprobs {probs:?}"
    );
    Ok(())
}

#[test]
fn rows_are_pure_functions_of_row_params_seed_offset() -> TestResult {
    let mut rng = rng("rows_are_pure_functions_of_row_params_seed_offset");
    let (vocab, batch) = (111, 35);
    let mut logits = Vec::new();
    let mut params = Vec::new();
    for r in 0..batch {
        push_row(&mut rng, DISTS[r % DISTS.len()], vocab, &mut logits);
        params.push(SamplingParams {
            temperature: [0.0, 0.5, 1.0, 1.7, NAN][rng.random_range(0..5)],
            top_k: [0, 1, 5, 110, 111, 1000][rng.random_range(0..6)],
            top_p: [1e-6, 0.5, 0.9, 1.0][rng.random_range(0..4)],
            min_p: [0.0, 0.05, 1.0][rng.random_range(0..3)],
            seed: rng.random(),
            offset: rng.random(),
        });
    }
    let temperature: Vec<f32> = params.iter().map(|p| p.temperature).collect();
    let seed: Vec<u64> = params.iter().map(|p| p.seed).collect();
    let offset: Vec<u64> = params.iter().map(|p| p.offset).collect();
    let kept = kept_sets(&logits, vocab, &params)?;
    let masked = masked_logits_batch(&logits, vocab, &params)?;
    let probs = probabilities_batch(&logits, vocab, &params)?;
    let soft = softmax_batch(&logits, vocab, &temperature)?;
    let drawn = sample_top_k_top_p_batch(&logits, vocab, &params)?;
    let gumbel = sample_gumbel_batch(&logits, vocab, &temperature, &seed, &offset)?;

    // The same rows in reverse order, each next to a different batchmate.
    let order: Vec<usize> = (0..batch).rev().collect();
    let shuffled: Vec<f32> = order
        .iter()
        .flat_map(|&r| logits[r * vocab..(r + 1) * vocab].to_vec())
        .collect();
    let shuffled_params: Vec<SamplingParams> = order.iter().map(|&r| params[r]).collect();
    let drawn_shuffled = sample_top_k_top_p_batch(&shuffled, vocab, &shuffled_params)?;
    let gumbel_shuffled = sample_gumbel_batch(
        &shuffled,
        vocab,
        &order.iter().map(|&r| temperature[r]).collect::<Vec<_>>(),
        &order.iter().map(|&r| seed[r]).collect::<Vec<_>>(),
        &order.iter().map(|&r| offset[r]).collect::<Vec<_>>(),
    )?;

    let mut m = Mismatches::default();
    for (i, &r) in order.iter().enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let p = &params[r];
        let span = r * vocab..(r + 1) * vocab;
        let agree = tokens_agree(row, p.temperature, p.seed, p.offset, gumbel[r]);
        let kept_agree = kept_sets_agree(row, p, &kept[r]);
        // Invariants: the kept set is a prefix of the total order, min-p and
        // top-k commute, masses are renormalised over it, tokens come from it.
        let valid = argmax(row)?.is_some();
        let full = kept_set(row, &SamplingParams::default())?;
        let k_only = kept_set(
            row,
            &SamplingParams {
                min_p: 0.0,
                top_p: 1.0,
                ..*p
            },
        )?;
        let min_p_only = kept_set(
            row,
            &SamplingParams {
                top_k: 0,
                top_p: 1.0,
                ..*p
            },
        )?;
        let both = kept_set(row, &SamplingParams { top_p: 1.0, ..*p })?;
        let sum: f64 = probs[span.clone()].iter().sum();
        let mass_outside =
            (0..vocab).any(|j| probs[r * vocab + j] > 0.0 && !kept[r].contains(&(j as u32)));
        let checks = [
            (
                drawn_shuffled[i] == drawn[r],
                "inverse CDF depends on position".to_string(),
            ),
            (
                gumbel_shuffled[i] == gumbel[r],
                "Gumbel-max depends on position".to_string(),
            ),
            (
                sample_top_k_top_p(row, p)? == drawn[r],
                "inverse CDF: batch != row".to_string(),
            ),
            (
                sample_gumbel(row, p.temperature, p.seed, p.offset)? == gumbel[r],
                "Gumbel-max: batch != row".to_string(),
            ),
            (agree.is_ok(), format!("tokens_agree: {agree:?}")),
            (
                kept_agree.is_ok(),
                format!("kept_sets_agree: {kept_agree:?}"),
            ),
            (
                bits(&masked_logits(row, p)?) == bits(&masked[span.clone()]),
                "masked logits: batch != row".to_string(),
            ),
            (
                probabilities(row, p)? == probs[span.clone()],
                "probabilities: batch != row".to_string(),
            ),
            (
                softmax(row, p.temperature)? == soft[span.clone()],
                "softmax: batch != row".to_string(),
            ),
            (
                full[..kept[r].len()] == kept[r][..],
                format!("kept {:?} is not a prefix of the order", kept[r]),
            ),
            (
                valid == !kept[r].is_empty(),
                format!("valid {valid}, kept {:?}", kept[r]),
            ),
            (
                both.len() == k_only.len().min(min_p_only.len()),
                "min-p and top-k do not commute".to_string(),
            ),
            (
                (sum - if valid { 1.0 } else { 0.0 }).abs() < 1e-12,
                format!("probabilities sum to {sum}"),
            ),
            (!mass_outside, "mass outside the kept set".to_string()),
            (
                drawn[r].is_none_or(|j| kept[r].contains(&j)),
                format!("drew {:?} outside the kept set", drawn[r]),
            ),
            (
                drawn[r].is_some() == valid && gumbel[r].is_some() == valid,
                format!("valid {valid}, drew {:?}", drawn[r]),
            ),
        ];
        let dist = DISTS[r % DISTS.len()];
        for (ok, what) in checks {
            m.check(ok, || format!("row {r} ({dist:?}), {p:?}: {what}"));
        }
    }
    m.assert_none("pure rows");
    Ok(())
}

#[test]
fn chi_square_p_values_match_known_values() {
    // Upper 5 % and 1 % points of chi-square tables.
    let points = [
        (3.841_458_820_694_124, 1, 0.05),
        (6.634_896_601_021_215, 1, 0.01),
        (23.209_251_158_954_36, 10, 0.01),
        (76.153_891_249_012_72, 50, 0.01),
        (135.806_723_171_026_8, 100, 0.01),
    ];
    for (x, dof, p) in points {
        assert_relative_eq!(chi_square_p_value(x, dof), p, max_relative = 1e-10);
    }
    // Q(a, x) from mpmath, series and continued-fraction regions alike.
    let q = [
        (0.5, 1.0, 0.157_299_207_050_285_13), // erfc(1)
        (0.5, 0.01, 0.887_537_083_981_715),
        (0.1, 0.5, 0.058_597_554_109_866_48),
        (2.5, 10.0, 0.001_249_730_563_031_375_4),
        (3.0, 2.0, 0.676_676_416_183_063_5), // 5 / e^2
        (31.5, 40.0, 0.072_895_489_324_622_68),
        (32.0, 20.0, 0.991_908_245_330_164_9),
        (200.0, 260.0, 4.750_012_444_300_876e-5),
        (1000.0, 900.0, 0.999_450_097_734_288_2),
        (1000.0, 1100.0, 0.001_059_323_253_929_977_3),
    ];
    for (a, x, want) in q {
        assert_relative_eq!(regularized_upper_gamma(a, x), want, max_relative = 1e-9);
    }
    assert_eq!(regularized_upper_gamma(2.0, 0.0), 1.0);
    assert_eq!(regularized_upper_gamma(2.0, f64::INFINITY), 0.0);
    for (a, x) in [
        (0.0, 1.0),
        (-1.0, 1.0),
        (1.0, -1.0),
        (f64::NAN, 1.0),
        (1.0, f64::NAN),
    ] {
        assert!(regularized_upper_gamma(a, x).is_nan(), "Q({a}, {x})");
    }
}

#[test]
fn chi_square_statistic_pools_small_bins() -> TestResult {
    let fit = chi_square(&[500, 500], &[1.0, 1.0])?;
    assert_eq!((fit.statistic, fit.dof, fit.p_value), (0.0, 1, 1.0));
    // Expected 998, 1, 1: the last two pool into one bin of expectation 2.
    let fit = chi_square(&[996, 2, 2], &[0.998, 0.001, 0.001])?;
    assert_eq!(fit.dof, 1);
    assert_relative_eq!(fit.statistic, 4.0 / 998.0 + 2.0, max_relative = 1e-12);
    // A zero-probability bin is left out unless something landed in it.
    assert_eq!(chi_square(&[10, 0, 10], &[0.5, 0.0, 0.5])?.dof, 1);
    let fit = chi_square(&[10, 1, 10], &[0.5, 0.0, 0.5])?;
    assert_eq!((fit.statistic, fit.p_value), (f64::INFINITY, 0.0));
    assert_eq!(chi_square(&[5], &[1.0])?.p_value, 1.0);
    assert_eq!(
        chi_square(&[1, 2], &[1.0]).unwrap_err(),
        ReferenceError::Shape {
            what: "probabilities",
            expected: 2,
            got: 1
        }
    );
    assert!(chi_square(&[1, 2], &[0.5, -0.5]).is_err());
    assert!(chi_square(&[1, 2], &[0.5, f64::NAN]).is_err());
    assert!(chi_square(&[0, 0], &[0.5, 0.5]).is_err());
    assert!(chi_square(&[1, 2], &[0.0, 0.0]).is_err());
    Ok(())
}

#[test]
fn binomial_band_matches_exact_quantiles() -> TestResult {
    // From exact rational binomial probabilities.
    let exact = [
        (100, 0.5, 37..=63),
        (1000, 0.01, 3..=19),
        (50, 0.1, 0..=11),
        (2000, 0.3, 548..=653),
        (7, 0.5, 0..=7),
        (1, 0.5, 0..=1),
        (10, 0.999, 9..=10),
    ];
    for (n, p, band) in exact {
        assert_eq!(binomial_band_99(n, p)?, band, "n = {n}, p = {p}");
    }
    assert_eq!(binomial_band_99(0, 0.3)?, 0..=0);
    assert_eq!(binomial_band_99(9, 0.0)?, 0..=0);
    assert_eq!(binomial_band_99(9, 1.0)?, 9..=9);
    // Large n: close to the normal band mean +- 2.5758 sd.
    let band = binomial_band_99(10_000_000, 0.25)?;
    let sd = (10_000_000.0f64 * 0.25 * 0.75).sqrt();
    assert_abs_diff_eq!(
        *band.start() as f64,
        2_500_000.0 - 2.5758 * sd,
        epsilon = 3.0
    );
    assert_abs_diff_eq!(*band.end() as f64, 2_500_000.0 + 2.5758 * sd, epsilon = 3.0);
    for p in [-0.1, 1.1, f64::NAN] {
        assert!(binomial_band_99(10, p).is_err());
    }
    assert!(binomial_band_99(u64::MAX, 0.5).is_err());
    Ok(())
}

/// The token of the kernels' own f32 rule (`sample::gumbel_key` with
/// `inv_t = 1 / T` in f32, the arithmetic of `sampling_from_logits`).
fn f32_rule_token(row: &[f32], temperature: f32, seed: u64, offset: u64) -> Option<u32> {
    let key = (0..row.len() as u32)
        .map(|j| {
            let x = row[j as usize];
            if is_greedy(temperature) {
                greedy_key(x, j)
            } else {
                let noise = token_noise(seed_key(seed), offset, j);
                gumbel_key(x, 1.0 / temperature, noise, j)
            }
        })
        .max()?;
    is_valid(key).then(|| token(key))
}

#[test]
fn the_kernels_f32_rule_is_within_tolerance() -> TestResult {
    let mut rng = rng("the_kernels_f32_rule_is_within_tolerance");
    let mut m = Mismatches::default();
    let mut differ = 0;
    // Rows of every shape the GPU tests draw.
    for r in 0..700 {
        let mut row = Vec::new();
        let dist = DISTS[r % DISTS.len()];
        push_row(&mut rng, dist, 111, &mut row);
        let t = [0.0, 0.25, 1.0, 3.0][r % 4];
        let (seed, offset) = (rng.random(), rng.random());
        let gpu = f32_rule_token(&row, t, seed, offset);
        differ += usize::from(gpu != sample_gumbel(&row, t, seed, offset)?);
        let agree = tokens_agree(&row, t, seed, offset, gpu);
        m.check(agree.is_ok(), || format!("{dist:?} T = {t}: {agree:?}"));
    }
    // Two-token rows tied up to f32 rounding: the f32 and f64 winners
    // disagree often, and the tolerance must accept every such pair.
    let seed = rng.random();
    for offset in 0..4000u64 {
        let t = [1.0, 0.3, 7.0][offset as usize % 3];
        let g = |j| f64::from(gumbel_from_bits(token_noise(seed_key(seed), offset, j)));
        let row = [0.0, ((g(0) - g(1)) * f64::from(t)) as f32];
        let gpu = f32_rule_token(&row, t, seed, offset);
        differ += usize::from(gpu != sample_gumbel(&row, t, seed, offset)?);
        let agree = tokens_agree(&row, t, seed, offset, gpu);
        m.check(agree.is_ok(), || {
            format!("tie row {row:?} T = {t}: {agree:?}")
        });
    }
    println!("f32 rule and float64 reference differ on {differ} rows");
    assert!(differ > 100, "the tie rows should exercise the tolerance");
    m.assert_none("f32 rule within tolerance");
    Ok(())
}

/// The kernels' 16-bit conversions (used to widen bf16/f16 logits for the
/// top-k/top-p kernels and narrow their masked results back) agree with
/// the `half` crate: every 16-bit pattern widened, and a million random
/// f32 bit patterns (NaNs aside, whose payloads the two keep differently)
/// plus every f32 near a 16-bit value narrowed.
#[test]
fn float16_conversions_agree_with_the_half_crate() {
    use flashsample::kernels::float16::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
    for bits in 0..=u16::MAX {
        let (b, h) = (half::bf16::from_bits(bits), half::f16::from_bits(bits));
        if !b.is_nan() {
            assert_eq!(bf16_to_f32(bits).to_bits(), b.to_f32().to_bits());
        }
        if !h.is_nan() {
            assert_eq!(f16_to_f32(bits).to_bits(), h.to_f32().to_bits());
        }
    }
    let mut rng = common::rng("float16_conversions_agree_with_the_half_crate");
    let near = (0..=u16::MAX).flat_map(|bits| {
        let x = f16_to_f32(bits).to_bits();
        [
            x.wrapping_sub(1),
            x,
            x.wrapping_add(1),
            x.wrapping_add(1 << 12),
        ]
    });
    let random: Vec<u32> = (0..1_000_000).map(|_| rng.random()).collect();
    for x in near
        .chain(random)
        .map(f32::from_bits)
        .filter(|x| !x.is_nan())
    {
        assert_eq!(f32_to_bf16(x), half::bf16::from_f32(x).to_bits(), "{x:e}");
        assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits(), "{x:e}");
    }
}
