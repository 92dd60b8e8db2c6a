//! The registry client against a real registry (`support::registry`):
//! digests, tags, signatures that travel with the artifact, the cache
//! when the registry is down, size limits, basic auth and TLS.

use crate::support::registry::{Options, Tls, info, registry, tcp_component};
use sonde_oci::signing::{SecretKey, SignatureError};
use sonde_oci::{self as oci, Client, ClientSettings, OciError, RegistryAccess, SignatureLocation};
use sonde_policy::identity::Digest;
use std::time::SystemTime;

#[tokio::test]
async fn a_blob_tampered_in_the_registry_is_refused_with_a_digest_mismatch() {
    let reg = registry!(Options::default());
    let cache = tempfile::tempdir().unwrap();
    let client = reg.client(cache.path());
    let pushed = client
        .push(&reg.reference("acme/tcp-check:1.0"), tcp_component(), &info())
        .await
        .unwrap();
    let data = reg.blob_data(&pushed.wasm_digest);
    let mut bytes = std::fs::read(&data).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    std::fs::write(&data, bytes).unwrap();

    let e = client.resolve(&pushed.reference).await.unwrap_err();
    assert!(matches!(e, OciError::DigestMismatch { .. }), "{e}");
    assert!(e.to_string().contains("digest mismatch"), "{e}");
    assert!(e.to_string().contains(&pushed.digest), "names the reference: {e}");
    assert_eq!(
        client.cache().get(&pushed.wasm_digest).unwrap(),
        None,
        "nothing tampered is cached"
    );
}

#[tokio::test]
async fn a_moved_tag_does_not_change_a_digest_pinned_resolve() {
    let reg = registry!(Options::default());
    let cache = tempfile::tempdir().unwrap();
    let client = reg.client(cache.path());
    let tag = reg.reference("acme/check:stable");
    let first = client.push(&tag, tcp_component(), &info()).await.unwrap();
    let http = sonde_builtins::get("http").unwrap();
    let second = client.push(&tag, http, &info()).await.unwrap();
    assert_ne!(first.digest, second.digest);

    let pinned = client.resolve(&first.reference).await.unwrap();
    assert_eq!(pinned.digest, first.digest);
    assert_eq!(&*pinned.bytes, tcp_component());
    let by_tag = client.resolve(&tag).await.unwrap();
    assert_eq!(by_tag.digest, second.digest);
    assert_eq!(&*by_tag.bytes, http);
    // Still, from a fresh cache.
    let fresh = tempfile::tempdir().unwrap();
    let pinned = reg.client(fresh.path()).resolve(&first.reference).await.unwrap();
    assert_eq!(&*pinned.bytes, tcp_component());
}

#[tokio::test]
async fn signatures_in_sondes_old_format_travel_with_the_artifact() {
    let mut reg = registry!(Options::default());
    let cache = tempfile::tempdir().unwrap();
    let client = reg.client(cache.path());
    let acme = SecretKey::generate("acme").unwrap();
    let mallory = SecretKey::generate("mallory").unwrap();
    let trusted = [acme.public()];

    // Missing.
    let unsigned = client
        .push(&reg.reference("acme/unsigned:1"), tcp_component(), &info())
        .await
        .unwrap();
    let r = client.resolve(&unsigned.reference).await.unwrap();
    let e = r.verify(&trusted).unwrap_err();
    assert!(matches!(e, SignatureError::Unsigned { .. }), "{e}");
    assert!(e.to_string().contains(&unsigned.digest), "{e}");

    // Present and trusted: docker-registry 2.8 has no referrers API, so the
    // signature goes under sonde's own tag, never cosign's `sha256-HEX.sig`
    // (each would overwrite the other).
    let signed = client
        .push(&reg.reference("acme/signed:1"), tcp_component(), &info())
        .await
        .unwrap();
    let sig = acme.sign(tcp_component(), SystemTime::now()).to_text();
    let attached = client
        .push_signature(&reg.reference("acme/signed:1"), &signed.wasm_digest, sig.as_bytes())
        .await
        .unwrap();
    let tag = format!("sha256-{}.sonde-sig", signed.digest.trim_start_matches("sha256:"));
    assert_eq!(oci::signature_tag(&signed.digest), tag);
    assert_eq!(attached.location, SignatureLocation::Tag { tag });
    let fresh = tempfile::tempdir().unwrap();
    let fresh_path = fresh.path().to_path_buf();
    let r = reg.client(fresh.path()).resolve(&signed.reference).await.unwrap();
    assert!(matches!(r.signature, Some((_, SignatureLocation::Tag { .. }))));
    let signers = r.verify(&trusted).unwrap();
    assert_eq!(signers[0].name, "acme");
    // Pinned and pulled before: from the cache, the signature comes along.
    let r = reg.client(fresh.path()).resolve(&signed.reference).await.unwrap();
    assert_eq!(r.signature.as_ref().map(|s| &s.1), Some(&SignatureLocation::Cache));
    r.verify(&trusted).unwrap();

    // Signed by a key that is not trusted.
    let other = client
        .push(&reg.reference("acme/mallory:1"), tcp_component(), &info())
        .await
        .unwrap();
    let sig = mallory.sign(tcp_component(), SystemTime::now()).to_text();
    client
        .push_signature(&other.reference, &other.wasm_digest, sig.as_bytes())
        .await
        .unwrap();
    let r = client.resolve(&other.reference).await.unwrap();
    let e = r.verify(&trusted).unwrap_err();
    assert!(matches!(e, SignatureError::Untrusted { .. }), "{e}");

    // A signature of other bytes is refused before it is attached.
    let http = sonde_builtins::get("http").unwrap();
    let wrong = acme.sign(http, SystemTime::now()).to_text();
    let e = client
        .push_signature(&unsigned.reference, &Digest::of(http).to_string(), wrong.as_bytes())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::DigestMismatch { .. }), "{e}");

    // The registry down: the signature comes from the cache.
    reg.stop();
    let r = reg.client(&fresh_path).resolve(&signed.reference).await.unwrap();
    assert_eq!(r.signature.as_ref().map(|s| &s.1), Some(&SignatureLocation::Cache));
    r.verify(&trusted).unwrap();
}

#[tokio::test]
async fn a_component_over_the_limit_is_refused() {
    let reg = registry!(Options::default());
    let cache = tempfile::tempdir().unwrap();
    let pushed = reg
        .client(cache.path())
        .push(&reg.reference("acme/big:1"), tcp_component(), &info())
        .await
        .unwrap();
    let mut settings = ClientSettings::new(cache.path().to_path_buf());
    settings.max_bytes = 1000;
    settings.registries.insert(reg.addr.clone(), reg.registry_settings());
    let e = Client::new(settings)
        .unwrap()
        .resolve(&pushed.reference)
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::TooLarge { limit: 1000, .. }), "{e}");
}

#[tokio::test]
async fn basic_auth_works_and_a_wrong_password_is_named_but_not_echoed() {
    let reg = registry!(Options {
        htpasswd: true,
        ..Options::default()
    });
    let cache = tempfile::tempdir().unwrap();
    let tag = reg.reference("acme/tcp-check:1.0");
    let pushed = reg
        .client(cache.path())
        .push(&tag, tcp_component(), &info())
        .await
        .unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let r = reg.client(fresh.path()).resolve(&tag).await.unwrap();
    assert_eq!(r.digest, pushed.digest);

    let wrong = "wrong-password-42";
    let file = reg.dir.path().join("wrong");
    std::fs::write(&file, wrong).unwrap();
    let settings = RegistryAccess {
        password_file: Some(file),
        ..reg.registry_settings()
    };
    let fresh = tempfile::tempdir().unwrap();
    let e = reg.client_with(fresh.path(), settings).resolve(&tag).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, OciError::Auth { .. }), "{text}");
    assert!(text.contains(&reg.addr) && text.contains("acme"), "{text}");
    assert!(!text.contains(wrong) && !format!("{e:?}").contains(wrong), "{text}");

    let anonymous = RegistryAccess {
        insecure: true,
        ..RegistryAccess::default()
    };
    let e = reg
        .client_with(fresh.path(), anonymous)
        .resolve(&tag)
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::Auth { .. }), "{e}");
    assert!(e.to_string().contains("none are configured"), "{e}");
}

#[tokio::test]
async fn tls_with_a_test_ca() {
    let reg = registry!(Options {
        tls: Some(Tls::new()),
        ..Options::default()
    });
    let cache = tempfile::tempdir().unwrap();
    let tag = reg.reference("acme/tcp-check:1.0");
    let pushed = reg
        .client(cache.path())
        .push(&tag, tcp_component(), &info())
        .await
        .unwrap();
    let fresh = tempfile::tempdir().unwrap();
    assert_eq!(
        reg.client(fresh.path()).resolve(&tag).await.unwrap().digest,
        pushed.digest
    );

    // Without the CA, the system roots do not vouch for it.
    let fresh = tempfile::tempdir().unwrap();
    let e = reg
        .client_with(fresh.path(), RegistryAccess::default())
        .resolve(&tag)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&reg.addr), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
}
