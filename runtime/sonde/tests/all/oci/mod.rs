//! Plugins from OCI registries, against a real registry: Debian's
//! `docker-registry` (the CNCF distribution server), started on loopback per
//! test with its own storage, and with htpasswd auth or TLS where a test
//! needs them. Never a mock.

pub(crate) mod hostile;
mod signing;

use crate::support::{self, sonde};
use sonde_oci::signing::{SecretKey, SignatureError};
use sonde_oci::{self as oci, Client, ClientSettings, OciError, Reference, RegistryAccess, SignatureLocation, Source};
use sonde_policy::identity::Digest;
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::Status;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const PASSWORD: &str = "correct-horse-battery";

/// TLS material for a registry: a test CA and a server certificate for
/// 127.0.0.1 it signed.
struct Tls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Tls {
    fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "sonde oci test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

#[derive(Default)]
pub(crate) struct Options {
    /// Require basic auth for user `acme` with [`PASSWORD`].
    htpasswd: bool,
    tls: Option<Tls>,
}

/// A running `docker-registry` on a free loopback port.
pub(crate) struct Registry {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub(crate) addr: String,
    ca_file: Option<PathBuf>,
    htpasswd: bool,
}

impl Registry {
    /// Starts a registry, or prints why the test is skipped and returns None
    /// when the binary is not installed.
    pub(crate) fn start(options: Options) -> Option<Self> {
        if !Path::new(REGISTRY_BIN).exists() {
            eprintln!("SKIPPED: {REGISTRY_BIN} is not installed (apt-get install docker-registry)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().join("storage").display()
        );
        let mut ca_file = None;
        if let Some(tls) = &options.tls {
            let cert = dir.path().join("server.pem");
            let key = dir.path().join("server.key");
            let ca = dir.path().join("ca.pem");
            std::fs::write(&cert, &tls.cert_pem).unwrap();
            std::fs::write(&key, &tls.key_pem).unwrap();
            std::fs::write(&ca, &tls.ca_pem).unwrap();
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ));
            ca_file = Some(ca);
        }
        if options.htpasswd {
            let hash = bcrypt::hash_with_result(PASSWORD, 4)
                .unwrap()
                .format_for_version(bcrypt::Version::TwoY);
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("acme:{hash}\n")).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: sonde-test\n    path: {}\n",
                file.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let mut registry = Self {
            child: Some(child),
            dir,
            addr,
            ca_file,
            htpasswd: options.htpasswd,
        };
        registry.wait_listening();
        Some(registry)
    }

    /// Waits until the registry accepts connections (it listens once ready).
    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&self.addr).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
                panic!("docker-registry exited ({status}): {log}");
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn reference(&self, path: &str) -> Reference {
        Reference::parse(&format!("oci://{}/{path}", self.addr)).unwrap()
    }

    fn registry_settings(&self) -> RegistryAccess {
        let password_file = self.htpasswd.then(|| {
            let p = self.dir.path().join("password");
            std::fs::write(&p, format!("{PASSWORD}\n")).unwrap();
            p
        });
        RegistryAccess {
            username: self.htpasswd.then(|| "acme".to_string()),
            password_file,
            ca_file: self.ca_file.clone(),
            insecure: self.ca_file.is_none(),
        }
    }

    /// A client for this registry with its own cache in `cache`.
    fn client_with(&self, cache: &Path, registry: RegistryAccess) -> Client {
        let mut settings = ClientSettings::new(cache.to_path_buf());
        settings.timeout = Duration::from_secs(20);
        settings.registries.insert(self.addr.clone(), registry);
        Client::new(settings).unwrap()
    }

    pub(crate) fn client(&self, cache: &Path) -> Client {
        self.client_with(cache, self.registry_settings())
    }

    /// Where the registry keeps the blob `digest`.
    fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The CLI flags that reach this registry.
    fn cli_flags(&self, cache: &Path) -> Vec<String> {
        let mut flags = vec!["--oci-cache".to_string(), cache.display().to_string()];
        match &self.ca_file {
            Some(ca) => flags.extend(["--registry-ca".to_string(), ca.display().to_string()]),
            None => flags.push("--insecure-registry".to_string()),
        }
        flags
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

macro_rules! registry {
    ($options:expr) => {
        match Registry::start($options) {
            Some(r) => r,
            None => return,
        }
    };
}

mod cosign;

fn tcp_component() -> &'static [u8] {
    sonde_builtins::get("tcp").unwrap()
}

pub(crate) fn info() -> oci::ComponentInfo {
    oci::ComponentInfo {
        exports: vec!["describe".into(), "check".into()],
        imports: vec![],
        target: Some("sonde:probe/plugin@0.1.0".into()),
    }
}

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

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn run_cli(args: &[&str], flags: &[String]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(flags.iter().map(String::as_str));
    sonde(&all)
}

#[test]
fn the_cli_signs_pushes_pulls_checks_and_inspects() {
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let flags = reg.cli_flags(&dir.path().join("oci-cache"));
    let wasm = dir.path().join("tcp.wasm");
    std::fs::write(&wasm, tcp_component()).unwrap();
    let key = dir.path().join("acme.key");
    let out = sonde(&["plugin", "keygen", key.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let public = dir.path().join("acme.pub").display().to_string();
    let reference = format!("oci://{}/acme/tcp-check:1.0", reg.addr);

    let out = run_cli(&["plugin", "push", wasm.to_str().unwrap(), &reference], &flags);
    assert!(out.status.success(), "{}", stderr(&out));
    let pushed = stdout(&out);
    let digest = pushed
        .split('@')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(Digest::parse(&digest).is_ok(), "{pushed}");

    // Unsigned: a check that requires a trusted signature refuses it.
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let target_addr = target.local_addr().unwrap().to_string();
    let out = run_cli(
        &["check", &reference, "--target", &target_addr, "--trust", &public],
        &flags,
    );
    assert_eq!(out.status.code(), Some(3), "{}", stdout(&out));
    assert!(stderr(&out).contains("unsigned"), "{}", stderr(&out));

    let out = run_cli(
        &[
            "plugin",
            "sign",
            "--key",
            key.to_str().unwrap(),
            wasm.to_str().unwrap(),
            "--push",
            &reference,
        ],
        &flags,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(".sig"), "cosign's tag: {}", stdout(&out));

    let pinned = format!("oci://{}/acme/tcp-check@{digest}", reg.addr);
    let out = run_cli(
        &["check", &pinned, "--target", &target_addr, "--trust", &public],
        &flags,
    );
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));

    let pulled = dir.path().join("pulled.wasm");
    let out = run_cli(
        &[
            "plugin",
            "pull",
            &reference,
            "-o",
            pulled.to_str().unwrap(),
            "--trust",
            &public,
        ],
        &flags,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&pulled).unwrap(), tcp_component());
    let out = sonde(&["plugin", "verify", "--key", &public, pulled.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "the pulled signature verifies as a file: {}",
        stdout(&out)
    );

    let out = run_cli(&["plugin", "inspect", &pinned, "-o", "json"], &flags);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = support::json(&out);
    assert_eq!(v["plugin"], pinned.as_str());
    assert_eq!(v["digest"], Digest::of(tcp_component()).to_string().as_str());
    drop(target);
}

#[test]
fn the_cli_refuses_a_pull_whose_signature_is_untrusted() {
    let reg = registry!(Options::default());
    let dir = tempfile::tempdir().unwrap();
    let flags = reg.cli_flags(&dir.path().join("oci-cache"));
    let wasm = dir.path().join("tcp.wasm");
    std::fs::write(&wasm, tcp_component()).unwrap();
    let mallory = dir.path().join("mallory.key");
    let acme = dir.path().join("acme.key");
    for k in [&mallory, &acme] {
        assert!(sonde(&["plugin", "keygen", k.to_str().unwrap()]).status.success());
    }
    let out = sonde(&[
        "plugin",
        "sign",
        "--key",
        mallory.to_str().unwrap(),
        wasm.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = format!("oci://{}/acme/tcp-check:1.0", reg.addr);
    // push --key signs the artifact in the registry.
    let out = run_cli(
        &[
            "plugin",
            "push",
            wasm.to_str().unwrap(),
            &reference,
            "--key",
            mallory.to_str().unwrap(),
        ],
        &flags,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("attached"), "{}", stdout(&out));

    let pulled = dir.path().join("pulled.wasm");
    let public = dir.path().join("acme.pub").display().to_string();
    let out = run_cli(
        &[
            "plugin",
            "pull",
            &reference,
            "-o",
            pulled.to_str().unwrap(),
            "--trust",
            &public,
        ],
        &flags,
    );
    assert_eq!(out.status.code(), Some(2), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("untrusted"), "{}", stdout(&out));
    assert!(!pulled.exists(), "nothing written");
}

#[test]
fn a_registry_reference_is_checked_before_anything_is_asked() {
    let out = sonde(&["check", "oci://registry.example.com/acme/pg-check"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stderr(&out).contains("sonde does not assume :latest"),
        "{}",
        stderr(&out)
    );
}

/// An agent whose config names its plugins by `oci://` reference (one
/// pinned to a digest, one by tag) with its cache in `state_dir/oci`.
fn oci_agent_config(dir: &Path, reg: &Registry, target: &str, plugins: &[(&str, &str)]) -> PathBuf {
    let mut yaml = format!(
        "state_dir: {state}\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\n  timeout: 5s\ntargets:\n  - name: svc\n    address: {target}\n    probes:\n",
        state = dir.join("state").display(),
        addr = reg.addr,
    );
    for (name, plugin) in plugins {
        yaml.push_str(&format!(
            "      - {{ name: {name}, plugin: \"{plugin}\", period: 200ms }}\n"
        ));
    }
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `GET path` on the agent's API: the body.
async fn api_get(api: std::net::SocketAddr, path: &str) -> String {
    support::call(api, "GET", path, None, b"").await.1
}

/// Waits until every probe in `names` has succeeded once, and returns
/// `/v1/probes`.
async fn wait_all_succeed(api: std::net::SocketAddr, names: &[&str]) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let probes: serde_json::Value = serde_json::from_str(&api_get(api, "/v1/probes").await).unwrap();
        let ok = |n: &str| {
            probes
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == n && p["last"]["status"] == "success")
        };
        if names.iter().all(|n| ok(n)) {
            return probes;
        }
        assert!(
            Instant::now() < deadline,
            "not every probe of {names:?} succeeded: {probes:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The acceptance: `sonde run` with plugins that are all `oci://`
/// references runs them, shows the digest that runs, and after a restart
/// with the registry stopped runs them from its cache; a reference it never
/// pulled leaves only its own probe out.
#[tokio::test]
async fn an_agent_runs_oci_plugins_and_restarts_from_its_cache_with_the_registry_down() {
    let mut reg = registry!(Options::default());
    let pusher_cache = tempfile::tempdir().unwrap();
    let tag = reg.reference("acme/tcp-check:1.0");
    let pushed = reg
        .client(pusher_cache.path())
        .push(&tag, tcp_component(), &info())
        .await
        .unwrap();
    let pinned = pushed.reference.to_string();
    assert!(pinned.contains("@sha256:"), "{pinned}");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let accepting = tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let by_tag = tag.to_string();
    let config = oci_agent_config(dir.path(), &reg, &target, &[("pinned", &pinned), ("tagged", &by_tag)]);
    let (agent, api) = support::start_agent(&config).await;
    let probes = wait_all_succeed(api, &["pinned", "tagged"]).await;
    // Both show the digest that runs, the tag resolved at load.
    for p in probes.as_array().unwrap() {
        assert_eq!(p["plugin"], pinned.as_str(), "{p:#}");
    }
    let metrics = api_get(api, "/metrics").await;
    assert!(
        metrics.contains(&format!("plugin=\"{pinned}\"")),
        "the metrics do not label runs with the pinned reference:\n{metrics}"
    );
    // The pulls counted against the tenant that named the plugins: at
    // least the component's bytes.
    let pulled = agent.executor().tenant_stats("default").unwrap().pull_bytes;
    assert!(pulled >= tcp_component().len() as u64, "{pulled} bytes charged");
    assert!(
        metrics.contains("sonde_tenant_oci_pull_bytes_total{tenant=\"default\"}"),
        "{metrics}"
    );
    agent.stop().await;

    // The registry goes away; the agent restarts with one more probe whose
    // plugin it never pulled.
    reg.stop();
    let never = reg.reference("acme/never-pulled:2.0").to_string();
    let config = oci_agent_config(
        dir.path(),
        &reg,
        &target,
        &[("pinned", &pinned), ("tagged", &by_tag), ("never", &never)],
    );
    let (agent, api) = support::start_agent(&config).await;
    let probes = wait_all_succeed(api, &["pinned", "tagged"]).await;
    // From the cache: nothing came from a registry.
    assert_eq!(agent.executor().tenant_stats("default").unwrap().pull_bytes, 0);
    assert!(
        !probes.as_array().unwrap().iter().any(|p| p["name"] == "never"),
        "{probes:#}"
    );
    // Its pull fails in the background (the registry is gone): the probe is
    // left out once it has, with the reason.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status: serde_json::Value = serde_json::from_str(&api_get(api, "/v1/status").await).unwrap();
        if status["left_out"].as_array().is_some_and(|l| !l.is_empty()) {
            break status;
        }
        assert!(Instant::now() < deadline, "{status:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let left_out = status["left_out"].as_array().unwrap_or_else(|| panic!("{status:#}"));
    assert_eq!(left_out.len(), 1, "{status:#}");
    let reason = left_out[0].as_str().unwrap();
    assert!(
        reason.starts_with("probe \"never\" of tenant \"default\": ")
            && reason.contains(&never)
            && reason.contains("not in the local cache"),
        "{reason}"
    );
    agent.stop().await;
    accepting.abort();
}
