"""An end-to-end plugin for sonde_sdk.credentials (not a user example): each
`mode` logs in with a secret handle from its config, through the real
bindings and the real host, and reports what it found. Run by
smoke/credentials.sh against a real Redis, PostgreSQL and an mTLS server;
the JavaScript twin is sdk/js/smoke/credentials."""

import struct
from dataclasses import dataclass
from typing import Optional

import sonde_sdk as sonde
from sonde_sdk import Outcome, ProbeError, credentials, net, tcp, tls
from sonde_sdk.credentials import ClientCert, LoginError


@dataclass
class Config:
    mode: str
    password: Optional[str] = None
    username: Optional[str] = None
    user: str = "postgres"
    client_cert: Optional[ClientCert] = None


def redis(req, config: Config, host: str, port: int) -> Outcome:
    session, _ = tcp.connect(host, port, req.remaining())
    with session:
        login = credentials.redis_login(session, config.username, config.password or "", req.remaining())
        if not login.accepted:
            return Outcome.failure(f"AUTH refused: {login.error}")
        session.send(b"PING\r\n")
        data, error = session.read_until(64, lambda b: b.endswith(b"\r\n"))
        if not data.startswith(b"+PONG\r\n"):
            return Outcome.failure(f"PING: {data[:60]!r} {error.describe() if error else ''}")
        # The reply to CONFIG GET holds the password: the host withholds it.
        session.send(b"CONFIG GET requirepass\r\n")
        data, error = session.read_until(4096, lambda b: b.startswith(b"[") or b.count(b"\r\n") >= 5)
    stored = data.decode(errors="replace") if data.startswith(b"[") else data.split(b"\r\n")[4].decode(errors="replace")
    return Outcome.success(f"PONG after AUTH ({login.method}); requirepass reads {stored}")


def read_message(session) -> tuple:
    """One PostgreSQL backend message: (type, body)."""
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = session.read(n - len(buf))
            if not chunk:
                raise ProbeError.io("the server closed the connection")
            buf += chunk
        return buf

    kind, length = struct.unpack("!ci", exactly(5))
    return kind, exactly(length - 4)


def postgres(req, config: Config, host: str, port: int) -> Outcome:
    session, _ = tcp.connect(host, port, req.remaining())
    with session:
        params = b"".join(k + b"\0" + v.encode() + b"\0" for k, v in ((b"user", config.user), (b"database", "postgres"))) + b"\0"
        session.send(struct.pack("!ii", 8 + len(params), 196608) + params)
        login = credentials.postgres_login(session, config.user, config.password or "", req.remaining())
        if not login.accepted:
            return Outcome.failure(f"login refused: {login.error}")
        # What follows AuthenticationOk is ours: up to ReadyForQuery, then a query.
        while read_message(session)[0] != b"Z":
            pass
        query = b"SELECT current_user\0"
        session.send(b"Q" + struct.pack("!i", 4 + len(query)) + query)
        row = None
        while True:
            kind, body = read_message(session)
            if kind == b"D":
                (n,) = struct.unpack("!i", body[2:6])
                row = body[6:6 + n].decode()
            if kind == b"E":
                return Outcome.failure(f"query: {body!r}")
            if kind == b"Z":
                break
    return Outcome.success(f"logged in ({login.method}) as {row}")


def mtls(req, config: Config, host: str, port: int) -> Outcome:
    if config.client_cert is not None:
        config.client_cert.present(host, port)
    try:
        session, _ = tls.connect(host, port, tls.TlsOptions(insecure_skip_verify=True), req.remaining())
    except sonde.NetError as e:
        return Outcome.failure(f"TLS: {e}")
    with session:
        session.send(b"who\n")
        data, error = session.read_until(200, lambda b: b"\n" in b)
    if not data:
        return Outcome.failure(f"the server sent nothing: {error.describe() if error else 'closed'}")
    return Outcome.success(f"the server saw {data.decode().strip()}")


class CredentialsSmoke(sonde.Probe):
    name = "credentials-smoke-py"
    Config = Config

    def check(self, req):
        config = req.config()
        host, port = net.host_port(req.target)
        try:
            if config.mode == "redis":
                return redis(req, config, host, port)
            if config.mode == "postgres":
                return postgres(req, config, host, port)
            if config.mode == "mtls":
                return mtls(req, config, host, port)
        except LoginError as e:
            return Outcome.failure(f"login: {e}")
        raise ProbeError.invalid_config(f"mode {config.mode!r}")


WitWorld = sonde.export(CredentialsSmoke)
