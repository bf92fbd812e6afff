//! SmolLM2-135M-Instruct (candle, CPU) decoding a chat answer, with every
//! step's token chosen by flashsample: on the GPU when there is one, on the
//! float64 CPU backend otherwise. Needs the model: `cargo xtask fetch-model`.
//!
//! `cargo run --release --example generate -- --prompt "What is a llama?"`
//!
//! Options: `--prompt TEXT`, `--max-tokens N` (64), `--temperature T` (0.7;
//! 0 is greedy), `--top-k K` (0 = off), `--top-p P` (1 = off), `--min-p P`
//! (0 = off), `--seed S` (0), `--fused`. The same seed writes the same text.
//!
//! `--fused` (GPU only, no truncation): candle computes the final hidden
//! state only (the model loaded with an identity LM head), and
//! flashsample's fused kernel samples from it and the model's LM head
//! (dequantised once to bf16 and uploaded) without writing the logits.

#[path = "smollm/mod.rs"]
mod smollm;

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use flashsample::reference::SamplingParams;
use flashsample::{Backend, Device};
use smollm::fused::GpuHead;
use smollm::{Forward, HiddenModel, Model, Result, Sampler, Tokenizer};

const USAGE: &str = "\
usage: cargo run --release --example generate -- [options]
  --prompt TEXT       the user's message (default: a question about llamas)
  --max-tokens N      tokens to generate at most (default 64)
  --temperature T     softmax temperature, 0 = greedy (default 0.7)
  --top-k K           keep the K most likely tokens (default 0 = off)
  --top-p P           nucleus mass in (0, 1] (default 1 = off)
  --min-p P           keep tokens with p >= P * p_max (default 0 = off)
  --seed S            64-bit sampling seed (default 0)
  --fused             sample from the final hidden state with the fused
                      LM-head kernel (bf16 LM head on the GPU; needs a GPU;
                      not with --top-k / --top-p / --min-p)";

/// The command line.
struct Args {
    prompt: String,
    max_tokens: usize,
    params: SamplingParams,
    fused: bool,
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
        fused: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        if arg == "--fused" {
            out.fused = true;
            continue;
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
    if args.fused {
        return run_fused(args);
    }
    let (backend, why) = Backend::auto();
    let mut sampler = Sampler::new(backend, args.params)?;
    println!("sampling on {} ({why})", sampler.describe());

    let path = smollm::cache::model_path()?;
    let load = Instant::now();
    let (mut model, tokenizer) = Model::open(&path, false)?;
    let prompt = encode_prompt(&tokenizer, args, &path, load)?;
    generate(
        &mut model,
        &tokenizer,
        &prompt,
        args,
        "sampling",
        |step, out| sampler.sample(&out.logits.to_vec1::<f32>()?, step as u64),
    )
}

/// `--fused`: the model without its LM head, and flashsample's fused
/// LM-head sampler on the GPU (an error, not a fallback, without one).
fn run_fused(args: &Args) -> Result<()> {
    let p = &args.params;
    p.validate()?;
    if smollm::truncates(p) {
        let msg = "--fused samples from the full distribution: --top-k, --top-p and \
                   --min-p are not supported with it (drop them, or drop --fused)";
        return Err(msg.into());
    }
    let device = Device::new(0).map_err(|e| {
        format!(
            "--fused needs a GPU (the fused LM-head kernel has no CPU version, and \
             there is no fallback): {e}; run without --fused to sample on the CPU"
        )
    })?;
    let stream = device.new_stream()?;

    let path = smollm::cache::model_path()?;
    let load = Instant::now();
    let (mut model, tokenizer) = HiddenModel::open(&path)?;
    let (name, lm_head) = smollm::lm_head_bf16(&path)?;
    let mut head = GpuHead::new(&device, &stream, &lm_head, p.temperature, p.seed)?;
    println!(
        "sampling on GPU {} with the fused LM-head kernel: LM head `{name}` \
         dequantised to bf16 ({} x {}, {:.1} MB) and uploaded once",
        head.describe(),
        smollm::VOCAB,
        smollm::HIDDEN,
        (lm_head.len() * 2) as f64 / 1e6
    );
    let prompt = encode_prompt(&tokenizer, args, &path, load)?;
    generate(
        &mut model,
        &tokenizer,
        &prompt,
        args,
        "fused LM head + sampling",
        |step, hidden| {
            head.set_row(&hidden.to_vec1::<f32>()?, step as u64)?;
            head.fused()
        },
    )
}

/// The chat prompt's tokens, after a line saying what was loaded and how
/// long it took.
fn encode_prompt(
    tokenizer: &Tokenizer,
    args: &Args,
    path: &std::path::Path,
    load: Instant,
) -> Result<Vec<u32>> {
    let prompt = tokenizer.encode(&smollm::chat_prompt(&args.prompt))?;
    println!(
        "loaded {} in {:.2} s; prompt: {} tokens\n",
        path.display(),
        load.elapsed().as_secs_f64(),
        prompt.len()
    );
    Ok(prompt)
}

/// The decode loop of both modes: `sample(step, output)` picks each token
/// (Philox offset = step index); streams the text, then prints tokens/s and
/// the `what` call's share of a decoding step.
fn generate<M: Forward>(
    model: &mut M,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    args: &Args,
    what: &str,
    mut sample: impl FnMut(usize, &M::Output) -> Result<u32>,
) -> Result<()> {
    let mut stdout = std::io::stdout();
    let mut text = tokenizer.inner().decode_stream(true);
    // Time of the decode steps' forward passes (the prompt's, the prefill,
    // apart) and of the sampling calls, measured between calls of `pick`.
    let mut prefill = Duration::ZERO;
    let mut forward = Duration::ZERO;
    let mut sampling = Duration::ZERO;
    let mut calls = 0usize;
    let mut last = Instant::now();
    let tokens = smollm::decode(model, prompt, args.max_tokens, |step, out| {
        let start = Instant::now();
        if step == 0 {
            prefill = start - last;
        } else {
            forward += start - last;
        }
        calls += 1;
        let token = sample(step, out)?;
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
         model {model_ms:.2} ms + {what} {sampling_ms:.3} ms ({:.2}% of the step)",
        tokens.len(),
        args.params.seed,
        ms(prefill, 1),
        1e3 / (model_ms + sampling_ms),
        model_ms + sampling_ms,
        100.0 * sampling_ms / (model_ms + sampling_ms),
    );
    Ok(())
}
