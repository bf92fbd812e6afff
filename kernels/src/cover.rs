//! Chunk lists that cover a row's top k (issue 4): the portable rules of
//! the chunked Qrita route's first pass, shared by the GPU kernels and the
//! CPU emulation in the tests below.
//!
//! The chunked route reads each chunk of [`crate::params::TOPK_TOPP_CHUNK`]
//! elements once for the row's statistics. For a row whose effective top-k
//! is small ([`local_k`]), the same pass also lists, per chunk, every
//! element at or above a **chunk floor** taken from the chunk's own
//! statistics (the Gaussian pre-filter applied to the chunk,
//! [`local_floor_keys`]), chosen among tiers ([`local_choice`]) so that the
//! chunk lists at least its own `k` largest elements, or all its finite
//! ones. Then:
//!
//! - **The row's top k lie in the union of the lists.** An element among
//!   the row's k largest (value desc, index asc) has fewer than k elements
//!   of its chunk before it, so it is among its chunk's k largest, which the
//!   chunk listed. With `F` the highest chunk floor, every element of the
//!   row at or above `F` is listed (each chunk listed all at or above its
//!   own floor), and the chunk whose floor is `F` listed at least k of them
//!   unless it listed all its finite elements.
//! - **So the pre-filter pass has nothing left to do for the row**
//!   ([`row_covered`]): its candidates are the listed elements at or above
//!   a floor ([`tight_floor_serves`]): the row's first-tier threshold when
//!   every chunk floor lies below it and at least k listed elements reach
//!   it (then the candidates are exactly those the pre-filter pass would
//!   have listed, in the same order), else `max(F, min-p's key)`.
//!
//! The floors are a speed device only: a row whose chunks could not list
//! (a +inf entry, more elements at the loosest tier than a list holds, or
//! top-k off or above [`LOCAL_MAX_K`]) takes the pre-filter pass as before.
//! No function here panics on any input.

use crate::pivot::{RowStats, upper_quantile_floor};
use crate::radix::f32_key;

/// Largest effective top-k whose rows the first pass lists chunk by chunk:
/// a chunk then lists about `k + 3 sqrt(k) + 8` elements (312 at 256),
/// well inside a chunk list's capacity.
pub const LOCAL_MAX_K: u32 = 256;

/// How many times more expected elements the chunk's second tier asks for
/// than its first ([`local_floor_keys`]).
pub const LOCAL_SECOND_TIER_FACTOR: f32 = 8.0;

/// The chunk floor of a chunk that listed nothing usable: the row is not
/// covered.
pub const NO_LIST: u32 = u32::MAX;

/// Key of the least finite f32 (`-f32::MAX`): the floor of a chunk that
/// listed all its finite elements.
pub const LEAST_FINITE_KEY: u32 = !(-f32::MAX).to_bits();

/// The number of elements top-k keeps of a row of `n` elements (as
/// [`crate::pivot::Plan`] takes it): 1 for a greedy row (`temperature <=
/// 0` or NaN), `n` when top-k is off (`top_k` 0 or at least `n`), else
/// `top_k`.
#[inline(always)]
pub fn effective_k(top_k: u32, temperature: f32, n: u32) -> u32 {
    if temperature.is_nan() || temperature <= 0.0 {
        1
    } else if top_k == 0 || top_k >= n {
        n
    } else {
        top_k
    }
}

/// The k the first pass lists the chunks of a row of `vocab` elements for:
/// [`effective_k`] when top-k cuts and keeps at most [`LOCAL_MAX_K`], else
/// 0 (no lists).
#[inline(always)]
pub fn local_k(top_k: u32, temperature: f32, vocab: u32) -> u32 {
    let k = effective_k(top_k, temperature, vocab);
    if k < vocab && k <= LOCAL_MAX_K { k } else { 0 }
}

/// Expected elements a chunk's first tier asks for: `k + 3 sqrt(k) + 8`,
/// so a Gaussian chunk falls short of k about once in a thousand (then the
/// second tier serves). Per chunk of 8192 this is a looser threshold than
/// the row's first tier ([`crate::pivot::prefilter_target_count`] over V)
/// for every V above about 20000, so on Gaussian rows every chunk lists
/// all the row's first-tier candidates.
#[inline(always)]
pub fn local_target_count(k: u32) -> f32 {
    let k = k as f32;
    k + 3.0 * core::intrinsics::sqrtf32(k) + 8.0
}

/// The chunk's two tier floors `[t1, t2]` (`t1 >= t2`) for top-k `k` from
/// its statistics `stats` (taken with `shift`): `mu + delta sigma` of its
/// finite elements with `delta` for [`local_target_count`] and
/// [`LOCAL_SECOND_TIER_FACTOR`] times it, never above the chunk's largest
/// element, never below [`LEAST_FINITE_KEY`] (the key of all finite
/// elements, also where the model says nothing: fewer finite elements than
/// the target, NaN statistics).
#[inline(always)]
pub fn local_floor_keys(stats: &RowStats, shift: f32, k: u32) -> [u32; 2] {
    let (mu, sd) = stats.mean_sd(shift);
    let n = stats.n_finite as f32;
    let m = local_target_count(k);
    let key = |m: f32| {
        if m >= n {
            return LEAST_FINITE_KEY;
        }
        let t = (mu + upper_quantile_floor(m / n) * sd).min(stats.max());
        if t.is_nan() {
            LEAST_FINITE_KEY
        } else {
            let key = f32_key(t.to_bits());
            if key < LEAST_FINITE_KEY {
                LEAST_FINITE_KEY
            } else {
                key
            }
        }
    };
    [key(m), key(LOCAL_SECOND_TIER_FACTOR * m)]
}

/// Which tier a chunk lists: its elements at or above its first tier floor,
/// its second, or all its finite elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalTier {
    First,
    Second,
    Finite,
}

/// The tier a chunk lists, from its counts at the two tier floors
/// (`counts`), its finite and +inf counts and the list capacity `cap`: the
/// first tier that reaches `k` and fits, else all its finite elements when
/// they fit; `None` (the row is not covered) when the chunk holds +inf or
/// the loosest tier that could serve does not fit.
#[inline(always)]
pub fn local_choice(
    counts: [u32; 2],
    n_finite: u32,
    n_posinf: u32,
    k: u32,
    cap: u32,
) -> Option<LocalTier> {
    if n_posinf > 0 {
        None
    } else if counts[0] >= k && counts[0] <= cap {
        Some(LocalTier::First)
    } else if counts[1] >= k && counts[1] <= cap {
        Some(LocalTier::Second)
    } else if n_finite <= cap {
        Some(LocalTier::Finite)
    } else {
        None
    }
}

/// Whether a row whose highest chunk floor is `f_max` ([`NO_LIST`] when a
/// chunk did not list) is covered by its chunks' lists for top-k `k >= 1`:
/// every chunk listed, no +inf, and the chunk of floor `f_max` listed at
/// least k elements (it did unless it listed all its finite elements; then
/// every chunk did, and the row's finite elements must number at least k).
#[inline(always)]
pub fn row_covered(f_max: u32, n_finite: u32, n_posinf: u32, k: u32) -> bool {
    f_max != NO_LIST && n_posinf == 0 && k >= 1 && (f_max > LEAST_FINITE_KEY || n_finite >= k)
}

/// Whether the candidates of a covered row are the listed elements at or
/// above `tight` (the row's first-tier key, at least min-p's key
/// `min_key`), of which `n_tight` are listed: when there are at least k
/// of them (the row's top k then lie at or above `tight`, and every one is
/// listed), or `tight` is min-p's key (fewer than k listed then means no
/// chunk floor lies above it, as such a chunk lists k elements above it:
/// every survivor of min-p is listed, and they are the kept set). Else the
/// candidates are the listed elements at or above `max(f_max, min_key)`.
/// When no chunk floor lies above `tight`, the tight candidates are exactly
/// those the pre-filter pass would list.
#[inline(always)]
pub fn tight_floor_serves(tight: u32, min_key: u32, n_tight: u32, k: u32) -> bool {
    n_tight >= k || tight == min_key
}

#[cfg(test)]
mod tests {
    //! The rules above emulated over whole rows on the CPU: the candidates
    //! of every covered row hold its exact kept set under top-k and min-p.
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::params::{TOPK_TOPP_CHUNK, TopkToppLayout};
    use crate::pivot::{Plan, RowParams};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f32 {
            let (u, v) = (self.unit().max(1e-300), self.unit());
            ((-2.0 * u.ln()).sqrt() * (core::f64::consts::TAU * v).cos()) as f32
        }
    }

    /// What the emulated passes make of a row: `None` when not covered,
    /// else the candidates' indices and whether the tight floor served.
    fn candidates(row: &[f32], params: &RowParams) -> Option<(Vec<u32>, bool)> {
        let vocab = row.len() as u32;
        let lay = TopkToppLayout::new(1, vocab);
        let shift = RowStats::shift_of(row[0]);
        let k = local_k(params.top_k, params.temperature, vocab);
        let key_of = |x: f32| f32_key(x.to_bits());
        let mut floors = Vec::new();
        for (c, chunk) in row.chunks(TOPK_TOPP_CHUNK as usize).enumerate() {
            let mut st = RowStats::EMPTY;
            chunk.iter().for_each(|&x| st.add(x, shift));
            let floor = if k == 0 {
                NO_LIST
            } else {
                let t = local_floor_keys(&st, shift, k);
                let count = |f: u32| chunk.iter().filter(|&&x| key_of(x) >= f).count() as u32;
                match local_choice(
                    [count(t[0]), count(t[1])],
                    st.n_finite,
                    st.n_posinf,
                    k,
                    lay.cap,
                ) {
                    Some(LocalTier::First) => t[0],
                    Some(LocalTier::Second) => t[1],
                    Some(LocalTier::Finite) => LEAST_FINITE_KEY,
                    None => NO_LIST,
                }
            };
            assert!(floor == NO_LIST || floor >= LEAST_FINITE_KEY, "chunk {c}");
            floors.push(floor);
        }
        let mut st = RowStats::EMPTY;
        row.iter().for_each(|&x| st.add(x, shift));
        let plan = Plan::new(&st, shift, vocab, params);
        let f_max = floors.iter().copied().max().unwrap_or(NO_LIST);
        if !(st.is_valid() && plan.topk && row_covered(f_max, st.n_finite, st.n_posinf, plan.k)) {
            return None;
        }
        assert_eq!(plan.k, k, "the plan's k is the first pass's");
        let min_key = plan.weights.min_p_key();
        let listed: Vec<u32> = (0..vocab)
            .filter(|&i| {
                let f = floors[(i / TOPK_TOPP_CHUNK) as usize];
                key_of(row[i as usize]) >= f
            })
            .collect();
        let tight = plan.t1.max(min_key);
        let n_tight = listed
            .iter()
            .filter(|&&i| key_of(row[i as usize]) >= tight)
            .count() as u32;
        let serves = tight_floor_serves(tight, min_key, n_tight, plan.k);
        let floor = if serves { tight } else { f_max.max(min_key) };
        let cand = listed
            .into_iter()
            .filter(|&i| key_of(row[i as usize]) >= floor)
            .collect();
        Some((cand, serves))
    }

    /// The exact kept set under min-p and top-k (before top-p): the first
    /// k of the total order that min-p keeps.
    fn kept(row: &[f32], params: &RowParams) -> Vec<u32> {
        let shift = RowStats::shift_of(row[0]);
        let mut st = RowStats::EMPTY;
        row.iter().for_each(|&x| st.add(x, shift));
        let plan = Plan::new(&st, shift, row.len() as u32, params);
        let min_key = plan.weights.min_p_key();
        let mut order: Vec<u32> = (0..row.len() as u32).collect();
        order.sort_by_key(|&i| (core::cmp::Reverse(f32_key(row[i as usize].to_bits())), i));
        order
            .into_iter()
            .take(plan.k as usize)
            .filter(|&i| f32_key(row[i as usize].to_bits()) >= min_key)
            .collect()
    }

    #[test]
    fn least_finite_key_is_the_key_of_minus_max() {
        assert_eq!(LEAST_FINITE_KEY, f32_key((-f32::MAX).to_bits()));
        assert_eq!(LEAST_FINITE_KEY, f32_key(f32::NEG_INFINITY.to_bits()) + 1);
    }

    #[test]
    fn covered_rows_list_their_kept_sets() {
        let mut rng = Rng(0x00c0_7e12);
        let (mut covered, mut tight, mut rows) = ([0u32; 7], [0u32; 7], [0u32; 7]);
        for case in 0..280u32 {
            let shape = (case % 7) as usize;
            let vocab =
                [40_000usize, 49_152, 128_256, 20_000, 151_936, 9_000][(case / 7 % 6) as usize];
            let sigma = 0.5 + 4.0 * rng.unit() as f32;
            // Masked vocabularies, down to fewer finite entries than k.
            let masked = [0.9, 0.999][(rng.next() % 2) as usize];
            let mut row: Vec<f32> = (0..vocab)
                .map(|_| match shape {
                    // Gaussian; bf16-like ties; heavy tails; few values.
                    0 => sigma * rng.normal(),
                    1 => ((sigma * rng.normal()) * 8.0).round() / 8.0,
                    2 => {
                        2.0 * rng.normal()
                            / (rng.normal().powi(2) + rng.normal().powi(2))
                                .sqrt()
                                .max(1e-3)
                    }
                    3 => (rng.next() % 3) as f32,
                    // Masked vocabularies: most entries -inf, some NaN.
                    4 | 5 => {
                        if rng.unit() < masked {
                            f32::NEG_INFINITY
                        } else {
                            sigma * rng.normal()
                        }
                    }
                    // Gaussian with outliers added below.
                    6 => rng.normal(),
                    _ => unreachable!(),
                })
                .collect();
            if shape == 5 {
                let special = [f32::NAN, f32::INFINITY][(rng.next() % 2) as usize];
                for _ in 0..8 {
                    let i = (rng.next() % vocab as u64) as usize;
                    row[i] = special;
                }
            }
            if shape == 6 {
                // Fewer outliers than k that inflate sigma: the row's first
                // tier lies above its k-th element.
                for _ in 0..rng.next() % 24 {
                    let i = (rng.next() % vocab as u64) as usize;
                    row[i] = 100.0 + 10.0 * rng.unit() as f32;
                }
            }
            let mut pick = |n: u64| (rng.next() % n) as usize;
            let mut params = RowParams {
                top_k: [1u32, 2, 50, 256, 257, 0][pick(6)],
                top_p: 0.9,
                min_p: [0.0f32, 0.05][pick(2)],
                temperature: [1.0f32, 0.7, 1.0, 0.0][pick(4)],
                prefilter: true,
            };
            if shape == 6 {
                // More than the outliers, and no min-p to drop the rest.
                (params.top_k, params.min_p, params.temperature) =
                    (50 + 200 * (case % 2), 0.0, 1.0);
            }
            rows[shape] += 1;
            let want = kept(&row, &params);
            if let Some((cand, serves)) = candidates(&row, &params) {
                covered[shape] += 1;
                tight[shape] += u32::from(serves);
                assert!(
                    cand.len() >= want.len() && want.iter().all(|i| cand.binary_search(i).is_ok()),
                    "case {case}: {} candidates miss some of {} kept",
                    cand.len(),
                    want.len()
                );
            }
        }
        std::println!("rows {rows:?}, covered {covered:?}, tight floor {tight:?}");
        // Gaussian rows with listed k are covered (k 257 and off are not),
        // most from the tight floor; the outlier rows take the other.
        assert!(covered[0] >= rows[0] / 2, "{covered:?}");
        assert!(tight[0] >= covered[0] * 3 / 4, "{tight:?}");
        assert!(covered[6] > tight[6], "{covered:?} {tight:?}");
        assert!(
            covered[2] > 0 && covered[3] > 0 && covered[4] > 0 && covered[5] > 0,
            "{covered:?}"
        );
    }
}
