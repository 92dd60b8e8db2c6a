//! The `redis` probe: speaks RESP to the target (`host:port`), optionally
//! authenticates, sends `PING` (which must answer `PONG`), then reads
//! `INFO replication`: the server's role must be the configured one, and a
//! replica's link to its master must be up. A replica whose master is gone
//! answers `PING` happily; this is the check that notices.
//!
//! A `password` that names a secret by handle (`$(secret:NAME)`) is never
//! seen by the plugin: the host sends `AUTH` with it on the plugin's
//! session ([`sonde_sdk::credentials::redis_login`]). The connection is the
//! host's (`tcp`) either way, since a probe granted secrets opens no socket
//! of its own.

use serde::Deserialize;
use sonde_sdk::credentials::{self, Login, LoginError};
use sonde_sdk::tls::{HandshakeError, Session};
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request, net};
use std::io::{self, Read};
use std::time::{Duration, Instant};

/// The largest bulk reply read; `INFO replication` is a few hundred bytes.
const MAX_BULK: usize = 1024 * 1024;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    role: Option<Role>,
    username: Option<String>,
    password: Option<String>,
    max_link_age: Option<String>,
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Role {
    Master,
    #[serde(alias = "slave")]
    Replica,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Self::Master => "master",
            Self::Replica => "replica",
        }
    }
}

/// One RESP reply.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(usize),
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Simple(s) => write!(f, "+{s}"),
            Self::Error(e) => write!(f, "-{e}"),
            Self::Integer(i) => write!(f, ":{i}"),
            Self::Bulk(None) => f.write_str("a null bulk string"),
            Self::Bulk(Some(b)) => write!(f, "a bulk string of {} bytes", b.len()),
            Self::Array(n) => write!(f, "an array of {n}"),
        }
    }
}

/// Reads RESP replies from a session the host holds, a line at a time.
struct Resp {
    stream: Session,
    buf: Vec<u8>,
}

impl Resp {
    fn new(stream: Session) -> Self {
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    /// Sends one command as a RESP array of bulk strings.
    fn command(&mut self, args: &[&str]) -> io::Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        net::send(&mut self.stream, &out)?;
        self.reply()
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 4096];
        loop {
            match Read::read(&mut self.stream, &mut chunk) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ));
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..i].to_vec();
                self.buf.drain(..i + 2);
                return Ok(line);
            }
            if self.buf.len() > 64 * 1024 {
                return Err(invalid("a reply line longer than 64 KiB"));
            }
            self.fill()?;
        }
    }

    fn reply(&mut self) -> io::Result<Reply> {
        let line = self.line()?;
        let (kind, rest) = line.split_first().ok_or_else(|| invalid("an empty reply line"))?;
        let text = String::from_utf8_lossy(rest).into_owned();
        match kind {
            b'+' => Ok(Reply::Simple(text)),
            b'-' => Ok(Reply::Error(text)),
            b':' => text
                .parse()
                .map(Reply::Integer)
                .map_err(|_| invalid("a bad integer reply")),
            b'$' => {
                let len: i64 = text.parse().map_err(|_| invalid("a bad bulk length"))?;
                if len < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let len = len as usize;
                if len > MAX_BULK {
                    return Err(invalid("a bulk reply larger than 1 MiB"));
                }
                while self.buf.len() < len + 2 {
                    self.fill()?;
                }
                let data = self.buf[..len].to_vec();
                self.buf.drain(..len + 2);
                Ok(Reply::Bulk(Some(data)))
            }
            b'*' => text
                .parse::<i64>()
                .map(|n| Reply::Array(n.max(0) as usize))
                .map_err(|_| invalid("a bad array length")),
            _ => Err(invalid("not a RESP reply (is this a Redis server?)")),
        }
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("protocol error: {what}"))
}

/// The `name:value` fields of an `INFO` section.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

/// Judges `INFO replication` against the config.
fn judge(info: &str, want: Option<Role>, max_link_age: Option<Duration>) -> Outcome {
    let role = match info_field(info, "role") {
        Some("master") => Role::Master,
        Some("slave") | Some("replica") => Role::Replica,
        other => return Outcome::unknown(format!("INFO replication has no known role: {other:?}")),
    };
    if let Some(want) = want
        && want != role
    {
        return Outcome::failure(format!("role is {}, expected {}", role.as_str(), want.as_str()));
    }
    match role {
        Role::Master => {
            let replicas = info_field(info, "connected_slaves")
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            Outcome::success(format!("PONG; role master with {replicas} connected replica(s)")).with_metric(
                "connected_replicas",
                replicas,
                "",
            )
        }
        Role::Replica => {
            let master = format!(
                "{}:{}",
                info_field(info, "master_host").unwrap_or("?"),
                info_field(info, "master_port").unwrap_or("?")
            );
            let link = info_field(info, "master_link_status").unwrap_or("unknown");
            if link != "up" {
                let since = info_field(info, "master_link_down_since_seconds")
                    .filter(|s| *s != "-1")
                    .map(|s| format!(" for {s}s"))
                    .unwrap_or_default();
                return Outcome::failure(format!("replica: link to master {master} is {link}{since}"));
            }
            let io_age = info_field(info, "master_last_io_seconds_ago").and_then(|v| v.parse::<f64>().ok());
            let mut outcome = Outcome::success(format!("PONG; role replica, link to master {master} up"));
            if let Some(age) = io_age {
                if let Some(max) = max_link_age
                    && age > max.as_secs_f64()
                {
                    outcome = Outcome::warning(format!(
                        "replica: last I/O with master {master} {age}s ago, more than {}s",
                        max.as_secs_f64()
                    ));
                }
                outcome = outcome.with_metric("master_last_io_seconds", age, "seconds");
            }
            outcome
        }
    }
}

struct Redis;

impl Probe for Redis {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "Redis: AUTH (a password given as a secret handle, $(secret:NAME), is sent by the host, never seen by the plugin), PING, then the replication role and, on a replica, the master link status.".into(),
            config_schema: Some(include_str!("schema.json").into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let max_link_age = config
            .max_link_age
            .as_deref()
            .map(|s| {
                humantime::parse_duration(s).map_err(|e| ProbeError::invalid_config(format!("max_link_age {s:?}: {e}")))
            })
            .transpose()?;
        if config.username.is_some() && config.password.is_none() {
            return Err(ProbeError::invalid_config("username needs a password"));
        }
        let start = Instant::now();
        let stream = match sonde_sdk::tcp::open_target(&req) {
            Ok((s, _)) => s,
            Err(HandshakeError::Failed(m)) => return Ok(Outcome::failure(m)),
            Err(HandshakeError::Probe(e)) => return Err(e),
        };
        let mut resp = Resp::new(stream);
        let failed = |what: &str, e: io::Error| Outcome::failure(format!("{what}: {}", net::describe_error(&e)));

        if let Some(handle) = config.password.as_deref().filter(|p| credentials::has_handle(p)) {
            match credentials::redis_login(&resp.stream, config.username.as_deref(), handle, req.remaining()) {
                Ok(Login::Accepted(_)) => {}
                Ok(Login::Refused(e)) => return Ok(Outcome::failure(format!("AUTH refused: {e}"))),
                Err(LoginError::Failed(m)) => return Ok(Outcome::failure(format!("AUTH: {m}"))),
                Err(LoginError::Probe(e)) => return Err(e),
            }
        } else if let Some(password) = &config.password {
            let mut args = vec!["AUTH"];
            if let Some(user) = &config.username {
                args.push(user);
            }
            args.push(password);
            match resp.command(&args) {
                Ok(Reply::Simple(s)) if s == "OK" => {}
                Ok(Reply::Error(e)) => return Ok(Outcome::failure(format!("AUTH refused: {e}"))),
                Ok(other) => return Ok(Outcome::failure(format!("AUTH: unexpected reply {other}"))),
                Err(e) => return Ok(failed("AUTH", e)),
            }
        }
        match resp.command(&["PING"]) {
            Ok(Reply::Simple(s)) if s == "PONG" => {}
            Ok(Reply::Error(e)) => return Ok(Outcome::failure(format!("PING: {e}"))),
            Ok(other) => return Ok(Outcome::failure(format!("PING: unexpected reply {other}"))),
            Err(e) => return Ok(failed("PING", e)),
        }
        let ping = start.elapsed().as_secs_f64();
        let info = match resp.command(&["INFO", "replication"]) {
            Ok(Reply::Bulk(Some(b))) => String::from_utf8_lossy(&b).into_owned(),
            Ok(Reply::Error(e)) => return Ok(Outcome::failure(format!("INFO replication: {e}"))),
            Ok(other) => return Ok(Outcome::failure(format!("INFO replication: unexpected reply {other}"))),
            Err(e) => return Ok(failed("INFO replication", e)),
        };
        Ok(judge(&info, config.role, max_link_age)
            .with_metric("ping_seconds", ping, "seconds")
            .with_metric("probe_seconds", start.elapsed().as_secs_f64(), "seconds"))
    }
}

sonde_sdk::export!(Redis);

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_sdk::Status;

    const REPLICA_DOWN: &str = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_port:1\r\nmaster_link_status:down\r\nmaster_last_io_seconds_ago:-1\r\nmaster_link_down_since_seconds:-1\r\n";
    const REPLICA_UP: &str = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6379\r\nmaster_link_status:up\r\nmaster_last_io_seconds_ago:40\r\n";
    const MASTER: &str = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n";

    #[test]
    fn roles_and_links_are_judged() {
        assert_eq!(judge(MASTER, None, None).status, Status::Success);
        assert_eq!(judge(MASTER, Some(Role::Master), None).status, Status::Success);
        let o = judge(MASTER, Some(Role::Replica), None);
        assert_eq!(o.status, Status::Failure);
        assert_eq!(o.message, "role is master, expected replica");
        let o = judge(REPLICA_DOWN, None, None);
        assert_eq!(o.status, Status::Failure);
        assert_eq!(o.message, "replica: link to master 127.0.0.1:1 is down");
        assert_eq!(judge(REPLICA_UP, Some(Role::Replica), None).status, Status::Success);
        let o = judge(REPLICA_UP, None, Some(Duration::from_secs(30)));
        assert_eq!(o.status, Status::Warning, "{}", o.message);
        assert_eq!(judge("garbage", None, None).status, Status::Unknown);
    }

    #[test]
    fn config_accepts_slave_for_replica_and_refuses_unknown_keys() {
        let c: Config = serde_json::from_str(r#"{"role": "slave"}"#).unwrap();
        assert_eq!(c.role, Some(Role::Replica));
        assert!(serde_json::from_str::<Config>(r#"{"rol": "master"}"#).is_err());
        assert!(serde_json::from_str::<Config>(r#"{"role": "primary"}"#).is_err());
    }
}
