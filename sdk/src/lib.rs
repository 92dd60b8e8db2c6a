//! Write [sonde](https://github.com/sonde-probe/sonde) probe plugins in Rust.
//!
//! A plugin is a `cdylib` crate built with `cargo build --target wasm32-wasip2`.
//! It implements [`Probe`] for a type and exports it with [`export!`]; the SDK
//! owns every generated binding, so a plugin writes no WIT glue:
//!
//! ```no_run
//! use sonde_sdk::{Outcome, Probe, ProbeError, Request};
//!
//! struct AlwaysUp;
//!
//! impl Probe for AlwaysUp {
//!     fn check(_req: Request) -> Result<Outcome, ProbeError> {
//!         Ok(Outcome::success("up"))
//!     }
//! }
//!
//! sonde_sdk::export!(AlwaysUp);
//! ```
//!
//! The host runs every call in a fresh sandbox: statics do not survive from
//! one call to the next. Network access reaches the probe's target and what
//! the operator granted, nothing else; [`net`], [`http`], [`grpc`] and [`tls`]
//! are the helpers, and `std::net` obeys the same grants. [`credentials`]
//! logs in with secrets the plugin names by handle and never sees.
//!
//! On the host, `testing` (with the `std` feature) builds a plugin and runs
//! it through the `sonde` binary for the plugin's own tests.
//!
//! Without the default `std` feature the SDK is `no_std` + `alloc`: in the
//! sandbox it brings the allocator, the panic handler and the canonical
//! ABI's `cabi_realloc`, and the plugin imports only the interfaces it
//! calls, which makes every call cheaper. Everything but [`net`]'s
//! `std::net` wrappers remains: [`tls::Session`] has `send` and `read`,
//! [`time::Instant`] measures phases, [`fs::metadata`] and `ca_file` read
//! through the `files` grants, and [`duration`] parses and formats
//! durations as humantime does.

#![deny(missing_docs)]
#![cfg_attr(not(feature = "std"), no_std)]

extern crate alloc;
#[cfg(all(not(feature = "std"), not(target_arch = "wasm32")))]
extern crate std;

#[cfg(any(test, all(target_arch = "wasm32", feature = "arena")))]
mod arena;
pub mod credentials;
pub mod duration;
pub mod exec;
pub mod fs;
pub mod grpc;
pub mod http;
pub mod icmp;
pub mod log;
pub mod net;
#[cfg(all(target_arch = "wasm32", not(feature = "std")))]
mod rt;
pub mod tcp;
#[cfg(all(feature = "std", not(target_arch = "wasm32")))]
pub mod testing;
pub mod time;
pub mod tls;
pub mod udp;

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;
use serde::de::DeserializeOwned;
use time::Instant;

#[doc(hidden)]
#[allow(
    clippy::too_many_arguments,
    reason = "wit-bindgen's generated functions take one argument per WIT parameter"
)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin",
        default_bindings_module: "sonde_sdk::bindings",
    });
}

use bindings::sonde::probe::types as wit;

/// The verdict of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The target is healthy.
    Success,
    /// The target works but something deserves attention.
    Warning,
    /// The target is unhealthy.
    Failure,
    /// The check could not tell.
    Unknown,
}

/// One measurement reported with an [`Outcome`].
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    /// A Prometheus-style name such as `connect_seconds`.
    pub name: String,
    /// The value.
    pub value: f64,
    /// The unit (`seconds`, `bytes`), or empty.
    pub unit: String,
}

/// What a check found: a [`Status`], a message, metrics and an optional detail.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The verdict.
    pub status: Status,
    /// One line for a person.
    pub message: String,
    /// Measurements taken during the check.
    pub metrics: Vec<Metric>,
    /// An optional excerpt, such as part of a response body.
    pub detail: Option<String>,
}

impl Outcome {
    /// An outcome with the given status and message and nothing else.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            metrics: Vec::new(),
            detail: None,
        }
    }

    /// The target is healthy.
    pub fn success(message: impl Into<String>) -> Self {
        Self::new(Status::Success, message)
    }

    /// The target works but deserves attention.
    pub fn warning(message: impl Into<String>) -> Self {
        Self::new(Status::Warning, message)
    }

    /// The target is unhealthy.
    pub fn failure(message: impl Into<String>) -> Self {
        Self::new(Status::Failure, message)
    }

    /// The check could not tell.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(Status::Unknown, message)
    }

    /// Adds a metric.
    pub fn with_metric(mut self, name: impl Into<String>, value: f64, unit: impl Into<String>) -> Self {
        self.metrics.push(Metric {
            name: name.into(),
            value,
            unit: unit.into(),
        });
        self
    }

    /// Sets the detail excerpt.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// Why a check could not produce an [`Outcome`].
///
/// Errors never flip a probe's state: the host retries the check and finally
/// records `unknown`. Return [`Outcome::failure`] when the *target* is
/// unhealthy, and an error when the *check* could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// The plugin config does not fit the plugin.
    InvalidConfig(String),
    /// A capability the plugin needs was refused.
    Denied(String),
    /// An I/O error that says nothing about the target's health.
    Io(String),
    /// A bug in the plugin.
    Internal(String),
}

impl ProbeError {
    /// The plugin config does not fit the plugin.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::InvalidConfig(message.into())
    }

    /// A capability the plugin needs was refused.
    pub fn denied(message: impl Into<String>) -> Self {
        Self::Denied(message.into())
    }

    /// An I/O error that says nothing about the target's health.
    pub fn io(message: impl Into<String>) -> Self {
        Self::Io(message.into())
    }

    /// A bug in the plugin.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(message.into())
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidConfig(m) => write!(f, "invalid config: {m}"),
            Self::Denied(m) => write!(f, "denied: {m}"),
            Self::Io(m) => write!(f, "i/o error: {m}"),
            Self::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl core::error::Error for ProbeError {}

#[cfg(feature = "std")]
impl From<std::io::Error> for ProbeError {
    fn from(err: std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::PermissionDenied => Self::Denied(err.to_string()),
            _ => Self::Io(err.to_string()),
        }
    }
}

/// One call of [`Probe::check`]: the target, the plugin config and the time
/// left.
#[derive(Clone, Debug)]
pub struct Request {
    probe: String,
    target: String,
    config: String,
    timeout: Duration,
    attempt: u32,
    started: Instant,
}

impl Request {
    /// Builds a request by hand, for unit tests of a plugin's logic.
    pub fn new(target: impl Into<String>, config: impl Into<String>, timeout: Duration) -> Self {
        Self {
            probe: "test".into(),
            target: target.into(),
            config: config.into(),
            timeout,
            attempt: 1,
            started: Instant::now(),
        }
    }

    /// The probe's name.
    pub fn probe(&self) -> &str {
        &self.probe
    }

    /// The address to probe: `host:port` or a URL, as configured.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The plugin config as JSON text.
    pub fn config_json(&self) -> &str {
        &self.config
    }

    /// The plugin config, deserialized. A mismatch is
    /// [`ProbeError::InvalidConfig`] naming the field at fault.
    pub fn config<T: DeserializeOwned>(&self) -> Result<T, ProbeError> {
        serde_json::from_str(&self.config).map_err(|e| ProbeError::invalid_config(e.to_string()))
    }

    /// The whole time this call may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The time left before the host stops this call.
    pub fn remaining(&self) -> Duration {
        self.timeout.saturating_sub(self.started.elapsed())
    }

    /// 1 for the first attempt in a period, 2 and up for retries.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

/// The kinds of capability a plugin may ask for in its [`PluginInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapabilityKind {
    /// Connections beyond the target.
    Net,
    /// Programs the host runs for the plugin.
    Exec,
    /// Read-only paths.
    Files,
}

/// A capability a plugin needs, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Its kind.
    pub kind: CapabilityKind,
    /// The pattern (`db.internal:5432`, `/usr/bin/pg_isready`, `/etc/app`).
    pub value: String,
    /// Why the plugin needs it, for the operator.
    pub why: String,
}

/// Who a plugin is and what it needs. Empty `name` and `version` are filled
/// from the plugin crate's `Cargo.toml` by [`export!`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginInfo {
    /// The plugin's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Who ships it.
    pub vendor: String,
    /// One paragraph on what it checks.
    pub description: String,
    /// A JSON Schema for its config.
    pub config_schema: Option<String>,
    /// What it needs granted.
    pub capabilities: Vec<Capability>,
}

/// A probe handler. Implement [`check`](Probe::check), and
/// [`describe`](Probe::describe) to publish a config schema or capabilities.
pub trait Probe {
    /// Probes `req.target()` once.
    fn check(req: Request) -> Result<Outcome, ProbeError>;

    /// Tells the host who this plugin is. The default names the crate.
    fn describe() -> PluginInfo {
        PluginInfo::default()
    }
}

#[doc(hidden)]
pub mod __private {
    use super::*;
    pub use bindings::Guest;
    pub use wit::{
        Outcome as WitOutcome, PluginInfo as WitPluginInfo, ProbeError as WitProbeError, Request as WitRequest,
    };

    pub fn describe<P: Probe>(crate_name: &str, crate_version: &str) -> wit::PluginInfo {
        let info = P::describe();
        wit::PluginInfo {
            name: if info.name.is_empty() {
                crate_name.to_string()
            } else {
                info.name
            },
            version: if info.version.is_empty() {
                crate_version.to_string()
            } else {
                info.version
            },
            vendor: info.vendor,
            description: info.description,
            config_schema: info.config_schema,
            capabilities: info
                .capabilities
                .into_iter()
                .map(|c| wit::Capability {
                    kind: match c.kind {
                        CapabilityKind::Net => wit::CapabilityKind::Net,
                        CapabilityKind::Exec => wit::CapabilityKind::Exec,
                        CapabilityKind::Files => wit::CapabilityKind::Files,
                    },
                    value: c.value,
                    why: c.why,
                })
                .collect(),
        }
    }

    pub fn check<P: Probe>(req: wit::Request) -> Result<wit::Outcome, wit::ProbeError> {
        let req = Request {
            probe: req.probe,
            target: req.target,
            config: req.config,
            timeout: Duration::from_millis(req.timeout_ms),
            attempt: req.attempt,
            started: Instant::now(),
        };
        match P::check(req) {
            Ok(o) => Ok(wit::Outcome {
                status: match o.status {
                    Status::Success => wit::Status::Success,
                    Status::Warning => wit::Status::Warning,
                    Status::Failure => wit::Status::Failure,
                    Status::Unknown => wit::Status::Unknown,
                },
                message: o.message,
                metrics: o
                    .metrics
                    .into_iter()
                    .map(|m| wit::Metric {
                        name: m.name,
                        value: m.value,
                        unit: m.unit,
                    })
                    .collect(),
                detail: o.detail,
            }),
            Err(e) => Err(match e {
                ProbeError::InvalidConfig(m) => wit::ProbeError::InvalidConfig(m),
                ProbeError::Denied(m) => wit::ProbeError::Denied(m),
                ProbeError::Io(m) => wit::ProbeError::Io(m),
                ProbeError::Internal(m) => wit::ProbeError::Internal(m),
            }),
        }
    }
}

/// Exports a [`Probe`] implementation as the plugin's `describe` and `check`.
///
/// Call it once, at the crate root: `sonde_sdk::export!(MyProbe);`.
#[macro_export]
macro_rules! export {
    ($probe:ty) => {
        const _: () = {
            struct __SondeExport;

            impl $crate::__private::Guest for __SondeExport {
                fn describe() -> $crate::__private::WitPluginInfo {
                    $crate::__private::describe::<$probe>(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
                }

                fn check(
                    req: $crate::__private::WitRequest,
                ) -> ::core::result::Result<$crate::__private::WitOutcome, $crate::__private::WitProbeError> {
                    $crate::__private::check::<$probe>(req)
                }
            }

    $crate::bindings::__export_plugin!(__SondeExport with_types_in $crate::bindings);
        };
    };
}
