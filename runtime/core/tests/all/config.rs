//! The config as sonde-core parses it: the `api:` block's limits, and
//! every YAML config in the docs. A YAML block in the docs is a config
//! unless its info string says what else it is (```` ```yaml kubernetes ````
//! for Kubernetes objects, ```` ```yaml api-body ```` for a body sent to the
//! API, ```` ```yaml prometheus ```` for a Prometheus config).

use sonde_tests::manifests::yaml_blocks;
use sonde_tests::tools::repo;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Info strings that mark a YAML block of the docs as something other than
/// a sonde config.
const NOT_CONFIG: &[&str] = &["kubernetes", "api-body", "prometheus"];

#[test]
fn api_limits_are_read_from_the_api_block_and_checked() {
    use sonde_core::config::{ApiLimits, ApiSpec, parse};
    let file = parse(
        Path::new("t.yaml"),
        "api: {listen: 127.0.0.1:9, header_read_timeout: 2s, max_connections: 9, max_header_bytes: 32KiB, max_watch_streams: 2, body_read_timeout: 5s, max_probe_runs: 3, max_probe_queue: 0}\n",
    )
    .unwrap();
    let spec: &ApiSpec = &file.api.as_ref().unwrap().value;
    assert_eq!(spec.listen.as_deref(), Some("127.0.0.1:9"));
    let limits = ApiLimits::from_spec(spec).unwrap();
    assert_eq!(
        limits,
        ApiLimits {
            header_read_timeout: Duration::from_secs(2),
            body_read_timeout: Duration::from_secs(5),
            max_connections: 9,
            max_header_bytes: 32 * 1024,
            max_watch_streams: 2,
            max_probe_runs: 3,
            max_probe_queue: 0,
        }
    );
    // The short form is the address alone, with the defaults.
    let file = parse(Path::new("t.yaml"), "api: 127.0.0.1:9\n").unwrap();
    let spec = &file.api.as_ref().unwrap().value;
    assert_eq!(spec.listen.as_deref(), Some("127.0.0.1:9"));
    assert_eq!(ApiLimits::from_spec(spec).unwrap(), ApiLimits::default());
    // Out of range, and unknown keys.
    for (text, why) in [
        ("api: {max_connections: 0}\n", "max_connections: must be at least 1"),
        (
            "api: {max_header_bytes: 1KiB}\n",
            "max_header_bytes: must be at least 8KiB",
        ),
        (
            "api: {header_read_timeout: 1ms}\n",
            "header_read_timeout: must be at least 100ms",
        ),
    ] {
        let file = parse(Path::new("t.yaml"), text).unwrap();
        let err = ApiLimits::from_spec(&file.api.as_ref().unwrap().value).unwrap_err();
        assert!(err.to_string().contains(why), "{text}: {err}");
    }
    let err = parse(Path::new("t.yaml"), "api: {max_conections: 5}\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_conections"), "{err}");
}

#[test]
fn the_yaml_configs_in_the_docs_parse() {
    let mut docs = vec![repo().join("README.md")];
    let mut md: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    md.sort();
    docs.extend(md);
    let mut configs = 0;
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.file_name().unwrap().to_string_lossy().into_owned();
        for (line, info, body) in yaml_blocks(&text) {
            let mark = info.trim_start_matches("yaml").trim();
            if !mark.is_empty() {
                assert!(
                    NOT_CONFIG.contains(&mark),
                    "{name}:{line}: ```{info}: a YAML block is a config, or marked one of {NOT_CONFIG:?}"
                );
                continue;
            }
            let at = PathBuf::from(format!("{name}:{line}"));
            if let Err(e) = sonde_core::config::parse(&at, &body) {
                panic!("{name}:{line}: a config block that sonde refuses:\n{e}\n{body}");
            }
            configs += 1;
        }
    }
    assert!(configs >= 8, "only {configs} config blocks found");
}
