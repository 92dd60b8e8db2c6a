//! A real registry for the tests: Debian's `docker-registry` (the CNCF
//! distribution server), started on loopback per test with its own
//! storage, and with htpasswd auth or TLS where a test needs them. The
//! tests of sonde-core, sonde-kubernetes and the sonde crate include this
//! file too (`#[path]`).

use sonde_oci::{self as oci, Client, ClientSettings, Reference, RegistryAccess};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The registry `Registry::start($options)` started, or the test returns
/// (skipped: `docker-registry` is not installed).
macro_rules! registry {
    ($options:expr) => {
        match $crate::support::registry::Registry::start($options) {
            Some(r) => r,
            None => return,
        }
    };
}
pub(crate) use registry;

pub(crate) const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

pub(crate) const PASSWORD: &str = "correct-horse-battery";

/// TLS material for a registry: a test CA and a server certificate for
/// 127.0.0.1 it signed.
pub(crate) struct Tls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl Tls {
    pub(crate) fn new() -> Self {
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
    pub(crate) htpasswd: bool,
    pub(crate) tls: Option<Tls>,
}

/// A running `docker-registry` on a free loopback port.
pub(crate) struct Registry {
    pub(crate) child: Option<Child>,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) addr: String,
    pub(crate) ca_file: Option<PathBuf>,
    pub(crate) htpasswd: bool,
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
    pub(crate) fn wait_listening(&mut self) {
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

    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub(crate) fn reference(&self, path: &str) -> Reference {
        Reference::parse(&format!("oci://{}/{path}", self.addr)).unwrap()
    }

    pub(crate) fn registry_settings(&self) -> RegistryAccess {
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
    pub(crate) fn client_with(&self, cache: &Path, registry: RegistryAccess) -> Client {
        let mut settings = ClientSettings::new(cache.to_path_buf());
        settings.timeout = Duration::from_secs(20);
        settings.registries.insert(self.addr.clone(), registry);
        Client::new(settings).unwrap()
    }

    pub(crate) fn client(&self, cache: &Path) -> Client {
        self.client_with(cache, self.registry_settings())
    }

    /// Where the registry keeps the blob `digest`.
    pub(crate) fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The CLI flags that reach this registry.
    pub(crate) fn cli_flags(&self, cache: &Path) -> Vec<String> {
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

pub(crate) fn tcp_component() -> &'static [u8] {
    sonde_builtins::get("tcp").unwrap()
}

pub(crate) fn info() -> oci::ComponentInfo {
    oci::ComponentInfo {
        exports: vec!["describe".into(), "check".into()],
        imports: vec![],
        target: Some("sonde:probe/plugin@0.1.0".into()),
    }
}
