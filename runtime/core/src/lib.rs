//! sonde's agent core: the [`config`] file is loaded by the [`catalog`]
//! into the set of probes (their plugins resolved, grants checked against
//! their [`tenants`]' ceilings); the [`scheduler`] decides when each runs
//! and the [`executor`] when its call may enter the sandbox; `thresholds`
//! turn results into state changes kept by [`results`] and exposed by
//! [`metrics`]. [`control`] is the one path by which a running agent's
//! probes change (reloads, the API, Kubernetes); [`uploads`] keeps what
//! tenants upload; [`auth`] says who an API caller is.

#![deny(missing_docs)]

pub mod auth;
pub mod catalog;
pub mod config;
pub mod control;
pub mod executor;
pub mod metrics;
pub mod npd;
pub mod results;
pub mod scheduler;
pub mod tenants;
pub mod thresholds;
pub mod uploads;
