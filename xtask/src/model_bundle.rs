//! `cargo xtask model-bundle`: the real-model GPU run (the SmolLM2 test of
//! the fused sampler against the unfused path, and `generate`), in parts
//! that each fit the device machine's 64 MiB transfer.
//!
//! The model alone (94 MiB) is larger than one transfer, so the bundle is
//! cut into folders `p1`, `p2`, ... of at most [`PART_BYTES`] each, holding
//! consecutive slices of the model (`model.gguf.<k>`), the stripped
//! executables (`bin/`) and, in the last part, the `run` script. Ignored
//! folders already on the device machine stay there between calls while it
//! is held, so the parts travel in consecutive calls, each naming one part
//! in `carry` (the earlier ones only `true`), the last one running
//! `model-bundle/p<N>/run`; `run` joins the slices, checks the model's
//! SHA-256 and writes its logs to `$OUT`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bundle::{Kind, arch_and_out, cargo_executables, strip_file, which};
use crate::model::cache;
use crate::{Opts, cargo, workspace_root};

/// Largest part: the transfer limit less room for the tracked tree.
const PART_BYTES: u64 = 60 * 1024 * 1024;

/// The run script; `@SHA256@` and `@MODEL_FILE@` are filled in.
const RUN_TEMPLATE: &str = include_str!("model_run.sh");

pub fn main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &["out", "arch"], &[])?;
    let (arch, out) = arch_and_out(&opts, "model-bundle")?;
    let model = cache::model_path()?;
    if !model.is_file() {
        return Err(format!(
            "no model at {}: run `cargo xtask fetch-model`",
            model.display()
        ));
    }
    let strip = which("strip");
    let tests = cargo_executables(
        None,
        &[
            "test",
            "--release",
            "-p",
            "flashsample",
            "--test",
            "model",
            "--no-run",
        ],
        Kind::Test,
        strip.is_none(),
        &arch,
    )?;
    let model_test = tests
        .into_iter()
        .find(|e| e.name == "model")
        .ok_or("cargo built no `model` test executable")?;
    let generate = build_example("generate", &arch, strip.is_none())?;

    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("removing {}: {e}", out.display()))?;
    }
    let mut parts = Parts::new(&out);
    parts.add_sliced(&model, "model.gguf")?;
    for (src, name) in [(&model_test.path, "model"), (&generate, "generate")] {
        let dest = parts.add_file(src, &format!("bin/{name}"))?;
        if let Some(strip) = &strip {
            strip_file(strip, &dest)?;
        }
    }
    let script = RUN_TEMPLATE
        .replace("@SHA256@", cache::MODEL_SHA256)
        .replace("@MODEL_FILE@", cache::MODEL_FILE);
    let run = parts.last_dir().join("run");
    std::fs::write(&run, script).map_err(|e| format!("writing {}: {e}", run.display()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", run.display()))?;
    }
    let n = parts.count();
    let rel = out
        .strip_prefix(workspace_root())
        .unwrap_or(&out)
        .display()
        .to_string();
    println!("\nmodel bundle {}: {n} parts", out.display());
    for k in 1..=n {
        let dir = out.join(format!("p{k}"));
        let size = crate::bundle::dir_size(&dir)?;
        println!("  p{k}: {:.1} MiB", size as f64 / (1 << 20) as f64);
    }
    println!("on the device machine, in consecutive calls (it must stay held):");
    for k in 1..n {
        println!("  carry [\"{rel}/p{k}\"], command: true");
    }
    println!("  carry [\"{rel}/p{n}\"], command: {rel}/p{n}/run");
    Ok(())
}

/// `cargo build --release --example <name>` embedding only `arch`'s PTX;
/// returns the executable.
fn build_example(name: &str, arch: &str, strip_in_profile: bool) -> Result<PathBuf, String> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root())
        .env("FLASHSAMPLE_PTX_ARCHES", arch)
        .args(["build", "--release", "-p", "flashsample", "--example", name]);
    if strip_in_profile {
        cmd.env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    }
    println!("\nrunning cargo build --release --example {name}");
    let status = cmd.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building example {name} failed ({status})"));
    }
    let exe = workspace_root().join("target/release/examples").join(name);
    exe.is_file()
        .then_some(exe)
        .ok_or_else(|| format!("cargo built no target/release/examples/{name}"))
}

/// Folders `p1`, `p2`, ... under a root, filled in order, each at most
/// [`PART_BYTES`].
struct Parts {
    root: PathBuf,
    /// (part number, bytes used) of the part being filled.
    current: (usize, u64),
}

impl Parts {
    fn new(root: &Path) -> Parts {
        Parts {
            root: root.to_path_buf(),
            current: (1, 0),
        }
    }

    fn count(&self) -> usize {
        self.current.0
    }

    fn last_dir(&self) -> PathBuf {
        self.root.join(format!("p{}", self.current.0))
    }

    /// Room for `bytes` more: the current part, or the next one.
    fn make_room(&mut self, bytes: u64) {
        if self.current.1 > 0 && self.current.1 + bytes > PART_BYTES {
            self.current = (self.current.0 + 1, 0);
        }
    }

    /// Copies `src` whole into the part with room for it, as `name`.
    fn add_file(&mut self, src: &Path, name: &str) -> Result<PathBuf, String> {
        let len = std::fs::metadata(src)
            .map_err(|e| format!("{}: {e}", src.display()))?
            .len();
        if len > PART_BYTES {
            return Err(format!("{} is larger than one part", src.display()));
        }
        self.make_room(len);
        let dest = self.last_dir().join(name);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        std::fs::copy(src, &dest)
            .map_err(|e| format!("copying {} to {}: {e}", src.display(), dest.display()))?;
        self.current.1 += len;
        Ok(dest)
    }

    /// Cuts `src` into slices `<name>.<k>` filling the parts in order.
    fn add_sliced(&mut self, src: &Path, name: &str) -> Result<(), String> {
        let mut file =
            std::fs::File::open(src).map_err(|e| format!("opening {}: {e}", src.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut done = false;
        while !done {
            self.make_room(1);
            let k = self.current.0;
            let dir = self.last_dir();
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            let path = dir.join(format!("{name}.{k}"));
            let mut slice = std::fs::File::create(&path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            while self.current.1 < PART_BYTES {
                let want = buf.len().min((PART_BYTES - self.current.1) as usize);
                let n = file
                    .read(&mut buf[..want])
                    .map_err(|e| format!("reading {}: {e}", src.display()))?;
                if n == 0 {
                    done = true;
                    break;
                }
                slice
                    .write_all(&buf[..n])
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                self.current.1 += n as u64;
            }
        }
        Ok(())
    }
}
