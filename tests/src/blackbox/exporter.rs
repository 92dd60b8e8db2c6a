//! blackbox_exporter, each release the answers are compared with, run on a
//! loopback port; and the plain HTTP client both are asked with.

use crate::closed_port;
use crate::raw_http::parse_response;
use crate::tools::{tool, tool_from_env};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on a new connection, with an optional bearer token: the
/// status and the body (dechunked when blackbox sends it in chunks).
pub async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!("GET {path} HTTP/1.1\r\nHost: probe\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    let (status, body) = parse_response(&text);
    // blackbox answers chunked; the chunk sizes are not samples.
    let body = if body.starts_with(|c: char| c.is_ascii_hexdigit()) && !body.starts_with("# ") {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

/// The data of a chunked body.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// A release of blackbox_exporter that sonde's answers are compared with,
/// oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Release {
    /// 0.23, Debian 12's `prometheus-blackbox-exporter`.
    V023,
    /// 0.28, the current release, built by `scripts/tools.sh` from the Go
    /// module proxy; its path is in `SONDE_BLACKBOX_028`.
    V028,
}

impl Release {
    /// Every release compared with, oldest first.
    pub const ALL: [Release; 2] = [Release::V023, Release::V028];

    /// `0.23`, `0.28`.
    pub fn version(self) -> &'static str {
        match self {
            Release::V023 => "0.23",
            Release::V028 => "0.28",
        }
    }

    /// The release's binary; `None` (the test skips it, and says so) when
    /// it is missing, unless `SONDE_REQUIRE_TOOLS` is set.
    fn binary(self) -> Option<PathBuf> {
        match self {
            Release::V023 => tool("prometheus-blackbox-exporter", "prometheus-blackbox-exporter"),
            Release::V028 => tool_from_env(
                "SONDE_BLACKBOX_028",
                "blackbox_exporter 0.28",
                "scripts/test builds it; alone: eval \"$(scripts/tools.sh)\"",
            ),
        }
    }
}

/// One release of blackbox_exporter, on a free loopback port, with a config.
pub struct Blackbox {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Which release it is.
    pub release: Release,
}

impl Blackbox {
    /// `release` with `config` (written in `dir`), once it listens; `None`
    /// when it is not installed (see [`Release::binary`]). Its `--version`
    /// must name the release.
    pub async fn start(release: Release, dir: &Path, config: &str) -> Option<Self> {
        let binary = release.binary()?;
        let version = Command::new(&binary)
            .arg("--version")
            .output()
            .expect("blackbox_exporter --version");
        let said = String::from_utf8_lossy(&version.stdout).into_owned() + &String::from_utf8_lossy(&version.stderr);
        let wanted = format!("blackbox_exporter, version {}.", release.version());
        assert!(
            said.starts_with(&wanted),
            "{}: {wanted} expected, it says {said}",
            binary.display()
        );
        let file = dir.join(format!("blackbox-{}.yml", release.version()));
        std::fs::write(&file, config).unwrap();
        let addr = closed_port();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start blackbox_exporter");
        let bb = Self { child, addr, release };
        let start = Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "blackbox_exporter {} did not listen",
                release.version()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(bb)
    }

    /// Every release that is installed, each with `config` (see
    /// [`Blackbox::start`]); empty when none is.
    pub async fn start_each(dir: &Path, config: &str) -> Vec<Self> {
        let mut all = Vec::new();
        for release in Release::ALL {
            if let Some(bb) = Self::start(release, dir, config).await {
                all.push(bb);
            }
        }
        all
    }
}

impl Drop for Blackbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
