//! Secrets as the agent and `sonde` hold them (docs/secrets.md): the
//! documented config, no secret in a state file, log line or answer, each
//! tenant its own. What the host does with a secret on the wire is in
//! sonde-sandbox's tests (`secrets::`).

mod docs;
mod leaks;
mod tenants;

/// The bearer token the tests' server wants.
pub(crate) const TOKEN: &str = "tok-7f3a9c21e8b54d06";

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
