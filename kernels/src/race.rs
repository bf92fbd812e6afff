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

/// The approximate score a token must reach to be worth an exact look, given
/// the best approximate score `a` seen so far (see [`Race::visit`]).
#[inline(always)]
fn threshold(a: f32) -> f32 {
    if a == f32::INFINITY {
        f32::INFINITY
    } else {
        let mag = if a < 0.0 { -a } else { a };
        a - (2.0 * GUMBEL_APPROX_ERR + (mag + 1.0) * (1.0 / 2_097_152.0))
    }
}

/// One thread's share of a row's Gumbel-max race.
///
/// Exactness of the filter: each score is computed approximately (`a`) and,
/// if `a >= threshold(best a so far)`, exactly (`e`). With `|a - e| <= d`
/// (noise error plus f32 rounding, which `threshold`'s margin exceeds), the
/// thread's exact winner `w` satisfies `a_w >= e_w - d >= e_k - d >= a_k - 2d`
/// for every earlier `k`, so it is always looked at exactly: the thread's
/// exact maximum is the same as without the filter.
pub struct Race {
    greedy: bool,
    inv_t: f32,
    key: [u32; 2],
    offset: u64,
    /// The best key so far (0: none, an invalid row).
    pub best: u64,
    /// `x * inv_t` of the best key's token (`x` for greedy rows).
    pub best_xs: f32,
    best_a: f32,
    thr: f32,
}

impl Race {
    /// Whether the row is sampled greedily.
    #[inline(always)]
    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    /// Forgets the best key (keeping the filter's threshold, which stays a
    /// valid bound): the next keys found are the best of a new tile.
    #[inline(always)]
    pub fn reset_best(&mut self) {
        self.best = 0;
        self.best_xs = f32::NAN;
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
            best_a: f32::NEG_INFINITY,
            thr: f32::NEG_INFINITY,
        }
    }

    /// Token `j` with logit `x`, scaled logit `xs = x * inv_t` and noise
    /// word `bits`.
    #[inline(always)]
    fn visit(&mut self, x: f32, xs: f32, bits: u32, j: u32) {
        // Cheapest rejection first, integer and add only (no conversion or
        // logarithm, which run at a quarter of the ALU rate): for all but one
        // word in 256 the noise is at most GUMBEL_BOUND_COMMON, so with the
        // approximation error (twice, covering the rounding of the sum) a
        // token below the threshold by more than that is skipped, as the
        // approximate test below would skip it.
        if !bits >= noise::COMMON_WORD_MIN && xs + COMMON_CAP < self.thr {
            return;
        }
        let a = if x == f32::INFINITY {
            f32::INFINITY
        } else {
            xs + gumbel_approx(bits)
        };
        if a >= self.thr {
            let k = sample::gumbel_key(x, self.inv_t, bits, j);
            if k > self.best {
                self.best = k;
                self.best_xs = xs;
            }
            if a > self.best_a {
                self.best_a = a;
                self.thr = threshold(a);
            }
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
            let xs = [
                x[0] * self.inv_t,
                x[1] * self.inv_t,
                x[2] * self.inv_t,
                x[3] * self.inv_t,
            ];
            // No noise can lift any of the four to the threshold: skip the
            // Philox call (typical of real, peaked logits at T <= 1).
            let top = xs[0].max(xs[1]).max(xs[2].max(xs[3]));
            if top + NOISE_CAP < self.thr {
                return;
            }
            let r = philox::token_noise_group(self.key, self.offset, j >> 2);
            self.visit(x[0], xs[0], r[0], j);
            self.visit(x[1], xs[1], r[1], j + 1);
            self.visit(x[2], xs[2], r[2], j + 2);
            self.visit(x[3], xs[3], r[3], j + 3);
        }
    }

    #[inline(always)]
    pub fn visit1(&mut self, x: f32, j: u32) {
        if self.greedy {
            self.visit_greedy(x, j);
        } else {
            self.visit(
                x,
                x * self.inv_t,
                philox::token_noise(self.key, self.offset, j),
                j,
            );
        }
    }
}
