//! The built-in `dns` probe: one query to the target, a DNS server
//! (`host:port`, port 53 when left out), checked the way
//! blackbox_exporter's `dns` prober checks it: the response code against
//! `valid_rcodes`, then each section's records against the
//! `validate_*_rrs` regexes.
//!
//! The query goes over UDP through the host's `udp` capability (a
//! connected socket: only the server's datagrams are read) and is asked
//! again over TCP when the reply is truncated (TC bit), or over TCP only
//! with `transport_protocol: tcp` (2-byte length framing, through the
//! host's `tcp`). hickory-proto builds the query and parses the reply;
//! before it does, the reply's header is checked against its length, so a
//! reply that claims more records than its bytes can hold is refused
//! without allocating for them. A reply whose ID or question differs from
//! the query's, that is not a response, or that does not parse is a
//! failure with the reason.
//!
//! A record is matched as text: its owner name (absolute, with the final
//! dot), TTL, class, type and data, separated by tabs, the data as
//! hickory-proto writes it (`example.com.\t300\tIN\tA\t192.0.2.1`,
//! `example.com.\t300\tIN\tMX\t10 mail.example.com.`), as blackbox's
//! miekg/dns writes them; TXT data is written as miekg/dns writes it
//! (hickory does not quote it): each string in double quotes
//! (`"v=spf1 -all"`), so a regex written for blackbox matches.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod reply;
mod text;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::str::FromStr;
use core::time::Duration;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use reply::{parse_reply, proto_reason};
use serde::Deserialize;
use sonde_regex::Regex;
use sonde_sdk::time::Instant;
use sonde_sdk::tls::HandshakeError;
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

/// The most a reply may be over TCP (a DNS message's 16-bit length).
const MAX_REPLY: usize = 65_535;
/// The most a UDP reply may be. The query carries no EDNS, so a server
/// sends at most 512 bytes and truncates the rest (RFC 1035); a little room
/// is left for a server that pads, and anything larger is refused by the
/// host as oversized.
const MAX_UDP_REPLY: u32 = 4096;

/// Time kept back from the deadline so a slow server is reported by the
/// plugin (with what was measured) rather than as a bare timeout.
const MARGIN: Duration = Duration::from_millis(20);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    query_name: String,
    #[serde(default = "any")]
    query_type: String,
    #[serde(default = "class_in")]
    query_class: String,
    #[serde(default = "yes")]
    recursion_desired: bool,
    #[serde(default)]
    transport_protocol: Transport,
    #[serde(default = "noerror")]
    valid_rcodes: Vec<String>,
    #[serde(default)]
    validate_answer_rrs: RrsConfig,
    #[serde(default)]
    validate_authority_rrs: RrsConfig,
    #[serde(default)]
    validate_additional_rrs: RrsConfig,
}

fn any() -> String {
    "ANY".into()
}
fn class_in() -> String {
    "IN".into()
}
fn yes() -> bool {
    true
}
fn noerror() -> Vec<String> {
    alloc::vec!["NOERROR".into()]
}

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
enum Transport {
    #[default]
    Udp,
    Tcp,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RrsConfig {
    #[serde(default)]
    fail_if_matches_regexp: Vec<String>,
    #[serde(default)]
    fail_if_not_matches_regexp: Vec<String>,
    #[serde(default)]
    fail_if_all_match_regexp: Vec<String>,
    #[serde(default)]
    fail_if_none_matches_regexp: Vec<String>,
}

/// A section's validators, compiled.
#[derive(Default)]
struct Rrs {
    matches: Vec<Regex>,
    not_matches: Vec<Regex>,
    all_match: Vec<Regex>,
    none_matches: Vec<Regex>,
}

/// The config, checked: what to ask and how to judge the reply.
struct Plan {
    name: Name,
    rtype: RecordType,
    class: DNSClass,
    recursion_desired: bool,
    transport: Transport,
    rcodes: Vec<u16>,
    sections: [(&'static str, Rrs); 3],
}

fn compile(key: &str, patterns: &[String]) -> Result<Vec<Regex>, ProbeError> {
    patterns
        .iter()
        .map(|p| sonde_regex::compile(p).map_err(|e| ProbeError::invalid_config(format!("{key} {p:?}: {e}"))))
        .collect()
}

impl Rrs {
    fn new(section: &str, c: &RrsConfig) -> Result<Self, ProbeError> {
        let key = |k: &str| format!("validate_{section}_rrs.{k}");
        Ok(Self {
            matches: compile(&key("fail_if_matches_regexp"), &c.fail_if_matches_regexp)?,
            not_matches: compile(&key("fail_if_not_matches_regexp"), &c.fail_if_not_matches_regexp)?,
            all_match: compile(&key("fail_if_all_match_regexp"), &c.fail_if_all_match_regexp)?,
            none_matches: compile(&key("fail_if_none_matches_regexp"), &c.fail_if_none_matches_regexp)?,
        })
    }

    fn is_empty(&self) -> bool {
        self.matches.is_empty()
            && self.not_matches.is_empty()
            && self.all_match.is_empty()
            && self.none_matches.is_empty()
    }

    /// Why `records` (as text) fail these validators, as blackbox decides
    /// it, or `None` when they pass.
    fn failure(&self, records: &[String]) -> Option<String> {
        for re in &self.matches {
            if let Some(r) = records.iter().find(|r| re.is_match(r)) {
                return Some(format!("{r:?} matches /{}/", re.as_str()));
            }
        }
        for re in &self.not_matches {
            if records.is_empty() {
                return Some(format!("no record to match /{}/", re.as_str()));
            }
            if let Some(r) = records.iter().find(|r| !re.is_match(r)) {
                return Some(format!("{r:?} does not match /{}/", re.as_str()));
            }
        }
        // What blackbox_exporter does (0.23 to 0.28), whatever the name
        // says: it fails unless every record matches, and an empty section
        // passes. Configs written for it rely on that.
        for re in &self.all_match {
            if let Some(r) = records.iter().find(|r| !re.is_match(r)) {
                return Some(format!(
                    "{r:?} does not match /{}/ (fail_if_all_match_regexp)",
                    re.as_str()
                ));
            }
        }
        for re in &self.none_matches {
            if !records.iter().any(|r| re.is_match(r)) {
                return Some(format!("no record ({}) matches /{}/", records.len(), re.as_str()));
            }
        }
        None
    }
}

/// The response codes by the names blackbox's `valid_rcodes` uses.
const RCODES: &[(&str, u16)] = &[
    ("NOERROR", 0),
    ("FORMERR", 1),
    ("SERVFAIL", 2),
    ("NXDOMAIN", 3),
    ("NOTIMP", 4),
    ("REFUSED", 5),
    ("YXDOMAIN", 6),
    ("YXRRSET", 7),
    ("NXRRSET", 8),
    ("NOTAUTH", 9),
    ("NOTZONE", 10),
    ("BADVERS", 16),
    ("BADSIG", 16),
    ("BADKEY", 17),
    ("BADTIME", 18),
    ("BADMODE", 19),
    ("BADNAME", 20),
    ("BADALG", 21),
    ("BADTRUNC", 22),
    ("BADCOOKIE", 23),
];

/// A response code by its name (`NOERROR`, `NXDOMAIN`...) or number.
fn rcode(name: &str) -> Result<u16, ProbeError> {
    let upper = name.to_ascii_uppercase();
    match RCODES.iter().find(|(n, _)| *n == upper) {
        Some((_, code)) => Ok(*code),
        None => name
            .parse()
            .map_err(|_| ProbeError::invalid_config(format!("valid_rcodes: unknown response code {name:?}"))),
    }
}

/// A response code's name, or its number when it has none.
fn rcode_name(code: u16) -> String {
    RCODES
        .iter()
        .find(|(_, c)| *c == code)
        .map_or_else(|| code.to_string(), |(n, _)| (*n).to_string())
}

impl Plan {
    fn new(c: Config) -> Result<Self, ProbeError> {
        let mut name = Name::from_ascii(&c.query_name)
            .map_err(|e| ProbeError::invalid_config(format!("query_name {:?}: {}", c.query_name, proto_reason(&e))))?;
        // ASCII presentation form (an IDN as punycode), as blackbox reads
        // it; always absolute.
        name.set_fqdn(true);
        let rtype = RecordType::from_str(&c.query_type.to_ascii_uppercase())
            .map_err(|e| ProbeError::invalid_config(format!("query_type {:?}: {}", c.query_type, proto_reason(&e))))?;
        let class = DNSClass::from_str(&c.query_class.to_ascii_uppercase()).map_err(|e| {
            ProbeError::invalid_config(format!("query_class {:?}: {}", c.query_class, proto_reason(&e)))
        })?;
        let rcodes = c.valid_rcodes.iter().map(|r| rcode(r)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name,
            rtype,
            class,
            recursion_desired: c.recursion_desired,
            transport: c.transport_protocol,
            rcodes,
            sections: [
                ("answer", Rrs::new("answer", &c.validate_answer_rrs)?),
                ("authority", Rrs::new("authority", &c.validate_authority_rrs)?),
                ("additional", Rrs::new("additional", &c.validate_additional_rrs)?),
            ],
        })
    }

    /// The query, as bytes, with `id`.
    fn query(&self, id: u16) -> Result<Vec<u8>, ProbeError> {
        let mut q = Query::query(self.name.clone(), self.rtype);
        q.set_query_class(self.class);
        let mut m = Message::new();
        m.set_id(id)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(self.recursion_desired)
            .add_query(q);
        m.to_vec()
            .map_err(|e| ProbeError::invalid_config(format!("query_name {}: {}", self.name, proto_reason(&e))))
    }
}

/// A query ID that differs from call to call: the clocks' nanoseconds,
/// mixed (splitmix64). The host's connected socket already keeps other
/// peers' datagrams out; the ID only pairs the reply with this query.
fn query_id() -> u16 {
    let mut x = (Instant::now().elapsed().as_nanos() as u64)
        ^ ((sonde_sdk::time::unix_seconds() * 1e9) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as u16
}

/// How the reply came: its timings, and the transport that brought it.
#[derive(Default)]
struct Timings {
    resolve: f64,
    connect: f64,
    request: f64,
    over_tcp: bool,
    fell_back: bool,
}

/// Why no reply was read: the target failed (a failed probe) or the
/// probe could not be made (denied, invalid).
enum Failed {
    Target(String),
    Probe(ProbeError),
}

impl From<HandshakeError> for Failed {
    fn from(e: HandshakeError) -> Self {
        match e {
            HandshakeError::Failed(m) => Failed::Target(m),
            HandshakeError::Probe(e) => Failed::Probe(e),
        }
    }
}

fn over_udp(host: &str, port: u16, query: &[u8], left: Duration, t: &mut Timings) -> Result<Vec<u8>, Failed> {
    let start = Instant::now();
    // Without a reply, the time the exchange took is its request phase.
    let reply = sonde_sdk::udp::exchange(host, port, query, MAX_UDP_REPLY, left)
        .inspect_err(|_| t.request = start.elapsed().as_secs_f64())?;
    t.resolve = reply.dns_seconds;
    t.connect = reply.connect_seconds;
    t.request = reply.round_trip_seconds;
    Ok(reply.data)
}

fn over_tcp(host: &str, port: u16, query: &[u8], left: Duration, t: &mut Timings) -> Result<Vec<u8>, Failed> {
    let (mut session, connected) = sonde_sdk::tcp::connect(host, port, left)?;
    t.resolve = connected.dns_seconds;
    t.connect = connected.connect_seconds;
    t.over_tcp = true;
    let start = Instant::now();
    let len = u16::try_from(query.len()).map_err(|_| Failed::Probe(ProbeError::invalid_config("query too long")))?;
    let mut framed = Vec::with_capacity(query.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(query);
    session
        .send(&framed)
        .map_err(|e| Failed::Target(format!("tcp: send: {}", e.describe())))?;
    // The 2-byte length, then that many bytes: never more than 64 KiB.
    let wanted = |b: &[u8]| b.len() >= 2 && b.len() >= 2 + usize::from(u16::from_be_bytes([b[0], b[1]]));
    let (bytes, error) = session.read_until(2 + MAX_REPLY, wanted);
    t.request = start.elapsed().as_secs_f64();
    if !wanted(&bytes) {
        let why = match error {
            Some(e) => e.describe(),
            None => "the server closed the connection".to_string(),
        };
        return Err(Failed::Target(format!(
            "tcp: {why} after {} byte(s) of the reply",
            bytes.len()
        )));
    }
    let n = usize::from(u16::from_be_bytes([bytes[0], bytes[1]]));
    Ok(bytes[2..2 + n].to_vec())
}

struct Dns;

fn outcome_metrics(mut o: Outcome, t: &Timings) -> Outcome {
    o = o
        .with_metric("resolve_seconds", t.resolve, "seconds")
        .with_metric("connect_seconds", t.connect, "seconds")
        .with_metric("request_seconds", t.request, "seconds");
    if t.fell_back {
        o = o.with_metric("tcp_fallback", 1.0, "");
    }
    o
}

fn check(req: &Request, plan: &Plan) -> Result<Outcome, ProbeError> {
    let target = req.target();
    let (host, port) = match sonde_sdk::net::host_port(target) {
        Ok(hp) => hp,
        Err(_) if !target.contains(':') && !target.is_empty() => (target, 53),
        Err(e) => return Err(e),
    };
    let id = query_id();
    let query = plan.query(id)?;
    let start = Instant::now();
    let mut t = Timings::default();
    let left = || req.remaining().saturating_sub(MARGIN).max(Duration::from_millis(1));
    let exchanged = match plan.transport {
        Transport::Tcp => over_tcp(host, port, &query, left(), &mut t),
        Transport::Udp => over_udp(host, port, &query, left(), &mut t),
    };
    let bytes = match exchanged {
        Ok(b) => b,
        Err(Failed::Probe(e)) => return Err(e),
        Err(Failed::Target(m)) => {
            let o = Outcome::failure(format!("{target}: {m}")).with_metric("query_succeeded", 0.0, "");
            return Ok(outcome_metrics(o, &t));
        }
    };
    let failed = |m: String, t: &Timings| {
        let o = Outcome::failure(format!("{target}: {m}")).with_metric("query_succeeded", 0.0, "");
        Ok(outcome_metrics(o, t))
    };
    let mut reply = match parse_reply(&bytes, id, plan) {
        Ok(m) => m,
        Err(m) => return failed(m.to_string(), &t),
    };
    if reply.truncated() && !t.over_tcp {
        let mut again = Timings::default();
        match over_tcp(host, port, &query, left(), &mut again) {
            Ok(b) => match parse_reply(&b, id, plan) {
                Ok(m) => reply = m,
                Err(m) => return failed(format!("after a truncated UDP reply: {m}"), &t),
            },
            Err(Failed::Probe(e)) => return Err(e),
            Err(Failed::Target(m)) => return failed(format!("after a truncated UDP reply: {m}"), &t),
        }
        again.request += t.request;
        again.fell_back = true;
        t = again;
    }
    let code = u16::from(reply.response_code());
    let sections = [reply.answers(), reply.name_servers(), reply.additionals()];
    let mut o = Outcome::success("").with_metric("query_succeeded", 1.0, "");
    o = o
        .with_metric("rcode", f64::from(code), "")
        .with_metric("answer_rrs", sections[0].len() as f64, "")
        .with_metric("authority_rrs", sections[1].len() as f64, "")
        .with_metric("additional_rrs", sections[2].len() as f64, "");
    // As blackbox: for an SOA query only, the answer's serial (0 without one).
    if plan.rtype == RecordType::SOA {
        let serial = sections[0].iter().find_map(|r| match r.data() {
            RData::SOA(soa) => Some(soa.serial()),
            _ => None,
        });
        o = o.with_metric("serial", f64::from(serial.unwrap_or(0)), "");
    }
    o = outcome_metrics(o, &t).with_metric("probe_seconds", start.elapsed().as_secs_f64(), "seconds");
    let rcode_name = rcode_name(code);
    let verdict = if !plan.rcodes.contains(&code) {
        Some(format!("response code {rcode_name} is not one of valid_rcodes"))
    } else {
        plan.sections
            .iter()
            .zip(sections)
            .find_map(|((section, rrs), records)| {
                if rrs.is_empty() {
                    return None;
                }
                let texts: Vec<String> = records.iter().map(text::text).collect();
                rrs.failure(&texts).map(|why| format!("{section} section: {why}"))
            })
    };
    let via = if t.fell_back {
        " (over TCP after a truncated UDP reply)"
    } else if t.over_tcp {
        " (over TCP)"
    } else {
        ""
    };
    let counts = format!(
        "{} answer, {} authority, {} additional record(s)",
        sections[0].len(),
        sections[1].len(),
        sections[2].len()
    );
    match verdict {
        Some(why) => {
            o.status = sonde_sdk::Status::Failure;
            o.message = format!("{target}: {why}; {counts}{via}");
        }
        None => o.message = format!("{target}: {rcode_name} for {} {}, {counts}{via}", plan.name, plan.rtype),
    }
    Ok(o)
}

impl Probe for Dns {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "Sends one DNS query to the target (a DNS server) over UDP or TCP and checks the response code and records, as blackbox_exporter's dns prober."
                .into(),
            config_schema: Some(include_str!("schema.json").into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let plan = Plan::new(config)?;
        check(&req, &plan)
    }
}

sonde_sdk::export!(Dns);

/// hickory-proto's lazily built statics (through once_cell without std)
/// take a `critical-section`, which a no-std build must provide. A plugin
/// runs on one thread, in an instance no other thread or interrupt enters,
/// so a critical section needs no lock: acquiring and releasing do nothing.
#[cfg(target_arch = "wasm32")]
#[allow(
    unsafe_code,
    reason = "critical-section's implementation for a single-threaded plugin"
)]
mod one_thread {
    struct OneThread;
    critical_section::set_impl!(OneThread);

    // SAFETY: the instance is single-threaded and never re-entered while a
    // critical section is held (no interrupts, no threads in wasm32-wasip2
    // without the threads proposal), so running the section's body with
    // no lock excludes every other execution of it.
    unsafe impl critical_section::Impl for OneThread {
        unsafe fn acquire() {}
        unsafe fn release(_: ()) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::ReplyError;

    fn plan(json: &str) -> Result<Plan, ProbeError> {
        Plan::new(serde_json::from_str(json).map_err(|e| ProbeError::invalid_config(e.to_string()))?)
    }

    #[test]
    fn config_defaults_and_refusals() {
        let p = plan(r#"{"query_name": "example.com"}"#).unwrap();
        assert_eq!(p.rtype, RecordType::ANY);
        assert_eq!(p.class, DNSClass::IN);
        assert!(p.recursion_desired);
        assert_eq!(p.transport, Transport::Udp);
        assert_eq!(p.rcodes, [0]);
        let p = plan(r#"{"query_name": "x.", "query_type": "mx", "valid_rcodes": ["nxdomain", "2"], "transport_protocol": "tcp"}"#)
            .unwrap();
        assert_eq!(
            (p.rtype, p.rcodes.as_slice(), p.transport),
            (RecordType::MX, &[3, 2][..], Transport::Tcp)
        );
        assert!(plan(r#"{"query_name": "x", "query_type": "NOPE"}"#).is_err());
        assert!(plan(r#"{"query_name": "x", "valid_rcodes": ["OKAY"]}"#).is_err());
        assert!(plan(r#"{"query_name": "x", "validate_answer_rrs": {"fail_if_matches_regexp": ["("]}}"#).is_err());
        assert!(plan(r#"{"query_name": "x", "validate_answer_rrs": {"fail_if_match": []}}"#).is_err());
    }

    #[test]
    fn validators_decide_as_blackbox() {
        let rrs = |json: &str| Rrs::new("answer", &serde_json::from_str(json).unwrap()).unwrap();
        let recs = [
            "a.\t60\tIN\tA\t192.0.2.1".to_string(),
            "a.\t60\tIN\tA\t192.0.2.2".to_string(),
        ];
        assert!(
            rrs(r#"{"fail_if_matches_regexp": ["192\\.0\\.2\\.2"]}"#)
                .failure(&recs)
                .is_some()
        );
        assert!(
            rrs(r#"{"fail_if_not_matches_regexp": ["192\\.0\\.2\\.1"]}"#)
                .failure(&recs)
                .is_some()
        );
        // Every record matches: passes (blackbox's behaviour, not its name).
        assert!(
            rrs(r#"{"fail_if_all_match_regexp": ["\tA\t"]}"#)
                .failure(&recs)
                .is_none()
        );
        assert!(
            rrs(r#"{"fail_if_none_matches_regexp": ["AAAA"]}"#)
                .failure(&recs)
                .is_some()
        );
        assert!(
            rrs(r#"{"fail_if_none_matches_regexp": ["192\\.0\\.2\\.2"]}"#)
                .failure(&recs)
                .is_none()
        );
        // One record of two matches: fails.
        assert!(
            rrs(r#"{"fail_if_all_match_regexp": ["\\.1$"]}"#)
                .failure(&recs)
                .is_some()
        );
        // As blackbox: no record at all passes "all" and fails "none" and
        // "not matches".
        assert!(rrs(r#"{"fail_if_all_match_regexp": ["x"]}"#).failure(&[]).is_none());
        assert!(rrs(r#"{"fail_if_none_matches_regexp": ["x"]}"#).failure(&[]).is_some());
        assert!(rrs(r#"{"fail_if_not_matches_regexp": ["x"]}"#).failure(&[]).is_some());
    }

    #[test]
    fn hostile_headers_are_refused_before_parsing() {
        let p = plan(r#"{"query_name": "example.com", "query_type": "A"}"#).unwrap();
        // ID 7, a response, 65535 answers and nothing after the header.
        let huge = [0, 7, 0x80, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0];
        let why = parse_reply(&huge, 7, &p).unwrap_err();
        assert!(matches!(why, ReplyError::Overcounted { records: 65535, .. }), "{why}");
        assert!(why.to_string().contains("more than its 12 bytes"), "{why}");
        // One question whose name is a pointer to itself.
        let looped = [0, 7, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1];
        let why = parse_reply(&looped, 7, &p).unwrap_err();
        assert!(matches!(why, ReplyError::Malformed(_)), "{why}");
        assert!(why.to_string().starts_with("malformed reply"), "{why}");
        let why = parse_reply(&[1, 2, 3], 7, &p).unwrap_err();
        assert!(
            matches!(why, ReplyError::Header(_)) && why.to_string().contains("header"),
            "{why}"
        );
        let good = p.query(9).unwrap();
        let why = parse_reply(&good, 7, &p).unwrap_err();
        assert!(matches!(why, ReplyError::OtherId { reply: 9, query: 7 }), "{why}");
        assert!(why.to_string().contains("differs"), "{why}");
        let why = parse_reply(&good, 9, &p).unwrap_err();
        assert!(matches!(why, ReplyError::NotResponse), "{why}");
        assert!(why.to_string().contains("not a response"), "{why}");
    }
}
