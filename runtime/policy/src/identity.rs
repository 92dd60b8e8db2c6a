//! What a plugin is, before anything runs it: the [`Digest`] of its bytes,
//! what kind of WebAssembly they are ([`sniff`]), the largest a plugin may
//! be ([`MAX_PLUGIN_BYTES`]), and how its file is read ([`read_plugin`]).
//!
//! Every place that names, checks or reads a plugin — the engine, the
//! signatures, the OCI client, `sonde plugin` — uses these, so the rules
//! have one home. This module is the bottom layer: it uses nothing else
//! of the crate.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// The largest plugin sonde reads, pulls, pushes or accepts in an upload:
/// far above any real component (the built-ins are a few hundred KiB), far
/// below what would hurt the agent to hold.
pub const MAX_PLUGIN_BYTES: u64 = 32 * 1024 * 1024;

/// The SHA-256 of a plugin's bytes (or of any blob): what a plugin is known
/// by in the compile cache, in signatures and in OCI registries. Written
/// `sha256:` and 64 lower-case hex digits ([`fmt::Display`],
/// [`Digest::parse`]), or the hex alone ([`Digest::hex`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

/// The prefix of a written digest: sonde accepts no other algorithm.
const ALGORITHM: &str = "sha256:";

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// Parses `sha256:` and 64 lower-case hex digits.
    pub fn parse(text: &str) -> Result<Self, DigestError> {
        let hex = text.strip_prefix(ALGORITHM).ok_or_else(|| DigestError {
            text: text.to_string(),
            why: "it does not start with `sha256:`",
        })?;
        Self::from_hex(hex).map_err(|e| DigestError {
            text: text.to_string(),
            why: e.why,
        })
    }

    /// Parses 64 lower-case hex digits (the digest without `sha256:`).
    pub fn from_hex(hex: &str) -> Result<Self, DigestError> {
        let bad = |why| DigestError {
            text: hex.to_string(),
            why,
        };
        if hex.len() != 64 {
            return Err(bad("a SHA-256 digest has 64 hex digits"));
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            let high = hex_value(pair[0]).ok_or_else(|| bad("only the digits 0-9 and a-f may follow `sha256:`"))?;
            let low = hex_value(pair[1]).ok_or_else(|| bad("only the digits 0-9 and a-f may follow `sha256:`"))?;
            *byte = high << 4 | low;
        }
        Ok(Self(bytes))
    }

    /// The 64 lower-case hex digits, without `sha256:`.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{ALGORITHM}{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A [`Digest`] computed piece by piece, as a blob arrives.
#[derive(Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    /// Adds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything added.
    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

/// A digest that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a digest: {why}")]
pub struct DigestError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The value of a lower-case hex digit.
fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// `bytes` as lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// What a file's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WasmKind {
    /// A WebAssembly component (what a plugin must be).
    Component,
    /// A core WebAssembly module (a plugin built for the wrong target).
    CoreModule,
    /// Not WebAssembly.
    Other,
}

/// What `bytes` are, from the WebAssembly preamble: the magic `\0asm`,
/// then a version and a layer (`1 0 0 0` for a core module, `.. .. 1 0`
/// for a component).
pub fn sniff(bytes: &[u8]) -> WasmKind {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => WasmKind::CoreModule,
        Some([0, b'a', b's', b'm', _, _, 1, 0]) => WasmKind::Component,
        _ => WasmKind::Other,
    }
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It could not be opened or read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// It is not a regular file: what it is.
    #[error("not a regular file ({0})")]
    NotAFile(&'static str),
    /// It is larger than the limit: its size (or as much as was read).
    #[error("{size} bytes, more than the {limit} allowed")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit it passed.
        limit: u64,
    },
}

/// Reads the regular file at `path`, at most `limit` bytes: opened without
/// blocking (a FIFO would wait for a writer), refused unless it is a
/// regular file, and refused when larger than `limit` (checked before
/// reading, and again while reading, should it grow). The calling thread
/// blocks while the file is read: for a small file, or off the async
/// runtime ([`read_plugin`] is the async form).
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::io::Read;
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty())
        .map_err(std::io::Error::from)?;
    let stat = rustix::fs::fstat(&fd).map_err(std::io::Error::from)?;
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => None,
        FileType::Directory => Some("a directory"),
        FileType::Fifo => Some("a FIFO"),
        FileType::Socket => Some("a socket"),
        FileType::CharacterDevice => Some("a character device"),
        FileType::BlockDevice => Some("a block device"),
        _ => Some("not a file"),
    };
    if let Some(kind) = kind {
        return Err(ReadError::NotAFile(kind));
    }
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if size > limit {
        return Err(ReadError::TooLarge { size, limit });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd).take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

/// Reads a plugin file ([`read_regular`] under [`MAX_PLUGIN_BYTES`]) on a
/// blocking thread, so a slow disk or a large file never holds an async
/// worker.
pub async fn read_plugin(path: &Path) -> Result<Vec<u8>, ReadError> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || read_regular(&owned, MAX_PLUGIN_BYTES))
        .await
        .unwrap_or_else(|e| Err(ReadError::Io(std::io::Error::other(e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_written_and_parsed_back() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.hex(),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
            "the SHA-256 test vector of `hello`"
        );
        assert_eq!(d.to_string(), format!("sha256:{}", d.hex()));
        assert_eq!(Digest::parse(&d.to_string()), Ok(d));
        assert_eq!(d.to_string().parse::<Digest>(), Ok(d));
        assert_eq!(Digest::from_hex(&d.hex()), Ok(d));
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        let mut pieces = Hasher::default();
        pieces.update(b"he");
        pieces.update(b"llo");
        assert_eq!(pieces.finish(), d, "piece by piece as at once");
    }

    #[test]
    fn other_spellings_of_a_digest_are_refused() {
        let hex = Digest::of(b"x").hex();
        for bad in [
            hex.clone(),
            format!("sha512:{hex}"),
            format!("SHA256:{hex}"),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[..63]),
            format!("sha256:{hex}0"),
            format!("sha256: {}", &hex[1..]),
            format!("sha256:{}g", &hex[..63]),
            "sha256:".to_string(),
            String::new(),
        ] {
            let e = Digest::parse(&bad).expect_err(&bad);
            assert_eq!(e.text, bad);
        }
        // Multi-byte characters are refused, not split.
        assert!(Digest::from_hex(&"é".repeat(32)).is_err());
    }

    #[test]
    fn sniffing_tells_components_from_modules() {
        assert_eq!(sniff(b"\0asm\x0d\0\x01\0rest"), WasmKind::Component);
        assert_eq!(sniff(b"\0asm\x01\0\0\0rest"), WasmKind::CoreModule);
        assert_eq!(sniff(b"\0asm\x01\0"), WasmKind::Other, "too short");
        assert_eq!(sniff(b"\x7fELF\x02\x01\x01\0"), WasmKind::Other);
        assert_eq!(sniff(b""), WasmKind::Other);
    }

    #[test]
    fn only_a_regular_file_within_the_limit_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.wasm");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        assert!(matches!(
            read_regular(&file, 4),
            Err(ReadError::TooLarge { size: 5, limit: 4 })
        ));
        assert!(matches!(
            read_regular(dir.path(), 5),
            Err(ReadError::NotAFile("a directory"))
        ));
        assert!(matches!(
            read_regular(Path::new("/dev/zero"), 5),
            Err(ReadError::NotAFile("a character device"))
        ));
        assert!(matches!(
            read_regular(&dir.path().join("none"), 5),
            Err(ReadError::Io(_))
        ));
    }

    /// A FIFO with no writer would block an ordinary open for ever.
    #[tokio::test]
    async fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("p.wasm");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), read_plugin(&fifo))
            .await
            .expect("reading a FIFO must not wait for a writer");
        assert!(matches!(read, Err(ReadError::NotAFile("a FIFO"))), "{read:?}");
    }

    #[tokio::test]
    async fn a_plugin_file_is_read_off_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.wasm");
        std::fs::write(&file, b"\0asm\x0d\0\x01\0").unwrap();
        let bytes = read_plugin(&file).await.unwrap();
        assert_eq!(sniff(&bytes), WasmKind::Component);
    }
}
