//! Building the kernels crate into one PTX module per target architecture.
//!
//! Shared by `cargo xtask build-ptx` and the host crate's build script (which
//! includes this file with `#[path]`), so both build PTX the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A PTX target: the module's name, `-C target-cpu`, and extra target
/// features.
pub struct Arch {
    pub name: &'static str,
    pub cpu: &'static str,
    pub features: &'static str,
}

/// Every architecture the host embeds (PTX ISA 7.8 at least: CUDA 11.8
/// drivers or newer; `.L1::no_allocate` loads need 7.4). `sm_80` is the portable module (the
/// driver JIT-compiles it for any later GPU); `sm_90a` unlocks Hopper-only
/// instructions (wgmma, setmaxnreg) and runs only on compute capability 9.0.
pub const ARCHES: &[Arch] = &[
    Arch {
        name: "sm_80",
        cpu: "sm_80",
        features: "+ptx78",
    },
    Arch {
        name: "sm_89",
        cpu: "sm_89",
        features: "+ptx78",
    },
    Arch {
        name: "sm_90",
        cpu: "sm_90",
        features: "+ptx80",
    },
    Arch {
        name: "sm_90a",
        cpu: "sm_90a",
        features: "+ptx80",
    },
];

/// Environment variables of an outer cargo that must not leak into the
/// nested PTX build (they would retarget or reconfigure it).
const SCRUB_ENV: &[&str] = &[
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_ENCODED_RUSTFLAGS",
    "RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_MAKEFLAGS",
    "CARGO_PROFILE_RELEASE_DEBUG",
    "CARGO_PRIMARY_PACKAGE",
    "RUSTDOCFLAGS",
    "CARGO_LLVM_COV",
    "LLVM_PROFILE_FILE",
];

/// Compiles `kernels_dir` for `arch` into PTX text, using `target_dir` for
/// the nested build (`core` is compiled once there and reused by every arch),
/// with `bounds` written into their kernels (see [`with_launch_bounds`]).
pub fn build(
    cargo: &Path,
    kernels_dir: &Path,
    target_dir: &Path,
    arch: &Arch,
    bounds: &[flashsample_kernels::LaunchBounds],
) -> Result<String, String> {
    let mut cmd = Command::new(cargo);
    for v in SCRUB_ENV {
        cmd.env_remove(v);
    }
    for (k, _) in std::env::vars() {
        if k.starts_with("CARGO_CFG_") || k.starts_with("CARGO_FEATURE_") || k.starts_with("DEP_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(kernels_dir)
        .env("RUSTUP_TOOLCHAIN", "nightly")
        .args([
            "rustc",
            "--release",
            "--lib",
            "--target",
            "nvptx64-nvidia-cuda",
        ])
        .arg("--message-format=json")
        .arg("-Zbuild-std=core")
        .arg("--target-dir")
        .arg(target_dir)
        .args([
            "--config",
            "profile.release.codegen-units=1",
            "--config",
            "profile.release.panic=\"abort\"",
        ])
        .args(["--", "--emit=asm", "-C"])
        .arg(format!("target-cpu={}", arch.cpu));
    if !arch.features.is_empty() {
        cmd.arg("-C")
            .arg(format!("target-feature={}", arch.features));
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.display()))?;
    // rustc's diagnostics come inside cargo's JSON messages, not on stderr:
    // show them, and refuse a module built with warnings (host clippy never
    // sees the device-only code).
    let stdout = String::from_utf8_lossy(&out.stdout);
    let warnings = diagnostics(&stdout);
    if !out.status.success() {
        return Err(format!(
            "building PTX for {} failed:\n{}\n{}\nThe kernels need the nightly toolchain with rust-src: \
             rustup component add rust-src llvm-tools --toolchain nightly",
            arch.name,
            warnings.join("\n"),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if !warnings.is_empty() {
        return Err(format!(
            "the kernels crate has {} warning(s) for {}:\n{}",
            warnings.len(),
            arch.name,
            warnings.join("\n")
        ));
    }
    // Each arch's flags give the crate its own metadata hash, so its `.s` file
    // is `deps/flashsample_kernels-<hash>.s`. Take the hash from cargo's
    // artifact message: when the arch is fresh rustc does not run again, and
    // the newest `.s` file in `deps/` would be another arch's.
    let asm = asm_path(&stdout).ok_or_else(|| {
        format!(
            "cargo reported no flashsample_kernels artifact for {}",
            arch.name
        )
    })?;
    let text = std::fs::read_to_string(&asm).map_err(|e| {
        format!(
            "reading {}: {e} (if it was deleted, remove {} to rebuild)",
            asm.display(),
            target_dir.display()
        )
    })?;
    let bounds: Vec<_> = bounds
        .iter()
        .filter(|b| b.modules.includes(arch.name))
        .collect();
    let text = with_launch_bounds(&text, &bounds)?;
    if arch.name == "sm_90a" {
        with_tensor_map_alignment(&text, flashsample_kernels::TENSOR_MAP_PARAMS)
    } else {
        Ok(text)
    }
}

/// `ptx` with each of the `params` (128-byte tensor-map parameters, which
/// rustc declares 16-byte aligned) declared 64-byte aligned, as the copy
/// engine needs them in parameter space.
pub fn with_tensor_map_alignment(ptx: &str, params: &[&str]) -> Result<String, String> {
    let mut out = ptx.to_string();
    for name in params {
        let from = format!(".param .align 16 .b8 {name}[128]");
        if !out.contains(&from) {
            return Err(format!(
                "tensor-map parameter {name}: no `{from}` in the module"
            ));
        }
        out = out.replace(&from, &format!(".param .align 64 .b8 {name}[128]"));
    }
    Ok(out)
}

/// `ptx` with each kernel's `.maxntid` and `.minnctapersm` directives
/// written between its parameter list and its body, where PTX expects
/// performance-tuning directives.
pub fn with_launch_bounds(
    ptx: &str,
    bounds: &[&flashsample_kernels::LaunchBounds],
) -> Result<String, String> {
    let mut out = ptx.to_string();
    for b in bounds {
        let head = format!(".entry {}(", b.kernel);
        let start = out
            .find(&head)
            .ok_or_else(|| format!("launch bounds for {}: no such entry point", b.kernel))?;
        // The parameter list ends at the first `)` line after the header.
        let close = out[start..]
            .find("\n)")
            .map(|i| start + i + 2)
            .ok_or_else(|| format!("launch bounds for {}: no end of parameters", b.kernel))?;
        out.insert_str(
            close + 1,
            &format!(
                "\n.maxntid {}, 1, 1\n.minnctapersm {}\n",
                b.max_threads, b.min_blocks_per_sm
            ),
        );
    }
    Ok(out)
}

/// The `.s` file next to the kernels crate's hashed `deps/` artifact named in
/// cargo's JSON messages.
/// The rendered compiler diagnostics (errors and warnings) in cargo's JSON
/// messages, cached ones included, but for the
/// notice that an arch's `-C target-feature` (`+ptx80`, ...) is unstable,
/// which every build of those arches gets.
fn diagnostics(cargo_json: &str) -> Vec<String> {
    cargo_json
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-message\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            !v["message"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("unstable feature specified for `-Ctarget-feature`"))
        })
        .filter_map(|v| Some(v["message"]["rendered"].as_str()?.to_string()))
        .collect()
}

fn asm_path(cargo_json: &str) -> Option<PathBuf> {
    cargo_json
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"")
                && l.contains("\"name\":\"flashsample_kernels\"")
        })
        .flat_map(|l| l.split('"'))
        .find_map(|s| {
            let p = Path::new(s);
            let stem = p
                .file_name()?
                .to_str()?
                .strip_prefix("libflashsample_kernels-")?;
            let hash = stem
                .strip_suffix(".rmeta")
                .or_else(|| stem.strip_suffix(".rlib"))?;
            Some(p.with_file_name(format!("flashsample_kernels-{hash}.s")))
        })
}

/// Problems that make a module unusable: unresolved external functions
/// (panic paths, bounds checks, formatting left in device code), missing
/// entry points, and kernels whose PTX keeps an array in local memory (a
/// `.local` declaration: the code generator's own stack, such as an
/// iterator over an array taken by value; ptxas's stack frames and spills
/// are judged from its resource report instead).
pub fn check(ptx: &str, entry_points: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut entry: Option<&str> = None;
    for line in ptx.lines() {
        let l = line.trim();
        if l.starts_with(".extern .func") || l.starts_with(".extern .global") {
            problems.push(format!("unresolved external: {l}"));
        }
        if let Some(rest) = l.strip_prefix(".visible .entry ") {
            entry = rest.split('(').next();
        } else if line.starts_with('}') {
            entry = None;
        } else if let Some(e) = entry.filter(|_| l.starts_with(".local ")) {
            problems.push(format!(
                "{e} keeps an array in local memory ({l}): index loops instead of \
                 iterating arrays by value"
            ));
        }
    }
    for e in entry_points {
        if !ptx.contains(&format!(".entry {e}(")) {
            problems.push(format!("missing entry point {e}"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_arrays_in_kernels_are_problems() {
        let ptx = concat!(
            ".visible .func helper(\n",
            "{\n",
            "\t.local .align 8 .b8 \t__local_depot0[72];\n",
            "}\n",
            ".visible .entry good(\n",
            "\t.param .u64 good_param_0\n",
            ")\n",
            "{\n",
            "\tret;\n",
            "}\n",
            ".visible .entry bad(\n",
            ")\n",
            "{\n",
            "\t.local .align 8 .b8 \t__local_depot2[80];\n",
            "}\n",
        );
        let problems = check(ptx, &["good", "bad"]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("bad keeps an array in local memory"));
        assert!(check(ptx, &["good", "gone"])[1].contains("missing entry point gone"));
    }

    #[test]
    fn diagnostics_are_read_from_cargo_messages() {
        let json = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"flashsample_kernels"}}"#,
            "\n",
            r#"{"reason":"compiler-message","message":{"level":"warning","rendered":"warning: unused variable: `tid`\n"}}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            diagnostics(json),
            vec!["warning: unused variable: `tid`\n".to_string()]
        );
        assert!(diagnostics(r#"{"reason":"build-finished","success":true}"#).is_empty());
        let target_feature = r#"{"reason":"compiler-message","message":{"message":"unstable feature specified for `-Ctarget-feature`: `ptx78`","rendered":"warning: unstable feature specified"}}"#;
        assert!(diagnostics(target_feature).is_empty());
    }
}
