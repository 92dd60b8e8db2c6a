//! `sonde plugin`: inspect, list, sign and verify plugins.

use super::{CliError, Output, load_plugin};
use crate::engine::{Engine, EngineConfig};
use crate::signing::{self, PublicKey, SecretKey};
use clap::Subcommand;
use std::path::PathBuf;

/// `sonde plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Show what a plugin says about itself (describe), its imports and digest.
    Inspect {
        /// A built-in name or the path to a `.wasm` component.
        plugin: String,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// List the built-in plugins.
    List,
    /// Generate an ed25519 signing key: KEYFILE (secret, mode 0600) and KEYFILE.pub. Never overwrites.
    Keygen {
        /// Where to write the secret key; the public key goes to KEYFILE.pub.
        keyfile: PathBuf,
        /// The name signatures made with this key carry [default: the key file's name without extension].
        #[arg(long, value_name = "NAME")]
        signer: Option<String>,
    },
    /// Sign a component: writes FILE.wasm.sig (the digest, signer name and time, signed with ed25519).
    Sign {
        /// The secret key file (from `sonde plugin keygen`).
        #[arg(long, value_name = "KEYFILE")]
        key: PathBuf,
        /// The component to sign.
        wasm: PathBuf,
    },
    /// Create a plugin crate: Cargo.toml, src/lib.rs (a TCP check with a JSON config), tests and a README.
    New {
        /// The plugin's (Cargo package) name.
        name: String,
        /// Where to create it [default: ./NAME]; must not exist.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The sonde SDK to depend on [default: the sdk/ of the checkout this binary was built from].
        #[arg(long, value_name = "PATH")]
        sdk: Option<PathBuf>,
        /// The vendor name the plugin's describe() reports.
        #[arg(long, default_value = "", value_name = "NAME")]
        vendor: String,
    },
    /// Verify FILE.wasm against FILE.wasm.sig and trusted public keys: exit 0 valid, 2 unsigned, tampered or untrusted.
    Verify {
        /// A trusted public key file (KEYFILE.pub). Repeatable.
        #[arg(long, value_name = "KEYFILE.pub", required = true)]
        key: Vec<PathBuf>,
        /// The component to verify.
        wasm: PathBuf,
    },
}

pub(super) async fn run(config: EngineConfig, cmd: PluginCommand) -> Result<i32, CliError> {
    match cmd {
        PluginCommand::New { name, dir, sdk, vendor } => {
            let dir = super::scaffold::create(super::scaffold::NewPlugin { name, dir, sdk, vendor })?;
            println!(
                "created {0}\n  cd {0}\n  cargo build --target wasm32-wasip2 --release\n  cargo test",
                dir.display()
            );
            Ok(0)
        }
        PluginCommand::Keygen { keyfile, signer } => {
            let signer = match signer {
                Some(s) => s,
                None => keyfile
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            let public = signing::keygen(&keyfile, &signer)?;
            println!(
                "wrote {} (secret, keep it private) and {} (public, give it to operators); signer {:?}, key id {}",
                keyfile.display(),
                signing::public_key_path(&keyfile).display(),
                public.signer(),
                public.key_id()
            );
            Ok(0)
        }
        PluginCommand::Sign { key, wasm } => {
            let key = SecretKey::read(&key)?;
            let bytes = std::fs::read(&wasm).map_err(|e| CliError(format!("{}: {e}", wasm.display())))?;
            if !matches!(bytes.get(..8), Some([0, b'a', b's', b'm', _, _, 1, 0])) {
                return Err(CliError(format!(
                    "{}: not a WebAssembly component; sign the .wasm built for wasm32-wasip2",
                    wasm.display()
                )));
            }
            let sig = signing::sign_file(&key, &wasm, std::time::SystemTime::now())?;
            println!(
                "signed {} as {:?} (key id {}): {}",
                wasm.display(),
                key.signer(),
                key.public().key_id(),
                sig.display()
            );
            Ok(0)
        }
        PluginCommand::Verify { key, wasm } => {
            let trusted = key.iter().map(|k| PublicKey::read(k)).collect::<Result<Vec<_>, _>>()?;
            match signing::verify_file(&wasm, &trusted) {
                Ok(signer) => {
                    println!(
                        "valid: {} signed by {:?} (key id {}) at {}, {}",
                        wasm.display(),
                        signer.name,
                        signer.key_id,
                        signer.signed_at,
                        signer.digest
                    );
                    Ok(0)
                }
                Err(e) if e.is_verdict() => {
                    println!("invalid: {e}");
                    Ok(2)
                }
                Err(e) => Err(e.into()),
            }
        }
        PluginCommand::List => {
            let engine = Engine::new(config)?;
            for name in crate::builtins::names() {
                let p = load_plugin(&engine, name).await?;
                println!("{name:<12} {} {}", p.info().version, p.info().description);
            }
            Ok(0)
        }
        PluginCommand::Inspect { plugin, output } => {
            let engine = Engine::new(config)?;
            let p = load_plugin(&engine, &plugin).await?;
            let info = p.info();
            match output {
                Output::Json => {
                    let v = serde_json::json!({
                        "plugin": p.label(),
                        "digest": format!("sha256:{}", p.digest()),
                        "info": info,
                        "imports": p.imports(),
                    });
                    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                }
                Output::Text => {
                    println!("plugin:       {}", p.label());
                    println!("digest:       sha256:{}", p.digest());
                    println!("name:         {}", info.name);
                    println!("version:      {}", info.version);
                    println!("vendor:       {}", info.vendor);
                    println!("description:  {}", info.description);
                    if info.capabilities.is_empty() {
                        println!("capabilities: none beyond its target");
                    } else {
                        println!("capabilities:");
                        for c in &info.capabilities {
                            println!("  {:?} {}: {}", c.kind, c.value, c.why);
                        }
                    }
                    println!("imports:");
                    for i in p.imports() {
                        println!("  {i}");
                    }
                    match &info.config_schema {
                        Some(s) => println!("config schema:\n{s}"),
                        None => println!("config schema: none"),
                    }
                }
            }
            Ok(0)
        }
    }
}
