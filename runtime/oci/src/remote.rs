//! The pull side of the distribution API, bounded in size and time: every
//! byte a registry sends the agent (manifests, blobs, referrer lists, token
//! answers, redirects) is read through this module.
//!
//! - **Size.** A manifest, referrer list or token answer is read up to its
//!   cap ([`MAX_MANIFEST_BYTES`], [`MAX_TOKEN_BYTES`]) and refused as soon
//!   as it passes it; a blob is read at its declared size, hashed as it
//!   streams, and refused as soon as it passes that size, when it ends
//!   short, or when it does not hash to its digest. Nothing is buffered
//!   beyond the cap. Response heads are bounded by the HTTP stack (100
//!   headers, ~400 KiB).
//! - **Time.** Connecting has [`Limits::connect`], each read (the first
//!   byte of the answer, then every next one) has [`Limits::idle`]; a
//!   silent peer is given up on in seconds. The whole pull's deadline is
//!   the caller's ([`super::ClientSettings::timeout`]).
//! - **Place.** Redirects (at most [`MAX_REDIRECTS`], never from HTTPS to
//!   HTTP) and token realms go only where [`super::guard`] allows.
//!
//! It speaks the token flow of the distribution spec itself (a `401` with
//! `WWW-Authenticate: Bearer realm=…`, or `Basic`), so that the token
//! endpoint's answer is bounded too.

use super::guard::{self, Guard, Refusal, Why};
use super::{OciError, Reference};
use sonde_policy::identity::Hasher;
use std::sync::Mutex;
use std::time::Duration;

/// The largest manifest (or signature manifest, or referrer list) read:
/// 4 MiB, as the CNCF distribution registry caps what it accepts.
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// The largest answer of a token endpoint read: 64 KiB.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// The most redirects one request follows.
pub const MAX_REDIRECTS: usize = 5;

/// The per-step time bounds of registry exchanges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connecting (TCP and TLS) [default: 5s].
    pub connect: Duration,
    /// Waiting for the first byte of an answer, and between two reads of a
    /// body [default: 10s].
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            idle: Duration::from_secs(10),
        }
    }
}

/// A password, never printed.
#[derive(Clone)]
pub(crate) struct Secret(pub(crate) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One registry's pull client: its HTTP client (guarded resolver, redirect
/// policy, timeouts), its credentials and the bearer token it holds.
pub(crate) struct Remote {
    name: String,
    base: String,
    http: reqwest::Client,
    guard: Guard,
    limits: Limits,
    username: Option<String>,
    password: Option<Secret>,
    /// The last bearer token, by the scope it was asked for.
    token: Mutex<Option<(String, Secret)>>,
}

/// What is being read, for errors and caps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Body {
    Manifest,
    Signature,
    Referrers,
    Token,
}

impl Body {
    fn cap(self) -> u64 {
        match self {
            Self::Token => MAX_TOKEN_BYTES,
            _ => MAX_MANIFEST_BYTES,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Self::Manifest => "manifest",
            Self::Signature => "signature manifest",
            Self::Referrers => "referrer list",
            Self::Token => "token answer",
        }
    }
}

impl Remote {
    /// A pull client for registry `name` (`HOST[:PORT]`).
    pub(crate) fn new(
        name: &str,
        insecure: bool,
        roots: Vec<reqwest::Certificate>,
        username: Option<String>,
        password: Option<Secret>,
        limits: Limits,
    ) -> Result<Self, OciError> {
        let guard = Guard {
            allow_loopback: guard::is_local_registry(name),
        };
        let policy_guard = guard.clone();
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            let place: String = attempt.url().as_str().chars().take(200).collect();
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(Refusal {
                    what: "a redirect to",
                    place,
                    why: Why::TooManyRedirects,
                });
            }
            let downgrade =
                attempt.url().scheme() == "http" && attempt.previous().last().is_some_and(|u| u.scheme() == "https");
            if downgrade {
                return attempt.error(Refusal {
                    what: "a redirect to",
                    place,
                    why: Why::Downgrade,
                });
            }
            match policy_guard.check_url("a redirect to", attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(r) => attempt.error(r),
            }
        });
        let http = reqwest::Client::builder()
            .redirect(policy)
            .dns_resolver(guard::resolver(&guard))
            .connect_timeout(limits.connect)
            .read_timeout(limits.idle)
            .user_agent(super::USER_AGENT)
            .tls_certs_merge(roots)
            .build()
            .map_err(|e| OciError::Registry {
                registry: name.to_string(),
                detail: format!("cannot build the HTTP client: {e}"),
            })?;
        let host = if name == "docker.io" {
            "registry-1.docker.io"
        } else {
            name
        };
        Ok(Self {
            name: name.to_string(),
            base: format!("{}://{host}", if insecure { "http" } else { "https" }),
            http,
            guard,
            limits,
            username,
            password,
            token: Mutex::new(None),
        })
    }

    /// Text with the password removed, should anything ever echo it.
    pub(crate) fn scrub(&self, text: String) -> String {
        match &self.password {
            Some(p) if !p.0.is_empty() => text.replace(&p.0, "<redacted>"),
            _ => text,
        }
    }

    /// A transport error as an [`OciError`] naming the registry: refused
    /// destinations, stalls and connection failures told apart.
    fn transport(&self, e: reqwest::Error, doing: &str) -> OciError {
        if let Some(r) = guard::find_refusal(&e) {
            return OciError::Refused {
                registry: self.name.clone(),
                refusal: Box::new(r),
            };
        }
        if e.is_timeout() {
            let (step, after) = if e.is_connect() {
                ("connecting", self.limits.connect)
            } else {
                ("waiting for data", self.limits.idle)
            };
            return OciError::Stalled {
                registry: self.name.clone(),
                step: format!("{doing}: {step}"),
                after,
            };
        }
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            source = s.source();
        }
        OciError::Unreachable {
            registry: self.name.clone(),
            detail: self.scrub(format!("{doing}: {detail}")),
        }
    }

    /// `GET url` with the registry's credentials: anonymous first, then
    /// as a `401` asks (basic, or a bearer token from the realm it names).
    async fn get(
        &self,
        url: &str,
        accept: &str,
        reference: &Reference,
        doing: &str,
    ) -> Result<reqwest::Response, OciError> {
        let parsed: reqwest::Url = url.parse().map_err(|e| OciError::InvalidReference {
            reference: reference.to_string(),
            detail: format!("{url}: {e}"),
        })?;
        self.guard
            .check_url("the registry URL", &parsed)
            .map_err(|r| OciError::Refused {
                registry: self.name.clone(),
                refusal: Box::new(r),
            })?;
        let scope = format!("repository:{}:pull", reference.repository());
        let held = self
            .token
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|(s, _)| *s == scope)
            .map(|(_, t)| t.clone());
        let send = |auth: Option<Auth>| {
            let mut req = self.http.get(parsed.clone()).header(reqwest::header::ACCEPT, accept);
            match auth {
                Some(Auth::Bearer(t)) => req = req.bearer_auth(t.0),
                Some(Auth::Basic) => {
                    req = req.basic_auth(
                        self.username.clone().unwrap_or_default(),
                        self.password.as_ref().map(|p| p.0.clone()),
                    )
                }
                None => {}
            }
            req.send()
        };
        let resp = send(held.map(Auth::Bearer))
            .await
            .map_err(|e| self.transport(e, doing))?;
        if resp.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        let challenge = resp
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        drop(resp);
        let auth = if challenge.trim_start().to_ascii_lowercase().starts_with("bearer") {
            let token = self.fetch_token(&challenge, &scope, reference).await?;
            *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some((scope.clone(), token.clone()));
            Auth::Bearer(token)
        } else if self.password.is_some() {
            Auth::Basic
        } else {
            return Err(self.auth_failed());
        };
        let resp = send(Some(auth)).await.map_err(|e| self.transport(e, doing))?;
        if matches!(resp.status().as_u16(), 401 | 403) {
            return Err(self.auth_failed());
        }
        Ok(resp)
    }

    fn auth_failed(&self) -> OciError {
        let detail = match &self.username {
            Some(u) if self.password.is_some() => format!("the registry refused the credentials of user {u:?}"),
            _ => "the registry wants credentials and none are configured for it".into(),
        };
        OciError::Auth {
            registry: self.name.clone(),
            detail,
        }
    }

    /// Asks the realm of a `Bearer` challenge for a token of `scope`.
    async fn fetch_token(&self, challenge: &str, scope: &str, reference: &Reference) -> Result<Secret, OciError> {
        let params = challenge_params(challenge);
        let bad = |detail: String| OciError::Registry {
            registry: self.name.clone(),
            detail,
        };
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| bad("a Bearer challenge without a realm".into()))?;
        let mut url: reqwest::Url = realm
            .parse()
            .map_err(|e| bad(format!("the token realm {realm:?} is not a URL: {e}")))?;
        self.guard
            .check_url("the token realm", &url)
            .map_err(|r| OciError::Refused {
                registry: self.name.clone(),
                refusal: Box::new(r),
            })?;
        {
            let mut q = url.query_pairs_mut();
            if let Some((_, service)) = params.iter().find(|(k, _)| k == "service") {
                q.append_pair("service", service);
            }
            q.append_pair("scope", scope);
        }
        let mut req = self.http.get(url);
        if let (Some(u), Some(p)) = (&self.username, &self.password) {
            req = req.basic_auth(u, Some(&p.0));
        }
        let resp = req.send().await.map_err(|e| self.transport(e, "asking for a token"))?;
        if matches!(resp.status().as_u16(), 401 | 403) {
            return Err(self.auth_failed());
        }
        if !resp.status().is_success() {
            return Err(bad(format!("the token endpoint answered {}", resp.status())));
        }
        let body = self.read_capped(resp, Body::Token, reference).await?;
        #[derive(serde::Deserialize)]
        struct Answer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Answer =
            serde_json::from_slice(&body).map_err(|e| bad(format!("the token answer is not JSON: {e}")))?;
        answer
            .token
            .or(answer.access_token)
            .filter(|t| !t.is_empty())
            .map(Secret)
            .ok_or_else(|| bad("the token answer holds no token".into()))
    }

    /// A status that is not 200 as an error: 404 is [`OciError::NotFound`].
    fn status_error(&self, resp: &reqwest::Response, reference: &Reference, doing: &str) -> OciError {
        if resp.status().is_redirection() {
            // A redirect the client did not follow: not to http or https.
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("nowhere");
            let scheme = to.split_once(':').map_or("none", |(s, _)| s);
            return OciError::Refused {
                registry: self.name.clone(),
                refusal: Box::new(Refusal {
                    what: "a redirect to",
                    place: to.chars().take(200).collect(),
                    why: Why::Scheme(scheme.chars().take(20).collect()),
                }),
            };
        }
        match resp.status().as_u16() {
            404 => OciError::NotFound {
                reference: reference.to_string(),
            },
            401 | 403 => self.auth_failed(),
            s => OciError::Registry {
                registry: self.name.clone(),
                detail: format!("{doing}: the registry answered {s}"),
            },
        }
    }

    /// Reads a body of kind `body` up to its cap; refuses it as soon as it
    /// passes the cap (or declares a length past it).
    async fn read_capped(
        &self,
        mut resp: reqwest::Response,
        body: Body,
        reference: &Reference,
    ) -> Result<Vec<u8>, OciError> {
        let cap = body.cap();
        let too_large = |size| OciError::TooLarge {
            reference: reference.to_string(),
            what: body.what(),
            size,
            limit: cap,
        };
        if let Some(n) = resp.content_length()
            && n > cap
        {
            return Err(too_large(n));
        }
        let mut out = Vec::with_capacity(resp.content_length().unwrap_or(0) as usize);
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| self.transport(e, &format!("reading the {}", body.what())))?
        {
            let total = out.len() as u64 + chunk.len() as u64;
            if total > cap {
                return Err(too_large(total));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn url(&self, reference: &Reference, kind: &str, id: &str) -> String {
        format!("{}/v2/{}/{kind}/{id}", self.base, reference.repository())
    }

    /// The image index tagged `reference` (a registry's referrers tag
    /// `sha256-HEX`, as cosign writes it without the referrers API), read
    /// up to the referrers list's bound.
    pub(crate) async fn index(&self, reference: &Reference) -> Result<Vec<u8>, OciError> {
        let id = reference.digest().or(reference.tag()).unwrap_or_default();
        let url = self.url(reference, "manifests", id);
        let doing = "fetching the referrers tag";
        let resp = self.get(&url, super::OCI_INDEX_MEDIA_TYPE, reference, doing).await?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(self.status_error(&resp, reference, doing));
        }
        self.read_capped(resp, Body::Referrers, reference).await
    }

    /// The manifest `reference` names (its digest, else its tag), read up
    /// to [`MAX_MANIFEST_BYTES`].
    pub(crate) async fn manifest(&self, reference: &Reference, signature: bool) -> Result<Vec<u8>, OciError> {
        let id = reference.digest().or(reference.tag()).unwrap_or_default();
        let url = self.url(reference, "manifests", id);
        let doing = "fetching the manifest";
        let resp = self.get(&url, super::OCI_MANIFEST_MEDIA_TYPE, reference, doing).await?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(self.status_error(&resp, reference, doing));
        }
        let body = if signature { Body::Signature } else { Body::Manifest };
        self.read_capped(resp, body, reference).await
    }

    /// The referrers of manifest `pinned` of `artifact_type` (an OCI image
    /// index), or `None` when the registry has no referrers API.
    pub(crate) async fn referrers(&self, pinned: &Reference, artifact_type: &str) -> Result<Option<Vec<u8>>, OciError> {
        let digest = pinned.digest().unwrap_or_default();
        let url = format!("{}?artifactType={artifact_type}", self.url(pinned, "referrers", digest));
        let doing = "listing the referrers";
        let resp = self.get(&url, super::OCI_INDEX_MEDIA_TYPE, pinned, doing).await?;
        match resp.status().as_u16() {
            200 => Ok(Some(self.read_capped(resp, Body::Referrers, pinned).await?)),
            404 | 400 | 405 => Ok(None),
            _ => Err(self.status_error(&resp, pinned, doing)),
        }
    }

    /// The blob `digest` of `reference`, which declares `size` bytes:
    /// hashed as it streams, refused as soon as it passes `size`, when it
    /// ends short, or when it does not hash to `digest`.
    pub(crate) async fn blob(
        &self,
        reference: &Reference,
        digest: &str,
        size: u64,
        what: &'static str,
        progress: &(dyn Fn(super::Progress) + Sync),
    ) -> Result<Vec<u8>, OciError> {
        let url = self.url(reference, "blobs", digest);
        let doing = format!("fetching the {what} {digest}");
        let mut resp = self.get(&url, "*/*", reference, &doing).await?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(self.status_error(&resp, reference, &doing));
        }
        let wrong_size = |got: u64, early: bool| OciError::SizeMismatch {
            reference: reference.to_string(),
            what,
            declared: size,
            got,
            early,
        };
        if let Some(n) = resp.content_length()
            && n != size
        {
            return Err(wrong_size(n, true));
        }
        let mut hasher = Hasher::default();
        let mut out = Vec::with_capacity(size as usize);
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| self.transport(e, &format!("reading the {what} {digest}")))?
        {
            let total = out.len() as u64 + chunk.len() as u64;
            if total > size {
                return Err(wrong_size(total, true));
            }
            hasher.update(&chunk);
            out.extend_from_slice(&chunk);
            progress(super::Progress {
                done: total,
                total: size,
            });
        }
        if (out.len() as u64) < size {
            return Err(wrong_size(out.len() as u64, false));
        }
        let actual = hasher.finish().to_string();
        if actual != digest {
            return Err(OciError::DigestMismatch {
                reference: reference.to_string(),
                expected: digest.to_string(),
                actual,
            });
        }
        Ok(out)
    }
}

enum Auth {
    Bearer(Secret),
    Basic,
}

/// The `key="value"` parameters of a `WWW-Authenticate` challenge.
fn challenge_params(challenge: &str) -> Vec<(String, String)> {
    let rest = challenge.trim_start();
    let rest = rest.split_once(char::is_whitespace).map_or("", |(_, r)| r);
    let mut out = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let value: String = if chars.peek() == Some(&'"') {
            chars.next();
            let mut v = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => v.extend(chars.next()),
                    '"' => break,
                    c => v.push(c),
                }
            }
            v
        } else {
            chars.by_ref().take_while(|c| *c != ',').collect()
        };
        out.push((key.trim().to_ascii_lowercase(), value));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_is_read_with_quotes_and_commas() {
        let p = challenge_params(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            p,
            vec![
                ("realm".into(), "https://auth.example/token".into()),
                ("service".into(), "registry.example".into()),
                ("scope".into(), "repository:a/b:pull,push".into()),
            ]
        );
        assert!(challenge_params("Basic").is_empty());
    }
}
