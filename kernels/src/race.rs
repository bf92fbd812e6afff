//! One thread's share of a Gumbel-max race, shared by every sampling kernel:
//! the approximate-noise candidate filter and the exact decision.

use crate::arch;
use crate::noise::{self, GUMBEL_APPROX_ERR};
use crate::philox;
use crate::sample;

const LN2: f32 = core::f32::consts::LN_2;

/// Gumbel noise from the hardware logarithm (`lg2.approx`): cheap, within
/// [`GUMBEL_APPROX_ERR`] of the exact value, used only to skip tokens that
/// cannot win.
#[inline(always)]
pub fn gumbel_approx(bits: u32) -> f32 {
    let (t, upper) = noise::split_unit(bits);
    // E = -ln u; u = 1 - t in the upper half, where a short series keeps the
    // relative precision of tiny t (error below t^4 / 5 <= 3.1e-6).
    let e_series = t * (1.0 + t * (0.5 + t * (1.0 / 3.0 + t * 0.25)));
    let w = if upper { 1.0 - t } else { t };
    let e_log = -LN2 * arch::lg2_approx_f32(w);
    let e = if upper && t < 0.0625 { e_series } else { e_log };
    -LN2 * arch::lg2_approx_f32(e)
}

/// Above every approximate noise value: [`noise::GUMBEL_MAX`] plus twice
/// the approximation error.
const NOISE_CAP: f32 = noise::GUMBEL_MAX + 2.0 * GUMBEL_APPROX_ERR;
/// Above the approximate noise of every common word (see [`Race::visit`]).
const COMMON_CAP: f32 = noise::GUMBEL_BOUND_COMMON + 2.0 * GUMBEL_APPROX_ERR;
/// Above the approximate noise of every word in the lower half.
const LOWER_CAP: f32 = noise::GUMBEL_BOUND_LOWER + 2.0 * GUMBEL_APPROX_ERR;

/// Twice the largest distance between an approximate score `a` and the
/// exact score of the same token, for scores of magnitude up to `mag`: the
/// noise error twice plus a relative 2^-21 (f32 rounding of the sums is
/// below 2^-23 relative).
#[inline(always)]
fn margin(mag: f32) -> f32 {
    2.0 * GUMBEL_APPROX_ERR + (mag + 1.0) * (1.0 / 2_097_152.0)
}

/// The approximate score a token must reach to be worth a look, given the
/// best approximate score `a` seen so far (see [`Race`]).
#[inline(always)]
fn threshold(a: f32) -> f32 {
    if a == f32::INFINITY {
        f32::INFINITY
    } else {
        a - margin(if a < 0.0 { -a } else { a })
    }
}

/// `top` plus [`noise::gumbel_clz_bound`] of word `w` plus the
/// approximation error twice, as `(clz(!w) ln 2 + top) + (ln 2 + 2 err)`:
/// a fused multiply-add and an add instead of a multiply and two adds,
/// rounded twice like the sum it stands for.
#[inline(always)]
fn group_score(top: f32, w: u32) -> f32 {
    let ln2 = noise::LN2_UP;
    arch::fma_f32((!w).leading_zeros() as f32, ln2, top) + (ln2 + 2.0 * GUMBEL_APPROX_ERR)
}

/// The largest of a group's four noise words (its bound's word).
#[inline(always)]
fn max_word(r: [u32; 4]) -> u32 {
    r[0].max(r[1]).max(r[2].max(r[3]))
}

/// The exact key of a token ([`sample::gumbel_key`]), out of line: it is
/// needed at most a few times per thread and row, and inlined at every
/// token it made the hot loop too large for the instruction cache.
#[inline(never)]
fn exact_key(x: f32, inv_t: f32, bits: u32, j: u32) -> u64 {
    sample::gumbel_key(x, inv_t, bits, j)
}

/// The token a thread currently holds, known by its approximate score until
/// a near tie (or the end) asks for its exact key.
#[derive(Clone, Copy)]
struct Held {
    a: f32,
    x: f32,
    xs: f32,
    bits: u32,
    j: u32,
}

/// One thread's share of a row's Gumbel-max race.
///
/// Each token's score is first computed approximately (`a`, hardware
/// logarithm, `|a - e| <= d` with `e` the exact score and `2d` below
/// [`margin`]); the exact key, which costs a correctly rounded logarithm and
/// a division, is computed only when two tokens' approximate scores are
/// within the margin of each other, and once for the token held at the end.
///
/// Exactness: a token whose `a` is below `threshold(A)`, with `A` the
/// approximate score of any token `m` already seen (by this thread or, after
/// [`Race::raise`], by another thread of the row), has `e <= a + d <
/// A - d <= e_m`: it cannot win, and is skipped. Among the others the thread
/// holds one token `h` with the largest exact key so far: a newcomer whose
/// `a` exceeds `a_h` by more than the margin has the larger exact score and
/// replaces it without an exact look; one below by more than the margin
/// cannot beat it; in between both exact keys decide. So the key the thread
/// reports is the largest exact key among the tokens it did not skip, and
/// the row's winner is never skipped.
pub struct Race {
    greedy: bool,
    inv_t: f32,
    key: [u32; 2],
    offset: u64,
    /// Greedy rows: the best key so far (0: none). Sampled rows: the held
    /// token's exact key once computed, else 0 (no exact key is 0: its
    /// score field is never zero).
    best: u64,
    /// `x * inv_t` of the best key's token (greedy: `x`).
    best_xs: f32,
    held: Option<Held>,
    /// The largest approximate score seen (this thread's or a raised one).
    top_a: f32,
    thr: f32,
}

impl Race {
    /// Whether the row is sampled greedily.
    #[inline(always)]
    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    #[inline(always)]
    pub fn new(temperature: f32, seed: u64, offset: u64) -> Race {
        Race {
            greedy: sample::is_greedy(temperature),
            inv_t: 1.0 / temperature,
            key: philox::seed_key(seed),
            offset,
            best: 0,
            best_xs: f32::NAN,
            held: None,
            top_a: f32::NEG_INFINITY,
            thr: f32::NEG_INFINITY,
        }
    }

    /// The largest approximate score this thread has seen (or been raised
    /// to), for sharing with the other threads of the row.
    #[inline(always)]
    pub fn top_score(&self) -> f32 {
        self.top_a
    }

    /// The approximate score of token `j` with logit `x` (the value
    /// [`Race::visit4`] computes for it): any thread of the row may
    /// [`Race::raise`] its filter to it, since it is a token's approximate
    /// score. Sampled rows only.
    #[inline(always)]
    pub fn approx_score(&self, x: f32, j: u32) -> f32 {
        if x == f32::INFINITY {
            f32::INFINITY
        } else {
            x * self.inv_t + gumbel_approx(philox::token_noise(self.key, self.offset, j))
        }
    }

    /// Raises the filter to an approximate score `a` that another thread of
    /// the same row has seen (a valid bound for every thread of the row).
    #[inline(always)]
    pub fn raise(&mut self, a: f32) {
        if a > self.top_a {
            self.top_a = a;
            self.thr = threshold(a);
        }
    }

    /// The thread's best key and its token's `x * inv_t` (greedy: `x`)
    /// since the last call (key 0: none); the filter keeps its threshold,
    /// which stays a valid bound for the next tokens of the row.
    #[inline(always)]
    pub fn take_best(&mut self) -> (u64, f32) {
        if let Some(h) = self.held {
            if self.best == 0 {
                self.best = exact_key(h.x, self.inv_t, h.bits, h.j);
                self.best_xs = h.xs;
            }
        }
        let out = (self.best, self.best_xs);
        self.best = 0;
        self.best_xs = f32::NAN;
        self.held = None;
        out
    }

    /// Offers token `j` with approximate score `a` (at least the threshold)
    /// against the held token.
    #[inline(always)]
    fn offer(&mut self, t: Held) {
        let Some(h) = self.held else {
            self.held = Some(t);
            return;
        };
        let (ma, mh) = (
            if t.a < 0.0 { -t.a } else { t.a },
            if h.a < 0.0 { -h.a } else { h.a },
        );
        let m = margin(if ma > mh { ma } else { mh });
        if t.a - h.a > m {
            self.held = Some(t);
            self.best = 0;
        } else if !(h.a - t.a > m) {
            // Within the margin (or infinite, NaN differences): exact keys.
            if self.best == 0 {
                self.best = exact_key(h.x, self.inv_t, h.bits, h.j);
                self.best_xs = h.xs;
            }
            let k = exact_key(t.x, self.inv_t, t.bits, t.j);
            if k > self.best {
                self.best = k;
                self.best_xs = t.xs;
                self.held = Some(t);
            }
        }
    }

    /// The cheapest rejection, integer selects and an add only (no
    /// conversion or logarithm, which run at a quarter of the ALU rate):
    /// whether token `xs` with noise word `bits` may reach the threshold.
    /// The noise of a word in the lower half is at most
    /// `GUMBEL_BOUND_LOWER`, and of all but one word in 256 at most
    /// `GUMBEL_BOUND_COMMON`; with the approximation error (twice, covering
    /// the rounding of the sum) a token below the threshold by more than
    /// that would fail the approximate test of [`Race::visit`] too. Branch
    /// free, so that four tokens cost one branch.
    #[inline(always)]
    fn may_reach(&self, xs: f32, bits: u32) -> bool {
        let cap = if bits < 0x8000_0000 {
            LOWER_CAP
        } else if !bits >= noise::COMMON_WORD_MIN {
            COMMON_CAP
        } else {
            // One word in 256: no cheap bound.
            f32::INFINITY
        };
        // NaN fails here, as it fails the approximate test.
        xs + cap >= self.thr
    }

    /// Token `j` with logit `x`, scaled logit `xs = x * inv_t` and noise
    /// word `bits`, which passed [`Race::may_reach`].
    #[inline(always)]
    fn visit(&mut self, x: f32, xs: f32, bits: u32, j: u32) {
        let a = if x == f32::INFINITY {
            f32::INFINITY
        } else {
            xs + gumbel_approx(bits)
        };
        if a >= self.thr {
            self.raise(a);
            self.offer(Held { a, x, xs, bits, j });
        }
    }

    #[inline(always)]
    fn visit_greedy(&mut self, x: f32, j: u32) {
        let k = sample::greedy_key(x, j);
        if k > self.best {
            self.best = k;
            self.best_xs = x;
        }
    }

    /// Four consecutive tokens `j .. j + 4`, `j` a multiple of 4 (one Philox
    /// call covers them). Written out rather than looped: an indexed loop
    /// over the arrays left them in local memory.
    #[inline(always)]
    pub fn visit4(&mut self, x: [f32; 4], j: u32) {
        if self.greedy {
            self.visit_greedy(x[0], j);
            self.visit_greedy(x[1], j + 1);
            self.visit_greedy(x[2], j + 2);
            self.visit_greedy(x[3], j + 3);
        } else {
            let top = self.scaled_top(x);
            // No noise can lift any of the four to the threshold: skip the
            // Philox call (typical of real, peaked logits at T <= 1).
            if self.out_of_reach(top) {
                return;
            }
            let r = philox::token_noise_group(self.key, self.offset, j >> 2);
            // One test for the group, branch free: the bound is
            // non-decreasing in the word, so at the largest scaled logit and
            // the largest word it bounds all four tokens. With the threshold
            // near its final value a group passes only when a word is in
            // the top 2^-12 of the range or a logit is near the threshold;
            // the cheaper three-step cap of `may_reach` (every word in the
            // top 2^-8 unbounded) sent 40 % of warps' groups down the
            // per-token path, 12 % slower at B = 1024. (A NaN `top`, from
            // an infinite `inv_t` or `T`, skips nothing: the per-token tests
            // decide.)
            if group_score(top, max_word(r)) < self.thr {
                return;
            }
            self.visit_passed(x, r, j);
        }
    }

    /// Sixteen tokens in four groups, group `i` starting at token `j[i]` (a
    /// multiple of 4) with logits `x(i)`, ignored unless `valid[i]`: what
    /// [`Race::visit4`] does for each, with the four groups' Philox calls
    /// made together, independent chains the scheduler interleaves, for
    /// kernels with few warps a scheduler (one chain leaves most issue slots
    /// idle there). `x` is called twice for a group that passes its noise
    /// bound, so that the logits need not stay in registers across the
    /// Philox calls.
    #[inline(always)]
    pub fn visit16(&mut self, x: impl Fn(usize) -> [f32; 4], j: [u32; 4], valid: [bool; 4]) {
        // Written out: indexed loops left the arrays in local memory.
        if self.greedy {
            if valid[0] {
                self.visit4(x(0), j[0]);
            }
            if valid[1] {
                self.visit4(x(1), j[1]);
            }
            if valid[2] {
                self.visit4(x(2), j[2]);
            }
            if valid[3] {
                self.visit4(x(3), j[3]);
            }
            return;
        }
        let top = |i: usize| {
            if valid[i] {
                self.scaled_top(x(i))
            } else {
                f32::NEG_INFINITY
            }
        };
        let tops = [top(0), top(1), top(2), top(3)];
        let need = |i: usize| valid[i] && !self.out_of_reach(tops[i]);
        let need = [need(0), need(1), need(2), need(3)];
        if !(need[0] | need[1] | need[2] | need[3]) {
            return;
        }
        let noise = |j: u32| philox::token_noise_group(self.key, self.offset, j >> 2);
        let r = [noise(j[0]), noise(j[1]), noise(j[2]), noise(j[3])];
        // Every group's bound before one branch: a bound tested only in its
        // group's branch let the compiler sink each Philox call into it,
        // one chain at a time again. Past the branch (rare) each bound is
        // tested again against the threshold of the moment.
        let pass = |i: usize, thr: f32| need[i] & !(group_score(tops[i], max_word(r[i])) < thr);
        if !(pass(0, self.thr) | pass(1, self.thr) | pass(2, self.thr) | pass(3, self.thr)) {
            return;
        }
        if pass(0, self.thr) {
            self.visit_passed(x(0), r[0], j[0]);
        }
        if pass(1, self.thr) {
            self.visit_passed(x(1), r[1], j[1]);
        }
        if pass(2, self.thr) {
            self.visit_passed(x(2), r[2], j[2]);
        }
        if pass(3, self.thr) {
            self.visit_passed(x(3), r[3], j[3]);
        }
    }

    /// The largest scaled logit of a group of four: scaling by `inv_t > 0`
    /// and rounding are monotone, so it is the largest of the four
    /// products, which are formed only for a group that passes.
    #[inline(always)]
    fn scaled_top(&self, x: [f32; 4]) -> f32 {
        x[0].max(x[1]).max(x[2].max(x[3])) * self.inv_t
    }

    /// Whether no noise can lift a group whose largest scaled logit is
    /// `top` to the threshold (its Philox call is skipped).
    #[inline(always)]
    fn out_of_reach(&self, top: f32) -> bool {
        top + NOISE_CAP < self.thr
    }

    /// The per-token tests of a group of four tokens from `j` whose noise
    /// words `r` passed the group's bound.
    #[inline(always)]
    fn visit_passed(&mut self, x: [f32; 4], r: [u32; 4], j: u32) {
        let xs = [
            x[0] * self.inv_t,
            x[1] * self.inv_t,
            x[2] * self.inv_t,
            x[3] * self.inv_t,
        ];
        let p = [
            self.may_reach(xs[0], r[0]),
            self.may_reach(xs[1], r[1]),
            self.may_reach(xs[2], r[2]),
            self.may_reach(xs[3], r[3]),
        ];
        if !(p[0] | p[1] | p[2] | p[3]) {
            return;
        }
        if p[0] {
            self.visit(x[0], xs[0], r[0], j);
        }
        if p[1] {
            self.visit(x[1], xs[1], r[1], j + 1);
        }
        if p[2] {
            self.visit(x[2], xs[2], r[2], j + 2);
        }
        if p[3] {
            self.visit(x[3], xs[3], r[3], j + 3);
        }
    }

    #[inline(always)]
    pub fn visit1(&mut self, x: f32, j: u32) {
        if self.greedy {
            self.visit_greedy(x, j);
        } else {
            let (xs, bits) = (
                x * self.inv_t,
                philox::token_noise(self.key, self.offset, j),
            );
            if self.may_reach(xs, bits) {
                self.visit(x, xs, bits, j);
            }
        }
    }
}
