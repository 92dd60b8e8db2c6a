//! Every config shipped in `docs/examples/` and `examples/` is read as
//! shipped by a test of the `sonde` crate's `examples` module, which
//! validates it and, where it can run on one machine, runs it. The check
//! reads that module's source for the files its tests open with
//! `Example::read("…")`: a config no test reads fails here, and so does a
//! test that reads a file no longer shipped.

use crate::repo;

/// The module whose tests read the shipped configs.
const EXAMPLES_TESTS: &str = "runtime/sonde/tests/all/examples.rs";

/// The shipped configs: YAML and JSON files under the example folders,
/// less npm's manifests (the JavaScript example's build inputs, not sonde
/// configs: CI builds and runs that example with its own scripts).
fn shipped_configs() -> Vec<String> {
    let mut found = Vec::new();
    for dir in ["docs/examples", "examples"] {
        let mut stack = vec![repo().join(dir)];
        while let Some(d) = stack.pop() {
            let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            for entry in entries.flatten() {
                let path = entry.path();
                let npm = path
                    .file_name()
                    .is_some_and(|n| n == "package.json" || n == "package-lock.json" || n == "node_modules");
                if npm {
                    continue;
                }
                if path.is_dir() {
                    stack.push(path);
                } else if path
                    .extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
                {
                    found.push(path.strip_prefix(repo()).unwrap().to_string_lossy().into_owned());
                }
            }
        }
    }
    found.sort();
    found
}

/// The files `source` opens with `Example::read("…")`, each once.
fn read_by_tests(source: &str) -> Vec<String> {
    let mut read: Vec<String> = source
        .split("Example::read(\"")
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(path, _)| path.to_string()))
        .collect();
    read.sort();
    read.dedup();
    read
}

#[test]
fn every_shipped_config_is_read_by_a_test_of_the_examples_module() {
    let path = repo().join(EXAMPLES_TESTS);
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let read = read_by_tests(&source);
    assert!(
        !read.is_empty(),
        "{EXAMPLES_TESTS} reads no example: has Example::read moved?"
    );
    assert_eq!(
        shipped_configs(),
        read,
        "each shipped config needs a test in {EXAMPLES_TESTS} that reads it with Example::read"
    );
}

#[test]
fn the_files_a_test_reads_are_found_in_its_source() {
    let source = "let a = Example::read(\"docs/examples/b.yaml\").sub(\"x\", \"y\");\n\
                  Example::read(\"docs/examples/a.yaml\"); Example::read(\"docs/examples/b.yaml\");";
    assert_eq!(read_by_tests(source), ["docs/examples/a.yaml", "docs/examples/b.yaml"]);
}
