//! `cargo xtask build-ptx`: PTX per architecture, PTX checks, and the ptxas
//! resource report.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ptx::{self, Arch};
use crate::{Opts, absolute, cargo, tools, workspace_root};

/// Functions allowed to spill registers, with the reason. A spill anywhere
/// else fails `build-ptx`: local memory traffic in a sampling kernel is a
/// performance bug, so each entry must say why it is acceptable.
/// Entries: (function name, architecture or `"*"` for all, reason).
const SPILL_ALLOW: &[(&str, &str, &str)] = &[
    ("fused_sample_bf16_b128", "sm_80", B128_SPILL),
    ("fused_sample_f16_b128", "sm_80", B128_SPILL),
    ("fused_sample_bf16_b128", "sm_89", B128_SPILL),
    ("fused_sample_f16_b128", "sm_89", B128_SPILL),
    ("fused_sample_bf16_b128", "sm_90", B128_SPILL),
    ("fused_sample_f16_b128", "sm_90", B128_SPILL),
    ("fused_sample_bf16_b64", "sm_80", B64_SPILL),
    ("fused_sample_f16_b64", "sm_80", B64_SPILL),
    ("fused_sample_bf16_b64", "sm_89", B64_SPILL),
    ("fused_sample_f16_b64", "sm_89", B64_SPILL),
    ("fused_sample_bf16_b64", "sm_90", B64_SPILL),
    ("fused_sample_f16_b64", "sm_90", B64_SPILL),
    ("fused_sample_bf16_b64", "sm_90a", WS_SPILL),
    ("fused_sample_f16_b64", "sm_90a", WS_SPILL),
    ("fused_sample_bf16_b128", "sm_90a", WS_SPILL),
    ("fused_sample_f16_b128", "sm_90a", WS_SPILL),
    ("topk_topp_filter_f32", "sm_90", FILTER_SPILL),
    ("topk_topp_filter_f32", "sm_90a", FILTER_SPILL),
    (
        "topk_topp_filter_grouped_f32",
        "sm_80",
        GROUPED_FILTER_SPILL,
    ),
    (
        "topk_topp_filter_grouped_f32",
        "sm_89",
        GROUPED_FILTER_SPILL,
    ),
    (
        "topk_topp_filter_grouped_f32",
        "sm_90",
        GROUPED_FILTER_SPILL,
    ),
    (
        "topk_topp_filter_grouped_f32",
        "sm_90a",
        GROUPED_FILTER_SPILL,
    ),
    (
        "radix_topk_filter_small_logits_f32",
        "sm_90",
        LOGITS_FILTER_SPILL,
    ),
    (
        "radix_topk_filter_small_logits_f32",
        "sm_90a",
        LOGITS_FILTER_SPILL,
    ),
];
const LOGITS_FILTER_SPILL: &str = "the radix filter's small-k kernel over logits (Qrita's radix \
     route) at its 128-register bound: ptxas keeps one word in local memory (8-byte frame; since \
     the logit keys took 31-bit indices, session 37); sm_90a SASS (session 41): one store before \
     the row loop, one load per row in the in-place masking's write pass (MODE_MASK), none in \
     the rounds";
const FILTER_SPILL: &str = "the pre-filter pass at four blocks a multiprocessor (64 registers): \
     ptxas keeps one flag word in local memory in the scan that sums the tiers' masses (rows with \
     top-p and no top-k only; sm_90a SASS: one store and two loads a chunk)";
const GROUPED_FILTER_SPILL: &str = "the listing route's pre-filter pass at four blocks a \
     multiprocessor (64 registers), up to four chunks a block: ptxas keeps one to three words in \
     local memory in the code of rows with top-p and no top-k only (the scan that sums the tiers' \
     masses and their f64 reduction; sm_90a SASS: three stores and three loads a chunk; 8 bytes \
     on sm_80 and sm_89)";
const B64_SPILL: &str = "mma.sync path at its 128-register bound: ptxas keeps two \
     loop-invariant words (8 to 16 bytes) in local memory, stored before the step loop and \
     loaded once per step after the main loop (sm_80, sm_89 and sm_90 SASS: no local access \
     between the first and last HMMA)";
const B128_SPILL: &str = "16 warps of at most 128 registers, 64 of them accumulators: ptxas \
     spills 21 to 27 loop-invariant registers (copy addresses, staging offsets) outside the main \
     loop, about 15 local loads per step of 64 to 128 k-blocks (sm_90 SASS: none between the \
     first and last HMMA; sm_90a runs the warp-specialised kernel instead)";

const WS_SPILL: &str = "warp-specialised consumers at 112 registers (64 accumulators): ptxas \
     keeps 1 to 7 loop-invariant words (launch pointers, offsets) in local memory, stored before \
     the step loop and loaded after each step's main loop (sm_90a SASS: no local access between \
     a step's first and last HGMMA)";

/// The file name of every module under `<out>/<arch>/`.
pub const PTX_FILE: &str = "flashsample_kernels.ptx";

pub fn main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &["arch", "out"], &[])?;
    let arches = select_arches(&opts.all("arch"))?;
    let out = opts.last("out").map(absolute).unwrap_or_else(default_out);
    build(&arches, &out).map(|_| ())
}

/// `target/ptx`.
pub fn default_out() -> PathBuf {
    workspace_root().join("target/ptx")
}

/// The arches named in `--arch` values (comma-separated, repeatable), in
/// `ptx::ARCHES` order; all of them when none is named.
pub fn select_arches(values: &[&str]) -> Result<Vec<&'static Arch>, String> {
    let names: Vec<&str> = values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(ptx::ARCHES.iter().collect());
    }
    for n in &names {
        if !ptx::ARCHES.iter().any(|a| a.name == *n) {
            let known: Vec<&str> = ptx::ARCHES.iter().map(|a| a.name).collect();
            return Err(format!(
                "unknown architecture `{n}` (known: {})",
                known.join(", ")
            ));
        }
    }
    Ok(ptx::ARCHES
        .iter()
        .filter(|a| names.contains(&a.name))
        .collect())
}

/// Builds and checks every arch of `arches` into `<out>/<arch>/`, then runs
/// the ptxas report when ptxas is available. Returns the report's text (empty
/// without ptxas).
pub fn build(arches: &[&Arch], out: &Path) -> Result<String, String> {
    let root = workspace_root();
    let kernels = root.join("kernels");
    let target_dir = root.join("target/ptx-build");
    let cargo = cargo();
    let mut rejected = Vec::new();
    let mut written = Vec::new();
    for arch in arches {
        println!("building PTX for {}", arch.name);
        let text = ptx::build(
            &cargo,
            &kernels,
            &target_dir,
            arch,
            flashsample_kernels::LAUNCH_BOUNDS,
        )?;
        let dir = out.join(arch.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let file = dir.join(PTX_FILE);
        let rejected_file = dir.join("flashsample_kernels.rejected.ptx");
        let _ = std::fs::remove_file(&rejected_file);

        let mut problems = ptx::check(&text, flashsample_kernels::ENTRY_POINTS);
        if let Some(t) = ptx_target(&text).filter(|t| *t != arch.cpu) {
            problems.push(format!(
                "the module says `.target {t}`, expected {} (stale output of the nested build?)",
                arch.cpu
            ));
        }
        if problems.is_empty() {
            std::fs::write(&file, &text).map_err(|e| format!("writing {}: {e}", file.display()))?;
            println!("  wrote {}", file.display());
            written.push((*arch, file));
        } else {
            // Keep the module for inspection, but never where the good one
            // would be.
            let _ = std::fs::remove_file(&file);
            std::fs::write(&rejected_file, &text)
                .map_err(|e| format!("writing {}: {e}", rejected_file.display()))?;
            eprintln!(
                "error: PTX for {} is unusable (kept as {}):",
                arch.name,
                rejected_file.display()
            );
            for p in &problems {
                eprintln!("  {p}");
            }
            rejected.push(arch.name);
        }
    }
    if !rejected.is_empty() {
        return Err(format!(
            "unusable PTX for {}: device code must not reference panics, bounds checks or \
             formatting, and must export every entry point of flashsample_kernels::ENTRY_POINTS",
            rejected.join(", ")
        ));
    }

    let Some(ptxas) = tools::find_ptxas()? else {
        println!("note: ptxas not found; run cargo xtask install-ptxas for the resource report");
        return Ok(String::new());
    };
    resource_report(&ptxas, &written, &target_dir.join("cubin"))
}

/// The architecture of a module's `.target` directive.
fn ptx_target(text: &str) -> Option<&str> {
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(".target"))
        .and_then(|rest| rest.split([',', ' ', '\t']).find(|w| !w.is_empty()))
}

/// Resources of one function, as `ptxas -v` reports them.
#[derive(Default, Debug, PartialEq)]
struct Resources {
    name: String,
    entry: bool,
    registers: u64,
    smem: u64,
    stack: u64,
    spill_stores: u64,
    spill_loads: u64,
    barriers: u64,
}

/// Assembles every module with `ptxas -v`, prints one table per arch, warns
/// about stack frames and fails on spills that `SPILL_ALLOW` does not list.
fn resource_report(
    ptxas: &Path,
    modules: &[(&Arch, PathBuf)],
    cubin_dir: &Path,
) -> Result<String, String> {
    let version = tools::version(ptxas)?;
    std::fs::create_dir_all(cubin_dir)
        .map_err(|e| format!("creating {}: {e}", cubin_dir.display()))?;
    let mut report = String::new();
    let mut errors = Vec::new();
    for (arch, file) in modules {
        let cubin = cubin_dir.join(format!("{}.cubin", arch.name));
        let out = Command::new(ptxas)
            .arg(format!("-arch={}", arch.name))
            .arg("-v")
            .arg(file)
            .arg("-o")
            .arg(&cubin)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            eprintln!(
                "error: ptxas -arch={} rejected {}:\n{}",
                arch.name,
                file.display(),
                log.trim_end()
            );
            errors.push(format!("ptxas -arch={} rejected the module", arch.name));
            continue;
        }
        for w in log.lines().filter(|l| l.contains("ptxas warning")) {
            eprintln!("warning: {}: {}", arch.name, w.trim());
        }
        let funcs = parse_ptxas(&log);
        let table = format_table(arch.name, &version, &funcs);
        print!("{table}");
        report.push_str(&table);
        for f in &funcs {
            if f.stack > 0 {
                eprintln!(
                    "warning: {} {}: {} bytes stack frame (local memory)",
                    arch.name, f.name, f.stack
                );
            }
            if f.spill_stores > 0 || f.spill_loads > 0 {
                match spill_allowance(&f.name, arch.name) {
                    Some(reason) => eprintln!(
                        "note: {} {} spills ({} bytes stored, {} loaded); allowed: {reason}",
                        arch.name, f.name, f.spill_stores, f.spill_loads
                    ),
                    None => {
                        let e = format!(
                            "{} {} spills registers ({} bytes stored, {} bytes loaded); fix it \
                             or list it in SPILL_ALLOW (xtask/src/build_ptx.rs) with a reason",
                            arch.name, f.name, f.spill_stores, f.spill_loads
                        );
                        eprintln!("error: {e}");
                        errors.push(e);
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "the ptxas report failed:\n  {}",
            errors.join("\n  ")
        ))
    }
}

fn spill_allowance(function: &str, arch: &str) -> Option<&'static str> {
    SPILL_ALLOW
        .iter()
        .find(|(f, a, _)| *f == function && (*a == "*" || *a == arch))
        .map(|(_, _, reason)| *reason)
}

/// Parses the `-v` output of ptxas: for every function its stack and spill
/// line, and for entry points the `Used N registers, ...` line.
fn parse_ptxas(log: &str) -> Vec<Resources> {
    let mut funcs: Vec<Resources> = Vec::new();
    let mut current: Option<usize> = None;
    let mut current_entry: Option<usize> = None;
    let index = |funcs: &mut Vec<Resources>, name: &str| -> usize {
        match funcs.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                funcs.push(Resources {
                    name: name.to_string(),
                    ..Resources::default()
                });
                funcs.len() - 1
            }
        }
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or(rest);
            let i = index(&mut funcs, name);
            funcs[i].entry = true;
            current_entry = Some(i);
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = Some(index(&mut funcs, rest.trim()));
        } else if line.contains("bytes stack frame")
            && let Some(i) = current
        {
            for (n, key) in counts(line) {
                match key.as_str() {
                    "bytes stack frame" => funcs[i].stack = n,
                    "bytes spill stores" => funcs[i].spill_stores = n,
                    "bytes spill loads" => funcs[i].spill_loads = n,
                    _ => {}
                }
            }
        } else if line.contains(" registers")
            && let Some(i) = current_entry.or(current)
        {
            for (n, key) in counts(line) {
                match key.as_str() {
                    "registers" => funcs[i].registers = n,
                    "barriers" => funcs[i].barriers = n,
                    "bytes smem" => funcs[i].smem = n,
                    _ => {}
                }
            }
        }
    }
    funcs
}

/// `(number, words after it)` for each comma-separated part of a ptxas line:
/// `"ptxas info : Used 29 registers, 1024 bytes smem"` gives
/// `[(29, "registers"), (1024, "bytes smem")]`.
fn counts(line: &str) -> Vec<(u64, String)> {
    let body = line.rsplit_once(" : ").map_or(line, |(_, b)| b);
    body.split(',')
        .filter_map(|part| {
            let words: Vec<&str> = part.split_whitespace().collect();
            let at = words.iter().position(|w| w.parse::<u64>().is_ok())?;
            let n = words[at].parse().ok()?;
            Some((n, words[at + 1..].join(" ")))
        })
        .collect()
}

fn format_table(arch: &str, version: &str, funcs: &[Resources]) -> String {
    let width = funcs
        .iter()
        .map(|f| f.name.len() + if f.entry { 0 } else { 7 })
        .max()
        .unwrap_or(0)
        .max("kernel".len());
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{arch} (ptxas {version} -arch={arch}; smem is static shared memory only)"
    );
    let _ = writeln!(
        t,
        "{:<width$}  {:>9}  {:>9}  {:>11}  {:>12}  {:>11}  {:>8}",
        "kernel", "registers", "smem B", "stack B", "spill st B", "spill ld B", "barriers"
    );
    // Entry points first, then device functions ptxas kept separate.
    for f in funcs
        .iter()
        .filter(|f| f.entry)
        .chain(funcs.iter().filter(|f| !f.entry))
    {
        let name = if f.entry {
            f.name.clone()
        } else {
            format!("{} (func)", f.name)
        };
        let regs = if f.entry {
            f.registers.to_string()
        } else {
            "-".to_string()
        };
        let _ = writeln!(
            t,
            "{:<width$}  {:>9}  {:>9}  {:>11}  {:>12}  {:>11}  {:>8}",
            name, regs, f.smem, f.stack, f.spill_stores, f.spill_loads, f.barriers
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    64 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 8 registers, used 1 barriers, 64 bytes cumulative stack size, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 2.291 ms
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'j' for 'sm_90'
ptxas info    : Function properties for j
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 29 registers, used 0 barriers
";

    #[test]
    fn parses_ptxas_verbose_output() {
        let f = parse_ptxas(LOG);
        assert_eq!(
            f[0],
            Resources {
                name: "k".into(),
                entry: true,
                registers: 8,
                smem: 1024,
                stack: 64,
                spill_stores: 8,
                spill_loads: 4,
                barriers: 1,
            }
        );
        assert_eq!(f[1].name, "helper");
        assert!(!f[1].entry);
        assert_eq!(f[2].name, "j");
        assert_eq!((f[2].registers, f[2].barriers, f[2].smem), (29, 0, 0));
        assert_eq!(f.len(), 3);
    }

    #[test]
    fn reads_the_target_directive() {
        assert_eq!(ptx_target(".version 8.0\n.target sm_90a\n"), Some("sm_90a"));
        assert_eq!(ptx_target(".target sm_80, debug\n"), Some("sm_80"));
    }

    #[test]
    fn raises_tensor_map_parameter_alignment() {
        let ptx = ".entry k(\n\t.param .align 16 .b8 k_param_0[128],\n\t.param .u64 k_param_1\n)\n";
        let out = ptx::with_tensor_map_alignment(ptx, &["k_param_0"]).unwrap();
        assert!(out.contains(".param .align 64 .b8 k_param_0[128]"));
        assert!(!out.contains(".align 16"));
        // A listed parameter that is not a 128-byte one is an error.
        assert!(ptx::with_tensor_map_alignment(ptx, &["k_param_1"]).is_err());
    }

    #[test]
    fn launch_bounds_name_their_modules() {
        use flashsample_kernels::{LAUNCH_BOUNDS, Modules};
        // Every kernel has at most one set of bounds in each module.
        for arch in ptx::ARCHES {
            let mut seen: Vec<&str> = LAUNCH_BOUNDS
                .iter()
                .filter(|b| b.modules.includes(arch.name))
                .map(|b| b.kernel)
                .collect();
            let n = seen.len();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), n, "{}", arch.name);
        }
        assert!(Modules::Sm90a.includes("sm_90a") && !Modules::Sm90a.includes("sm_90"));
        assert!(!Modules::NotSm90a.includes("sm_90a") && Modules::NotSm90a.includes("sm_80"));
    }

    #[test]
    fn selects_arches_in_canonical_order() {
        let a = select_arches(&["sm_90a,sm_80"]).unwrap();
        let names: Vec<&str> = a.iter().map(|a| a.name).collect();
        assert_eq!(names, ["sm_80", "sm_90a"]);
        assert!(select_arches(&["sm_70"]).is_err());
        assert_eq!(select_arches(&[]).unwrap().len(), ptx::ARCHES.len());
    }
}
