//! Builds the kernels crate into one PTX module per architecture and embeds
//! them (see `xtask/src/ptx.rs`, shared with `cargo xtask build-ptx`).

#[path = "../xtask/src/ptx.rs"]
mod ptx;

use std::path::PathBuf;

/// Restricts the embedded modules (see `main`).
const PTX_ARCHES_ENV: &str = "FLASHSAMPLE_PTX_ARCHES";

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest
        .parent()
        .expect("host/ lives in the workspace root")
        .to_path_buf();
    let kernels = root.join("kernels");
    println!("cargo:rerun-if-changed={}", kernels.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        kernels.join("Cargo.toml").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        root.join("xtask/src/ptx.rs").display()
    );
    let cargo = PathBuf::from(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    // The nested build keeps its own target folder next to the workspace's so
    // that `core` for nvptx is compiled once and reused across builds.
    let target_dir = root.join("target").join("ptx-build");
    let mut table =
        String::from("/// (architecture, PTX module) for every embedded architecture.\n");
    table.push_str("pub const MODULES: &[(&str, &str)] = &[\n");
    // FLASHSAMPLE_PTX_ARCHES (comma-separated, e.g. `sm_90a`) embeds only
    // those modules: the GPU bundle's executables carry the one its GPU
    // runs, which keeps the bundle under the transfer limit.
    println!("cargo:rerun-if-env-changed={PTX_ARCHES_ENV}");
    let only = std::env::var(PTX_ARCHES_ENV).ok();
    let arches: Vec<&ptx::Arch> = ptx::ARCHES
        .iter()
        .filter(|a| {
            only.as_ref()
                .is_none_or(|o| o.split(',').any(|n| n.trim() == a.name))
        })
        .collect();
    if arches.is_empty() {
        panic!(
            "{PTX_ARCHES_ENV}={only:?} names none of {:?}",
            ptx::ARCHES.iter().map(|a| a.name).collect::<Vec<_>>()
        );
    }
    for arch in arches {
        let text = ptx::build(
            &cargo,
            &kernels,
            &target_dir,
            arch,
            flashsample_kernels::LAUNCH_BOUNDS,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let problems = ptx::check(&text, flashsample_kernels::ENTRY_POINTS);
        if !problems.is_empty() {
            panic!(
                "PTX for {} is unusable:\n  {}",
                arch.name,
                problems.join("\n  ")
            );
        }
        let file = out.join(format!("flashsample_{}.ptx", arch.name));
        std::fs::write(&file, text).expect("write PTX");
        table.push_str(&format!(
            "    (\"{}\", include_str!({:?})),\n",
            arch.name, file
        ));
    }
    table.push_str("];\n");
    std::fs::write(out.join("ptx_modules.rs"), table).expect("write module table");
}
