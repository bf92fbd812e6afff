//! `cargo xtask ab-bundle`: the same tests and benches built from several
//! git revisions, for a same-run comparison on the GPU machine.
//!
//! Each revision is checked out in a worktree of its own
//! (`target/ab/<rev>`, kept between calls, so a revision already built
//! rebuilds nothing) and built there, in its own target folder: two
//! checkouts sharing one target folder can reuse each other's embedded PTX.
//!
//! Layout of the output folder (default `ab-bundle`):
//!
//! ```text
//! run-ab                 entry point (bash): ./run-ab [tests] [sanitize] [bench] [profile]
//! <rev>/<name>           stripped bench executables of each revision, and
//!                        test executables of each but the first and those
//!                        named by `--bench-only`
//! revs.txt               the revisions, base first, with their subjects
//! data/corpus.bin        the logits corpus subset of `gpu-bundle`, when there
//!                        is a corpus (the real rows of tests and benches)
//! ```
//!
//! Next to the folder, `<out>.tgz` holds it gzipped (the executables embed
//! PTX text, which packs several to one); the archive is what travels.
//!
//! `run-ab tests` runs the test executables of every revision but the
//! first (the base, whose tests are neither built nor bundled) and the
//! `--bench-only` ones (variants timed beside a tested one, which keeps a
//! bundle of several variants under the size limit),
//! `sanitize` their `sanitize_` tests under memcheck and racecheck
//! (`FLASHSAMPLE_SANITIZE_TOOLS` picks others), each test in its
//! own process, and `bench` every revision's benches in turn, base first,
//! `FLASHSAMPLE_AB_REPS` times (default 2), so that each comparison is made
//! in one run; `profile` (never by default) runs Nsight Compute on one
//! kernel of each revision's benches. The script's header lists the
//! variables that narrow each step, and it leaves every log in one
//! `logs.tgz`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bundle::{
    Exe, Kind, RUN_PRELUDE, arch_and_out, cargo_executables, corpus_subset, pack, strip_file, which,
};
use crate::{Opts, workspace_root};

/// The `run-ab` script; `@REVS@`, `@TESTS@` and `@BENCHES@` become bash
/// array items, `@PRELUDE@` the bundle's [`RUN_PRELUDE`].
const RUN_TEMPLATE: &str = include_str!("run_ab.sh");

pub fn main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(
        args,
        &["rev", "bench-only", "test", "bench", "out", "arch"],
        &[],
    )?;
    let revs = opts.all("rev");
    if revs.len() < 2 {
        return Err("ab-bundle needs at least two --rev (the base first)".into());
    }
    let bench_only = opts.all("bench-only");
    if let Some(rev) = bench_only.iter().find(|rev| !revs.contains(rev)) {
        return Err(format!("--bench-only {rev} is not one of the --rev"));
    }
    let tests = opts.all("test");
    let benches = opts.all("bench");
    if tests.is_empty() && benches.is_empty() {
        return Err("ab-bundle needs at least one --test or --bench".into());
    }
    let (arch, out) = arch_and_out(&opts, "ab-bundle")?;
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("removing {}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;

    let strip = which("strip");
    let mut labels = Vec::new();
    let mut listing = String::new();
    for (i, rev) in revs.iter().enumerate() {
        let label = git(&["rev-parse", "--short", rev])?;
        if labels.contains(&label) {
            return Err(format!("--rev {rev} is {label} twice"));
        }
        let tree = worktree(&label)?;
        let mut exes = Vec::new();
        for (names, kind, base, flag) in [
            (&tests, Kind::Test, &["test", "--release"][..], "--test"),
            (&benches, Kind::Bench, &["bench"][..], "--bench"),
        ] {
            // The base's tests are not run (it is what the others are
            // compared with), nor those of bench-only revisions, so they
            // are not bundled.
            let untested = i == 0 || bench_only.contains(rev);
            if names.is_empty() || (kind == Kind::Test && untested) {
                continue;
            }
            let mut args = base.to_vec();
            args.extend(["-p", "flashsample", "--no-run"]);
            for name in names.iter() {
                args.extend([flag, name]);
            }
            exes.extend(cargo_executables(
                Some(&tree),
                &args,
                kind,
                strip.is_none(),
                &arch,
            )?);
        }
        copy_exes(&exes, &out.join(&label), strip.as_deref())?;
        let subject = git(&["log", "-1", "--format=%s", &label])?;
        listing.push_str(&format!("{label} {subject}\n"));
        labels.push(label);
    }
    std::fs::write(out.join("revs.txt"), &listing).map_err(|e| format!("writing revs.txt: {e}"))?;
    corpus_subset(&out.join("data"))?;
    write_run_script(&out.join("run-ab"), &labels, &tests, &benches)?;

    println!("\nab-bundle {}:", out.display());
    print!("{listing}");
    let archive = pack(&out)?;
    let name = out
        .file_name()
        .map_or("ab-bundle".into(), |n| n.to_string_lossy());
    println!(
        "run it on the GPU machine with: {}/run-ab [tests] [sanitize] [bench] [profile]\n\
         or, from the archive: tar xzf {} -C /tmp && /tmp/{name}/run-ab [...]",
        out.display(),
        archive.display()
    );
    Ok(())
}

/// `git <args>` in the workspace, its trimmed output.
fn git(args: &[&str]) -> Result<String, String> {
    let output = Command::new("git")
        .current_dir(workspace_root())
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The worktree of revision `label` under `target/ab`, added (detached) if
/// missing.
fn worktree(label: &str) -> Result<PathBuf, String> {
    let tree = workspace_root().join("target").join("ab").join(label);
    if !tree.join("Cargo.toml").exists() {
        let path = tree.to_string_lossy().to_string();
        git(&["worktree", "add", "--detach", &path, label])?;
    }
    Ok(tree)
}

/// Copies `exes` into `dir`, stripped with `strip` when there is one.
fn copy_exes(exes: &[Exe], dir: &Path, strip: Option<&Path>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for exe in exes {
        let dest = dir.join(&exe.name);
        std::fs::copy(&exe.path, &dest)
            .map_err(|e| format!("copying {} to {}: {e}", exe.path.display(), dest.display()))?;
        if let Some(strip) = strip {
            strip_file(strip, &dest)?;
        }
    }
    Ok(())
}

fn write_run_script(
    file: &Path,
    labels: &[String],
    tests: &[&str],
    benches: &[&str],
) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let script = RUN_TEMPLATE
        .replace("@PRELUDE@", RUN_PRELUDE.trim_end())
        .replace("@REVS@", &labels.join(" "))
        .replace("@TESTS@", &tests.join(" "))
        .replace("@BENCHES@", &benches.join(" "));
    std::fs::write(file, script).map_err(|e| format!("writing {}: {e}", file.display()))?;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", file.display()))
}
