//! The Qrita listing route's cover rules (`flashsample::kernels::cover`)
//! emulated over whole rows on the CPU: every chunk's floor and list as the
//! statistics pass makes them, the plan's cover test and candidate floor,
//! and a check that the candidates of every covered row hold its exact kept
//! set under top-k and min-p. The rules are a speed device (an uncovered
//! row takes the pre-filter pass), so the tests also hold them to covering
//! the rows the benches draw: Gaussian, bf16-rounded and, with the logits
//! corpus, real SmolLM2 rows.

#[path = "corpus/mod.rs"]
mod corpus;

use flashsample::kernels::cover::{
    LEAST_FINITE_KEY, LocalTier, NO_LIST, SHARED_MIN_VOCAB, chunk_ask, chunk_lists, floor_keys,
    is_shared, list_k, local_choice, row_covered, shared_cover, shared_floors, tight_floor_serves,
};
use flashsample::kernels::float16::{bf16_to_f32, f32_to_bf16};
use flashsample::kernels::params::{TOPK_TOPP_CHUNK, TopkToppLayout};
use flashsample::kernels::pivot::{Plan, RowParams, RowStats};
use flashsample::kernels::radix::f32_key;

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
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

fn key_of(x: f32) -> u32 {
    f32_key(x.to_bits())
}

/// What the emulated passes make of a row: `None` when not covered, else
/// the candidates' indices (ascending) and whether the first tier's floor
/// served.
fn candidates(row: &[f32], params: &RowParams) -> Option<(Vec<u32>, bool)> {
    let vocab = row.len() as u32;
    let lay = TopkToppLayout::new(1, vocab);
    let shift = RowStats::shift_of(row[0]);
    let k = list_k(params.top_k, params.temperature, vocab);
    let mut floors = Vec::new();
    for (c, chunk) in row.chunks(TOPK_TOPP_CHUNK as usize).enumerate() {
        let mut st = RowStats::EMPTY;
        chunk.iter().for_each(|&x| st.add(x, shift));
        let floor = if !chunk_lists(k, &st, shift) {
            NO_LIST
        } else {
            let ask = chunk_ask(k, chunk.len() as u32, vocab, lay.cap);
            let t = floor_keys(&st, shift, ask.targets);
            let count = |f: u32| chunk.iter().filter(|&&x| key_of(x) >= f).count() as u32;
            match local_choice(
                [count(t[0]), count(t[1])],
                st.n_finite,
                st.n_posinf,
                ask.need,
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
    let min_key = plan.weights.min_p_key();
    let listed: Vec<u32> = (0..vocab)
        .filter(|&i| {
            let f = floors[(i / TOPK_TOPP_CHUNK) as usize];
            f != NO_LIST && key_of(row[i as usize]) >= f
        })
        .collect();
    let at = |f: u32| {
        listed
            .iter()
            .filter(|&&i| key_of(row[i as usize]) >= f)
            .count() as u32
    };
    if !(st.is_valid() && plan.topk && f_max != NO_LIST) {
        return None;
    }
    let (floor, serves) = if is_shared(k) {
        let keys = shared_floors(&st, shift, k, f_max);
        (
            shared_cover(f_max, st.n_posinf, keys, keys.map(at), min_key, plan.k)?,
            false,
        )
    } else if row_covered(f_max, st.n_finite, st.n_posinf, plan.k) {
        let tight = plan.t1.max(min_key);
        if tight_floor_serves(tight, min_key, at(tight), plan.k) {
            (tight, true)
        } else {
            (f_max.max(min_key), false)
        }
    } else {
        return None;
    };
    assert_eq!(plan.k, k, "the plan's k is the first pass's");
    let cand = listed
        .into_iter()
        .filter(|&i| key_of(row[i as usize]) >= floor)
        .collect();
    Some((cand, serves))
}

/// The exact kept set under min-p and top-k (before top-p): the first k of
/// the total order (value desc, index asc) that min-p keeps.
fn kept(row: &[f32], params: &RowParams) -> Vec<u32> {
    let shift = RowStats::shift_of(row[0]);
    let mut st = RowStats::EMPTY;
    row.iter().for_each(|&x| st.add(x, shift));
    let plan = Plan::new(&st, shift, row.len() as u32, params);
    let min_key = plan.weights.min_p_key();
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    order.sort_unstable_by_key(|&i| (std::cmp::Reverse(key_of(row[i as usize])), i));
    order
        .into_iter()
        .take(plan.k as usize)
        .filter(|&i| key_of(row[i as usize]) >= min_key)
        .collect()
}

/// Whether `cand` (ascending) holds every index of `want`.
fn holds(cand: &[u32], want: &[u32]) -> bool {
    want.iter().all(|i| cand.binary_search(i).is_ok())
}

fn top_k_params(top_k: u32) -> RowParams {
    RowParams {
        top_k,
        top_p: 0.9,
        min_p: 0.0,
        temperature: 1.0,
        prefilter: true,
    }
}

#[test]
fn covered_rows_list_their_kept_sets() {
    let mut rng = Rng(0x00c0_7e12);
    let (mut covered, mut tight, mut rows) = ([0u32; 7], [0u32; 7], [0u32; 7]);
    for case in 0..280u32 {
        let shape = (case % 7) as usize;
        let vocab = [40_000usize, 49_152, 128_256, 20_000, 151_936, 9_000][(case / 7 % 6) as usize];
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
                _ => rng.normal(),
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
            // Fewer outliers than k that inflate sigma: the row's first tier
            // lies above its k-th element.
            for _ in 0..rng.next() % 24 {
                let i = (rng.next() % vocab as u64) as usize;
                row[i] = 100.0 + 10.0 * rng.unit() as f32;
            }
        }
        let mut pick = |n: u64| (rng.next() % n) as usize;
        let mut params = RowParams {
            top_k: [1u32, 2, 50, 256, 257, 1000, 0][pick(7)],
            top_p: 0.9,
            min_p: [0.0f32, 0.05][pick(2)],
            temperature: [1.0f32, 0.7, 1.0, 0.0][pick(4)],
            prefilter: true,
        };
        if shape == 6 {
            // More than the outliers, and no min-p to drop the rest.
            (params.top_k, params.min_p, params.temperature) = (50 + 200 * (case % 2), 0.0, 1.0);
        }
        rows[shape] += 1;
        let want = kept(&row, &params);
        if let Some((cand, serves)) = candidates(&row, &params) {
            covered[shape] += 1;
            tight[shape] += u32::from(serves);
            assert!(
                cand.len() >= want.len() && holds(&cand, &want),
                "case {case}: {} candidates miss some of {} kept",
                cand.len(),
                want.len()
            );
        }
    }
    println!("rows {rows:?}, covered {covered:?}, tight floor {tight:?}");
    // Gaussian rows with listed k are covered (k off is not), most of the
    // small k from the tight floor; the outlier rows take the other.
    assert!(covered[0] >= rows[0] / 2, "{covered:?}");
    assert!(tight[0] >= covered[0] * 3 / 4, "{tight:?}");
    assert!(covered[6] > tight[6], "{covered:?} {tight:?}");
    assert!(
        covered[2] > 0 && covered[3] > 0 && covered[4] > 0 && covered[5] > 0,
        "{covered:?}"
    );
}

/// Shared mode on the rows the bench draws: from [`SHARED_MIN_VOCAB`] on,
/// Gaussian rows (a sigma in [0.5, 8]) and their bf16 roundings are all
/// covered, with at most 1.3 k candidates from k = 1000, and Student-t rows
/// never (their chunks decline); whatever is covered lists its kept set.
/// Below it nothing is listed by shares.
#[test]
fn shared_lists_cover_gaussian_rows() {
    let mut rng = Rng(0x5a1e_d0c5);
    for vocab in [32_000usize, 128_256, 151_936, 262_144] {
        for k in [300u32, 1000, 2000, 4096] {
            // Gaussian, bf16-rounded Gaussian, Student-t (two degrees).
            let (mut covered, mut cands) = ([0u32; 3], [0usize; 3]);
            let rows = 12;
            for r in 0..rows {
                let shape = r % 3;
                let sigma = 0.5 + 7.5 * rng.unit() as f32;
                let row: Vec<f32> = (0..vocab)
                    .map(|_| match shape {
                        0 => sigma * rng.normal(),
                        1 => bf16_to_f32(f32_to_bf16(sigma * rng.normal())),
                        _ => {
                            let c = rng.normal().powi(2) + rng.normal().powi(2);
                            2.0 * rng.normal() / (c / 2.0).sqrt().max(1e-3)
                        }
                    })
                    .collect();
                let params = top_k_params(k);
                if let Some((cand, serves)) = candidates(&row, &params) {
                    assert!(!serves);
                    assert!(
                        holds(&cand, &kept(&row, &params)),
                        "V={vocab} k={k} row {r}: candidates miss the kept set"
                    );
                    covered[shape] += 1;
                    cands[shape] += cand.len();
                }
            }
            let per = |s: usize| cands[s] as f64 / f64::from(covered[s].max(1)) / k as f64;
            println!(
                "V={vocab} k={k}: covered {covered:?} of {} each, candidates / k {:.2} {:.2} {:.2}",
                rows / 3,
                per(0),
                per(1),
                per(2)
            );
            if (vocab as u32) < SHARED_MIN_VOCAB {
                assert_eq!(list_k(k, 1.0, vocab as u32), 0, "V={vocab} k={k}");
                assert_eq!(covered, [0; 3], "V={vocab} k={k}");
                continue;
            }
            assert_eq!(covered[0], rows as u32 / 3, "V={vocab} k={k} Gaussian");
            assert_eq!(covered[1], rows as u32 / 3, "V={vocab} k={k} bf16");
            assert_eq!(covered[2], 0, "V={vocab} k={k} Student-t");
            // Small shares ask for 8 more each: at most twice k.
            let bound = if k >= 1000 { 1.3 } else { 2.0 };
            assert!(per(0) < bound && per(1) < bound, "V={vocab} k={k}");
        }
    }
}

/// Shared mode on real SmolLM2 rows tiled to V (as the topk bench's real
/// lines): most rows are covered at every (V, k) from [`SHARED_MIN_VOCAB`]
/// (no chunk declines), each covered row's
/// candidates hold its kept set, and they number under 2.5 k from k = 1000
/// (the pre-filter's first tier lists about 2.3 k). Skipped, saying so,
/// without a logits corpus.
#[test]
fn shared_lists_cover_real_rows() {
    let rows = corpus::spread_rows("shared_lists_cover_real_rows", 64);
    if rows.is_empty() {
        println!("SKIPPED shared_lists_cover_real_rows: no logits corpus");
        return;
    }
    for vocab in [128_256usize, 151_936, 262_144] {
        for k in [300u32, 1000, 2000] {
            let (mut covered, mut cands) = (0usize, 0usize);
            for (r, row) in rows.iter().enumerate() {
                let tiled: Vec<f32> = row.logits.iter().copied().cycle().take(vocab).collect();
                let params = top_k_params(k);
                if let Some((cand, _)) = candidates(&tiled, &params) {
                    assert!(
                        holds(&cand, &kept(&tiled, &params)),
                        "V={vocab} k={k} real row {r}: candidates miss the kept set"
                    );
                    covered += 1;
                    cands += cand.len();
                }
            }
            let per = cands as f64 / covered.max(1) as f64 / k as f64;
            println!(
                "V={vocab} k={k}: {covered} of {} real rows covered, candidates / k {per:.2}",
                rows.len()
            );
            assert!(4 * covered >= 3 * rows.len(), "V={vocab} k={k}: {covered}");
            if k >= 1000 {
                assert!(per < 2.5, "V={vocab} k={k}: {per:.2}");
            }
        }
    }
}
