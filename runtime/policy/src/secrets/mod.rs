//! Secrets a plugin uses but never reads.
//!
//! A secret is named, owned by one tenant (or the operator), and held in
//! memory only ([`SecretValue`]: zeroed on drop, never printed). A probe
//! uses the secrets its `grants.secrets` name ([`SecretGrants`]). A plugin
//! never gets a secret's bytes: it writes a *handle* into the text it hands
//! the host (`$(secret:db-password)`, [`template`]), and the host puts the
//! bytes on the wire itself, after checking the peer against the call's
//! grants (`CallGrants::expand`, in `grants`). Whatever a peer answers
//! is scrubbed of every form of the call's secrets before the plugin sees
//! it ([`scrub`]), so a peer that echoes a header gives nothing away.

mod cell;
pub mod scrub;
pub mod template;

pub use cell::{MIN_SECRET_BYTES, SecretCell, SecretError, SecretGrants, SecretValue, valid_name};

/// Why a probe granted secrets may not open its own sockets.
pub(crate) const NO_OWN_SOCKETS: &str = "a probe granted secrets reaches peers only through the host's transports (sonde's http, tcp, tls, grpc and udp, and wasi:http), whose answers the host scrubs; not through wasi:sockets";

/// Why a secret named in a handle was refused, for the denial.
pub(crate) fn not_granted(name: &str, granted: &SecretGrants) -> String {
    let names: Vec<&str> = granted.names().collect();
    if names.is_empty() {
        format!("secret {name:?} is not granted: the probe's grants.secrets is empty")
    } else {
        format!(
            "secret {name:?} is not in the probe's grants.secrets ({})",
            names.join(", ")
        )
    }
}
