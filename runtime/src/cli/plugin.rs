//! `sonde plugin`: inspect and list plugins.

use super::{CliError, Output, load_plugin};
use crate::engine::{Engine, EngineConfig};
use clap::Subcommand;

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
}

pub(super) async fn run(config: EngineConfig, cmd: PluginCommand) -> Result<i32, CliError> {
    match cmd {
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
