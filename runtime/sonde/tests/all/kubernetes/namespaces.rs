//! Namespaces without hand-written tenants (docs/kubernetes.md), as
//! `sonde validate --kubernetes` reads the example config of that section
//! (the CLI). The agent that runs it against the mocked API server is in
//! sonde-kubernetes's tests (`namespaces`).

use super::NODE;

/// The config block of docs/kubernetes.md's section on namespace
/// templates, as shipped.
fn documented_config() -> String {
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/kubernetes.md")).unwrap();
    let section = doc
        .split("## Namespaces without hand-written tenants")
        .nth(1)
        .expect("the section");
    section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its config")
        .to_string()
}

/// `sonde validate` takes the page's example as shipped, and refuses a
/// template that `sonde run` would, naming the key path, with exit 2.
#[test]
fn validate_takes_the_documented_example_and_names_a_bad_template_s_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, documented_config()).unwrap();
    let run = |path: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
            .arg("--cache-dir")
            .arg(crate::support::cache_dir())
            .args(["validate", "--kubernetes"])
            .arg(path)
            .env("NODE_NAME", NODE)
            .output()
            .unwrap()
    };
    let out = run(&good);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bad = dir.path().join("bad.yaml");
    let text = documented_config().replace("timeout: 5s", "timeout: 0s");
    assert_ne!(text, documented_config(), "the example sets the template's timeout");
    std::fs::write(&bad, text).unwrap();
    let out = run(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("kubernetes.namespace_templates.standard.quotas.timeout: must be more than zero"),
        "{stderr}"
    );
    assert!(stderr.contains("bad.yaml:"), "names the file and line: {stderr}");
}
