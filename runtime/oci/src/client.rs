//! The registry client: resolve (pull through the cache), push, and attach
//! or fetch signatures. Built on `oci-client` (the ORAS project's Rust
//! client), which speaks the distribution API and the token flow.

use super::cache::Cache;
use super::remote::{Limits, Remote, Secret};
use super::{
    MAX_METADATA_BYTES, OCI_MANIFEST_MEDIA_TYPE, OciError, Reference, SIGNATURE_MEDIA_TYPE, WASM_CONFIG_MEDIA_TYPE,
    WASM_LAYER_MEDIA_TYPE,
};
use crate::signing::{PublicKey, SignatureError, Signer};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageIndex, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use serde::Serialize;
use sonde_policy::identity::{self, Digest, WasmKind};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The media type and content of the OCI "empty" config a signature
/// manifest carries (image-spec 1.1).
const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY_CONFIG: &[u8] = b"{}";
/// The most signature referrers of one manifest that are read.
const MAX_SIGNATURE_REFERRERS: usize = 8;

/// How sonde reaches registries and where it caches what it pulls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSettings {
    /// The cache directory (`STATE_DIR/oci` for the agent, the user cache
    /// for `sonde check`).
    pub cache_dir: PathBuf,
    /// Evict unused blobs beyond this many bytes [default: 1 GiB].
    pub cache_max_bytes: u64,
    /// Per registry (`HOST` or `HOST:PORT`, as in references): credentials,
    /// CA, plain HTTP. A registry not listed is reached anonymously over
    /// HTTPS with the system roots.
    pub registries: BTreeMap<String, RegistryAccess>,
    /// The longest a whole pull may take (the tag, the manifest, the
    /// component and the signature together), and a whole push
    /// [default: 60s].
    pub timeout: Duration,
    /// The per-step bounds within it: connecting, and each wait for data
    /// (a silent registry is given up on after [`Limits::idle`]).
    pub limits: Limits,
    /// The largest component accepted [default: 32 MiB].
    pub max_bytes: u64,
}

impl ClientSettings {
    /// The defaults, caching in `cache_dir`.
    pub fn new(cache_dir: PathBuf) -> Self {
        Self {
            cache_dir,
            cache_max_bytes: 1 << 30,
            registries: BTreeMap::new(),
            timeout: Duration::from_secs(60),
            limits: Limits::default(),
            max_bytes: identity::MAX_PLUGIN_BYTES,
        }
    }
}

/// How to reach one registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryAccess {
    /// The user for basic auth (and the token flow, which starts from it).
    pub username: Option<String>,
    /// The file holding the password (its first line). Read once, when the
    /// client is built; never logged.
    pub password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted for this registry, besides the
    /// system roots.
    pub ca_file: Option<PathBuf>,
    /// Speak plain HTTP (no TLS) to this registry. Only for loopback and dev
    /// registries, and only when set explicitly.
    pub insecure: bool,
}

/// What a component needs and offers, for the artifact's config (the
/// `component` field of the CNCF wasm config).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ComponentInfo {
    /// The interfaces and functions it exports.
    pub exports: Vec<String>,
    /// The interfaces it imports.
    pub imports: Vec<String>,
    /// The world it targets, such as `sonde:probe/plugin@0.1.0`.
    pub target: Option<String>,
}

/// How far a download has got, for a progress display.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Bytes received.
    pub done: u64,
    /// Bytes expected.
    pub total: u64,
}

/// Where the bytes of a resolve came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The registry was asked (a tag resolved now, or missing blobs pulled).
    Registry,
    /// Everything came from the cache: the reference is pinned and cached,
    /// and the registry was not needed (a signature lookup may still have
    /// been tried).
    Cache,
    /// The registry could not be asked and the cache stood in. For a tag,
    /// the digest is the one it resolved to at `tag_resolved_at`.
    CacheRegistryDown {
        /// Why the registry could not be asked.
        error: String,
        /// For a tag: when it last resolved (RFC 3339).
        tag_resolved_at: Option<String>,
    },
}

/// A component resolved from a reference, verified against its digests.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The reference as given.
    pub reference: Reference,
    /// The manifest digest: what runs, and what a pinned reference names.
    pub digest: String,
    /// The digest of the component itself (what a sonde signature signs).
    pub wasm_digest: String,
    /// The component.
    pub bytes: Arc<[u8]>,
    /// The sonde signature attached to the manifest, if any (the
    /// `FILE.wasm.sig` JSON), and where it was found.
    pub signature: Option<(Vec<u8>, SignatureLocation)>,
    /// Where this came from.
    pub source: Source,
    /// The bytes downloaded from the registry for this resolve (manifests,
    /// the component, the signature); 0 when all came from the cache. For
    /// counting pulls against a tenant.
    pub transferred: u64,
}

impl Resolved {
    /// The reference pinned to the digest that resolved (what to show in
    /// status, metrics and events).
    pub fn pinned(&self) -> Reference {
        self.reference.with_digest(&self.digest)
    }

    /// Checks the attached signature with [`crate::signing::verify`]:
    /// missing, tampered and untrusted are told apart exactly as for a file.
    pub fn verify(&self, trusted: &[PublicKey]) -> Result<Signer, SignatureError> {
        let plugin = self.pinned().to_string();
        let sig_name = match &self.signature {
            Some((_, loc)) => loc.describe(&self.pinned()),
            None => format!(
                "in the registry (no sonde referrer, no tag {})",
                signature_tag(&self.digest)
            ),
        };
        crate::signing::verify(
            &plugin,
            &self.bytes,
            &sig_name,
            self.signature.as_ref().map(|(b, _)| b.as_slice()),
            trusted,
        )
    }
}

/// Where a signature is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureLocation {
    /// An OCI 1.1 referrer: a manifest whose subject is the artifact.
    Referrer {
        /// The signature manifest's digest.
        manifest: String,
    },
    /// The `sha256-HEX.sonde-sig` tag (sonde's own; cosign's is `.sig`).
    Tag {
        /// The tag.
        tag: String,
    },
    /// Read from the cache (it was fetched from the registry before).
    Cache,
}

impl SignatureLocation {
    fn describe(&self, artifact: &Reference) -> String {
        match self {
            Self::Referrer { manifest } => format!("the signature referrer {manifest} of {artifact}"),
            Self::Tag { tag } => format!("the signature tag {tag} of {artifact}"),
            Self::Cache => format!("the cached signature of {artifact}"),
        }
    }
}

/// What a push stored.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// The reference pinned to the pushed manifest.
    pub reference: Reference,
    /// The manifest digest.
    pub digest: String,
    /// The component's digest.
    pub wasm_digest: String,
}

/// Where a pushed signature went.
#[derive(Clone, Debug)]
pub struct SignaturePushed {
    /// The artifact signed, pinned.
    pub artifact: Reference,
    /// How it is attached.
    pub location: SignatureLocation,
}

/// What [`Client::blob_or_fetch`] fetches when the cache lacks it.
enum Fetch<'a> {
    Manifest,
    Component {
        layer: &'a OciDescriptor,
        max: u64,
        progress: &'a (dyn Fn(Progress) + Sync),
    },
}

/// One resolve under way: the registry it asks, its deadline, where its
/// bytes have come from so far, the error that showed the registry down
/// (then only the cache is read), and the bytes that came over the network.
struct Resolving {
    registry: Arc<RegistryClient>,
    deadline: tokio::time::Instant,
    source: Source,
    offline: Option<OciError>,
    transferred: u64,
}

/// One registry's client and credentials.
struct RegistryClient {
    name: String,
    /// For pushes.
    client: oci_client::Client,
    /// For everything read: bounded in size, time and place.
    remote: Remote,
    username: Option<String>,
    password: Option<Secret>,
}

impl RegistryClient {
    fn auth(&self) -> RegistryAuth {
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => RegistryAuth::Basic(u.clone(), p.0.clone()),
            _ => RegistryAuth::Anonymous,
        }
    }

    /// Text from the registry or the HTTP stack, with the password removed
    /// should anything ever echo it.
    fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if !p.0.is_empty() => text.replace(&p.0, "<redacted>"),
            _ => text,
        }
    }

    /// Turns an oci-client error into one that names the registry or the
    /// reference and carries no secret.
    fn error(&self, reference: &Reference, e: OciDistributionError) -> OciError {
        let has_code = |codes: &[OciErrorCode]| match &e {
            OciDistributionError::RegistryError { envelope, .. } => {
                envelope.errors.iter().any(|x| codes.contains(&x.code))
            }
            _ => false,
        };
        let status = match &e {
            OciDistributionError::ServerError { code, .. } => Some(*code),
            _ => None,
        };
        let auth_failed = matches!(
            e,
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_)
        ) || matches!(status, Some(401 | 403))
            || has_code(&[OciErrorCode::Unauthorized, OciErrorCode::Denied]);
        if auth_failed {
            let detail = match &self.username {
                Some(u) if self.password.is_some() => {
                    format!("the registry refused the credentials of user {u:?}")
                }
                _ => "the registry wants credentials and none are configured for it".into(),
            };
            return OciError::Auth {
                registry: self.name.clone(),
                detail,
            };
        }
        let not_found = matches!(e, OciDistributionError::ImageManifestNotFoundError(_))
            || status == Some(404)
            || has_code(&[
                OciErrorCode::ManifestUnknown,
                OciErrorCode::NameUnknown,
                OciErrorCode::BlobUnknown,
            ]);
        if not_found {
            return OciError::NotFound {
                reference: reference.to_string(),
            };
        }
        if let OciDistributionError::RequestError(r) = &e {
            let mut detail = r.to_string();
            let mut source = std::error::Error::source(r);
            while let Some(s) = source {
                detail.push_str(": ");
                detail.push_str(&s.to_string());
                source = s.source();
            }
            let detail = self.scrub(detail);
            if r.is_connect() || r.is_timeout() || r.is_request() {
                return OciError::Unreachable {
                    registry: self.name.clone(),
                    detail,
                };
            }
            return OciError::Registry {
                registry: self.name.clone(),
                detail,
            };
        }
        OciError::Registry {
            registry: self.name.clone(),
            detail: self.scrub(e.to_string()),
        }
    }
}

/// A client for plugin artifacts in OCI registries, with its cache.
///
/// Lifecycle: built once per process ([`Client::new`] reads password and CA
/// files then); [`Client::resolve`] per plugin load.
pub struct Client {
    settings: ClientSettings,
    cache: Cache,
    registries: Mutex<HashMap<String, Arc<RegistryClient>>>,
    /// Blobs resolved by this process: never evicted while it runs.
    in_use: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("cache", &self.cache.dir())
            .field("registries", &self.settings.registries.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

fn build_registry(name: &str, s: &RegistryAccess, limits: Limits) -> Result<RegistryClient, OciError> {
    // reqwest is built without a default crypto provider; sonde uses ring
    // everywhere. Installing fails only when one is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings_error = |path: &PathBuf, detail: String| OciError::Settings {
        registry: name.to_string(),
        path: path.display().to_string(),
        detail,
    };
    let password = match &s.password_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| settings_error(p, e.to_string()))?;
            let line = text.lines().next().unwrap_or_default().to_string();
            if line.is_empty() {
                return Err(settings_error(p, "the password file is empty".into()));
            }
            Some(Secret(line))
        }
        None => None,
    };
    if password.is_some() != s.username.is_some() {
        return Err(OciError::Settings {
            registry: name.to_string(),
            path: String::new(),
            detail: "basic auth needs both username and password_file".into(),
        });
    }
    let mut extra_roots = Vec::new();
    let mut roots = Vec::new();
    if let Some(ca) = &s.ca_file {
        let pem = std::fs::read(ca).map_err(|e| settings_error(ca, e.to_string()))?;
        if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
            return Err(settings_error(ca, "not a PEM file of certificates".into()));
        }
        roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| settings_error(ca, e.to_string()))?;
        extra_roots.push(oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: pem,
        });
    }
    if s.insecure {
        let host = name.rsplit_once(':').map_or(name, |(h, _)| h);
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            tracing::warn!(registry = %name, "plain HTTP to a registry that is not on loopback: anyone on the path can read and alter pulls");
        }
    }
    let config = oci_client::client::ClientConfig {
        protocol: if s.insecure {
            oci_client::client::ClientProtocol::Http
        } else {
            oci_client::client::ClientProtocol::Https
        },
        extra_root_certificates: extra_roots,
        // An image index is not a wasm artifact; sonde refuses it rather
        // than picking a platform.
        platform_resolver: None,
        connect_timeout: Some(limits.connect),
        read_timeout: Some(limits.idle),
        user_agent: super::USER_AGENT,
        ..Default::default()
    };
    let client = oci_client::Client::try_from(config).map_err(|e| OciError::Registry {
        registry: name.to_string(),
        detail: format!("cannot build the HTTP client: {e}"),
    })?;
    let remote = Remote::new(name, s.insecure, roots, s.username.clone(), password.clone(), limits)?;
    Ok(RegistryClient {
        name: name.to_string(),
        client,
        remote,
        username: s.username.clone(),
        password,
    })
}

/// The CNCF wasm config (`application/vnd.wasm.config.v0+json`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    created: String,
    architecture: &'static str,
    os: &'static str,
    layer_digests: [&'a str; 1],
    component: &'a ComponentInfo,
}

fn descriptor(media_type: &str, bytes: &[u8]) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.to_string(),
        digest: Digest::of(bytes).to_string(),
        size: bytes.len() as i64,
        ..Default::default()
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Checks a manifest against the CNCF wasm layout and returns its one
/// component layer.
fn wasm_layer(reference: &Reference, manifest: &OciImageManifest, max: u64) -> Result<OciDescriptor, OciError> {
    let not_wasm = |detail: String| OciError::NotWasm {
        reference: reference.to_string(),
        detail,
    };
    if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(not_wasm(format!(
            "config media type {:?}, expected {WASM_CONFIG_MEDIA_TYPE:?}",
            manifest.config.media_type
        )));
    }
    let wasm: Vec<&OciDescriptor> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER_MEDIA_TYPE)
        .collect();
    let [layer] = wasm.as_slice() else {
        return Err(not_wasm(format!(
            "{} {WASM_LAYER_MEDIA_TYPE} layers, expected exactly one",
            wasm.len()
        )));
    };
    if Digest::parse(&layer.digest).is_err() {
        return Err(not_wasm(format!("layer digest {:?} is not sha256", layer.digest)));
    }
    if layer.size < 0 || layer.size as u64 > max {
        return Err(OciError::TooLarge {
            reference: reference.to_string(),
            what: "component",
            size: layer.size.max(0) as u64,
            limit: max,
        });
    }
    Ok((*layer).clone())
}

fn parse_manifest(reference: &Reference, bytes: &[u8]) -> Result<OciImageManifest, OciError> {
    serde_json::from_slice(bytes).map_err(|e| OciError::NotWasm {
        reference: reference.to_string(),
        detail: format!("the manifest is not an OCI image manifest: {e}"),
    })
}

impl Client {
    /// Builds the client: opens the cache and reads every configured
    /// registry's password and CA file (errors name the file, never its
    /// contents).
    pub fn new(settings: ClientSettings) -> Result<Self, OciError> {
        let cache = Cache::open(&settings.cache_dir, settings.cache_max_bytes)?;
        let mut registries = HashMap::new();
        for (name, s) in &settings.registries {
            registries.insert(name.clone(), Arc::new(build_registry(name, s, settings.limits)?));
        }
        Ok(Self {
            settings,
            cache,
            registries: Mutex::new(registries),
            in_use: Mutex::new(HashSet::new()),
        })
    }

    /// The cache this client pulls through.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    fn registry(&self, name: &str) -> Result<Arc<RegistryClient>, OciError> {
        let mut map = self.registries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = map.get(name) {
            return Ok(r.clone());
        }
        let r = Arc::new(build_registry(name, &RegistryAccess::default(), self.settings.limits)?);
        map.insert(name.to_string(), r.clone());
        Ok(r)
    }

    fn mark_in_use(&self, digest: &str) {
        self.in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string());
    }

    /// Evicts least recently used blobs this process has not resolved until
    /// the cache is within `cache_max_bytes`. Returns the bytes freed.
    pub(crate) fn prune_cache(&self) -> Result<u64, OciError> {
        let in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.cache.prune(&in_use)
    }

    /// `f`, given up on at `deadline` (the whole pull's or push's).
    async fn bounded<T>(
        &self,
        deadline: tokio::time::Instant,
        registry: &str,
        f: impl std::future::Future<Output = Result<T, OciError>>,
    ) -> Result<T, OciError> {
        match tokio::time::timeout_at(deadline, f).await {
            Ok(r) => r,
            Err(_) => Err(OciError::Timeout {
                registry: registry.to_string(),
                after: self.settings.timeout,
            }),
        }
    }

    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.settings.timeout
    }

    /// Resolves `reference` to a verified component: a tag to its manifest
    /// digest (asking the registry), then the manifest, the component and
    /// its signature, each from the cache when there and from the registry
    /// otherwise, each checked against its digest.
    ///
    /// Offline: a pinned reference whose blobs are cached resolves without
    /// the registry; a tag resolves to the digest it last resolved to here
    /// ([`Source::CacheRegistryDown`] says so). A reference never pulled,
    /// with the registry down, is [`OciError::NotCached`].
    pub async fn resolve(&self, reference: &Reference) -> Result<Resolved, OciError> {
        self.resolve_with_progress(reference, &|_| {}).await
    }

    /// As [`Client::resolve`], calling `progress` as the component downloads.
    pub async fn resolve_with_progress(
        &self,
        reference: &Reference,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Resolved, OciError> {
        let mut r = Resolving {
            registry: self.registry(reference.registry())?,
            deadline: self.deadline(),
            source: Source::Cache,
            offline: None,
            transferred: 0,
        };
        // 1. The manifest digest.
        let digest = self.manifest_digest(&mut r, reference).await?;
        let pinned = reference.with_digest(&digest);

        // 2. The manifest, then 3. the component.
        let manifest_bytes = self.blob_or_fetch(&mut r, &pinned, &digest, Fetch::Manifest).await?;
        let manifest = parse_manifest(&pinned, &manifest_bytes)?;
        let layer = wasm_layer(&pinned, &manifest, self.settings.max_bytes)?;
        let component = Fetch::Component {
            layer: &layer,
            max: self.settings.max_bytes,
            progress,
        };
        let wasm = self.blob_or_fetch(&mut r, &pinned, &layer.digest, component).await?;

        // 4. The signature.
        let signature = self.signature_of(&mut r, &pinned, &digest).await?;
        self.mark_in_use(&digest);
        self.mark_in_use(&layer.digest);
        if let Err(e) = self.prune_cache() {
            tracing::warn!(error = %e, "cannot prune the OCI cache");
        }
        Ok(Resolved {
            reference: reference.clone(),
            digest,
            wasm_digest: layer.digest,
            bytes: wasm.into(),
            signature,
            source: r.source,
            transferred: r.transferred,
        })
    }

    /// The manifest digest `reference` names: its own, or what its tag
    /// resolves to now (cached with the manifest), or, with the registry
    /// down, what the tag last resolved to.
    async fn manifest_digest(&self, r: &mut Resolving, reference: &Reference) -> Result<String, OciError> {
        if let Some(d) = reference.digest() {
            return Ok(d.to_string());
        }
        let registry = r.registry.clone();
        match self
            .bounded(r.deadline, registry.name.as_str(), self.fetch_tag(&registry, reference))
            .await
        {
            Ok((digest, manifest)) => {
                r.transferred += manifest.len() as u64;
                self.cache.put(&digest, &manifest)?;
                self.cache.remember_tag(reference, &digest)?;
                r.source = Source::Registry;
                Ok(digest)
            }
            Err(e) if e.is_offline() => match self.cache.recall_tag(reference)? {
                Some(memo) => {
                    tracing::warn!(reference = %reference, digest = %memo.digest, resolved_at = %memo.resolved_at, error = %e, "registry down; using the digest this tag last resolved to");
                    r.source = Source::CacheRegistryDown {
                        error: e.to_string(),
                        tag_resolved_at: Some(memo.resolved_at),
                    };
                    r.offline = Some(e);
                    Ok(memo.digest)
                }
                None => Err(OciError::NotCached {
                    reference: reference.to_string(),
                    source: Box::new(e),
                }),
            },
            Err(e) => Err(e),
        }
    }

    /// The signature of the manifest `digest`: cached, else asked for
    /// (absence is not cached, so a signature attached later is found);
    /// not asked for with the registry down.
    async fn signature_of(
        &self,
        r: &mut Resolving,
        pinned: &Reference,
        digest: &str,
    ) -> Result<Option<(Vec<u8>, SignatureLocation)>, OciError> {
        if let Some(sig_digest) = self.cache.recall_signature(digest)?
            && let Some(bytes) = self.cache.get(&sig_digest)?
        {
            self.mark_in_use(&sig_digest);
            return Ok(Some((bytes, SignatureLocation::Cache)));
        }
        if r.offline.is_some() {
            return Ok(None);
        }
        let registry = r.registry.clone();
        match self
            .bounded(
                r.deadline,
                registry.name.as_str(),
                self.fetch_signature(&registry, pinned),
            )
            .await
        {
            Ok(Some((bytes, loc))) => {
                r.transferred += bytes.len() as u64;
                let d = Digest::of(&bytes).to_string();
                self.cache.put(&d, &bytes)?;
                self.cache.remember_signature(digest, &d)?;
                self.mark_in_use(&d);
                Ok(Some((bytes, loc)))
            }
            Ok(None) => Ok(None),
            Err(e) if e.is_offline() => {
                tracing::warn!(reference = %pinned, error = %e, "registry down; cannot look for a signature");
                if r.source == Source::Cache {
                    r.source = Source::CacheRegistryDown {
                        error: e.to_string(),
                        tag_resolved_at: None,
                    };
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Resolves a pinned `reference` from the cache alone, without a
    /// byte of network: `None` unless its manifest and component are
    /// cached (and its signature too, when `need_signature`).
    pub fn resolve_cached(&self, reference: &Reference, need_signature: bool) -> Result<Option<Resolved>, OciError> {
        let Some(digest) = reference.digest() else {
            return Ok(None);
        };
        let Some(manifest) = self.cache.get(digest)? else {
            return Ok(None);
        };
        let pinned = reference.with_digest(digest);
        let layer = wasm_layer(&pinned, &parse_manifest(&pinned, &manifest)?, self.settings.max_bytes)?;
        let Some(wasm) = self.cache.get(&layer.digest)? else {
            return Ok(None);
        };
        let mut signature = None;
        if let Some(sig_digest) = self.cache.recall_signature(digest)?
            && let Some(bytes) = self.cache.get(&sig_digest)?
        {
            self.mark_in_use(&sig_digest);
            signature = Some((bytes, SignatureLocation::Cache));
        }
        if need_signature && signature.is_none() {
            return Ok(None);
        }
        self.mark_in_use(digest);
        self.mark_in_use(&layer.digest);
        Ok(Some(Resolved {
            reference: reference.clone(),
            digest: digest.to_string(),
            wasm_digest: layer.digest,
            bytes: wasm.into(),
            signature,
            source: Source::Cache,
            transferred: 0,
        }))
    }

    /// A blob from the cache, else fetched (checked, then cached, and
    /// counted in `r`). With the registry down, a blob not cached is
    /// [`OciError::NotCached`].
    async fn blob_or_fetch(
        &self,
        r: &mut Resolving,
        pinned: &Reference,
        digest: &str,
        what: Fetch<'_>,
    ) -> Result<Vec<u8>, OciError> {
        if let Some(bytes) = self.cache.get(digest)? {
            return Ok(bytes);
        }
        let registry = &*r.registry;
        let deadline = r.deadline;
        if let Some(e) = &r.offline {
            return Err(OciError::NotCached {
                reference: pinned.to_string(),
                source: Box::new(OciError::Unreachable {
                    registry: registry.name.clone(),
                    detail: e.to_string(),
                }),
            });
        }
        let fetched = match what {
            Fetch::Manifest => {
                self.bounded(deadline, &registry.name, Self::fetch_manifest(registry, pinned))
                    .await
            }
            Fetch::Component { layer, max, progress } => {
                self.bounded(
                    deadline,
                    &registry.name,
                    Self::fetch_blob(registry, pinned, layer, max, "component", progress),
                )
                .await
            }
        };
        match fetched {
            Ok(bytes) => {
                let actual = Digest::of(&bytes).to_string();
                if actual != digest {
                    return Err(OciError::DigestMismatch {
                        reference: pinned.to_string(),
                        expected: digest.to_string(),
                        actual,
                    });
                }
                self.cache.put(digest, &bytes)?;
                if r.source == Source::Cache {
                    r.source = Source::Registry;
                }
                r.transferred += bytes.len() as u64;
                Ok(bytes)
            }
            Err(e) if e.is_offline() => Err(OciError::NotCached {
                reference: pinned.to_string(),
                source: Box::new(e),
            }),
            Err(e) => Err(e),
        }
    }

    /// Asks the registry what a tag points at: (digest, manifest bytes).
    async fn fetch_tag(&self, registry: &RegistryClient, reference: &Reference) -> Result<(String, Vec<u8>), OciError> {
        let bytes = Self::fetch_manifest(registry, reference).await?;
        Ok((Digest::of(&bytes).to_string(), bytes))
    }

    /// A manifest, read up to [`super::MAX_MANIFEST_BYTES`].
    async fn fetch_manifest(registry: &RegistryClient, reference: &Reference) -> Result<Vec<u8>, OciError> {
        registry.remote.manifest(reference, false).await
    }

    /// A blob at its declared size, hashed as it streams: refused as soon
    /// as it passes `layer.size`, when it ends short or hashes wrong, and
    /// when it declares more than `max` bytes.
    async fn fetch_blob(
        registry: &RegistryClient,
        reference: &Reference,
        layer: &OciDescriptor,
        max: u64,
        what: &'static str,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Vec<u8>, OciError> {
        if layer.size < 0 || layer.size as u64 > max {
            return Err(OciError::TooLarge {
                reference: reference.to_string(),
                what,
                size: layer.size.max(0) as u64,
                limit: max,
            });
        }
        registry
            .remote
            .blob(reference, &layer.digest, layer.size as u64, what, progress)
            .await
    }

    /// Looks for a sonde signature of the manifest `pinned` names: first the
    /// OCI 1.1 referrers, then the `sha256-HEX.sonde-sig` tag.
    async fn fetch_signature(
        &self,
        registry: &RegistryClient,
        pinned: &Reference,
    ) -> Result<Option<(Vec<u8>, SignatureLocation)>, OciError> {
        let digest = pinned.digest().unwrap_or_default().to_string();
        let index = match registry.remote.referrers(pinned, SIGNATURE_MEDIA_TYPE).await {
            Ok(Some(bytes)) => serde_json::from_slice::<OciImageIndex>(&bytes).ok(),
            Ok(None) => None,
            // A registry that fails the referrers API may still have the tag.
            Err(e @ (OciError::Registry { .. } | OciError::NotFound { .. })) => {
                tracing::debug!(reference = %pinned, error = %e, "no referrers; trying the signature tag");
                None
            }
            Err(e) => return Err(e),
        };
        if let Some(index) = index {
            // The newest last, as registries list them in push order; a
            // registry listing more than a few is not read further.
            for entry in index.manifests.iter().rev().take(MAX_SIGNATURE_REFERRERS) {
                if Digest::parse(&entry.digest).is_err() {
                    continue;
                }
                let sig_ref = pinned.with_digest(&entry.digest);
                let bytes = registry.remote.manifest(&sig_ref, true).await?;
                if Digest::of(&bytes).to_string() != entry.digest {
                    continue;
                }
                if let Some(sig) = self
                    .signature_from_manifest(registry, &sig_ref, &bytes, &digest)
                    .await?
                {
                    return Ok(Some((
                        sig,
                        SignatureLocation::Referrer {
                            manifest: entry.digest.clone(),
                        },
                    )));
                }
            }
        }
        let tag = signature_tag(&digest);
        let tag_ref = pinned.with_tag(&tag);
        let bytes = match registry.remote.manifest(&tag_ref, true).await {
            Ok(b) => b,
            Err(OciError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let sig = self
            .signature_from_manifest(registry, &tag_ref, &bytes, &digest)
            .await?;
        Ok(sig.map(|s| (s, SignatureLocation::Tag { tag })))
    }

    /// The signature blob of a signature manifest, if it is one for `subject`.
    async fn signature_from_manifest(
        &self,
        registry: &RegistryClient,
        at: &Reference,
        manifest: &[u8],
        subject: &str,
    ) -> Result<Option<Vec<u8>>, OciError> {
        let Ok(m) = serde_json::from_slice::<OciImageManifest>(manifest) else {
            return Ok(None);
        };
        if m.artifact_type.as_deref() != Some(SIGNATURE_MEDIA_TYPE)
            || m.subject.as_ref().is_some_and(|s| s.digest != subject)
        {
            return Ok(None);
        }
        let Some(layer) = m.layers.iter().find(|l| l.media_type == SIGNATURE_MEDIA_TYPE) else {
            return Ok(None);
        };
        if Digest::parse(&layer.digest).is_err() {
            return Ok(None);
        }
        let bytes = Self::fetch_blob(registry, at, layer, MAX_METADATA_BYTES, "signature", &|_| {}).await?;
        Ok(Some(bytes))
    }

    /// Pushes `wasm` as a CNCF wasm artifact to `reference` (its tag; a
    /// pinned reference must name the digest the push produces). `info`
    /// fills the config's `component` field.
    pub async fn push(&self, reference: &Reference, wasm: &[u8], info: &ComponentInfo) -> Result<Pushed, OciError> {
        if wasm.len() as u64 > self.settings.max_bytes {
            return Err(OciError::TooLarge {
                reference: reference.to_string(),
                what: "component",
                size: wasm.len() as u64,
                limit: self.settings.max_bytes,
            });
        }
        if identity::sniff(wasm) != WasmKind::Component {
            return Err(OciError::NotWasm {
                reference: reference.to_string(),
                detail: "the file is not a WebAssembly component (build for wasm32-wasip2)".into(),
            });
        }
        let registry = self.registry(reference.registry())?;
        let layer = OciDescriptor {
            annotations: None,
            ..descriptor(WASM_LAYER_MEDIA_TYPE, wasm)
        };
        let created = now_rfc3339();
        let config = serde_json::to_vec(&WasmConfig {
            created: created.clone(),
            architecture: "wasm",
            os: "wasip2",
            layer_digests: [&layer.digest],
            component: info,
        })
        .unwrap_or_default();
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_string()),
            config: descriptor(WASM_CONFIG_MEDIA_TYPE, &config),
            layers: vec![layer.clone()],
            subject: None,
            artifact_type: None,
            annotations: Some(BTreeMap::from([(
                "org.opencontainers.image.created".to_string(),
                created,
            )])),
        };
        let manifest_bytes = serde_json::to_vec(&manifest).unwrap_or_default();
        let digest = Digest::of(&manifest_bytes).to_string();
        if let Some(d) = reference.digest()
            && d != digest
        {
            return Err(OciError::DigestMismatch {
                reference: reference.to_string(),
                expected: d.to_string(),
                actual: digest,
            });
        }
        let blobs = [(config.as_slice(), &manifest.config.digest), (wasm, &layer.digest)];
        let target = match reference.tag() {
            Some(t) => reference.with_tag(t),
            None => reference.clone(),
        };
        self.bounded(self.deadline(), registry.name.as_str(), async {
            self.push_blobs(&registry, &target, &blobs).await?;
            self.push_manifest(&registry, &target, &manifest_bytes).await
        })
        .await?;
        Ok(Pushed {
            reference: reference.with_digest(&digest),
            digest,
            wasm_digest: layer.digest,
        })
    }

    async fn push_blobs(
        &self,
        registry: &RegistryClient,
        reference: &Reference,
        blobs: &[(&[u8], &String)],
    ) -> Result<(), OciError> {
        let r = reference.to_client();
        registry
            .client
            .store_auth_if_needed(reference.registry(), &registry.auth())
            .await;
        registry
            .client
            .auth(&r, &registry.auth(), oci_client::RegistryOperation::Push)
            .await
            .map_err(|e| registry.error(reference, e))?;
        for (bytes, digest) in blobs {
            let exists = registry.client.blob_exists(&r, digest).await.unwrap_or(false);
            if !exists {
                registry
                    .client
                    .push_blob(&r, bytes.to_vec(), digest)
                    .await
                    .map_err(|e| registry.error(reference, e))?;
            }
        }
        Ok(())
    }

    async fn push_manifest(
        &self,
        registry: &RegistryClient,
        reference: &Reference,
        bytes: &[u8],
    ) -> Result<(), OciError> {
        let content_type = http::HeaderValue::from_static(OCI_MANIFEST_MEDIA_TYPE);
        registry
            .client
            .push_manifest_raw(&reference.to_client(), bytes.to_vec(), content_type)
            .await
            .map_err(|e| registry.error(reference, e))?;
        Ok(())
    }

    /// Attaches `signature` (a `FILE.wasm.sig` JSON) to the artifact
    /// `reference` names, after checking that the artifact's component is
    /// `wasm_digest` (what the signature signs). It goes as an OCI 1.1
    /// referrer; when the registry does not list referrers, it is also
    /// tagged `sha256-HEX.sonde-sig`, replacing an older one.
    pub async fn push_signature(
        &self,
        reference: &Reference,
        wasm_digest: &str,
        signature: &[u8],
    ) -> Result<SignaturePushed, OciError> {
        let registry = self.registry(reference.registry())?;
        self.bounded(self.deadline(), registry.name.as_str(), async {
            let subject_bytes = Self::fetch_manifest(&registry, reference).await?;
            let subject_digest = Digest::of(&subject_bytes).to_string();
            if let Some(d) = reference.digest()
                && d != subject_digest
            {
                return Err(OciError::DigestMismatch {
                    reference: reference.to_string(),
                    expected: d.to_string(),
                    actual: subject_digest,
                });
            }
            let pinned = reference.with_digest(&subject_digest);
            let subject = parse_manifest(&pinned, &subject_bytes)?;
            let layer = wasm_layer(&pinned, &subject, u64::MAX)?;
            if layer.digest != wasm_digest {
                return Err(OciError::DigestMismatch {
                    reference: format!("{pinned} (its component, which the signature must sign)"),
                    expected: wasm_digest.to_string(),
                    actual: layer.digest,
                });
            }
            let sig_layer = descriptor(SIGNATURE_MEDIA_TYPE, signature);
            let manifest = OciImageManifest {
                schema_version: 2,
                media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_string()),
                config: descriptor(EMPTY_CONFIG_MEDIA_TYPE, EMPTY_CONFIG),
                layers: vec![sig_layer.clone()],
                subject: Some(OciDescriptor {
                    media_type: OCI_MANIFEST_MEDIA_TYPE.to_string(),
                    digest: subject_digest.clone(),
                    size: subject_bytes.len() as i64,
                    ..Default::default()
                }),
                artifact_type: Some(SIGNATURE_MEDIA_TYPE.to_string()),
                annotations: Some(BTreeMap::from([(
                    "org.opencontainers.image.created".to_string(),
                    now_rfc3339(),
                )])),
            };
            let bytes = serde_json::to_vec(&manifest).unwrap_or_default();
            let sig_manifest = Digest::of(&bytes).to_string();
            let empty_digest = Digest::of(EMPTY_CONFIG).to_string();
            let blobs = [(EMPTY_CONFIG, &empty_digest), (signature, &sig_layer.digest)];
            self.push_blobs(&registry, &pinned, &blobs).await?;
            self.push_manifest(&registry, &pinned.with_digest(&sig_manifest), &bytes)
                .await?;
            // A registry that implements the referrers API lists it now.
            let listed = registry
                .client
                .pull_referrers(&pinned.to_client(), Some(SIGNATURE_MEDIA_TYPE))
                .await
                .is_ok_and(|i| i.manifests.iter().any(|m| m.digest == sig_manifest));
            let location = if listed {
                SignatureLocation::Referrer { manifest: sig_manifest }
            } else {
                let tag = signature_tag(&subject_digest);
                self.push_manifest(&registry, &pinned.with_tag(&tag), &bytes).await?;
                SignatureLocation::Tag { tag }
            };
            Ok(SignaturePushed {
                artifact: pinned,
                location,
            })
        })
        .await
    }
}

/// sonde's tag for the signature of manifest `digest`: `sha256-HEX.sonde-sig`,
/// beside (never over) cosign's `sha256-HEX.sig` for the same manifest.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sonde-sig", digest.replacen(':', "-", 1))
}
