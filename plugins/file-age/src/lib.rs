//! The `file-age` probe: a file exists and was modified within `max_age`.
//!
//! Agents that cannot answer a network probe often prove they are alive by
//! touching a file (Calico's node agent checks its own status files' age
//! this way). The plugin reads the file's metadata through the probe's
//! read-only `files` grant: without one, the host refuses the read and the
//! run is `denied`.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;
use core::time::Duration;
use serde::Deserialize;
use sonde_sdk::duration::format as shown;
use sonde_sdk::fs::{FileKind, FsErrorKind};
use sonde_sdk::{Capability, CapabilityKind, Outcome, PluginInfo, Probe, ProbeError, Request};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    path: String,
    max_age: String,
    warn_age: Option<String>,
    #[serde(default)]
    min_size: u64,
}

fn duration(field: &str, text: &str) -> Result<Duration, ProbeError> {
    sonde_sdk::duration::parse(text).map_err(|e| ProbeError::invalid_config(format!("{field} {text:?}: {e}")))
}

/// What the config asks, checked.
struct Limits {
    max_age: Duration,
    warn_age: Option<Duration>,
    min_size: u64,
}

fn limits(config: &Config) -> Result<Limits, ProbeError> {
    if !config.path.starts_with('/') {
        return Err(ProbeError::invalid_config(format!(
            "path {:?}: must be absolute",
            config.path
        )));
    }
    let max_age = duration("max_age", &config.max_age)?;
    let warn_age = config
        .warn_age
        .as_deref()
        .map(|w| duration("warn_age", w))
        .transpose()?;
    if let Some(w) = warn_age
        && w >= max_age
    {
        return Err(ProbeError::invalid_config("warn_age must be less than max_age"));
    }
    Ok(Limits {
        max_age,
        warn_age,
        min_size: config.min_size,
    })
}

/// Judges a file of `size` bytes last modified `age` ago.
fn judge(path: &str, age: Duration, size: u64, limits: &Limits) -> Outcome {
    let age_shown = shown(Duration::from_secs(age.as_secs()));
    let outcome = if age > limits.max_age {
        Outcome::failure(format!(
            "{path} was modified {age_shown} ago, more than {}",
            shown(limits.max_age)
        ))
    } else if size < limits.min_size {
        Outcome::failure(format!("{path} has {size} bytes, fewer than {}", limits.min_size))
    } else if let Some(w) = limits.warn_age
        && age > w
    {
        Outcome::warning(format!("{path} was modified {age_shown} ago, more than {}", shown(w)))
    } else {
        Outcome::success(format!("{path} was modified {age_shown} ago"))
    };
    outcome
        .with_metric("age_seconds", age.as_secs_f64(), "seconds")
        .with_metric("size_bytes", size as f64, "bytes")
}

struct FileAge;

impl Probe for FileAge {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "A file exists and was modified within max_age (read-only files grant).".into(),
            config_schema: Some(include_str!("schema.json").into()),
            capabilities: vec![Capability {
                kind: CapabilityKind::Files,
                value: "*".into(),
                why: "reads the metadata of the file named by `path`: grant its directory read-only".into(),
            }],
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let limits = limits(&config)?;
        let path = &config.path;
        let meta = match sonde_sdk::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind == FsErrorKind::NotFound => {
                return Ok(Outcome::failure(format!("{path} does not exist")));
            }
            Err(e) if e.kind == FsErrorKind::Denied => {
                return Err(ProbeError::denied(format!(
                    "{path}: not readable; grant its directory read-only ({e})"
                )));
            }
            Err(e) => return Err(ProbeError::io(format!("{path}: {e}"))),
        };
        if meta.kind != FileKind::File {
            return Ok(Outcome::failure(format!("{path} is not a regular file")));
        }
        let modified = meta
            .modified
            .ok_or_else(|| ProbeError::io(format!("{path}: the filesystem keeps no modification time")))?;
        // A file modified in the future (clock skew) counts as fresh.
        let age = sonde_sdk::time::since_unix_epoch().saturating_sub(modified);
        Ok(judge(path, age, meta.size, &limits))
    }
}

sonde_sdk::export!(FileAge);

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_sdk::Status;

    fn parse(json: &str) -> Result<Limits, ProbeError> {
        let config: Config = serde_json::from_str(json).map_err(|e| ProbeError::invalid_config(e.to_string()))?;
        limits(&config)
    }

    #[test]
    fn ages_are_judged_against_the_limits() {
        let l = parse(r#"{"path": "/x", "max_age": "5m", "warn_age": "1m", "min_size": 1}"#).unwrap();
        let judge_at = |secs, size| judge("/x", Duration::from_secs(secs), size, &l).status;
        assert_eq!(judge_at(10, 5), Status::Success);
        assert_eq!(judge_at(90, 5), Status::Warning);
        assert_eq!(judge_at(301, 5), Status::Failure);
        assert_eq!(judge_at(10, 0), Status::Failure);
        let o = judge("/x", Duration::from_secs(600), 5, &l);
        assert_eq!(o.message, "/x was modified 10m ago, more than 5m");
    }

    #[test]
    fn bad_configs_name_the_field() {
        for (json, expected) in [
            (r#"{"path": "x", "max_age": "5m"}"#, "must be absolute"),
            (r#"{"path": "/x", "max_age": "soon"}"#, "max_age \"soon\""),
            (
                r#"{"path": "/x", "max_age": "1m", "warn_age": "2m"}"#,
                "warn_age must be less",
            ),
            (r#"{"path": "/x"}"#, "max_age"),
            (r#"{"path": "/x", "max_age": "1m", "maxage": 1}"#, "maxage"),
        ] {
            let err = parse(json).err().unwrap();
            assert!(err.to_string().contains(expected), "{json}: {err}");
        }
    }
}
