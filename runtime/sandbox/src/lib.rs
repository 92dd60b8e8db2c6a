//! sonde's sandbox: one call of a health-probe plugin — a WebAssembly
//! component implementing the `sonde:probe` WIT contract — in a fresh
//! wasmtime store under a deadline, a fuel budget and a memory cap, with
//! nothing reachable but the probe's target and what the operator granted.
//!
//! The [`engine`] compiles, loads and runs plugins; every import a plugin
//! uses is a [`host`] capability that checks the call's grants (from
//! `sonde-policy`) first; [`verdict`] says what a run produced. This is the
//! hot path of every probe run, and the crate the release profile builds
//! in one codegen unit.
//!
//! # Examples
//!
//! ```no_run
//! use sonde_sandbox::engine::{Call, Engine, EngineConfig, Limits};
//! use sonde_sandbox::host::Grants;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::new(EngineConfig::default())?;
//! let tcp = engine.load("tcp", sonde_builtins::get("tcp").unwrap()).await?;
//! let grants = std::sync::Arc::new(Grants::default());
//! let result = engine
//!     .run(&tcp, &Call {
//!         probe: "db-port",
//!         target: "127.0.0.1:5432",
//!         config: "{}",
//!         limits: Limits::default(),
//!         grants: &grants,
//!         attempt: 1,
//!         observe: false,
//!     })
//!     .await;
//! println!("{}: {}", result.status, result.message);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod bindings;
pub mod engine;
pub mod host;
pub mod verdict;
