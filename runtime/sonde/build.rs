//! Records the commit `sonde --version` and `sonde_build_info` name
//! (`SONDE_COMMIT`). Only this crate reads it, so a new commit rebuilds
//! the binary crate alone.

use std::process::Command;

fn main() {
    commit();
}

/// Sets `SONDE_COMMIT` to the checkout's short commit id, or `unknown`
/// outside a git checkout (a crate tarball). Reruns when HEAD or the branch
/// it points at moves.
fn commit() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let id = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SONDE_COMMIT={id}");
    // A worktree's HEAD lives in its own git dir; the branch it points at
    // in the common one, loose or packed. Only files that exist are named:
    // Cargo takes a missing one as changed, and would rerun this script
    // (and rebuild the crate) on every build.
    let path = |flag: &str| git(&["rev-parse", "--path-format=absolute", flag]).map(std::path::PathBuf::from);
    let mut watched = Vec::new();
    if let Some(dir) = path("--git-dir") {
        watched.push(dir.join("HEAD"));
    }
    if let Some(common) = path("--git-common-dir") {
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let loose = common.join(branch);
            // Where a packed branch's next commit writes its loose file.
            if let Some(dir) = loose.parent().filter(|d| d.is_dir()) {
                watched.push(dir.to_path_buf());
            }
            watched.push(loose);
        }
        watched.push(common.join("packed-refs"));
    }
    for file in watched.iter().filter(|f| f.exists()) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
}
