//! Who an API caller is. A caller proves it with a bearer token; the
//! operator's token makes it the [`Principal::Operator`], a tenant's makes
//! it that [`Principal::Tenant`], and an API on a loopback address may need
//! no token at all ([`ApiAuth`]).
//!
//! Tokens are read once ([`read_token`]: from a file or an environment
//! variable), trimmed, and kept only as a SHA-256 digest in a [`Token`],
//! which never prints and is compared in constant time by
//! [`authenticate`].
//!
//! This module imports nothing else of the crate: the tenants that hold
//! tokens and the API that checks them both build on it.
//!
//! # Examples
//!
//! ```
//! use sonde_core::auth::{Principal, Token, authenticate, bearer};
//!
//! let acme = Token::new("acme-s3cret\n").unwrap();
//! let known = [(&acme, Principal::Tenant("acme".into()))];
//! let presented = bearer("Bearer acme-s3cret").unwrap();
//! assert_eq!(authenticate(presented, known.iter().cloned()), Some(Principal::Tenant("acme".into())));
//! assert_eq!(authenticate("guess", known.iter().cloned()), None);
//! ```

use sha2::{Digest, Sha256};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Whether API callers must present a bearer token, and who checks it:
/// `--api-auth` or the file's `api: {auth: ...}` (the flag wins).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApiAuth {
    /// `token` when the config has any token, else `none`.
    #[default]
    Auto,
    /// Every endpoint but `/livez` and `/healthz` needs `Authorization: Bearer <token>`.
    Token,
    /// No token: every caller is the operator. Only on a loopback address.
    None,
    /// Every endpoint but `/livez` and `/healthz` needs a bearer token: a
    /// configured token as with `token`, or a Kubernetes token that the API
    /// server's `TokenReview` authenticates and whose holder RBAC lets
    /// `get` (`put`, ...) the request's path, asked with a
    /// `SubjectAccessReview` on that non-resource URL
    /// (`sonde_kubernetes::review`). Such a caller acts as the operator
    /// for that request.
    Kubernetes,
}

/// Why an API cannot serve with the authentication asked for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiAuthError {
    /// No token would be asked while tenants exist.
    #[error(
        "the API on {addr} would answer without a token while tenants are configured: every caller would be the operator, including a local service a tenant's probe may reach; configure operator_token_file (or operator_token_env) and the tenants' token_file, or leave `api` out"
    )]
    OpenWithTenants {
        /// Where the API would listen.
        addr: SocketAddr,
    },
    /// No token would be asked on an address off loopback.
    #[error(
        "the API on {addr} would answer anyone without a token: configure operator_token_file (or tenant tokens), or serve it on a loopback address such as 127.0.0.1"
    )]
    OpenOffLoopback {
        /// Where the API would listen.
        addr: SocketAddr,
    },
    /// Tokens are required but none is configured.
    #[error(
        "--api-auth token, but no token is configured (operator_token_file, operator_token_env, or a tenant's token_file/token_env)"
    )]
    NoToken,
}

impl ApiAuth {
    /// The flag's choice, or the file's `api: {auth: ...}` when the flag
    /// is left at `auto`.
    pub fn or_file(self, file: Option<Self>) -> Self {
        match (self, file) {
            (Self::Auto, Some(f)) => f,
            (flag, _) => flag,
        }
    }

    /// What this means for an API on `addr` with or without tokens
    /// configured, and with or without tenants besides the operator:
    /// `Token` or `None`, or why it cannot be.
    ///
    /// An API without tokens makes every caller the operator, so it is
    /// refused off loopback, and refused once tenants exist: a tenant's
    /// plugin never connects to the agent's own listeners, but a service
    /// on the node that a tenant may reach could forward to the API, and
    /// would then act as the operator.
    ///
    /// `Kubernetes` is always an authenticated API: it resolves to itself.
    /// Call it on [`ApiAuth::or_file`]'s answer.
    pub fn resolve(self, addr: SocketAddr, has_tokens: bool, has_tenants: bool) -> Result<Self, ApiAuthError> {
        let open = match self {
            Self::Auto => !has_tokens,
            Self::Token => false,
            Self::None => true,
            Self::Kubernetes => return Ok(Self::Kubernetes),
        };
        if open && has_tenants {
            return Err(ApiAuthError::OpenWithTenants { addr });
        }
        if open && !addr.ip().is_loopback() {
            return Err(ApiAuthError::OpenOffLoopback { addr });
        }
        if !open && !has_tokens {
            return Err(ApiAuthError::NoToken);
        }
        Ok(if open { Self::None } else { Self::Token })
    }
}

/// Who an API caller is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// The operator: sees and acts on every tenant's probes.
    Operator,
    /// A tenant (its id): sees and acts on its own probes only.
    Tenant(Arc<str>),
}

impl Principal {
    /// Whether this caller may see what `tenant` owns.
    pub fn sees(&self, tenant: &str) -> bool {
        match self {
            Self::Operator => true,
            Self::Tenant(t) => &**t == tenant,
        }
    }
}

/// An API token, kept as the SHA-256 of its text: it never prints, and
/// [`Token::matches`] compares in constant time.
#[derive(Clone)]
pub struct Token([u8; 32]);

impl Token {
    /// The token whose text is `secret` (trimmed); `None` if that is empty.
    pub fn new(secret: &str) -> Option<Self> {
        let secret = secret.trim();
        (!secret.is_empty()).then(|| Self(Sha256::digest(secret.as_bytes()).into()))
    }

    /// Whether `presented` is this token, in time that does not depend on
    /// where they differ (both sides are hashed first, so not on the
    /// length either).
    pub fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.0.ct_eq(&digest).into()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for Token {
    fn eq(&self, o: &Self) -> bool {
        self.0.ct_eq(&o.0).into()
    }
}

impl Eq for Token {}

/// The token of an `Authorization` header's value: `Bearer <token>`
/// (the scheme in any case); `None` for any other scheme.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Who presents `token` among the `known` tokens and whose they are: the
/// first that matches, or nobody. Every known token is compared, each in
/// constant time, whichever matches.
pub fn authenticate<'a>(token: &str, known: impl IntoIterator<Item = (&'a Token, Principal)>) -> Option<Principal> {
    let mut found = None;
    for (t, who) in known {
        if t.matches(token) && found.is_none() {
            found = Some(who);
        }
    }
    found
}

/// Why a token could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Both `token_file` and `token_env` are set.
    #[error("set token_file or token_env, not both")]
    Both,
    /// The file cannot be read.
    #[error("token_file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file may be read by others than its owner's group.
    #[error(
        "token_file {path}: readable or writable by every user (mode {mode:o}); make it readable by sonde alone (chmod 600 or 640)"
    )]
    WorldAccessible {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The environment variable is not set or not UTF-8.
    #[error("token_env {name}: not set in sonde's environment")]
    NoEnv {
        /// The variable.
        name: String,
    },
    /// The token is empty (after trimming).
    #[error("{source_name}: the token is empty")]
    Empty {
        /// `token_file PATH` or `token_env NAME`.
        source_name: String,
    },
}

/// Reads a token from `file` or the environment variable `env` (one of
/// them at most); `Ok(None)` when neither is given.
///
/// A file readable or writable by every user is refused: a token anyone on
/// the node can read protects nothing. A file readable by its group is
/// accepted with a warning (a secret volume often is, for a group sonde
/// runs in).
pub fn read_token(file: Option<&Path>, env: Option<&str>) -> Result<Option<Token>, TokenError> {
    match (file, env) {
        (Some(_), Some(_)) => Err(TokenError::Both),
        (None, None) => Ok(None),
        (Some(path), None) => {
            use std::os::unix::fs::PermissionsExt;
            let read_err = |source| TokenError::Read {
                path: path.to_path_buf(),
                source,
            };
            let meta = std::fs::metadata(path).map_err(read_err)?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o006 != 0 {
                return Err(TokenError::WorldAccessible {
                    path: path.to_path_buf(),
                    mode,
                });
            }
            if mode & 0o060 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "token file is readable by its group");
            }
            let text = std::fs::read_to_string(path).map_err(read_err)?;
            Token::new(&text).map(Some).ok_or_else(|| TokenError::Empty {
                source_name: format!("token_file {}", path.display()),
            })
        }
        (None, Some(name)) => {
            let text = take_env(name).ok_or_else(|| TokenError::NoEnv { name: name.to_string() })?;
            Token::new(&text).map(Some).ok_or_else(|| TokenError::Empty {
                source_name: format!("token_env {name}"),
            })
        }
    }
}

/// The token variables read so far, by name: once read, a variable is gone
/// from the environment, and a reload finds its value here.
static TAKEN: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Reads the environment variable `name` and removes it from the process:
/// its value is overwritten where the kernel shows it
/// (`/proc/<pid>/environ`, the block the process started with), then the
/// variable is removed from the environment programs would inherit. Later
/// reads of the same name get the value read first.
pub(crate) fn take_env(name: &str) -> Option<String> {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, value)) = taken.iter().find(|(n, _)| n == name) {
        return Some(value.clone());
    }
    let value = std::env::var(name).ok()?;
    scrub_env(name);
    taken.push((name.to_string(), value.clone()));
    Some(value)
}

/// Overwrites the value of `name` in the environment block and removes the
/// variable.
fn scrub_env(name: &str) {
    let Ok(c_name) = std::ffi::CString::new(name) else {
        return;
    };
    // SAFETY: `getenv` returns a pointer to the NUL-terminated value inside
    // the environment (for a variable the process started with, inside the
    // block `/proc/<pid>/environ` shows), valid until the environment
    // changes; std's environment lock, held by `env::var` and
    // `remove_var`, is not held here, but sonde changes its environment
    // only in this function, called with `TAKEN` locked, so nothing changes
    // it meanwhile. Overwriting the value's bytes in place with the same
    // number of `*` keeps every string the same length and terminated:
    // a concurrent reader sees the value or stars, never invalid memory.
    #[allow(unsafe_code, reason = "overwriting a token in the environment in place")]
    unsafe {
        let value = libc::getenv(c_name.as_ptr());
        if !value.is_null() {
            let len = libc::strlen(value);
            std::ptr::write_bytes(value, b'*', len);
        }
    }
    // SAFETY: removing a variable races only with C code reading the
    // environment through `getenv` on another thread; glibc's `unsetenv`
    // never frees the strings or the array a concurrent reader walks
    // (at worst that reader misses this one variable, which is the point),
    // and Rust's readers take std's environment lock.
    #[allow(unsafe_code, reason = "removing a token from the environment")]
    unsafe {
        std::env::remove_var(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_never_print_and_authenticate() {
        let token = Token::new("  s3cret\n").unwrap();
        assert_eq!(format!("{token:?} {token}"), "Token(<redacted>) <redacted>");
        assert!(token.matches("s3cret"));
        assert!(!token.matches("s3cret "));
        assert!(!token.matches(""));
        assert!(Token::new(" \n").is_none());
        let (op, acme) = (Token::new("op-token").unwrap(), Token::new("acme-token").unwrap());
        let known = || [(&op, Principal::Operator), (&acme, Principal::Tenant("acme".into()))];
        assert_eq!(
            authenticate("acme-token", known()),
            Some(Principal::Tenant("acme".into()))
        );
        assert_eq!(authenticate("op-token", known()), Some(Principal::Operator));
        assert_eq!(authenticate("nobody", known()), None);
        assert!(Principal::Operator.sees("acme"));
        assert!(!Principal::Tenant("acme".into()).sees("other"));
    }

    #[test]
    fn kubernetes_reviews_count_as_authentication() {
        let public: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        // No token configured, tenants configured, off loopback: refused
        // without reviews, accepted with them.
        assert!(ApiAuth::Auto.resolve(public, false, true).is_err());
        assert_eq!(
            ApiAuth::Kubernetes.resolve(public, false, true),
            Ok(ApiAuth::Kubernetes)
        );
        assert_eq!(
            ApiAuth::Kubernetes.resolve(public, true, false),
            Ok(ApiAuth::Kubernetes)
        );
        // The flag wins unless it is left at auto.
        assert_eq!(ApiAuth::Auto.or_file(Some(ApiAuth::Kubernetes)), ApiAuth::Kubernetes);
        assert_eq!(ApiAuth::Token.or_file(Some(ApiAuth::Kubernetes)), ApiAuth::Token);
        assert_eq!(ApiAuth::Auto.or_file(None), ApiAuth::Auto);
    }

    #[test]
    fn only_bearer_tokens() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn token_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "t0k3n\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token(Some(&path), None).unwrap_err();
        assert!(e.to_string().contains("every user (mode 644)"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_token(Some(&path), None).unwrap().unwrap().matches("t0k3n"));
        std::fs::write(&path, "\n").unwrap();
        let e = read_token(Some(&path), None).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = read_token(Some(&dir.path().join("missing")), None).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        let e = read_token(None, Some("SONDE_TEST_NO_SUCH_VARIABLE")).unwrap_err();
        assert!(e.to_string().contains("not set"), "{e}");
        assert!(matches!(read_token(Some(&path), Some("X")), Err(TokenError::Both)));
        assert!(read_token(None, None).unwrap().is_none());
    }
}
