//! Qrita selection statistics on real logits: runs the portable pivot
//! selection (`flashsample::kernels::pivot::select_row`, the algorithm the
//! GPU kernel will run) over the SmolLM2 logits corpus and prints, per
//! (k, p) and temperature, the sigma pre-filter's outcome, the candidates
//! searched and the pivot rounds; every kept set is checked against the
//! float64 reference.
//!
//! `cargo xtask logits-corpus && cargo run --release --example pivot_stats`

#[path = "../tests/corpus/mod.rs"]
mod corpus;

use flashsample::kernels::pivot::{Prefilter, RowParams, select_row};
use flashsample::kernels::radix::f32_key;
use flashsample::reference::{self, SamplingParams};

fn main() -> Result<(), String> {
    let path = std::env::var("FLASHSAMPLE_CORPUS")
        .map(std::path::PathBuf::from)
        .or_else(|_| corpus::default_path())?;
    let rows = corpus::read_all(&path)
        .map_err(|e| format!("{}: {e} (run cargo xtask logits-corpus)", path.display()))?;
    println!(
        "{} real rows of {} logits from {}",
        rows.len(),
        rows[0].logits.len(),
        path.display()
    );
    println!(
        "| top_k | top_p | T | rows | pre-filter hit | 2nd tier | fallback | mean candidates | mean kept | top-k rounds | top-p rounds | tie rounds |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (top_k, top_p) in [(50u32, 0.9f32), (1000, 0.9), (0, 0.9), (50, 1.0)] {
        for t in [0.7f32, 1.0] {
            let (mut hit, mut second, mut fallback) = (0, 0, 0);
            let (mut cand, mut kept, mut rk, mut rp, mut rt) = (0u64, 0u64, 0u64, 0u64, 0u64);
            for row in &rows {
                let p = RowParams {
                    top_k,
                    top_p,
                    min_p: 0.0,
                    temperature: t,
                    prefilter: true,
                };
                let s = select_row(&row.logits, &p);
                match s.prefilter {
                    Prefilter::Hit => hit += 1,
                    Prefilter::HitSecondTier => second += 1,
                    Prefilter::Fallback => fallback += 1,
                    Prefilter::Unused => {}
                }
                cand += u64::from(s.candidates);
                kept += u64::from(s.kept);
                rk += u64::from(s.topk_rounds);
                rp += u64::from(s.topp_rounds);
                rt += u64::from(s.tie_rounds);
                let sp = SamplingParams {
                    temperature: t,
                    top_k,
                    top_p,
                    ..SamplingParams::default()
                };
                let want = reference::kept_set(&row.logits, &sp).map_err(|e| e.to_string())?;
                let got: Vec<u32> = (0..row.logits.len() as u32)
                    .filter(|&j| s.cut.keeps(f32_key(row.logits[j as usize].to_bits()), j))
                    .collect();
                reference::kept_sets_agree(&row.logits, &sp, &got).map_err(|e| {
                    format!(
                        "prompt {} step {} k={top_k} p={top_p} T={t}: {e} (reference keeps {})",
                        row.prompt,
                        row.step,
                        want.len()
                    )
                })?;
            }
            let n = rows.len() as f64;
            println!(
                "| {top_k} | {top_p} | {t} | {} | {:.3} | {:.3} | {:.3} | {:.0} | {:.1} | {:.2} | {:.2} | {:.2} |",
                rows.len(),
                f64::from(hit) / n,
                f64::from(second) / n,
                f64::from(fallback) / n,
                cand as f64 / n,
                kept as f64 / n,
                rk as f64 / n,
                rp as f64 / n,
                rt as f64 / n
            );
        }
    }
    println!("every kept set equals the float64 reference's");
    Ok(())
}
