//! `sonde plugin`: inspect, list, sign and verify plugins, and push them to
//! and pull them from OCI registries.

use super::error::CliError;
use super::load::load_plugin;
use super::output::Output;
use clap::{Args, Subcommand};
use sonde_oci::signing::{self, PublicKey, SigningKey};
use sonde_oci::{self as oci, Reference};
use sonde_policy::identity::{self, Digest, WasmKind};
use sonde_sandbox::engine::{Engine, EngineConfig, Plugin};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How to reach the registry of an `oci://` reference.
#[derive(Debug, Default, Args)]
pub struct RegistryArgs {
    /// For oci:// references: the registry user (basic auth, and the token flow that starts from it).
    #[arg(long, value_name = "USER", requires = "registry_password_file")]
    pub registry_user: Option<String>,
    /// For oci:// references: a file whose first line is the registry password.
    #[arg(long, value_name = "FILE", requires = "registry_user")]
    pub registry_password_file: Option<PathBuf>,
    /// For oci:// references: a PEM file of CA certificates to trust for the registry, besides the system roots.
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Option<PathBuf>,
    /// For oci:// references: speak plain HTTP to the registry (loopback and dev registries only).
    #[arg(long)]
    pub insecure_registry: bool,
    /// For oci:// references: the longest a whole pull or push may take.
    #[arg(long, default_value = "60s", value_parser = super::args::parse_duration, value_name = "DURATION")]
    pub registry_timeout: Duration,
    /// For oci:// references: the longest the registry may stay silent (its first byte, or between two reads).
    #[arg(long, default_value = "10s", value_parser = super::args::parse_positive_duration, value_name = "DURATION")]
    pub registry_idle_timeout: Duration,
    /// Where pulled blobs are cached, by digest [default: CACHE_DIR/oci].
    #[arg(long, value_name = "DIR")]
    pub oci_cache: Option<PathBuf>,
}

impl RegistryArgs {
    /// A registry client for `reference`, caching in `--oci-cache`, else
    /// `oci/` of the compile cache, else the system temp dir.
    pub(crate) fn client(&self, config: &EngineConfig, reference: &Reference) -> Result<oci::Client, CliError> {
        let cache_dir = match (&self.oci_cache, &config.cache_dir) {
            (Some(d), _) => d.clone(),
            (None, Some(d)) => d.join("oci"),
            (None, None) => std::env::temp_dir().join("sonde-oci"),
        };
        let mut settings = oci::ClientSettings::new(cache_dir);
        settings.timeout = self.registry_timeout;
        if !self.registry_idle_timeout.is_zero() {
            settings.limits.idle = self.registry_idle_timeout;
        }
        settings.registries.insert(
            reference.registry().to_string(),
            oci::RegistryAccess {
                username: self.registry_user.clone(),
                password_file: self.registry_password_file.clone(),
                ca_file: self.registry_ca.clone(),
                insecure: self.insecure_registry,
            },
        );
        Ok(oci::Client::new(settings)?)
    }
}

/// Prints download progress on stderr when it is a terminal and the blob is
/// larger than 1 MiB.
fn progress_printer(what: String) -> impl Fn(oci::Progress) + Sync {
    let tty = std::io::stderr().is_terminal();
    move |p: oci::Progress| {
        if !tty || p.total < 1 << 20 {
            return;
        }
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        eprint!("\rpulling {what}: {:.1} / {:.1} MiB", mib(p.done), mib(p.total));
        if p.done >= p.total {
            eprintln!();
        }
    }
}

/// Resolves an `oci://` reference, verifies its signature against `trust`
/// (when any key is given) and loads it. The plugin's label is the
/// reference pinned to the digest that resolved.
pub(crate) async fn load_oci(
    engine: &Engine,
    config: &EngineConfig,
    registry: &RegistryArgs,
    reference: &str,
    trust: &[PublicKey],
) -> Result<Arc<Plugin>, CliError> {
    let reference = Reference::parse(reference)?;
    let client = registry.client(config, &reference)?;
    let resolved = client
        .resolve_with_progress(&reference, &progress_printer(reference.to_string()))
        .await?;
    report_source(&resolved);
    if !trust.is_empty() {
        let signers = resolved
            .verify(trust)
            .map_err(|e| CliError::Message(format!("refusing to run {e}")))?;
        for s in signers {
            tracing::info!(plugin = %resolved.pinned(), signer = %s.name, key_id = %s.key_id, "signature verified");
        }
    }
    Ok(engine.load(&resolved.pinned().to_string(), &resolved.bytes).await?)
}

fn report_source(resolved: &oci::Resolved) {
    if let oci::Source::CacheRegistryDown { error, tag_resolved_at } = &resolved.source {
        match tag_resolved_at {
            Some(at) => eprintln!(
                "sonde: {}: registry unreachable ({error}); using the cached digest {} this tag resolved to at {at}",
                resolved.reference, resolved.digest
            ),
            None => eprintln!(
                "sonde: {}: registry unreachable ({error}); using the cached copy",
                resolved.pinned()
            ),
        }
    }
}

fn source_text(source: &oci::Source) -> &'static str {
    match source {
        oci::Source::Registry => "registry",
        oci::Source::Cache => "cache",
        oci::Source::CacheRegistryDown { .. } => "cache (registry unreachable)",
    }
}

/// Writes `bytes` to `path` through a temp file in the same directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let err = |e: std::io::Error| CliError::file(path, e);
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    Ok(())
}

/// `sonde plugin` subcommands.
#[allow(
    rustdoc::broken_intra_doc_links,
    reason = "the docs are clap's help text, where [:PORT] marks what may be left out"
)]
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Show what a plugin says about itself (describe), its imports and digest.
    Inspect {
        /// A built-in name, the path to a `.wasm` component, or oci://HOST/REPO:TAG or @sha256:DIGEST.
        plugin: String,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Push a component to an OCI registry (the CNCF wasm artifact layout); with --key, sign it there as cosign does.
    Push {
        /// The component.
        wasm: PathBuf,
        /// Where: oci://HOST[:PORT]/REPO:TAG.
        reference: String,
        /// Sign the pushed artifact with this private key (cosign's format; password from $COSIGN_PASSWORD): `cosign verify --key KEYFILE.pub` checks it.
        #[arg(long, value_name = "KEYFILE")]
        key: Option<PathBuf>,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Pull a component from an OCI registry, checked against its digest; its signatures, if any, go to FILE.sig.
    Pull {
        /// oci://HOST[:PORT]/REPO:TAG or @sha256:DIGEST.
        reference: String,
        /// Where to write it [default: the repository's last component, .wasm, in the current directory].
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
        /// Refuse it (exit 2, nothing written) unless its signature is valid by this public key. Repeatable.
        #[arg(long = "trust", value_name = "KEYFILE.pub")]
        trust: Vec<PathBuf>,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// List the built-in plugins.
    List,
    /// Generate an ECDSA P-256 key pair in cosign's format: KEYFILE (encrypted with $COSIGN_PASSWORD, empty when unset; mode 0600) and KEYFILE.pub (PEM). Never overwrites.
    Keygen {
        /// Where to write the private key; the public key goes to KEYFILE.pub, and its signer name in `trust:` is that file's name without .pub.
        keyfile: PathBuf,
    },
    /// Sign a component file (writes FILE.wasm.sigstore.json, a sigstore bundle, as `cosign sign-blob --bundle` does) or an oci:// artifact (as `cosign sign` does).
    Sign {
        /// The private key: from `sonde plugin keygen` or `cosign generate-key-pair` (password from $COSIGN_PASSWORD).
        #[arg(long, value_name = "KEYFILE")]
        key: PathBuf,
        /// The component file, or an oci:// reference to sign in its registry.
        wasm: String,
        /// Also sign this artifact in a registry (oci://…), which must hold this very component.
        #[arg(long, value_name = "OCI_REFERENCE")]
        push: Option<String>,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Create a plugin in Rust, Python or JavaScript: a TCP check with a JSON config, its tests (a fake host, then through sonde) and a README.
    New {
        /// The plugin's (Cargo, Python or npm package) name.
        name: String,
        /// The language: rust (the sonde-sdk crate), python (sdk/python, componentize-py) or js (sdk/js, componentize-js).
        #[arg(long, value_enum, default_value_t = super::scaffold::Lang::Rust)]
        lang: super::scaffold::Lang,
        /// Where to create it [default: ./NAME]; must not exist.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The sonde SDK directory (sdk/) to refer to [default: the sdk/ of the checkout this binary was built from].
        #[arg(long, value_name = "PATH")]
        sdk: Option<PathBuf>,
        /// The vendor name the plugin's describe() reports.
        #[arg(long, default_value = "", value_name = "NAME")]
        vendor: String,
    },
    /// Verify a component file (against FILE.wasm.sigstore.json or FILE.wasm.sig) or an oci:// artifact (its cosign signatures, bundles and sonde signatures) with trusted public keys: exit 0 valid, 2 unsigned, tampered or untrusted.
    Verify {
        /// A trusted public key file: PEM (cosign's, or from `sonde plugin keygen`) or sonde's old format. Repeatable.
        #[arg(long, value_name = "KEYFILE.pub", required = true)]
        key: Vec<PathBuf>,
        /// The component file, or an oci:// reference.
        wasm: String,
        /// How to reach the registry.
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

pub(super) async fn run(config: EngineConfig, cmd: PluginCommand) -> Result<i32, CliError> {
    match cmd {
        PluginCommand::New {
            name,
            lang,
            dir,
            sdk,
            vendor,
        } => {
            let req = super::scaffold::NewPlugin {
                name,
                lang,
                dir,
                sdk,
                vendor,
            };
            let dir = super::scaffold::create(req)?;
            out!("created {0}\n  cd {0}\n  {1}", dir.display(), lang.next_steps());
            Ok(0)
        }
        PluginCommand::Keygen { keyfile } => keygen(&keyfile),
        PluginCommand::Sign {
            key,
            wasm,
            push,
            registry,
        } => sign(&config, &key, &wasm, push.as_deref(), &registry).await,
        PluginCommand::Push {
            wasm,
            reference,
            key,
            registry,
        } => push(config, &wasm, &reference, key.as_deref(), &registry).await,
        PluginCommand::Pull {
            reference,
            output,
            trust,
            registry,
        } => pull(config, &reference, output, &trust, &registry).await,
        PluginCommand::Verify { key, wasm, registry } => verify(&config, &key, &wasm, &registry).await,
        PluginCommand::List => {
            let engine = Engine::new(config)?;
            for name in sonde_builtins::names() {
                let p = load_plugin(&engine, name).await?;
                out!("{name:<12} {} {}", p.info().version, p.info().description);
            }
            Ok(0)
        }
        PluginCommand::Inspect {
            plugin,
            output,
            registry,
        } => inspect(config, &plugin, output, &registry).await,
    }
}

/// `sonde plugin keygen KEYFILE`.
fn keygen(keyfile: &Path) -> Result<i32, CliError> {
    let public_path = signing::public_key_path(keyfile);
    let signer = public_path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".pub").to_string())
        .unwrap_or_default();
    let public = signing::keygen(keyfile, &signer)?;
    out!(
        "wrote {} (private, encrypted with ${}; keep it private) and {} (public, give it to operators); signer {:?} in `trust:`, key id {}",
        keyfile.display(),
        signing::PASSWORD_ENV,
        public_path.display(),
        public.signer(),
        public.key_id()
    );
    Ok(0)
}

/// `sonde plugin sign --key KEYFILE (FILE.wasm | oci://…) [--push oci://…]`.
async fn sign(
    config: &EngineConfig,
    key: &Path,
    target: &str,
    push: Option<&str>,
    registry: &RegistryArgs,
) -> Result<i32, CliError> {
    let key = SigningKey::read(key)?;
    let mut wasm_digest = None;
    let mut push = push;
    if Reference::is_oci(target) {
        push = Some(target);
    } else {
        let wasm = Path::new(target);
        let bytes = sonde_sandbox::engine::read_plugin_file(wasm).await?;
        if identity::sniff(&bytes) != WasmKind::Component {
            return Err(CliError::Message(format!(
                "{}: not a WebAssembly component; sign the .wasm built for wasm32-wasip2",
                wasm.display()
            )));
        }
        let bundle = signing::sign_file(&key, wasm, &bytes)?;
        out!(
            "signed {} as {:?} (key id {}): {}",
            wasm.display(),
            key.public().signer(),
            key.public().key_id(),
            bundle.display()
        );
        wasm_digest = Some(Digest::of(&bytes).to_string());
    }
    if let Some(reference) = push {
        let reference = Reference::parse(reference)?;
        let client = registry.client(config, &reference)?;
        let pushed = client
            .push_cosign_signature(&reference, &key, wasm_digest.as_deref())
            .await?;
        out!(
            "signed {} as {:?} (key id {}), attached as {}",
            pushed.artifact,
            key.public().signer(),
            key.public().key_id(),
            describe_location(&pushed.location)
        );
    }
    Ok(0)
}

/// `sonde plugin verify --key KEYFILE.pub (FILE.wasm | oci://…)`: 0 when
/// valid, 2 when not.
async fn verify(
    config: &EngineConfig,
    keys: &[PathBuf],
    target: &str,
    registry: &RegistryArgs,
) -> Result<i32, CliError> {
    let trusted = keys.iter().map(|k| PublicKey::read(k)).collect::<Result<Vec<_>, _>>()?;
    let verdict = if Reference::is_oci(target) {
        let reference = Reference::parse(target)?;
        let client = registry.client(config, &reference)?;
        let resolved = client.resolve(&reference).await?;
        report_source(&resolved);
        resolved.verify(&trusted)
    } else {
        signing::verify_file(Path::new(target), &trusted)
    };
    match verdict {
        Ok(signers) => {
            for signer in signers {
                out!(
                    "valid: {} signed by {:?} (key id {}), {}",
                    target,
                    signer.name,
                    signer.key_id,
                    signer.digest
                );
            }
            Ok(0)
        }
        Err(e) if e.is_verdict() => {
            out!("invalid: {e}");
            Ok(2)
        }
        Err(e) => Err(e.into()),
    }
}

/// `sonde plugin inspect PLUGIN`: what the plugin says of itself, its
/// digest and its imports.
async fn inspect(config: EngineConfig, plugin: &str, output: Output, registry: &RegistryArgs) -> Result<i32, CliError> {
    let engine = Engine::new(config.clone())?;
    let p = if Reference::is_oci(plugin) {
        load_oci(&engine, &config, registry, plugin, &[]).await?
    } else {
        load_plugin(&engine, plugin).await?
    };
    let info = p.info();
    match output {
        Output::Json => {
            let v = serde_json::json!({
                "plugin": p.label(),
                "digest": p.digest().to_string(),
                "info": info,
                "imports": p.imports(),
            });
            out!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Text => {
            out!("plugin:       {}", p.label());
            out!("digest:       {}", p.digest());
            out!("name:         {}", info.name);
            out!("version:      {}", info.version);
            out!("vendor:       {}", info.vendor);
            out!("description:  {}", info.description);
            if info.capabilities.is_empty() {
                out!("capabilities: none beyond its target");
            } else {
                out!("capabilities:");
                for c in &info.capabilities {
                    out!("  {:?} {}: {}", c.kind, c.value, c.why);
                }
            }
            out!("imports:");
            for i in p.imports() {
                out!("  {i}");
            }
            match &info.config_schema {
                Some(s) => out!("config schema:\n{s}"),
                None => out!("config schema: none"),
            }
        }
    }
    Ok(0)
}

fn describe_location(location: &oci::SignatureLocation) -> String {
    match location {
        oci::SignatureLocation::Referrer { manifest } => format!("an OCI referrer ({manifest})"),
        oci::SignatureLocation::Tag { tag } => format!("tag {tag} (the registry lists no referrers)"),
        oci::SignatureLocation::Cache => "the cached signature".into(),
    }
}

/// `sonde plugin push FILE.wasm oci://… [--key KEYFILE]`.
async fn push(
    config: EngineConfig,
    wasm: &Path,
    reference: &str,
    key: Option<&Path>,
    registry: &RegistryArgs,
) -> Result<i32, CliError> {
    let key = key.map(SigningKey::read).transpose()?;
    let reference = Reference::parse(reference)?;
    let bytes = sonde_sandbox::engine::read_plugin_file(wasm).await?;
    // Load it first: what is pushed must be a sonde plugin, and its imports
    // go into the artifact's config.
    let engine = Engine::new(config.clone())?;
    let plugin = engine.load(&wasm.display().to_string(), &bytes).await?;
    let info = oci::ComponentInfo {
        exports: vec!["describe".into(), "check".into()],
        imports: plugin.imports().to_vec(),
        target: Some("sonde:probe/plugin@0.1.0".into()),
    };
    let client = registry.client(&config, &reference)?;
    let pushed = client.push(&reference, &bytes, &info).await?;
    out!(
        "pushed {} ({} bytes, component {})",
        pushed.reference,
        bytes.len(),
        pushed.wasm_digest
    );
    if let Some(key) = key {
        let attached = client
            .push_cosign_signature(&pushed.reference, &key, Some(&pushed.wasm_digest))
            .await?;
        out!(
            "signed as {:?} (key id {}), attached as {}",
            key.public().signer(),
            key.public().key_id(),
            describe_location(&attached.location)
        );
    }
    Ok(0)
}

/// `sonde plugin pull oci://… [-o FILE] [--trust KEY]`.
async fn pull(
    config: EngineConfig,
    reference: &str,
    output: Option<PathBuf>,
    trust: &[PathBuf],
    registry: &RegistryArgs,
) -> Result<i32, CliError> {
    let reference = Reference::parse(reference)?;
    let trusted = trust
        .iter()
        .map(|k| PublicKey::read(k))
        .collect::<Result<Vec<_>, _>>()?;
    let client = registry.client(&config, &reference)?;
    let resolved = client
        .resolve_with_progress(&reference, &progress_printer(reference.to_string()))
        .await?;
    report_source(&resolved);
    if !trusted.is_empty() {
        match resolved.verify(&trusted) {
            Ok(signers) => {
                for s in signers {
                    out!("valid signature by {:?} (key id {})", s.name, s.key_id);
                }
            }
            Err(e) if e.is_verdict() => {
                out!("invalid: {e}");
                return Ok(2);
            }
            Err(e) => return Err(e.into()),
        }
    }
    let path = output.unwrap_or_else(|| {
        let name = reference.repository().rsplit('/').next().unwrap_or("plugin");
        PathBuf::from(format!("{name}.wasm"))
    });
    write_atomic(&path, &resolved.bytes)?;
    let sig_path = signing::signature_path(&path);
    // A bundle beside the file is read first: one from an older pull or
    // sign would stand for these bytes.
    let bundle = signing::bundle_path(&path);
    if let Err(e) = std::fs::remove_file(&bundle)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(CliError::file(&bundle, e));
    }
    match &resolved.signature {
        Some((sig, _)) => write_atomic(&sig_path, sig)?,
        // A stale signature next to new bytes would mislead `verify`.
        None => match std::fs::remove_file(&sig_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CliError::file(&sig_path, e)),
        },
    }
    out!(
        "pulled {} from {} to {} ({} bytes, component {}){}",
        resolved.pinned(),
        source_text(&resolved.source),
        path.display(),
        resolved.bytes.len(),
        resolved.wasm_digest,
        if resolved.signature.is_some() {
            format!("; signature in {}", sig_path.display())
        } else {
            "; no signature attached".into()
        }
    );
    Ok(0)
}
