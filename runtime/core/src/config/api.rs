//! The `api:` block: where the API listens and its limits.

use super::*;

/// `api:` — the address alone (`api: 127.0.0.1:9464`) or a block with the
/// limits that keep the API answering while clients misbehave:
///
/// ```yaml
/// api:
///   listen: 127.0.0.1:9464      # where to serve (--api overrides it)
///   header_read_timeout: 10s    # a request's head must arrive within it
///   body_read_timeout: 30s      # an upload's body must arrive within it
///   max_connections: 1024       # open connections, agent-wide
///   max_header_bytes: 16KiB     # a request's head (at least 8KiB)
///   max_watch_streams: 64       # open GET /v1/watch streams per token
///   max_probe_runs: 8           # GET /probe runs at once, agent-wide
///   max_probe_queue: 64         # GET /probe requests waiting for a run; more: 429
///   auth: kubernetes            # auto (default), token, none or kubernetes (--api-auth overrides it)
/// ```
///
/// Each key is optional; the defaults are [`ApiLimits::default`]'s.
#[derive(Debug, Default, PartialEq)]
pub struct ApiSpec {
    /// `listen: 127.0.0.1:9464` — the address, as written.
    pub listen: Option<String>,
    /// `header_read_timeout: 10s`.
    pub header_read_timeout: Option<Dur>,
    /// `body_read_timeout: 30s`.
    pub body_read_timeout: Option<Dur>,
    /// `max_connections: 1024`.
    pub max_connections: Option<u32>,
    /// `max_header_bytes: 16KiB`.
    pub max_header_bytes: Option<Size>,
    /// `max_watch_streams: 64`.
    pub max_watch_streams: Option<u32>,
    /// `max_probe_runs: 8`.
    pub max_probe_runs: Option<u32>,
    /// `max_probe_queue: 64`.
    pub max_probe_queue: Option<u32>,
    /// `auth: kubernetes` — who may call ([`crate::auth::ApiAuth`]).
    pub auth: Option<crate::auth::ApiAuth>,
}

/// The block form of [`ApiSpec`], as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiBlock {
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    header_read_timeout: Option<Dur>,
    #[serde(default)]
    body_read_timeout: Option<Dur>,
    #[serde(default)]
    max_connections: Option<u32>,
    #[serde(default)]
    max_header_bytes: Option<Size>,
    #[serde(default)]
    max_watch_streams: Option<u32>,
    #[serde(default)]
    max_probe_runs: Option<u32>,
    #[serde(default)]
    max_probe_queue: Option<u32>,
    #[serde(default)]
    auth: Option<crate::auth::ApiAuth>,
}

impl<'de> Deserialize<'de> for ApiSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = ApiSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address such as 127.0.0.1:9464, or a mapping with listen: and the API's limits")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ApiSpec, E> {
                Ok(ApiSpec {
                    listen: Some(s.to_string()),
                    ..ApiSpec::default()
                })
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ApiSpec, A::Error> {
                let b = ApiBlock::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ApiSpec {
                    listen: b.listen,
                    header_read_timeout: b.header_read_timeout,
                    body_read_timeout: b.body_read_timeout,
                    max_connections: b.max_connections,
                    max_header_bytes: b.max_header_bytes,
                    max_watch_streams: b.max_watch_streams,
                    max_probe_runs: b.max_probe_runs,
                    max_probe_queue: b.max_probe_queue,
                    auth: b.auth,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// The API's limits in force ([`ApiSpec`] with the defaults filled in).
/// What each bounds is in `docs/security.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// A request's head (request line and headers) must arrive within this
    /// after the connection opens or the previous response ends; else the
    /// connection is closed. Bounds slow ("slowloris") and idle clients.
    /// Default 10s.
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this once its head has; else
    /// 408. Bounds slow uploads. Default 30s.
    pub body_read_timeout: Duration,
    /// Open connections, agent-wide. At the limit a new connection closes
    /// the oldest one that is between requests; when none is, the new one
    /// is closed. Default 1024.
    pub max_connections: usize,
    /// The largest request head; a larger one is answered 431. At least
    /// 8 KiB. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Open `GET /v1/watch` streams per caller (token); one more is
    /// answered 429. Default 64.
    pub max_watch_streams: usize,
    /// `GET /probe` runs at once, agent-wide: the share of the executor a
    /// scraper can take, so a flood of `/probe` requests cannot starve the
    /// scheduled probes. Default 8.
    pub max_probe_runs: usize,
    /// `GET /probe` requests waiting for one of those runs; one more is
    /// answered 429 at once. Default 64.
    pub max_probe_queue: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_header_bytes: 16 * 1024,
            max_watch_streams: 64,
            max_probe_runs: 8,
            max_probe_queue: 64,
        }
    }
}

/// An `api:` limit out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiLimitError {
    /// A count that must be positive is 0.
    #[error("api: {key}: must be at least 1")]
    Zero {
        /// The key.
        key: &'static str,
    },
    /// A read timeout under 100 ms.
    #[error("api: {key}: must be at least 100ms")]
    TimeoutTooShort {
        /// The key.
        key: &'static str,
    },
    /// `max_header_bytes` under [`ApiLimits::MIN_HEADER_BYTES`].
    #[error("api: max_header_bytes: must be at least 8KiB (got {got} bytes)")]
    HeaderBytesTooFew {
        /// The bytes it gives.
        got: u64,
    },
}

impl ApiLimits {
    /// The smallest `max_header_bytes`: below it, ordinary requests (long
    /// cookies, tokens) would be refused.
    pub const MIN_HEADER_BYTES: usize = 8 * 1024;

    /// The limits `spec` sets, the defaults elsewhere; what is out of range
    /// is named in the error.
    pub fn from_spec(spec: &ApiSpec) -> Result<Self, ApiLimitError> {
        let d = Self::default();
        let positive = |key: &'static str, v: Option<u32>, default: usize| match v {
            Some(0) => Err(ApiLimitError::Zero { key }),
            Some(n) => Ok(n as usize),
            None => Ok(default),
        };
        let timeout = |key: &'static str, v: Option<Dur>, default: Duration| match v {
            Some(Dur(t)) if t < Duration::from_millis(100) => Err(ApiLimitError::TimeoutTooShort { key }),
            Some(Dur(t)) => Ok(t),
            None => Ok(default),
        };
        let max_header_bytes = match spec.max_header_bytes {
            Some(Size(n)) if n < Self::MIN_HEADER_BYTES as u64 => {
                return Err(ApiLimitError::HeaderBytesTooFew { got: n });
            }
            Some(Size(n)) => usize::try_from(n).unwrap_or(usize::MAX).min(1 << 30),
            None => d.max_header_bytes,
        };
        Ok(Self {
            header_read_timeout: timeout("header_read_timeout", spec.header_read_timeout, d.header_read_timeout)?,
            body_read_timeout: timeout("body_read_timeout", spec.body_read_timeout, d.body_read_timeout)?,
            max_connections: positive("max_connections", spec.max_connections, d.max_connections)?,
            max_header_bytes,
            max_watch_streams: positive("max_watch_streams", spec.max_watch_streams, d.max_watch_streams)?,
            max_probe_runs: positive("max_probe_runs", spec.max_probe_runs, d.max_probe_runs)?,
            max_probe_queue: match spec.max_probe_queue {
                Some(n) => n as usize,
                None => d.max_probe_queue,
            },
        })
    }
}
