//! Secrets a plugin uses but never reads (docs/secrets.md): the host puts
//! them on the wire toward granted peers only, and scrubs every answer.
//! Real servers: an HTTP server that wants basic auth or a bearer token,
//! an HTTPS server that wants a client certificate, tonic's gRPC health
//! server reading metadata; PostgreSQL and Redis in `probes::`.

mod differential;
mod held;
mod hostile;
mod http;

use sonde_policy::secrets::{SecretCell, SecretGrants, SecretValue};
use sonde_sandbox::host::Grants;
use std::sync::Arc;

/// The bearer token the tests' server wants.
pub(crate) const TOKEN: &str = "tok-7f3a9c21e8b54d06";
/// The basic-auth password it wants.
pub(crate) const PASSWORD: &str = "pw:Zq8!u2#rT5)x";

/// A server that wants [`TOKEN`] as its bearer token and basic-auth
/// password (user `u`).
pub(crate) async fn token_server() -> sonde_tests::secrets::AuthServer {
    sonde_tests::secrets::AuthServer::start(sonde_tests::secrets::Expected {
        user: "u".into(),
        password: TOKEN.into(),
        token: TOKEN.into(),
    })
    .await
}

/// Grants of `secrets` (name, value), owned by the operator, plus `net`.
pub(crate) fn grants(secrets: &[(&str, &str)], net: &[&str]) -> Grants {
    Grants {
        secrets: SecretGrants::new(
            secrets
                .iter()
                .map(|(name, value)| {
                    Arc::new(SecretCell::given(
                        name,
                        Arc::from("default"),
                        &format!("env {}", name.to_uppercase()),
                        SecretValue::new(value.as_bytes().to_vec()),
                    ))
                })
                .collect(),
        ),
        net: net.iter().map(|n| n.parse().unwrap()).collect(),
        ..Grants::default()
    }
}

/// Whether `text` holds `secret`, or any 6 bytes of it in a row, in any
/// form a peer's echo could carry it: the bytes, their hex, their base64
/// at any offset.
pub(crate) fn holds(text: &str, secret: &str) -> bool {
    use base64::Engine as _;
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    let mut forms = vec![hex.clone(), hex.to_uppercase()];
    let bytes = secret.as_bytes();
    forms.extend(bytes.windows(6).map(|w| String::from_utf8_lossy(w).into_owned()));
    for prefix in ["", "a", "ab", "u:"] {
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{prefix}{secret}"));
        // The characters that depend on the secret alone.
        let skip = (prefix.len() * 8).div_ceil(6);
        forms.push(encoded[skip..skip + 8].to_string());
    }
    forms.iter().any(|f| text.contains(f.as_str()))
}
