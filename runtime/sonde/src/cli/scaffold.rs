//! `sonde plugin new [--lang rust|python|js] NAME`: a plugin that builds
//! into a component and tests itself through this `sonde` binary.
//!
//! The Rust templates live in `runtime/sonde/templates/plugin/`, the Python
//! and JavaScript ones next to their SDKs (`sdk/python/templates/plugin/`,
//! `sdk/js/templates/plugin/`, where the SDKs' own tests render them); all
//! are embedded in the binary. The plugin refers to the SDK of the sonde
//! checkout this binary was built from (or `--sdk`) by path, and its tests
//! run this binary (or `$SONDE_BIN`). The plugin is written into a
//! temporary directory next to its destination and renamed into place: an
//! error leaves nothing behind, and an existing directory is never touched.

use super::error::CliError;
use std::path::{Path, PathBuf};

/// This repository's pinned toolchain; the plugin pins the same one.
const REPO_TOOLCHAIN: &str = include_str!("../../../../rust-toolchain.toml");

/// A template: the file it becomes, its text, whether it is executable.
type Template = (&'static str, &'static str, bool);

const RUST: &[Template] = &[
    (
        "Cargo.toml",
        include_str!("../../templates/plugin/Cargo.toml.tmpl"),
        false,
    ),
    (
        "rust-toolchain.toml",
        include_str!("../../templates/plugin/rust-toolchain.toml.tmpl"),
        false,
    ),
    (
        ".gitignore",
        include_str!("../../templates/plugin/gitignore.tmpl"),
        false,
    ),
    (
        "README.md",
        include_str!("../../templates/plugin/README.md.tmpl"),
        false,
    ),
    ("src/lib.rs", include_str!("../../templates/plugin/lib.rs.tmpl"), false),
    (
        "tests/check.rs",
        include_str!("../../templates/plugin/check.rs.tmpl"),
        false,
    ),
];

const PYTHON: &[Template] = &[
    (
        "app.py",
        include_str!("../../../../sdk/python/templates/plugin/app.py.tmpl"),
        false,
    ),
    (
        "test_app.py",
        include_str!("../../../../sdk/python/templates/plugin/test_app.py.tmpl"),
        false,
    ),
    (
        "test_component.py",
        include_str!("../../../../sdk/python/templates/plugin/test_component.py.tmpl"),
        false,
    ),
    (
        "build.sh",
        include_str!("../../../../sdk/python/templates/plugin/build.sh.tmpl"),
        true,
    ),
    (
        "test.sh",
        include_str!("../../../../sdk/python/templates/plugin/test.sh.tmpl"),
        true,
    ),
    (
        ".gitignore",
        include_str!("../../../../sdk/python/templates/plugin/gitignore.tmpl"),
        false,
    ),
    (
        "README.md",
        include_str!("../../../../sdk/python/templates/plugin/README.md.tmpl"),
        false,
    ),
];

const JS: &[Template] = &[
    (
        "package.json",
        include_str!("../../../../sdk/js/templates/plugin/package.json.tmpl"),
        false,
    ),
    (
        "app.js",
        include_str!("../../../../sdk/js/templates/plugin/app.js.tmpl"),
        false,
    ),
    (
        "check.js",
        include_str!("../../../../sdk/js/templates/plugin/check.js.tmpl"),
        false,
    ),
    (
        "check.test.js",
        include_str!("../../../../sdk/js/templates/plugin/check.test.js.tmpl"),
        false,
    ),
    (
        "component.test.js",
        include_str!("../../../../sdk/js/templates/plugin/component.test.js.tmpl"),
        false,
    ),
    (
        ".gitignore",
        include_str!("../../../../sdk/js/templates/plugin/gitignore.tmpl"),
        false,
    ),
    (
        "README.md",
        include_str!("../../../../sdk/js/templates/plugin/README.md.tmpl"),
        false,
    ),
];

/// The language a plugin is written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, with the sonde-sdk crate: a wasm32-wasip2 cdylib.
    #[default]
    Rust,
    /// Python, with sdk/python (sonde_sdk), built by componentize-py.
    Python,
    /// JavaScript, with sdk/js (@sonde/sdk), built by componentize-js.
    #[value(alias = "javascript")]
    Js,
}

impl Lang {
    fn templates(self) -> &'static [Template] {
        match self {
            Lang::Rust => RUST,
            Lang::Python => PYTHON,
            Lang::Js => JS,
        }
    }

    /// A file of the SDK that shows `--sdk` is a sonde `sdk/` directory
    /// with this language's SDK in it.
    fn sdk_marker(self) -> &'static str {
        match self {
            Lang::Rust => "Cargo.toml",
            Lang::Python => "python/src/sonde_sdk/__init__.py",
            Lang::Js => "js/package.json",
        }
    }

    /// What to run once the plugin is created, in its directory.
    pub(super) fn next_steps(self) -> &'static str {
        match self {
            Lang::Rust => "cargo build --target wasm32-wasip2 --release\n  cargo test",
            Lang::Python => "./build.sh    # componentize-py 0.25.1 on PATH or in $COMPONENTIZE_PY\n  ./test.sh",
            Lang::Js => "npm install\n  npm run build\n  npm test",
        }
    }
}

/// What `sonde plugin new` was asked for.
pub(super) struct NewPlugin {
    pub name: String,
    pub lang: Lang,
    pub dir: Option<PathBuf>,
    pub sdk: Option<PathBuf>,
    pub vendor: String,
}

/// Whether `name` can name a `lang` package (and a directory).
fn check_name(name: &str, lang: Lang) -> Result<(), CliError> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(CliError::Message(format!(
            "plugin name {name:?}: use letters, digits, `-` and `_`, starting with a letter (at most 64)"
        )));
    }
    if lang == Lang::Rust && ["test", "core", "std", "alloc", "proc_macro", "self", "crate", "super"].contains(&name) {
        return Err(CliError::Message(format!(
            "plugin name {name:?} is reserved by Rust; choose another"
        )));
    }
    if lang == Lang::Js && name.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(CliError::Message(format!(
            "plugin name {name:?}: an npm package name is lowercase; use {:?}",
            name.to_ascii_lowercase()
        )));
    }
    Ok(())
}

/// The SDK to refer to: `--sdk`, or the `sdk/` next to the runtime this
/// binary was built from; it must hold `lang`'s SDK.
fn sdk_path(given: Option<PathBuf>, lang: Lang) -> Result<PathBuf, CliError> {
    let (path, from_flag) = match given {
        Some(p) => (p, true),
        None => (Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk"), false),
    };
    let marker = lang.sdk_marker();
    match path.join(marker).is_file().then(|| path.canonicalize()) {
        Some(Ok(sdk)) => Ok(sdk),
        _ if from_flag => Err(CliError::Message(format!(
            "--sdk {}: no {marker} there; give the sdk/ directory of a sonde checkout",
            path.display()
        ))),
        _ => Err(CliError::Message(format!(
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

/// A path as it goes into the templates: Rust and TOML strings take `\\`
/// and `\"` escapes; the Python and JavaScript templates also put paths in
/// shell, JSON and single-quoted strings, so such paths must not need any.
fn template_path(what: &str, path: &Path, lang: Lang) -> Result<String, CliError> {
    let text = path.display().to_string();
    if lang == Lang::Rust {
        return Ok(text.replace('\\', "\\\\").replace('"', "\\\""));
    }
    if text.chars().any(|c| "\"'\\$`".contains(c) || c.is_control()) {
        return Err(CliError::Message(format!(
            "{what} {text:?} has a quote, `\\`, `$` or a control character, which the {lang:?} plugin's scripts cannot quote; move it"
        )));
    }
    Ok(text)
}

/// Creates the plugin and returns its directory.
pub(super) fn create(req: NewPlugin) -> Result<PathBuf, CliError> {
    check_name(&req.name, req.lang)?;
    let sdk = sdk_path(req.sdk, req.lang)?;
    let dir = req.dir.unwrap_or_else(|| PathBuf::from(&req.name));
    if dir.symlink_metadata().is_ok() {
        return Err(exists(&dir));
    }
    let sonde =
        std::env::current_exe().map_err(|e| CliError::Message(format!("cannot find this sonde binary: {e}")))?;
    let sdk = template_path("the SDK's path", &sdk, req.lang)?;
    let sonde = template_path("this sonde binary's path", &sonde, req.lang)?;
    // Rust, Python and JavaScript strings all read `\\`, `\"` and `\'`.
    let vendor = (req.vendor.chars())
        .flat_map(|c| ['\\', '"', '\''].contains(&c).then_some('\\').into_iter().chain([c]))
        .collect::<String>();
    let crate_name = req.name.replace('-', "_");
    let fill = |template: &str| {
        template
            .replace("{{name}}", &req.name)
            .replace("{{crate_name}}", &crate_name)
            .replace("{{sdk_path}}", &sdk)
            .replace("{{sonde_bin}}", &sonde)
            .replace("{{vendor}}", &vendor)
            .replace("{{channel}}", toolchain_channel())
    };
    let files: Vec<(&str, String, bool)> = req
        .lang
        .templates()
        .iter()
        .map(|&(path, template, exec)| (path, fill(template), exec))
        .collect();
    write_all(&dir, &files)?;
    Ok(dir)
}

fn exists(dir: &Path) -> CliError {
    CliError::Message(format!("{}: already exists; not overwriting it", dir.display()))
}

/// Writes `files` into a temporary directory next to `dir`, then renames it
/// to `dir`, which must not exist by then either.
fn write_all(dir: &Path, files: &[(&str, String, bool)]) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(|e| CliError::file(parent, e))?;
    let staging = tempfile::Builder::new()
        .prefix(".sonde-plugin-new-")
        .tempdir_in(parent)
        .map_err(|e| CliError::file(parent, e))?;
    for (path, text, exec) in files {
        let path = staging.path().join(path);
        if let Some(sub) = path.parent() {
            std::fs::create_dir_all(sub).map_err(|e| CliError::file(sub, e))?;
        }
        std::fs::write(&path, text).map_err(|e| CliError::file(&path, e))?;
        if *exec {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| CliError::file(&path, e))?;
        }
    }
    // The temporary directory is private (0700); the plugin is not.
    std::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| CliError::file(staging.path(), e))?;
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, staging.path(), CWD, dir, RenameFlags::NOREPLACE) {
        Ok(()) => {
            // Renamed away: nothing left to remove.
            let _ = staging.keep();
            Ok(())
        }
        Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY) => Err(exists(dir)),
        // A file system without RENAME_NOREPLACE: check, then rename.
        Err(rustix::io::Errno::INVAL) if dir.symlink_metadata().is_ok() => Err(exists(dir)),
        Err(rustix::io::Errno::INVAL) => {
            std::fs::rename(staging.path(), dir).map_err(|e| CliError::file(dir, e))?;
            let _ = staging.keep();
            Ok(())
        }
        Err(e) => Err(CliError::file(dir, e.into())),
    }
}

#[cfg(test)]
#[path = "scaffold_tests.rs"]
mod tests;
