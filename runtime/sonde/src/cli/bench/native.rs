//! The native baseline of `sonde bench`: the probes the built-in `tcp`,
//! `http` and `exec` plugins make, made directly with tokio and hyper, with
//! the host's connection policy — a new connection per probe closed with a
//! reset (SO_LINGER 0), or with `--keepalive` one kept-alive connection per
//! worker — so the sandbox's cost is what the ratio shows.

use super::{Job, RunEnd};
use crate::cli::error::CliError;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// What the baseline does, set up once from the bench's arguments.
pub(super) enum Native {
    Tcp(SocketAddr),
    Http(Arc<HttpTarget>),
    Exec(Arc<[String]>),
}

pub(super) struct HttpTarget {
    addr: SocketAddr,
    /// Path and query.
    path: String,
    /// The Host header.
    authority: String,
    keepalive: bool,
}

async fn resolve(host_port: &str) -> Result<SocketAddr, CliError> {
    tokio::net::lookup_host(host_port)
        .await
        .map_err(|e| CliError::Message(format!("--baseline: cannot resolve {host_port}: {e}")))?
        .next()
        .ok_or_else(|| CliError::Message(format!("--baseline: {host_port} has no address")))
}

impl Native {
    /// The baseline for `plugin` (a built-in name) probing `target` with
    /// the plugin's `config`.
    pub(super) async fn new(plugin: &str, target: &str, config: &str, keepalive: bool) -> Result<Self, CliError> {
        let config: serde_json::Value =
            serde_json::from_str(config).map_err(|e| CliError::Message(format!("--config is not valid JSON: {e}")))?;
        match plugin {
            "tcp" => Ok(Self::Tcp(resolve(target).await?)),
            "http" => {
                let path = config.get("path").and_then(|p| p.as_str()).unwrap_or("/");
                let url = if target.contains("://") {
                    target.to_string()
                } else {
                    format!("http://{target}{path}")
                };
                let uri: http::Uri = url
                    .parse()
                    .map_err(|e| CliError::Message(format!("--baseline: URL {url:?}: {e}")))?;
                if uri.scheme_str() != Some("http") {
                    return Err(CliError::Message(
                        "--baseline: the native http baseline speaks http:// only".into(),
                    ));
                }
                let authority = uri
                    .authority()
                    .ok_or_else(|| CliError::Message(format!("--baseline: URL {url:?} has no host")))?
                    .to_string();
                let host_port = match uri.port_u16() {
                    Some(_) => authority.clone(),
                    None => format!("{authority}:80"),
                };
                Ok(Self::Http(Arc::new(HttpTarget {
                    addr: resolve(&host_port).await?,
                    path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
                    authority,
                    keepalive,
                })))
            }
            "exec" => {
                let argv: Vec<String> = config
                    .get("command")
                    .and_then(|c| serde_json::from_value(c.clone()).ok())
                    .filter(|a: &Vec<String>| !a.is_empty())
                    .ok_or_else(|| CliError::Message("--baseline: the exec config needs a \"command\" array".into()))?;
                Ok(Self::Exec(argv.into()))
            }
            other => Err(CliError::Message(format!(
                "--baseline: no native equivalent of {other:?} (there is one for tcp, http and exec; for a plugin given by path, name one with --baseline-as)"
            ))),
        }
    }

    /// What it does, for the report.
    pub(super) fn what(&self) -> &'static str {
        match self {
            Self::Tcp(_) => "tokio TCP connect, closed with a reset",
            Self::Http(t) if t.keepalive => "tokio + hyper HTTP/1.1 GET over one keep-alive connection per worker",
            Self::Http(_) => "tokio + hyper HTTP/1.1 GET, a new connection per probe closed with a reset",
            Self::Exec(_) => "tokio spawn of the program with its output captured",
        }
    }

    /// A worker's job.
    pub(super) fn job(&self) -> NativeJob {
        match self {
            Self::Tcp(addr) => NativeJob::Tcp(*addr),
            Self::Http(t) => NativeJob::Http(t.clone(), None),
            Self::Exec(argv) => NativeJob::Exec(argv.clone()),
        }
    }
}

/// One worker's native probe, with its kept-alive connection if any.
pub(super) enum NativeJob {
    Tcp(SocketAddr),
    Http(Arc<HttpTarget>, Option<SendRequest<Empty<Bytes>>>),
    Exec(Arc<[String]>),
}

async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    // As the host: a zero linger resets the connection on close.
    #[allow(
        deprecated,
        reason = "a zero linger never blocks on drop, which is what tokio's deprecation warns of"
    )]
    let _ = stream.set_linger(Some(Duration::ZERO));
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Why a native HTTP probe failed.
#[derive(Debug, thiserror::Error)]
enum HttpGetError {
    #[error("connect {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    #[error(transparent)]
    Request(#[from] http::Error),
}

async fn http_get(t: &HttpTarget, kept: &mut Option<SendRequest<Empty<Bytes>>>) -> Result<u16, HttpGetError> {
    let mut reused = kept.take();
    if let Some(s) = &mut reused
        && s.ready().await.is_err()
    {
        reused = None;
    }
    let mut sender = match reused {
        Some(s) => s,
        None => {
            let stream = connect(t.addr)
                .await
                .map_err(|source| HttpGetError::Connect { addr: t.addr, source })?;
            let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            sender
        }
    };
    let request = http::Request::get(t.path.as_str())
        .header(http::header::HOST, t.authority.as_str())
        .header(http::header::USER_AGENT, "sonde-bench-native")
        .body(Empty::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    response.into_body().collect().await?;
    if t.keepalive {
        *kept = Some(sender);
    }
    Ok(status)
}

impl Job for NativeJob {
    async fn run(&mut self) -> RunEnd {
        match self {
            Self::Tcp(addr) => match connect(*addr).await {
                Ok(stream) => {
                    drop(stream);
                    RunEnd::ok()
                }
                Err(e) => RunEnd::failed(format!("connect {addr}: {e}")),
            },
            Self::Http(t, kept) => match http_get(t, kept).await {
                Ok(status) if (200..400).contains(&status) => RunEnd::ok(),
                Ok(status) => RunEnd::failed(format!("HTTP {status}")),
                Err(e) => RunEnd::failed(e.to_string()),
            },
            Self::Exec(argv) => {
                let out = tokio::process::Command::new(&argv[0])
                    .args(&argv[1..])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .await;
                match out {
                    Ok(o) if o.status.success() => RunEnd::ok(),
                    Ok(o) => RunEnd::failed(format!("{} exited {}", argv[0], o.status)),
                    Err(e) => RunEnd::failed(format!("{}: {e}", argv[0])),
                }
            }
        }
    }
}
