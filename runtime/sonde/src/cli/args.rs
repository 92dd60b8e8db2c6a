//! What several subcommands share: the sandbox flags of a one-off run
//! (`check`, `bench`), flattened into each, and the parsers of durations
//! and sizes, the config file's own.

use super::error::CliError;
use clap::Args;
use serde::Deserialize;
use serde::de::IntoDeserializer;
use sonde_core::config::{Dur, Size};
use sonde_policy::reach::Reach;
use sonde_policy::secrets::{SecretCell, SecretGrants, valid_name};
use sonde_sandbox::engine::{Limits, limits};
use sonde_sandbox::host::Grants;
use std::path::PathBuf;
use std::time::Duration;

/// The sandbox a run gets: its deadline, fuel and memory, and what it may
/// reach beyond its target.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// The call's deadline, such as 500ms or 2s; past it the run is a failure with reason `timeout`.
    #[arg(long, default_value = "1s", value_parser = parse_timeout, value_name = "DURATION")]
    pub timeout: Duration,

    /// Fuel budget (about one unit per wasm instruction); spending it is an error with reason `fuel`.
    #[arg(long, default_value_t = limits::DEFAULT_FUEL, value_name = "N")]
    pub fuel: u64,

    /// Memory cap, such as 64MiB (at most 1GiB); growing past it is an error with reason `memory`.
    #[arg(long, default_value = "64MiB", value_parser = parse_memory, value_name = "SIZE")]
    pub memory: u64,

    /// Also allow connections to HOST:PORT (a name, `*.domain`, an IP, a CIDR or `*`; PORT a number or `*`). Repeatable.
    #[arg(long = "allow-net", value_name = "HOST:PORT")]
    pub allow_net: Vec<String>,

    /// Allow reading this host directory (mounted read-only at the same path). Repeatable.
    #[arg(long = "allow-file", value_name = "PATH")]
    pub allow_file: Vec<PathBuf>,

    /// Allow the plugin to run this program (an absolute path; no shell unless you name one). Repeatable.
    #[arg(long = "allow-exec", value_name = "PATH")]
    pub allow_exec: Vec<PathBuf>,

    /// Set NAME=VALUE in the environment of programs the plugin runs (empty by default). Repeatable.
    #[arg(long = "exec-env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub exec_env: Vec<(String, String)>,

    /// Grant the secret NAME, read from FILE (private to its owner), which the plugin names by handle, $(secret:NAME), and the host sends toward the target and --allow-net peers only. Repeatable.
    #[arg(long = "secret", value_name = "NAME=FILE", value_parser = parse_env)]
    pub secret: Vec<(String, String)>,
}

impl SandboxArgs {
    /// The per-call limits.
    pub fn limits(&self) -> Limits {
        Limits {
            timeout: self.timeout,
            fuel: self.fuel,
            memory: self.memory,
        }
    }

    /// The secrets of `--secret`, each read now.
    fn secrets(&self) -> Result<SecretGrants, CliError> {
        let mut cells = Vec::new();
        for (name, file) in &self.secret {
            if !valid_name(name) {
                return Err(CliError::Message(format!(
                    "--secret {name}={file}: {name:?} is not a secret name (1 to 63 of a-z, 0-9, `-`, `_` and `.`)"
                )));
            }
            let cell = SecretCell::file(name, "default".into(), std::path::Path::new(file));
            if let Err(e) = cell.current() {
                return Err(CliError::Message(format!("--secret {name}: {e}")));
            }
            cells.push(std::sync::Arc::new(cell));
        }
        Ok(SecretGrants::new(cells))
    }

    /// The grants, checked: net patterns parse, programs and directories
    /// are absolute paths that exist.
    pub fn grants(&self) -> Result<Grants, CliError> {
        let grants = Grants {
            net: self.allow_net.iter().map(|s| s.parse()).collect::<Result<_, _>>()?,
            files: self.allow_file.clone(),
            exec: self.allow_exec.clone(),
            env: self.exec_env.clone(),
            // `sonde check` and `sonde bench` run as the operator.
            reach: Reach::OPERATOR,
            secrets: self.secrets()?,
            ip_protocol: None,
        };
        for p in &grants.exec {
            if !p.is_absolute() || !p.is_file() {
                return Err(CliError::Message(format!(
                    "--allow-exec {}: must be an absolute path to a program",
                    p.display()
                )));
            }
        }
        for f in &grants.files {
            if !f.is_absolute() || !f.is_dir() {
                return Err(CliError::Message(format!(
                    "--allow-file {}: must be an absolute path to a directory",
                    f.display()
                )));
            }
            if let Some((mount, fstype)) = sonde_core::catalog::mounts::pseudo_within(f) {
                return Err(CliError::Message(format!(
                    "--allow-file {}: {} a {fstype} filesystem, which would expose sonde's own process; grant a directory of ordinary files",
                    f.display(),
                    if mount == *f {
                        "is".to_string()
                    } else {
                        format!("holds {},", mount.display())
                    }
                )));
            }
        }
        Ok(grants)
    }
}

/// A duration such as `500ms`, `10s` or `1m30s` (zero included), read as
/// the config file reads one.
pub(super) fn parse_duration(s: &str) -> Result<Duration, ArgError> {
    let de: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = s.into_deserializer();
    Ok(Dur::deserialize(de)?.0)
}

/// A duration that must be more than zero: a deadline, a period.
pub(super) fn parse_positive_duration(s: &str) -> Result<Duration, ArgError> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(ArgError::NotPositive(s.to_string()));
    }
    Ok(d)
}

/// A call's deadline: more than zero.
fn parse_timeout(s: &str) -> Result<Duration, ArgError> {
    parse_positive_duration(s)
}

/// A size such as `64MiB`, read as the config file reads one.
pub(super) fn parse_size(s: &str) -> Result<u64, ArgError> {
    let de: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = s.into_deserializer();
    Ok(Size::deserialize(de)?.0)
}

/// A memory cap: a size no more than [`limits::MAX_MEMORY`].
fn parse_memory(s: &str) -> Result<u64, ArgError> {
    let size = parse_size(s)?;
    if size > limits::MAX_MEMORY {
        return Err(ArgError::OverMemoryCeiling(s.to_string()));
    }
    Ok(size)
}

/// `NAME=VALUE`.
fn parse_env(s: &str) -> Result<(String, String), ArgError> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(ArgError::NotNameValue(s.to_string())),
    }
}

/// A command-line value that does not parse (clap shows it with the flag).
#[derive(Debug, PartialEq, thiserror::Error)]
pub(super) enum ArgError {
    /// Not a duration or size as the config file spells one.
    #[error(transparent)]
    Unreadable(#[from] serde::de::value::Error),
    /// A duration that must be more than zero.
    #[error("{0:?}: must be more than zero")]
    NotPositive(String),
    /// A memory cap above [`limits::MAX_MEMORY`].
    #[error("{0} is more than the 1GiB ceiling")]
    OverMemoryCeiling(String),
    /// An environment variable not given as `NAME=VALUE`.
    #[error("{0:?} is not NAME=VALUE")]
    NotNameValue(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_in_the_config_file() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        let e = parse_duration("10x").unwrap_err().to_string();
        assert!(e.contains("\"10x\" is not a duration"), "{e}");
        let e = parse_positive_duration("0s").unwrap_err();
        assert_eq!(e, ArgError::NotPositive("0s".into()));
        assert!(e.to_string().contains("more than zero"));
        assert_eq!(parse_positive_duration("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn sizes_and_the_memory_ceiling() {
        assert_eq!(parse_memory("64MiB"), Ok(64 << 20));
        assert!(parse_memory("2GiB").unwrap_err().to_string().contains("1GiB"));
        assert!(parse_size("lots").unwrap_err().to_string().contains("not a size"));
        assert!(parse_size("1024").unwrap_err().to_string().contains("1KiB (or 1024B)"));
    }
}
