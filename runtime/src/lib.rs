//! sonde's host runtime: it runs health-probe plugins — WebAssembly
//! components implementing the `sonde:probe` WIT contract — each call in a
//! fresh sandbox under a deadline, a fuel budget and a memory cap, with
//! nothing reachable but the probe's target and what the operator granted.
//!
//! The modules follow the data path of one probe run (docs/architecture.md): the
//! [`config`] file is resolved by the [`registry`] into probe specs; the
//! [`scheduler`] decides when each runs; the [`engine`] runs each call in a
//! sandbox whose [`host`] capabilities check every use of the network,
//! files and programs against the probe's grants; [`verdict`] says what a
//! run produced, `thresholds` whether it changes the probe's state, and
//! [`results`] keeps it (optionally on disk) for the [`api`] and the
//! [`kubernetes`] readiness-gate controller. [`agent`]
//! wires these into `sonde run`; [`cli`] is the `sonde` command.
//!
//! # Examples
//!
//! ```no_run
//! use sonde_runtime::engine::{Call, Engine, EngineConfig, Limits};
//! use sonde_runtime::host::Grants;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(EngineConfig::default())?;
//! let tcp = engine.load("tcp", sonde_runtime::builtins::get("tcp").unwrap()).await?;
//! let grants = std::sync::Arc::new(Grants::default());
//! let result = engine
//!     .run(&tcp, &Call {
//!         probe: "db-port",
//!         target: "127.0.0.1:5432",
//!         config: "{}",
//!         limits: Limits::default(),
//!         grants: &grants,
//!         attempt: 1,
//!     })
//!     .await;
//! println!("{}: {}", result.status, result.message);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod agent;
pub mod api;
pub mod auth;
mod bindings;
pub mod builtins;
pub mod cli;
pub mod config;
pub(crate) mod control;
pub mod engine;
pub mod executor;
pub mod host;
pub mod identity;
pub mod kubernetes;
pub mod managed;
pub mod metrics;
pub mod oci;
pub mod registry;
pub mod results;
pub mod scheduler;
pub mod signing;
pub(crate) mod tenants;
pub(crate) mod thresholds;
pub mod verdict;
