//! `sonde plugin new NAME`: a plugin crate that builds for wasm32-wasip2
//! and tests itself through this `sonde` binary.
//!
//! The templates live in `runtime/templates/plugin/`. The generated
//! `Cargo.toml` depends on the SDK of the sonde checkout this binary was
//! built from (or `--sdk`), and its tests run this binary (or `$SONDE_BIN`).

use super::CliError;
use std::path::{Path, PathBuf};

const CARGO_TOML: &str = include_str!("../../templates/plugin/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("../../templates/plugin/lib.rs.tmpl");
const CHECK_RS: &str = include_str!("../../templates/plugin/check.rs.tmpl");
const README: &str = include_str!("../../templates/plugin/README.md.tmpl");
const TOOLCHAIN: &str = include_str!("../../templates/plugin/rust-toolchain.toml.tmpl");
const GITIGNORE: &str = include_str!("../../templates/plugin/gitignore.tmpl");
/// This repository's pinned toolchain; the plugin pins the same one.
const REPO_TOOLCHAIN: &str = include_str!("../../../../rust-toolchain.toml");

/// What `sonde plugin new` was asked for.
pub(super) struct NewPlugin {
    pub name: String,
    pub dir: Option<PathBuf>,
    pub sdk: Option<PathBuf>,
    pub vendor: String,
}

/// Whether `name` can be a Cargo package name (and a directory name).
fn check_name(name: &str) -> Result<(), CliError> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(CliError(format!(
            "plugin name {name:?}: use letters, digits, `-` and `_`, starting with a letter (at most 64)"
        )));
    }
    if ["test", "core", "std", "alloc", "proc_macro", "self", "crate", "super"].contains(&name) {
        return Err(CliError(format!(
            "plugin name {name:?} is reserved by Rust; choose another"
        )));
    }
    Ok(())
}

/// The SDK to depend on: `--sdk`, or the `sdk/` next to the runtime this
/// binary was built from.
fn sdk_path(given: Option<PathBuf>) -> Result<PathBuf, CliError> {
    let (path, from_flag) = match given {
        Some(p) => (p, true),
        None => (Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk"), false),
    };
    match path.join("Cargo.toml").canonicalize() {
        Ok(manifest) => Ok(manifest.parent().map(Path::to_path_buf).unwrap_or(path)),
        Err(_) if from_flag => Err(CliError(format!(
            "--sdk {}: no Cargo.toml there; give the sdk/ directory of a sonde checkout",
            path.display()
        ))),
        Err(_) => Err(CliError(format!(
            "the sonde checkout this binary was built from is gone ({}); pass --sdk PATH/TO/sonde/sdk",
            path.display()
        ))),
    }
}

fn toolchain_channel() -> &'static str {
    REPO_TOOLCHAIN
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once('=')?;
            (key.trim() == "channel").then(|| value.trim().trim_matches('"'))
        })
        .unwrap_or("stable")
}

/// Escapes text for a TOML or Rust string literal: both take `\\` and `\"`.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

fn io_error(path: &Path, e: std::io::Error) -> CliError {
    CliError::file(path, &e)
}

/// Creates the crate and returns its directory.
pub(super) fn create(req: NewPlugin) -> Result<PathBuf, CliError> {
    check_name(&req.name)?;
    let sdk = sdk_path(req.sdk)?;
    let dir = req.dir.unwrap_or_else(|| PathBuf::from(&req.name));
    if dir.symlink_metadata().is_ok() {
        return Err(CliError(format!(
            "{}: already exists; not overwriting it",
            dir.display()
        )));
    }
    let sonde = std::env::current_exe().map_err(|e| CliError(format!("cannot find this sonde binary: {e}")))?;
    let crate_name = req.name.replace('-', "_");
    let fill = |template: &str| {
        template
            .replace("{{name}}", &req.name)
            .replace("{{crate_name}}", &crate_name)
            .replace("{{sdk_path}}", &escape(&sdk.display().to_string()))
            .replace("{{sonde_bin}}", &escape(&sonde.display().to_string()))
            .replace("{{vendor}}", &escape(&req.vendor))
            .replace("{{channel}}", toolchain_channel())
    };
    let files: [(&str, &str); 6] = [
        ("Cargo.toml", CARGO_TOML),
        ("rust-toolchain.toml", TOOLCHAIN),
        (".gitignore", GITIGNORE),
        ("README.md", README),
        ("src/lib.rs", LIB_RS),
        ("tests/check.rs", CHECK_RS),
    ];
    for sub in ["src", "tests"] {
        std::fs::create_dir_all(dir.join(sub)).map_err(|e| io_error(&dir, e))?;
    }
    for (path, template) in files {
        let path = dir.join(path);
        std::fs::write(&path, fill(template)).map_err(|e| io_error(&path, e))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_package_names() {
        for good in ["demo", "pg-replica", "check_2"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "2fast", "a b", "../x", "x/y", "test", &"a".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_toolchain_is_the_repository_s() {
        assert!(toolchain_channel().starts_with("1."), "{}", toolchain_channel());
    }
}
