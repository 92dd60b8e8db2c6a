//! sonde's rules that need no runtime: what a probe's grants allow
//! ([`grants`]: the `net`, `exec` and `files` patterns, and the one
//! per-call check every host capability goes through), which classes of
//! address a name may lead to and the agent's own listeners ([`reach`]),
//! and what a plugin is ([`identity`]: its digest, component sniffing, the
//! size cap, reading its file safely), and how text a plugin wrote is made
//! safe to keep and show ([`text`]), and the secrets a plugin uses
//! without reading them ([`secrets`]).
//!
//! Nothing here knows wasmtime, a registry or the agent: the sandbox, the
//! OCI client and the tenants' ceilings all check through these.

#![deny(missing_docs)]

pub mod grants;
pub mod identity;
pub mod reach;
pub mod secrets;
pub mod text;

pub use grants::{GrantError, Grants, NetPattern};
