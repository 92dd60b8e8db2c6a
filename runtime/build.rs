//! Builds the built-in plugins under `plugins/` for wasm32-wasip2,
//! generates the table that embeds them (`$OUT_DIR/builtins.rs`), and
//! records the commit `sonde --version` names (`SONDE_COMMIT`).

use std::path::Path;
use std::process::Command;

fn main() {
    commit();
    // Read at run time, not baked in with env!: a build script binary
    // reused from another checkout's target dir must build this checkout.
    let root = Path::new(&std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo")).join("..");
    let plugins = sonde_build::packages_in(&root.join("plugins"));
    let names: Vec<&str> = plugins.iter().map(|(n, _)| n.as_str()).collect();
    let built = sonde_build::build(&root, &names);
    let mut table =
        String::from("/// Built-in plugins: (name, component bytes).\npub static BUILTINS: &[(&str, &[u8])] = &[\n");
    for b in &built {
        let short = b.package.strip_prefix("sonde-plugin-").unwrap_or(&b.package);
        table.push_str(&format!(
            "    ({short:?}, include_bytes!({:?})),\n",
            b.wasm.display().to_string()
        ));
    }
    table.push_str("];\n");
    let out = Path::new(&std::env::var_os("OUT_DIR").unwrap()).join("builtins.rs");
    std::fs::write(out, table).unwrap();
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
