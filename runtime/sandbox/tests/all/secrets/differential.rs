//! The differential harness (docs/security.md, "A plugin never reads a
//! secret it uses"): the same hostile plugin (`steal_secret` in its
//! `views` mode) and the same peer programs ([`sonde_tests::reflect`]) run
//! under two random secrets of equal length, and everything the plugin
//! observes — every byte, the number and sizes of reads, headers in order,
//! statuses, errors, outcomes — must be identical, except where a peer's
//! answer holds a *reflection* (a run of `min(RUN, len)` bytes of one
//! secret) and the other's does not: there, and only there, the plugin
//! may see the withheld marker instead.
//!
//! A peer program is a transport (a TCP or TLS session, sonde's `http`
//! with keep-alive on or off and a `max-body` cut, `wasi:http`, gRPC, UDP,
//! a Redis or PostgreSQL login), what the peer reflects (the secret the
//! host put on the wire, or only the plugin's own guesses), an
//! [`Encoding`] real servers use, where the reflection lands (a
//! [`Field`]) and where the peer cuts its answer into writes, pausing
//! [`PAUSE`] after each (long against the host's 20 ms QUIET) so that the
//! plugin's reads split the same way in both runs.
//!
//! The two secrets of a pair have the same class at every position (a
//! lower-case letter where the other has one, the same symbol, the same
//! non-UTF-8 byte), so every encoding of one is as long as the same
//! encoding of the other: a difference in a length is a difference the
//! host let through, not one the test made.
//!
//! Nothing passes by nothing happening: for every program, the peer must
//! have logged the secret (or the guess) it received from each run, and
//! every step that reflects must show the marker (or, for a header name
//! or gRPC framing junk that is no valid answer, end in a host error).
//!
//! Generated programs follow the fuzz convention (`fuzz.rs`): a case is
//! made from one seed, printed; `SONDE_FUZZ_SEED=<seed> SONDE_FUZZ_ITERS=1`
//! replays it. A mismatch names the step and its program, runs that step
//! alone under both secrets and prints both transcripts and where they
//! first differ.

use crate::support::seeded::{self, Case};
use crate::support::{engine, guest};
use sonde_policy::secrets::{SecretCell, SecretGrants, SecretValue};
use sonde_sandbox::engine::{Call, Limits, Plugin};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{RunResult, Status};
use sonde_tests::guests;
use sonde_tests::reflect::{self, Encoding, Field, Login, Program, Reflector, Source};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The contract's constants: a reflection is a run of `min(RUN, len)`
/// consecutive bytes of a secret; a stream is handed on `LAG` bytes behind;
/// a withheld field, read or body becomes `WITHHELD`, a withheld header
/// `(WITHHELD_HEADER, WITHHELD)`.
pub(crate) use sonde_policy::secrets::scrub::{LAG, QUIET, RUN, WITHHELD, WITHHELD_HEADER};

/// A peer's pause after each write but the last: long against QUIET.
const PAUSE: Duration = Duration::from_millis(80);
/// A peer's longest write on a stream: shorter than [`LAG`], so that the
/// host holds each write whole until the pause after it.
const MAX_WRITE: usize = 160;
const _: () = assert!(MAX_WRITE < LAG);
const _: () = assert!(PAUSE.as_millis() >= 3 * QUIET.as_millis());
/// One run of the plugin.
const CALL: Duration = Duration::from_secs(90);
/// Steps per run: the host's 64 sockets per call, less a margin.
const BATCH: usize = 40;

// ---------------------------------------------------------------------
// The fuzz convention.

/// The cases of `target` ([`crate::support::seeded`]).
fn cases(target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    seeded::cases("secrets::differential", target, default)
}

// ---------------------------------------------------------------------
// Secrets and guesses.

/// What a pair of secrets is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Lower-case letters and digits.
    Alnum,
    /// Letters and digits with symbols (`"`, `\`, `/`, `&`, `%`, `+`, space...).
    Symbols,
    /// Letters and digits with one byte that is not UTF-8 (0xe9).
    NonUtf8,
    /// Upper- and lower-case letters and digits.
    Cased,
}

const KINDS: [Kind; 4] = [Kind::Alnum, Kind::Symbols, Kind::NonUtf8, Kind::Cased];
const LENGTHS: [usize; 5] = [8, 11, 12, 24, 64];
const SYMBOLS: &[u8] = b" !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Lower,
    Upper,
    Digit,
    /// The same byte in both secrets.
    Fixed(u8),
}

fn draw(rng: &mut fastrand::Rng, class: Class) -> u8 {
    match class {
        // From `d`: every letter's decimal reference is as wide (`&#100;`
        // to `&#122;`), so that every encoding of the two secrets is as long.
        Class::Lower => rng.u8(b'd'..=b'z'),
        Class::Upper => rng.u8(b'A'..=b'Z'),
        Class::Digit => rng.u8(b'0'..=b'9'),
        Class::Fixed(b) => b,
    }
}

/// Two secrets of equal length and the same class at every position,
/// different at every position that is not a shared symbol or byte: every
/// encoding of one is as long as the same encoding of the other (a
/// difference in a length is a difference the host let through).
#[derive(Clone, Debug)]
pub(crate) struct Pair {
    pub kind: Kind,
    pub a: Vec<u8>,
    pub b: Vec<u8>,
}

impl Pair {
    pub(super) fn new(rng: &mut fastrand::Rng, kind: Kind, len: usize) -> Self {
        let w = RUN.min(len);
        let alnum = |rng: &mut fastrand::Rng| if rng.u8(..4) == 0 { Class::Digit } else { Class::Lower };
        let classes: Vec<Class> = loop {
            let mut c: Vec<Class> = (0..len).map(|_| alnum(rng)).collect();
            match kind {
                Kind::Alnum => {}
                Kind::Cased => {
                    for x in &mut c {
                        if *x == Class::Lower && rng.bool() {
                            *x = Class::Upper;
                        }
                    }
                    c[0] = Class::Lower;
                    c[1] = Class::Upper;
                }
                Kind::Symbols => {
                    for x in &mut c[1..len - 1] {
                        if rng.u8(..3) == 0 {
                            *x = Class::Fixed(SYMBOLS[rng.usize(..SYMBOLS.len())]);
                        }
                    }
                    // One symbol at least, and no window the two share
                    // nearly whole.
                    let fixed = |c: &[Class]| c.iter().filter(|x| matches!(x, Class::Fixed(_))).count();
                    if fixed(&c) == 0 || c.windows(w).any(|win| w - fixed(win) < 3) {
                        continue;
                    }
                }
                Kind::NonUtf8 => c[rng.usize(1..len - 1)] = Class::Fixed(0xe9),
            }
            break c;
        };
        let a: Vec<u8> = classes.iter().map(|&c| draw(rng, c)).collect();
        let b = classes
            .iter()
            .zip(&a)
            .map(|(&c, &x)| {
                loop {
                    let y = draw(rng, c);
                    if y != x || matches!(c, Class::Fixed(_)) {
                        break y;
                    }
                }
            })
            .collect();
        Self { kind, a, b }
    }

    fn secret(&self, which: usize) -> &[u8] {
        if which == 0 { &self.a } else { &self.b }
    }

    fn run(&self) -> usize {
        RUN.min(self.a.len())
    }
}

fn fold(bytes: &[u8]) -> Vec<u8> {
    bytes.to_ascii_lowercase()
}

/// Whether `text` holds a reflection of `secret` in its raw or
/// case-folded view: `min(RUN, len)` consecutive bytes of it.
pub(crate) fn holds_run(text: &[u8], secret: &[u8]) -> bool {
    let w = RUN.min(secret.len());
    let (text, secret) = (fold(text), fold(secret));
    secret.windows(w).any(|run| text.windows(w).any(|t| t == run))
}

/// A byte that is not `b`, not even up to case, and of another class.
fn other(b: u8) -> u8 {
    if b.is_ascii_digit() {
        if b == b'7' { b'q' } else { b'k' }
    } else if b == b'3' {
        b'5'
    } else {
        b'3'
    }
}

/// `secret` with the byte at every `every`-th position changed (the
/// middle one for a secret no longer than a run): no `every` consecutive
/// bytes of it are left.
fn changed(secret: &[u8], every: usize) -> Vec<u8> {
    let mut g = secret.to_vec();
    if secret.len() <= RUN {
        g[secret.len() / 2] = other(g[secret.len() / 2]);
        return g;
    }
    for i in (every - 1..g.len()).step_by(every) {
        g[i] = other(g[i]);
    }
    g
}

fn random_text(rng: &mut fastrand::Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.alphanumeric() as u8).collect()
}

/// The old attack's guesses, and some that are reflections: prefixes of
/// 1..RUN-1 bytes of each secret, each secret with a byte changed every
/// RUN-1 bytes and every RUN bytes, random text, each secret whole, a run
/// of it inside random text, and (mixed case) it with its case flipped.
fn guesses(rng: &mut fastrand::Rng, pair: &Pair) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, s) in [("a", &pair.a), ("b", &pair.b)] {
        for k in 1..pair.run() {
            out.push((format!("{name}[..{k}]"), s[..k].to_vec()));
        }
        out.push((format!("{name} changed every {}", RUN - 1), changed(s, RUN - 1)));
        out.push((format!("{name} changed every {RUN}"), changed(s, RUN)));
        out.push((format!("{name} whole"), s.to_vec()));
        let at = rng.usize(..=s.len() - pair.run());
        let mut embedded = random_text(rng, 5);
        embedded.extend_from_slice(&s[at..at + pair.run()]);
        embedded.extend(random_text(rng, 4));
        out.push((format!("{name} run at {at} in text"), embedded));
        if pair.kind == Kind::Cased {
            let flipped = s
                .iter()
                .map(|b| {
                    if b.is_ascii_lowercase() {
                        b.to_ascii_uppercase()
                    } else {
                        b.to_ascii_lowercase()
                    }
                })
                .collect();
            out.push((format!("{name} case flipped"), flipped));
        }
    }
    for i in 0..3 {
        let len = rng.usize(1..=pair.a.len() + 8);
        out.push((format!("random {i}"), random_text(rng, len)));
    }
    out
}

// ---------------------------------------------------------------------
// Programs.

/// The transport a program goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Via {
    Tcp,
    Tls,
    Redis,
    Postgres,
    Http {
        keepalive: bool,
    },
    WasiHttp,
    Grpc,
    Udp,
    /// `credentials.client-certificate` with the secret as certificate
    /// and key: no peer, an error to compare.
    Cert,
}

/// What the plugin sends for the peer to reflect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// The secret, put on the wire by the host (a header, metadata, a
    /// login's password).
    Secret,
    /// `Basic $(base64:u:$(secret:s))` in `authorization`.
    Basic,
    /// The plugin's own guess, as data.
    Guess(String, Vec<u8>),
}

/// One peer program and the step of the plugin that meets it.
#[derive(Clone, Debug)]
pub(crate) struct Prog {
    pub via: Via,
    pub what: What,
    pub encoding: Encoding,
    pub field: Field,
    pub prefix: Vec<u8>,
    pub suffix: Vec<u8>,
    /// Where the peer cuts its answer, from where the encoded payload
    /// starts.
    pub cuts: Vec<isize>,
    /// sonde `http`'s `max-body`.
    pub max_body: u32,
    /// The most one read asks for (sessions, `wasi:http` bodies).
    pub read_max: u32,
    /// A session that reflects the secret cut inside its form: the host
    /// hands on what came before the cut after QUIET, so the views may
    /// differ there, by fewer than RUN bytes of the form (checked by
    /// [`residual`]).
    pub residual: bool,
}

impl Prog {
    pub(super) fn new(via: Via, what: What, encoding: Encoding, field: Field) -> Self {
        Self {
            via,
            what,
            encoding,
            field,
            prefix: Vec::new(),
            suffix: Vec::new(),
            cuts: Vec::new(),
            max_body: 65536,
            read_max: 65536,
            residual: false,
        }
    }

    /// What the peer receives under `secret`: its payload.
    fn payload(&self, secret: &[u8]) -> Vec<u8> {
        match &self.what {
            What::Secret => secret.to_vec(),
            What::Basic => [&b"Basic "[..], &encode(Encoding::Base64, &[b"u:", secret].concat())].concat(),
            What::Guess(_, g) => g.clone(),
        }
    }

    /// Whether the peer may pause in the middle of a reflection on a
    /// session — its data, or a login's answer, which the host reads
    /// through the same stream (the host then burns the secret).
    fn may_spill(&self) -> bool {
        matches!(self.via, Via::Tcp | Via::Tls | Via::Redis | Via::Postgres) && !self.cuts.is_empty()
    }

    fn is_stream(&self) -> bool {
        matches!(self.via, Via::Tcp | Via::Tls)
            || (matches!(self.via, Via::Redis | Via::Postgres) && self.field == Field::Session)
    }

    /// The peer's side.
    pub(super) fn peer(&self) -> Program {
        let source = match (&self.via, &self.what) {
            (Via::Tcp | Via::Tls | Via::Udp, _) => Source::Data,
            (Via::Redis | Via::Postgres, _) => Source::Password,
            (_, What::Secret) => Source::Header("x-steal".into()),
            (_, What::Basic) => Source::Header("authorization".into()),
            (Via::WasiHttp, What::Guess(..)) => Source::Header("x-guess".into()),
            (_, What::Guess(..)) => Source::Body,
        };
        let mut p = Program::new(source, self.encoding, self.field);
        p.prefix = self.prefix.clone();
        p.suffix = self.suffix.clone();
        p.cuts = self.cuts.clone();
        p.pause = PAUSE;
        if self.is_stream() || self.via == Via::WasiHttp {
            p.max_write = MAX_WRITE;
        }
        p.login = match self.via {
            Via::Redis => Some(Login::Redis),
            Via::Postgres => Some(Login::Postgres),
            _ => None,
        };
        p
    }

    /// The plugin's step, for program `id` of `r`.
    pub(super) fn step(&self, id: u32, r: &Reflector) -> serde_json::Value {
        use serde_json::json;
        let handle = "$(secret:s)";
        let password = match &self.what {
            What::Guess(_, g) => String::from_utf8_lossy(g).into_owned(),
            _ => handle.to_string(),
        };
        let guess = match &self.what {
            What::Guess(_, g) => g.clone(),
            _ => Vec::new(),
        };
        let header = match &self.what {
            What::Secret => Some(("x-steal", handle.to_string())),
            What::Basic => Some(("authorization", format!("Basic $(base64:u:{handle})"))),
            What::Guess(..) => None,
        };
        let session = |addr: std::net::SocketAddr, tls: bool, send: Vec<Vec<u8>>, login: Option<serde_json::Value>| {
            json!({
                "do": "session",
                "addr": addr.to_string(),
                "tls_ca": tls.then(|| r.ca_pem.clone()),
                "send": send.iter().map(|s| hex(s)).collect::<Vec<_>>(),
                "login": login,
                "read_max": self.read_max,
                "read_ms": 4000,
            })
        };
        match self.via {
            Via::Tcp => session(r.tcp, false, vec![reflect::frame(id, &guess)], None),
            Via::Tls => session(r.tls, true, vec![reflect::frame(id, &guess)], None),
            Via::Redis => session(
                r.tcp,
                false,
                vec![reflect::frame(id, b"")],
                Some(json!({"kind": "redis", "user": "u", "password": password})),
            ),
            Via::Postgres => session(
                r.tcp,
                false,
                vec![reflect::frame(id, b""), reflect::pg_startup("u")],
                Some(json!({"kind": "postgres", "user": "u", "password": password})),
            ),
            Via::Http { keepalive } => json!({
                "do": "http",
                "url": format!("http://{}{}", r.http, reflect::http_path(id)),
                "headers": header.iter().map(|(n, v)| [n.to_string(), v.clone()]).collect::<Vec<_>>(),
                "body": hex(&guess),
                "max_body": self.max_body,
                "keepalive": keepalive,
            }),
            Via::WasiHttp => {
                let headers: Vec<[String; 2]> = match &header {
                    Some((n, v)) => vec![[n.to_string(), hex(v.as_bytes())]],
                    None => vec![["x-guess".into(), hex(&guess)]],
                };
                json!({
                    "do": "wasi_http",
                    "authority": r.http.to_string(),
                    "path": reflect::http_path(id),
                    "headers": headers,
                    "read_max": self.read_max,
                })
            }
            Via::Grpc => json!({
                "do": "grpc",
                "authority": r.grpc.to_string(),
                "method": reflect::grpc_method(id),
                "message": hex(&guess),
                "metadata": header.iter().map(|(n, v)| [n.to_string(), v.clone()]).collect::<Vec<_>>(),
            }),
            Via::Udp => json!({
                "do": "udp",
                "addr": r.udp.to_string(),
                "data": hex(&reflect::frame(id, &guess)),
                "max": 4096,
            }),
            Via::Cert => json!({"do": "cert", "addr": r.tls.to_string(), "cert": handle, "key": handle}),
        }
    }

    /// Whether the run under secret `which` of `pair` must see a
    /// reflection at this step.
    fn reflects(&self, pair: &Pair, which: usize) -> bool {
        let secret = pair.secret(which);
        if self.via == Via::Cert {
            return false;
        }
        if self.encoding.is_compression() {
            // A body with a content-encoding goes whole, whatever it holds.
            return true;
        }
        match &self.what {
            What::Secret | What::Basic => true,
            What::Guess(_, g) => {
                // What a lossy encoding keeps may still hold a run.
                let kept = if self.encoding.keeps(g) {
                    g.clone()
                } else {
                    String::from_utf8_lossy(g).into_owned().into_bytes()
                };
                let g = &kept;
                let bytewise = !self.encoding.is_binary();
                let field = if bytewise {
                    [&self.prefix[..], g, &self.suffix[..]].concat()
                } else {
                    g.clone()
                };
                holds_run(&field, secret)
            }
        }
    }

    /// Whether a reflection here may end the call in a host error rather
    /// than the marker: a header name that is no valid name, gRPC framing
    /// junk.
    fn may_fail(&self) -> bool {
        matches!(self.field, Field::HeaderName | Field::GrpcStatus | Field::ContentType)
    }

    pub(super) fn describe(&self) -> String {
        let what = match &self.what {
            What::Secret => "the secret".to_string(),
            What::Basic => "Basic u:secret".to_string(),
            What::Guess(name, g) => format!("guess {name} {:?}", String::from_utf8_lossy(g)),
        };
        format!(
            "{:?} reflecting {what} as {:?} in {:?}, prefix {:?} suffix {:?}, cuts {:?}, max-body {}, read-max {}{}",
            self.via,
            self.encoding,
            self.field,
            String::from_utf8_lossy(&self.prefix),
            String::from_utf8_lossy(&self.suffix),
            self.cuts,
            self.max_body,
            self.read_max,
            if self.residual {
                ", cut inside the secret (residual)"
            } else {
                ""
            }
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn encode(e: Encoding, data: &[u8]) -> Vec<u8> {
    reflect::encode(e, data)
}

/// Whether `encoding` writes a byte of `data` that is not ASCII as the
/// code point of the same number (`\u00e9`, `&#233;`, `&#xE9;`,
/// `\u{e9}`), as a server that read the bytes as Latin-1 does.
fn latin1_escaped(encoding: Encoding, data: &[u8]) -> bool {
    data.iter().any(|&b| b >= 0x80)
        && matches!(
            encoding,
            Encoding::Json | Encoding::HtmlDecimal | Encoding::HtmlHex | Encoding::UnicodeBraces
        )
}

/// Encodings whose form survives the lower-casing of a header name.
const NAME_ENCODINGS: [Encoding; 10] = [
    Encoding::Raw,
    Encoding::Lower,
    Encoding::Upper,
    Encoding::HexLower,
    Encoding::HexUpper,
    Encoding::HexShifted,
    Encoding::PercentUpper,
    Encoding::PercentPartial,
    Encoding::HtmlDecimal,
    Encoding::XEscapeAll,
];

/// Text around a reflection, as servers frame what they echo.
const FRAMES: [(&[u8], &[u8]); 5] = [
    (b"", b""),
    (b"echo: ", b" (end)"),
    (b"{\"headers\": {\"x-steal\": \"", b"\"}}"),
    (b"<p>you sent ", b"</p>"),
    (b"token=", b"&x=1"),
];

/// Whether `encoding` may carry `payload` into `field` of `via` so that the
/// test can say what must happen.
fn fits(via: Via, field: Field, encoding: Encoding, what: &What, payloads: &[Vec<u8>]) -> bool {
    // A `wasi:http` guess goes in a header value, whose edges a parser trims.
    if via == Via::WasiHttp
        && matches!(what, What::Guess(..))
        && payloads
            .iter()
            .any(|p| p.is_empty() || p[0].is_ascii_whitespace() || p[p.len() - 1].is_ascii_whitespace())
    {
        return false;
    }
    if encoding.is_compression() {
        return field == Field::Body && matches!(via, Via::Http { .. } | Via::WasiHttp);
    }
    // Every payload the two runs send must come through whole (the
    // guesses: the test predicts from what it keeps).
    if !matches!(what, What::Guess(..)) && payloads.iter().any(|p| !encoding.keeps(p)) {
        return false;
    }
    // The premise: what the peer writes is as long under both secrets (a
    // `Basic` value's base64 has more `/` or wider decimal references in
    // one than the other, say; the length of what was withheld, in a
    // `content-length`, is not the host's to hide).
    if let [a, b] = payloads
        && encode(encoding, a).len() != encode(encoding, b).len()
    {
        return false;
    }
    // A byte that is not UTF-8 written as a code point (`\u00e9`): its own
    // test, `a_byte_that_is_not_utf8_written_as_a_code_point_is_withheld`.
    if payloads.iter().any(|p| latin1_escaped(encoding, p)) {
        return false;
    }
    // `Basic` and base64: the contract's views decode one base64 or hex
    // layer, not base64 or hex of a base64 value (a gap, not a case), nor
    // base64 whose letters changed case.
    if *what == What::Basic && (encoding.is_binary() || matches!(encoding, Encoding::Upper | Encoding::Lower)) {
        return false;
    }
    if matches!(field, Field::HeaderName) {
        if !NAME_ENCODINGS.contains(&encoding) || *what == What::Basic {
            return false;
        }
        // A `:` or a space would end the name there: the peer would cut
        // the secret in two, which no scanner can see whole.
        if payloads.iter().any(|p| {
            encode(encoding, p)
                .iter()
                .any(|&b| b == b':' || b.is_ascii_whitespace())
        }) {
            return false;
        }
        if via == Via::Grpc {
            return payloads.iter().all(|p| {
                let name = [&b"x-"[..], &encode(encoding, p)].concat().to_ascii_lowercase();
                http::HeaderName::from_bytes(&name).is_ok()
            });
        }
    }
    if matches!(via, Via::Redis | Via::Postgres) {
        // A login's password is text.
        return payloads.iter().all(|p| std::str::from_utf8(p).is_ok());
    }
    true
}

fn fields(via: Via) -> &'static [Field] {
    match via {
        Via::Tcp | Via::Tls => &[Field::Session],
        Via::Redis | Via::Postgres => &[Field::LoginError, Field::Session],
        Via::Http { .. } => &[Field::HeaderName, Field::HeaderValue, Field::Body, Field::Body],
        Via::WasiHttp => &[Field::HeaderName, Field::HeaderValue, Field::Body, Field::Trailer],
        Via::Grpc => &[
            Field::HeaderName,
            Field::HeaderValue,
            Field::Body,
            Field::Trailer,
            Field::StatusMessage,
            Field::GrpcStatus,
            Field::ContentType,
        ],
        Via::Udp => &[Field::Datagram],
        Via::Cert => &[Field::Nothing],
    }
}

/// One random program for `pair`.
fn generate(rng: &mut fastrand::Rng, pair: &Pair, all_guesses: &[(String, Vec<u8>)]) -> Prog {
    loop {
        let via = match rng.u8(..20) {
            0..=3 => Via::Tcp,
            4 => Via::Tls,
            5 | 6 => Via::Redis,
            7 => Via::Postgres,
            8..=11 => Via::Http { keepalive: rng.bool() },
            12..=14 => Via::WasiHttp,
            15..=17 => Via::Grpc,
            18 => Via::Udp,
            _ => Via::Cert,
        };
        let what = match via {
            Via::Tcp | Via::Tls | Via::Udp => None,
            Via::Cert => Some(What::Secret),
            Via::Http { .. } | Via::WasiHttp | Via::Grpc if rng.u8(..8) == 0 => Some(What::Basic),
            _ if rng.bool() => Some(What::Secret),
            _ => None,
        };
        let what = what.unwrap_or_else(|| {
            let (name, g) = &all_guesses[rng.usize(..all_guesses.len())];
            What::Guess(name.clone(), g.clone())
        });
        let field = fields(via)[rng.usize(..fields(via).len())];
        let payloads = [
            Prog::new(via, what.clone(), Encoding::Raw, field).payload(&pair.a),
            Prog::new(via, what.clone(), Encoding::Raw, field).payload(&pair.b),
        ];
        let encoding = Encoding::ALL[rng.usize(..Encoding::ALL.len())];
        if !fits(via, field, encoding, &what, &payloads) {
            continue;
        }
        let mut p = Prog::new(via, what, encoding, field);
        if !matches!(field, Field::HeaderName | Field::GrpcStatus | Field::Nothing) {
            let (prefix, suffix) = FRAMES[rng.usize(..FRAMES.len())];
            p.prefix = prefix.to_vec();
            p.suffix = suffix.to_vec();
        }
        let (_, _, len) = layout(&p, &payloads[0]);
        let stream = p.is_stream() || via == Via::WasiHttp;
        if stream
            || (matches!(via, Via::Http { .. }) && rng.u8(..3) == 0)
            || (field == Field::LoginError && rng.u8(..4) == 0)
        {
            let secret_stream = p.is_stream() && !matches!(p.what, What::Guess(..));
            for _ in 0..rng.usize(..=2) {
                let at = if secret_stream {
                    // Outside the secret's form: a cut inside it is the
                    // residual the class 2 test checks.
                    if rng.bool() {
                        -(rng.usize(..=3) as isize)
                    } else {
                        (len + rng.usize(..=3)) as isize
                    }
                } else {
                    rng.isize(-3..=len as isize + 3)
                };
                p.cuts.push(at);
            }
        }
        if matches!(via, Via::Http { .. }) {
            p.max_body = match (field, rng.u8(..3)) {
                (Field::Body, 0) => 65536,
                (Field::Body, _) => (p.prefix.len() as isize + rng.isize(-3..=len as isize + 3)).max(0) as u32,
                (_, 0) => rng.u32(..8),
                _ => 65536,
            };
        }
        p.read_max = [7, 64, 65536][rng.usize(..3)];
        return p;
    }
}

/// The encoded payload's place in the peer's stream of `p` for `payload`:
/// the whole stream, where the encoded payload starts, and its length.
fn layout(p: &Prog, payload: &[u8]) -> (Vec<u8>, usize, usize) {
    let peer = p.peer();
    let (bytes, mark) = peer.render(payload);
    let len = if p.encoding.is_compression() {
        bytes.len()
    } else {
        encode(p.encoding, payload).len()
    };
    (bytes, mark, len)
}

// ---------------------------------------------------------------------
// Running and reading the plugin's views.

/// What one run of `views` reported.
pub(crate) struct Seen {
    /// Per step: `hash40 << 8 | markers << 1 | failed`.
    pub steps: Vec<u64>,
    /// The transcripts the detail held, by step.
    pub transcripts: HashMap<usize, Vec<u8>>,
}

fn markers(packed: u64) -> u64 {
    (packed >> 1) & 127
}

fn failed(packed: u64) -> bool {
    packed & 1 == 1
}

fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (u32::from(value(c)) << (18 - 6 * i)));
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

fn seen(r: &RunResult, steps: usize) -> Seen {
    assert_eq!(r.status, Status::Success, "the views run failed: {r:?}");
    let mut values = vec![None; steps];
    for m in &r.metrics {
        if let Some(i) = m.name.strip_prefix('s').and_then(|i| i.parse::<usize>().ok())
            && i < steps
        {
            values[i] = Some(m.value as u64);
        }
    }
    let steps = values
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.unwrap_or_else(|| panic!("no metric for step {i}: {r:?}")))
        .collect();
    let mut transcripts = HashMap::new();
    for entry in r.detail.as_deref().unwrap_or_default().split(';') {
        if let Some((i, b64)) = entry.split_once('=')
            && let Ok(i) = i.parse::<usize>()
        {
            transcripts.insert(i, unbase64(b64).into_iter().map(|b| b ^ 0x5a).collect());
        }
    }
    Seen { steps, transcripts }
}

/// One record of a transcript.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub tag: u8,
    pub data: Vec<u8>,
}

pub(crate) fn items(transcript: &[u8]) -> Vec<Item> {
    let mut out = Vec::new();
    let mut rest = transcript;
    while rest.len() >= 5 {
        let len = u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let end = (5 + len).min(rest.len());
        out.push(Item {
            tag: rest[0],
            data: rest[5..end].to_vec(),
        });
        rest = &rest[end..];
    }
    out
}

fn show(items: &[Item]) -> String {
    let mut out = String::new();
    for (i, it) in items.iter().enumerate() {
        let _ = writeln!(
            out,
            "    {i:3} {} ({} bytes) {}",
            it.tag as char,
            it.data.len(),
            it.data.escape_ascii()
        );
    }
    out
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

/// The peers, the plugin, and what the runs are granted.
pub(crate) struct Harness {
    pub r: Reflector,
    plugin: Arc<Plugin>,
    net: Vec<String>,
}

/// A failed check: the report, and the steps to run alone.
type Failures = Vec<(usize, String)>;

impl Harness {
    pub(super) async fn new() -> Self {
        let r = Reflector::start().await;
        let net = [r.tcp, r.tls, r.http, r.grpc, r.udp]
            .iter()
            .map(|a| a.to_string())
            .collect();
        Self {
            r,
            plugin: guest(guests::STEAL_SECRET).await,
            net,
        }
    }

    fn grants(&self, secret: &[u8]) -> Grants {
        Grants {
            secrets: SecretGrants::new(vec![Arc::new(SecretCell::given(
                "s",
                Arc::from("default"),
                "env S",
                SecretValue::new(secret.to_vec()),
            ))]),
            net: self.net.iter().map(|n| n.parse().unwrap()).collect(),
            ..Grants::default()
        }
    }

    /// Runs `config` once under `secret`, for a tenant of its own (a
    /// keep-alive pool of its own).
    async fn run(&self, secret: &[u8], config: &str) -> RunResult {
        let tenant: Arc<str> = Arc::from(format!("differential-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
        let grants = Arc::new(self.grants(secret));
        let call = Call {
            probe: "differential",
            target: "",
            config,
            limits: Limits {
                timeout: CALL,
                ..Limits::default()
            },
            grants: &grants,
            attempt: 1,
            observe: true,
        };
        engine().run_for(&tenant, &self.plugin, &call).await
    }

    /// Runs `steps` under both secrets at once.
    pub(super) async fn run_pair(&self, pair: &Pair, steps: &[serde_json::Value], show: &[usize]) -> [Seen; 2] {
        let config = serde_json::json!({"mode": "views", "marker": WITHHELD, "steps": steps, "show": show}).to_string();
        let (a, b) = tokio::join!(self.run(&pair.a, &config), self.run(&pair.b, &config));
        [seen(&a, steps.len()), seen(&b, steps.len())]
    }

    /// Both transcripts of step `step` run alone.
    pub(super) async fn alone(&self, pair: &Pair, step: &serde_json::Value) -> [Vec<Item>; 2] {
        let [a, b] = self.run_pair(pair, std::slice::from_ref(step), &[0]).await;
        let t = |s: &Seen| items(s.transcripts.get(&0).map(Vec::as_slice).unwrap_or_default());
        [t(&a), t(&b)]
    }

    /// Registers `progs`, runs them under both secrets of `pair` and checks
    /// every step; panics with a report naming each failed step.
    ///
    /// A peer that pauses in the middle of a reflection on a session makes
    /// the host burn the probe's secrets (refused until they change: the
    /// call's later uses of them fail). So a run holds first the steps that
    /// cannot spill, then those that may but use no secret (guesses), and
    /// at most one that may spill and uses the secret, last.
    pub(super) async fn check(&self, pair: &Pair, progs: &[Prog]) {
        let report = self.report(pair, progs).await;
        assert!(report.is_empty(), "{report}");
    }

    /// What [`check`](Self::check) would panic with: empty when every step
    /// passed.
    pub(super) async fn report(&self, pair: &Pair, progs: &[Prog]) -> String {
        let rank = |p: &Prog| match (p.may_spill(), matches!(p.what, What::Guess(..))) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        };
        let of = |r: usize| progs.iter().filter(move |p| rank(p) == r).cloned().collect::<Vec<_>>();
        let (safe, spill_secret, spill_guess) = (of(0), of(1), of(2));
        // Runs of the steps that cannot spill, each ended by one that may
        // and uses the secret; those left run alone; then those that may
        // spill but use no secret.
        let mut batches: Vec<Vec<Prog>> = safe.chunks(BATCH - 1).map(<[Prog]>::to_vec).collect();
        let mut spilling = spill_secret.into_iter();
        for batch in &mut batches {
            batch.extend(spilling.next());
        }
        batches.extend(spilling.map(|p| vec![p]));
        batches.extend(spill_guess.chunks(BATCH).map(<[Prog]>::to_vec));
        let mut report = String::new();
        // A few runs at once: the peers' pauses, not the machine, set
        // their pace.
        for group in batches.chunks(3) {
            let results = futures_util::future::join_all(group.iter().map(|b| self.check_batch(pair, b))).await;
            for (batch, failures) in group.iter().zip(results) {
                for (i, why) in failures {
                    let p = &batch[i];
                    let _ = writeln!(report, "step {:?}: {}\n  {why}", p.via, p.describe());
                }
            }
        }
        if report.is_empty() {
            return report;
        }
        format!(
            "secrets {:?} {:?} ({:?}, {} bytes):\n{report}",
            pair.a.escape_ascii().to_string(),
            pair.b.escape_ascii().to_string(),
            pair.kind,
            pair.a.len()
        )
    }

    async fn check_batch(&self, pair: &Pair, progs: &[Prog]) -> Failures {
        let ids: Vec<u32> = progs
            .iter()
            .map(|p| if p.via == Via::Cert { 0 } else { self.r.add(p.peer()) })
            .collect();
        let steps: Vec<serde_json::Value> = progs.iter().zip(&ids).map(|(p, &id)| p.step(id, &self.r)).collect();
        let expect: Vec<[bool; 2]> = progs
            .iter()
            .map(|p| [p.reflects(pair, 0), p.reflects(pair, 1)])
            .collect();
        let show: Vec<usize> = (0..progs.len())
            .filter(|&i| expect[i][0] != expect[i][1] || progs[i].residual)
            .collect();
        let [a, b] = self.run_pair(pair, &steps, &show).await;
        let mut failures = Failures::new();
        for (i, p) in progs.iter().enumerate() {
            let (va, vb) = (a.steps[i], b.steps[i]);
            // The peer received what each run sent.
            if p.via != Via::Cert {
                let mut got = self.r.received(ids[i]);
                let mut want = vec![p.payload(&pair.a), p.payload(&pair.b)];
                got.sort();
                want.sort();
                if got != want {
                    failures.push((
                        i,
                        format!(
                            "the peer did not receive what the runs sent: got {:?}, want {:?}",
                            got.iter().map(|g| g.escape_ascii().to_string()).collect::<Vec<_>>(),
                            want.iter().map(|g| g.escape_ascii().to_string()).collect::<Vec<_>>()
                        ),
                    ));
                    continue;
                }
            }
            let why = match expect[i] {
                _ if p.residual => {
                    let t = |s: &Seen| s.transcripts.get(&i).map(|t| items(t));
                    let (ta, tb) = match (t(&a), t(&b)) {
                        (Some(ta), Some(tb)) => (ta, tb),
                        _ => {
                            let [ta, tb] = self.alone(pair, &steps[i]).await;
                            (ta, tb)
                        }
                    };
                    residual(p, pair, &ta, &tb).err()
                }
                [ea, eb] if ea == eb => {
                    if va != vb && !self.same_when_run_again(pair, &steps[i]).await {
                        Some(self.diagnose(pair, &steps[i], va, vb).await)
                    } else if ea && markers(va) == 0 && !(p.may_fail() && failed(va)) {
                        Some(format!(
                            "a reflection under both secrets, and no marker{}",
                            if failed(va) { " (the step failed)" } else { "" }
                        ))
                    } else if !ea && markers(va) != 0 {
                        Some(format!("no reflection, yet {} markers under both secrets", markers(va)))
                    } else {
                        None
                    }
                }
                // A field that is no valid answer may end both calls in the
                // same host error, which tells nothing.
                _ if p.may_fail() && va == vb && failed(va) => None,
                [ea, _] => {
                    let (w, o) = if ea { (0, 1) } else { (1, 0) };
                    let runs = [&a, &b];
                    let t = |s: &Seen| s.transcripts.get(&i).map(|t| items(t));
                    let (tw, to) = match (t(runs[w]), t(runs[o])) {
                        (Some(tw), Some(to)) => (tw, to),
                        _ => {
                            let both = self.alone(pair, &steps[i]).await;
                            (both[w].clone(), both[o].clone())
                        }
                    };
                    let secret = pair.secret(w);
                    only_the_marker_differs(p, secret, &tw, &to)
                        .err()
                        .map(|e| format!("a reflection of secret {} only: {e}", ["a", "b"][w]))
                }
            };
            if let Some(why) = why {
                failures.push((i, why));
            }
        }
        failures
    }

    /// Whether a step whose views differed gives the same view under both
    /// secrets in one of three runs of it alone: a difference that comes
    /// and goes is the machine's pace (a peer's pause read as a quiet
    /// session under load), not the secret, which would make every run
    /// differ.
    async fn same_when_run_again(&self, pair: &Pair, step: &serde_json::Value) -> bool {
        for _ in 0..3 {
            let [a, b] = self.run_pair(pair, std::slice::from_ref(step), &[]).await;
            if a.steps[0] == b.steps[0] {
                return true;
            }
        }
        false
    }

    /// Why two views of one step differ: the step run alone under both
    /// secrets, both transcripts and where they first differ.
    async fn diagnose(&self, pair: &Pair, step: &serde_json::Value, va: u64, vb: u64) -> String {
        let [ta, tb] = self.alone(pair, step).await;
        let mut out = format!(
            "the views differ (hashes {:x} / {:x}, markers {} / {}, failed {} / {})",
            va >> 8,
            vb >> 8,
            markers(va),
            markers(vb),
            failed(va),
            failed(vb)
        );
        if ta == tb {
            out.push_str("; run alone, they are the same (timing?)");
        } else {
            let first = ta
                .iter()
                .zip(&tb)
                .position(|(x, y)| x != y)
                .unwrap_or(ta.len().min(tb.len()));
            let _ = write!(out, "; run alone, they first differ at record {first}");
            if let (Some(x), Some(y)) = (ta.get(first), tb.get(first)) {
                let at = x.data.iter().zip(&y.data).position(|(p, q)| p != q).unwrap_or(0);
                let _ = write!(
                    out,
                    ", byte {at}: `{}` / `{}`",
                    x.data[at.min(x.data.len())..].escape_ascii(),
                    y.data[at.min(y.data.len())..].escape_ascii()
                );
            }
        }
        let _ = write!(out, "\n  under a:\n{}  under b:\n{}", show(&ta), show(&tb));
        out
    }
}

/// Whether `data` is the marker, or `items` (reads) spell it. A login's
/// error that quotes only the marker counts too (the property is the same;
/// the contract's `refused(WITHHELD)` is
/// `a_login_refusal_that_reflects_is_refused_with_the_marker`'s to check).
fn is_marker(items: &[Item]) -> bool {
    let login_error = |i: &Item| {
        i.tag == b'X'
            && i.data.starts_with(b"TlsError::")
            && i.data.windows(WITHHELD.len()).any(|w| w == WITHHELD.as_bytes())
    };
    match items {
        [one] => one.data == WITHHELD.as_bytes() || login_error(one),
        [n, v] if n.data == WITHHELD_HEADER.as_bytes() && v.data == WITHHELD.as_bytes() => true,
        many => {
            many.iter().all(|i| i.tag == b'r')
                && many.iter().flat_map(|i| i.data.clone()).collect::<Vec<u8>>() == WITHHELD.as_bytes()
        }
    }
}

/// The check of a step that reflects under one secret only: the view that
/// holds the reflection (`w`) is the other view (`o`) with the marker in
/// place of what reflected, nothing else: `o` is P, X, S and `w` is P, M,
/// S, where M is the marker (a record, a header pair, or reads that spell
/// it) and X what it replaced: one field for one field, or, on a stream,
/// the rest of the stream (a session is finished after a hit, a
/// `wasi:http` body ends). On a stream the marker stands for everything
/// from LAG bytes before the reflection's end, so the last read before it
/// may be a shorter prefix of the other view's read there (P, T, M, S,
/// with T a prefix of X's first read). What was handed on before the
/// marker holds no run of the secret.
fn only_the_marker_differs(p: &Prog, secret: &[u8], w: &[Item], o: &[Item]) -> Result<(), String> {
    let shown = || format!("\n  with the reflection:\n{}  without:\n{}", show(w), show(o));
    let common = w.iter().zip(o).take_while(|(x, y)| x == y).count();
    if common == w.len() && common == o.len() {
        return Err(format!("the views are the same: no marker{}", shown()));
    }
    let stream = p.is_stream() || (p.via == Via::WasiHttp && matches!(p.field, Field::Body));
    // Where the marker may start: right after the common records, or, on
    // a stream, after a read cut short.
    let mut starts = vec![common];
    if stream
        && let (Some(t), Some(x)) = (w.get(common), o.get(common))
        && t.tag == b'r'
        && x.tag == b'r'
        && t.data.len() < x.data.len()
        && x.data.starts_with(&t.data)
    {
        starts.push(common + 1);
    }
    let found = starts.iter().copied().find(|&m_start| {
        (m_start + 1..=w.len()).any(|m_end| {
            let suffix = &w[m_end..];
            if suffix.len() > o.len() - common || !o.ends_with(suffix) || !is_marker(&w[m_start..m_end]) {
                return false;
            }
            let replaced = o.len() - common - suffix.len();
            replaced > 0 && (stream || replaced == m_end - m_start)
        })
    });
    let Some(m_start) = found else {
        return Err(format!(
            "the view with the reflection is not the other with the marker in place of one field or the rest of a stream{}",
            shown()
        ));
    };
    let handed: Vec<u8> = w[..m_start]
        .iter()
        .filter(|i| i.tag == b'r')
        .flat_map(|i| i.data.clone())
        .collect();
    if holds_run(&handed, secret) {
        return Err(format!(
            "a run of the secret was handed on before the marker{}",
            shown()
        ));
    }
    // At that place: on a session, what was handed on before the marker
    // ends before the reflection does.
    if p.is_stream()
        && let What::Guess(_, g) = &p.what
        && p.encoding.keeps(g)
    {
        let (_, mark, _) = layout(p, g);
        let w_len = RUN.min(secret.len());
        let at = (0..=g.len().saturating_sub(w_len))
            .find(|&i| holds_run(&g[i..i + w_len], secret))
            .unwrap_or(0);
        // Where the run's form ends (a base64 group later at most).
        let end = mark + encode(p.encoding, &g[..(at + w_len).min(g.len())]).len() + 4;
        if handed.len() >= end {
            return Err(format!(
                "the marker came after the reflection's end ({} bytes handed on, the reflection ends at {end}){}",
                handed.len(),
                shown()
            ));
        }
    }
    Ok(())
}

/// The check of a session that reflects the secret cut inside its form:
/// both views end in the marker at the same read; before it they are the
/// same but in the bytes of the form handed on at the cut, fewer than a
/// run of the secret.
fn residual(p: &Prog, pair: &Pair, a: &[Item], b: &[Item]) -> Result<(), String> {
    let shown = || format!("\n  under a:\n{}  under b:\n{}", show(a), show(b));
    if a.len() != b.len()
        || a.iter()
            .zip(b)
            .any(|(x, y)| x.tag != y.tag || x.data.len() != y.data.len())
    {
        return Err(format!("the views differ in more than bytes of the form{}", shown()));
    }
    let marker = a.iter().position(|i| i.data == WITHHELD.as_bytes());
    if marker.is_none() || marker != b.iter().position(|i| i.data == WITHHELD.as_bytes()) {
        return Err(format!("no marker at the same read in both{}", shown()));
    }
    let handed = |t: &[Item]| -> Vec<u8> {
        t[..marker.unwrap_or(0)]
            .iter()
            .filter(|i| i.tag == b'r')
            .flat_map(|i| i.data.clone())
            .collect()
    };
    let (ha, hb) = (handed(a), handed(b));
    let (_, mark, _) = layout(p, &pair.a);
    if let Some(first) = ha.iter().zip(&hb).position(|(x, y)| x != y)
        && first < mark
    {
        return Err(format!("the views differ before the reflection starts{}", shown()));
    }
    if holds_run(&ha, &pair.a) || holds_run(&hb, &pair.b) {
        return Err(format!("a run of the secret was handed on{}", shown()));
    }
    if a[marker.unwrap_or(0) + 1..] != b[marker.unwrap_or(0) + 1..] {
        return Err(format!("the views differ after the marker{}", shown()));
    }
    Ok(())
}

// ---------------------------------------------------------------------
// The tests.

/// Generated peer programs: every transport, field, encoding, chunking,
/// `max-body` cut and guess, under pairs of secrets of each kind and
/// length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_are_identical_across_secrets_for_generated_peer_programs() {
    let target = "views_are_identical_across_secrets_for_generated_peer_programs";
    let h = Harness::new().await;
    let mut report = String::new();
    for (case, mut rng) in cases(target, 3) {
        let kind = KINDS[rng.usize(..KINDS.len())];
        let len = LENGTHS[rng.usize(..LENGTHS.len())];
        let pair = Pair::new(&mut rng, kind, len);
        let all = guesses(&mut rng, &pair);
        let progs: Vec<Prog> = (0..BATCH).map(|_| generate(&mut rng, &pair, &all)).collect();
        let failed = h.report(&pair, &progs).await;
        if !failed.is_empty() {
            let _ = writeln!(
                report,
                "case with seed {seed} failed; replay it with\n  SONDE_FUZZ_SEED={seed} SONDE_FUZZ_ITERS=1 \
                 cargo test --workspace --test all -- secrets::differential::{target}\n{failed}",
                seed = case.seed
            );
        }
    }
    assert!(report.is_empty(), "{report}");
}

/// A pair of secrets for a named test: `kind` and `len`, random from the
/// test's seed (printed).
fn named_pair(target: &'static str, kind: Kind, len: usize) -> (Case, Pair, fastrand::Rng) {
    let (case, mut rng) = cases(target, 1).next().expect("one case");
    let pair = Pair::new(&mut rng, kind, len);
    (case, pair, rng)
}

fn guess(name: &str, g: &[u8]) -> What {
    What::Guess(name.to_string(), g.to_vec())
}

/// Class 1, "the scrubber is an oracle": a plugin sends its own guesses to
/// an echo — prefixes of 1..RUN-1 bytes of a secret, the secret with a
/// byte changed every RUN-1 or RUN bytes, random text — and watches what
/// comes back and how the reads split (the old design held back a tail
/// that partly matched). Through a TCP echo read a byte at a time, a TLS
/// echo, and an HTTP echo on a kept-alive connection (the body, and a
/// header in hex), every view is the same under both secrets; only a guess
/// that holds a run of one secret differs, by the marker alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class1_the_scrubber_is_no_oracle_guess_by_guess() {
    let h = Harness::new().await;
    let (_case, pair, mut rng) = named_pair("class1_the_scrubber_is_no_oracle_guess_by_guess", Kind::Symbols, 24);
    let all = guesses(&mut rng, &pair);
    let mut progs = Vec::new();
    for (name, g) in &all {
        let mut tcp = Prog::new(Via::Tcp, guess(name, g), Encoding::Raw, Field::Session);
        tcp.read_max = 1;
        progs.push(tcp);
        progs.push(Prog::new(Via::Tls, guess(name, g), Encoding::Raw, Field::Session));
        let mut body = Prog::new(
            Via::Http { keepalive: true },
            guess(name, g),
            Encoding::Raw,
            Field::Body,
        );
        body.prefix = b"you sent: ".to_vec();
        progs.push(body);
        progs.push(Prog::new(
            Via::Http { keepalive: true },
            guess(name, g),
            Encoding::HexLower,
            Field::HeaderValue,
        ));
    }
    h.check(&pair, &progs).await;
}

/// Class 2, "a whole form cut at a boundary": a reflection cut at every
/// offset — a TCP echo of a guess that is the whole secret, split into two
/// writes at each byte; a `wasi:http` body and an HTTP body split so; a
/// sonde `http` body cut by `max-body` at every offset across the secret
/// (raw and in hex, keep-alive on and off); the echo of a Redis login cut
/// inside the password. The plugin never gets RUN consecutive bytes of the
/// secret: where both runs reflect, their views are the same (so they hold
/// no byte that depends on the secret); where one does, what came before
/// the marker holds no run. A session cut inside the secret itself is the
/// one residual: the bytes before the cut are handed on after QUIET, fewer
/// than a run, and the views may differ there and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class2_no_cut_hands_on_a_run_of_a_reflected_secret() {
    let h = Harness::new().await;
    let (_case, pair, _) = named_pair("class2_no_cut_hands_on_a_run_of_a_reflected_secret", Kind::Alnum, 24);
    let len = pair.a.len() as isize;
    let mut progs = Vec::new();
    for k in 1..len {
        let mut tcp = Prog::new(Via::Tcp, guess("a whole", &pair.a), Encoding::Raw, Field::Session);
        tcp.prefix = b"echo: ".to_vec();
        tcp.cuts = vec![k];
        progs.push(tcp);
        let mut wasi = Prog::new(Via::WasiHttp, What::Secret, Encoding::Raw, Field::Body);
        wasi.prefix = b"you sent: ".to_vec();
        wasi.cuts = vec![k];
        wasi.read_max = 7;
        progs.push(wasi);
        let mut body = Prog::new(Via::Http { keepalive: false }, What::Secret, Encoding::Raw, Field::Body);
        body.cuts = vec![k];
        progs.push(body);
        let mut redis = Prog::new(Via::Redis, What::Secret, Encoding::Raw, Field::Session);
        redis.prefix = b"+ECHO ".to_vec();
        redis.cuts = vec![k];
        redis.residual = true;
        progs.push(redis);
    }
    for (encoding, keepalive) in [
        (Encoding::Raw, true),
        (Encoding::Raw, false),
        (Encoding::HexLower, false),
    ] {
        let form = encode(encoding, &pair.a).len() as isize;
        for k in -2..=form + 2 {
            let mut p = Prog::new(Via::Http { keepalive }, What::Secret, encoding, Field::Body);
            p.prefix = b"{\"x-steal\": \"".to_vec();
            p.suffix = b"\"}".to_vec();
            p.max_body = (p.prefix.len() as isize + k) as u32;
            progs.push(p);
        }
    }
    h.check(&pair, &progs).await;
}

/// Class 3, "reflections in encodings real servers use": the secret the
/// host sent, reflected in each [`Encoding`] into an HTTP body and header
/// value, a `wasi:http` body and trailer, a gRPC message, metadata value
/// and status message, a Redis and a PostgreSQL login's refusal and the
/// session after a login, and the plugin's guess of the whole secret into
/// a TCP session and a UDP reply; header names and gRPC metadata names in
/// the encodings a name can carry; gRPC `grpc-status` and `content-type`
/// junk (a host error that must not quote it); gzip and deflate bodies
/// (withheld whole whatever they hold, the host having asked for
/// identity). Secrets with symbols, with a byte that is not UTF-8, and
/// with both cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class3_reflections_in_the_encodings_real_servers_use_are_withheld() {
    let h = Harness::new().await;
    let target = "class3_reflections_in_the_encodings_real_servers_use_are_withheld";
    let (_case, mut rng) = cases(target, 1).next().expect("one case");
    let mut report = String::new();
    let every = [
        (Via::Http { keepalive: false }, Field::Body),
        (Via::Http { keepalive: true }, Field::HeaderValue),
        (Via::WasiHttp, Field::Body),
        (Via::WasiHttp, Field::Trailer),
        (Via::Grpc, Field::Body),
        (Via::Grpc, Field::HeaderValue),
        (Via::Grpc, Field::Trailer),
        (Via::Grpc, Field::StatusMessage),
        (Via::Redis, Field::LoginError),
        (Via::Postgres, Field::LoginError),
        (Via::Redis, Field::Session),
    ];
    // Every field for the secret with symbols (what escapes change);
    // fewer for the others, whose every byte is a letter or digit but one.
    let some = [
        (Via::Http { keepalive: false }, Field::Body),
        (Via::WasiHttp, Field::Trailer),
        (Via::Grpc, Field::HeaderValue),
        (Via::Grpc, Field::StatusMessage),
        (Via::Postgres, Field::LoginError),
    ];
    for (kind, len, secret_fields) in [
        (Kind::Symbols, 24, &every[..]),
        (Kind::NonUtf8, 12, &some[..]),
        (Kind::Cased, 11, &some[..]),
    ] {
        let pair = Pair::new(&mut rng, kind, len);
        let mut progs = Vec::new();
        for encoding in Encoding::ALL {
            for &(via, field) in secret_fields {
                let payloads = [pair.a.clone(), pair.b.clone()];
                if fits(via, field, encoding, &What::Secret, &payloads) {
                    let mut p = Prog::new(via, What::Secret, encoding, field);
                    let (prefix, suffix) = FRAMES[rng.usize(..FRAMES.len())];
                    (p.prefix, p.suffix) = (prefix.to_vec(), suffix.to_vec());
                    progs.push(p);
                }
            }
            let whole = guess("a whole", &pair.a);
            for (via, field) in [(Via::Tcp, Field::Session), (Via::Udp, Field::Datagram)] {
                if !encoding.is_compression() && !latin1_escaped(encoding, &pair.a) {
                    progs.push(Prog::new(via, whole.clone(), encoding, field));
                }
            }
            for via in [Via::Http { keepalive: false }, Via::WasiHttp, Via::Grpc] {
                let payloads = [pair.a.clone(), pair.b.clone()];
                if fits(via, Field::HeaderName, encoding, &What::Secret, &payloads) {
                    progs.push(Prog::new(via, What::Secret, encoding, Field::HeaderName));
                }
            }
        }
        for encoding in [Encoding::Raw, Encoding::Base64, Encoding::HexLower, Encoding::Json] {
            for field in [Field::GrpcStatus, Field::ContentType] {
                progs.push(Prog::new(Via::Grpc, What::Secret, encoding, field));
            }
        }
        // A compressed body goes whole even when it reflects nothing.
        for via in [Via::Http { keepalive: false }, Via::WasiHttp] {
            for encoding in [Encoding::Gzip, Encoding::Deflate] {
                progs.push(Prog::new(
                    via,
                    guess("random", b"nothing of a secret"),
                    encoding,
                    Field::Body,
                ));
            }
        }
        report.push_str(&h.report(&pair, &progs).await);
    }
    assert!(report.is_empty(), "{report}");
}

impl Pair {
    /// `self` with the same symbol every `every` bytes in both secrets:
    /// no run of either is free of one.
    fn with_symbol_every(mut self, every: usize, symbol: u8) -> Self {
        for i in (every - 1..self.a.len() - 1).step_by(every) {
            self.a[i] = symbol;
            self.b[i] = symbol;
        }
        self.kind = Kind::Symbols;
        self
    }
}

/// Class 3: a secret byte that is not UTF-8 (0xe9), reflected by a server
/// that read the bytes as Latin-1 (a Java servlet's header, Python's
/// `latin-1` codec) and wrote it as the code point of the same number:
/// `\u00e9` in JSON, `&#233;` or `&#xE9;` in HTML, `\u{e9}`. The secret
/// comes back whole in another spelling: a reflection, withheld (the
/// stricter reading of the contract's `\uXXXX` and `&#NNN;` views: a code
/// point below 256 stands for that byte too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_that_is_not_utf8_written_as_a_code_point_is_withheld() {
    let h = Harness::new().await;
    let (_case, mut rng) = cases("a_byte_that_is_not_utf8_written_as_a_code_point_is_withheld", 1)
        .next()
        .expect("one case");
    let mut report = String::new();
    for len in [8, 12] {
        let pair = Pair::new(&mut rng, Kind::NonUtf8, len);
        let mut progs = Vec::new();
        for encoding in [
            Encoding::Json,
            Encoding::HtmlDecimal,
            Encoding::HtmlHex,
            Encoding::UnicodeBraces,
        ] {
            for (via, field) in [
                (Via::Http { keepalive: false }, Field::Body),
                (Via::WasiHttp, Field::Trailer),
                (Via::Grpc, Field::HeaderValue),
                (Via::Redis, Field::LoginError),
            ] {
                progs.push(Prog::new(via, What::Secret, encoding, field));
            }
            progs.push(Prog::new(Via::Tcp, guess("a whole", &pair.a), encoding, Field::Session));
        }
        report.push_str(&h.report(&pair, &progs).await);
    }
    assert!(report.is_empty(), "{report}");
}

/// Class 3: gRPC's `grpc-message` is percent-encoded on the wire and
/// handed to the plugin decoded; a status message that reflects the
/// secret percent-encoded (or form-encoded) is withheld, as the plugin
/// reads it, not only as the wire carries it (where it is encoded twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_status_messages_are_checked_as_the_plugin_reads_them() {
    let h = Harness::new().await;
    let (_case, pair, _) = named_pair(
        "grpc_status_messages_are_checked_as_the_plugin_reads_them",
        Kind::Alnum,
        24,
    );
    let pair = pair.with_symbol_every(5, b'/');
    let mut progs = Vec::new();
    for encoding in [
        Encoding::Raw,
        Encoding::PercentUpper,
        Encoding::PercentLower,
        Encoding::PercentPartial,
        Encoding::Form,
        Encoding::Json,
        Encoding::HtmlHex,
    ] {
        let mut p = Prog::new(Via::Grpc, What::Secret, encoding, Field::StatusMessage);
        p.prefix = b"bad token: ".to_vec();
        progs.push(p);
    }
    h.check(&pair, &progs).await;
}

/// A login whose server answer reflects the password (the secret the host
/// sent, or a guess the plugin sent as its password), in one write or cut
/// before the reflection, with different words around it: its outcome is
/// the marker, and the same for every such answer, so no byte the server
/// sent reaches the plugin. The contract says `refused(WITHHELD)`; the host
/// withholds the answer before its parser reads it and fails the login
/// with the marker (`login: the server's answer reflected the password:
/// [withheld: ...]`); either is the marker and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_answer_that_reflects_gives_the_marker_and_no_server_byte() {
    let h = Harness::new().await;
    let (_case, pair, _) = named_pair(
        "a_login_answer_that_reflects_gives_the_marker_and_no_server_byte",
        Kind::Alnum,
        24,
    );
    let mut progs = Vec::new();
    for via in [Via::Redis, Via::Postgres] {
        for (what, cuts, prefix) in [
            (What::Secret, vec![], &b"bad password "[..]),
            (What::Secret, vec![-4], b"WRONGPASS for "),
            (guess("a whole", &pair.a), vec![], b"no such password: "),
            (guess("a whole", &pair.a), vec![-4], b"denied "),
        ] {
            let mut p = Prog::new(via, what, Encoding::Raw, Field::LoginError);
            p.prefix = prefix.to_vec();
            p.cuts = cuts;
            progs.push(p);
        }
    }
    let ids: Vec<u32> = progs.iter().map(|p| h.r.add(p.peer())).collect();
    let steps: Vec<serde_json::Value> = progs.iter().zip(&ids).map(|(p, &id)| p.step(id, &h.r)).collect();
    let mut outcomes: Vec<(String, Item)> = Vec::new();
    for (p, step) in progs.iter().zip(&steps) {
        // Alone: a cut answer burns the secret for the rest of its call.
        let t = h.alone(&pair, step).await[0].clone();
        match t.iter().find(|r| matches!(r.tag, b'A' | b'F' | b'X')) {
            Some(r) => outcomes.push((p.describe(), r.clone())),
            None => panic!("{}: no login outcome:\n{}", p.describe(), show(&t)),
        }
    }
    let is_the_marker = |r: &Item| {
        (r.tag == b'F' && r.data == WITHHELD.as_bytes())
            || (r.tag == b'X' && r.data.windows(WITHHELD.len()).any(|w| w == WITHHELD.as_bytes()))
    };
    for (what, r) in &outcomes {
        assert!(is_the_marker(r), "{what}: {}", r.data.escape_ascii());
        assert!(!holds_run(&r.data, &pair.a), "{what}: {}", r.data.escape_ascii());
    }
    // Each server had the password it reflected.
    for (p, &id) in progs.iter().zip(&ids) {
        assert!(h.r.received(id).contains(&p.payload(&pair.a)), "{}", p.describe());
    }
    // The same outcome whatever the server wrote around the reflection.
    for via in 0..2 {
        let first = &outcomes[via * 4].1;
        for (what, r) in &outcomes[via * 4..via * 4 + 4] {
            assert_eq!(r, first, "{what}: the outcome depends on what the server wrote");
        }
    }
}
