//! `sonde modules import BLACKBOX_YML --grant HOST:PORT`: blackbox_exporter's
//! modules as sonde's `modules:` block (docs/prometheus.md, "Migrating from
//! blackbox_exporter"), printed on stdout; whatever sonde cannot honour is
//! named on stderr by its key path, and refuses the import unless
//! `--skip-unsupported` leaves it out.

mod blackbox;
mod dns;
mod http;
mod options;
mod tree;
mod walk;

use crate::cli::error::CliError;
use clap::{Args, Subcommand};
use serde_json::Value as Json;
use sonde_sandbox::host::NetPattern;
use std::fmt::Write as _;
use std::path::PathBuf;
use walk::Severity;

/// `sonde modules …`.
#[derive(Debug, Subcommand)]
pub enum ModulesCommand {
    /// Print the sonde `modules:` block equivalent to a blackbox_exporter config file (exit 0 imported, 2 refused: each option sonde cannot honour is named).
    Import(ImportArgs),
}

/// `sonde modules import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// blackbox_exporter's config file (blackbox.yml).
    #[arg(value_name = "BLACKBOX_YML")]
    pub file: PathBuf,

    /// The targets every imported module may probe, as a `net` grant: HOST:PORT (a name, `*.domain`, an IP, a CIDR or `*`; PORT a number or `*`). Repeatable; at least one.
    #[arg(long = "grant", value_name = "HOST:PORT", required = true)]
    pub grants: Vec<String>,

    /// Leave out the options (or whole modules) sonde cannot honour, listing them on stderr, instead of refusing the import.
    #[arg(long)]
    pub skip_unsupported: bool,
}

/// Runs `sonde modules …`.
pub(super) fn run(cmd: ModulesCommand) -> Result<i32, CliError> {
    match cmd {
        ModulesCommand::Import(args) => import(&args),
    }
}

fn import(args: &ImportArgs) -> Result<i32, CliError> {
    for g in &args.grants {
        g.parse::<NetPattern>()
            .map_err(|e| CliError::Message(format!("--grant: {e}")))?;
    }
    let text = std::fs::read_to_string(&args.file).map_err(|e| CliError::file(&args.file, e))?;
    let file = args.file.display().to_string();
    let (modules, ctx) = match blackbox::import(&text) {
        Ok(done) => done,
        Err((message, line, column)) => {
            eprintln!("sonde: {file}:{line}:{column}: {message}");
            return Ok(2);
        }
    };
    let invalid = ctx.problems.iter().filter(|p| p.severity == Severity::Invalid).count();
    let unsupported = ctx.problems.len() - invalid;
    if invalid > 0 || (unsupported > 0 && !args.skip_unsupported) {
        for p in &ctx.problems {
            let whole = match p.severity {
                Severity::UnsupportedModule => "; --skip-unsupported leaves the whole module out",
                _ => "",
            };
            eprintln!("sonde: {}{whole}", p.render(&file));
        }
        if invalid > 0 {
            eprintln!(
                "sonde: {file}: not imported: {invalid} error(s) blackbox_exporter would refuse too{}",
                if unsupported > 0 {
                    format!(", and {unsupported} option(s) sonde cannot honour")
                } else {
                    String::new()
                }
            );
        } else {
            eprintln!(
                "sonde: {file}: not imported: {unsupported} option(s) sonde cannot honour; --skip-unsupported leaves them out (the whole module where it is no check without them)"
            );
        }
        return Ok(2);
    }
    for p in &ctx.problems {
        let whole = match p.severity {
            Severity::UnsupportedModule => "; the whole module is left out",
            _ => "",
        };
        eprintln!("skipped: {}{whole}", p.render(&file));
    }
    for n in &ctx.notes {
        eprintln!("note: {n}");
    }
    out_part!("{}", render(&file, &args.grants, &modules, &ctx.problems));
    Ok(0)
}

/// The `modules:` block, with a comment saying where it came from.
fn render(file: &str, grants: &[String], modules: &[blackbox::Imported], skipped: &[walk::Problem]) -> String {
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# sonde modules imported from the blackbox_exporter config {}",
        comment(file)
    );
    let _ = writeln!(y, "# by `sonde modules import` (sonde {}).", crate::build::VERSION);
    if !skipped.is_empty() {
        let _ = writeln!(y, "# Left out (--skip-unsupported):");
        for p in skipped {
            let whole = match p.severity {
                Severity::UnsupportedModule => " (the whole module)",
                _ => "",
            };
            let _ = writeln!(y, "#   {}{whole}", comment(&p.render(file)));
        }
    }
    let secrets: std::collections::BTreeMap<&String, &PathBuf> = modules.iter().flat_map(|m| &m.secrets).collect();
    if !secrets.is_empty() {
        y.push_str("secrets:\n");
        for (name, file) in secrets {
            let file = scalar(&Json::String(file.display().to_string()));
            let _ = writeln!(y, "  {}: {{file: {file}}}", key(name));
        }
    }
    if modules.is_empty() {
        y.push_str("modules: {}\n");
        return y;
    }
    y.push_str("modules:\n");
    for m in modules {
        let _ = writeln!(y, "  # blackbox_exporter: prober {} at line {}", m.prober, m.line);
        let _ = writeln!(y, "  {}:", key(&m.name));
        let _ = writeln!(y, "    plugin: {}", m.plugin);
        match &m.timeout {
            Some(t) => {
                let _ = writeln!(y, "    timeout: {}", scalar(&Json::String(t.clone())));
            }
            None => {
                let _ = writeln!(
                    y,
                    "    timeout: {}  # none in blackbox_exporter: the scrape's deadline governs",
                    blackbox::NO_TIMEOUT
                );
            }
        }
        if !m.config.is_empty() {
            field(&mut y, 4, "config", &Json::Object(m.config.clone()));
        }
        y.push_str("    grants:\n");
        let net: Vec<Json> = grants.iter().map(|g| Json::String(g.clone())).collect();
        field(&mut y, 6, "net", &Json::Array(net));
        if !m.files.is_empty() {
            let files = m.files.iter().map(|f| Json::String(f.display().to_string())).collect();
            field(&mut y, 6, "files", &Json::Array(files));
        }
        if !m.secrets.is_empty() {
            let names = m.secrets.keys().map(|n| Json::String(n.clone())).collect();
            field(&mut y, 6, "secrets", &Json::Array(names));
        }
        if let Some((version, fallback)) = m.ip_protocol {
            let _ = writeln!(y, "      ip_protocol: {version}");
            if !fallback {
                y.push_str("      ip_protocol_fallback: false\n");
            }
        }
    }
    y
}

/// Text made safe for one comment line.
fn comment(text: &str) -> String {
    text.replace('\r', "\\r").replace('\n', "\\n")
}

/// `key: value` at `indent`, a mapping or list in block style below it.
fn field(y: &mut String, indent: usize, name: &str, value: &Json) {
    let pad = " ".repeat(indent);
    match value {
        Json::Object(m) if !m.is_empty() => {
            let _ = writeln!(y, "{pad}{}:", key(name));
            for (k, v) in m {
                field(y, indent + 2, k, v);
            }
        }
        Json::Array(items) if !items.is_empty() => {
            let _ = writeln!(y, "{pad}{}:", key(name));
            for item in items {
                // A mapping in a list is written as JSON, YAML's flow style.
                let _ = writeln!(y, "{pad}  - {}", scalar(item));
            }
        }
        other => {
            let _ = writeln!(y, "{pad}{}: {}", key(name), scalar(other));
        }
    }
}

/// A value as YAML: JSON, whose strings are YAML's double-quoted scalars
/// (so `yes`, `0x10` or `*` stay strings) and whose objects and arrays are
/// its flow style.
fn scalar(value: &Json) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// A mapping key: bare when plainly a word, quoted otherwise.
fn key(name: &str) -> String {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && !matches!(
            name.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
        );
    if plain {
        name.to_string()
    } else {
        scalar(&Json::String(name.to_string()))
    }
}

#[cfg(test)]
mod tests;
