//! The `views` mode: runs a script of steps against granted peers and
//! records everything the plugin observes in each — every byte each host
//! call returned and its length, the number and size of reads, header
//! names and values in order, statuses, errors' variants and texts, login
//! outcomes — as a transcript, so that a test can compare what the plugin
//! saw under two different secrets.
//!
//! It calls the host's imports directly (`sonde_sdk::bindings`), not the
//! SDK's wrappers, so that nothing between the host and the transcript
//! drops or reshapes a byte (the SDK's `Session::read` copies at most the
//! buffer it is given).
//!
//! Config: `{"mode": "views", "marker": TEXT, "steps": [STEP...], "show":
//! [INDEX...]}`. Binary data (`send`, `body`, `data`, `message`, header
//! values of `wasi_http`) is hex. Each step is an object with `do`:
//!
//! - `session`: `addr`, `tls_ca` (PEM: TLS; none: TCP), `send` (what to send
//!   after connecting), `login` (`{"kind": "redis"|"postgres", "user",
//!   "password"}`, made after `send`), `read_max`, `read_ms`: then reads
//!   until the peer closes, a read fails or 256 reads;
//! - `http`: sonde's `http`: `url`, `headers`, `body`, `max_body`,
//!   `keepalive`;
//! - `wasi_http`: a GET through `wasi:http/outgoing-handler`: `authority`,
//!   `path`, `headers`, `read_max`; reads the body to its end, then the
//!   trailers;
//! - `grpc`: `authority`, `method`, `message`, `metadata`;
//! - `udp`: `addr`, `data`, `max`;
//! - `cert`: `credentials.client-certificate(host, port, cert, key)`.
//!
//! Result: one metric per step, `s<INDEX>`, whose value packs the step's
//! transcript hash (the top 40 bits of its FNV-1a 64), how many times
//! `marker` occurs in what the step observed (7 bits) and whether a call
//! failed (1 bit): `hash40 << 8 | markers << 1 | failed`. The detail holds
//! the transcripts of the steps named in `show`, while they fit the host's
//! 4 KiB: `INDEX=BASE64;` each, the transcript's bytes XORed with 0x5a
//! first so that the host's scan of a plugin's own output never mistakes a
//! transcript for a reflection (and withholds the diagnosis with it).
//! A transcript is a list of records: a tag byte, a 4-byte little-endian
//! length, the bytes.

use serde::Deserialize;
use sonde_sdk::bindings::sonde::probe::{credentials, grpc, http, tcp, tls, udp};
use sonde_sdk::{Outcome, ProbeError};

/// The host's cap on an outcome's detail.
const MAX_DETAIL: usize = 4 * 1024;
/// The host's cap on metrics.
const MAX_STEPS: usize = 64;
/// At most this many reads of one stream.
const MAX_READS: usize = 256;
const TIMEOUT_MS: u64 = 5000;

#[derive(Deserialize)]
pub(crate) struct Views {
    marker: String,
    steps: Vec<Step>,
    #[serde(default)]
    show: Vec<usize>,
}

#[derive(Deserialize)]
struct LoginStep {
    kind: String,
    #[serde(default)]
    user: Option<String>,
    password: String,
}

#[derive(Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
enum Step {
    Session {
        addr: String,
        #[serde(default)]
        tls_ca: Option<String>,
        #[serde(default)]
        send: Vec<String>,
        #[serde(default)]
        login: Option<LoginStep>,
        read_max: u32,
        read_ms: u64,
    },
    Http {
        url: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
        #[serde(default)]
        body: String,
        max_body: u32,
        #[serde(default)]
        keepalive: bool,
    },
    WasiHttp {
        authority: String,
        path: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
        read_max: u64,
    },
    Grpc {
        authority: String,
        method: String,
        #[serde(default)]
        message: String,
        #[serde(default)]
        metadata: Vec<(String, String)>,
    },
    Udp {
        addr: String,
        data: String,
        max: u32,
    },
    Cert {
        addr: String,
        cert: String,
        key: String,
    },
}

/// What one step observed.
#[derive(Default)]
struct Transcript {
    bytes: Vec<u8>,
    /// Everything observed, without the records' framing: where markers
    /// are counted (a marker split over reads still counts).
    seen: Vec<u8>,
    failed: bool,
}

impl Transcript {
    fn record(&mut self, tag: u8, data: &[u8]) {
        self.bytes.push(tag);
        self.bytes.extend((data.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(data);
        self.seen.extend_from_slice(data);
    }

    /// A host call's error: its variant and text.
    fn error(&mut self, e: &impl core::fmt::Debug) {
        self.failed = true;
        self.record(b'X', format!("{e:?}").as_bytes());
    }

    fn markers(&self, marker: &[u8]) -> usize {
        if marker.is_empty() {
            return 0;
        }
        self.seen.windows(marker.len()).filter(|w| *w == marker).count()
    }
}

fn unhex(text: &str) -> Vec<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    };
    text.as_bytes()
        .chunks(2)
        .map(|p| (digit(p[0]) << 4) | digit(*p.get(1).unwrap_or(&b'0')))
        .collect()
}

fn host_port(addr: &str) -> (&str, u16) {
    addr.rsplit_once(':')
        .map_or((addr, 0), |(h, p)| (h, p.parse().unwrap_or(0)))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for g in data.chunks(3) {
        let n =
            (u32::from(g[0]) << 16) | (u32::from(*g.get(1).unwrap_or(&0)) << 8) | u32::from(*g.get(2).unwrap_or(&0));
        for i in 0..=g.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn tls_info(t: &mut Transcript, i: &tls::Info) {
    let text = format!(
        "{} {:?} {} {} {} {}",
        i.version, i.alpn, i.not_before, i.not_after, i.subject, i.issuer
    );
    t.record(b'I', text.as_bytes());
}

/// Reads `session` until it closes, a read fails, or [`MAX_READS`].
fn read_all(t: &mut Transcript, session: &tls::Session, max: u32, ms: u64) {
    for _ in 0..MAX_READS {
        match session.receive(max, ms) {
            Ok(data) => {
                t.record(b'r', &data);
                if data.is_empty() {
                    return;
                }
            }
            Err(e) => {
                t.record(b'e', format!("{e:?}").as_bytes());
                return;
            }
        }
    }
}

fn session_step(
    t: &mut Transcript,
    addr: &str,
    tls_ca: Option<&str>,
    send: &[String],
    login: Option<&LoginStep>,
    read_max: u32,
    read_ms: u64,
) {
    let (host, port) = host_port(addr);
    let session = match tls_ca {
        None => tcp::connect(host, port, TIMEOUT_MS).map(|(s, _)| {
            t.record(b'C', b"tcp");
            s
        }),
        Some(ca) => {
            let options = tls::Options {
                ca_pem: Some(ca.into()),
                insecure_skip_verify: false,
                server_name: None,
            };
            tls::connect(host, port, &options, TIMEOUT_MS).map(|(s, r)| {
                tls_info(t, &r.info);
                s
            })
        }
    };
    let session = match session {
        Ok(s) => s,
        Err(e) => return t.error(&e),
    };
    for data in send {
        if let Err(e) = session.send(&unhex(data)) {
            return t.error(&e);
        }
    }
    if let Some(login) = login {
        let result = match login.kind.as_str() {
            "redis" => credentials::redis_login(&session, login.user.as_deref(), &login.password, TIMEOUT_MS),
            _ => credentials::postgres_login(
                &session,
                login.user.as_deref().unwrap_or("u"),
                &login.password,
                TIMEOUT_MS,
            ),
        };
        match result {
            Ok(credentials::Login::Accepted(m)) => t.record(b'A', m.as_bytes()),
            Ok(credentials::Login::Refused(m)) => t.record(b'F', m.as_bytes()),
            Err(e) => t.error(&e),
        }
    }
    read_all(t, &session, read_max, read_ms);
}

fn http_step(t: &mut Transcript, url: &str, headers: &[(String, String)], body: &str, max_body: u32, keepalive: bool) {
    let request = http::Request {
        method: if body.is_empty() { "GET" } else { "POST" }.into(),
        url: url.into(),
        headers: headers.to_vec(),
        body: unhex(body),
        timeout_ms: TIMEOUT_MS,
        max_body,
        tls: tls::Options {
            ca_pem: None,
            insecure_skip_verify: false,
            server_name: None,
        },
        keepalive,
    };
    match http::send(&request) {
        Ok(r) => {
            t.record(b'S', &r.status.to_le_bytes());
            for (n, v) in &r.headers {
                t.record(b'N', n.as_bytes());
                t.record(b'V', v.as_bytes());
            }
            t.record(b'B', &r.body);
            t.record(b'U', &[u8::from(r.reused)]);
            if let Some(i) = &r.tls {
                tls_info(t, i);
            }
        }
        Err(e) => t.error(&e),
    }
}

#[cfg(target_arch = "wasm32")]
fn wasi_http_step(t: &mut Transcript, authority: &str, path: &str, headers: &[(String, String)], read_max: u64) {
    use wasi::http::outgoing_handler;
    use wasi::http::types::{Fields, IncomingBody, OutgoingRequest, Scheme};
    use wasi::io::streams::StreamError;
    let fields = Fields::new();
    for (name, value) in headers {
        if let Err(e) = fields.append(name, &unhex(value)) {
            return t.error(&e);
        }
    }
    let req = OutgoingRequest::new(fields);
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some(authority));
    let _ = req.set_path_with_query(Some(path));
    let response = match outgoing_handler::handle(req, None) {
        Ok(r) => r,
        Err(e) => return t.error(&e),
    };
    response.subscribe().block();
    let response = match response.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => return t.error(&e),
        other => return t.error(&other.map(|r| r.map(|_| ()))),
    };
    t.record(b'S', &response.status().to_le_bytes());
    for (n, v) in response.headers().entries() {
        t.record(b'N', n.as_bytes());
        t.record(b'V', &v);
    }
    let Ok(body) = response.consume() else {
        return t.error(&"no body");
    };
    if let Ok(stream) = body.stream() {
        for _ in 0..MAX_READS {
            // Wait for data or the end, then take what is there: one read
            // per time the host hands bytes on.
            stream.subscribe().block();
            match stream.read(read_max) {
                Ok(chunk) if chunk.is_empty() => continue,
                Ok(chunk) => t.record(b'r', &chunk),
                Err(StreamError::Closed) => {
                    t.record(b'z', b"closed");
                    break;
                }
                Err(StreamError::LastOperationFailed(e)) => {
                    t.record(b'z', e.to_debug_string().as_bytes());
                    break;
                }
            }
        }
    }
    let trailers = IncomingBody::finish(body);
    trailers.subscribe().block();
    match trailers.get() {
        Some(Ok(Ok(Some(trailers)))) => {
            for (n, v) in trailers.entries() {
                t.record(b'n', n.as_bytes());
                t.record(b'v', &v);
            }
        }
        Some(Ok(Ok(None))) => t.record(b'n', b""),
        Some(Ok(Err(e))) => t.record(b'x', format!("{e:?}").as_bytes()),
        other => t.record(b'x', format!("{:?}", other.map(|r| r.map(|_| ()))).as_bytes()),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn wasi_http_step(t: &mut Transcript, _: &str, _: &str, _: &[(String, String)], _: u64) {
    t.error(&"wasi:http exists only in wasm");
}

fn grpc_step(t: &mut Transcript, authority: &str, method: &str, message: &str, metadata: &[(String, String)]) {
    let request = grpc::Request {
        authority: authority.into(),
        path: method.into(),
        message: unhex(message),
        metadata: metadata.to_vec(),
        timeout_ms: TIMEOUT_MS,
        tls: None,
    };
    match grpc::call(&request) {
        Ok(r) => {
            t.record(b'G', &r.code.to_le_bytes());
            t.record(b'Q', r.status_message.as_bytes());
            match &r.message {
                Some(m) => t.record(b'M', m),
                None => t.record(b'm', b""),
            }
            for (n, v) in &r.metadata {
                t.record(b'N', n.as_bytes());
                t.record(b'V', v.as_bytes());
            }
        }
        Err(e) => t.error(&e),
    }
}

fn step(t: &mut Transcript, s: &Step) {
    match s {
        Step::Session {
            addr,
            tls_ca,
            send,
            login,
            read_max,
            read_ms,
        } => session_step(t, addr, tls_ca.as_deref(), send, login.as_ref(), *read_max, *read_ms),
        Step::Http {
            url,
            headers,
            body,
            max_body,
            keepalive,
        } => http_step(t, url, headers, body, *max_body, *keepalive),
        Step::WasiHttp {
            authority,
            path,
            headers,
            read_max,
        } => wasi_http_step(t, authority, path, headers, *read_max),
        Step::Grpc {
            authority,
            method,
            message,
            metadata,
        } => grpc_step(t, authority, method, message, metadata),
        Step::Udp { addr, data, max } => {
            let (host, port) = host_port(addr);
            match udp::exchange(host, port, &unhex(data), *max, TIMEOUT_MS) {
                Ok(r) => t.record(b'D', &r.data),
                Err(e) => t.error(&e),
            }
        }
        Step::Cert { addr, cert, key } => {
            let (host, port) = host_port(addr);
            match credentials::client_certificate(host, port, cert, key) {
                Ok(()) => t.record(b'K', b"ok"),
                Err(e) => t.error(&e),
            }
        }
    }
}

/// Runs the script and reports it.
pub(crate) fn run(views: &Views) -> Result<Outcome, ProbeError> {
    if views.steps.len() > MAX_STEPS {
        return Err(ProbeError::invalid_config(format!("at most {MAX_STEPS} steps")));
    }
    let marker = views.marker.as_bytes();
    let mut detail = String::new();
    let mut metrics = Vec::new();
    for (i, s) in views.steps.iter().enumerate() {
        let mut t = Transcript::default();
        step(&mut t, s);
        let hash = fnv1a(&t.bytes) >> 24;
        let markers = t.markers(marker).min(127) as u64;
        let packed = (hash << 8) | (markers << 1) | u64::from(t.failed);
        metrics.push((format!("s{i}"), packed as f64));
        if views.show.contains(&i) {
            let masked: Vec<u8> = t.bytes.iter().map(|b| b ^ 0x5a).collect();
            let entry = format!("{i}={};", base64(&masked));
            if detail.len() + entry.len() <= MAX_DETAIL {
                detail.push_str(&entry);
            }
        }
    }
    let mut outcome = Outcome::success(format!("views: {} steps", views.steps.len())).with_detail(detail);
    for (name, value) in metrics {
        outcome = outcome.with_metric(name, value, "");
    }
    Ok(outcome)
}
