//! cosign beside sonde, on the same plugins: cosign 2.5 (Debian 13) signs
//! what sonde verifies — an image signature under cosign's `.sig` tag, a
//! sigstore bundle as an OCI 1.1 referrer, a blob bundle and a bare blob
//! signature — and verifies what sonde signs, with ECDSA P-256 keys from
//! either tool and ed25519 keys. No transparency log runs here, so cosign
//! signs with `--tlog-upload=false` and verifies with
//! `--insecure-ignore-tlog` and an empty trusted root (it would fetch
//! sigstore's otherwise).

use crate::support::registry::{Options, info, registry, tcp_component};
use crate::support::{self, sonde};
use sonde_oci::signing;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// cosign with its password and no network: `None` when it is missing
/// (a failure under scripts/test).
fn cosign_bin() -> Option<PathBuf> {
    support::tool("cosign", "cosign (Debian 13)")
}

fn cosign(bin: &Path, dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", "")
        .env("COSIGN_YES", "true")
        .env("SIGSTORE_NO_CACHE", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    eprintln!(
        "cosign {args:?}: {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn flip_one_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

/// The text of `out`.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `host:port/repo@sha256:…` as cosign takes it (no `oci://`).
fn image(reference: &sonde_oci::Reference) -> String {
    reference.to_string().trim_start_matches("oci://").to_string()
}

/// `cosign sign --key KEY IMAGE` with no transparency log: it must pass.
fn cosign_sign(bin: &Path, dir: &Path, key: &str, image: &str) {
    let out = cosign(
        bin,
        dir,
        &[
            "sign",
            "--key",
            key,
            "--tlog-upload=false",
            "--allow-http-registry",
            image,
        ],
    );
    assert!(out.status.success(), "cosign sign: {}", text(&out));
}

/// `sonde plugin verify --key KEY TARGET` against the test registry.
fn sonde_verify(key: &Path, target: &str, cache: &Path) -> Output {
    let cache = cache.display().to_string();
    sonde(&[
        "plugin",
        "verify",
        "--insecure-registry",
        "--oci-cache",
        &cache,
        "--key",
        key.to_str().unwrap(),
        target,
    ])
}

#[tokio::test]
async fn a_cosign_signed_plugin_runs_under_trust_with_cosigns_key() {
    let Some(bin) = cosign_bin() else { return };
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pushed = reg
        .client(&d.join("push-cache"))
        .push(&reg.reference("acme/tcp:1"), tcp_component(), &info())
        .await
        .unwrap();
    assert!(cosign(&bin, d, &["generate-key-pair"]).status.success());
    let other = d.join("other.key");
    signing::keygen(&other, "other").unwrap();
    let target = pushed.reference.to_string();

    // Unsigned yet: refused.
    let out = sonde_verify(&d.join("cosign.pub"), &target, &d.join("c1"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unsigned"), "{}", text(&out));

    cosign_sign(&bin, d, "cosign.key", &image(&pushed.reference));
    let out = sonde_verify(&d.join("cosign.pub"), &target, &d.join("c2"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("signed by \"cosign\""), "{}", text(&out));
    let out = sonde_verify(&d.join("other.pub"), &target, &d.join("c3"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("untrusted: 1 signature(s)"), "{}", text(&out));

    // The agent: require_signed with cosign's key runs it; with another
    // key it refuses it, before anything runs.
    let config = d.join("sonde.yaml");
    let write = |key: &str| {
        std::fs::write(
            &config,
            format!(
                "require_signed: true\ntrust: [{key}]\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\ntargets:\n  - name: t\n    address: 127.0.0.1:1\n    probes:\n      - {{name: p, plugin: \"{target}\"}}\n",
                addr = reg.addr
            ),
        )
        .unwrap()
    };
    write("cosign.pub");
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    write("other.pub");
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("require_signed") && text(&out).contains("untrusted"),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn what_sonde_signs_cosign_verifies_and_both_refuse_a_tampered_file() {
    let Some(bin) = cosign_bin() else { return };
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let wasm = d.join("plugin.wasm");
    std::fs::write(&wasm, tcp_component()).unwrap();
    let out = sonde(&["plugin", "keygen", d.join("vendor.key").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(cosign(&bin, d, &["generate-key-pair"]).status.success());

    // In a registry: `sonde plugin push --key` signs as cosign does.
    let reference = reg.reference("acme/vendor:1").to_string();
    let flags = ["--insecure-registry", "--oci-cache", d.join("cache").to_str().unwrap()].map(str::to_string);
    let mut args = vec!["plugin", "push", wasm.to_str().unwrap(), &reference, "--key"];
    let key = d.join("vendor.key");
    args.push(key.to_str().unwrap());
    args.extend(flags.iter().map(String::as_str));
    let out = sonde(&args);
    assert!(out.status.success(), "{}", text(&out));
    let image = reference.trim_start_matches("oci://");
    let verify = |key: &str| {
        cosign(
            &bin,
            d,
            &[
                "verify",
                "--key",
                key,
                "--insecure-ignore-tlog",
                "--allow-http-registry",
                image,
            ],
        )
    };
    let out = verify("vendor.pub");
    assert!(out.status.success(), "cosign refused what sonde signed: {}", text(&out));
    assert!(text(&out).contains("docker-manifest-digest"), "{}", text(&out));
    assert!(
        !verify("cosign.pub").status.success(),
        "cosign took another key's signature"
    );

    // Signed by both: each verifies its own, sonde sees both. sonde
    // signs with cosign's own (encrypted) key here, by reference.
    let out = sonde(&[
        "plugin",
        "sign",
        "--insecure-registry",
        "--key",
        d.join("cosign.key").to_str().unwrap(),
        &reference,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        verify("vendor.pub").status.success(),
        "cosign's signature replaced sonde's"
    );
    let out = sonde(&[
        "plugin",
        "verify",
        "--insecure-registry",
        "--key",
        d.join("vendor.pub").to_str().unwrap(),
        "--key",
        d.join("cosign.pub").to_str().unwrap(),
        &reference,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("signed by \"vendor\"") && text(&out).contains("signed by \"cosign\""),
        "{}",
        text(&out)
    );

    // On disk: `sonde plugin sign` writes the bundle `cosign verify-blob` reads.
    let out = sonde(&["plugin", "sign", "--key", key.to_str().unwrap(), wasm.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(
        d.join("root.json"),
        r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}"#,
    )
    .unwrap();
    let verify_blob = |key: &str| {
        cosign(
            &bin,
            d,
            &[
                "verify-blob",
                "--key",
                key,
                "--bundle",
                "plugin.wasm.sigstore.json",
                "--new-bundle-format",
                "--trusted-root",
                "root.json",
                "--insecure-ignore-tlog",
                "plugin.wasm",
            ],
        )
    };
    assert!(
        verify_blob("vendor.pub").status.success(),
        "cosign refused sonde's bundle"
    );
    assert!(!verify_blob("cosign.pub").status.success());
    flip_one_byte(&wasm);
    assert!(
        !verify_blob("vendor.pub").status.success(),
        "cosign took a tampered file"
    );
    let out = sonde(&[
        "plugin",
        "verify",
        "--key",
        d.join("vendor.pub").to_str().unwrap(),
        wasm.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("tampered"), "{}", text(&out));
}

#[tokio::test]
async fn cosigns_bundles_blob_signatures_and_ed25519_keys_verify() {
    let Some(bin) = cosign_bin() else { return };
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(cosign(&bin, d, &["generate-key-pair"]).status.success());
    let other = d.join("other.key");
    signing::keygen(&other, "other").unwrap();
    let pushed = reg
        .client(&d.join("push-cache"))
        .push(&reg.reference("acme/attested:1"), tcp_component(), &info())
        .await
        .unwrap();

    // A sigstore bundle (a DSSE statement naming the manifest) as an OCI
    // 1.1 referrer; docker-registry has no referrers API, so cosign files
    // it under the referrers tag sonde reads in that case.
    std::fs::write(d.join("predicate.json"), "{}").unwrap();
    let attested = cosign(
        &bin,
        d,
        &[
            "attest",
            "--key",
            "cosign.key",
            "--tlog-upload=false",
            "--allow-http-registry",
            "--new-bundle-format",
            "--predicate",
            "predicate.json",
            "--type",
            "custom",
            &image(&pushed.reference),
        ],
    );
    assert!(attested.status.success());
    let target = pushed.reference.to_string();
    let out = sonde_verify(&d.join("cosign.pub"), &target, &d.join("c1"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("signed by \"cosign\""), "{}", text(&out));
    let out = sonde_verify(&d.join("other.pub"), &target, &d.join("c2"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // Files: `cosign sign-blob --bundle FILE.wasm.sigstore.json`, and a
    // bare signature as FILE.wasm.sig.
    let wasm = d.join("plugin.wasm");
    std::fs::write(&wasm, tcp_component()).unwrap();
    let verify_file = |key: &str| {
        sonde(&[
            "plugin",
            "verify",
            "--key",
            d.join(key).to_str().unwrap(),
            wasm.to_str().unwrap(),
        ])
    };
    let blob = |extra: &[&str]| {
        let mut args = vec!["sign-blob", "--key", "cosign.key", "--tlog-upload=false"];
        args.extend_from_slice(extra);
        args.push("plugin.wasm");
        assert!(cosign(&bin, d, &args).status.success());
    };
    blob(&["--new-bundle-format", "--bundle", "plugin.wasm.sigstore.json"]);
    let out = verify_file("cosign.pub");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(verify_file("other.pub").status.code(), Some(2));
    std::fs::remove_file(signing::bundle_path(&wasm)).unwrap();
    blob(&["--output-signature", "plugin.wasm.sig"]);
    let out = verify_file("cosign.pub");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::remove_file(signing::signature_path(&wasm)).unwrap();
    blob(&["--bundle", "plugin.wasm.sigstore.json"]);
    let out = verify_file("cosign.pub");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // ed25519: a PKCS#8 key imported into cosign signs the image; sonde
    // verifies with its PEM public key, and signs with the same key.
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    std::fs::write(d.join("ed.pem"), ed.serialize_pem()).unwrap();
    assert!(
        cosign(&bin, d, &["import-key-pair", "--key", "ed.pem", "-o", "ed"])
            .status
            .success()
    );
    cosign_sign(&bin, d, "ed.key", &image(&pushed.reference));
    let out = sonde_verify(&d.join("ed.pub"), &target, &d.join("c3"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("signed by \"ed\""), "{}", text(&out));
    std::fs::copy(d.join("ed.pem"), d.join("ed-sonde.key")).unwrap();
    std::fs::remove_file(signing::bundle_path(&wasm)).unwrap();
    let out = sonde(&[
        "plugin",
        "sign",
        "--key",
        d.join("ed-sonde.key").to_str().unwrap(),
        wasm.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = verify_file("ed.pub");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
