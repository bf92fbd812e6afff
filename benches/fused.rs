//! GPU bench of the fused LM-head sampler against cuBLAS in the same run.
//!
//! For every (V, d, B): the HBM floor (the LM head's bytes over the read
//! bandwidth measured in this run), cuBLAS computing the same logits
//! (bf16 output, the matmul alone), the unfused pipeline (cuBLAS f32 logits
//! then `sampling_from_logits`), and the fused kernel; the targets
//! (fused <= 1.02 x cuBLAS for B <= 64, <= 1.15 x for B >= 128, faster than
//! unfused everywhere, >= 90 % of the read bandwidth for B <= 8), and the
//! PyTorch references of `benches/torch_reference.py` when given. Writes a
//! markdown table to `FLASHSAMPLE_BENCH_OUT` when set.

#[path = "../tests/common/mod.rs"]
mod common;
mod harness;

use std::fmt::Write as _;

use cudarc::driver::CudaSlice;
use flashsample::{FusedOutput, HeadShape, Result, RowParams, SampleOutput, Unfused};
use half::bf16;
use harness::time_us;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `n` random bf16 values of scale `s` (a 16 Mi pattern, tiled).
fn random_bf16(rng: &mut StdRng, n: usize, s: f32) -> Vec<bf16> {
    let pattern: Vec<bf16> = (0..(n.min(1 << 24)))
        .map(|_| bf16::from_f32(s * (rng.random::<f32>() * 2.0 - 1.0)))
        .collect();
    pattern.iter().copied().cycle().take(n).collect()
}

fn main() -> Result<()> {
    let Some(harness::Setup {
        dev,
        stream,
        mut ws,
        refs,
        read_bw,
    }) = harness::setup("bench fused")?
    else {
        return Ok(());
    };
    let mut unfused = Unfused::new(&stream)?;
    let mut rng = StdRng::seed_from_u64(3);
    let mut table = String::new();
    writeln!(
        table,
        "read bandwidth {:.0} GB/s (1 GiB read, same run)\n",
        read_bw / 1e9
    )
    .ok();
    writeln!(
        table,
        "| V | d | B | floor us | cuBLAS us | unfused us | fused us | fused / cuBLAS | target | fused GB/s | ok | PyTorch same run |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .ok();
    let mut misses = 0;
    for (vocab, dim) in [(151_936usize, 4096usize), (128_256, 8192), (262_144, 5376)] {
        let w: CudaSlice<bf16> = stream.clone_htod(&random_bf16(
            &mut rng,
            vocab * dim,
            3.0 / (dim as f32).sqrt(),
        ))?;
        let h: CudaSlice<bf16> = stream.clone_htod(&random_bf16(&mut rng, 256 * dim, 1.0))?;
        let floor = (vocab * dim * 2) as f64 / read_bw * 1e6;
        for batch in [1usize, 8, 32, 64, 128, 256] {
            if !harness::selected(&format!("fused bf16 B={batch} V={vocab} d={dim}")) {
                continue;
            }
            let shape = HeadShape::new(batch, vocab, dim);
            let hv = h.slice(..batch * dim);
            let params = RowParams::upload(
                &stream,
                &vec![0.8; batch],
                &(0..batch as u64).collect::<Vec<_>>(),
                &vec![0; batch],
            )?;
            let mut mm_out: CudaSlice<bf16> = stream.alloc_zeros(batch * vocab)?;
            let t_blas = time_us(&stream, 3, 5, |_| {
                unfused.matmul_16bit(&hv, &w.as_view(), shape, &mut mm_out)
            })?;
            let mut sout = SampleOutput::new(&stream, batch)?;
            let t_unfused = time_us(&stream, 3, 5, |_| {
                unfused.sample(&dev, &hv, &w.as_view(), shape, &params, &mut sout, &mut ws)
            })?;
            let mut fout = FusedOutput::new(&stream, batch)?;
            let t_fused = time_us(&stream, 3, 5, |_| {
                dev.fused_sample(
                    &stream,
                    &hv,
                    &w.as_view(),
                    None,
                    shape,
                    &params,
                    &mut fout,
                    &mut ws,
                )
            })?;
            let ratio = t_fused / t_blas;
            let target = if batch <= 64 { 1.02 } else { 1.15 };
            let gbs = (vocab * dim * 2) as f64 / (t_fused * 1e-6) / 1e9;
            let ok =
                ratio <= target && t_fused < t_unfused && (batch > 8 || gbs >= 0.9 * read_bw / 1e9);
            misses += usize::from(!ok);
            let case = format!("fused bf16 B={batch} V={vocab} d={dim}");
            writeln!(
                table,
                "| {vocab} | {dim} | {batch} | {floor:.1} | {t_blas:.1} | {t_unfused:.1} | {t_fused:.1} | {ratio:.3} | {target} | {gbs:.0} | {} | {} |",
                if ok { "yes" } else { "NO" },
                refs.case(&case)
            )
            .ok();
            println!(
                "V={vocab} d={dim} B={batch}: cuBLAS {t_blas:.1} us, unfused {t_unfused:.1} us, fused {t_fused:.1} us ({ratio:.3} x cuBLAS)"
            );
        }
    }
    harness::report(&table)?;
    if misses > 0 {
        println!("{misses} case(s) miss a target");
    }
    Ok(())
}
