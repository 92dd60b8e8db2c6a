//! Test a plugin the way operators run it: build the component and run it
//! through the real `sonde` binary, in its sandbox, against a real target.
//!
//! Only on the host (not compiled for wasm). The helper runs
//! `cargo build --target wasm32-wasip2 --release` for the plugin crate, so a
//! test never runs a stale component, then `sonde check FILE.wasm --output
//! json` and parses the result. Plugin authors write no wasmtime code and
//! compile no wasmtime: the runtime is the `sonde` binary.
//!
//! ```no_run
//! use sonde_sdk::Status;
//! use sonde_sdk::testing::Plugin;
//!
//! let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
//! let plugin = Plugin::build(env!("CARGO_MANIFEST_DIR"));
//! let result = plugin.check(&listener.local_addr().unwrap().to_string()).config(r#"{}"#).run();
//! assert_eq!(result.status, Status::Success, "{result:?}");
//! ```
//!
//! The `sonde` binary is `$SONDE_BIN` when set, else the path given to
//! [`Plugin::with_sonde`] when it exists, else `sonde` on `PATH`.

use crate::Status;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A plugin component built from a crate, and the `sonde` binary to run it.
#[derive(Clone, Debug)]
pub struct Plugin {
    wasm: PathBuf,
    sonde: Option<PathBuf>,
}

/// The result of one `sonde check`, as its JSON output says.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    /// The verdict.
    pub status: Status,
    /// Why the run did not end with the plugin's own verdict (`timeout`,
    /// `denied`, `invalid-config`…), if so.
    pub reason: Option<String>,
    /// The message.
    pub message: String,
    /// The metrics: name, value, unit.
    pub metrics: Vec<(String, f64, String)>,
    /// The detail excerpt, if any.
    pub detail: Option<String>,
    /// `sonde`'s exit code: 0 success, 1 warning, 2 failure, 3 unknown.
    pub exit_code: i32,
}

impl CheckResult {
    /// The value of the metric `name`, if the run reported it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|(n, _, _)| n == name).map(|(_, v, _)| *v)
    }
}

/// One `sonde check` to run: the target, the config, the grants.
#[derive(Clone, Debug)]
pub struct Check<'a> {
    plugin: &'a Plugin,
    args: Vec<String>,
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The target directory of the crate at `manifest_dir`, as Cargo sees it.
fn target_dir(manifest_dir: &Path) -> PathBuf {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(manifest_dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `cargo metadata`: {e}"));
    assert!(
        out.status.success(),
        "`cargo metadata` failed in {}: {}",
        manifest_dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("`cargo metadata` prints JSON");
    PathBuf::from(
        meta["target_directory"]
            .as_str()
            .expect("target_directory in cargo metadata"),
    )
}

impl Plugin {
    /// Builds the plugin crate at `manifest_dir` (pass
    /// `env!("CARGO_MANIFEST_DIR")`) for `wasm32-wasip2` in release mode.
    ///
    /// # Panics
    ///
    /// When the build fails; its errors are on stderr.
    pub fn build(manifest_dir: impl AsRef<Path>) -> Self {
        let dir = manifest_dir.as_ref();
        let status = cargo()
            .args(["build", "--release", "--lib", "--target", "wasm32-wasip2"])
            .current_dir(dir)
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
        assert!(
            status.success(),
            "building {} for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`)",
            dir.display()
        );
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("read Cargo.toml");
        let name = manifest
            .lines()
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| {
                let (key, value) = l.split_once('=')?;
                (key.trim() == "name").then(|| value.trim().trim_matches('"').to_string())
            })
            .expect("a [package] name in Cargo.toml");
        let wasm = target_dir(dir)
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", name.replace('-', "_")));
        assert!(wasm.exists(), "the build did not produce {}", wasm.display());
        Self { wasm, sonde: None }
    }

    /// A plugin from an already built component.
    pub fn from_file(wasm: impl Into<PathBuf>) -> Self {
        Self {
            wasm: wasm.into(),
            sonde: None,
        }
    }

    /// Runs this `sonde` binary unless `$SONDE_BIN` is set (ignored when the
    /// file does not exist).
    pub fn with_sonde(mut self, path: impl Into<PathBuf>) -> Self {
        self.sonde = Some(path.into());
        self
    }

    /// The component's path.
    pub fn wasm(&self) -> &Path {
        &self.wasm
    }

    fn sonde(&self) -> PathBuf {
        if let Some(bin) = std::env::var_os("SONDE_BIN") {
            return bin.into();
        }
        match &self.sonde {
            Some(p) if p.exists() => p.clone(),
            _ => "sonde".into(),
        }
    }

    /// A check of `target` (`host:port` or a URL), with an empty config,
    /// no grants and a 1s timeout until told otherwise.
    pub fn check(&self, target: &str) -> Check<'_> {
        Check {
            plugin: self,
            args: vec!["--target".into(), target.into()],
        }
    }
}

impl Check<'_> {
    /// The plugin config, as JSON text.
    pub fn config(mut self, json: &str) -> Self {
        self.args.extend(["--config".into(), json.into()]);
        self
    }

    /// The call's deadline.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.args
            .extend(["--timeout".into(), format!("{}ms", timeout.as_millis().max(1))]);
        self
    }

    /// Grants connections to `pattern` (`host:port`), as `--allow-net`.
    pub fn allow_net(mut self, pattern: &str) -> Self {
        self.args.extend(["--allow-net".into(), pattern.into()]);
        self
    }

    /// Grants reading the directory `dir`, as `--allow-file`.
    pub fn allow_file(mut self, dir: impl AsRef<Path>) -> Self {
        self.args
            .extend(["--allow-file".into(), dir.as_ref().display().to_string()]);
        self
    }

    /// Grants running `program`, as `--allow-exec`.
    pub fn allow_exec(mut self, program: impl AsRef<Path>) -> Self {
        self.args
            .extend(["--allow-exec".into(), program.as_ref().display().to_string()]);
        self
    }

    /// Runs `sonde check` and returns what it printed.
    ///
    /// # Panics
    ///
    /// When `sonde` cannot be run or does not print a result (a usage
    /// error, such as a grant that is not a directory).
    pub fn run(self) -> CheckResult {
        let sonde = self.plugin.sonde();
        let out = Command::new(&sonde)
            .arg("check")
            .arg(&self.plugin.wasm)
            .args(&self.args)
            .args(["--output", "json"])
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} ({e}); set SONDE_BIN to the sonde binary",
                    sonde.display()
                )
            });
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "sonde printed no result (exit {:?}): {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        });
        let text = |key: &str| v[key].as_str().map(str::to_string);
        CheckResult {
            status: match v["status"].as_str() {
                Some("success") => Status::Success,
                Some("warning") => Status::Warning,
                Some("failure") => Status::Failure,
                _ => Status::Unknown,
            },
            reason: text("reason"),
            message: text("message").unwrap_or_default(),
            metrics: v["metrics"]
                .as_array()
                .map(|ms| {
                    ms.iter()
                        .map(|m| {
                            (
                                m["name"].as_str().unwrap_or_default().to_string(),
                                m["value"].as_f64().unwrap_or(f64::NAN),
                                m["unit"].as_str().unwrap_or_default().to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
            detail: text("detail"),
            exit_code: out.status.code().unwrap_or(-1),
        }
    }
}
