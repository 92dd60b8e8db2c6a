//! The answer of `GET /probe` ([`super::scrape`]): blackbox_exporter's
//! series, named, labelled and valued as blackbox_exporter 0.28 answers
//! for the same case (and 0.23 but for the series 0.28 added), beside
//! sonde's own.
//!
//! Every blackbox series is taken from one of two places, here and nowhere
//! else (docs/prometheus.md has the table):
//!
//! - what the host saw of the run's connections ([`Observed`]): the
//!   address and its lookup, the phase timings, the HTTP status, version,
//!   lengths and redirects, the TLS version and the certificates served,
//!   the gRPC status. Which of `http`, `grpc` or `tcp`/`tls` the plugin
//!   used picks the prober whose series are answered.
//! - what only the plugin knows, which it reports as a metric of a
//!   well-known name: [`REGEX_METRIC`] (a body, header or `expect` regex
//!   failed), [`BYTES_METRIC`] (expected bytes did not come) and
//!   [`SERVING_METRIC`] (the gRPC health status).
//!
//! The families are sorted by name, each with its `HELP` and `TYPE`
//! (every one a gauge), and a family's series by their labels.

mod cert;
mod tls;

use sonde_sandbox::verdict::observed::{GrpcSeen, HttpSeen, IcmpSeen, Observed};
use sonde_sandbox::verdict::{RunResult, Status};
use std::fmt::Write;
use std::net::IpAddr;
use std::time::Duration;
use tls::{Prober, tls_series};

// The metric a plugin reports (1) when a regex over the answer failed
// (blackbox's `probe_failed_due_to_regex`), and the one the gRPC plugin
// reports with the health status's number
// (`grpc.health.v1.HealthCheckResponse.ServingStatus`): the sandbox's,
// which sorts a failure's cause by them too.
pub(crate) use sonde_sandbox::verdict::{REGEX_METRIC, SERVING_METRIC};

/// The metric a plugin reports (1) when bytes it expected were not the
/// ones that came: blackbox's `probe_failed_due_to_bytes` (tcp).
pub(crate) const BYTES_METRIC: &str = "failed_due_to_bytes";

/// The metric a DNS check reports (1 when a reply to its query came, 0
/// when none did): blackbox's `probe_dns_query_succeeded`, and what makes
/// the answer the dns prober's.
pub(crate) const DNS_METRIC: &str = "query_succeeded";

/// The health statuses, by their number on the wire.
const SERVING_STATUSES: [&str; 4] = ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"];

/// The gRPC status a call that got no answer counts as: `UNAVAILABLE`.
const GRPC_UNAVAILABLE: u32 = 14;

/// One metric family: its name, help, and series (rendered labels, value).
struct Family {
    name: &'static str,
    help: &'static str,
    series: Vec<(String, f64)>,
}

/// The families of one answer.
#[derive(Default)]
struct Answer(Vec<Family>);

impl Answer {
    /// Adds the series `name{labels} value`, in a family of its own or
    /// after the family's others.
    fn add(&mut self, name: &'static str, help: &'static str, labels: &[(&str, &str)], value: f64) {
        let mut text = String::new();
        if !labels.is_empty() {
            text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                let _ = write!(text, "{k}=\"{}\"", escape(v));
            }
            text.push('}');
        }
        match self.0.iter_mut().find(|f| f.name == name) {
            Some(f) => f.series.push((text, value)),
            None => self.0.push(Family {
                name,
                help,
                series: vec![(text, value)],
            }),
        }
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, value: f64) {
        self.add(name, help, &[], value);
    }

    fn render(mut self) -> String {
        self.0.sort_by(|a, b| a.name.cmp(b.name));
        for f in &mut self.0 {
            f.series.sort_by(|a, b| a.0.cmp(&b.0));
        }
        let mut out = String::with_capacity(2048);
        for f in &self.0 {
            let _ = writeln!(out, "# HELP {} {}\n# TYPE {} gauge", f.name, f.help, f.name);
            for (labels, value) in &f.series {
                let _ = writeln!(out, "{}{labels} {}", f.name, Number(*value));
            }
        }
        out
    }
}

/// Escapes a label value for the text format (borrowed when nothing needs
/// escaping, as nearly every value).
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if value.contains(['\\', '"', '\n']) {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        value.into()
    }
}

/// A sample value as the text format spells it.
struct Number(f64);

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            v if v.is_nan() => f.write_str("NaN"),
            v if v.is_infinite() && v > 0.0 => f.write_str("+Inf"),
            v if v.is_infinite() => f.write_str("-Inf"),
            v => write!(f, "{v}"),
        }
    }
}

/// The answer's metrics: `probe_success`, `probe_duration_seconds`,
/// blackbox's series for what the run did, and sonde's own
/// (`sonde_probe_outcome`, the plugin's measurements in base units).
pub(crate) fn exposition(result: &RunResult, took: Duration) -> String {
    let mut a = Answer::default();
    let success = matches!(result.status, Status::Success | Status::Warning);
    a.gauge(
        "probe_success",
        "Whether the probe succeeded (1) or not (0)",
        f64::from(u8::from(success)),
    );
    a.gauge(
        "probe_duration_seconds",
        "How long the probe took, admission and queueing included",
        took.as_secs_f64(),
    );
    a.add(
        "sonde_probe_outcome",
        "The probe's status and, when it did not end with the plugin's verdict, why",
        &[
            ("status", result.status.as_str()),
            ("reason", result.reason.map_or("", |r| r.as_str())),
        ],
        1.0,
    );
    if let Some(cause) = result.cause() {
        a.add(
            "sonde_probe_failure_cause",
            "1 when the probe failed, labelled with why (one of 15 causes)",
            &[("cause", cause.as_str())],
            1.0,
        );
    }
    for m in result.metrics.iter().take(sonde_core::metrics::MAX_PLUGIN_SERIES) {
        let (value, unit) = sonde_core::metrics::base_unit(m.value, &m.unit);
        a.add(
            "sonde_probe_metric",
            "A measurement the plugin returned, in base units",
            &[("metric", &m.name), ("unit", &unit)],
            value,
        );
    }
    if let Some(o) = &result.observed {
        blackbox(&mut a, result, o);
    }
    a.render()
}

/// The plugin's metric `name`, if it reported one.
fn metric(result: &RunResult, name: &str) -> Option<f64> {
    result.metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

/// blackbox's series for what the host observed, by the prober the plugin
/// acted as: `dns` (a plugin that reports [`DNS_METRIC`], whatever
/// transport it used), `icmp`, `http`, `grpc`, or `tcp` (for `tcp` and
/// `tls`).
fn blackbox(a: &mut Answer, result: &RunResult, o: &Observed) {
    let flag = |name| metric(result, name).map_or(0.0, |v| if v > 0.0 { 1.0 } else { 0.0 });
    let regex = flag(REGEX_METRIC);
    // Whether the address is known: the phases past `resolve` are answered.
    let resolved = o.first_lookup.is_none_or(|l| l.found);
    if let Some(succeeded) = metric(result, DNS_METRIC) {
        dns(a, o, result, succeeded);
    } else if let Some(i) = &o.icmp {
        icmp(a, o, i);
    } else if let Some(h) = &o.http {
        http(a, o, h, regex, resolved);
    } else if let Some(g) = &o.grpc {
        grpc(a, o, g, metric(result, SERVING_METRIC), resolved);
    } else if o.tcp {
        tcp(a, o, regex, flag(BYTES_METRIC));
    }
}

/// The http prober's series.
fn http(a: &mut Answer, o: &Observed, h: &HttpSeen, regex: f64, resolved: bool) {
    address(a, o);
    a.gauge(
        "probe_failed_due_to_regex",
        "Whether a regex over the answer failed (1) or not (0)",
        regex,
    );
    const PHASES: &str = "Time spent in each phase of the HTTP exchange, summed over its redirects";
    let phase = |a: &mut Answer, p: &str, d: Duration| {
        a.add("probe_http_duration_seconds", PHASES, &[("phase", p)], d.as_secs_f64());
    };
    phase(a, "resolve", o.dns);
    if resolved {
        // A handshake that failed leaves no connection to time, as
        // blackbox (Go's client) reports it.
        let connect = if h.handshake_failed && h.responses == 0 {
            Duration::ZERO
        } else {
            o.connect
        };
        phase(a, "connect", connect);
        phase(a, "tls", o.handshake);
        phase(a, "processing", h.processing);
        phase(a, "transfer", h.transfer);
    }
    a.gauge(
        "probe_http_status_code",
        "The status of the last HTTP response, 0 when none came",
        f64::from(h.status),
    );
    a.gauge(
        "probe_http_version",
        "The HTTP version of the last response (1.1, 2), 0 when none came",
        f64::from(h.version.0) + f64::from(h.version.1) / 10.0,
    );
    a.gauge(
        "probe_http_content_length",
        "The Content-Length of the last response, -1 when it had none",
        h.content_length as f64,
    );
    a.gauge(
        "probe_http_uncompressed_body_length",
        "Bytes of the last response's body read",
        h.body_bytes as f64,
    );
    a.gauge(
        "probe_http_redirects",
        "How many responses were redirects",
        f64::from(h.redirects),
    );
    a.gauge(
        "probe_http_ssl",
        "Whether the last response came over TLS (1) or not (0)",
        f64::from(u8::from(h.ssl)),
    );
    if let Some(t) = h.last_modified {
        a.gauge(
            "probe_http_last_modified_timestamp_seconds",
            "The last response's Last-Modified, in Unix seconds",
            t as f64,
        );
    }
    if h.ssl
        && let Some(tls) = &o.tls
    {
        tls_series(a, tls, Prober::Http);
    }
}

/// The grpc prober's series; `serving` is the plugin's health status.
fn grpc(a: &mut Answer, o: &Observed, g: &GrpcSeen, serving: Option<f64>, resolved: bool) {
    address(a, o);
    const PHASES: &str = "Time spent in each phase of the gRPC health check";
    a.add(
        "probe_grpc_duration_seconds",
        PHASES,
        &[("phase", "resolve")],
        o.dns.as_secs_f64(),
    );
    if resolved {
        a.add(
            "probe_grpc_duration_seconds",
            PHASES,
            &[("phase", "check")],
            g.check.as_secs_f64(),
        );
        for (n, status) in SERVING_STATUSES.iter().enumerate() {
            let this = serving.is_some_and(|v| v == n as f64);
            a.add(
                "probe_grpc_healthcheck_response",
                "Which status the health check answered (1), all 0 when it got none",
                &[("serving_status", status)],
                f64::from(u8::from(this)),
            );
        }
    }
    let connected = g.code.is_some();
    a.gauge(
        "probe_grpc_status_code",
        "The gRPC status of the health check, 14 (UNAVAILABLE) when no status came, 0 when the target did not resolve",
        f64::from(g.code.unwrap_or(if resolved { GRPC_UNAVAILABLE } else { 0 })),
    );
    a.gauge(
        "probe_grpc_ssl",
        "Whether the health check went over TLS (1) or not (0)",
        f64::from(u8::from(g.ssl && connected && o.tls.is_some())),
    );
    if g.ssl
        && connected
        && let Some(tls) = &o.tls
    {
        tls_series(a, tls, Prober::Grpc);
    }
}

/// The icmp prober's series, from the host's echo.
fn icmp(a: &mut Answer, o: &Observed, i: &IcmpSeen) {
    address(a, o);
    let resolve = o.first_lookup.filter(|l| l.found).map_or(Duration::ZERO, |l| l.took);
    let help = "Time of each phase of the ICMP echo";
    for (phase, took) in [
        ("resolve", resolve),
        ("setup", i.setup),
        ("rtt", i.rtt.unwrap_or_default()),
    ] {
        a.add(
            "probe_icmp_duration_seconds",
            help,
            &[("phase", phase)],
            took.as_secs_f64(),
        );
    }
    if let (Some(hops), Some(_)) = (i.hop_limit, i.rtt) {
        a.gauge(
            "probe_icmp_reply_hop_limit",
            "The TTL (IPv4) or hop limit (IPv6) of the echo reply",
            f64::from(hops),
        );
    }
}

/// The dns prober's series, from what the DNS plugin reported
/// (`succeeded`: whether a reply came) and the address the host reached.
fn dns(a: &mut Answer, o: &Observed, result: &RunResult, succeeded: f64) {
    address(a, o);
    let m = |name| metric(result, name).unwrap_or(0.0);
    a.gauge(
        "probe_dns_query_succeeded",
        "Whether a reply to the query came (1), whatever its response code, or not (0)",
        succeeded,
    );
    for (name, help, key) in [
        (
            "probe_dns_answer_rrs",
            "Records in the reply's answer section",
            "answer_rrs",
        ),
        (
            "probe_dns_authority_rrs",
            "Records in the reply's authority section",
            "authority_rrs",
        ),
        (
            "probe_dns_additional_rrs",
            "Records in the reply's additional section",
            "additional_rrs",
        ),
    ] {
        a.gauge(name, help, m(key));
    }
    // The plugin's phases; where it has none (no reply came), the host's
    // own lookup and connect.
    let or = |plugin: f64, host: Duration| if plugin > 0.0 { plugin } else { host.as_secs_f64() };
    let lookup = o.first_lookup.map_or(Duration::ZERO, |l| l.took);
    let help = "Time of each phase of the DNS query";
    for (phase, value) in [
        ("resolve", or(m("resolve_seconds"), lookup)),
        ("connect", or(m("connect_seconds"), o.connect)),
        ("request", m("request_seconds")),
    ] {
        a.add("probe_dns_duration_seconds", help, &[("phase", phase)], value);
    }
    if let Some(serial) = metric(result, "serial") {
        a.gauge(
            "probe_dns_serial",
            "The serial of the SOA record in the answer (SOA queries only)",
            serial,
        );
    }
}

/// The tcp prober's series; `regex` and `bytes` are the plugin's
/// [`REGEX_METRIC`] and [`BYTES_METRIC`], answered (as blackbox 0.28
/// does) once the connection, and its TLS session with `tls`, was made.
fn tcp(a: &mut Answer, o: &Observed, regex: f64, bytes: f64) {
    address(a, o);
    if o.tcp_ready {
        a.gauge(
            "probe_failed_due_to_regex",
            "Whether a regex over the answer failed (1) or not (0)",
            regex,
        );
        a.gauge(
            "probe_failed_due_to_bytes",
            "Whether bytes expected were not the ones that came (1) or were (0)",
            bytes,
        );
    }
    if let Some(tls) = &o.tls {
        tls_series(a, tls, Prober::Tcp);
    }
}

/// The three series of the target's address: its lookup time, its IP
/// version and a hash of it (0 when the lookup found nothing).
fn address(a: &mut Answer, o: &Observed) {
    let Some(lookup) = o.first_lookup else {
        return;
    };
    let peer = o.peer.filter(|_| lookup.found);
    a.gauge(
        "probe_dns_lookup_time_seconds",
        "Time spent looking up the target's address",
        lookup.took.as_secs_f64(),
    );
    a.gauge(
        "probe_ip_protocol",
        "The IP version of the target's address (4 or 6), 0 when it did not resolve",
        match peer {
            Some(IpAddr::V4(_)) => 4.0,
            Some(IpAddr::V6(_)) => 6.0,
            None => 0.0,
        },
    );
    a.gauge(
        "probe_ip_addr_hash",
        "FNV-1a (32 bits) of the target address's bytes, to see it change; 0 when it did not resolve",
        peer.map_or(0.0, |ip| f64::from(ip_hash(ip))),
    );
}

/// FNV-1a, 32 bits, over the address's bytes (4 or 16).
fn ip_hash(ip: IpAddr) -> u32 {
    let bytes: Vec<u8> = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    bytes
        .iter()
        .fold(2_166_136_261u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(16_777_619))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_hash_is_fnv1a_over_its_bytes() {
        assert_eq!(ip_hash("127.0.0.1".parse().unwrap()), 3_668_918_509);
        assert_eq!(ip_hash("::1".parse().unwrap()), 1_751_717_746);
    }

    #[test]
    fn families_are_sorted_with_help_and_type() {
        let mut a = Answer::default();
        a.gauge("b", "second", 1.5);
        a.add("a", "first", &[("k", "w")], f64::NAN);
        a.add("a", "first", &[("k", "v\"")], -1.0);
        assert_eq!(
            a.render(),
            "# HELP a first\n# TYPE a gauge\na{k=\"v\\\"\"} -1\na{k=\"w\"} NaN\n# HELP b second\n# TYPE b gauge\nb 1.5\n"
        );
    }

    use sonde_sandbox::verdict::Reason;
    use sonde_sandbox::verdict::observed::Lookup;

    /// The series of an answer, without values: `name{labels}`.
    fn series(text: &str) -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("sonde_"))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect()
    }

    fn unresolved(observed: Observed) -> RunResult {
        let mut r = RunResult::error(Reason::Io, "");
        r.status = Status::Failure;
        r.observed = Some(Box::new(Observed {
            first_lookup: Some(Lookup {
                took: Duration::from_millis(3),
                found: false,
            }),
            dns: Duration::from_millis(3),
            ..observed
        }));
        r
    }

    #[test]
    fn a_name_that_does_not_resolve_keeps_the_resolve_phase_only() {
        let http = unresolved(Observed {
            http: Some(HttpSeen::default()),
            ..Observed::default()
        });
        let text = exposition(&http, Duration::from_millis(5));
        assert_eq!(
            series(&text),
            [
                "probe_dns_lookup_time_seconds",
                "probe_duration_seconds",
                "probe_failed_due_to_regex",
                "probe_http_content_length",
                "probe_http_duration_seconds{phase=\"resolve\"}",
                "probe_http_redirects",
                "probe_http_ssl",
                "probe_http_status_code",
                "probe_http_uncompressed_body_length",
                "probe_http_version",
                "probe_ip_addr_hash",
                "probe_ip_protocol",
                "probe_success",
            ]
        );
        assert!(text.contains("\nprobe_ip_protocol 0\n"), "{text}");
        assert!(text.contains("\nprobe_ip_addr_hash 0\n"), "{text}");
        assert!(text.contains("\nprobe_http_status_code 0\n"), "{text}");

        let grpc = unresolved(Observed {
            grpc: Some(GrpcSeen::default()),
            ..Observed::default()
        });
        let text = exposition(&grpc, Duration::from_millis(5));
        assert_eq!(
            series(&text),
            [
                "probe_dns_lookup_time_seconds",
                "probe_duration_seconds",
                "probe_grpc_duration_seconds{phase=\"resolve\"}",
                "probe_grpc_ssl",
                "probe_grpc_status_code",
                "probe_ip_addr_hash",
                "probe_ip_protocol",
                "probe_success",
            ]
        );
        assert!(text.contains("\nprobe_grpc_status_code 0\n"), "{text}");
    }

    #[test]
    fn tcp_answers_its_failure_series_once_connected() {
        let tcp = |tcp_ready| {
            let mut r = RunResult::error(Reason::Io, "");
            r.observed = Some(Box::new(Observed {
                tcp: true,
                tcp_ready,
                ..Observed::default()
            }));
            series(&exposition(&r, Duration::from_millis(1)))
        };
        assert_eq!(tcp(false), ["probe_duration_seconds", "probe_success"]);
        assert_eq!(
            tcp(true),
            [
                "probe_duration_seconds",
                "probe_failed_due_to_bytes",
                "probe_failed_due_to_regex",
                "probe_success"
            ]
        );
    }

    #[test]
    fn a_run_that_connected_nowhere_answers_sondes_series_only() {
        let denied = RunResult::error(Reason::Denied, "outside the grant");
        assert_eq!(
            series(&exposition(&denied, Duration::from_millis(1))),
            ["probe_duration_seconds", "probe_success"]
        );
    }

    #[test]
    fn what_a_run_observes_stays_small() {
        assert!(
            std::mem::size_of::<Observed>() <= 320,
            "{}",
            std::mem::size_of::<Observed>()
        );
    }
}
