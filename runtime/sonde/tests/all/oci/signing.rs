//! Plugin signing as a user meets it: `sonde plugin keygen | sign |
//! verify`, and configs that require signatures (the library's own
//! contract is in sonde-oci's tests, `signing`). Keys and signatures are
//! cosign's formats (tests/all/oci/cosign.rs runs cosign itself beside
//! sonde); sonde's old format still verifies, deprecated.

use crate::support::signed::{Setup, flip_one_byte, sign_with};
use crate::support::sonde;
use sonde_oci::signing;
use sonde_tests::guests;
use std::path::{Path, PathBuf};
use std::process::Output;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn keygen_writes_a_private_key_and_refuses_to_overwrite() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("vendor.key");
    let key_arg = key.to_str().unwrap();
    let out = sonde(&["plugin", "keygen", key_arg]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // cosign's files: an encrypted private key, a PEM public key named after it.
    assert_eq!(signing::public_key_path(&key), dir.path().join("vendor.pub"));
    let private = std::fs::read_to_string(&key).unwrap();
    assert!(
        private.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"),
        "{private}"
    );
    let public = std::fs::read_to_string(dir.path().join("vendor.pub")).unwrap();
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
    assert!(stdout(&out).contains("signer \"vendor\""), "{out:?}");
    let before = std::fs::read(&key).unwrap();

    let out = sonde(&["plugin", "keygen", key_arg]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already exists"),
        "{out:?}"
    );
    assert_eq!(std::fs::read(&key).unwrap(), before, "the key was overwritten");
}

#[test]
fn cli_sign_and_verify_exit_0_valid_2_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("plugin.wasm");
    std::fs::copy(guests::ALWAYS_UP, &wasm).unwrap();
    let wasm_arg = wasm.to_str().unwrap();
    let key = dir.path().join("acme.key");
    let public = signing::public_key_path(&key);
    let (key_arg, public_arg) = (key.to_str().unwrap(), public.to_str().unwrap());
    assert_eq!(sonde(&["plugin", "keygen", key_arg]).status.code(), Some(0));

    let out = sonde(&["plugin", "verify", "--key", public_arg, wasm_arg]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stdout(&out).contains("unsigned"), "{out:?}");

    let out = sonde(&["plugin", "sign", "--key", key_arg, wasm_arg]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(signing::bundle_path(&wasm).exists());

    let out = sonde(&["plugin", "verify", "--key", public_arg, wasm_arg]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).starts_with("valid:") && stdout(&out).contains("\"acme\""),
        "{out:?}"
    );

    let other = dir.path().join("other.key");
    assert_eq!(
        sonde(&["plugin", "keygen", other.to_str().unwrap()]).status.code(),
        Some(0)
    );
    let other_public = signing::public_key_path(&other);
    let out = sonde(&["plugin", "verify", "--key", other_public.to_str().unwrap(), wasm_arg]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stdout(&out).contains("untrusted"), "{out:?}");

    flip_one_byte(&wasm);
    let out = sonde(&["plugin", "verify", "--key", public_arg, wasm_arg]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stdout(&out).contains("tampered"), "{out:?}");

    // A private key given where a public key is expected is a usage error, not a verdict.
    let out = sonde(&["plugin", "verify", "--key", key_arg, wasm_arg]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("this is a private key"),
        "{out:?}"
    );

    // Only components are signed.
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "not wasm").unwrap();
    let out = sonde(&["plugin", "sign", "--key", key_arg, text.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn check_with_trust_runs_only_validly_signed_plugins() {
    let s = Setup::new();
    let wasm = s.wasm.to_str().unwrap();
    let public = signing::public_key_path(&s.key);
    let public = public.to_str().unwrap();

    let out = sonde(&["check", wasm, "--trust", public]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to run") && err.contains("unsigned"), "{err}");

    s.sign();
    let out = sonde(&["check", wasm, "--trust", public]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    flip_one_byte(&s.wasm);
    let out = sonde(&["check", wasm, "--trust", public]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to run") && err.contains("tampered"), "{err}");

    // Built-ins are trusted by being embedded.
    let out = sonde(&["check", "tcp", "--target", "127.0.0.1:1", "--trust", public]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// A config that runs `plugin.wasm` with `require_signed` and `trust` keys.
fn config_requiring_signatures(setup: &Setup, trust: &[&Path]) -> PathBuf {
    let config = setup.dir.path().join("sonde.yaml");
    let keys: Vec<String> = trust.iter().map(|k| format!("{:?}", k.display().to_string())).collect();
    std::fs::write(
        &config,
        format!(
            "require_signed: true\ntrust: [{}]\ntargets:\n  - name: t\n    address: 127.0.0.1:1\n    probes:\n      - {{name: p, plugin: ./plugin.wasm}}\n",
            keys.join(", ")
        ),
    )
    .unwrap();
    config
}

#[test]
fn require_signed_refuses_tampered_unsigned_and_untrusted_plugins_at_load() {
    let setup = Setup::new();
    let public = signing::public_key_path(&setup.key);
    let config = config_requiring_signatures(&setup, &[&public]);
    let validate = || sonde(&["validate", config.to_str().unwrap()]);

    let out = validate();
    assert_eq!(out.status.code(), Some(2), "unsigned");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sonde.yaml:7:") && err.contains("require_signed") && err.contains("unsigned"),
        "{err}"
    );

    setup.sign();
    let out = validate();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    flip_one_byte(&setup.wasm);
    let out = validate();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tampered"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Signed again, but by a key the config does not trust.
    let other = setup.dir.path().join("other.key");
    signing::keygen(&other, "other").unwrap();
    sign_with(&other, &setup.wasm);
    let out = validate();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("untrusted") || err.contains("not trusted"), "{err}");

    // And the same refusal stops `sonde run` before anything runs.
    let out = sonde(&["run", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_probe_missing_a_grant_its_plugin_asks_for_gets_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        "targets:\n  - name: t\n    address: 127.0.0.1:1\n    probes:\n      - {name: age, plugin: file-age, config: {path: /etc/hostname, max_age: 1h}}\n",
    )
    .unwrap();
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: ") && err.contains("\"age\"") && err.contains("files"),
        "{err}"
    );
    std::fs::write(
        &config,
        "targets:\n  - name: t\n    address: 127.0.0.1:1\n    probes:\n      - {name: age, plugin: file-age, config: {path: /etc/hostname, max_age: 1h}, grants: {files: [/etc]}}\n",
    )
    .unwrap();
    let out = sonde(&["validate", config.to_str().unwrap()]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sonde plugin verify` reads the plugin as every other reader does: a
/// FIFO in its place is refused at once (it used to wait for a writer,
/// forever), and a file past the plugin cap is refused without being read.
#[test]
fn verify_refuses_a_fifo_and_an_oversized_file_without_waiting() {
    let s = Setup::new();
    let public = signing::public_key_path(&s.key);
    let fifo = s.dir.path().join("fifo.wasm");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let started = std::time::Instant::now();
    let out = sonde(&[
        "plugin",
        "verify",
        "--key",
        public.to_str().unwrap(),
        fifo.to_str().unwrap(),
    ]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "verify waited on the FIFO"
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a regular file"),
        "{out:?}"
    );

    let big = s.dir.path().join("big.wasm");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(sonde_policy::identity::MAX_PLUGIN_BYTES + 1)
        .unwrap();
    let err = signing::verify_file(&big, &[s.public()]).unwrap_err();
    assert!(err.to_string().contains("larger than 33554432 bytes"), "{err}");
}

/// `ceiling.signers`: a tenant runs only the plugins one of its signers
/// signed (built-ins always), even where the agent requires no signature;
/// a signer no `trust` key has is refused by name; and one tenant's signer
/// never admits another tenant's plugin.
#[test]
fn a_tenants_signers_limit_which_plugins_it_runs() {
    let s = Setup::new();
    let beta = s.dir.path().join("beta.key");
    signing::keygen(&beta, "beta").unwrap();
    s.sign();
    let config = s.dir.path().join("sonde.yaml");
    let write = |tenants: &str| {
        std::fs::write(
            &config,
            format!(
                "trust: [acme.pub, beta.pub]\ntenants:\n{tenants}targets:\n  - name: a\n    tenant: a\n    address: 10.1.0.1:80\n    probes:\n      - {{name: pa, plugin: ./plugin.wasm}}\n      - {{name: builtin, plugin: tcp}}\n  - name: b\n    tenant: b\n    address: 10.1.0.2:80\n    probes:\n      - {{name: pb, plugin: ./plugin.wasm}}\n"
            ),
        )
        .unwrap();
    };
    let tenant = |id: &str, signers: &str| {
        format!("  - id: {id}\n    ceiling: {{net: [\"10.1.0.0/16:*\"], signers: {signers}}}\n")
    };
    let validate = || {
        let out = sonde(&["validate", config.to_str().unwrap()]);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };

    // Signed by acme: tenant a (acme) runs it, tenant b (beta) does not.
    write(&(tenant("a", "[acme]") + &tenant("b", "[beta]")));
    let (code, err) = validate();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("tenant \"b\" runs only plugins signed by beta: ./plugin.wasm is signed by acme"),
        "{err}"
    );
    assert_eq!(
        err.matches("runs only plugins").count(),
        1,
        "only tenant b's probe: {err}"
    );

    // Both signers allowed for b: it runs too.
    write(&(tenant("a", "[acme]") + &tenant("b", "[beta, acme]")));
    let (code, err) = validate();
    assert_eq!(code, Some(0), "{err}");

    // Unsigned now: neither tenant runs it; the built-in still runs.
    std::fs::remove_file(signing::bundle_path(&s.wasm)).unwrap();
    let (code, err) = validate();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("tenant \"a\" runs only plugins signed by acme: ./plugin.wasm is signed by no trusted signer"),
        "{err}"
    );
    assert_eq!(err.matches("runs only plugins").count(), 2, "{err}");

    // A signer that is no trust key's: refused, named.
    write(&(tenant("a", "[acme, gamma]") + &tenant("b", "[beta]")));
    let (code, err) = validate();
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("ceiling.signers: tenant \"a\": \"gamma\" is not a trusted signer (trust: acme, beta)"),
        "{err}"
    );
}
