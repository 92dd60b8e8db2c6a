//! Secrets a plugin uses but never reads.
//!
//! A secret is named, owned by one tenant (or the operator), and held in
//! memory only ([`SecretValue`]: zeroed on drop, never printed). A probe
//! uses the secrets its `grants.secrets` name ([`SecretGrants`]). A plugin
//! never gets a secret's bytes: it writes a *handle* into the text it hands
//! the host (`$(secret:db-password)`, [`template`]), and the host puts the
//! bytes on the wire itself, after checking the peer against the call's
//! grants ([`crate::grants::CallGrants::expand`]). Whatever a peer answers
//! is scrubbed of every form of the call's secrets before the plugin sees
//! it ([`scrub`]), so a peer that echoes a header gives nothing away.

mod cell;
pub mod scrub;
pub mod template;

pub use cell::{MIN_SECRET_BYTES, SecretCell, SecretError, SecretGrants, SecretValue, valid_name};
