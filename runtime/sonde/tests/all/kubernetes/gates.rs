//! Readiness gates' settings as `sonde validate` reads them (the CLI):
//! an allowlist entry it cannot compare safely is refused. The gates
//! themselves, against the mocked API server, are in sonde-kubernetes's
//! tests (`gates`).

/// `sonde validate` checks the `kubernetes:` block's allowlist: an entry
/// that a prefix test could be fooled by is refused, naming the file and
/// the entry; a good block passes.
#[test]
fn validate_refuses_an_allowlist_entry_it_cannot_compare_safely() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    for (entry, why) in [
        ("/opt/sonde/../tmp/", "normal absolute path"),
        ("oci://ghcr.io/acme/", "registry scope"),
        ("sha256:abcd", "64 lowercase hex"),
    ] {
        std::fs::write(
            &config,
            format!("kubernetes:\n  plugins: [http, \"{entry}\"]\ntargets: []\n"),
        )
        .unwrap();
        let out = crate::support::sonde(&["validate", config.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{entry}: {stderr}");
        assert!(
            stderr.contains(config.to_str().unwrap()) && stderr.contains(entry) && stderr.contains(why),
            "{stderr}"
        );
    }
    std::fs::write(
        &config,
        "kubernetes:\n  plugins: [http, \"oci://ghcr.io/acme/*\", /opt/sonde/plugins/]\ntargets: []\n",
    )
    .unwrap();
    let out = crate::support::sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}
