//! Build sonde plugins for `wasm32-wasip2` from a build script.
//!
//! sonde never commits a `.wasm`: its built-in plugins and its test guests are
//! compiled from source by build scripts that call [`build`]. A plugin
//! author's tests can do the same.
//!
//! ```no_run
//! // build.rs
//! let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
//! let built = sonde_build::build(&root, &["sonde-plugin-tcp"]);
//! for guest in &built {
//!     println!("{} -> {}", guest.package, guest.wasm.display());
//! }
//! ```
//!
//! A package whose manifest has `[package.metadata.sonde] no-std = true`
//! (built against `sonde-sdk` without its `std` feature) is built in a
//! cargo invocation of its own: Cargo unifies features within one, so a std
//! package beside it would turn std on for it, and another no-std package
//! its own SDK features (`panic-message`).

#![deny(missing_docs)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wasm target plugins are built for.
pub const TARGET: &str = "wasm32-wasip2";

/// One built plugin.
#[derive(Debug, Clone)]
pub struct Built {
    /// The Cargo package name.
    pub package: String,
    /// The component's path.
    pub wasm: PathBuf,
}

/// Fails the build with instructions when the wasm target is missing.
pub fn require_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = sysroot.is_some_and(|s| s.join("lib/rustlib").join(TARGET).exists());
    if !installed {
        panic!(
            "\n\nsonde builds its plugins for the `{TARGET}` target, which is not installed.\n\
             Install it with:\n\n    rustup target add {TARGET}\n\n"
        );
    }
}

/// The directory guests are built in: `<target-dir>/guests`, shared by every
/// build script and profile so each guest compiles once.
fn guest_target_dir() -> PathBuf {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("sonde_build::build runs from a build script"));
    // OUT_DIR is <target-dir>/<profile>/build/<package>-<hash>/out.
    out.ancestors()
        .nth(4)
        .map(|t| t.join("guests"))
        .unwrap_or_else(|| out.join("guests"))
}

/// Builds `packages` (members of the workspace at `workspace`) for
/// `wasm32-wasip2` in release mode and returns their components. Tells
/// Cargo to rerun the calling build script when their sources or the SDK
/// change.
///
/// # Panics
///
/// When the target is missing or the build fails: a build script has no
/// better way to report either.
pub fn build(workspace: &Path, packages: &[&str]) -> Vec<Built> {
    require_target();
    let target_dir = guest_target_dir();
    // Each package built without std goes in a cargo invocation of its own
    // (Cargo unifies features within one); the std packages share one.
    let no_std = no_std_packages(workspace);
    let (bare, with_std): (Vec<&str>, Vec<&str>) = packages.iter().partition(|p| no_std.contains(**p));
    for p in bare {
        cargo_build(workspace, &target_dir, &[p]);
    }
    if !with_std.is_empty() {
        cargo_build(workspace, &target_dir, &with_std);
    }

    println!("cargo:rerun-if-changed={}", workspace.join("sdk/src").display());
    println!("cargo:rerun-if-changed={}", workspace.join("sdk/wit").display());
    println!("cargo:rerun-if-changed={}", workspace.join("sdk/regex").display());
    println!("cargo:rerun-if-changed={}", workspace.join("Cargo.lock").display());
    packages
        .iter()
        .map(|p| Built {
            package: p.to_string(),
            wasm: target_dir
                .join(TARGET)
                .join("release")
                .join(format!("{}.wasm", p.replace('-', "_"))),
        })
        .collect()
}

fn cargo_build(workspace: &Path, target_dir: &Path, packages: &[&str]) {
    let mut cmd = cargo(workspace);
    cmd.args(["build", "--release", "--target", TARGET, "--target-dir"])
        .arg(target_dir);
    for p in packages {
        cmd.args(["-p", p]);
    }
    // The outer build's flags are for the host, not for wasm.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("cannot run cargo to build the wasm plugins");
    assert!(status.success(), "building {packages:?} for {TARGET} failed");
}

/// The cargo that runs this build script (else the one on `PATH`), in
/// `workspace`.
fn cargo(workspace: &Path) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace);
    cmd
}

/// The workspace's members whose manifest says they are built without
/// std, as `cargo metadata` reports them:
///
/// ```toml
/// [package.metadata.sonde]
/// no-std = true
/// ```
fn no_std_packages(workspace: &Path) -> BTreeSet<String> {
    let out = cargo(workspace)
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .output()
        .expect("cannot run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata = serde_json::from_slice(&out.stdout).expect("cargo metadata printed JSON");
    no_std_in(&metadata)
}

/// The packages of `cargo metadata`'s output marked `no-std`.
fn no_std_in(metadata: &serde_json::Value) -> BTreeSet<String> {
    let packages = metadata["packages"].as_array().map(Vec::as_slice).unwrap_or_default();
    packages
        .iter()
        .filter(|p| p["metadata"]["sonde"]["no-std"] == true)
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

/// The `name` of a manifest's `[package]`.
fn package_name(manifest: &str) -> Option<String> {
    manifest.lines().skip_while(|l| l.trim() != "[package]").find_map(|l| {
        l.trim()
            .strip_prefix("name")
            .map(|r| r.trim_start_matches([' ', '=']).trim().trim_matches('"').to_string())
    })
}

/// Lists the packages under `dir` (each subdirectory with a `Cargo.toml`),
/// with their directories, and tells Cargo to rerun when any of them changes.
pub fn packages_in(dir: &Path) -> Vec<(String, PathBuf)> {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if let Some(name) = package_name(&text) {
            println!("cargo:rerun-if-changed={}", entry.path().display());
            found.push((name, entry.path()));
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_say_no_std_in_their_sonde_metadata() {
        let metadata = serde_json::json!({"packages": [
            {"name": "a", "metadata": {"sonde": {"no-std": true}}},
            {"name": "b", "metadata": {"sonde": {"no-std": false}}},
            {"name": "c", "metadata": {"other": {"no-std": true}}},
            {"name": "d", "metadata": null},
        ]});
        assert_eq!(no_std_in(&metadata), BTreeSet::from(["a".to_string()]));
    }

    /// This workspace, as Cargo sees it: the built-ins without std, the
    /// ones on std not.
    #[test]
    fn the_workspace_s_no_std_packages() {
        // Found at run time: this binary may have been built in another
        // checkout sharing the target dir.
        let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo test")).join("../..");
        let found = no_std_packages(&root);
        for p in ["sonde-plugin-tcp", "sonde-plugin-http", "always_up"] {
            assert!(found.contains(p), "{p}: {found:?}");
        }
        assert!(!found.contains("sonde-plugin-postgres"), "{found:?}");
    }
}
