//! Plugin signing: the library the config loader calls (`sonde plugin
//! keygen | sign | verify` as a user runs them is in the sonde crate's
//! tests, `oci::signing`). Keys and signatures are cosign's formats
//! (runtime/sonde/tests/all/oci/cosign.rs runs cosign itself beside
//! sonde); sonde's old format still verifies, deprecated.

use crate::support::signed::{Setup, flip_one_byte};
use sonde_oci::signing::{self, PublicKey, SecretKey, SignatureError, SigningKey};
use sonde_policy::identity::Digest;
use std::time::SystemTime;

#[test]
fn a_signed_plugin_verifies_and_names_its_signer() {
    let s = Setup::new();
    s.sign();
    let signers = signing::verify_file(&s.wasm, &[s.public()]).unwrap();
    let signer = &signers[0];
    assert_eq!(signer.name, "acme");
    assert_eq!(signer.key_id, s.public().key_id());
    let wasm = std::fs::read(&s.wasm).unwrap();
    assert_eq!(signer.digest, format!("sha256:{}", Digest::of(&wasm).hex()));
}

#[test]
fn flipping_one_byte_of_the_component_is_tampered() {
    let s = Setup::new();
    s.sign();
    flip_one_byte(&s.wasm);
    let err = signing::verify_file(&s.wasm, &[s.public()]).unwrap_err();
    assert!(matches!(err, SignatureError::DigestMismatch { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("tampered"), "{text}");
    assert!(text.contains(&s.wasm.display().to_string()), "{text}");
}

#[test]
fn an_altered_signature_verifies_by_no_key() {
    let s = Setup::new();
    s.sign();
    let path = signing::bundle_path(&s.wasm);
    let mut bundle: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let sig = bundle["messageSignature"]["signature"].as_str().unwrap().to_string();
    let altered = format!("{}{}", &sig[..8], if &sig[8..9] == "A" { "B" } else { "A" }) + &sig[9..];
    bundle["messageSignature"]["signature"] = altered.into();
    std::fs::write(&path, bundle.to_string()).unwrap();
    let err = signing::verify_file(&s.wasm, &[s.public()]).unwrap_err();
    assert!(
        matches!(err, SignatureError::NoTrustedSignature { found: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("untrusted"), "{err}");
}

#[test]
fn a_signature_in_sondes_old_format_still_verifies() {
    let s = Setup::new();
    let legacy = s.dir.path().join("old.key");
    let public = signing::legacy_keygen(&legacy, "acme-2025").unwrap();
    let sig = SecretKey::read(&legacy)
        .unwrap()
        .sign(&std::fs::read(&s.wasm).unwrap(), SystemTime::now());
    std::fs::write(signing::signature_path(&s.wasm), sig.to_text()).unwrap();
    let trusted = [PublicKey::read(&signing::public_key_path(&legacy)).unwrap()];
    assert_eq!(trusted[0], public);
    let signers = signing::verify_file(&s.wasm, &trusted).unwrap();
    assert_eq!(signers[0].name, "acme-2025");
    // A PEM key does not vouch for it, and the old key no longer signs.
    let err = signing::verify_file(&s.wasm, &[s.public()]).unwrap_err();
    assert!(matches!(err, SignatureError::Untrusted { .. }), "{err}");
    let err = SigningKey::read(&legacy).unwrap_err();
    assert!(err.to_string().contains("no longer sign"), "{err}");
}

#[test]
fn a_key_not_trusted_is_untrusted() {
    let s = Setup::new();
    s.sign();
    let other = s.dir.path().join("other.key");
    signing::keygen(&other, "other").unwrap();
    let other = PublicKey::read(&signing::public_key_path(&other)).unwrap();
    let err = signing::verify_file(&s.wasm, &[other]).unwrap_err();
    assert!(matches!(err, SignatureError::NoTrustedSignature { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("untrusted") && text.contains("none by the 1 trusted key"),
        "{text}"
    );
    // No trusted keys at all: untrusted too.
    let err = signing::verify_file(&s.wasm, &[]).unwrap_err();
    assert!(matches!(err, SignatureError::NoTrustedSignature { .. }), "{err}");
}

#[test]
fn a_missing_signature_file_is_unsigned() {
    let s = Setup::new();
    let err = signing::verify_file(&s.wasm, &[s.public()]).unwrap_err();
    assert!(matches!(err, SignatureError::Unsigned { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("unsigned") && text.contains("plugin.wasm.sigstore.json"),
        "{text}"
    );
}

#[test]
fn the_verify_bytes_api_matches_the_file_api() {
    let s = Setup::new();
    s.sign();
    let wasm = std::fs::read(&s.wasm).unwrap();
    let sig = std::fs::read(signing::bundle_path(&s.wasm)).unwrap();
    let signer = signing::verify("plugin.wasm", &wasm, "plugin.wasm.sig", Some(&sig), &[s.public()]).unwrap();
    assert_eq!(signer.name, "acme");
    let err = signing::verify("plugin.wasm", &wasm, "plugin.wasm.sig", None, &[s.public()]).unwrap_err();
    assert!(matches!(err, SignatureError::Unsigned { .. }));
}
