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
    // A worktree's HEAD lives in its own git dir; the branch refs in the
    // common one (packed or loose).
    for (flag, files) in [
        ("--git-dir", &["HEAD"][..]),
        ("--git-common-dir", &["packed-refs", "refs/heads"][..]),
    ] {
        if let Some(dir) = git(&["rev-parse", "--path-format=absolute", flag]) {
            for f in files {
                println!("cargo:rerun-if-changed={}", Path::new(&dir).join(f).display());
            }
        }
    }
}
