//! The `postgres` probe: speaks the PostgreSQL wire protocol itself, over
//! the SDK's TCP helper, to tell a running server from a ready database.
//!
//! It connects to the target (`host:port`), sends the startup message,
//! authenticates as the server asks (trust, cleartext password, md5 or
//! SCRAM-SHA-256, checking the server's SCRAM signature too), runs a query
//! (`SELECT 1` by default) with the simple query protocol, and optionally
//! checks the server's role and a standby's replay lag. A server that is
//! starting up, shutting down, refuses the login or fails the query is a
//! failure carrying the server's own message and SQLSTATE.
//!
//! A `password` that names a secret by handle (`$(secret:NAME)`) is never
//! seen by the plugin: the host logs in with it on the plugin's session
//! ([`sonde_sdk::credentials::postgres_login`]), and the plugin goes on
//! from AuthenticationOk. The connection is the host's (`tcp`) either way,
//! since a probe granted secrets opens no socket of its own.

mod scram;
mod wire;

use md5::Md5;
use serde::Deserialize;
use sha2::Digest;
use sonde_sdk::credentials::{self, Login, LoginError};
use sonde_sdk::tls::HandshakeError;
use sonde_sdk::{Capability, CapabilityKind, Outcome, PluginInfo, Probe, ProbeError, Request, net};
use std::io;
use std::time::{Duration, Instant};
use wire::{Conn, ServerError, protocol_error, simple_query};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_user")]
    user: String,
    password: Option<String>,
    password_file: Option<String>,
    database: Option<String>,
    #[serde(default = "default_query")]
    query: String,
    role: Option<Role>,
    max_replica_lag: Option<String>,
    #[serde(default = "default_application_name")]
    application_name: String,
}

fn default_user() -> String {
    "postgres".into()
}
fn default_query() -> String {
    "SELECT 1".into()
}
fn default_application_name() -> String {
    "sonde".into()
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Role {
    Primary,
    Standby,
}

/// Why a check stopped early: the target is unhealthy, or the check could
/// not be made.
enum Stop {
    Failure(String),
    Error(ProbeError),
}

impl From<ProbeError> for Stop {
    fn from(e: ProbeError) -> Self {
        Self::Error(e)
    }
}

/// A connection that broke mid-protocol is the target's failure.
fn broken(step: &str) -> impl FnOnce(io::Error) -> Stop + '_ {
    move |e| Stop::Failure(format!("{step}: {}", net::describe_error(&e)))
}

/// Reads the password from the config or its file (through the files grant).
fn password(config: &Config) -> Result<Option<String>, ProbeError> {
    match (&config.password, &config.password_file) {
        (Some(_), Some(_)) => Err(ProbeError::invalid_config("give password or password_file, not both")),
        (Some(p), None) => Ok(Some(p.clone())),
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(text.trim_end_matches(['\r', '\n']).to_string())),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(ProbeError::denied(format!(
                "password_file {path}: not readable; grant its directory read-only ({e})"
            ))),
            Err(e) => Err(ProbeError::invalid_config(format!("password_file {path}: {e}"))),
        },
        (None, None) => Ok(None),
    }
}

/// `md5` followed by md5(md5(password + user) + salt), in hex.
fn md5_password(user: &str, password: &str, salt: &[u8]) -> String {
    let inner = hex(&Md5::digest(format!("{password}{user}").as_bytes()));
    let mut outer = Md5::new();
    outer.update(inner.as_bytes());
    outer.update(salt);
    format!("md5{}", hex(&outer.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn cstring(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Which authentication the server asked for, for the message.
#[derive(Clone, Copy)]
enum Method {
    Trust,
    Password,
    Md5,
    Scram,
}

impl Method {
    /// The method a host login reports.
    fn from_host(name: &str) -> Option<Self> {
        [Self::Trust, Self::Password, Self::Md5, Self::Scram]
            .into_iter()
            .find(|m| m.as_str() == name)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Trust => "trust",
            Self::Password => "password",
            Self::Md5 => "md5",
            Self::Scram => "scram-sha-256",
        }
    }
}

/// How the login is made: by the plugin, with the password it holds, if
/// any; or by the host, with a password the plugin names by handle.
#[derive(Clone, Copy)]
enum Credentials<'a> {
    Own(Option<&'a str>),
    Handle(&'a str),
}

/// The host logs in with the password `handle` names; the plugin reads
/// nothing of the exchange and goes on from AuthenticationOk.
fn host_login(conn: &Conn, user: &str, handle: &str, timeout: Duration) -> Result<Method, Stop> {
    let session = conn
        .session()
        .ok_or_else(|| Stop::Error(ProbeError::internal("a host login after the plugin read the reply")))?;
    match credentials::postgres_login(session, user, handle, timeout) {
        Ok(Login::Accepted(method)) => Method::from_host(&method)
            .ok_or_else(|| Stop::Error(ProbeError::io(format!("the host logged in with {method:?}")))),
        Ok(Login::Refused(e)) => Err(Stop::Failure(format!("authentication refused: {e}"))),
        Err(LoginError::Failed(m)) => Err(Stop::Failure(format!("login: {m}"))),
        Err(LoginError::Probe(e)) => Err(Stop::Error(e)),
    }
}

/// Logs in after the startup message and waits for ReadyForQuery.
/// Returns the method used and the server version.
fn login(
    conn: &mut Conn,
    user: &str,
    credentials: Credentials<'_>,
    timeout: Duration,
) -> Result<(Method, String), Stop> {
    match credentials {
        Credentials::Own(password) => authenticate(conn, user, password, None),
        Credentials::Handle(handle) => {
            let method = host_login(conn, user, handle, timeout)?;
            authenticate(conn, user, None, Some(method))
        }
    }
}

/// Authenticates after the startup message (or, when the host logged in
/// with `by_host`, after AuthenticationOk) and waits for ReadyForQuery.
/// Returns the method used and the server version.
fn authenticate(
    conn: &mut Conn,
    user: &str,
    password: Option<&str>,
    by_host: Option<Method>,
) -> Result<(Method, String), Stop> {
    let need_password = |method: &str| {
        Stop::Error(ProbeError::invalid_config(format!(
            "the server asks for {method} authentication and no password or password_file is configured"
        )))
    };
    let mut method = by_host.unwrap_or(Method::Trust);
    let mut scram: Option<(scram::Scram, Option<scram::ClientFinal>)> = None;
    let mut version = String::new();
    let mut server_verified = false;
    loop {
        let msg = conn.recv().map_err(broken("startup"))?;
        match msg.tag {
            b'E' => {
                return Err(Stop::Failure(format!(
                    "{} refused: {}",
                    if matches!(method, Method::Trust) {
                        "login"
                    } else {
                        "authentication"
                    },
                    ServerError::parse(&msg.body)
                )));
            }
            b'R' if by_host.is_some() => {
                return Err(Stop::Failure(format!(
                    "startup: {}",
                    protocol_error("an authentication request after the host's login")
                )));
            }
            b'R' => {
                let kind = wire::be_i32(&msg.body, 0)
                    .ok_or_else(|| Stop::Error(ProbeError::io("short Authentication message")))?;
                match kind {
                    0 => {
                        // AuthenticationOk. After SCRAM it must follow a verified
                        // SASLFinal: a server that skips it has not proved it
                        // knows the password.
                        if scram.is_some() && !server_verified {
                            return Err(Stop::Failure(
                                "SCRAM: the server accepted the login without proving it knows the password".into(),
                            ));
                        }
                    }
                    3 => {
                        method = Method::Password;
                        let pw = password.ok_or_else(|| need_password("password"))?;
                        conn.send(b'p', &cstring(pw)).map_err(broken("password"))?;
                    }
                    5 => {
                        method = Method::Md5;
                        let pw = password.ok_or_else(|| need_password("md5"))?;
                        let salt = msg
                            .body
                            .get(4..8)
                            .ok_or_else(|| Stop::Error(ProbeError::io("short md5 salt")))?;
                        conn.send(b'p', &cstring(&md5_password(user, pw, salt)))
                            .map_err(broken("md5 password"))?;
                    }
                    10 => {
                        method = Method::Scram;
                        let mut mechanisms = Vec::new();
                        let mut rest = &msg.body[4..];
                        while !rest.is_empty() && rest[0] != 0 {
                            let (m, tail) = wire::cstr(rest);
                            mechanisms.push(m);
                            rest = tail;
                        }
                        if !mechanisms.iter().any(|m| m == "SCRAM-SHA-256") {
                            return Err(Stop::Error(ProbeError::io(format!(
                                "the server offers only SASL mechanisms {mechanisms:?}; sonde speaks SCRAM-SHA-256"
                            ))));
                        }
                        let pw = password.ok_or_else(|| need_password("SCRAM-SHA-256"))?;
                        let s = scram::Scram::new(pw).map_err(|e| Stop::Error(ProbeError::internal(e.to_string())))?;
                        let first = s.client_first();
                        let mut body = cstring("SCRAM-SHA-256");
                        body.extend_from_slice(&(first.len() as i32).to_be_bytes());
                        body.extend_from_slice(first.as_bytes());
                        conn.send(b'p', &body).map_err(broken("SCRAM"))?;
                        scram = Some((s, None));
                    }
                    11 => {
                        let Some((s, fin)) = scram.as_mut() else {
                            return Err(Stop::Error(ProbeError::io("SASLContinue before SASL")));
                        };
                        let server_first = String::from_utf8_lossy(&msg.body[4..]).into_owned();
                        let f = s
                            .client_final(&server_first)
                            .map_err(|e| Stop::Failure(format!("SCRAM: {e}")))?;
                        conn.send(b'p', f.message.as_bytes()).map_err(broken("SCRAM"))?;
                        *fin = Some(f);
                    }
                    12 => {
                        let Some((_, Some(fin))) = scram.as_ref() else {
                            return Err(Stop::Error(ProbeError::io("SASLFinal before SASLContinue")));
                        };
                        fin.verify_server(&String::from_utf8_lossy(&msg.body[4..]))
                            .map_err(|e| Stop::Failure(format!("SCRAM: {e}")))?;
                        server_verified = true;
                    }
                    7..=9 => {
                        return Err(Stop::Error(ProbeError::io(
                            "the server asks for GSSAPI or SSPI authentication, which sonde does not speak",
                        )));
                    }
                    2 | 6 => {
                        return Err(Stop::Error(ProbeError::io(
                            "the server asks for Kerberos or SCM authentication, which sonde does not speak",
                        )));
                    }
                    other => {
                        return Err(Stop::Error(ProbeError::io(format!(
                            "unknown authentication request {other}"
                        ))));
                    }
                }
            }
            b'S' => {
                let (name, rest) = wire::cstr(&msg.body);
                if name == "server_version" {
                    version = wire::cstr(rest).0;
                }
            }
            b'K' | b'N' => {}
            b'Z' => return Ok((method, version)),
            other => {
                return Err(Stop::Failure(format!(
                    "startup: {}",
                    protocol_error(format!("unexpected message {:?}", other as char))
                )));
            }
        }
    }
}

/// Runs `sql` and fails the check on a server error.
fn query(conn: &mut Conn, sql: &str) -> Result<Vec<Vec<Option<String>>>, Stop> {
    let result = simple_query(conn, sql).map_err(broken("query"))?;
    match result.error {
        Some(e) => Err(Stop::Failure(format!("query {sql:?} failed: {e}"))),
        None => Ok(result.rows),
    }
}

/// Whether the server is in recovery (a standby), and the replay lag in
/// seconds: 0 when everything received has been replayed, otherwise the
/// age of the last replayed transaction (None when nothing was replayed).
const REPLICATION_QUERY: &str = "SELECT pg_is_in_recovery(), \
     CASE WHEN pg_last_wal_receive_lsn() IS NOT NULL AND pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 \
     ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END";

struct Replication {
    standby: bool,
    lag: Option<f64>,
}

fn replication(conn: &mut Conn) -> Result<Replication, Stop> {
    let rows = query(conn, REPLICATION_QUERY)?;
    let row = rows
        .first()
        .ok_or_else(|| Stop::Error(ProbeError::io("the replication query returned no row")))?;
    let standby = row.first().and_then(|v| v.as_deref()) == Some("t");
    let lag = row
        .get(1)
        .and_then(|v| v.as_deref())
        .and_then(|v| v.parse::<f64>().ok());
    Ok(Replication { standby, lag })
}

struct Postgres;

impl Probe for Postgres {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "PostgreSQL: connect, authenticate (trust, password, md5, SCRAM-SHA-256; a password given as a secret handle, $(secret:NAME), is used by the host, never seen by the plugin), run a query, and optionally check the role and a standby's replay lag.".into(),
            config_schema: Some(include_str!("schema.json").into()),
            capabilities: vec![Capability {
                kind: CapabilityKind::Files,
                value: "*".into(),
                why: "only with `password_file`: reads the password from it; grant its directory read-only".into(),
            }],
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let max_lag = config
            .max_replica_lag
            .as_deref()
            .map(|s| {
                humantime::parse_duration(s)
                    .map_err(|e| ProbeError::invalid_config(format!("max_replica_lag {s:?}: {e}")))
            })
            .transpose()?;
        if config.query.trim().is_empty() {
            return Err(ProbeError::invalid_config("query must not be empty"));
        }
        let password = password(&config)?;
        // Only the config's own text is taken for a handle; a password_file
        // is sent as it reads.
        let credentials = match (&config.password, password.as_deref()) {
            (Some(p), _) if credentials::has_handle(p) => Credentials::Handle(p),
            (_, own) => Credentials::Own(own),
        };
        match run(&req, &config, credentials, max_lag) {
            Ok(outcome) => Ok(outcome),
            Err(Stop::Failure(message)) => Ok(Outcome::failure(message)),
            Err(Stop::Error(e)) => Err(e),
        }
    }
}

fn run(
    req: &Request,
    config: &Config,
    credentials: Credentials<'_>,
    max_lag: Option<Duration>,
) -> Result<Outcome, Stop> {
    let start = Instant::now();
    let stream = match sonde_sdk::tcp::open_target(req) {
        Ok((s, _)) => s,
        Err(HandshakeError::Failed(m)) => return Err(Stop::Failure(m)),
        Err(HandshakeError::Probe(e)) => return Err(e.into()),
    };
    let connected = start.elapsed().as_secs_f64();
    let mut conn = Conn::new(stream);
    let database = config.database.as_deref().unwrap_or(&config.user);
    conn.startup(&[
        ("user", &config.user),
        ("database", database),
        ("application_name", &config.application_name),
        ("client_encoding", "UTF8"),
    ])
    .map_err(broken("startup"))?;
    let (method, version) = login(&mut conn, &config.user, credentials, req.remaining())?;
    let ready = start.elapsed().as_secs_f64();

    let rows = query(&mut conn, &config.query)?;
    let answered = start.elapsed().as_secs_f64() - ready;
    let first = rows.first().and_then(|r| r.first()).map(|v| match v {
        Some(v) if v.len() > 64 => format!("{}…", v.chars().take(64).collect::<String>()),
        Some(v) => v.clone(),
        None => "NULL".into(),
    });

    let mut role_text = String::new();
    let mut outcome_lag = None;
    if config.role.is_some() || max_lag.is_some() {
        let r = replication(&mut conn)?;
        let role = if r.standby { Role::Standby } else { Role::Primary };
        if let Some(want) = config.role
            && want != role
        {
            conn.terminate();
            return Err(Stop::Failure(format!(
                "role is {}, expected {}",
                role_name(role),
                role_name(want)
            )));
        }
        role_text = format!(", {}", role_name(role));
        if r.standby {
            match (r.lag, max_lag) {
                (Some(lag), Some(max)) if lag > max.as_secs_f64() => {
                    conn.terminate();
                    return Err(Stop::Failure(format!(
                        "standby replay lag {lag:.1}s, more than {}",
                        humantime::format_duration(max)
                    )));
                }
                (None, Some(_)) => {
                    conn.terminate();
                    return Err(Stop::Failure(
                        "standby has replayed no transaction since it started: lag unknown".into(),
                    ));
                }
                _ => {}
            }
            outcome_lag = r.lag;
        }
    }
    conn.terminate();

    let shown = match first {
        Some(v) => format!("{:?} → {v}", config.query),
        None => format!("{:?} → no rows", config.query),
    };
    let mut outcome = Outcome::success(format!(
        "{shown}; PostgreSQL {version}{role_text}, {} auth as {}",
        method.as_str(),
        config.user
    ))
    .with_metric("connect_seconds", connected, "seconds")
    .with_metric("ready_seconds", ready, "seconds")
    .with_metric("query_seconds", answered, "seconds")
    .with_metric("probe_seconds", start.elapsed().as_secs_f64(), "seconds");
    if let Some(lag) = outcome_lag {
        outcome = outcome.with_metric("replica_lag_seconds", lag, "seconds");
    }
    Ok(outcome)
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Primary => "primary",
        Role::Standby => "standby",
    }
}

sonde_sdk::export!(Postgres);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_and_password_file_are_exclusive() {
        let config: Config = serde_json::from_str(r#"{"password": "a", "password_file": "/x"}"#).unwrap();
        assert!(password(&config).is_err());
        assert!(serde_json::from_str::<Config>(r#"{"pasword": "a"}"#).is_err());
    }
}
