//! `sonde plugin new`: the generated crate builds for wasm32-wasip2 and its
//! own tests pass, running the component through this `sonde` binary.

use std::path::Path;
use std::process::{Command, Output};

fn cargo(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(dir).args(args);
    // A target dir of its own that persists between runs, so a warm run
    // compiles only the demo; offline, with the workspace's lock file, so
    // the versions are those already downloaded.
    cmd.env(
        "CARGO_TARGET_DIR",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target"),
    )
    .env("CARGO_NET_OFFLINE", "true")
    .env_remove("SONDE_BIN")
    .env_remove("CARGO_ENCODED_RUSTFLAGS")
    .env_remove("RUSTC_WORKSPACE_WRAPPER");
    cmd.output().expect("run cargo")
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_new_plugin_builds_and_passes_its_own_tests() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .current_dir(tmp.path())
        .args(["plugin", "new", "demo", "--vendor", "Demo Corp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let demo = tmp.path().join("demo");
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "tests/check.rs",
        "README.md",
        "rust-toolchain.toml",
    ] {
        assert!(demo.join(file).is_file(), "{file} missing");
    }
    let repo = crate::support::repo();
    std::fs::copy(repo.join("Cargo.lock"), demo.join("Cargo.lock")).unwrap();

    let out = cargo(&demo, &["build", "--target", "wasm32-wasip2", "--release"]);
    assert!(out.status.success(), "{}", show(&out));
    let wasm = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target/wasm32-wasip2/release/demo.wasm");
    let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .args(["plugin", "inspect", "-o", "json"])
        .arg(&wasm)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["info"]["name"], "demo");
    assert_eq!(info["info"]["vendor"], "Demo Corp");

    // Formatted as `cargo fmt` would, so a vendor's first commit is clean.
    let out = cargo(&demo, &["fmt", "--check"]);
    assert!(out.status.success(), "{}", show(&out));

    let out = cargo(&demo, &["test"]);
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("test result: ok. 4 passed"), "{}", show(&out));

    // Never over an existing directory.
    let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .current_dir(tmp.path())
        .args(["plugin", "new", "demo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
}
