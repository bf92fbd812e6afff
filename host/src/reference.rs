//! The float64 CPU reference: the oracle every GPU test compares against, and
//! a usable (slow, exact) CPU backend.
//!
//! Every random number comes from the kernels crate's portable math
//! ([`flashsample_kernels::philox`], [`flashsample_kernels::noise`]), so the
//! reference draws the very bits the GPU draws; everything computed from
//! them (scores, probabilities, cumulative masses) is float64.
//!
//! # Semantics
//!
//! - **Total order**: value descending, then index ascending. NaN ranks with
//!   -inf, and -0.0 ranks just below +0.0 (IEEE 754 `totalOrder`, the order
//!   of [`flashsample_kernels::radix::f32_key`] that the kernels' greedy keys
//!   use; the two zeros carry the same probability, so only the order of
//!   ties between them depends on it).
//! - **Greedy**: temperature `<= 0` or NaN ([`is_greedy`]) picks the first
//!   entry of the total order (argmax, lowest index on ties). A greedy row's
//!   kept set is that one token, its probabilities are one-hot there.
//! - **Gumbel-max**: token `j` scores `x_j / T + g_j` with `g_j` the Gumbel
//!   noise of the row's Philox stream at `(seed, offset, j)`. Classes rank
//!   above scores: +inf logits form a class above every finite one and score
//!   `g_j` alone (the row samples uniformly among them); NaN and -inf are
//!   never chosen. A row with nothing finite and no +inf is invalid (`None`).
//! - **Softmax**: `softmax(x / T)`; +inf entries share the mass evenly; NaN
//!   and -inf get 0; a greedy row is one-hot at its argmax; a row with no
//!   valid entry is all zeros.
//!
//! # Truncation order
//!
//! vLLM v1's sampler: **temperature, then min-p, then top-k, then top-p**.
//!
//! 1. min-p keeps `p_i >= min_p * p_max` (`min_p = 0` keeps everything).
//! 2. top-k keeps exactly `k` elements in the total order (ties at the k-th
//!    value go to the lower indices); `k = 0` or `k >= V` is off.
//! 3. top-p works on the mass that survived 1 and 2: it keeps element `i` iff
//!    the mass strictly before `i` in the total order is `< p * survivors'
//!    mass` (the shortest prefix whose *exclusive* mass is below the
//!    threshold; the first element is always kept). `p = 1` is off.
//!
//! Each filter keeps a prefix of the total order, so the kept set is one
//! too, and min-p and top-k commute. top-p does not commute with them:
//! SGLang applies min-p *last*, after top-p measured the mass of the whole
//! row, which can keep more tokens than this order does (see the tests).
//! With every filter off the kept set is the whole row (zero-probability
//! entries included); a row with no valid entry keeps nothing.
//!
//! The inverse-CDF sampler ([`sample_top_k_top_p`]) draws the row's first
//! per-row uniform `u` and returns the first kept token (in the total order)
//! whose cumulative renormalised probability exceeds `u`.
//!
//! # Errors
//!
//! Every entry point validates its arguments and returns a
//! [`ReferenceError`]: nothing here panics on user input.
//!
//! # Example
//!
//! ```
//! use flashsample::reference::{self, SamplingParams};
//!
//! let row = [1.0f32, 3.0, 3.0, f32::NAN, 2.0];
//! let params = SamplingParams { top_k: 3, ..SamplingParams::default() };
//! assert_eq!(reference::kept_set(&row, &params)?, vec![1, 2, 4]);
//! let token = reference::sample_top_k_top_p(&row, &params)?;
//! assert!(matches!(token, Some(1 | 2 | 4)));
//! assert_eq!(reference::argmax(&row)?, Some(1));
//! # Ok::<(), reference::ReferenceError>(())
//! ```

use std::cmp::Reverse;

use flashsample_kernels::noise::{gumbel_from_bits, uniform_open};
use flashsample_kernels::philox::{row_uniform_bits, seed_key, token_noise_group};
use flashsample_kernels::radix::f32_key;
use flashsample_kernels::sample::{MAX_VOCAB, is_greedy, logit_class};

/// Relative move of the top-p threshold within which a kept/unkept decision
/// counts as "near the boundary" (DESIGN: the GPU may differ from the
/// float64 reference by one element only there).
pub const TOP_P_BOUNDARY_REL: f64 = 1.0e-6;

/// A bound on the magnitude of the Gumbel noise
/// ([`flashsample_kernels::noise::GUMBEL_MAX`] = 22.88, rounded up).
const NOISE_BOUND: f64 = 23.0;

/// Wrong arguments to a reference entry point.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReferenceError {
    /// A buffer has the wrong number of elements.
    #[error("{what}: expected {expected} elements, got {got}")]
    Shape {
        /// Which buffer.
        what: &'static str,
        /// Elements the other arguments call for.
        expected: usize,
        /// Elements it has.
        got: usize,
    },
    /// A parameter is outside its domain.
    #[error("invalid parameter {name} = {value}")]
    InvalidParam {
        /// Which parameter.
        name: &'static str,
        /// Its value (widened to f64, exact for every argument type here).
        value: f64,
    },
}

/// The sampling parameters of one row.
///
/// The default samples the full distribution at temperature 1 with seed 0
/// and offset 0; set fields with struct-update syntax:
///
/// ```
/// use flashsample::reference::SamplingParams;
///
/// let p = SamplingParams { top_k: 50, top_p: 0.9, seed: 7, ..SamplingParams::default() };
/// assert!(p.validate().is_ok());
/// assert!(SamplingParams { top_p: 0.0, ..p }.validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` or NaN samples greedily.
    pub temperature: f32,
    /// Keep the `top_k` first tokens of the total order; 0 or `>= vocab` is off.
    pub top_k: u32,
    /// Nucleus mass in `(0, 1]`; 1 is off.
    pub top_p: f32,
    /// Keep tokens with `p_i >= min_p * p_max`; in `[0, 1]`, 0 is off.
    pub min_p: f32,
    /// The row's 64-bit Philox seed.
    pub seed: u64,
    /// The row's Philox offset.
    pub offset: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            offset: 0,
        }
    }
}

impl SamplingParams {
    /// Rejects `top_p` outside `(0, 1]` and `min_p` outside `[0, 1]` (NaN
    /// included). Every temperature and every `top_k` is valid.
    pub fn validate(&self) -> Result<(), ReferenceError> {
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ReferenceError::InvalidParam {
                name: "top_p",
                value: self.top_p.into(),
            });
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(ReferenceError::InvalidParam {
                name: "min_p",
                value: self.min_p.into(),
            });
        }
        Ok(())
    }
}

/// Rejects an empty vocabulary or one above [`MAX_VOCAB`].
fn check_vocab(vocab: usize) -> Result<(), ReferenceError> {
    if vocab == 0 || vocab as u64 > MAX_VOCAB {
        return Err(ReferenceError::InvalidParam {
            name: "vocab",
            value: vocab as f64,
        });
    }
    Ok(())
}

/// Indices of a row (already checked by [`check_vocab`]) in the total order.
fn total_order(row: &[f32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    order.sort_unstable_by_key(|&j| (Reverse(f32_key(row[j as usize].to_bits())), j));
    order
}

/// Unnormalised probabilities `w_i = exp((x_i - x_max) / T)` (so the
/// largest is 1), one-hot at `order[0]` for a greedy row, 1 on every +inf
/// entry of a row that has one; `None` for a row with no valid entry.
fn weights(row: &[f32], temperature: f32, order: &[u32]) -> Option<Vec<f64>> {
    let top = order[0] as usize;
    let max = row[top];
    if logit_class(max) == 0 {
        return None;
    }
    if is_greedy(temperature) {
        let mut w = vec![0.0; row.len()];
        w[top] = 1.0;
        return Some(w);
    }
    if max == f32::INFINITY {
        return Some(
            row.iter()
                .map(|&x| if x == f32::INFINITY { 1.0 } else { 0.0 })
                .collect(),
        );
    }
    let (max, t) = (f64::from(max), f64::from(temperature));
    Some(
        row.iter()
            .map(|&x| {
                if logit_class(x) == 1 {
                    ((f64::from(x) - max) / t).exp()
                } else {
                    0.0
                }
            })
            .collect(),
    )
}

/// How many of `prefix` top-p keeps, with the threshold `top_p * mass`
/// scaled by `scale` (1 for the cut itself, `1 +- TOP_P_BOUNDARY_REL` for
/// its neighbourhood). The mass is summed in the total order, so the last
/// cumulative sum equals it exactly.
fn top_p_len(prefix: &[u32], w: &[f64], top_p: f32, scale: f64) -> usize {
    if top_p >= 1.0 {
        return prefix.len();
    }
    let mass: f64 = prefix.iter().map(|&j| w[j as usize]).sum();
    let threshold = f64::from(top_p) * mass * scale;
    let mut before = 0.0;
    prefix
        .iter()
        .take_while(|&&j| {
            let keep = before < threshold;
            before += w[j as usize];
            keep
        })
        .count()
}

/// A valid row after truncation: its kept set is `order[..kept]`.
struct Truncation {
    order: Vec<u32>,
    weights: Vec<f64>,
    /// Elements left by min-p and top-k (the prefix top-p works on).
    survivors: usize,
    kept: usize,
}

impl Truncation {
    /// `None` for a row with no valid entry.
    fn new(row: &[f32], params: &SamplingParams) -> Result<Option<Truncation>, ReferenceError> {
        params.validate()?;
        check_vocab(row.len())?;
        let order = total_order(row);
        let Some(weights) = weights(row, params.temperature, &order) else {
            return Ok(None);
        };
        let (survivors, kept) = if is_greedy(params.temperature) {
            (1, 1)
        } else {
            // p_i >= min_p * p_max  <=>  w_i >= min_p * w_max (same normaliser).
            let min_w = f64::from(params.min_p) * weights[order[0] as usize];
            let mut survivors = order
                .iter()
                .take_while(|&&j| weights[j as usize] >= min_w)
                .count();
            if params.top_k != 0 {
                survivors = survivors.min(params.top_k as usize);
            }
            (
                survivors,
                top_p_len(&order[..survivors], &weights, params.top_p, 1.0),
            )
        };
        Ok(Some(Truncation {
            order,
            weights,
            survivors,
            kept,
        }))
    }

    fn kept(&self) -> &[u32] {
        &self.order[..self.kept]
    }

    /// Mass of the kept set, summed in the total order.
    fn kept_mass(&self) -> f64 {
        self.kept().iter().map(|&j| self.weights[j as usize]).sum()
    }

    /// The kept-set sizes top-p could produce with its threshold anywhere
    /// within `1 +- TOP_P_BOUNDARY_REL` of its value (a greedy row's one
    /// survivor is always kept).
    fn top_p_range(&self, top_p: f32) -> (usize, usize) {
        let prefix = &self.order[..self.survivors];
        let len = |scale| top_p_len(prefix, &self.weights, top_p, scale);
        (len(1.0 - TOP_P_BOUNDARY_REL), len(1.0 + TOP_P_BOUNDARY_REL))
    }
}

/// The greedy token of a row: the first entry of the total order (argmax,
/// lowest index on ties, NaN as -inf, +0.0 above -0.0); `None` when the row
/// has nothing finite and no +inf.
///
/// ```
/// use flashsample::reference::argmax;
///
/// assert_eq!(argmax(&[2.0, 5.0, 5.0])?, Some(1));
/// assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY])?, None);
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn argmax(row: &[f32]) -> Result<Option<u32>, ReferenceError> {
    check_vocab(row.len())?;
    let best = (0..row.len() as u32)
        .max_by_key(|&j| (f32_key(row[j as usize].to_bits()), Reverse(j)))
        .filter(|&j| logit_class(row[j as usize]) != 0);
    Ok(best)
}

/// The kept set of a row after min-p, top-k and top-p, in the total order.
/// Greedy rows keep their argmax; rows with no valid entry keep nothing.
pub fn kept_set(row: &[f32], params: &SamplingParams) -> Result<Vec<u32>, ReferenceError> {
    Ok(Truncation::new(row, params)?
        .map(|t| t.kept().to_vec())
        .unwrap_or_default())
}

/// The row with every token outside the kept set replaced by -inf; kept
/// tokens keep their value bit for bit (a kept NaN stays NaN: only a row
/// with its filters off, or with fewer valid entries than `top_k`, keeps one).
pub fn masked_logits(row: &[f32], params: &SamplingParams) -> Result<Vec<f32>, ReferenceError> {
    let mut out = vec![f32::NEG_INFINITY; row.len()];
    if let Some(t) = Truncation::new(row, params)? {
        for &j in t.kept() {
            out[j as usize] = row[j as usize];
        }
    }
    Ok(out)
}

/// Probabilities renormalised over the kept set (0 outside it); all zeros
/// for a row with no valid entry, one-hot for a greedy row.
pub fn probabilities(row: &[f32], params: &SamplingParams) -> Result<Vec<f64>, ReferenceError> {
    let mut out = vec![0.0; row.len()];
    if let Some(t) = Truncation::new(row, params)? {
        let mass = t.kept_mass();
        for &j in t.kept() {
            out[j as usize] = t.weights[j as usize] / mass;
        }
    }
    Ok(out)
}

/// `softmax(x / T)` of a row in float64: [`probabilities`] with no
/// truncation.
///
/// ```
/// use flashsample::reference::softmax;
///
/// let p = softmax(&[0.0, 2.0f32.ln(), f32::INFINITY, f32::NAN], 1.0)?;
/// assert_eq!(p, vec![0.0, 0.0, 1.0, 0.0]);
/// let p = softmax(&[0.0, 2.0f32.ln()], 1.0)?;
/// assert!((p[1] - 2.0 / 3.0).abs() < 1e-7);
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn softmax(row: &[f32], temperature: f32) -> Result<Vec<f64>, ReferenceError> {
    probabilities(
        row,
        &SamplingParams {
            temperature,
            ..SamplingParams::default()
        },
    )
}

/// One token by inverse CDF over the kept set: `u` is the row's first
/// per-row uniform (`uniform_open(row_uniform_bits(seed_key(seed), offset,
/// 0))`); the kept set is walked in the total order, accumulating
/// renormalised probabilities in f64, and the first token whose cumulative
/// mass exceeds `u` is returned (the last kept token if rounding leaves the
/// sum at or below `u`). Greedy rows return their argmax; rows with no
/// valid entry `None`.
pub fn sample_top_k_top_p(
    row: &[f32],
    params: &SamplingParams,
) -> Result<Option<u32>, ReferenceError> {
    let Some(t) = Truncation::new(row, params)? else {
        return Ok(None);
    };
    let u = f64::from(uniform_open(row_uniform_bits(
        seed_key(params.seed),
        params.offset,
        0,
    )));
    let mass = t.kept_mass();
    let mut cumulative = 0.0;
    for &j in t.kept() {
        cumulative += t.weights[j as usize] / mass;
        if cumulative > u {
            return Ok(Some(j));
        }
    }
    Ok(t.kept().last().copied())
}

/// Whether the row's top-p cut is near its boundary: whether any kept/unkept
/// decision changes when the threshold `top_p * mass` moves by
/// [`TOP_P_BOUNDARY_REL`] (relative) either way. Only there may a GPU kept
/// set differ from [`kept_set`]. Always false when top-p is off, for greedy
/// rows and for rows with no valid entry.
pub fn top_p_near_boundary(row: &[f32], params: &SamplingParams) -> Result<bool, ReferenceError> {
    Ok(Truncation::new(row, params)?
        .is_some_and(|t| t.top_p_range(params.top_p) != (t.kept, t.kept)))
}

/// Checks a GPU kept set (any order) against the reference: equal as sets,
/// or, when the top-p cut is near its boundary ([`top_p_near_boundary`]),
/// equal to a prefix of the total order that a threshold within
/// `1 +- TOP_P_BOUNDARY_REL` of the exact one would keep. The error names
/// the sizes and the first differing tokens with their bit patterns.
pub fn kept_sets_agree(row: &[f32], params: &SamplingParams, gpu: &[u32]) -> Result<(), String> {
    let t = Truncation::new(row, params).map_err(|e| e.to_string())?;
    let mut gpu_sorted = gpu.to_vec();
    gpu_sorted.sort_unstable();
    let (order, kept, (lo, hi)) = match &t {
        Some(t) => (t.order.as_slice(), t.kept, t.top_p_range(params.top_p)),
        None => (&[][..], 0, (0, 0)),
    };
    let set_of = |n: usize| {
        let mut s = order[..n].to_vec();
        s.sort_unstable();
        s
    };
    if (lo.min(kept)..=hi.max(kept)).any(|n| set_of(n) == gpu_sorted) {
        return Ok(());
    }
    let reference = set_of(kept);
    let bits = |j: u32| {
        row.get(j as usize).map_or_else(
            || "out of range".to_string(),
            |x| format!("{x:e} ({:#010x})", x.to_bits()),
        )
    };
    let missing: Vec<String> = reference
        .iter()
        .filter(|j| gpu_sorted.binary_search(j).is_err())
        .take(4)
        .map(|&j| format!("{j}: {}", bits(j)))
        .collect();
    let extra: Vec<String> = gpu_sorted
        .iter()
        .filter(|j| reference.binary_search(j).is_err())
        .take(4)
        .map(|&j| format!("{j}: {}", bits(j)))
        .collect();
    Err(format!(
        "kept sets differ: reference keeps {kept} (top-p may keep {lo}..={hi}), GPU {}; \
         missing from GPU [{}], extra in GPU [{}]",
        gpu.len(),
        missing.join(", "),
        extra.join(", ")
    ))
}

/// The Gumbel-max scores of a row: `x_j / T + g_j` in f64 for finite `x_j`,
/// `g_j` alone for +inf (whose class ranks above every finite score), -inf
/// for NaN and -inf (never chosen). `g_j` is
/// `gumbel_from_bits(token_noise(seed_key(seed), offset, j))` widened to
/// f64, bit-identical to the GPU's noise. A greedy row's scores are its
/// logits (NaN as -inf).
///
/// ```
/// use flashsample::kernels::{noise, philox};
/// use flashsample::reference::gumbel_scores;
///
/// let s = gumbel_scores(&[1.5, f32::INFINITY, f32::NAN], 0.5, 42, 7)?;
/// let g = |j| f64::from(noise::gumbel_from_bits(philox::token_noise(philox::seed_key(42), 7, j)));
/// assert_eq!(s, vec![3.0 + g(0), g(1), f64::NEG_INFINITY]);
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn gumbel_scores(
    row: &[f32],
    temperature: f32,
    seed: u64,
    offset: u64,
) -> Result<Vec<f64>, ReferenceError> {
    check_vocab(row.len())?;
    if is_greedy(temperature) {
        return Ok(row
            .iter()
            .map(|&x| {
                if logit_class(x) == 0 {
                    f64::NEG_INFINITY
                } else {
                    f64::from(x)
                }
            })
            .collect());
    }
    let key = seed_key(seed);
    let t = f64::from(temperature);
    let scores = row
        .chunks(4)
        .zip(0u32..)
        .flat_map(|(xs, group)| xs.iter().zip(token_noise_group(key, offset, group)))
        .map(|(&x, bits)| {
            let g = f64::from(gumbel_from_bits(bits));
            match logit_class(x) {
                1 => f64::from(x) / t + g,
                2 => g,
                _ => f64::NEG_INFINITY,
            }
        })
        .collect();
    Ok(scores)
}

/// The winner of a Gumbel-max race over `scores` (from [`gumbel_scores`] of a
/// non-greedy row): highest class, then highest score, then lowest index.
fn gumbel_winner(row: &[f32], scores: &[f64]) -> Option<u32> {
    let mut best: Option<(u32, f64, u32)> = None;
    for (j, (&x, &s)) in (0u32..).zip(row.iter().zip(scores)) {
        let class = logit_class(x);
        let better = match best {
            None => class != 0,
            Some((bc, bs, _)) => class > bc || (class == bc && s > bs),
        };
        if better {
            best = Some((class, s, j));
        }
    }
    best.map(|(_, _, j)| j)
}

/// One token by Gumbel-max in float64 (see [`gumbel_scores`]); the argmax
/// for a greedy row; `None` for a row with nothing finite and no +inf.
pub fn sample_gumbel(
    row: &[f32],
    temperature: f32,
    seed: u64,
    offset: u64,
) -> Result<Option<u32>, ReferenceError> {
    if is_greedy(temperature) {
        return argmax(row);
    }
    let scores = gumbel_scores(row, temperature, seed, offset)?;
    Ok(gumbel_winner(row, &scores))
}

/// Checks a GPU Gumbel-max token (`None`: the GPU reported the row invalid)
/// against the float64 reference.
///
/// Accepted: the reference token itself; or, for a non-greedy row, a token
/// of the same class (both finite) whose f64 score `s_gpu` is within
/// rounding of the reference token's score `s_ref`:
///
/// `|s_ref - s_gpu| <= 8 eps max(1, |s_ref|, |x_ref / T|, |x_gpu / T|) + 8 eps * 23`
///
/// with `eps = f32::EPSILON`. Why: the GPU computes each score in f32 as
/// `x * (1 / T) + g` with the noise `g` bit-identical to the reference's.
/// `1 / T` and the product each round by at most `eps / 2` relative, the sum
/// by `eps / 2` of its magnitude, so each GPU score is within about
/// `eps |x / T| + (eps / 2) |s|` of its exact f64 value (less when the
/// compiler fuses the multiply-add); the GPU can prefer the other token only
/// if the two exact scores differ by at most the sum of both errors, and
/// `|s| <= |x / T| + 23` (`|g| <= GUMBEL_MAX < 23`). The bound above covers
/// that sum with a factor of more than two to spare. It does not cover
/// what f32 cannot represent: `T < 1 / f32::MAX` (the GPU's `1 / T`
/// overflows) or `|x / T| > f32::MAX`.
///
/// Never accepted: a class difference (+inf against finite, a valid token
/// against an invalid row), a different token on a greedy row (the keys
/// involve no arithmetic), or a different token among +inf entries (their
/// scores are the bit-identical noise alone).
pub fn tokens_agree(
    row: &[f32],
    temperature: f32,
    seed: u64,
    offset: u64,
    gpu_token: Option<u32>,
) -> Result<(), String> {
    let scores = gumbel_scores(row, temperature, seed, offset).map_err(|e| e.to_string())?;
    let reference = if is_greedy(temperature) {
        argmax(row).map_err(|e| e.to_string())?
    } else {
        gumbel_winner(row, &scores)
    };
    let (r, g) = match (reference, gpu_token) {
        (None, None) => return Ok(()),
        (Some(r), Some(g)) if r == g => return Ok(()),
        (Some(r), Some(g)) => (r, g),
        (r, g) => {
            return Err(format!(
                "reference token {r:?}, GPU token {g:?} (None: invalid row)"
            ));
        }
    };
    let (Some(&x_r), Some(&x_g)) = (row.get(r as usize), row.get(g as usize)) else {
        return Err(format!(
            "GPU token {g} is outside the vocabulary of {}",
            row.len()
        ));
    };
    let describe = |j: u32, x: f32| {
        format!(
            "token {j} (x = {x:e} = {:#010x}, score {:e})",
            x.to_bits(),
            scores[j as usize]
        )
    };
    let (ref_desc, gpu_desc) = (describe(r, x_r), describe(g, x_g));
    if is_greedy(temperature) {
        return Err(format!("greedy row: reference {ref_desc}, GPU {gpu_desc}"));
    }
    let (class_r, class_g) = (logit_class(x_r), logit_class(x_g));
    if class_r != class_g || class_r != 1 {
        return Err(format!(
            "class {class_r} reference {ref_desc}, class {class_g} GPU {gpu_desc}"
        ));
    }
    let t = f64::from(temperature);
    let (s_r, s_g) = (scores[r as usize], scores[g as usize]);
    let eps = f64::from(f32::EPSILON);
    let scale = 1f64
        .max(s_r.abs())
        .max((f64::from(x_r) / t).abs())
        .max((f64::from(x_g) / t).abs());
    let bound = 8.0 * eps * scale + 8.0 * eps * NOISE_BOUND;
    if (s_r - s_g).abs() <= bound {
        Ok(())
    } else {
        Err(format!(
            "reference {ref_desc}, GPU {gpu_desc}: score gap {:e} exceeds {bound:e}",
            s_r - s_g
        ))
    }
}

/// Splits a row-major `[batch, vocab]` buffer into its rows after checking
/// the vocabulary and that `logits` holds exactly `batch * vocab` elements.
fn rows(
    logits: &[f32],
    vocab: usize,
    batch: usize,
) -> Result<std::slice::Chunks<'_, f32>, ReferenceError> {
    check_vocab(vocab)?;
    let expected = batch
        .checked_mul(vocab)
        .ok_or(ReferenceError::InvalidParam {
            name: "batch",
            value: batch as f64,
        })?;
    if logits.len() != expected {
        return Err(ReferenceError::Shape {
            what: "logits",
            expected,
            got: logits.len(),
        });
    }
    Ok(logits.chunks(vocab))
}

/// Applies a row function to every row of a `[params.len(), vocab]` buffer.
fn map_rows<T>(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
    f: impl Fn(&[f32], &SamplingParams) -> Result<T, ReferenceError>,
) -> Result<Vec<T>, ReferenceError> {
    rows(logits, vocab, params.len())?
        .zip(params)
        .map(|(row, p)| f(row, p))
        .collect()
}

/// [`kept_set`] of every row of a row-major `[params.len(), vocab]` buffer.
///
/// ```
/// use flashsample::reference::{SamplingParams, kept_sets};
///
/// let logits = [0.0f32, 1.0, 2.0, 9.0, 8.0, 7.0];
/// let params = [SamplingParams { top_k: 2, ..SamplingParams::default() }; 2];
/// assert_eq!(kept_sets(&logits, 3, &params)?, vec![vec![2, 1], vec![0, 1]]);
/// assert!(kept_sets(&logits, 4, &params).is_err());
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn kept_sets(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
) -> Result<Vec<Vec<u32>>, ReferenceError> {
    map_rows(logits, vocab, params, kept_set)
}

/// [`masked_logits`] of every row, row-major `[params.len(), vocab]`.
pub fn masked_logits_batch(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
) -> Result<Vec<f32>, ReferenceError> {
    Ok(map_rows(logits, vocab, params, masked_logits)?.concat())
}

/// [`probabilities`] of every row, row-major `[params.len(), vocab]`.
pub fn probabilities_batch(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
) -> Result<Vec<f64>, ReferenceError> {
    Ok(map_rows(logits, vocab, params, probabilities)?.concat())
}

/// [`sample_top_k_top_p`] of every row of a `[params.len(), vocab]` buffer.
pub fn sample_top_k_top_p_batch(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
) -> Result<Vec<Option<u32>>, ReferenceError> {
    map_rows(logits, vocab, params, sample_top_k_top_p)
}

/// [`softmax`] of every row of a `[temperature.len(), vocab]` buffer,
/// row-major.
pub fn softmax_batch(
    logits: &[f32],
    vocab: usize,
    temperature: &[f32],
) -> Result<Vec<f64>, ReferenceError> {
    let rows = rows(logits, vocab, temperature.len())?;
    let probs: Result<Vec<Vec<f64>>, _> = rows
        .zip(temperature)
        .map(|(row, &t)| softmax(row, t))
        .collect();
    Ok(probs?.concat())
}

/// [`sample_gumbel`] of every row of a `[temperature.len(), vocab]` buffer,
/// with per-row temperature, seed and offset (the arguments of the GPU's
/// `sampling_from_logits`).
///
/// ```
/// use flashsample::reference::{sample_gumbel, sample_gumbel_batch};
///
/// let logits = [0.5f32, 0.1, f32::NAN, f32::NEG_INFINITY];
/// let tokens = sample_gumbel_batch(&logits, 2, &[1.0, 1.0], &[3, 3], &[0, 1])?;
/// assert_eq!(tokens[0], sample_gumbel(&logits[..2], 1.0, 3, 0)?);
/// assert_eq!(tokens[1], None);
/// assert!(sample_gumbel_batch(&logits, 2, &[1.0, 1.0], &[3], &[0, 1]).is_err());
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn sample_gumbel_batch(
    logits: &[f32],
    vocab: usize,
    temperature: &[f32],
    seed: &[u64],
    offset: &[u64],
) -> Result<Vec<Option<u32>>, ReferenceError> {
    let batch = temperature.len();
    for (what, len) in [("seed", seed.len()), ("offset", offset.len())] {
        if len != batch {
            return Err(ReferenceError::Shape {
                what,
                expected: batch,
                got: len,
            });
        }
    }
    rows(logits, vocab, batch)?
        .enumerate()
        .map(|(r, row)| sample_gumbel(row, temperature[r], seed[r], offset[r]))
        .collect()
}

/// Statistics for the sampling tests: chi-square goodness of fit and
/// binomial bands, with no dependency beyond `std`.
pub mod stats {
    use std::ops::RangeInclusive;

    use super::ReferenceError;

    /// Bins whose expected count is below this are pooled into one bin
    /// before the chi-square statistic is formed.
    pub const MIN_EXPECTED: f64 = 5.0;

    /// Result of a chi-square goodness-of-fit test.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct ChiSquare {
        /// `sum (observed - expected)^2 / expected` over the (pooled) bins;
        /// +inf when a bin of probability 0 was observed.
        pub statistic: f64,
        /// Degrees of freedom: bins with positive expectation, minus one.
        pub dof: usize,
        /// Probability of a statistic at least this large under the
        /// hypothesis.
        pub p_value: f64,
    }

    /// Chi-square test of `observed` counts against `probabilities` (any
    /// non-negative weights; normalised here). Bins expected below
    /// [`MIN_EXPECTED`] times are pooled into one; bins of probability 0 are
    /// left out unless observed, which makes the statistic +inf and the
    /// p-value 0.
    ///
    /// ```
    /// use flashsample::reference::stats::chi_square;
    ///
    /// let fit = chi_square(&[260, 240, 500], &[0.25, 0.25, 0.5])?;
    /// assert_eq!(fit.dof, 2);
    /// assert!((fit.statistic - 0.8).abs() < 1e-12);
    /// assert!(fit.p_value > 0.5);
    /// assert_eq!(chi_square(&[1, 9], &[0.0, 1.0])?.p_value, 0.0);
    /// # Ok::<(), flashsample::reference::ReferenceError>(())
    /// ```
    pub fn chi_square(
        observed: &[u64],
        probabilities: &[f64],
    ) -> Result<ChiSquare, ReferenceError> {
        if probabilities.len() != observed.len() {
            return Err(ReferenceError::Shape {
                what: "probabilities",
                expected: observed.len(),
                got: probabilities.len(),
            });
        }
        if let Some(&p) = probabilities
            .iter()
            .find(|p| !(p.is_finite() && **p >= 0.0))
        {
            return Err(ReferenceError::InvalidParam {
                name: "probability",
                value: p,
            });
        }
        let total_p: f64 = probabilities.iter().sum();
        let draws: u64 = observed.iter().sum();
        if total_p == 0.0 || draws == 0 {
            return Err(ReferenceError::InvalidParam {
                name: "draws",
                value: draws as f64,
            });
        }
        let n = draws as f64;
        let (mut statistic, mut bins) = (0.0, 0usize);
        let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
        for (&o, &p) in observed.iter().zip(probabilities) {
            let (o, e) = (o as f64, n * p / total_p);
            if e == 0.0 {
                if o > 0.0 {
                    return Ok(ChiSquare {
                        statistic: f64::INFINITY,
                        dof: 0,
                        p_value: 0.0,
                    });
                }
            } else if e < MIN_EXPECTED {
                pooled_o += o;
                pooled_e += e;
            } else {
                statistic += (o - e) * (o - e) / e;
                bins += 1;
            }
        }
        if pooled_e > 0.0 {
            statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
            bins += 1;
        }
        let dof = bins.saturating_sub(1);
        let p_value = if dof == 0 {
            1.0
        } else {
            chi_square_p_value(statistic, dof)
        };
        Ok(ChiSquare {
            statistic,
            dof,
            p_value,
        })
    }

    /// Upper tail `P(X >= statistic)` of a chi-square distribution with
    /// `dof` degrees of freedom: `Q(dof / 2, statistic / 2)`. NaN for
    /// `dof = 0` or a NaN statistic.
    ///
    /// ```
    /// use flashsample::reference::stats::chi_square_p_value;
    ///
    /// assert!((chi_square_p_value(3.841_458_820_694_124, 1) - 0.05).abs() < 1e-12);
    /// ```
    pub fn chi_square_p_value(statistic: f64, dof: usize) -> f64 {
        regularized_upper_gamma(dof as f64 / 2.0, statistic / 2.0)
    }

    /// The regularised upper incomplete gamma function
    /// `Q(a, x) = Gamma(a, x) / Gamma(a)` for `a > 0`, `x >= 0` (NaN
    /// elsewhere): a power series for `x < a + 1`, Lentz's continued fraction
    /// beyond (Numerical Recipes, 6.2), both to f64 precision.
    ///
    /// ```
    /// use flashsample::reference::stats::regularized_upper_gamma;
    ///
    /// assert!((regularized_upper_gamma(1.0, 2.0) - (-2.0f64).exp()).abs() < 1e-15);
    /// ```
    pub fn regularized_upper_gamma(a: f64, x: f64) -> f64 {
        const MAX_ITER: usize = 100_000;
        if !(a > 0.0 && a.is_finite() && x >= 0.0) {
            return f64::NAN;
        }
        if x == 0.0 {
            return 1.0;
        }
        if x == f64::INFINITY {
            return 0.0;
        }
        let prefactor = (a * x.ln() - x - ln_gamma(a)).exp();
        if x < a + 1.0 {
            // P(a, x) = x^a e^-x / Gamma(a + 1) * sum_n x^n / ((a + 1) ... (a + n)).
            let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
            for _ in 0..MAX_ITER {
                ap += 1.0;
                term *= x / ap;
                sum += term;
                if term.abs() < sum.abs() * f64::EPSILON {
                    break;
                }
            }
            1.0 - sum * prefactor
        } else {
            // Q(a, x) = x^a e^-x / Gamma(a) * 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - ...)).
            let tiny = f64::MIN_POSITIVE / f64::EPSILON;
            let mut b = x + 1.0 - a;
            let mut c = 1.0 / tiny;
            let mut d = 1.0 / b;
            let mut h = d;
            for i in 1..MAX_ITER {
                let an = -(i as f64) * (i as f64 - a);
                b += 2.0;
                d = an * d + b;
                if d.abs() < tiny {
                    d = tiny;
                }
                c = b + an / c;
                if c.abs() < tiny {
                    c = tiny;
                }
                d = 1.0 / d;
                let delta = d * c;
                h *= delta;
                if (delta - 1.0).abs() < f64::EPSILON {
                    break;
                }
            }
            prefactor * h
        }
    }

    /// `ln Gamma(x)` for `x > 0`: Lanczos (g = 7, 9 terms, relative error
    /// about 1e-15), with the reflection formula below 1/2.
    fn ln_gamma(x: f64) -> f64 {
        const G: f64 = 7.0;
        const C: [f64; 9] = [
            0.999_999_999_999_809_9,
            676.520_368_121_885_1,
            -1_259.139_216_722_402_8,
            771.323_428_777_653_1,
            -176.615_029_162_140_6,
            12.507_343_278_686_905,
            -0.138_571_095_265_720_12,
            9.984_369_578_019_572e-6,
            1.505_632_735_149_311_6e-7,
        ];
        if x < 0.5 {
            let pi = std::f64::consts::PI;
            return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
        }
        let x = x - 1.0;
        let sum = C[1..]
            .iter()
            .zip(1..)
            .fold(C[0], |s, (&c, i)| s + c / (x + f64::from(i)));
        let t = x + G + 0.5;
        0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
    }

    /// The central 99 % band of a Binomial(n, p) count: the largest `lo`
    /// and smallest `hi` with `P(X < lo) <= 0.005` and `P(X > hi) <= 0.005`,
    /// from the exact probabilities (summed outward from the mode, where
    /// terms below 1e-20 of the mode's are dropped). A count outside it
    /// happens with probability at most 1 %. `p` must lie in `[0, 1]` and
    /// `n` be at most 2^36.
    ///
    /// ```
    /// use flashsample::reference::stats::binomial_band_99;
    ///
    /// assert_eq!(binomial_band_99(100, 0.5)?, 37..=63);
    /// assert_eq!(binomial_band_99(10, 0.0)?, 0..=0);
    /// assert!(binomial_band_99(10, 1.5).is_err());
    /// # Ok::<(), flashsample::reference::ReferenceError>(())
    /// ```
    pub fn binomial_band_99(n: u64, p: f64) -> Result<RangeInclusive<u64>, ReferenceError> {
        const TAIL: f64 = 0.005;
        const NEGLIGIBLE: f64 = 1.0e-20;
        // Keeps the tables of terms (about 20 standard deviations) small.
        const MAX_N: u64 = 1 << 36;
        if !(0.0..=1.0).contains(&p) {
            return Err(ReferenceError::InvalidParam {
                name: "p",
                value: p,
            });
        }
        if n > MAX_N {
            return Err(ReferenceError::InvalidParam {
                name: "n",
                value: n as f64,
            });
        }
        if p == 0.0 || p == 1.0 || n == 0 {
            let k = if p == 1.0 { n } else { 0 };
            return Ok(k..=k);
        }
        let nf = n as f64;
        let mode = (((nf + 1.0) * p).floor() as u64).min(n);
        let odds = p / (1.0 - p);
        // Unnormalised probabilities, mode first, then outward each way.
        let mut below = Vec::new();
        let (mut k, mut term) = (mode, 1.0);
        while k > 0 && term >= NEGLIGIBLE {
            term *= k as f64 / ((nf - k as f64 + 1.0) * odds);
            k -= 1;
            below.push(term);
        }
        let mut above = Vec::new();
        let (mut k, mut term) = (mode, 1.0);
        while k < n && term >= NEGLIGIBLE {
            term *= (nf - k as f64) * odds / (k as f64 + 1.0);
            k += 1;
            above.push(term);
        }
        let total = 1.0 + below.iter().sum::<f64>() + above.iter().sum::<f64>();
        // Walk each tail inward from its far end while it stays below TAIL.
        let inward = |tail: &[f64]| {
            tail.iter()
                .rev()
                .scan(0.0, |m, &t| {
                    *m += t / total;
                    Some(*m)
                })
                .take_while(|&m| m <= TAIL)
                .count() as u64
        };
        let lo = mode - below.len() as u64 + inward(&below);
        let hi = mode + above.len() as u64 - inward(&above);
        Ok(lo..=hi)
    }
}

/// The float64 logits of one row of an LM head, `h . W_j (+ b_j)`, from
/// the same (widened) bf16/f16 values a GPU kernel reads, with a bound on how
/// far an f32-accumulating kernel's logit can be from each: products of
/// 16-bit floats are exact in f32, and a sum of `dim` terms accumulated in
/// f32 (any order, round-to-nearest or truncating tensor-core adds) is within
/// `2 dim 2^-23 sum_k |h_k W_jk|` of the exact sum.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadLogits {
    /// Exact (float64) logits, one per vocabulary row.
    pub logits: Vec<f64>,
    /// Bound on the f32 kernel's error for each logit.
    pub error_bound: Vec<f64>,
}

/// [`HeadLogits`] of `hidden` (`dim` values) against `weight`
/// (`[vocab, dim]`, row-major) and an optional `bias` (`vocab` values).
///
/// ```
/// use flashsample::reference::lm_head_logits;
///
/// let head = lm_head_logits(&[1.0, 2.0], &[1.0, 0.5, -1.0, 0.25], Some(&[0.0, 1.0]))?;
/// assert_eq!(head.logits, vec![2.0, 0.5]);
/// assert!(head.error_bound[0] > 0.0 && head.error_bound[0] < 1e-5);
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn lm_head_logits(
    hidden: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
) -> Result<HeadLogits, ReferenceError> {
    let dim = hidden.len();
    if dim == 0 || !weight.len().is_multiple_of(dim) {
        return Err(ReferenceError::Shape {
            what: "weight",
            expected: dim,
            got: weight.len(),
        });
    }
    let vocab = weight.len() / dim;
    check_vocab(vocab)?;
    if let Some(b) = bias
        && b.len() != vocab
    {
        return Err(ReferenceError::Shape {
            what: "bias",
            expected: vocab,
            got: b.len(),
        });
    }
    let gamma = 2.0 * dim as f64 * f64::from(f32::EPSILON);
    let mut logits = Vec::with_capacity(vocab);
    let mut error_bound = Vec::with_capacity(vocab);
    for (j, w) in weight.chunks_exact(dim).enumerate() {
        let (mut sum, mut abs) = (0.0f64, 0.0f64);
        for (&h, &x) in hidden.iter().zip(w) {
            let p = f64::from(h) * f64::from(x);
            sum += p;
            abs += p.abs();
        }
        let b = bias.map_or(0.0, |b| f64::from(b[j]));
        logits.push(sum + b);
        // The bias is added in f32 after the accumulation: half an ulp more.
        error_bound.push(gamma * abs + (sum + b).abs() * f64::from(f32::EPSILON));
    }
    Ok(HeadLogits {
        logits,
        error_bound,
    })
}

/// Accepts a fused sampler's token for a row whose exact logits are `head`:
/// equal to the float64 Gumbel-max (or argmax) token, or a different token
/// whose float64 score is within the two logits' error bounds (divided by
/// T) plus the f32 rounding of the scores of the reference's. `None` means
/// the kernel flagged the row invalid, which finite logits never are.
pub fn fused_tokens_agree(
    head: &HeadLogits,
    temperature: f32,
    seed: u64,
    offset: u64,
    gpu_token: Option<u32>,
) -> Result<(), String> {
    let greedy = is_greedy(temperature);
    let scale = if greedy {
        1.0
    } else {
        1.0 / f64::from(temperature)
    };
    let key = seed_key(seed);
    let score = |j: usize| {
        let x = head.logits[j] * scale;
        if greedy {
            x
        } else {
            x + f64::from(gumbel_from_bits(
                token_noise_group(key, offset, (j >> 2) as u32)[j & 3],
            ))
        }
    };
    let mut best = (0usize, f64::NEG_INFINITY);
    for j in 0..head.logits.len() {
        let s = score(j);
        if s > best.1 {
            best = (j, s);
        }
    }
    let Some(g) = gpu_token else {
        return Err(format!(
            "GPU flagged a row of finite logits invalid (reference token {})",
            best.0
        ));
    };
    let g = g as usize;
    if g == best.0 {
        return Ok(());
    }
    if g >= head.logits.len() {
        return Err(format!(
            "GPU token {g} is outside the vocabulary of {}",
            head.logits.len()
        ));
    }
    let (sr, sg) = (best.1, score(g));
    let tol = (head.error_bound[best.0] + head.error_bound[g]) * scale
        + 8.0 * f64::from(f32::EPSILON) * (sr.abs().max(sg.abs()) + NOISE_BOUND);
    if sr - sg <= tol {
        Ok(())
    } else {
        Err(format!(
            "reference token {} (score {sr:e}), GPU token {g} (score {sg:e}): gap {:e} above the bound {tol:e}",
            best.0,
            sr - sg
        ))
    }
}

// ---------------------------------------------------------------------------
// Probability samplers: top-k, then top-p on the top-k mass, then one draw
// (`top_k_first`, issue 5). The oracle of `Device::top_k_to_slab` and
// `Device::top_k_top_p_sampling_from_probs`, and their CPU backend.
// ---------------------------------------------------------------------------

/// The weight of a probability in the probability samplers: finite
/// positive values count as themselves, NaN, negative values, +-0 and +inf
/// as 0 (rows need not be normalised).
///
/// ```
/// use flashsample::reference::prob_weight;
///
/// assert_eq!(prob_weight(0.25), 0.25);
/// for bad in [f32::NAN, -0.5, -0.0, f32::INFINITY] {
///     assert_eq!(prob_weight(bad), 0.0);
/// }
/// ```
pub fn prob_weight(x: f32) -> f64 {
    if x > 0.0 && x.is_finite() {
        f64::from(x)
    } else {
        0.0
    }
}

/// A probability row after top-k and top-p: its kept set is
/// `order[..kept]`, of the top-k `order[..k]`; `kept = 0` when the top-k
/// has no positive mass.
struct ProbsCut {
    order: Vec<u32>,
    weights: Vec<f64>,
    k: usize,
    kept: usize,
}

impl ProbsCut {
    fn new(row: &[f32], top_k: u32, top_p: f32) -> Result<ProbsCut, ReferenceError> {
        check_vocab(row.len())?;
        if top_k == 0 {
            return Err(ReferenceError::InvalidParam {
                name: "top_k",
                value: 0.0,
            });
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ReferenceError::InvalidParam {
                name: "top_p",
                value: top_p.into(),
            });
        }
        let weights: Vec<f64> = row.iter().map(|&x| prob_weight(x)).collect();
        let mut order: Vec<u32> = (0..row.len() as u32).collect();
        order.sort_by(|&a, &b| {
            weights[b as usize]
                .total_cmp(&weights[a as usize])
                .then(a.cmp(&b))
        });
        let k = (top_k as usize).min(row.len());
        let mass: f64 = order[..k].iter().map(|&j| weights[j as usize]).sum();
        let kept = if mass > 0.0 {
            top_p_len(&order[..k], &weights, top_p, 1.0)
        } else {
            0
        };
        Ok(ProbsCut {
            order,
            weights,
            k,
            kept,
        })
    }

    /// The kept-set sizes top-p could produce with its threshold within
    /// `1 +- TOP_P_BOUNDARY_REL` of its value.
    fn top_p_range(&self, top_p: f32) -> (usize, usize) {
        if self.kept == 0 {
            return (0, 0);
        }
        let prefix = &self.order[..self.k];
        let len = |scale| top_p_len(prefix, &self.weights, top_p, scale);
        (len(1.0 - TOP_P_BOUNDARY_REL), len(1.0 + TOP_P_BOUNDARY_REL))
    }

    /// Cumulative kept mass before and after each kept entry, over the
    /// kept mass (summed in the total order).
    fn window(&self, position: usize) -> (f64, f64) {
        let w: Vec<f64> = self.order[..self.kept]
            .iter()
            .map(|&j| self.weights[j as usize])
            .collect();
        let mass: f64 = w.iter().sum();
        let before: f64 = w[..position].iter().sum();
        (before / mass, (before + w[position]) / mass)
    }
}

/// The top-k of a probability row: the first `min(top_k, V)` indices in
/// the total order of [`prob_weight`] (descending, ties and zeros by lower
/// index): the set `Device::top_k_to_slab` writes, in its order. Rejects
/// `top_k = 0` and empty or oversized rows.
///
/// ```
/// use flashsample::reference::probs_top_k;
///
/// let row = [0.1f32, f32::NAN, 0.3, 0.3, -1.0];
/// assert_eq!(probs_top_k(&row, 3)?, vec![2, 3, 0]);
/// assert_eq!(probs_top_k(&row, 5)?, vec![2, 3, 0, 1, 4]);
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn probs_top_k(row: &[f32], top_k: u32) -> Result<Vec<u32>, ReferenceError> {
    let cut = ProbsCut::new(row, top_k, 1.0)?;
    Ok(cut.order[..cut.k].to_vec())
}

/// The kept set of a probability row, in the total order: the top-k, then
/// the shortest prefix of it whose exclusive mass is below `top_p *
/// topk_mass` (float64 sums in order; `top_p = 1` keeps the whole top-k).
/// Empty when the top-k has no positive mass.
///
/// ```
/// use flashsample::reference::probs_kept_set;
///
/// let row = [0.5f32, 0.25, 0.125, 0.125];
/// // Exclusive masses 0, 0.5, 0.75, 0.875: top-p 0.75 keeps two.
/// assert_eq!(probs_kept_set(&row, 4, 0.75)?, vec![0, 1]);
/// assert_eq!(probs_kept_set(&row, 3, 0.75)?, vec![0, 1]);
/// assert!(probs_kept_set(&[0.0f32, f32::NAN], 2, 0.9)?.is_empty());
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn probs_kept_set(row: &[f32], top_k: u32, top_p: f32) -> Result<Vec<u32>, ReferenceError> {
    let cut = ProbsCut::new(row, top_k, top_p)?;
    Ok(cut.order[..cut.kept].to_vec())
}

/// One token of a probability row by inverse CDF over its kept set
/// ([`probs_kept_set`]): `u = uniform_open(row_uniform_bits(seed_key(seed),
/// offset, 0))` (the Qrita sampler's uniform), and the first kept token
/// whose cumulative renormalised mass (float64, in the total order)
/// exceeds `u`. `None` when the top-k has no positive mass.
pub fn sample_probs_top_k_top_p(
    row: &[f32],
    top_k: u32,
    top_p: f32,
    seed: u64,
    offset: u64,
) -> Result<Option<u32>, ReferenceError> {
    let cut = ProbsCut::new(row, top_k, top_p)?;
    if cut.kept == 0 {
        return Ok(None);
    }
    let u = f64::from(uniform_open(row_uniform_bits(seed_key(seed), offset, 0)));
    let kept = &cut.order[..cut.kept];
    let mass: f64 = kept.iter().map(|&j| cut.weights[j as usize]).sum();
    let mut cumulative = 0.0;
    for &j in kept {
        cumulative += cut.weights[j as usize] / mass;
        if cumulative > u {
            return Ok(Some(j));
        }
    }
    // Rounding left the sum at or below u: the last kept token with mass.
    Ok(kept
        .iter()
        .rev()
        .find(|&&j| cut.weights[j as usize] > 0.0)
        .copied())
}

/// Whether a probability row's top-p cut is near its boundary: whether it
/// changes when the threshold moves by [`TOP_P_BOUNDARY_REL`] (relative)
/// either way. Only there may a GPU kept set differ from
/// [`probs_kept_set`].
pub fn probs_top_p_near_boundary(
    row: &[f32],
    top_k: u32,
    top_p: f32,
) -> Result<bool, ReferenceError> {
    let cut = ProbsCut::new(row, top_k, top_p)?;
    Ok(cut.top_p_range(top_p) != (cut.kept, cut.kept))
}

/// Checks a GPU token of a probability sampler (`None`: the GPU reported
/// the row invalid) against [`sample_probs_top_k_top_p`]. Accepted: the
/// reference token; or, when the top-p cut is near its boundary, any token
/// a threshold within `1 +- TOP_P_BOUNDARY_REL` keeps; or a kept token whose
/// cumulative window `[before, after]` (renormalised, float64) reaches `u`
/// within `1e-9` (the GPU sums exact integer masses, within `2^-53` of the
/// row's largest value each). Never accepted: a token outside every such
/// kept set, or a validity difference.
pub fn probs_draw_agrees(
    row: &[f32],
    top_k: u32,
    top_p: f32,
    seed: u64,
    offset: u64,
    gpu: Option<u32>,
) -> Result<(), String> {
    let want =
        sample_probs_top_k_top_p(row, top_k, top_p, seed, offset).map_err(|e| e.to_string())?;
    let (g, w) = match (gpu, want) {
        (None, None) => return Ok(()),
        (Some(g), Some(w)) if g == w => return Ok(()),
        (Some(g), Some(w)) => (g, w),
        (g, w) => return Err(format!("GPU token {g:?}, reference {w:?} (None: invalid)")),
    };
    let cut = ProbsCut::new(row, top_k, top_p).map_err(|e| e.to_string())?;
    let (_, widest) = cut.top_p_range(top_p);
    let Some(pos) = cut.order[..widest.max(cut.kept)]
        .iter()
        .position(|&j| j == g)
    else {
        return Err(format!(
            "GPU token {g} is outside the kept set (reference {w}, {} kept)",
            cut.kept
        ));
    };
    if cut.top_p_range(top_p) != (cut.kept, cut.kept) {
        return Ok(());
    }
    let u = f64::from(uniform_open(row_uniform_bits(seed_key(seed), offset, 0)));
    let (before, after) = cut.window(pos);
    let eps = 1e-9;
    if before <= u + eps && after >= u - eps && cut.weights[g as usize] > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "GPU token {g} (cumulative {before:.12}..{after:.12}), reference {w}, u = {u:.12}"
        ))
    }
}

/// [`sample_probs_top_k_top_p`] of every row of a row-major `[batch, vocab]`
/// buffer with per-row `top_k`, `top_p`, seed and offset (the arguments of
/// `Device::top_k_top_p_sampling_from_probs`): the CPU backend.
///
/// ```
/// use flashsample::reference::sample_probs_top_k_top_p_batch;
///
/// let probs = [0.7f32, 0.2, 0.1, 0.0, 0.0, f32::NAN];
/// let t = sample_probs_top_k_top_p_batch(&probs, 3, &[1, 3], &[1.0, 0.5], &[5, 5], &[0, 0])?;
/// assert_eq!(t, vec![Some(0), None]);
/// # Ok::<(), flashsample::reference::ReferenceError>(())
/// ```
pub fn sample_probs_top_k_top_p_batch(
    probs: &[f32],
    vocab: usize,
    top_k: &[u32],
    top_p: &[f32],
    seed: &[u64],
    offset: &[u64],
) -> Result<Vec<Option<u32>>, ReferenceError> {
    let batch = top_k.len();
    for (what, len) in [
        ("top_p", top_p.len()),
        ("seed", seed.len()),
        ("offset", offset.len()),
    ] {
        if len != batch {
            return Err(ReferenceError::Shape {
                what,
                expected: batch,
                got: len,
            });
        }
    }
    rows(probs, vocab, batch)?
        .enumerate()
        .map(|(r, row)| sample_probs_top_k_top_p(row, top_k[r], top_p[r], seed[r], offset[r]))
        .collect()
}

#[cfg(test)]
mod probs_tests {
    use super::*;

    #[test]
    fn top_k_orders_bad_values_as_zeros() {
        let row = [0.0f32, -2.0, f32::INFINITY, 0.5, f32::NAN, 0.5, 1.0e-45];
        assert_eq!(probs_top_k(&row, 7).unwrap(), vec![3, 5, 6, 0, 1, 2, 4]);
        assert_eq!(probs_top_k(&row, 100).unwrap().len(), 7);
        assert!(probs_top_k(&row, 0).is_err());
        assert!(probs_top_k(&[], 1).is_err());
    }

    #[test]
    fn top_p_runs_on_the_top_k_mass() {
        let row = [0.4f32, 0.3, 0.2, 0.1];
        // top-k 2: mass 0.7, threshold 0.35: 0.4 alone.
        assert_eq!(probs_kept_set(&row, 2, 0.5).unwrap(), vec![0]);
        // top-k 3: mass 0.9, threshold 0.45: 0.4 then 0.3.
        assert_eq!(probs_kept_set(&row, 3, 0.5).unwrap(), vec![0, 1]);
        assert_eq!(probs_kept_set(&row, 4, 1.0).unwrap(), vec![0, 1, 2, 3]);
        for bad in [0.0, -0.1, 1.1, f32::NAN] {
            assert!(probs_kept_set(&row, 2, bad).is_err());
        }
        // Exactly on the boundary (exact in float64), and near it.
        let exact = [0.5f32, 0.25, 0.25];
        assert_eq!(probs_kept_set(&exact, 3, 0.75).unwrap(), vec![0, 1]);
        assert!(probs_top_p_near_boundary(&exact, 3, 0.75).unwrap());
        assert!(!probs_top_p_near_boundary(&exact, 3, 0.6).unwrap());
    }

    #[test]
    fn draws_follow_the_renormalised_kept_mass() {
        let row = [0.1f32, 0.6, 0.0, 0.3];
        let mut counts = [0u64; 4];
        for offset in 0..20_000 {
            let t = sample_probs_top_k_top_p(&row, 3, 0.95, 1, offset).unwrap();
            counts[t.unwrap() as usize] += 1;
            probs_draw_agrees(&row, 3, 0.95, 1, offset, t).unwrap();
        }
        // top-k 3 (0.6, 0.3, 0.1), mass 1, top-p 0.95 keeps all three.
        let fit = stats::chi_square(&counts, &[0.1, 0.6, 0.0, 0.3]).unwrap();
        assert!(fit.p_value > 1e-4, "{counts:?} {fit:?}");
        assert!(probs_draw_agrees(&row, 3, 0.95, 1, 0, Some(2)).is_err());
        assert!(probs_draw_agrees(&row, 3, 0.95, 1, 0, None).is_err());
        assert_eq!(
            sample_probs_top_k_top_p(&[0.0, -1.0], 2, 0.5, 1, 0),
            Ok(None)
        );
        assert!(probs_draw_agrees(&[0.0, -1.0], 2, 0.5, 1, 0, None).is_ok());
    }
}
