//! Writes the SmolLM2 logits corpus (format and prompts: `tests/corpus/mod.rs`):
//! every prompt decoded at every corpus temperature for a fixed number of
//! steps, each step's f32 logits and final hidden state recorded, tokens
//! sampled by flashsample's float64 CPU reference (deterministic).
//!
//! Run it through `cargo xtask logits-corpus`; directly:
//! `cargo run --release --example corpus -- [--steps N] [--out PATH]`
//! (default 128 steps, the path next to the model).

#[path = "../tests/corpus/mod.rs"]
mod corpus;
#[path = "smollm/mod.rs"]
mod smollm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use candle_core::{Device, Module, Tensor};
use flashsample::Backend;
use flashsample::reference::SamplingParams;
use smollm::{HIDDEN, Model, Result, Sampler, VOCAB};

/// Decoding steps per (prompt, temperature) run unless `--steps` says
/// otherwise: 5 prompts x 3 temperatures x 128 steps = 1920 rows, 382 MB.
const DEFAULT_STEPS: usize = 128;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the options, then writes the corpus.
fn run() -> Result<()> {
    let mut steps = DEFAULT_STEPS;
    let mut out = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("`{arg}` needs a value"));
        match arg.as_str() {
            "--steps" => steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--out" => out = Some(PathBuf::from(value()?)),
            _ => {
                return Err(
                    format!("unknown argument `{arg}` (options: --steps N, --out PATH)").into(),
                );
            }
        }
    }
    let out = match out {
        Some(p) => p,
        None => corpus::default_path()?,
    };

    let path = smollm::cache::model_path()?;
    let (mut model, tokenizer) = Model::open(&path, true)?;
    // Checks the hidden states: the model's own LM head applied to them
    // must give back candle's logits bit for bit.
    let head = smollm::lm_head(&path)?;
    let mut mismatches = 0usize;
    let mut writer = corpus::Writer::create(&out, VOCAB, HIDDEN)?;
    let start = Instant::now();
    for (p, prompt) in corpus::PROMPTS.iter().enumerate() {
        let p = p as u32;
        let text = if prompt.chat {
            smollm::chat_prompt(prompt.text)
        } else {
            prompt.text.to_string()
        };
        let ids = tokenizer.encode(&text)?;
        for temperature in corpus::TEMPERATURES {
            let run = Instant::now();
            let params = SamplingParams {
                temperature,
                seed: corpus::seed(p),
                ..SamplingParams::default()
            };
            let mut sampler = Sampler::new(Backend::Cpu, params)?;
            let tokens = smollm::decode(&mut model, &ids, steps, |step, out| {
                let logits = out.logits.to_vec1::<f32>()?;
                let hidden = out
                    .hidden
                    .as_ref()
                    .ok_or("the model was opened without its hidden state")?
                    .to_vec1::<f32>()?;
                writer.push(p, temperature, step as u32, &logits, &hidden)?;
                let h = Tensor::new(hidden.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
                let again = head.forward(&h)?.squeeze(0)?.to_vec1::<f32>()?;
                mismatches += usize::from(
                    again
                        .iter()
                        .zip(&logits)
                        .any(|(a, b)| a.to_bits() != b.to_bits()),
                );
                Ok(Some(sampler.sample(&logits, step as u64)?))
            })?;
            let preview: String = tokenizer
                .decode(&tokens, true)?
                .chars()
                .take(60)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            println!(
                "{:>7} T={temperature:.1}: {} steps in {:.1} s: {preview:?}",
                prompt.name,
                tokens.len(),
                run.elapsed().as_secs_f64()
            );
        }
    }
    let rows = corpus::PROMPTS.len() * corpus::TEMPERATURES.len() * steps;
    if mismatches > 0 {
        return Err(format!(
            "{mismatches} of {rows} hidden states do not give back their logits \
             through the model's LM head"
        )
        .into());
    }
    let bytes = writer.finish()?;
    println!("hidden states checked: the LM head maps each to its row's logits exactly");
    println!(
        "wrote {} ({:.1} MB, {} rows) in {:.1} s",
        out.display(),
        bytes as f64 / 1e6,
        rows,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
