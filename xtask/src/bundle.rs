//! `cargo xtask gpu-bundle`: everything the GPU machine (no Rust toolchain,
//! no network) needs to run the tests, the sanitizer and the benches.
//!
//! Layout of the bundle:
//!
//! ```text
//! run                              entry point (bash): ./run [tests] [sanitize] [bench]
//! bin/<name>                       stripped release executables, embedding
//!                                  only the sm_90a module (the H200's;
//!                                  `--arch` picks another)
//! ptx/<arch>/flashsample_kernels.ptx   that module
//! ptx/ptxas-report.txt             when ptxas was available
//! scripts/*.py                     benches/*.py (same-run PyTorch references)
//! kernels.txt                      the kernel entry points, one a line (the
//!                                  sanitizer step checks that its tests
//!                                  launched every one)
//! ```
//!
//! Next to the folder, `<out>.tgz` holds it gzipped: the executables each
//! embed a PTX module of about 6 MiB, so the folder (83 MiB in session 11)
//! is over the transfer limit and the archive (26 MiB) is what travels.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Opts, absolute, build_ptx, cargo, workspace_root};

/// A bundle's archive (`gpu-bundle`'s and `ab-bundle`'s) must fit through
/// the 64 MiB transfer limit with room to spare.
const MAX_BYTES: u64 = 60 * 1024 * 1024;

/// The `run` script; `@TESTS@` and `@BENCHES@` become bash array items,
/// `@PRELUDE@` the [`RUN_PRELUDE`].
const RUN_TEMPLATE: &str = include_str!("run.sh");

/// What the `run` scripts of `gpu-bundle` and `ab-bundle` start with: the
/// script's folder, `OUT`, the GPU required, the CUDA libraries and the
/// step timeout.
pub(crate) const RUN_PRELUDE: &str = include_str!("run_prelude.sh");

/// The name of the library's unit-test executable in the bundle.
const UNIT_NAME: &str = "flashsample-unit";

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Test,
    Bench,
}

pub(crate) struct Exe {
    pub(crate) name: String,
    kind: Kind,
    pub(crate) path: PathBuf,
}

/// Test targets that need no GPU (and no GPU-side data): left out of the
/// bundle.
const CPU_ONLY_TESTS: &[&str] = &["fuzz", "model", "reference"];

/// The `--arch` whose PTX modules the executables embed (default sm_90a,
/// the H200's; a comma-separated list such as `sm_90a,sm_90,sm_80` adds
/// the portable modules that `Device::with_module` opens, at about 12 MB of
/// PTX each) and the `--out` folder (default `default_dir` in the
/// workspace) of a bundle task.
pub(crate) fn arch_and_out(opts: &Opts, default_dir: &str) -> Result<(String, PathBuf), String> {
    let arch = opts.last("arch").unwrap_or("sm_90a").to_string();
    for name in arch.split(',') {
        if !crate::ptx::ARCHES.iter().any(|a| a.name == name) {
            return Err(format!("unknown --arch {name}"));
        }
    }
    let out = opts
        .last("out")
        .map(absolute)
        .unwrap_or_else(|| workspace_root().join(default_dir));
    Ok((arch, out))
}

pub fn main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &["out", "arch"], &[])?;
    let (arch, out) = arch_and_out(&opts, "bundle")?;

    let ptx_out = build_ptx::default_out();
    let report = build_ptx::build(&build_ptx::select_arches(&[])?, &ptx_out)?;

    let strip = which("strip");
    let mut exes = cargo_executables(
        None,
        &["test", "--release", "-p", "flashsample", "--no-run"],
        Kind::Test,
        strip.is_none(),
        &arch,
    )?;
    exes.extend(cargo_executables(
        None,
        &["bench", "-p", "flashsample", "--no-run"],
        Kind::Bench,
        strip.is_none(),
        &arch,
    )?);
    // Tests that never touch a GPU run in CI; carrying them (the model
    // test holds candle) would push the bundle past the transfer limit.
    exes.retain(|e| !CPU_ONLY_TESTS.contains(&e.name.as_str()));
    if exes.is_empty() {
        return Err("cargo built no test or bench executables".into());
    }
    for (i, a) in exes.iter().enumerate() {
        if let Some(b) = exes[i + 1..].iter().find(|b| b.name == a.name) {
            return Err(format!(
                "a test and a bench would both be bin/{}: {} and {}",
                a.name,
                a.path.display(),
                b.path.display()
            ));
        }
    }
    // Run order: benches last, the library's unit tests first, then by name.
    exes.sort_by(|a, b| {
        (a.kind == Kind::Bench, a.name != UNIT_NAME, &a.name).cmp(&(
            b.kind == Kind::Bench,
            b.name != UNIT_NAME,
            &b.name,
        ))
    });

    // Only what this task writes is replaced; `out/` holds results of an
    // earlier local `./run` and would otherwise travel with the bundle.
    for stale in ["bin", "ptx", "scripts", "out"] {
        let p = out.join(stale);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(|e| format!("removing {}: {e}", p.display()))?;
        }
    }
    let bin = out.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("creating {}: {e}", bin.display()))?;
    for exe in &exes {
        let dest = bin.join(&exe.name);
        std::fs::copy(&exe.path, &dest)
            .map_err(|e| format!("copying {} to {}: {e}", exe.path.display(), dest.display()))?;
        if let Some(strip) = &strip {
            strip_file(strip, &dest)?;
        }
    }

    copy_ptx(&ptx_out, &arch, &out.join("ptx"))?;
    copy_scripts(&workspace_root().join("benches"), &out.join("scripts"))?;
    corpus_subset(&out.join("data"))?;
    if !report.is_empty() {
        let file = out.join("ptx/ptxas-report.txt");
        std::fs::write(&file, report.trim_start())
            .map_err(|e| format!("writing {}: {e}", file.display()))?;
    }
    let kernels = out.join("kernels.txt");
    std::fs::write(
        &kernels,
        format!("{}\n", flashsample_kernels::ENTRY_POINTS.join("\n")),
    )
    .map_err(|e| format!("writing {}: {e}", kernels.display()))?;
    write_run_script(&out.join("run"), &exes)?;

    println!("\nbundle {}:", out.display());
    for exe in &exes {
        let kind = match exe.kind {
            Kind::Test => "test",
            Kind::Bench => "bench",
        };
        println!(
            "  bin/{:<20} {kind:<5} from {}",
            exe.name,
            exe.path.display()
        );
    }
    let archive = pack(&out)?;
    let name = out
        .file_name()
        .map_or("bundle".into(), |n| n.to_string_lossy());
    println!(
        "run it on the GPU machine with: {}/run [tests] [sanitize] [bench]\n\
         or, from the archive: tar xzf {} -C /tmp && /tmp/{name}/run [tests] [sanitize] [bench]",
        out.display(),
        archive.display()
    );
    Ok(())
}

/// Gzips the folder `out` into `<out>.tgz` ([`archive`]), prints both
/// sizes and fails when the archive is over [`MAX_BYTES`]; returns the
/// archive's path.
pub(crate) fn pack(out: &Path) -> Result<PathBuf, String> {
    let size = dir_size(out)?;
    let archive = archive(out)?;
    let packed = std::fs::metadata(&archive)
        .map_err(|e| format!("reading {}: {e}", archive.display()))?
        .len();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "  size {:.1} MiB, {} {:.1} MiB (limit {} MiB)",
        mib(size),
        archive.display(),
        mib(packed),
        MAX_BYTES >> 20
    );
    if packed > MAX_BYTES {
        return Err(format!(
            "the archive {} is {:.1} MiB, over the {} MiB limit",
            archive.display(),
            mib(packed),
            MAX_BYTES >> 20
        ));
    }
    Ok(archive)
}

/// Writes `<out>.tgz`, the folder gzipped (its top folder named as `out`),
/// and returns its path.
fn archive(out: &Path) -> Result<PathBuf, String> {
    let (Some(parent), Some(name)) = (out.parent(), out.file_name()) else {
        return Err(format!(
            "{}: no parent folder for the archive",
            out.display()
        ));
    };
    let mut file = name.to_os_string();
    file.push(".tgz");
    let tgz = parent.join(file);
    let status = Command::new("tar")
        .arg("czf")
        .arg(&tgz)
        .arg("-C")
        .arg(parent)
        .arg(name)
        .status()
        .map_err(|e| format!("running tar: {e}"))?;
    if !status.success() {
        return Err(format!("tar czf {} failed: {status}", tgz.display()));
    }
    Ok(tgz)
}

/// Runs `cargo <args> --message-format=json-render-diagnostics`, embedding
/// only `arch`'s PTX module, and returns the executables of its
/// test-profile artifacts of `kind`: in the workspace, or in the checkout
/// `checkout` in its own target folder (whatever `CARGO_TARGET_DIR` says:
/// checkouts sharing one can reuse each other's embedded PTX).
pub(crate) fn cargo_executables(
    checkout: Option<&Path>,
    args: &[&str],
    kind: Kind,
    strip_in_profile: bool,
    arch: &str,
) -> Result<Vec<Exe>, String> {
    let mut cmd = Command::new(cargo());
    match checkout {
        Some(dir) => cmd.current_dir(dir).env_remove("CARGO_TARGET_DIR"),
        None => cmd.current_dir(workspace_root()),
    };
    cmd.env("FLASHSAMPLE_PTX_ARCHES", arch)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    if strip_in_profile {
        // No `strip` on this machine: let rustc's linker strip instead. This
        // changes the profile, so these builds do not share artifacts with a
        // plain `cargo test --release`.
        cmd.env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
            .env("CARGO_PROFILE_BENCH_STRIP", "symbols");
    }
    println!("\nrunning cargo {}", args.join(" "));
    let mut child = cmd.spawn().map_err(|e| format!("cannot run cargo: {e}"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut exes: Vec<Exe> = Vec::new();
    let mut parse_error = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading cargo's output: {e}"))?;
        match artifact(&line, kind) {
            Ok(Some(exe)) => {
                if let Some(other) = exes.iter().find(|e| e.name == exe.name) {
                    parse_error.get_or_insert(format!(
                        "two executables would be bin/{}: {} and {}",
                        exe.name,
                        other.path.display(),
                        exe.path.display()
                    ));
                } else {
                    exes.push(exe);
                }
            }
            Ok(None) => {}
            Err(e) => {
                parse_error.get_or_insert(e);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo {} failed ({status})", args.join(" ")));
    }
    match parse_error {
        Some(e) => Err(e),
        None => Ok(exes),
    }
}

/// The executable of one `compiler-artifact` message, when it is a test
/// profile artifact of `kind`: the lib's unit tests and integration tests for
/// `Kind::Test`, bench targets for `Kind::Bench`.
fn artifact(line: &str, kind: Kind) -> Result<Option<Exe>, String> {
    if !line.starts_with('{') {
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("cargo printed bad JSON ({e}): {line}"))?;
    if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
        return Ok(None);
    }
    let Some(path) = v["executable"].as_str() else {
        return Ok(None);
    };
    let target = &v["target"];
    let name = target["name"].as_str().unwrap_or_default();
    let kinds: Vec<&str> = target["kind"]
        .as_array()
        .map(|a| a.iter().filter_map(|k| k.as_str()).collect())
        .unwrap_or_default();
    let has = |k: &str| kinds.contains(&k);
    let bundle_name = match kind {
        Kind::Test if has("lib") || has("rlib") || has("cdylib") => UNIT_NAME.to_string(),
        Kind::Test if has("bin") => format!("{name}-unit"),
        Kind::Test if has("test") => name.to_string(),
        Kind::Bench if has("bench") => name.to_string(),
        _ => return Ok(None),
    };
    Ok(Some(Exe {
        name: bundle_name,
        kind,
        path: PathBuf::from(path),
    }))
}

/// Copies `<from>/<arch>/*.ptx` to `<to>/<arch>/` for the embedded `arch`.
fn copy_ptx(from: &Path, only: &str, to: &Path) -> Result<(), String> {
    let wanted = |name: &str| only.split(',').any(|o| o == name);
    for arch in crate::ptx::ARCHES.iter().filter(|a| wanted(a.name)) {
        let src = from.join(arch.name).join(build_ptx::PTX_FILE);
        let dir = to.join(arch.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        std::fs::copy(&src, dir.join(build_ptx::PTX_FILE))
            .map_err(|e| format!("copying {}: {e}", src.display()))?;
    }
    Ok(())
}

/// Copies the Python helpers of the benches (`benches/*.py`, e.g. the
/// same-run PyTorch references) to `to`.
fn copy_scripts(from: &Path, to: &Path) -> Result<(), String> {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "py") {
            std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
            let dest = to.join(path.file_name().expect("a file name"));
            std::fs::copy(&path, &dest).map_err(|e| format!("copying {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

fn write_run_script(file: &Path, exes: &[Exe]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let list = |kind: Kind| {
        exes.iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let script = RUN_TEMPLATE
        .replace("@PRELUDE@", RUN_PRELUDE.trim_end())
        .replace("@TESTS@", &list(Kind::Test))
        .replace("@BENCHES@", &list(Kind::Bench));
    std::fs::write(file, script).map_err(|e| format!("writing {}: {e}", file.display()))?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", file.display()))
}

/// Total size of the files under `dir`.
pub(crate) fn dir_size(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let meta = entry.metadata().map_err(|e| e.to_string())?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Strips the symbols of the executable `file` with the `strip` at `strip`.
pub(crate) fn strip_file(strip: &Path, file: &Path) -> Result<(), String> {
    let status = Command::new(strip)
        .arg(file)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", strip.display()))?;
    if !status.success() {
        return Err(format!("strip {} failed ({status})", file.display()));
    }
    Ok(())
}

/// `program` from PATH.
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// Steps kept from each (prompt, temperature) run of the logits corpus: one
/// in 32 (60 rows, 12 MB), so the bundle stays far below the transfer limit.
const CORPUS_STEP_STRIDE: u32 = 32;

/// Copies every `CORPUS_STEP_STRIDE`-th step of the SmolLM2 logits corpus
/// (when `cargo xtask logits-corpus` has written it) to `dir/corpus.bin`, for
/// the GPU tests and benches (`run` and `run-ab` point `FLASHSAMPLE_CORPUS`
/// at it).
pub(crate) fn corpus_subset(dir: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let src = match crate::corpus::default_path() {
        Ok(p) if p.exists() => p,
        _ => {
            println!("no logits corpus (cargo xtask logits-corpus): the bundle carries none");
            return Ok(());
        }
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let reader =
        crate::corpus::Reader::open(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let dest = dir.join("corpus.bin");
    let mut writer = crate::corpus::Writer::create(&dest, reader.vocab(), reader.hidden())
        .map_err(|e| format!("{}: {e}", dest.display()))?;
    for row in reader {
        let row = row.map_err(|e| format!("{}: {e}", src.display()))?;
        if row.step % CORPUS_STEP_STRIDE == 0 {
            writer
                .push(
                    row.prompt,
                    row.temperature,
                    row.step,
                    &row.logits,
                    &row.hidden,
                )
                .map_err(|e| format!("{}: {e}", dest.display()))?;
        }
    }
    writer
        .finish()
        .map_err(|e| format!("{}: {e}", dest.display()))?;
    Ok(())
}
