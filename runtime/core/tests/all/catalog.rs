//! Incremental registry changes follow exactly the rules of a whole load:
//! a probe added to a loaded registry is refused for the same reasons, with
//! the same words, as the same probe written in the file.

use crate::support::engine;
use sonde_core::catalog::{Catalog, Change};
use sonde_core::config;
use std::path::Path;

const FILE: &str = r#"
tenants:
  - id: acme
    quotas: { max_probes: 2 }
    ceiling: { net: ["10.1.0.0/16:*"] }
targets:
  - name: shop
    tenant: acme
    address: 10.1.0.1:80
    probes:
      - { name: shop-ready, plugin: tcp }
      - { name: shop-live, plugin: tcp, kind: liveness }
  - name: db
    address: 127.0.0.1:5432
    probes:
      - { name: db-ready, plugin: tcp }
"#;

async fn loaded() -> Catalog {
    Catalog::load_text(&engine(), Path::new("sonde.yaml"), FILE)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One target, as the API or a Kubernetes Pod brings it.
fn target(yaml: &str) -> Vec<config::Target> {
    let mut f = config::parse(Path::new("PUT /v1/probes/x"), &format!("targets:\n{yaml}")).unwrap();
    for t in &mut f.targets {
        t.source = Some("PUT /v1/probes/x".into());
    }
    f.targets
}

#[tokio::test]
async fn an_added_probe_is_refused_for_the_reasons_and_in_the_words_of_a_whole_load() {
    let reg = loaded().await;
    let extra = "  - name: shop2\n    tenant: acme\n    address: 10.2.0.1:80\n    probes:\n      - { name: db-ready, plugin: htp, period: 10ms }\n";
    let incremental = reg
        .prepare(&engine(), Change::add(target(extra)))
        .await
        .unwrap_err()
        .to_string();
    // The same target written in the file.
    let whole = Catalog::load_text(&engine(), Path::new("sonde.yaml"), &format!("{FILE}{extra}"))
        .await
        .unwrap_err()
        .to_string();
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.splitn(4, ':').nth(3).unwrap_or(l).trim().to_string())
            .collect()
    };
    assert_eq!(strip(&incremental), strip(&whole));
    for rule in [
        "name: probe \"db-ready\" is already defined at sonde.yaml:",
        "period: 10ms is below the 100ms minimum",
        "target \"10.2.0.1:80\" is outside the tenant's net ceiling",
        "over the tenant's quota of 2 probes",
        "unknown built-in \"htp\"",
    ] {
        assert!(incremental.contains(rule), "{rule} in:\n{incremental}");
    }
}

#[tokio::test]
async fn add_replace_and_remove_keep_names_and_quotas_exact() {
    let engine = engine();
    let mut reg = loaded().await;
    assert_eq!(reg.probe_count("acme"), 2);
    // acme is at its quota: a third is refused, nothing changes.
    let third = "  - name: x\n    tenant: acme\n    address: 10.1.0.9:80\n    probes: [{ name: x, plugin: tcp }]\n";
    let refused = reg.prepare(&engine, Change::add(target(third))).await.unwrap_err();
    assert!(refused.to_string().contains("quotas.max_probes"), "{refused}");
    assert_eq!(reg.probes().len(), 3);
    // Removing one of acme's frees its place, and the third fits.
    let delta = reg.commit(reg.prepare(&engine, Change::remove(["shop"])).await.unwrap());
    assert_eq!(delta.removed_targets.len(), 1);
    assert_eq!(delta.removed_probes.len(), 2);
    assert_eq!(reg.probe_count("acme"), 0);
    let delta = reg.commit(reg.prepare(&engine, Change::add(target(third))).await.unwrap());
    assert_eq!(delta.probes.len(), 1);
    assert_eq!(reg.probe_count("acme"), 1);
    // Replacing it (remove + add of one name) keeps the count and the order.
    let moved = third.replace("10.1.0.9", "10.1.0.10");
    let change = Change {
        remove: vec!["x".into()],
        add: target(&moved),
        ..Change::default()
    };
    let delta = reg.commit(reg.prepare(&engine, change).await.unwrap());
    assert!(delta.removed_probes.is_empty(), "a replaced probe is not removed");
    assert_eq!(reg.probe("x").unwrap().address, "10.1.0.10:80");
    assert_eq!(reg.probe_count("acme"), 1);
    // Adding it again without removing it is a duplicate.
    let dup = reg.prepare(&engine, Change::add(target(third))).await.unwrap_err();
    assert!(
        dup.to_string().contains("name: target \"x\" is already defined"),
        "{dup}"
    );
    let names: Vec<&str> = reg.probes().map(|p| &*p.name).collect();
    assert_eq!(names, ["db-ready", "x"]);
}

#[tokio::test]
async fn a_whole_registry_is_a_full_delta() {
    let reg = loaded().await;
    let d = reg.delta();
    assert!(d.full);
    assert_eq!(d.probes.len(), 3);
    let shop = d.targets.iter().find(|t| &*t.spec.name == "shop").unwrap();
    assert_eq!(shop.probes.len(), 2);
    assert!(!shop.has_startup);
}

/// A change's own secrets (the Kubernetes agent's cells of a SondeCheck's
/// `secretRefs`) are granted to the probes that name them, when owned by
/// the probe's tenant; one of another tenant is refused as a file's would
/// be, naming no value.
#[tokio::test]
async fn a_change_s_own_secrets_are_granted_to_probes_of_their_owner_only() {
    use sonde_policy::secrets::{SecretCell, SecretValue};
    use std::sync::Arc;
    let mut reg = loaded().await;
    let cell = |owner: &str| {
        Arc::new(SecretCell::given(
            "token",
            owner.into(),
            "Secret shop/api-token key token",
            SecretValue::new(b"a-token-value-of-its-own".to_vec()),
        ))
    };
    let probe = "  - name: x\n    tenant: acme\n    address: 10.1.0.9:80\n    probes: [{ name: x, plugin: tcp, grants: { secrets: [token] } }]\n";
    let change = |owner: &str| Change {
        remove: vec!["shop".into()],
        add: target(probe),
        secrets: vec![cell(owner)],
    };
    let refused = reg.prepare(&engine(), change("beta")).await.unwrap_err().to_string();
    assert!(
        refused.contains("grants.secrets: \"token\" is not a secret of tenant \"acme\""),
        "{refused}"
    );
    assert!(!refused.contains("a-token-value"), "{refused}");
    let prepared = reg.prepare(&engine(), change("acme")).await.unwrap();
    let _ = reg.commit(prepared);
    let granted = &reg.probe("x").unwrap().grants.secrets;
    assert_eq!(granted.names().collect::<Vec<_>>(), ["token"]);
    assert_eq!(
        granted.get("token").unwrap().current().unwrap().expose(),
        b"a-token-value-of-its-own"
    );
}
