//! Peers that reflect what a plugin sent them: the secrets differential
//! tests' servers (docs/security.md, "A plugin never reads a secret it
//! uses").
//!
//! A [`Reflector`] listens on five loopback ports — a TCP session peer
//! (which also speaks the Redis and PostgreSQL logins), the same behind
//! TLS, a hand-written HTTP/1.1 server with keep-alive, an HTTP/2 gRPC
//! server and a UDP one — and runs, for each connection, request or
//! datagram, the [`Program`] its id names. A program says what the peer
//! takes from what it received (a [`Source`]: the data a plugin sent, a
//! header, a login's password...), how it encodes it (an [`Encoding`] a
//! real server uses: JSON, percent, HTML entities, base64, hex, gzip...),
//! where it puts it in its answer (a [`Field`]) and how it cuts the answer
//! into writes, with a pause after each, so that the plugin's reads split
//! where the test says.
//!
//! Every payload a peer took is logged ([`Reflector::received`]), so a
//! test can prove that the secret (or a guess) did reach the peer: a test
//! whose peer never saw the secret proves nothing.
//!
//! The encoders are written here, from the formats' definitions, for the
//! tests; none is fit for anything else.

use crate::TestCert;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How a peer encodes what it reflects: the forms echo services, error
/// pages and frameworks write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The bytes themselves.
    Raw,
    /// A JSON string as Python's `json.dumps` or PHP's `json_encode`
    /// writes it: `\"`, `\\`, `\/`, `\b \f \n \r \t`, other control bytes
    /// and every byte of 0x80 and above as `\u00XX` (the byte read as
    /// Latin-1: `é` is `\u00e9`).
    Json,
    /// A JSON string as Go's `encoding/json` writes it: `\"`, `\\`, `<`,
    /// `>` and `&` as `\u003c`, `\u003e` and `\u0026`, control bytes as
    /// `\u00XX`; valid UTF-8 is kept and an invalid byte becomes `\ufffd`
    /// (lossy: such a byte is lost).
    JsonGo,
    /// Percent-encoding of every byte outside RFC 3986's unreserved set,
    /// upper-case hex.
    PercentUpper,
    /// The same, lower-case hex.
    PercentLower,
    /// Percent-encoding applied to every other byte only (whatever it is,
    /// letters too), upper-case hex: a value encoded twice over or by
    /// hand.
    PercentPartial,
    /// `application/x-www-form-urlencoded`: a space as `+`, alphanumerics
    /// and `*-._` kept, every other byte `%XX`.
    Form,
    /// HTML's named entities for `& < > "` and `&#39;` for `'`, as most
    /// template engines escape.
    HtmlNamed,
    /// The same with `&apos;` for `'`.
    HtmlApos,
    /// Every byte as a decimal character reference, `&#NNN;`.
    HtmlDecimal,
    /// Every byte as a hexadecimal character reference, `&#xHH;`.
    HtmlHex,
    /// ASCII letters upper-cased.
    Upper,
    /// ASCII letters lower-cased.
    Lower,
    /// Standard base64, padded.
    Base64,
    /// Standard base64 without padding.
    Base64NoPad,
    /// URL-safe base64, padded.
    Base64Url,
    /// URL-safe base64 without padding.
    Base64UrlNoPad,
    /// Standard base64 of `u:` and the bytes, as in `Authorization: Basic`:
    /// the bytes start at an offset inside the encoded run.
    Base64Basic,
    /// Standard base64 of one byte (`x`) and the bytes: the other offset.
    Base64Offset1,
    /// Hex, lower case.
    HexLower,
    /// Hex, upper case.
    HexUpper,
    /// Hex, lower case, after one more hex digit (`0`): the other
    /// alignment of a hex run.
    HexShifted,
    /// As Rust's `Debug` writes a byte string: printable ASCII kept but
    /// `\"` and `\\`, `\t \r \n \0`, and `\xHH` for every other byte.
    DebugEscape,
    /// Every byte as `\xHH`, upper-case hex.
    XEscapeAll,
    /// Every byte as `\u{HH}`.
    UnicodeBraces,
    /// The body gzip-compressed, with `Content-Encoding: gzip` (an HTTP
    /// body only).
    Gzip,
    /// The body zlib-compressed, with `Content-Encoding: deflate` (an
    /// HTTP body only).
    Deflate,
}

impl Encoding {
    /// Every encoding.
    pub const ALL: [Encoding; 27] = [
        Encoding::Raw,
        Encoding::Json,
        Encoding::JsonGo,
        Encoding::PercentUpper,
        Encoding::PercentLower,
        Encoding::PercentPartial,
        Encoding::Form,
        Encoding::HtmlNamed,
        Encoding::HtmlApos,
        Encoding::HtmlDecimal,
        Encoding::HtmlHex,
        Encoding::Upper,
        Encoding::Lower,
        Encoding::Base64,
        Encoding::Base64NoPad,
        Encoding::Base64Url,
        Encoding::Base64UrlNoPad,
        Encoding::Base64Basic,
        Encoding::Base64Offset1,
        Encoding::HexLower,
        Encoding::HexUpper,
        Encoding::HexShifted,
        Encoding::DebugEscape,
        Encoding::XEscapeAll,
        Encoding::UnicodeBraces,
        Encoding::Gzip,
        Encoding::Deflate,
    ];

    /// Whether it is a `Content-Encoding` of an HTTP body rather than a
    /// text encoding.
    pub fn is_compression(self) -> bool {
        matches!(self, Encoding::Gzip | Encoding::Deflate)
    }

    /// Whether it writes base64 or hex: text whose bytes are not the
    /// bytes it encodes, one for one.
    pub fn is_binary(self) -> bool {
        matches!(
            self,
            Encoding::Base64
                | Encoding::Base64NoPad
                | Encoding::Base64Url
                | Encoding::Base64UrlNoPad
                | Encoding::Base64Basic
                | Encoding::Base64Offset1
                | Encoding::HexLower
                | Encoding::HexUpper
                | Encoding::HexShifted
        )
    }

    /// Whether what it writes of `data` keeps every byte (a reader can get
    /// them back, up to ASCII case for [`Encoding::Upper`] and
    /// [`Encoding::Lower`]): all but [`Encoding::JsonGo`] on invalid UTF-8.
    pub fn keeps(self, data: &[u8]) -> bool {
        match self {
            Encoding::JsonGo => std::str::from_utf8(data).is_ok(),
            _ => true,
        }
    }
}

/// `data` encoded as `encoding` says.
pub fn encode(encoding: Encoding, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * 2);
    match encoding {
        Encoding::Raw => out.extend_from_slice(data),
        Encoding::Json => {
            for &b in data {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'/' => out.extend_from_slice(b"\\/"),
                    0x08 => out.extend_from_slice(b"\\b"),
                    0x0c => out.extend_from_slice(b"\\f"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    0..0x20 | 0x7f.. => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                    _ => out.push(b),
                }
            }
        }
        Encoding::JsonGo => {
            for chunk in data.utf8_chunks() {
                for c in chunk.valid().chars() {
                    match c {
                        '"' => out.extend_from_slice(b"\\\""),
                        '\\' => out.extend_from_slice(b"\\\\"),
                        '\n' => out.extend_from_slice(b"\\n"),
                        '\r' => out.extend_from_slice(b"\\r"),
                        '\t' => out.extend_from_slice(b"\\t"),
                        '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\0'..='\u{1f}' => {
                            out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
                        }
                        c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                for _ in chunk.invalid() {
                    out.extend_from_slice(b"\\ufffd");
                }
            }
        }
        Encoding::PercentUpper | Encoding::PercentLower => {
            for &b in data {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    out.push(b);
                } else if encoding == Encoding::PercentUpper {
                    out.extend_from_slice(format!("%{b:02X}").as_bytes());
                } else {
                    out.extend_from_slice(format!("%{b:02x}").as_bytes());
                }
            }
        }
        Encoding::PercentPartial => {
            for (i, &b) in data.iter().enumerate() {
                if i % 2 == 0 {
                    out.extend_from_slice(format!("%{b:02X}").as_bytes());
                } else {
                    out.push(b);
                }
            }
        }
        Encoding::Form => {
            for &b in data {
                match b {
                    b' ' => out.push(b'+'),
                    b'*' | b'-' | b'.' | b'_' => out.push(b),
                    b if b.is_ascii_alphanumeric() => out.push(b),
                    b => out.extend_from_slice(format!("%{b:02X}").as_bytes()),
                }
            }
        }
        Encoding::HtmlNamed | Encoding::HtmlApos => {
            for &b in data {
                match b {
                    b'&' => out.extend_from_slice(b"&amp;"),
                    b'<' => out.extend_from_slice(b"&lt;"),
                    b'>' => out.extend_from_slice(b"&gt;"),
                    b'"' => out.extend_from_slice(b"&quot;"),
                    b'\'' if encoding == Encoding::HtmlApos => out.extend_from_slice(b"&apos;"),
                    b'\'' => out.extend_from_slice(b"&#39;"),
                    b => out.push(b),
                }
            }
        }
        Encoding::HtmlDecimal => {
            for &b in data {
                out.extend_from_slice(format!("&#{b};").as_bytes());
            }
        }
        Encoding::HtmlHex => {
            for &b in data {
                out.extend_from_slice(format!("&#x{b:02X};").as_bytes());
            }
        }
        Encoding::Upper => out.extend(data.iter().map(u8::to_ascii_uppercase)),
        Encoding::Lower => out.extend(data.iter().map(u8::to_ascii_lowercase)),
        Encoding::Base64 => out = base64(data, STANDARD, true),
        Encoding::Base64NoPad => out = base64(data, STANDARD, false),
        Encoding::Base64Url => out = base64(data, URL_SAFE, true),
        Encoding::Base64UrlNoPad => out = base64(data, URL_SAFE, false),
        Encoding::Base64Basic => out = base64(&[b"u:", data].concat(), STANDARD, true),
        Encoding::Base64Offset1 => out = base64(&[b"x", data].concat(), STANDARD, true),
        Encoding::HexLower => out = hex(data, b"0123456789abcdef"),
        Encoding::HexUpper => out = hex(data, b"0123456789ABCDEF"),
        Encoding::HexShifted => out = [&b"0"[..], &hex(data, b"0123456789abcdef")].concat(),
        Encoding::DebugEscape => {
            for &b in data {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    0 => out.extend_from_slice(b"\\0"),
                    0x20..0x7f => out.push(b),
                    b => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                }
            }
        }
        Encoding::XEscapeAll => {
            for &b in data {
                out.extend_from_slice(format!("\\x{b:02X}").as_bytes());
            }
        }
        Encoding::UnicodeBraces => {
            for &b in data {
                out.extend_from_slice(format!("\\u{{{b:x}}}").as_bytes());
            }
        }
        Encoding::Gzip => out = gzip(data),
        Encoding::Deflate => out = zlib(data),
    }
    out
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len().div_ceil(3) * 4);
    for group in data.chunks(3) {
        let n = (u32::from(group[0]) << 16)
            | (u32::from(*group.get(1).unwrap_or(&0)) << 8)
            | u32::from(*group.get(2).unwrap_or(&0));
        let chars = group.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(alphabet[((n >> (18 - 6 * i)) & 63) as usize]);
            } else if pad {
                out.push(b'=');
            }
        }
    }
    out
}

fn hex(data: &[u8], digits: &[u8; 16]) -> Vec<u8> {
    data.iter()
        .flat_map(|b| [digits[usize::from(b >> 4)], digits[usize::from(b & 15)]])
        .collect()
}

/// Bits written least significant first, as DEFLATE packs them.
struct Bits {
    out: Vec<u8>,
    acc: u32,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= value << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code: sent most significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        let reversed = code.reverse_bits() >> (32 - len);
        self.put(reversed, len);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

/// One final DEFLATE block (RFC 1951) with the fixed Huffman codes and
/// literals only: real compressed data (the bytes do not appear in it),
/// without the work of finding matches.
fn deflate(data: &[u8]) -> Vec<u8> {
    let mut bits = Bits {
        out: Vec::new(),
        acc: 0,
        n: 0,
    };
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed codes
    for &b in data {
        let b = u32::from(b);
        if b < 144 {
            bits.code(0x30 + b, 8);
        } else {
            bits.code(0x190 + (b - 144), 9);
        }
    }
    bits.code(0, 7); // end of block (256)
    bits.finish()
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    out.extend(deflate(data));
    out.extend(crc32(data).to_le_bytes());
    out.extend((data.len() as u32).to_le_bytes());
    out
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    let mut out = vec![0x78, 0x01];
    out.extend(deflate(data));
    out.extend(((b << 16) | a).to_be_bytes());
    out
}

/// The gRPC wire form of a status message (`grpc-message`): every byte
/// outside printable ASCII, and `%`, percent-encoded.
pub fn grpc_percent(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in data {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// What of the request a peer reflects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The data a plugin sent on a session or in a datagram, after the
    /// program's id ([`frame`]).
    Data,
    /// The password of a Redis or PostgreSQL login.
    Password,
    /// An HTTP header's value, or gRPC metadata's (the name in lower case).
    Header(String),
    /// An HTTP request's body, or a gRPC request's message.
    Body,
}

/// Which login a session peer speaks before it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Login {
    /// `AUTH [user] password`, answered with one RESP line.
    Redis,
    /// A StartupMessage, then AuthenticationCleartextPassword and the
    /// PasswordMessage.
    Postgres,
}

/// Where in its answer a peer puts what it reflects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Nowhere: a fixed answer (an HTTP redirect, say).
    Nothing,
    /// Session data (the whole stream, after a login's answer for a login
    /// peer).
    Session,
    /// A login's refusal: Redis's `-ERR` line, PostgreSQL's ErrorResponse
    /// message.
    LoginError,
    /// An HTTP header's name (`x-` and the encoded payload; any bytes, as
    /// a broken server writes them) or gRPC metadata's (lower case).
    HeaderName,
    /// An HTTP header's value or gRPC metadata's (`x-reflect`).
    HeaderValue,
    /// An HTTP body or a gRPC response message.
    Body,
    /// An HTTP trailer's value (a chunked body) or gRPC trailing metadata's.
    Trailer,
    /// gRPC's `grpc-message`.
    StatusMessage,
    /// gRPC's `grpc-status`: junk that is no code.
    GrpcStatus,
    /// gRPC's `content-type`: `application/` and the payload, not gRPC.
    ContentType,
    /// A UDP reply.
    Datagram,
}

/// What a peer does for one id: see the [module](self) documentation.
#[derive(Clone, Debug)]
pub struct Program {
    /// What it takes from the request.
    pub source: Source,
    /// How it encodes it.
    pub encoding: Encoding,
    /// Where it puts it.
    pub field: Field,
    /// Text before the encoded payload in its field.
    pub prefix: Vec<u8>,
    /// Text after it.
    pub suffix: Vec<u8>,
    /// Where the answer is cut into writes, counted from where the encoded
    /// payload starts in it (negative: before). Cuts outside the answer
    /// are ignored.
    pub cuts: Vec<isize>,
    /// How long the peer waits after each write but the last.
    pub pause: Duration,
    /// A longer write is cut further, into writes of at most this many
    /// bytes (0: no limit).
    pub max_write: usize,
    /// The login a session peer speaks first, if any.
    pub login: Option<Login>,
    /// An HTTP answer's status.
    pub status: u16,
    /// An HTTP answer's `Location`, for a redirect.
    pub location: Option<String>,
}

impl Program {
    /// A program reflecting `source` into `field` as `encoding`, in one
    /// write, with no text around it.
    pub fn new(source: Source, encoding: Encoding, field: Field) -> Self {
        Self {
            source,
            encoding,
            field,
            prefix: Vec::new(),
            suffix: Vec::new(),
            cuts: Vec::new(),
            pause: Duration::ZERO,
            max_write: 0,
            login: None,
            status: 200,
            location: None,
        }
    }

    /// The encoded payload with its prefix and suffix, and where the
    /// encoded payload starts in it. A compression compresses the prefix
    /// and suffix too (the whole body), and starts at 0.
    pub fn render(&self, payload: &[u8]) -> (Vec<u8>, usize) {
        if self.encoding.is_compression() {
            let plain = [&self.prefix[..], payload, &self.suffix[..]].concat();
            return (encode(self.encoding, &plain), 0);
        }
        let mut out = self.prefix.clone();
        out.extend(encode(self.encoding, payload));
        out.extend_from_slice(&self.suffix);
        (out, self.prefix.len())
    }

    /// Where a peer running this program cuts `len` bytes whose encoded
    /// payload starts at `mark`: the writes' byte ranges, in order.
    pub fn writes(&self, len: usize, mark: usize) -> Vec<std::ops::Range<usize>> {
        let mut at: Vec<usize> = self
            .cuts
            .iter()
            .filter_map(|c| usize::try_from(mark as isize + c).ok())
            .filter(|&p| p > 0 && p < len)
            .collect();
        at.sort_unstable();
        at.dedup();
        let mut ranges = Vec::new();
        let mut start = 0;
        for end in at.into_iter().chain([len]) {
            let mut s = start;
            while self.max_write > 0 && end - s > self.max_write {
                ranges.push(s..s + self.max_write);
                s += self.max_write;
            }
            if end > s || len == 0 {
                ranges.push(s..end);
            }
            start = end;
        }
        ranges
    }

    async fn write<W: AsyncWrite + Unpin>(&self, w: &mut W, bytes: &[u8], mark: usize) -> std::io::Result<()> {
        let writes = self.writes(bytes.len(), mark);
        for (i, r) in writes.iter().enumerate() {
            if i > 0 && !self.pause.is_zero() {
                tokio::time::sleep(self.pause).await;
            }
            w.write_all(&bytes[r.clone()]).await?;
            w.flush().await?;
        }
        Ok(())
    }
}

/// What a plugin sends first on a session or in a datagram to a
/// [`Reflector`]: `#ID LEN\n` and the payload of `LEN` bytes.
pub fn frame(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("#{id} {}\n", payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The HTTP path that runs program `id`.
pub fn http_path(id: u32) -> String {
    format!("/p/{id}")
}

/// The gRPC method that runs program `id`.
pub fn grpc_method(id: u32) -> String {
    format!("/sonde.Reflect/P{id}")
}

/// A PostgreSQL StartupMessage (protocol 3.0) for `user`.
pub fn pg_startup(user: &str) -> Vec<u8> {
    let mut body = 196_608i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0");
    body.extend_from_slice(user.as_bytes());
    body.extend_from_slice(b"\0\0");
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

#[derive(Default)]
struct State {
    programs: Mutex<HashMap<u32, Arc<Program>>>,
    next: AtomicU32,
    received: Mutex<Vec<(u32, Vec<u8>)>>,
    heads: Mutex<Vec<Vec<u8>>>,
}

impl State {
    fn program(&self, id: u32) -> Option<Arc<Program>> {
        self.programs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    fn log(&self, id: u32, payload: &[u8]) {
        self.received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, payload.to_vec()));
    }
}

/// The reflecting peers, on free loopback ports; stopped when dropped.
pub struct Reflector {
    /// The session peer (plain TCP): an echo, or a Redis or PostgreSQL
    /// login peer, as the program says.
    pub tcp: SocketAddr,
    /// The same behind TLS, with a certificate for `127.0.0.1` issued by
    /// [`ca_pem`](Self::ca_pem).
    pub tls: SocketAddr,
    /// The HTTP/1.1 server (keep-alive; the program's id in the path,
    /// [`http_path`]).
    pub http: SocketAddr,
    /// The same behind TLS (the certificate of [`tls`](Self::tls)).
    pub https: SocketAddr,
    /// The gRPC server (HTTP/2 with prior knowledge; the id in the method,
    /// [`grpc_method`]).
    pub grpc: SocketAddr,
    /// The UDP peer.
    pub udp: SocketAddr,
    /// The CA the TLS peer's certificate chains to (PEM).
    pub ca_pem: String,
    state: Arc<State>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Reflector {
    /// Starts every peer.
    pub async fn start() -> Self {
        let state = Arc::new(State::default());
        let cert = TestCert::new(2030, 1, 1);
        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
        let bind = || async {
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback")
        };
        let (tcp, tls, http, https, grpc) = (bind().await, bind().await, bind().await, bind().await, bind().await);
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = |l: &tokio::net::TcpListener| l.local_addr().expect("local addr");
        let mut me = Self {
            tcp: addr(&tcp),
            tls: addr(&tls),
            http: addr(&http),
            https: addr(&https),
            grpc: addr(&grpc),
            udp: udp.local_addr().expect("local addr"),
            ca_pem: cert.ca_pem.clone(),
            state: state.clone(),
            tasks: Vec::new(),
        };
        let s = state.clone();
        me.tasks.push(tokio::spawn(accept(tcp, move |stream| {
            let s = s.clone();
            async move {
                let _ = session(stream, &s).await;
            }
        })));
        let s = state.clone();
        me.tasks.push(tokio::spawn(accept(tls, move |stream| {
            let (s, acceptor) = (s.clone(), acceptor.clone());
            async move {
                if let Ok(stream) = acceptor.accept(stream).await {
                    let _ = session(stream, &s).await;
                }
            }
        })));
        let s = state.clone();
        me.tasks.push(tokio::spawn(accept(http, move |stream| {
            let s = s.clone();
            async move {
                let _ = http1(stream, &s).await;
            }
        })));
        let s = state.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
        me.tasks.push(tokio::spawn(accept(https, move |stream| {
            let (s, acceptor) = (s.clone(), acceptor.clone());
            async move {
                if let Ok(stream) = acceptor.accept(stream).await {
                    let _ = http1(stream, &s).await;
                }
            }
        })));
        let s = state.clone();
        me.tasks.push(tokio::spawn(accept(grpc, move |stream| {
            let s = s.clone();
            async move {
                let service = hyper::service::service_fn(move |req| grpc_answer(req, s.clone()));
                let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .auto_date_header(false)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            }
        })));
        me.tasks.push(tokio::spawn(datagrams(udp, state)));
        me
    }

    /// Registers `program` and returns its id.
    pub fn add(&self, program: Program) -> u32 {
        let id = self.state.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.state
            .programs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::new(program));
        id
    }

    /// Every payload program `id` took, in order: what it received.
    pub fn received(&self, id: u32) -> Vec<Vec<u8>> {
        self.state
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(i, _)| *i == id)
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// The head (request line and headers) of every HTTP request the HTTP
    /// server read, whatever its path, in order.
    pub fn http_heads(&self) -> Vec<Vec<u8>> {
        self.state.heads.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept<F, Fut>(listener: tokio::net::TcpListener, serve: F)
where
    F: Fn(tokio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve(stream));
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// Reads up to and with `\n` (at most `max` bytes).
async fn read_line<R: AsyncRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        if line.len() >= max || r.read(&mut byte).await? == 0 {
            return Err(bad("no line"));
        }
        line.push(byte[0]);
    }
    Ok(line)
}

/// `#ID LEN\n`: the id and the length.
fn parse_frame(line: &[u8]) -> Option<(u32, usize)> {
    let text = std::str::from_utf8(line.strip_prefix(b"#")?).ok()?;
    let (id, len) = text.trim_end().split_once(' ')?;
    Some((id.parse().ok()?, len.parse().ok()?))
}

async fn session<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, state: &State) -> std::io::Result<()> {
    let (id, len) = parse_frame(&read_line(&mut s, 64).await?).ok_or_else(|| bad("no frame"))?;
    let program = state.program(id).ok_or_else(|| bad("no program"))?;
    let mut data = vec![0; len];
    s.read_exact(&mut data).await?;
    match program.login {
        None => {
            state.log(id, &data);
            let (bytes, mark) = program.render(&data);
            program.write(&mut s, &bytes, mark).await?;
        }
        Some(Login::Redis) => {
            let password = redis_auth(&mut s).await?;
            state.log(id, &password);
            if program.field == Field::LoginError {
                let (inner, mark) = program.render(&password);
                let bytes = [&b"-ERR "[..], &inner, b"\r\n"].concat();
                program.write(&mut s, &bytes, mark + 5).await?;
            } else {
                s.write_all(b"+OK\r\n").await?;
                after_login(&mut s, &program, &password).await?;
            }
        }
        Some(Login::Postgres) => {
            let password = pg_password(&mut s).await?;
            state.log(id, &password);
            if program.field == Field::LoginError {
                let (inner, mark) = program.render(&password);
                let mut body = b"SFATAL\0VFATAL\0C28P01\0M".to_vec();
                let at = 5 + body.len() + mark;
                body.extend(inner);
                body.extend_from_slice(b"\0\0");
                let mut bytes = vec![b'E'];
                bytes.extend(((body.len() + 4) as i32).to_be_bytes());
                bytes.extend(body);
                program.write(&mut s, &bytes, at).await?;
            } else {
                s.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0]).await?;
                after_login(&mut s, &program, &password).await?;
            }
        }
    }
    s.flush().await?;
    s.shutdown().await
}

/// After a login's answer, a pause, then the reflection as session data.
async fn after_login<S: AsyncWrite + Unpin>(s: &mut S, program: &Program, payload: &[u8]) -> std::io::Result<()> {
    s.flush().await?;
    tokio::time::sleep(program.pause.max(Duration::from_millis(60))).await;
    let (bytes, mark) = program.render(payload);
    program.write(s, &bytes, mark).await
}

/// Reads a RESP array of bulk strings (`AUTH [user] password`) and returns
/// its last element.
async fn redis_auth<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let head = read_line(s, 32).await?;
    let n: usize = std::str::from_utf8(head.strip_prefix(b"*").ok_or_else(|| bad("not RESP"))?)
        .ok()
        .and_then(|t| t.trim_end().parse().ok())
        .ok_or_else(|| bad("not RESP"))?;
    let mut last = Vec::new();
    for _ in 0..n {
        let line = read_line(s, 32).await?;
        let len: usize = std::str::from_utf8(line.strip_prefix(b"$").ok_or_else(|| bad("not a bulk string"))?)
            .ok()
            .and_then(|t| t.trim_end().parse().ok())
            .ok_or_else(|| bad("not a bulk string"))?;
        let mut arg = vec![0; len + 2];
        s.read_exact(&mut arg).await?;
        arg.truncate(len);
        last = arg;
    }
    Ok(last)
}

/// Reads a StartupMessage, asks for a cleartext password and returns it.
async fn pg_password<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = usize::try_from(i32::from_be_bytes(len)).map_err(|_| bad("length"))?;
    let mut startup = vec![0; len.saturating_sub(4)];
    s.read_exact(&mut startup).await?;
    s.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).await?;
    s.flush().await?;
    let mut head = [0u8; 5];
    s.read_exact(&mut head).await?;
    if head[0] != b'p' {
        return Err(bad("not a PasswordMessage"));
    }
    let len = usize::try_from(i32::from_be_bytes([head[1], head[2], head[3], head[4]])).map_err(|_| bad("length"))?;
    let mut body = vec![0; len.saturating_sub(4)];
    s.read_exact(&mut body).await?;
    if body.last() == Some(&0) {
        body.pop();
    }
    Ok(body)
}

/// One HTTP/1.1 request: its head and body.
struct Http1Request {
    head: Vec<u8>,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

async fn read_request<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Option<Http1Request>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 {
            return Err(bad("head too long"));
        }
        if s.read(&mut byte).await? == 0 {
            return Ok(None);
        }
        head.push(byte[0]);
    }
    let text = head.clone();
    let mut lines = text.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let target = request_line.split(' ').nth(1).unwrap_or("/").to_string();
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        if let Some(colon) = line.iter().position(|&b| b == b':') {
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            let value = line[colon + 1..].trim_ascii().to_vec();
            headers.push((name, value));
        }
    }
    let header = |n: &str| headers.iter().find(|(h, _)| h == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(len) = header("content-length") {
        let len: usize = String::from_utf8_lossy(&len)
            .trim()
            .parse()
            .map_err(|_| bad("length"))?;
        body = vec![0; len];
        s.read_exact(&mut body).await?;
    } else if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked")) {
        loop {
            let line = read_line(s, 64).await?;
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&line).trim().split(';').next().unwrap_or(""),
                16,
            )
            .map_err(|_| bad("chunk size"))?;
            if size == 0 {
                while read_line(s, 8192).await? != b"\r\n" {}
                break;
            }
            let mut chunk = vec![0; size + 2];
            s.read_exact(&mut chunk).await?;
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Ok(Some(Http1Request {
        head,
        target,
        headers,
        body,
    }))
}

fn take(source: &Source, headers: &[(String, Vec<u8>)], body: &[u8]) -> Vec<u8> {
    match source {
        Source::Header(name) => headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default(),
        _ => body.to_vec(),
    }
}

/// Serves requests on one connection until the client closes it.
async fn http1<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, state: &State) -> std::io::Result<()> {
    while let Some(req) = read_request(&mut s).await? {
        state
            .heads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(req.head.clone());
        let program = req
            .target
            .strip_prefix("/p/")
            .and_then(|id| id.split('?').next()?.parse::<u32>().ok())
            .and_then(|id| Some((id, state.program(id)?)));
        let Some((id, program)) = program else {
            s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\nnot found")
                .await?;
            s.flush().await?;
            continue;
        };
        let payload = take(&program.source, &req.headers, &req.body);
        state.log(id, &payload);
        let (bytes, mark) = http1_answer(&program, &payload);
        program.write(&mut s, &bytes, mark).await?;
    }
    Ok(())
}

/// The answer to a request, and where its encoded payload starts.
fn http1_answer(program: &Program, payload: &[u8]) -> (Vec<u8>, usize) {
    let (reflected, at) = program.render(payload);
    let mut out = format!("HTTP/1.1 {} Reflected\r\nx-before: 1\r\n", program.status).into_bytes();
    let mut mark = None;
    match program.field {
        Field::HeaderName => {
            out.extend_from_slice(b"x-");
            mark = Some(out.len() + at);
            out.extend_from_slice(&reflected);
            out.extend_from_slice(b": 1\r\n");
        }
        Field::HeaderValue => {
            out.extend_from_slice(b"x-reflect: ");
            mark = Some(out.len() + at);
            out.extend_from_slice(&reflected);
            out.extend_from_slice(b"\r\n");
        }
        _ => {}
    }
    if let Some(location) = &program.location {
        out.extend_from_slice(format!("location: {location}\r\n").as_bytes());
    }
    out.extend_from_slice(b"content-type: text/plain\r\nx-after: 2\r\n");
    let body = match program.field {
        Field::Body => reflected.clone(),
        _ => b"a body that reflects nothing".to_vec(),
    };
    if program.field == Field::Body {
        match program.encoding {
            Encoding::Gzip => out.extend_from_slice(b"content-encoding: gzip\r\n"),
            Encoding::Deflate => out.extend_from_slice(b"content-encoding: deflate\r\n"),
            _ => {}
        }
    }
    if program.field == Field::Trailer {
        out.extend_from_slice(b"transfer-encoding: chunked\r\ntrailer: x-reflect\r\n\r\n");
        out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(b"\r\n0\r\nx-reflect: ");
        mark = Some(out.len() + at);
        out.extend_from_slice(&reflected);
        out.extend_from_slice(b"\r\n\r\n");
    } else {
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        if program.field == Field::Body {
            mark = Some(out.len() + at);
        }
        out.extend_from_slice(&body);
    }
    let mark = mark.unwrap_or(out.len());
    (out, mark)
}

type GrpcBody = http_body_util::StreamBody<
    tokio_stream::Iter<std::vec::IntoIter<Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>>>,
>;

fn header_value(bytes: &[u8]) -> hyper::header::HeaderValue {
    hyper::header::HeaderValue::from_bytes(bytes).unwrap_or_else(|_| hyper::header::HeaderValue::from_static("invalid"))
}

async fn grpc_answer(
    req: hyper::Request<hyper::body::Incoming>,
    state: Arc<State>,
) -> Result<hyper::Response<GrpcBody>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let id = req
        .uri()
        .path()
        .strip_prefix("/sonde.Reflect/P")
        .and_then(|id| id.parse::<u32>().ok());
    let headers: Vec<(String, Vec<u8>)> = req
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let message = body.get(5..).unwrap_or_default();
    let mut response = hyper::Response::builder().status(200);
    let mut trailers = hyper::HeaderMap::new();
    let mut frames = Vec::new();
    let Some((id, program)) = id.and_then(|id| Some((id, state.program(id)?))) else {
        trailers.insert("grpc-status", hyper::header::HeaderValue::from_static("12"));
        let response = response
            .header("content-type", "application/grpc")
            .body(http_body_util::StreamBody::new(tokio_stream::iter(vec![Ok(
                hyper::body::Frame::trailers(trailers),
            )])))
            .expect("response");
        return Ok(response);
    };
    let payload = take(&program.source, &headers, message);
    state.log(id, &payload);
    let (reflected, _) = program.render(&payload);
    let mut content_type = b"application/grpc".to_vec();
    let mut status = b"0".to_vec();
    let mut reply = b"a message that reflects nothing".to_vec();
    response = response.header("x-before", "1");
    match program.field {
        Field::HeaderName => {
            let name = [&b"x-"[..], &reflected].concat().to_ascii_lowercase();
            if let Ok(name) = hyper::header::HeaderName::from_bytes(&name) {
                response = response.header(name, "1");
            }
        }
        Field::HeaderValue => response = response.header("x-reflect", header_value(&reflected)),
        Field::Body => reply = reflected.clone(),
        Field::Trailer => {
            trailers.insert("x-reflect", header_value(&reflected));
        }
        Field::StatusMessage => {
            status = b"9".to_vec();
            trailers.insert("grpc-message", header_value(&grpc_percent(&reflected)));
        }
        Field::GrpcStatus => status = reflected.clone(),
        Field::ContentType => content_type = [&b"application/"[..], &reflected].concat(),
        _ => {}
    }
    response = response.header("content-type", header_value(&content_type));
    trailers.insert("grpc-status", header_value(&status));
    trailers.insert("x-after", hyper::header::HeaderValue::from_static("2"));
    let mut framed = vec![0u8];
    framed.extend((reply.len() as u32).to_be_bytes());
    framed.extend(reply);
    frames.push(Ok(hyper::body::Frame::data(bytes::Bytes::from(framed))));
    frames.push(Ok(hyper::body::Frame::trailers(trailers)));
    Ok(response
        .body(http_body_util::StreamBody::new(tokio_stream::iter(frames)))
        .expect("response"))
}

async fn datagrams(socket: tokio::net::UdpSocket, state: Arc<State>) {
    let mut buf = vec![0; 65536];
    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
        let data = &buf[..n];
        let Some(nl) = data.iter().position(|&b| b == b'\n') else {
            continue;
        };
        let Some((id, len)) = parse_frame(&data[..=nl]) else {
            continue;
        };
        let payload = &data[nl + 1..];
        if payload.len() != len {
            continue;
        }
        let Some(program) = state.program(id) else {
            continue;
        };
        state.log(id, payload);
        let (reply, _) = program.render(payload);
        let _ = socket.send_to(&reply, from).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoders_write_the_forms_servers_write() {
        let s = b"a\"b\\c/d e&f<g>'h\xe9";
        assert_eq!(encode(Encoding::Json, s), b"a\\\"b\\\\c\\/d e&f<g>'h\\u00e9".to_vec());
        assert_eq!(
            encode(Encoding::JsonGo, s),
            b"a\\\"b\\\\c/d e\\u0026f\\u003cg\\u003e'h\\ufffd".to_vec()
        );
        assert_eq!(encode(Encoding::PercentUpper, b"a b/~"), b"a%20b%2F~".to_vec());
        assert_eq!(encode(Encoding::PercentLower, b"a b/"), b"a%20b%2f".to_vec());
        assert_eq!(encode(Encoding::PercentPartial, b"abcd"), b"%61b%63d".to_vec());
        assert_eq!(encode(Encoding::Form, b"a b*/"), b"a+b*%2F".to_vec());
        assert_eq!(
            encode(Encoding::HtmlNamed, b"&<>\"'"),
            b"&amp;&lt;&gt;&quot;&#39;".to_vec()
        );
        assert_eq!(encode(Encoding::HtmlApos, b"'"), b"&apos;".to_vec());
        assert_eq!(encode(Encoding::HtmlDecimal, b"A\xe9"), b"&#65;&#233;".to_vec());
        assert_eq!(encode(Encoding::HtmlHex, b"A"), b"&#x41;".to_vec());
        assert_eq!(
            encode(Encoding::Base64, b"any carnal pleas"),
            b"YW55IGNhcm5hbCBwbGVhcw==".to_vec()
        );
        assert_eq!(encode(Encoding::Base64NoPad, b"\xfb\xff"), b"+/8".to_vec());
        assert_eq!(encode(Encoding::Base64UrlNoPad, b"\xfb\xff"), b"-_8".to_vec());
        assert_eq!(encode(Encoding::Base64Url, b"\xfb\xff"), b"-_8=".to_vec());
        assert_eq!(encode(Encoding::Base64Basic, b"pw"), b"dTpwdw==".to_vec());
        assert_eq!(encode(Encoding::HexShifted, b"\x1f"), b"01f".to_vec());
        assert_eq!(encode(Encoding::HexUpper, b"\x1f"), b"1F".to_vec());
        assert_eq!(encode(Encoding::DebugEscape, b"a\"\xe9\n"), b"a\\\"\\xe9\\n".to_vec());
        assert_eq!(encode(Encoding::XEscapeAll, b"a"), b"\\x61".to_vec());
        assert_eq!(encode(Encoding::UnicodeBraces, b"a"), b"\\u{61}".to_vec());
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn the_fixed_code_deflate_block_is_what_rfc_1951_says() {
        // zlib.compress(b"a", wbits) with the fixed codes, literals only:
        // 0x4b 0x04 0x00 (BFINAL, BTYPE 01, 'a' = 0x30 + 0x61, end).
        assert_eq!(deflate(b"a"), [0x4b, 0x04, 0x00]);
        assert_eq!(deflate(b""), [0x03, 0x00]);
    }

    #[test]
    fn writes_cut_where_the_program_says() {
        let mut p = Program::new(Source::Data, Encoding::Raw, Field::Session);
        p.cuts = vec![-2, 0, 3, 100];
        assert_eq!(p.writes(10, 4), [0..2, 2..4, 4..7, 7..10]);
        p.max_write = 2;
        p.cuts = vec![];
        assert_eq!(p.writes(5, 0), [0..2, 2..4, 4..5]);
    }
}
