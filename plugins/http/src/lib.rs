//! The built-in `http` probe, through the host's probe transport.
//!
//! By default it behaves as the kubelet's `httpGet`: GET, success when
//! 200 ≤ status < 400, redirects to the same host followed (at most 10), a
//! redirect to another host not followed and reported as `warning`,
//! `User-Agent: sonde/<version>`, at most 10 KiB of body read, and the body
//! never shown unless `show_body` is set. On request it checks like
//! blackbox_exporter: method and body, expected statuses, body and header
//! regexes, JSON fields, and a response-time warning threshold.
//!
//! `https://` goes through the host's TLS client. Unlike the kubelet, which
//! skips certificate checks, the server is verified against the system's
//! roots, or a CA from `ca_file` / `ca_pem`; `insecure_skip_verify` turns
//! checks off. `keepalive` takes connections from the host's shared pool.
//! HTTP/2 is offered to `https://` servers, as blackbox_exporter does;
//! `enable_http2: false` keeps to HTTP/1.1.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod status;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;
use serde::Deserialize;
use sonde_regex::Regex;
use sonde_sdk::http::{HttpRequest, HttpResponse, send_keeping};
use sonde_sdk::tls::TlsOptions;
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

const USER_AGENT: &str = concat!("sonde/", env!("CARGO_PKG_VERSION"));
const MAX_REDIRECTS: usize = 10;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_path")]
    path: String,
    #[serde(default = "default_method")]
    method: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: String,
    /// Codes (`200`) and ranges (`"200-299"`); default 200–399.
    #[serde(default)]
    expected_status: Vec<StatusSpec>,
    body_regex: Option<String>,
    body_not_regex: Option<String>,
    #[serde(default)]
    header_regex: BTreeMap<String, String>,
    /// Header name to a regex none of its values may match.
    #[serde(default)]
    header_not_regex: BTreeMap<String, String>,
    /// Headers of `header_regex` and `header_not_regex` whose absence passes.
    #[serde(default)]
    header_allow_missing: Vec<String>,
    /// Follow redirects to the same origin (default); false: a redirect is the answer.
    #[serde(default = "default_true")]
    follow_redirects: bool,
    /// A body longer than this many bytes fails the probe.
    body_size_limit: Option<usize>,
    /// `{"status.db": "ok"}`: dotted paths into a JSON body and the values they must equal.
    #[serde(default)]
    json: BTreeMap<String, serde_json::Value>,
    /// A response slower than this is a warning (`"500ms"`).
    warn_after: Option<String>,
    #[serde(default)]
    show_body: bool,
    #[serde(default = "default_max_body")]
    max_body: usize,
    /// `http` or `https`, for a `host:port` target (a URL target names its own).
    #[serde(default)]
    scheme: Scheme,
    /// A PEM file of CAs to trust instead of the system's roots (needs a `files` grant).
    ca_file: Option<String>,
    /// PEM text of CAs to trust instead of the system's roots.
    ca_pem: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
    /// The name to send as SNI and to verify, instead of the URL's host.
    server_name: Option<String>,
    /// Reuse connections from the host's keep-alive pool.
    #[serde(default)]
    keepalive: bool,
    /// Offer HTTP/2 to an `https://` server (blackbox_exporter's
    /// `enable_http2`, on by default as there).
    #[serde(default = "default_true")]
    enable_http2: bool,
    /// Require the answer to come from one backend behind a balancer.
    backend: Option<Backend>,
    /// HTTP basic authentication; the password is usually a secret's
    /// handle, `$(secret:NAME)`, which the host fills in.
    basic_auth: Option<BasicAuth>,
    /// `Authorization: Bearer <token>`; usually a handle.
    bearer_token: Option<String>,
    /// A client certificate (mTLS) for an `https://` target.
    client_cert: Option<sonde_sdk::credentials::ClientCert>,
}

/// Has the host present `spec` in every handshake with the host and port
/// of `url` (an `https://` URL) in this run.
fn present_client_cert(url: &str, spec: &sonde_sdk::credentials::ClientCert) -> Result<(), ProbeError> {
    let Some(rest) = url.strip_prefix("https://") else {
        return Err(ProbeError::invalid_config(
            "client_cert needs an https:// target (scheme: https)",
        ));
    };
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    // No port (or a bare IPv6 address in brackets): https's.
    let (host, port) = match authority.ends_with(']') {
        false => sonde_sdk::net::host_port(authority)
            .unwrap_or((authority.trim_start_matches('[').trim_end_matches(']'), 443)),
        true => (authority.trim_start_matches('[').trim_end_matches(']'), 443),
    };
    spec.present(host, port)
}

/// `basic_auth`: the `Authorization: Basic` header, built by the host from
/// handles (`$(base64:USER:$(secret:NAME))`), so the plugin never holds
/// the password.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BasicAuth {
    username: String,
    password: String,
}

/// The `Authorization` header `basic_auth` or `bearer_token` asks for.
fn authorization(config: &Config) -> Result<Option<String>, ProbeError> {
    let explicit = config.headers.keys().any(|k| k.eq_ignore_ascii_case("authorization"));
    match (&config.basic_auth, &config.bearer_token) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(ProbeError::invalid_config("give basic_auth or bearer_token, not both")),
        _ if explicit => Err(ProbeError::invalid_config(
            "an Authorization header is given in headers and by basic_auth or bearer_token; give one",
        )),
        (Some(b), None) => {
            if b.username.contains([':', ')']) {
                return Err(ProbeError::invalid_config(
                    "basic_auth.username: `:` and `)` cannot be part of a basic-auth user name",
                ));
            }
            let handle = b.password.starts_with("$(secret:") && b.password.find(')') == Some(b.password.len() - 1);
            if !handle && b.password.contains(')') {
                return Err(ProbeError::invalid_config(
                    "basic_auth.password: a password with `)` must come from a secret ($(secret:NAME))",
                ));
            }
            Ok(Some(format!("Basic $(base64:{}:{})", b.username, b.password)))
        }
        (None, Some(token)) => Ok(Some(format!("Bearer {token}"))),
    }
}

/// `backend`: which backend behind a balancer (a Kubernetes Service) must
/// answer. Each attempt is a fresh connection, so the balancer picks anew;
/// a response whose `header` equals `equals` came from the backend wanted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Backend {
    /// The response header that names the backend that answered (`Pod-IPv4`).
    header: String,
    /// Its value when the wanted backend answered (the Pod's IP).
    equals: String,
    /// Fresh connections per run, at most.
    #[serde(default = "default_attempts")]
    attempts: u32,
    /// What a response without `header` means: `pass` (cannot verify, as
    /// an older server that does not send it) or `fail`.
    #[serde(default)]
    missing: Missing,
}

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Missing {
    #[default]
    Pass,
    Fail,
}

fn default_attempts() -> u32 {
    3
}

/// Attempts per run, at most: each is a connection, and a call may open
/// at most 64 (`sandbox.sockets_per_call`'s default), redirects included.
const MAX_ATTEMPTS: u32 = 60;

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Scheme {
    #[default]
    Http,
    Https,
}

fn default_path() -> String {
    "/".into()
}
fn default_method() -> String {
    "GET".into()
}
fn default_true() -> bool {
    true
}
fn default_max_body() -> usize {
    10 * 1024
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StatusSpec {
    Code(u16),
    Range(String),
}

impl StatusSpec {
    fn range(&self) -> Result<(u16, u16), ProbeError> {
        match self {
            Self::Code(c) => Ok((*c, *c)),
            Self::Range(r) => {
                let bad = || ProbeError::invalid_config(format!("expected_status {r:?}: expected CODE or LOW-HIGH"));
                let (lo, hi) = r.split_once('-').ok_or_else(bad)?;
                let (lo, hi) = (
                    lo.trim().parse().map_err(|_| bad())?,
                    hi.trim().parse().map_err(|_| bad())?,
                );
                if lo > hi {
                    return Err(bad());
                }
                Ok((lo, hi))
            }
        }
    }
}

const SCHEMA: &str = include_str!("schema.json");

fn regex(field: &str, pattern: &str) -> Result<Regex, ProbeError> {
    sonde_regex::compile(pattern).map_err(|e| ProbeError::invalid_config(format!("{field} {pattern:?}: {e}")))
}

/// The URL to request: the target as a URL, or `SCHEME://TARGET` plus `path`.
fn url_for(target: &str, path: &str, scheme: Scheme) -> String {
    if target.contains("://") {
        let after = target.split_once("://").map_or("", |(_, r)| r);
        if after.contains('/') || path == "/" {
            target.to_string()
        } else {
            format!("{target}{path}")
        }
    } else {
        let scheme = match scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!("{scheme}://{target}{path}")
    }
}

/// `scheme://authority` of an absolute URL.
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    let end = url[after..].find(['/', '?']).map_or(url.len(), |i| after + i);
    &url[..end]
}

/// The path and query of an absolute URL (`/` when it has none).
fn path(url: &str) -> &str {
    match &url[origin(url).len()..] {
        "" => "/",
        rest => rest,
    }
}

/// Resolves a `Location` against the URL it came from.
fn resolve(base: &str, location: &str) -> String {
    if location.contains("://") {
        location.to_string()
    } else if location.starts_with("//") {
        let scheme = base.split_once("://").map_or("http", |(s, _)| s);
        format!("{scheme}:{location}")
    } else if location.starts_with('/') {
        format!("{}{location}", origin(base))
    } else {
        let dir = base
            .rfind('/')
            .filter(|&i| i >= origin(base).len())
            .map_or(origin(base).to_string() + "/", |i| base[..=i].to_string());
        format!("{dir}{location}")
    }
}

fn json_at<'a>(value: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(value, |v, key| match v {
        serde_json::Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => v.get(key),
    })
}

struct Http;

impl Probe for Http {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "HTTP check with the kubelet's semantics by default and blackbox_exporter-grade validations."
                .into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let checks = Checks::new(&config)?;
        let backend = config.backend.as_ref().map(|b| b.validate(&config)).transpose()?;

        let mut headers: Vec<(String, String)> = config.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("user-agent")) {
            headers.push(("User-Agent".into(), USER_AGENT.into()));
        }
        if let Some(value) = authorization(&config)? {
            headers.push(("Authorization".into(), value));
        }
        let tls = TlsOptions::from_config(
            config.ca_file.as_deref(),
            config.ca_pem.as_deref(),
            config.insecure_skip_verify,
            config.server_name.as_deref(),
        )?;
        let url = url_for(req.target(), &config.path, config.scheme);
        if let Some(spec) = &config.client_cert {
            present_client_cert(&url, spec)?;
        }
        let mut request = HttpRequest {
            method: config.method.to_ascii_uppercase(),
            url,
            headers,
            body: config.body.as_bytes().to_vec(),
            // The call's deadline bounds the exchange, so a slow server
            // is recorded by the host as reason `timeout`.
            timeout: req.timeout(),
            // One byte past the limit tells a body over it.
            max_body: config
                .body_size_limit
                .map_or(config.max_body, |limit| config.max_body.max(limit.saturating_add(1))),
            tls,
            keepalive: config.keepalive,
            http2: config.enable_http2,
        };
        // The headers the checks read: the host returns no others.
        let keep: Vec<&str> = core::iter::once("location")
            .chain(checks.header_regex.iter().map(|(name, _, _)| name.as_str()))
            .chain(backend.iter().map(|b| b.header.as_str()))
            .collect();
        match backend {
            None => Ok(match exchange(&mut request, &keep, config.follow_redirects)? {
                Exchange::Answered(response, total) => checks.judge(&config, &request, &response, total),
                Exchange::Unreachable(message) => unreachable(message),
                Exchange::Elsewhere(outcome) => outcome,
            }),
            Some(backend) => backend.attempt(&config, &checks, &request, &keep),
        }
    }
}

/// The checks a response must pass, parsed from the config once per run.
struct Checks {
    expected: Vec<(u16, u16)>,
    body_regex: Option<Regex>,
    body_not_regex: Option<Regex>,
    /// Lower-case name, regex, and whether the regex must match (`false`:
    /// must not); each with its absence allowed or not.
    header_regex: Vec<(String, Regex, HeaderRule)>,
    warn_after: Option<Duration>,
}

/// How one header regex judges a response.
#[derive(Clone, Copy)]
struct HeaderRule {
    /// Some value must match (`header_regex`), or none may (`header_not_regex`).
    must_match: bool,
    /// A response without the header passes.
    allow_missing: bool,
}

impl Checks {
    fn new(config: &Config) -> Result<Self, ProbeError> {
        let expected = if config.expected_status.is_empty() {
            vec![(200, 399)]
        } else {
            config
                .expected_status
                .iter()
                .map(StatusSpec::range)
                .collect::<Result<_, _>>()?
        };
        let body_regex = config
            .body_regex
            .as_deref()
            .map(|p| regex("body_regex", p))
            .transpose()?;
        let body_not_regex = config
            .body_not_regex
            .as_deref()
            .map(|p| regex("body_not_regex", p))
            .transpose()?;
        let header_regex = header_rules(config)?;
        let warn_after = config
            .warn_after
            .as_deref()
            .map(|d| {
                sonde_sdk::duration::parse(d).map_err(|e| ProbeError::invalid_config(format!("warn_after {d:?}: {e}")))
            })
            .transpose()?;
        Ok(Self {
            expected,
            body_regex,
            body_not_regex,
            header_regex,
            warn_after,
        })
    }

    /// The outcome of a response that came back, with its metrics.
    fn judge(&self, config: &Config, request: &HttpRequest, response: &HttpResponse, total: Duration) -> Outcome {
        let (method, url) = (&request.method, &request.url);
        let status = response.status;
        let mut outcome = verdict(
            config,
            request,
            &self.expected,
            response,
            self.body_regex.as_ref(),
            self.body_not_regex.as_ref(),
            &self.header_regex,
        )
        .unwrap_or_else(|| Outcome::success(format!("{method} {url}: {status}")));
        if outcome.status == sonde_sdk::Status::Success
            && let Some(limit) = self.warn_after
            && total > limit
        {
            outcome = Outcome::warning(format!(
                "{method} {url}: {status} in {}ms, slower than {}ms",
                total.as_millis(),
                limit.as_millis()
            ));
        }
        if config.show_body {
            outcome = outcome.with_detail(String::from_utf8_lossy(&response.body));
        }
        with_metrics(outcome, response, total)
    }
}

/// How one exchange (a request and the redirects it follows) ended.
enum Exchange {
    /// A response that is not a redirect to follow, and the time of all hops.
    Answered(HttpResponse, Duration),
    /// No response: the connection or the exchange failed (the message).
    Unreachable(String),
    /// A redirect to another host, which is not followed: the outcome.
    Elsewhere(Outcome),
}

/// Sends `request`, following redirects to the same origin (at most
/// [`MAX_REDIRECTS`]); `request` ends as the last one sent.
fn exchange(request: &mut HttpRequest, keep: &[&str], follow: bool) -> Result<Exchange, ProbeError> {
    let mut total = Duration::ZERO;
    let mut hops = 0;
    loop {
        let response = match send_keeping(request, keep) {
            Ok(r) => r,
            Err(ProbeError::Io(m)) => {
                return Ok(Exchange::Unreachable(format!(
                    "{} {}: {m}",
                    request.method, request.url
                )));
            }
            Err(e) => return Err(e),
        };
        total += Duration::from_secs_f64(response.timings.total);
        let location = response.header("location").map(str::to_string);
        match (response.status, location) {
            (301 | 302 | 303 | 307 | 308, Some(location)) if follow && hops < MAX_REDIRECTS => {
                let next = resolve(&request.url, &location);
                if origin(&next) != origin(&request.url) {
                    // As the kubelet: another host is not followed, and says so.
                    return Ok(Exchange::Elsewhere(with_metrics(
                        Outcome::warning(format!(
                            "{} redirect to another host not followed: {next}",
                            response.status
                        )),
                        &response,
                        total,
                    )));
                }
                if matches!(response.status, 301..=303) {
                    request.method = "GET".into();
                    request.body.clear();
                }
                request.url = next;
                hops += 1;
            }
            _ => return Ok(Exchange::Answered(response, total)),
        }
    }
}

impl Backend {
    fn validate(&self, config: &Config) -> Result<&Self, ProbeError> {
        if config.keepalive {
            return Err(ProbeError::invalid_config(
                "backend: each attempt needs a fresh connection, so not with keepalive: true",
            ));
        }
        if self.header.trim().is_empty() {
            return Err(ProbeError::invalid_config("backend.header is empty"));
        }
        if self.equals.trim().is_empty() {
            return Err(ProbeError::invalid_config(
                "backend.equals is empty: nothing would name the backend wanted",
            ));
        }
        if !(1..=MAX_ATTEMPTS).contains(&self.attempts) {
            return Err(ProbeError::invalid_config(format!(
                "backend.attempts {}: from 1 to {MAX_ATTEMPTS}",
                self.attempts
            )));
        }
        Ok(self)
    }

    /// Up to `attempts` fresh exchanges, until the wanted backend answers
    /// (its response judged as any) or a response cannot say who answered.
    fn attempt(
        &self,
        config: &Config,
        checks: &Checks,
        base: &HttpRequest,
        keep: &[&str],
    ) -> Result<Outcome, ProbeError> {
        let mut tally = Tally::default();
        let mut spent = Duration::ZERO;
        for attempt in 1..=self.attempts {
            let Some(left) = base.timeout.checked_sub(spent).filter(|d| !d.is_zero()) else {
                break;
            };
            let mut request = base.clone();
            request.timeout = left;
            let (response, total) = match exchange(&mut request, keep, config.follow_redirects)? {
                Exchange::Answered(response, total) => (response, total),
                Exchange::Unreachable(message) => {
                    tally.log.push(format!("attempt {attempt}: {message}"));
                    tally.unreachable += 1;
                    tally.last_error = Some(message);
                    continue;
                }
                Exchange::Elsewhere(outcome) => return Ok(tally.finish(outcome, attempt)),
            };
            spent += total;
            let status = response.status;
            let (outcome, who) = match response.header(&self.header).map(str::trim) {
                Some(who) if who == self.equals.trim() => (checks.judge(config, &request, &response, total), who),
                Some(other) => {
                    tally
                        .log
                        .push(format!("attempt {attempt}: answered by {other} ({status})"));
                    tally.add_other(other);
                    continue;
                }
                None if self.missing == Missing::Fail => {
                    let message = format!(
                        "cannot verify the backend: the response ({status}) has no {} header",
                        self.header
                    );
                    tally.log.push(format!("attempt {attempt}: {message}"));
                    return Ok(tally.finish(with_metrics(Outcome::failure(message), &response, total), attempt));
                }
                None => {
                    let judged = checks.judge(config, &request, &response, total);
                    let message = format!("{}; backend not verified (no {} header)", judged.message, self.header);
                    tally
                        .log
                        .push(format!("attempt {attempt}: no {} header ({status})", self.header));
                    return Ok(tally.finish(Outcome { message, ..judged }, attempt));
                }
            };
            tally
                .log
                .push(format!("attempt {attempt}: answered by {who} ({status})"));
            let message = format!(
                "{} from this backend ({}: {who}, attempt {attempt})",
                outcome.message, self.header
            );
            return Ok(tally.finish(Outcome { message, ..outcome }, attempt));
        }
        let attempts = tally.log.len() as u32;
        let mut message = format!(
            "not routed to this backend ({}: {}) in {attempts} attempts",
            self.header, self.equals
        );
        if !tally.others.is_empty() {
            let who: Vec<String> = tally.others.iter().map(|(ip, n)| format!("{ip} ×{n}")).collect();
            message.push_str(&format!("; answered by {}", who.join(", ")));
        }
        if let Some(last) = &tally.last_error {
            message.push_str(&format!("; {} failed, the last: {last}", tally.unreachable));
        }
        Ok(tally.finish(Outcome::failure(message), attempts))
    }
}

/// What the attempts of one run saw.
#[derive(Default)]
struct Tally {
    /// One entry per attempt: the outcome's detail, `; `-separated (the
    /// host escapes newlines in a plugin's text).
    log: Vec<String>,
    /// Other backends that answered, each with its count, in order seen.
    others: Vec<(String, u32)>,
    unreachable: u32,
    last_error: Option<String>,
}

impl Tally {
    fn add_other(&mut self, who: &str) {
        match self.others.iter_mut().find(|(ip, _)| ip == who) {
            Some((_, n)) => *n += 1,
            None => self.others.push((who.to_string(), 1)),
        }
    }

    fn finish(self, outcome: Outcome, attempts: u32) -> Outcome {
        let detail = match outcome.detail.as_deref() {
            Some(body) => format!("{}; body: {body}", self.log.join("; ")),
            None => self.log.join("; "),
        };
        outcome
            .with_detail(detail)
            .with_metric("backend_attempts", f64::from(attempts), "")
    }
}

/// The first check that fails, as a failure; `None` when all pass.
fn verdict(
    config: &Config,
    request: &HttpRequest,
    expected: &[(u16, u16)],
    response: &HttpResponse,
    body_regex: Option<&Regex>,
    body_not_regex: Option<&Regex>,
    header_regex: &[(String, Regex, HeaderRule)],
) -> Option<Outcome> {
    let status = response.status;
    if !expected.iter().any(|(lo, hi)| (*lo..=*hi).contains(&status)) {
        // As a person reads it (`GET /ready: 503 Service Unavailable`, what
        // a Pod's condition and Event say); the metric sorts the failure's
        // cause as `status` (docs/prometheus.md).
        let line = status::status_line(status);
        let message = format!("{} {}: {line}", request.method, path(&request.url));
        return Some(Outcome::failure(message).with_metric("failed_due_to_status", 1.0, ""));
    }
    if let Some(limit) = config.body_size_limit
        && response.body.len() > limit
    {
        return Some(Outcome::failure(format!(
            "status {status}, but the body is longer than body_size_limit ({limit} bytes)"
        )));
    }
    let body = String::from_utf8_lossy(&response.body);
    if let Some(re) = body_regex
        && !re.is_match(&body)
    {
        return Some(regex_failed(Outcome::failure(format!(
            "status {status}, but the body does not match /{}/",
            re.as_str()
        ))));
    }
    if let Some(re) = body_not_regex
        && re.is_match(&body)
    {
        return Some(regex_failed(Outcome::failure(format!(
            "status {status}, but the body matches /{}/",
            re.as_str()
        ))));
    }
    for (name, re, rule) in header_regex {
        if let Some(failure) = header_verdict(response, name, re, *rule) {
            return Some(regex_failed(Outcome::failure(failure)));
        }
    }
    if !config.json.is_empty() {
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&response.body) else {
            return Some(Outcome::failure(format!("status {status}, but the body is not JSON")));
        };
        for (path, want) in &config.json {
            match json_at(&doc, path) {
                Some(got) if got == want => {}
                Some(got) => return Some(Outcome::failure(format!("JSON {path} is {got}, expected {want}"))),
                None => return Some(Outcome::failure(format!("JSON {path} is missing"))),
            }
        }
    }
    None
}

/// The header regexes of `header_regex` and `header_not_regex`, within
/// what the host returns (`location`, these and the backend's header).
fn header_rules(config: &Config) -> Result<Vec<(String, Regex, HeaderRule)>, ProbeError> {
    let count = config.header_regex.len() + config.header_not_regex.len();
    let room = sonde_sdk::http::MAX_KEPT_HEADERS - 1 - usize::from(config.backend.is_some());
    if count > room {
        return Err(ProbeError::invalid_config(format!(
            "header_regex and header_not_regex: {count} headers, at most {room}"
        )));
    }
    let allowed = |h: &str| config.header_allow_missing.iter().any(|a| a.eq_ignore_ascii_case(h));
    let mut rules = Vec::with_capacity(count);
    for (field, map, must_match) in [
        ("header_regex", &config.header_regex, true),
        ("header_not_regex", &config.header_not_regex, false),
    ] {
        for (h, p) in map {
            let rule = HeaderRule {
                must_match,
                allow_missing: allowed(h),
            };
            rules.push((h.to_ascii_lowercase(), regex(&format!("{field}.{h}"), p)?, rule));
        }
    }
    Ok(rules)
}

/// Why header `name` fails `re` under `rule`, or `None`: as
/// blackbox_exporter, some value must match (or none may).
fn header_verdict(response: &HttpResponse, name: &str, re: &Regex, rule: HeaderRule) -> Option<String> {
    let mut values = response
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| String::from_utf8_lossy(v))
        .peekable();
    if values.peek().is_none() {
        return (!rule.allow_missing).then(|| format!("header {name} is missing"));
    }
    let matched = values.any(|v| re.is_match(&v));
    match (rule.must_match, matched) {
        (true, false) => Some(format!("header {name} does not match /{}/", re.as_str())),
        (false, true) => Some(format!("header {name} matches /{}/", re.as_str())),
        _ => None,
    }
}

/// A failure because no answer came: at the deadline, marked with the
/// metric `failed_due_to_timeout` (1), which sorts its cause as `timeout`
/// (docs/prometheus.md); otherwise the host saw why (no address, no
/// connection, a TLS handshake).
fn unreachable(message: String) -> Outcome {
    let timed_out = sonde_sdk::net::is_timeout(&message);
    let outcome = Outcome::failure(message);
    if timed_out {
        outcome.with_metric("failed_due_to_timeout", 1.0, "")
    } else {
        outcome
    }
}

/// A failure because a body or header regex did not hold, marked with the
/// metric `failed_due_to_regex` (1) that `/probe` answers as blackbox's
/// `probe_failed_due_to_regex`.
fn regex_failed(outcome: Outcome) -> Outcome {
    outcome.with_metric("failed_due_to_regex", 1.0, "")
}

fn with_metrics(outcome: Outcome, response: &HttpResponse, total: Duration) -> Outcome {
    let t = response.timings;
    let outcome = match &response.tls {
        Some(tls) => outcome.with_metric("cert_expiry_seconds", tls.expires_in_seconds(), "seconds"),
        None => outcome,
    };
    outcome
        .with_metric("status_code", f64::from(response.status), "")
        .with_metric("dns_seconds", t.dns, "seconds")
        .with_metric("connect_seconds", t.connect, "seconds")
        .with_metric("tls_seconds", t.tls, "seconds")
        .with_metric("first_byte_seconds", t.first_byte, "seconds")
        .with_metric("total_seconds", total.as_secs_f64(), "seconds")
}

sonde_sdk::export!(Http);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            url_for("127.0.0.1:80", "/healthz", Scheme::Http),
            "http://127.0.0.1:80/healthz"
        );
        assert_eq!(url_for("a:443", "/", Scheme::Https), "https://a:443/");
        assert_eq!(url_for("http://a:1/x", "/", Scheme::Https), "http://a:1/x");
        assert_eq!(url_for("http://a:1", "/y", Scheme::Http), "http://a:1/y");
        assert_eq!(origin("http://a:1/x?y"), "http://a:1");
        assert_eq!(resolve("http://a:1/x/y", "/z"), "http://a:1/z");
        assert_eq!(resolve("http://a:1/x/y", "z"), "http://a:1/x/z");
        assert_eq!(resolve("http://a:1/x", "http://b/"), "http://b/");
        assert_eq!(resolve("http://a:1/x", "//b/c"), "http://b/c");
    }

    #[test]
    fn status_specs() {
        assert_eq!(StatusSpec::Code(204).range().unwrap(), (204, 204));
        assert_eq!(StatusSpec::Range("200-299".into()).range().unwrap(), (200, 299));
        assert!(StatusSpec::Range("299-200".into()).range().is_err());
        assert!(StatusSpec::Range("2xx".into()).range().is_err());
    }

    #[test]
    fn json_paths() {
        let doc: serde_json::Value = serde_json::from_str(r#"{"status": {"db": "ok", "replicas": [1, 2]}}"#).unwrap();
        assert_eq!(json_at(&doc, "status.db"), Some(&serde_json::json!("ok")));
        assert_eq!(json_at(&doc, "status.replicas.1"), Some(&serde_json::json!(2)));
        assert_eq!(json_at(&doc, "status.nope"), None);
    }
}
