//! Plugins pulled from a real registry (sonde-oci's `support/registry.rs`,
//! included here) and run by the engine: by tag and by digest, and from
//! the cache with the registry stopped.

use crate::support;
use crate::support::registry::{Options, info, registry, tcp_component};
use sonde_oci::{self as oci, OciError, Source};
use sonde_policy::identity::Digest;
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::Status;
use std::time::Duration;

/// Loads `bytes` and probes a live TCP listener with it.
async fn run_tcp_probe(label: &str, bytes: &[u8]) -> Status {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let accept = tokio::spawn(async move {
        let _ = listener.accept().await;
    });
    let plugin = support::engine().load(label, bytes).await.unwrap();
    let result = support::run(&plugin, &target, "{}", &Grants::default(), Duration::from_secs(5)).await;
    accept.abort();
    result.status
}

#[tokio::test]
async fn push_then_pull_and_run_by_tag_and_by_digest() {
    let reg = registry!(Options::default());
    let cache = tempfile::tempdir().unwrap();
    let client = reg.client(cache.path());
    let tagged = reg.reference("acme/tcp-check:1.0");
    let pushed = client.push(&tagged, tcp_component(), &info()).await.unwrap();
    assert_eq!(pushed.wasm_digest, Digest::of(tcp_component()).to_string());

    let by_tag = client.resolve(&tagged).await.unwrap();
    assert_eq!(by_tag.digest, pushed.digest);
    assert_eq!(by_tag.source, Source::Registry);
    assert_eq!(&*by_tag.bytes, tcp_component());
    assert!(by_tag.signature.is_none());
    assert_eq!(by_tag.pinned(), tagged.with_digest(&pushed.digest));

    let pinned = reg.reference(&format!("acme/tcp-check@{}", pushed.digest));
    let by_digest = client.resolve(&pinned).await.unwrap();
    assert_eq!(by_digest.digest, pushed.digest);
    assert_eq!(
        by_digest.source,
        Source::Cache,
        "a pinned, cached reference needs no pull"
    );
    assert_eq!(by_digest.transferred, 0);
    assert!(by_tag.transferred > tcp_component().len() as u64);
    assert_eq!(
        run_tcp_probe(&by_digest.pinned().to_string(), &by_digest.bytes).await,
        Status::Success
    );

    // A fresh cache pulls by digest too, and the layout is the CNCF one.
    let fresh = tempfile::tempdir().unwrap();
    let again = reg.client(fresh.path()).resolve(&pinned).await.unwrap();
    assert_eq!(again.source, Source::Registry);
    let manifest: serde_json::Value =
        serde_json::from_slice(&reg.client(fresh.path()).cache().get(&pushed.digest).unwrap().unwrap()).unwrap();
    assert_eq!(manifest["config"]["mediaType"], oci::WASM_CONFIG_MEDIA_TYPE);
    assert_eq!(manifest["layers"][0]["mediaType"], oci::WASM_LAYER_MEDIA_TYPE);
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);
    let config = std::fs::read(reg.blob_data(manifest["config"]["digest"].as_str().unwrap())).unwrap();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["os"], "wasip2");
    assert_eq!(config["layerDigests"][0], pushed.wasm_digest.as_str());
}

#[tokio::test]
async fn with_the_registry_stopped_what_was_pulled_resolves_from_cache() {
    let mut reg = registry!(Options::default());
    let cache = tempfile::tempdir().unwrap();
    let tag = reg.reference("acme/tcp-check:1.0");
    let pushed = reg
        .client(cache.path())
        .push(&tag, tcp_component(), &info())
        .await
        .unwrap();
    reg.client(cache.path()).resolve(&tag).await.unwrap();
    reg.stop();

    // An agent restarted: a new client over the same cache.
    let client = reg.client(cache.path());
    let by_tag = client.resolve(&tag).await.unwrap();
    assert_eq!(by_tag.digest, pushed.digest);
    assert!(
        matches!(
            &by_tag.source,
            Source::CacheRegistryDown {
                tag_resolved_at: Some(_),
                ..
            }
        ),
        "{:?}",
        by_tag.source
    );
    let by_digest = client.resolve(&pushed.reference).await.unwrap();
    assert_eq!(&*by_digest.bytes, tcp_component());
    assert_eq!(run_tcp_probe("cached", &by_digest.bytes).await, Status::Success);

    // Never pulled: a clear error naming the reference and the registry.
    let other = reg.reference("acme/never-pulled:1.0");
    let e = client.resolve(&other).await.unwrap_err();
    assert!(matches!(e, OciError::NotCached { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&other.to_string()) && text.contains("not in the local cache"),
        "{text}"
    );
    assert!(text.contains(&reg.addr) && text.contains("unreachable"), "{text}");
}
