//! SmolLM2-135M-Instruct (candle, CPU) decoding a chat answer, with every
//! step's token chosen by flashsample: on the GPU when there is one, on the
//! float64 CPU backend otherwise. Needs the model: `cargo xtask fetch-model`.
//!
//! `cargo run --release --example generate -- --prompt "What is a llama?"`
//!
//! Options: `--prompt TEXT`, `--max-tokens N` (64), `--temperature T` (0.7;
//! 0 is greedy), `--top-k K` (0 = off), `--top-p P` (1 = off), `--min-p P`
//! (0 = off), `--seed S` (0). The same seed writes the same text.

#[path = "smollm/mod.rs"]
mod smollm;

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use flashsample::Backend;
use flashsample::reference::SamplingParams;
use smollm::{Model, Result, Sampler};

const USAGE: &str = "\
usage: cargo run --release --example generate -- [options]
  --prompt TEXT       the user's message (default: a question about llamas)
  --max-tokens N      tokens to generate at most (default 64)
  --temperature T     softmax temperature, 0 = greedy (default 0.7)
  --top-k K           keep the K most likely tokens (default 0 = off)
  --top-p P           nucleus mass in (0, 1] (default 1 = off)
  --min-p P           keep tokens with p >= P * p_max (default 0 = off)
  --seed S            64-bit sampling seed (default 0)";

/// The command line.
struct Args {
    prompt: String,
    max_tokens: usize,
    params: SamplingParams,
}

/// Parses `--name value` / `--name=value` pairs; `None` for `--help`.
fn parse_args(args: &[String]) -> Result<Option<Args>> {
    let mut out = Args {
        prompt: "What is a llama? Answer in three sentences.".into(),
        max_tokens: 64,
        params: SamplingParams {
            temperature: 0.7,
            ..SamplingParams::default()
        },
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n, v.to_string()),
            None => {
                let v = it
                    .next()
                    .ok_or_else(|| format!("option `{arg}` needs a value\n\n{USAGE}"))?;
                (arg.as_str(), v.clone())
            }
        };
        let bad = |e: &dyn std::fmt::Display| format!("bad value `{value}` for {name}: {e}");
        let p = &mut out.params;
        match name {
            "--prompt" => out.prompt = value.clone(),
            "--max-tokens" => out.max_tokens = value.parse().map_err(|e| bad(&e))?,
            "--temperature" => p.temperature = value.parse().map_err(|e| bad(&e))?,
            "--top-k" => p.top_k = value.parse().map_err(|e| bad(&e))?,
            "--top-p" => p.top_p = value.parse().map_err(|e| bad(&e))?,
            "--min-p" => p.min_p = value.parse().map_err(|e| bad(&e))?,
            "--seed" => p.seed = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown option `{name}`\n\n{USAGE}").into()),
        }
    }
    Ok(Some(out))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse_args(&args).and_then(|args| match args {
        Some(args) => run(&args),
        None => {
            println!("{USAGE}");
            Ok(())
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Loads the model and decodes `args.prompt`'s answer.
fn run(args: &Args) -> Result<()> {
    let (backend, why) = Backend::auto();
    let mut sampler = Sampler::new(backend, args.params)?;
    println!("sampling on {} ({why})", sampler.describe());
    if sampler.truncates() {
        println!(
            "top-k / top-p / min-p requested: truncated sampling runs on the CPU float64 \
             reference (the GPU truncation kernels are not written yet)"
        );
    }

    let path = smollm::cache::model_path()?;
    let load = Instant::now();
    let (mut model, tokenizer) = Model::open(&path, false)?;
    let prompt = tokenizer.encode(&smollm::chat_prompt(&args.prompt))?;
    println!(
        "loaded {} in {:.2} s; prompt: {} tokens\n",
        path.display(),
        load.elapsed().as_secs_f64(),
        prompt.len()
    );

    let mut stdout = std::io::stdout();
    let mut text = tokenizer.inner().decode_stream(true);
    // Time of the decode steps' forward passes (the prompt's, the prefill,
    // apart) and of the sampling calls, measured between calls of `pick`.
    let mut prefill = Duration::ZERO;
    let mut forward = Duration::ZERO;
    let mut sampling = Duration::ZERO;
    let mut calls = 0usize;
    let mut last = Instant::now();
    let tokens = smollm::decode(&mut model, &prompt, args.max_tokens, |step, out| {
        let start = Instant::now();
        if step == 0 {
            prefill = start - last;
        } else {
            forward += start - last;
        }
        calls += 1;
        let logits = out.logits.to_vec1::<f32>()?;
        let token = sampler.sample(&logits, step as u64)?;
        sampling += start.elapsed();
        if tokenizer.is_stop(token) {
            return Ok(None);
        }
        if let Some(piece) = text.step(token)? {
            print!("{piece}");
            stdout.flush()?;
        }
        last = Instant::now();
        Ok(Some(token))
    })?;
    println!("\n");

    let ms = |d: Duration, n: usize| d.as_secs_f64() * 1e3 / n.max(1) as f64;
    let (model_ms, sampling_ms) = (ms(forward, calls.saturating_sub(1)), ms(sampling, calls));
    println!(
        "{} tokens (seed {}); prompt {:.1} ms; decoding {:.1} tokens/s: {:.2} ms per step, \
         model {model_ms:.2} ms + sampling {sampling_ms:.3} ms ({:.2}% of the step)",
        tokens.len(),
        args.params.seed,
        ms(prefill, 1),
        1e3 / (model_ms + sampling_ms),
        model_ms + sampling_ms,
        100.0 * sampling_ms / (model_ms + sampling_ms),
    );
    Ok(())
}
