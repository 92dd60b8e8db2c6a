//! The built-in `tcp` probe: success when a TCP connection to the target
//! opens within the deadline, failure (with the reason) when it is refused,
//! unreachable or times out.
//!
//! Optional send/expect steps, like blackbox_exporter's `query_response`,
//! check what the service says: `{"send": "PING\r\n", "expect": "\\+PONG"}`
//! for one exchange, `{"steps": [{"expect": "^220"}, {"send": "QUIT\r\n"}]}`
//! for several. An `expect` reads until its regex matches what arrived since
//! the previous `expect`, the peer closes, or 64 KiB have arrived.
//! `expect_bytes` (or `expect_bytes_base64`) reads exactly its bytes and
//! compares them; `send_base64` sends bytes that are not text; `send_expand`
//! sends its text with `${1}`, `$name`… replaced by the groups of the last
//! `expect`'s match (blackbox_exporter's `query_response`).
//!
//! With `{"tls": true}` the host connects and completes a TLS handshake
//! instead (the system's roots, or `ca_file` / `ca_pem`, or
//! `insecure_skip_verify`), and the outcome reports the handshake time and
//! the seconds until the server certificate expires. Send/expect steps then
//! run over the TLS session, which the host holds for the plugin.
//!
//! A `{"starttls": true}` step upgrades the plain connection to TLS where
//! it stands (after the server agreed to SMTP's or IMAP's `STARTTLS`), with
//! the same TLS keys, and reports the same handshake metrics; the steps
//! after it run over TLS (blackbox_exporter's `starttls`).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod config;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use config::{Config, SCHEMA, Step};
use core::time::Duration;
use sonde_regex::BytesRegex as Regex;
use sonde_sdk::time::Instant;
use sonde_sdk::tls::{HandshakeError, Session, TlsOptions};
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

/// How much one `expect` reads at most.
const MAX_READ: usize = 64 * 1024;

/// Time kept back from the deadline so a reply that never matches is
/// reported by the plugin, with what arrived, rather than as a bare timeout.
const MARGIN: Duration = Duration::from_millis(50);

fn with_metrics(mut outcome: Outcome, metrics: &[(&str, f64)]) -> Outcome {
    for (name, value) in metrics {
        outcome = outcome.with_metric(*name, *value, "seconds");
    }
    outcome
}

/// Why a step stopped the exchange.
enum Stop {
    /// The target failed it: why, an excerpt of what arrived, and the
    /// blackbox_exporter metric (`failed_due_to_regex`...) it sets to 1.
    Failed(String, Option<String>, Option<&'static str>),
    /// The check could not be made.
    Probe(ProbeError),
}

impl Stop {
    fn why(why: String) -> Self {
        Self::Failed(why, None, None)
    }
}

/// What an exchange needs besides its steps: the session, and the TLS
/// options of a `starttls` step.
struct Exchange<'a> {
    req: &'a Request,
    session: &'a mut Session,
    tls: Option<&'a TlsOptions>,
    /// The metrics the outcome reports, with those of a `starttls`.
    metrics: Vec<(&'static str, f64)>,
    /// The TLS version and certificate subject after a `starttls`.
    upgraded: Option<sonde_sdk::tls::TlsInfo>,
}

/// Runs `steps` over the session: the failure of the first that fails
/// (with the metrics), or `None` when all passed.
fn exchange(x: &mut Exchange<'_>, steps: &[Step]) -> Result<Option<Outcome>, ProbeError> {
    // The last expect's regex and what it matched in.
    let mut last: Option<(&Regex, Vec<u8>)> = None;
    for (i, step) in steps.iter().enumerate() {
        match run_step(x, step, &mut last) {
            Ok(()) => {}
            Err(Stop::Probe(e)) => return Err(e),
            Err(Stop::Failed(why, detail, metric)) => {
                let mut failure = with_metrics(Outcome::failure(format!("step {}: {why}", i + 1)), &x.metrics);
                if let Some(detail) = detail {
                    failure = failure.with_detail(detail);
                }
                if let Some(metric) = metric {
                    failure = failure.with_metric(metric, 1.0, "");
                }
                return Ok(Some(failure));
            }
        }
    }
    Ok(None)
}

/// Runs one step; `last` is the last expect's regex and what it matched in.
fn run_step<'s>(x: &mut Exchange<'_>, step: &'s Step, last: &mut Option<(&'s Regex, Vec<u8>)>) -> Result<(), Stop> {
    let session = &mut *x.session;
    match step {
        Step::Send(data) => session
            .send(data)
            .map_err(|e| Stop::why(format!("send: {}", e.describe()))),
        Step::SendExpand(template) => {
            let mut data = Vec::new();
            match last {
                // The groups of the first line that matches, without its
                // end (\n or \r\n), as blackbox_exporter reads lines.
                Some((re, bytes)) => {
                    let lines = bytes.split(|b| *b == b'\n');
                    let line = lines
                        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                        .find_map(|l| re.captures(l));
                    if let Some(caps) = line {
                        caps.expand(template.as_bytes(), &mut data);
                    }
                }
                None => data.extend_from_slice(template.as_bytes()),
            }
            session
                .send(&data)
                .map_err(|e| Stop::why(format!("send: {}", e.describe())))
        }
        Step::Expect(re) => {
            let left = x.req.remaining().saturating_sub(MARGIN).max(Duration::from_millis(1));
            session.set_read_timeout(left);
            let (bytes, error) = session.read_until(MAX_READ, |buf| re.is_match(buf));
            if !re.is_match(&bytes) {
                // The peer closed without a match: what blackbox's
                // `probe_failed_due_to_regex` counts (a timeout is not).
                let closed = error.is_none() && bytes.len() < MAX_READ;
                let why = match error {
                    Some(e) => format!("{} after {} bytes", e.describe(), bytes.len()),
                    None => format!("no match in {} bytes", bytes.len()),
                };
                return Err(Stop::Failed(
                    format!("expected /{}/: {why}", re.as_str()),
                    Some(excerpt(&bytes)),
                    closed.then_some("failed_due_to_regex"),
                ));
            }
            *last = Some((re, bytes));
            Ok(())
        }
        Step::ExpectBytes(want) => {
            let left = x.req.remaining().saturating_sub(MARGIN).max(Duration::from_millis(1));
            session.set_read_timeout(left);
            let (got, error) = read_exactly(session, want.len());
            if got.len() < want.len() {
                let why = error.map_or_else(|| "the peer closed".into(), |e| e.describe());
                let why = format!("expected {} bytes: {why} after {}", want.len(), got.len());
                return Err(Stop::Failed(why, Some(excerpt(&got)), None));
            }
            if got != *want {
                // blackbox's `probe_failed_due_to_bytes`.
                let why = format!("expected the bytes {}, got {}", excerpt(want), excerpt(&got));
                return Err(Stop::Failed(why, None, Some("failed_due_to_bytes")));
            }
            Ok(())
        }
        Step::StartTls => {
            let options = x.tls.cloned().unwrap_or_default();
            let h = match session.starttls(&options, x.req.remaining()) {
                Ok(h) => h,
                Err(HandshakeError::Failed(m)) => return Err(Stop::why(format!("starttls: {m}"))),
                Err(HandshakeError::Probe(e)) => return Err(Stop::Probe(e)),
            };
            x.metrics.push(("tls_seconds", h.tls_seconds));
            x.metrics.push(("cert_expiry_seconds", h.info.expires_in_seconds()));
            x.upgraded = Some(h.info);
            Ok(())
        }
    }
}

/// Reads until `n` bytes arrived (never more: the rest is the next step's),
/// the peer closes or a read fails: what arrived, and the failure.
fn read_exactly(session: &mut Session, n: usize) -> (Vec<u8>, Option<sonde_sdk::tls::SessionError>) {
    let mut got = alloc::vec![0u8; n];
    let mut have = 0;
    while have < n {
        match session.read(&mut got[have..]) {
            Ok(0) => break,
            Ok(k) => have += k,
            Err(e) => {
                got.truncate(have);
                return (got, Some(e));
            }
        }
    }
    got.truncate(have);
    (got, None)
}

fn steps_done(steps: &[Step]) -> String {
    match steps.len() {
        0 => String::new(),
        n => format!(" and completed {n} step(s)"),
    }
}

/// The check of `{"tls": true}`: a handshake by the host, then the steps
/// over the session.
fn check_tls(req: &Request, options: &TlsOptions, steps: &[Step]) -> Result<Outcome, ProbeError> {
    let (host, port) = sonde_sdk::net::host_port(req.target())?;
    let (mut session, h) = match sonde_sdk::tls::connect(host, port, options, req.remaining()) {
        Ok(connected) => connected,
        Err(HandshakeError::Failed(m)) => return Ok(Outcome::failure(format!("{}: {m}", req.target()))),
        Err(HandshakeError::Probe(e)) => return Err(e),
    };
    let expires = h.info.expires_in_seconds();
    let mut x = Exchange {
        req,
        session: &mut session,
        tls: None,
        metrics: alloc::vec![
            ("connect_seconds", h.connect_seconds),
            ("tls_seconds", h.tls_seconds),
            ("cert_expiry_seconds", expires),
        ],
        upgraded: None,
    };
    if let Some(failure) = exchange(&mut x, steps)? {
        return Ok(failure);
    }
    let message = format!(
        "{} with {}: certificate of {} expires in {} days{}",
        h.info.version,
        req.target(),
        h.info.subject,
        whole_days(expires),
        steps_done(steps)
    );
    Ok(with_metrics(Outcome::success(message), &x.metrics).with_metric(
        "probe_seconds",
        h.dns_seconds + h.connect_seconds + h.tls_seconds,
        "seconds",
    ))
}

/// Whole days in `seconds`, rounded down (`f64::floor` is not in `core`).
fn whole_days(seconds: f64) -> f64 {
    let days = seconds / 86_400.0;
    let truncated = days as i64 as f64;
    if truncated > days { truncated - 1.0 } else { truncated }
}

/// A short, printable excerpt of bytes that arrived.
fn excerpt(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .take(256)
        .flat_map(|b| core::ascii::escape_default(*b))
        .map(char::from)
        .collect();
    if bytes.len() > 256 { format!("{text}…") } else { text }
}

struct Tcp;

impl Probe for Tcp {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description:
                "Opens a TCP connection to the target within the probe timeout, optionally with send/expect steps."
                    .into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let tls = config.tls_options()?;
        if let Some(spec) = &config.client_cert {
            let (host, port) = sonde_sdk::net::host_port(req.target())?;
            spec.present(host, port)?;
        }
        let over_tls = config.tls;
        let steps = config::steps(config)?;
        let starttls = match tls {
            Some(options) if over_tls => return check_tls(&req, &options, &steps),
            starttls => starttls,
        };
        let start = Instant::now();
        // The host dials: no socket stack in the sandbox, and a reset at
        // the end instead of a FIN and a TIME_WAIT.
        let (host, port) = sonde_sdk::net::host_port(req.target())?;
        let (mut stream, connected) = match sonde_sdk::tcp::connect(host, port, req.remaining()) {
            Ok(c) => c,
            Err(HandshakeError::Failed(m)) => return Ok(Outcome::failure(format!("{}: {m}", req.target()))),
            Err(HandshakeError::Probe(e)) => return Err(e),
        };
        let mut x = Exchange {
            req: &req,
            session: &mut stream,
            tls: starttls.as_ref(),
            metrics: alloc::vec![("connect_seconds", connected.connect_seconds)],
            upgraded: None,
        };
        if let Some(failure) = exchange(&mut x, &steps)? {
            return Ok(failure);
        }
        let tls = x.upgraded.as_ref().map_or_else(String::new, |i| {
            format!(
                " ({} by STARTTLS: certificate of {} expires in {} days)",
                i.version,
                i.subject,
                whole_days(i.expires_in_seconds())
            )
        });
        let message = format!("connected to {}{}{tls}", req.target(), steps_done(&steps));
        Ok(with_metrics(Outcome::success(message), &x.metrics).with_metric(
            "probe_seconds",
            start.elapsed().as_secs_f64(),
            "seconds",
        ))
    }
}

sonde_sdk::export!(Tcp);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_round_down() {
        assert_eq!(whole_days(89.9 * 86_400.0), 89.0);
        assert_eq!(whole_days(-0.5 * 86_400.0), -1.0);
        assert_eq!(whole_days(0.0), 0.0);
        assert_eq!(whole_days(-2.0 * 86_400.0), -2.0);
    }

    #[test]
    fn excerpts_are_printable() {
        assert_eq!(excerpt(b"+PONG\r\n"), "+PONG\\r\\n");
        assert!(excerpt(&[0u8; 300]).ends_with('…'));
    }
}
