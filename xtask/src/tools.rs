//! The pinned `ptxas` used for the offline resource report.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Opts, workspace_root};

/// The PyPI wheel that carries `ptxas`, pinned to the GPU machine's CUDA 13.0
/// driver (a newer ptxas could accept PTX that driver's JIT rejects).
pub const PTXAS_WHEEL: &str = "nvidia-cuda-nvcc==13.0.88";
/// What `ptxas --version` of that wheel reports.
const PTXAS_VERSION: &str = "V13.0.88";

/// Where `install-ptxas` unpacks the wheel.
fn install_dir() -> PathBuf {
    workspace_root().join("target/tools/nvcc")
}

/// `ptxas` inside the unpacked wheel.
fn cached_ptxas() -> PathBuf {
    install_dir().join("nvidia/cu13/bin/ptxas")
}

/// The ptxas to use: `$PTXAS` when set (an error if it does not run), else
/// the one `install-ptxas` unpacked, else `None`.
pub fn find_ptxas() -> Result<Option<PathBuf>, String> {
    if let Some(p) = std::env::var_os("PTXAS").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        version(&p).map_err(|e| format!("PTXAS={} does not run: {e}", p.display()))?;
        return Ok(Some(p));
    }
    let cached = cached_ptxas();
    Ok(cached.is_file().then_some(cached))
}

/// The version line of `ptxas --version` (e.g. `V13.0.88`), or the whole
/// output when it has an unexpected shape.
pub fn version(ptxas: &Path) -> Result<String, String> {
    let out = Command::new(ptxas)
        .arg("--version")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "exit status {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .filter_map(|l| l.split(", ").find(|w| w.starts_with('V')))
        .next_back()
        .map(str::to_string);
    Ok(v.unwrap_or_else(|| text.trim().to_string()))
}

pub fn install_ptxas_main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &[], &["force"])?;
    let target = cached_ptxas();
    if !opts.flag("force") && target.is_file() && version(&target).is_ok_and(|v| v == PTXAS_VERSION)
    {
        println!(
            "ptxas {PTXAS_VERSION} already installed: {}",
            target.display()
        );
        return Ok(());
    }

    let tools = workspace_root().join("target/tools");
    let download = tools.join(format!("download-{}", std::process::id()));
    let staging = tools.join(format!("nvcc-staging-{}", std::process::id()));
    let result = download_and_unpack(&download, &staging);
    let _ = std::fs::remove_dir_all(&download);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }

    // Replace any earlier install only once the new one is complete.
    let dest = install_dir();
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(|e| format!("removing {}: {e}", dest.display()))?;
    }
    std::fs::rename(&staging, &dest)
        .map_err(|e| format!("moving {} to {}: {e}", staging.display(), dest.display()))?;
    let v = version(&target)
        .map_err(|e| format!("installed {} does not run: {e}", target.display()))?;
    if v != PTXAS_VERSION {
        return Err(format!(
            "installed {} reports {v}, expected {PTXAS_VERSION}",
            target.display()
        ));
    }
    println!("installed ptxas {v}: {}", target.display());
    Ok(())
}

/// Downloads the wheel into `download` and unpacks it into `staging`.
fn download_and_unpack(download: &Path, staging: &Path) -> Result<(), String> {
    unpack_wheel(download, PTXAS_WHEEL, staging, "ptxas")
}

/// Downloads the wheel `spec` into `download`, unpacks it into `staging`
/// and checks that it holds `nvidia/cu13/bin/<tool>` (made executable).
fn unpack_wheel(download: &Path, spec: &str, staging: &Path, tool: &str) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(staging);
    let wheel = pip_download_wheel(download, spec)?;
    println!("unpacking {}", wheel.display());
    std::fs::create_dir_all(staging).map_err(|e| format!("creating {}: {e}", staging.display()))?;
    let unzip = Command::new("unzip")
        .arg("-q")
        .arg("-o")
        .arg(&wheel)
        .arg("-d")
        .arg(staging)
        .status();
    let unpacked = match unzip {
        Ok(s) => s.success(),
        // No `unzip`: Python's zipfile module does the same (without file
        // modes, which are restored below).
        Err(_) => Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(staging)
            .status()
            .map_err(|e| format!("cannot run python3: {e}"))?
            .success(),
    };
    if !unpacked {
        return Err(format!("unpacking {} failed", wheel.display()));
    }
    let bin = staging.join("nvidia/cu13/bin");
    if !bin.join(tool).is_file() {
        return Err(format!(
            "the wheel has no nvidia/cu13/bin/{tool} (unpacked into {})",
            staging.display()
        ));
    }
    make_executable(&bin)
}

/// The PyPI wheels of the SASS disassembler (`cuobjdump` drives
/// `nvdisasm`); any version reads the cubins of the pinned ptxas.
const SASS_WHEELS: &[(&str, &str)] = &[
    ("nvidia-cuda-cuobjdump==13.2.78", "cuobjdump"),
    ("nvidia-cuda-nvdisasm==13.5.37", "nvdisasm"),
];

/// `cuobjdump` with `nvdisasm` next to it, unpacked into target/tools/sass
/// on first use.
fn sass_tools() -> Result<PathBuf, String> {
    let bin = workspace_root().join("target/tools/sass/nvidia/cu13/bin");
    if SASS_WHEELS.iter().all(|(_, t)| bin.join(t).is_file()) {
        return Ok(bin);
    }
    let tools = workspace_root().join("target/tools");
    for (spec, tool) in SASS_WHEELS {
        let download = tools.join(format!("download-{tool}-{}", std::process::id()));
        let staging = tools.join(format!("{tool}-staging-{}", std::process::id()));
        let result = unpack_wheel(&download, spec, &staging, tool);
        let _ = std::fs::remove_dir_all(&download);
        result?;
        std::fs::create_dir_all(&bin).map_err(|e| format!("creating {}: {e}", bin.display()))?;
        let from = staging.join("nvidia/cu13/bin").join(tool);
        std::fs::rename(&from, bin.join(tool))
            .map_err(|e| format!("moving {}: {e}", from.display()))?;
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(bin)
}

/// `cargo xtask sass`: assembles one arch's PTX module with the pinned
/// ptxas and prints its SASS (one kernel with `--kernel`), then the SASS
/// instruction count of every function (loop bodies too large for the
/// instruction cache show up there first).
pub fn sass_main(args: &[String]) -> Result<(), String> {
    let opts = Opts::parse(args, &["arch", "kernel"], &[])?;
    let arch = crate::build_ptx::select_arches(&[opts.last("arch").unwrap_or("sm_90a")])?;
    let ptxas = find_ptxas()?.ok_or("no ptxas: run `cargo xtask install-ptxas` first")?;
    let bin = sass_tools()?;
    let out = crate::build_ptx::default_out();
    crate::build_ptx::build(&arch, &out)?;
    let name = arch[0].name;
    let ptx = out.join(name).join(crate::build_ptx::PTX_FILE);
    let cubin = out.join(name).join("flashsample_kernels.cubin");
    let status = Command::new(&ptxas)
        .args(["-O3", &format!("-arch={name}"), "-o"])
        .arg(&cubin)
        .arg(&ptx)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    if !status.success() {
        return Err(format!("ptxas failed on {} ({status})", ptx.display()));
    }
    let mut cmd = Command::new(bin.join("cuobjdump"));
    cmd.env("NVDISASM_PATH", &bin).arg("-sass");
    if let Some(k) = opts.last("kernel") {
        cmd.args(["-fun", k]);
    }
    let dump = cmd
        .arg(&cubin)
        .output()
        .map_err(|e| format!("cannot run cuobjdump: {e}"))?;
    if !dump.status.success() {
        return Err(format!(
            "cuobjdump failed: {}",
            String::from_utf8_lossy(&dump.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&dump.stdout);
    println!("{text}");
    println!("SASS instructions per function ({name}):");
    let mut current: Option<(&str, usize)> = None;
    for line in text.lines() {
        if let Some(f) = line.trim().strip_prefix("Function : ") {
            if let Some((n, c)) = current.take() {
                println!("  {n:<50} {c:>7}");
            }
            current = Some((f, 0));
        } else if let Some((_, c)) = current.as_mut() {
            // An instruction line: `/*addr*/  OPCODE operands ;  /* encoding */`
            // (the encoding's second half is a line of its own, without `;`).
            let t = line.trim_start();
            if t.starts_with("/*") && t.contains(';') {
                *c += 1;
            }
        }
    }
    if let Some((n, c)) = current {
        println!("  {n:<50} {c:>7}");
    }
    Ok(())
}

/// Sets the executable bits on every file of `dir` (zipfile drops them).
fn make_executable(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_file() {
            let mut perm = std::fs::metadata(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .permissions();
            perm.set_mode(perm.mode() | 0o755);
            std::fs::set_permissions(&path, perm)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Downloads one wheel (`name==version`, no dependencies, binary only) with
/// pip into the folder `download` and returns its path.
pub fn pip_download_wheel(download: &Path, spec: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(download)
        .map_err(|e| format!("creating {}: {e}", download.display()))?;
    println!("downloading {spec} with pip");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(download)
        .arg(spec)
        .status()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`python3 -m pip download {spec}` failed ({status}); is PyPI reachable?"
        ));
    }
    std::fs::read_dir(download)
        .map_err(|e| format!("reading {}: {e}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip wrote no wheel into {}", download.display()))
}
