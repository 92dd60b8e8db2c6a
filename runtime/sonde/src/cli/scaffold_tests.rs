//! `sonde plugin new`'s tests: the command line, names, and what is written
//! (or not) for each language.

use super::*;
use crate::cli::command::{Cli, Command};
use crate::cli::plugin::PluginCommand;
use clap::Parser;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(["sonde", "plugin", "new"].into_iter().chain(args.iter().copied()))
}

fn lang_of(args: &[&str]) -> Lang {
    match parse(args).unwrap().command {
        Command::Plugin(PluginCommand::New { lang, .. }) => lang,
        _ => panic!("not plugin new"),
    }
}

fn new(lang: Lang, dir: &Path) -> Result<PathBuf, CliError> {
    create(NewPlugin {
        name: "demo-check".into(),
        lang,
        dir: Some(dir.to_path_buf()),
        sdk: None,
        vendor: "ACME \"Probes\" l's".into(),
    })
}

/// The names of the files under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path().strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_language_is_rust_unless_given() {
    assert_eq!(lang_of(&["demo"]), Lang::Rust);
    assert_eq!(lang_of(&["--lang", "python", "demo"]), Lang::Python);
    assert_eq!(lang_of(&["--lang", "js", "demo"]), Lang::Js);
    assert_eq!(lang_of(&["--lang", "javascript", "demo"]), Lang::Js);
}

#[test]
fn an_unknown_language_is_refused_with_the_known_ones() {
    let Err(e) = parse(&["--lang", "go", "demo"]) else {
        panic!("go accepted")
    };
    let e = e.to_string();
    assert!(e.contains("invalid value 'go' for '--lang <LANG>'"), "{e}");
    assert!(e.contains("[possible values: rust, python, js]"), "{e}");
}

#[test]
fn names_must_be_package_names() {
    for good in ["demo", "pg-replica", "check_2"] {
        assert!(check_name(good, Lang::Rust).is_ok(), "{good}");
    }
    for bad in ["", "2fast", "a b", "../x", "x/y", "test", &"a".repeat(65)] {
        assert!(check_name(bad, Lang::Rust).is_err(), "{bad:?}");
    }
    assert!(check_name("test", Lang::Python).is_ok(), "reserved in Rust only");
    assert!(check_name("Demo", Lang::Python).is_ok());
    let e = check_name("Demo", Lang::Js).unwrap_err().to_string();
    assert!(e.contains("lowercase") && e.contains("\"demo\""), "{e}");
}

#[test]
fn the_toolchain_is_the_repository_s() {
    assert!(toolchain_channel().starts_with("1."), "{}", toolchain_channel());
}

#[test]
fn each_language_writes_its_files_filled_in() {
    let tmp = tempfile::tempdir().unwrap();
    let want: [(Lang, &[&str]); 3] = [
        (
            Lang::Rust,
            &[
                ".gitignore",
                "Cargo.toml",
                "README.md",
                "rust-toolchain.toml",
                "src/lib.rs",
                "tests/check.rs",
            ],
        ),
        (
            Lang::Python,
            &[
                ".gitignore",
                "README.md",
                "app.py",
                "build.sh",
                "test.sh",
                "test_app.py",
                "test_component.py",
            ],
        ),
        (
            Lang::Js,
            &[
                ".gitignore",
                "README.md",
                "app.js",
                "check.js",
                "check.test.js",
                "component.test.js",
                "package.json",
            ],
        ),
    ];
    let sdk = sdk_path(None, Lang::Rust).unwrap().display().to_string();
    for (lang, names) in want {
        let dir = new(lang, &tmp.path().join(format!("{lang:?}"))).unwrap();
        assert_eq!(files(&dir), names, "{lang:?}");
        let all: String = names
            .iter()
            .map(|n| std::fs::read_to_string(dir.join(n)).unwrap())
            .collect();
        assert!(!all.contains("{{"), "{lang:?}: a placeholder is left");
        assert!(all.contains("demo-check") && all.contains(&sdk), "{lang:?}");
        for n in names {
            let mode = std::os::unix::fs::PermissionsExt::mode(&dir.join(n).metadata().unwrap().permissions());
            assert_eq!(mode & 0o111 != 0, n.ends_with(".sh"), "{lang:?} {n}: {mode:o}");
        }
    }
    let py = std::fs::read_to_string(tmp.path().join("Python/app.py")).unwrap();
    assert!(py.contains(r#"vendor = "ACME \"Probes\" l\'s""#), "{py}");
    let pkg = std::fs::read_to_string(tmp.path().join("Js/package.json")).unwrap();
    assert!(pkg.contains(&format!("\"file:{sdk}/js\"")), "{pkg}");
    // Nothing but the plugins: no staging directory is left.
    let mut top: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    top.sort();
    assert_eq!(top, ["Js", "Python", "Rust"]);
}

#[test]
fn an_existing_directory_is_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo-check");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("app.py"), "mine").unwrap();
    for lang in [Lang::Rust, Lang::Python, Lang::Js] {
        let e = new(lang, &dir).unwrap_err().to_string();
        assert!(e.contains("already exists; not overwriting it"), "{e}");
        assert_eq!(std::fs::read_to_string(dir.join("app.py")).unwrap(), "mine");
        assert_eq!(files(&dir), ["app.py"]);
    }
    // A file or a dangling symlink is there too.
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), tmp.path().join("link")).unwrap();
    assert!(new(Lang::Js, &tmp.path().join("link")).is_err());
    assert!(!tmp.path().join("nowhere").exists());
}

#[test]
fn a_directory_that_appears_meanwhile_is_kept_and_nothing_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    // Created between the check and the rename: even empty, it stays.
    let dir = tmp.path().join("late");
    std::fs::create_dir(&dir).unwrap();
    let e = write_all(&dir, &[("a.txt", "x".into(), false)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("already exists"), "{e}");
    assert!(files(&dir).is_empty());
    // A write that fails half-way leaves nothing either.
    let half = tmp.path().join("half");
    let bad = [("a", "x".into(), false), ("a/b", "y".into(), false)];
    assert!(write_all(&half, &bad).is_err());
    assert!(!half.exists());
    let top: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(top, ["late"], "a staging directory is left");
}

#[test]
fn an_sdk_without_the_language_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("Cargo.toml"), "").unwrap();
    assert!(sdk_path(Some(tmp.path().to_path_buf()), Lang::Rust).is_ok());
    for lang in [Lang::Python, Lang::Js] {
        let e = sdk_path(Some(tmp.path().to_path_buf()), lang).unwrap_err().to_string();
        assert!(e.starts_with("--sdk ") && e.contains(lang.sdk_marker()), "{e}");
    }
}

#[test]
fn a_path_the_scripts_cannot_quote_is_refused() {
    assert_eq!(
        template_path("x", Path::new(r#"/a "b"\c"#), Lang::Rust).unwrap(),
        r#"/a \"b\"\\c"#
    );
    for bad in ["/a'b", "/a$b", "/a\"b", "/a`b", "/a\nb"] {
        assert!(template_path("x", Path::new(bad), Lang::Python).is_err(), "{bad:?}");
        assert!(template_path("x", Path::new(bad), Lang::Js).is_err(), "{bad:?}");
    }
    assert!(template_path("x", Path::new("/a b/c-d"), Lang::Js).is_ok());
}
