//! Fuzzing the config parser and the whole load (`sonde validate`'s path)
//! with seeded generators (the convention of `sonde_tests::seeded`): never
//! a panic or a hang, every error names a place.

use crate::support::engine;
use sonde_tests::seeded::{self, Case, YAML_TOKENS, bytes, config_corpus, mutate};

/// The cases of `target` ([`sonde_tests::seeded`]).
fn cases(target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    seeded::cases("fuzz", target, default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_files_never_crash_the_parser_or_the_load() {
    let corpus = config_corpus();
    let dir = tempfile::tempdir().unwrap();
    // The corpus's token files, so the load goes past them.
    for (p, _) in &corpus {
        for e in std::fs::read_dir(p.parent().unwrap()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "token") {
                let to = dir.path().join(e.file_name());
                std::fs::copy(e.path(), &to).unwrap();
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            }
        }
    }
    let path = dir.path().join("sonde.yaml");
    let (mut parsed, mut loaded) = (0, 0);
    for (_case, mut rng) in cases("config_files_never_crash_the_parser_or_the_load", 1500) {
        let text = match rng.u8(..8) {
            0 => bytes(&mut rng, 512),
            _ => {
                let (_, seed) = &corpus[rng.usize(..corpus.len())];
                mutate(&mut rng, seed.as_bytes(), YAML_TOKENS)
            }
        };
        let text = String::from_utf8_lossy(&text).replace("oci://", "oci:");
        match sonde_core::config::parse(&path, &text) {
            Err(errors) => {
                for e in &errors.0 {
                    assert_eq!(e.place.file, path, "an error that names no file: {e}");
                }
            }
            Ok(_) => {
                parsed += 1;
                let engine = engine();
                let load = sonde_core::catalog::Catalog::load_text(&engine, &path, &text);
                // A load waits on nothing outside: bounded loosely.
                match tokio::time::timeout(std::time::Duration::from_secs(60), load)
                    .await
                    .unwrap_or_else(|_| panic!("loading this config hung:\n{text}"))
                {
                    Ok(_) => loaded += 1,
                    Err(errors) => assert!(!errors.0.is_empty()),
                }
            }
        }
    }
    eprintln!("config: {parsed} parsed, {loaded} loaded");
}
