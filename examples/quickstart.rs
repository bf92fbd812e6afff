//! Samples a few decoding steps for a small batch, on the GPU when there is
//! one and on the float64 CPU backend otherwise, and checks the two agree
//! when both are available.
//!
//! `cargo run --release --example quickstart`

use flashsample::{Backend, Result};

fn main() -> Result<()> {
    let (mut backend, why) = Backend::auto();
    println!("sampling on {} ({why})", backend.describe());

    // Four requests over a 32000-token vocabulary: greedy, and three
    // temperatures, each with its own seed. Logits: a smooth deterministic
    // shape with a few strong candidates, like a language model's.
    let vocab = 32_000;
    let temperature = [0.0f32, 0.7, 1.0, 1.5];
    let seed = [1u64, 2, 3, 4];
    let batch = temperature.len();
    let mut logits = vec![0.0f32; batch * vocab];
    for (r, row) in logits.chunks_mut(vocab).enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            let t = j as f32 * 0.001 + r as f32;
            *x = 4.0 * (t * 7.3).sin() * (t * 0.37).cos() + if j % 997 == r { 6.0 } else { 0.0 };
        }
    }
    let mut cpu = Backend::Cpu;
    for step in 0..4u64 {
        let offset = [step; 4];
        let tokens = backend.sample_from_logits(&logits, vocab, &temperature, &seed, &offset)?;
        let shown: Vec<String> = tokens
            .iter()
            .map(|t| t.map_or("invalid".into(), |t| t.to_string()))
            .collect();
        println!("step {step}: tokens {}", shown.join(", "));
        if !matches!(backend, Backend::Cpu) {
            let reference = cpu.sample_from_logits(&logits, vocab, &temperature, &seed, &offset)?;
            let same = reference
                .iter()
                .zip(&tokens)
                .filter(|(a, b)| a == b)
                .count();
            println!("        float64 CPU reference agrees on {same} of {batch} rows");
        }
    }
    Ok(())
}
