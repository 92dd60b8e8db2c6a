//! Tenants: a config's tenants, tokens, quotas and ceilings as the registry
//! loads them (every problem at once, each with its place, tenant, probe and
//! grant). The hostile-tenant acceptance test is a binary of its own
//! (`tests/hostile_tenant.rs`), so that no other test shares its CPU.

use crate::support::engine;
use sonde::api::auth::{Principal, authenticate};
use sonde_core::catalog::Catalog;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

async fn load(dir: &Path, yaml: &str) -> Result<Catalog, String> {
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    Catalog::load_file(&engine(), &path).await.map_err(|e| e.to_string())
}

fn token_file(dir: &Path, name: &str, token: &str, mode: u32) {
    let path = dir.join(name);
    std::fs::write(&path, token).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn probes_belong_to_their_targets_tenant() {
    let dir = tempfile::tempdir().unwrap();
    token_file(dir.path(), "acme.token", "acme-secret\n", 0o600);
    token_file(dir.path(), "operator.token", "  op-secret  ", 0o640);
    let reg = load(
        dir.path(),
        r#"
operator_token_file: operator.token
tenants:
  - id: acme
    token_file: acme.token
    quotas: { max_probes: 2, max_concurrent_runs: 3, timeout: 2s, fuel: 5000000, memory: 32MiB }
    ceiling: { net: ["10.0.0.0/8:*", "*.acme.internal:443"] }
targets:
  - name: shop
    tenant: acme
    address: 10.1.2.3:8080
    probes:
      - plugin: tcp
        grants: { net: ["db.acme.internal:443"] }
  - name: node
    address: 127.0.0.1:22
    probes:
      - plugin: tcp
        timeout: 30s
"#,
    )
    .await
    .unwrap();
    let probes: Vec<_> = reg.probes().collect();
    let shop = probes[0];
    assert_eq!(&*shop.tenant, "acme");
    assert_eq!(&*reg.targets().next().unwrap().tenant, "acme");
    // Defaults a probe does not set are lowered to its tenant's quotas.
    assert_eq!(shop.limits.fuel, 5_000_000);
    assert_eq!(shop.limits.memory, 32 << 20);
    assert_eq!(shop.limits.timeout, Duration::from_secs(1));
    // The operator's probes have no ceiling.
    assert_eq!(&*probes[1].tenant, "default");
    assert_eq!(probes[1].limits.timeout, Duration::from_secs(30));
    let acme = reg.tenants.get("acme").unwrap();
    assert_eq!(acme.quotas.max_concurrent_runs, 3);
    assert!(
        acme.check(&shop.name, &shop.address, &shop.grants, &shop.limits)
            .is_empty()
    );
    assert_eq!(
        authenticate("acme-secret", reg.tenants.credentials()),
        Some(Principal::Tenant("acme".into()))
    );
    assert_eq!(
        authenticate("op-secret", reg.tenants.credentials()),
        Some(Principal::Operator)
    );
    assert_eq!(authenticate("acme-secret\n", reg.tenants.credentials()), None);
    let debug = format!("{reg:?}");
    assert!(
        !debug.contains("acme-secret") && !debug.contains("op-secret"),
        "{debug}"
    );
}

#[tokio::test]
async fn everything_over_a_tenants_ceiling_or_quotas_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    token_file(dir.path(), "open.token", "t1", 0o644);
    token_file(dir.path(), "a.token", "same", 0o600);
    token_file(dir.path(), "b.token", "same", 0o600);
    token_file(dir.path(), "empty.token", "\n", 0o600);
    let e = load(
        dir.path(),
        r#"tenants:
  - id: acme
    token_file: a.token
    quotas: { max_probes: 1, timeout: 2s }
    ceiling: { net: ["10.0.0.0/8:*", "*.acme.internal:443"], files: [/etc] }
  - id: acme
  - id: default
  - id: open
    token_file: open.token
  - id: copy
    token_file: b.token
  - id: blank
    token_file: empty.token
  - id: lost
    token_file: missing.token
targets:
  - name: shop
    tenant: acme
    address: 10.1.2.3:8080
    probes:
      - name: shop-ready
        plugin: tcp
        timeout: 5s
        grants:
          net: ["db.acme.internal:443", "*:443", "10.0.0.0/7:80"]
          files: [/var]
      - name: shop-live
        kind: liveness
        plugin: tcp
        target: 192.168.1.1:80
  - name: other
    tenant: nobody
    address: 10.0.0.1:1
"#,
    )
    .await
    .unwrap_err();
    let lines: Vec<&str> = e.lines().collect();
    let expect = [
        "sonde.yaml:6:9: id: tenant \"acme\" is already defined at ",
        "sonde.yaml:7:9: id: \"default\" is the operator's tenant",
        "sonde.yaml:9:17: tenant \"open\": token_file ",
        "sonde.yaml:13:17: tenant \"blank\": token_file ",
        "sonde.yaml:15:17: tenant \"lost\": token_file ",
        "sonde.yaml:10:9: token: tenant \"copy\" has the same token as tenant \"acme\"; each needs its own",
        "sonde.yaml:23:18: timeout: tenant \"acme\": probe \"shop-ready\": timeout 5s is over the tenant's quota of 2s",
        "sonde.yaml:25:41: grants.net: tenant \"acme\": probe \"shop-ready\": grants.net \"*:443\" is wider than the tenant's net ceiling",
        "sonde.yaml:25:50: grants.net: tenant \"acme\": probe \"shop-ready\": grants.net \"10.0.0.0/7:80\" is wider",
        "sonde.yaml:26:19: grants.files: tenant \"acme\": probe \"shop-ready\": grants.files \"/var\" is not in the tenant's files ceiling",
        "sonde.yaml:27:15: quotas.max_probes: tenant \"acme\": probe \"shop-live\" is over the tenant's quota of 1 probes",
        "sonde.yaml:30:17: target: tenant \"acme\": probe \"shop-live\": target \"192.168.1.1:80\" is outside the tenant's net ceiling",
        "sonde.yaml:32:13: tenant: no tenant \"nobody\" is defined (tenants: acme, open, copy, blank, lost)",
    ];
    for want in expect {
        assert!(lines.iter().any(|l| l.contains(want)), "missing {want:?} in:\n{e}");
    }
    assert!(e.contains("every user (mode 644)"), "{e}");
    assert!(e.contains("the token is empty"), "{e}");
    assert!(e.contains("missing.token: No such file"), "{e}");
    assert_eq!(lines.len(), expect.len(), "{e}");
}

#[tokio::test]
async fn the_multi_tenant_example_loads() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["operator", "acme", "globex"] {
        token_file(dir.path(), name, &format!("{name}-token"), 0o600);
    }
    let text = include_str!("../../../../docs/examples/multi-tenant.yaml")
        .replace("/etc/sonde/tokens/", &format!("{}/", dir.path().display()))
        .replace("token_env: GLOBEX_TOKEN", "token_file: globex");
    let reg = load(dir.path(), &text).await.unwrap_or_else(|e| panic!("{e}"));
    let tenants: Vec<&str> = reg.probes().map(|p| &*p.tenant).collect();
    assert_eq!(tenants, ["default", "acme", "acme", "globex"]);
    assert_eq!(
        authenticate("globex-token", reg.tenants.credentials()),
        Some(Principal::Tenant("globex".into()))
    );
}
