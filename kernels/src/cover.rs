//! Chunk lists that cover a row's top k (issue 4): the portable rules of
//! the chunked Qrita route's first pass, shared by the GPU kernels and the
//! CPU emulation in the tests below.
//!
//! The chunked route reads each chunk of [`crate::params::TOPK_TOPP_CHUNK`]
//! elements once for the row's statistics. For a row whose effective top-k
//! is small ([`list_k`], at most [`LOCAL_MAX_K`]), the same pass also
//! lists, per chunk, every element at or above a **chunk floor** taken
//! from the chunk's own statistics (the Gaussian pre-filter applied to the
//! chunk, [`floor_keys`] for [`chunk_ask`]'s targets), chosen among tiers
//! ([`local_choice`]) so that the chunk lists at least its own `k` largest
//! elements, or all its finite ones. Then:
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
//! Above [`LOCAL_MAX_K`] (up to [`SHARED_MAX_K`]) a chunk's own top k
//! would be most of a row's candidates many times over, so each chunk lists
//! only its **share**: the elements at or above the floor the chunk's
//! statistics put at [`shared_target_count`] elements (its part of the
//! row's k, with a wide slack). Every element of the row at or above the
//! highest floor `F` is then listed, and so is every element at or above
//! any key `f >= F`. The plan counts the listed elements at five such keys
//! ([`shared_floors`]: `F` and the row's own Gaussian floors for
//! [`SHARED_TIGHT_FACTORS`] times k, never below `F`) and takes the highest
//! that k listed elements reach (the row's top k lie at or above it), or
//! min-p's key when it lies at or above `F` (every element min-p keeps is
//! listed) ([`shared_cover`]). Real logits crowd their likely tokens into a
//! few chunks (SmolLM2's common tokens sit in its first 8192 ids), whose
//! Gaussian model is barely above the others': the slack lets every chunk
//! list several shares, so that the crowded chunk's extra elements are
//! still found, and the row's own floors keep the candidates near k.
//!
//! Shares are listed only in vocabularies of at least [`SHARED_MIN_VOCAB`],
//! and a chunk whose tail its Gaussian model does not describe declines
//! ([`chunk_lists`]).
//!
//! The floors are a speed device only: a row whose chunks could not list
//! (a +inf entry, more elements at the loosest tier than a list holds, a
//! declined share, or top-k off or above [`SHARED_MAX_K`]) or that the
//! lists do not cover takes the pre-filter pass as before. No function
//! here panics on any input.

use crate::params::TOPK_TOPP_CHUNK;
use crate::pivot::{RowStats, upper_quantile_floor};
use crate::radix::f32_key;

/// Largest effective top-k whose rows the first pass lists chunk by chunk:
/// a chunk then lists about `k + 3 sqrt(k) + 8` elements (312 at 256),
/// well inside a chunk list's capacity.
pub const LOCAL_MAX_K: u32 = 256;

/// Largest effective top-k whose rows the first pass lists at all: from
/// [`LOCAL_MAX_K`] up, each chunk lists its share of the row's top k
/// ([`shared_target_count`]). A Gaussian row's candidates then number
/// about `1.2 k`: at k = 1000 a sort of 2048 rather than the pre-filter's
/// about 2260 candidates and a sort of 4096.
pub const SHARED_MAX_K: u32 = 4096;

/// Least vocabulary whose rows are listed by shares: below it a row is a
/// few chunks (32000: four), whose pre-filter pass re-reads little, and on
/// the H200 (session 34, V = 32000, B >= 512, k = 1000) listing about 6 k
/// entries a row cost more than the pass it saves: Gaussian, bf16 and real
/// rows 9 to 15 % slower.
pub const SHARED_MIN_VOCAB: u32 = 65_536;

/// A chunk whose largest element lies more than this many standard
/// deviations above its mean does not list its share ([`chunk_lists`]):
/// its Gaussian floors say nothing of its tail, so its row would not be
/// covered and the list would be written for nothing (heavy-tailed rows paid
/// 2 to 9 % for it on the H200, session 34). Session 29's chunks: Gaussian
/// and bf16 3.2 to 5.1, real SmolLM2 2.9 to 9.2, Student-t 4 to 70
/// (median 31).
pub const SHARED_DECLINE_Z: f32 = 12.0;

/// How many times its share of the row's k ([`shared_target_count`]) a
/// chunk lists in shared mode. In the CPU emulation (`tests/cover.rs`) a
/// slack of 1.1 covered every Gaussian row but 7 of 64 real SmolLM2 rows
/// tiled to V = 128256 at k = 1000; 2 covered 15, 3 34, 4 54 and 6 63. The
/// candidates do not grow with it: the plan picks its floor from the row
/// ([`shared_floors`]). A row's lists then hold about 6 k entries.
pub const SHARED_SLACK: f32 = 6.0;

/// The row's own Gaussian floors the plan tries in shared mode, as
/// multiples of k expected elements at or above them ([`shared_floors`]):
/// real rows' heavier upper tails often reach k listed elements at the 0.5
/// or 0.75 floor, Gaussian rows at 1.05.
pub const SHARED_TIGHT_FACTORS: [f32; 4] = [0.5, 0.75, 1.05, 1.3];

/// How many times more expected elements the chunk's second tier asks for
/// than its first ([`chunk_ask`]).
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
/// [`effective_k`] when top-k cuts and keeps at most [`LOCAL_MAX_K`], or at
/// most [`SHARED_MAX_K`] in a vocabulary of at least [`SHARED_MIN_VOCAB`];
/// else 0 (no lists).
#[inline(always)]
pub fn list_k(top_k: u32, temperature: f32, vocab: u32) -> u32 {
    let k = effective_k(top_k, temperature, vocab);
    let listed = k <= LOCAL_MAX_K || (k <= SHARED_MAX_K && vocab >= SHARED_MIN_VOCAB);
    if k < vocab && listed { k } else { 0 }
}

/// Whether the chunks of a row listed for k `k` ([`list_k`]) list their
/// share of it rather than their own top k.
#[inline(always)]
pub fn is_shared(k: u32) -> bool {
    k > LOCAL_MAX_K
}

/// Whether a chunk with statistics `stats` (taken with `shift`) lists for
/// k `k` ([`list_k`]; 0: no lists): always for its own top k, and for a
/// share unless it declines, its largest element more than
/// [`SHARED_DECLINE_Z`] standard deviations above its mean (a chunk with
/// NaN statistics does not decline).
#[inline(always)]
pub fn chunk_lists(k: u32, stats: &RowStats, shift: f32) -> bool {
    let declines = |stats: &RowStats| {
        let (mu, sd) = stats.mean_sd(shift);
        stats.max() - mu > SHARED_DECLINE_Z * sd
    };
    !(k == 0 || (is_shared(k) && declines(stats)))
}

/// Elements a chunk of `len` elements of a row of `vocab` asks its floor
/// for in shared mode: its share `s = floor(k len / vocab)` of the row's k
/// as `SHARED_SLACK s + 8`, at most three quarters of its list's capacity
/// `cap` (so that a chunk a little above its model still lists).
#[inline(always)]
pub fn shared_target_count(k: u32, len: u32, vocab: u32, cap: u32) -> f32 {
    // k <= SHARED_MAX_K and len <= TOPK_TOPP_CHUNK: the product fits.
    let m =
        SHARED_SLACK * (k.min(SHARED_MAX_K) * len.min(TOPK_TOPP_CHUNK) / vocab.max(1)) as f32 + 8.0;
    m.min(0.75 * cap as f32)
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

/// What a chunk lists for: its two tiers' target counts (expected elements
/// at or above each floor, [`floor_keys`]) and how many elements the tier
/// it lists must hold ([`local_choice`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkAsk {
    pub targets: [f32; 2],
    pub need: u32,
}

/// What a chunk of `len` elements of a row of `vocab` lists for k `k >= 1`
/// ([`list_k`]) into a list of `cap` entries: its own top k
/// ([`local_target_count`] and [`LOCAL_SECOND_TIER_FACTOR`] times it, at
/// least k elements), or in shared mode its share ([`shared_target_count`]
/// for both tiers, no least count: the plan decides whether the row is
/// covered, [`shared_cover`]). Computed before the chunk's loads: the
/// statistics pass then holds two targets across them, not the mode.
#[inline(always)]
pub fn chunk_ask(k: u32, len: u32, vocab: u32, cap: u32) -> ChunkAsk {
    if is_shared(k) {
        let m = shared_target_count(k, len, vocab, cap);
        ChunkAsk {
            targets: [m, m],
            need: 0,
        }
    } else {
        let m = local_target_count(k);
        ChunkAsk {
            targets: [m, LOCAL_SECOND_TIER_FACTOR * m],
            need: k,
        }
    }
}

/// The floors for the target counts `m` (expected elements at or above
/// each) from statistics `stats` (taken with `shift`) of a chunk
/// ([`ChunkAsk`]'s two tiers) or a row ([`shared_floors`]): `mu + delta
/// sigma` of the finite elements with `delta` for `m[i]` expected elements
/// at or above it, never above the largest element, never below
/// [`LEAST_FINITE_KEY`] (the key of all finite elements, also where the
/// model says nothing: fewer finite elements than the target, NaN
/// statistics).
#[inline(always)]
pub fn floor_keys<const N: usize>(stats: &RowStats, shift: f32, m: [f32; N]) -> [u32; N] {
    let (mu, sd) = stats.mean_sd(shift);
    let n = stats.n_finite as f32;
    m.map(|m| {
        if m >= n {
            return LEAST_FINITE_KEY;
        }
        let t = (mu + upper_quantile_floor(m / n) * sd).min(stats.max());
        if t.is_nan() {
            LEAST_FINITE_KEY
        } else {
            f32_key(t.to_bits()).max(LEAST_FINITE_KEY)
        }
    })
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
/// first tier that reaches `need` ([`ChunkAsk`]) and fits, else all its
/// finite elements when they fit; `None` (the row is not covered) when the
/// chunk holds +inf or the loosest tier that could serve does not fit. (A
/// share, `need` 0: the first tier when it fits, as no tier counts more
/// than the finite elements.)
#[inline(always)]
pub fn local_choice(
    counts: [u32; 2],
    n_finite: u32,
    n_posinf: u32,
    need: u32,
    cap: u32,
) -> Option<LocalTier> {
    if n_posinf > 0 {
        None
    } else if counts[0] >= need && counts[0] <= cap {
        Some(LocalTier::First)
    } else if counts[1] >= need && counts[1] <= cap {
        Some(LocalTier::Second)
    } else if n_finite <= cap {
        Some(LocalTier::Finite)
    } else {
        None
    }
}

/// The keys at which the plan counts the listed elements of a row whose
/// chunks listed their shares of k `k` ([`is_shared`]) and whose highest
/// chunk floor is `f_max`: `f_max` itself, then the row's Gaussian floors
/// ([`floor_keys`] of its statistics `stats`, taken with `shift`) for
/// [`SHARED_TIGHT_FACTORS`] times k expected elements, each at least
/// `f_max`, so that every element of the row at or above each is listed.
#[inline(always)]
pub fn shared_floors(stats: &RowStats, shift: f32, k: u32, f_max: u32) -> [u32; 5] {
    let k = k as f32;
    let g = floor_keys(stats, shift, SHARED_TIGHT_FACTORS.map(|f| f * k));
    [
        f_max,
        g[0].max(f_max),
        g[1].max(f_max),
        g[2].max(f_max),
        g[3].max(f_max),
    ]
}

/// The candidate floor of a row listed by shares ([`is_shared`]) when the
/// lists cover it, else `None`: every chunk listed (`f_max`, the highest
/// chunk floor, is not [`NO_LIST`]), no +inf, and either one of the
/// `floors` ([`shared_floors`], each at least `f_max`) has at least k of
/// the listed elements at or above it (`at`; every element of the row at
/// or above it is listed, so the row's top k lie at or above it), or
/// min-p's key `min_key` is at least `f_max` (every element min-p keeps is
/// listed). The floor is the highest such of `floors`, else `f_max`, and at
/// least `min_key`.
#[inline(always)]
pub fn shared_cover(
    f_max: u32,
    n_posinf: u32,
    floors: [u32; 5],
    at: [u32; 5],
    min_key: u32,
    k: u32,
) -> Option<u32> {
    if f_max == NO_LIST || n_posinf > 0 || k == 0 {
        return None;
    }
    let mut pick = None;
    for (&f, &n) in floors.iter().zip(at.iter()) {
        if n >= k && pick.is_none_or(|p| f > p) {
            pick = Some(f);
        }
    }
    match pick {
        Some(f) => Some(f.max(min_key)),
        None if min_key >= f_max => Some(min_key),
        None => None,
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
    use super::*;

    #[test]
    fn least_finite_key_is_the_key_of_minus_max() {
        assert_eq!(LEAST_FINITE_KEY, f32_key((-f32::MAX).to_bits()));
        assert_eq!(LEAST_FINITE_KEY, f32_key(f32::NEG_INFINITY.to_bits()) + 1);
    }

    #[test]
    fn shared_cover_takes_the_highest_floor_k_listed_elements_reach() {
        let floors = [10, 40, 30, 20, 15];
        // k = 5: floors 20, 15 and 10 hold 5 or more: the highest, 20.
        assert_eq!(shared_cover(10, 0, floors, [9, 2, 4, 5, 7], 0, 5), Some(20));
        // min-p's key above the pick raises the floor.
        assert_eq!(
            shared_cover(10, 0, floors, [9, 2, 4, 5, 7], 25, 5),
            Some(25)
        );
        // None reaches k: covered only when min-p's key is at least F.
        assert_eq!(shared_cover(10, 0, floors, [4; 5], 9, 5), None);
        assert_eq!(shared_cover(10, 0, floors, [4; 5], 10, 5), Some(10));
        // A chunk without a list, +inf, k = 0.
        assert_eq!(shared_cover(NO_LIST, 0, floors, [9; 5], 0, 5), None);
        assert_eq!(shared_cover(10, 1, floors, [9; 5], 0, 5), None);
        assert_eq!(shared_cover(10, 0, floors, [9; 5], 0, 0), None);
    }
}
