"""Secrets the plugin uses but never sees (`sonde:probe/credentials`).

An operator grants a probe secrets (`grants.secrets`), and the probe's
config names them by *handle*: `$(secret:NAME)` in a text stands for the
secret's bytes (and `$(base64:...)` for the base64 of what it encloses).
The plugin passes such text to the host, which expands it only toward the
probe's target and its `net` grants and puts the bytes on the wire itself;
the plugin never holds them, and what a peer answers that reflects one
reaches it as `[withheld: the peer reflected a secret]`.

- `postgres_login` and `redis_login` log in on a `Session` the plugin
  opened with `tcp.connect` (or `tls.connect`);
- `client_certificate` (or `ClientCert.present`) registers a client
  certificate (PEM text or handles) that the host presents to a peer in
  every TLS handshake of the call (`tls`, `http`, `grpc`).

A probe granted secrets reaches peers only through the host's transports:
`socket` (`wasi:sockets`) is refused to it. A password that holds no handle
is sent as it is written, so the same plugin code serves plain configs too.

    session, _ = tcp.connect(host, port, req.remaining())
    with session:
        login = credentials.redis_login(session, None, config.password, req.remaining())
        if not login.accepted:
            return Outcome.failure(f"AUTH refused: {login.error}")
        ...

The Rust SDK's `Login::Accepted(method)` / `Login::Refused(error)` are
`Accepted` / `Refused` here (both a `Login`); its `LoginError::Failed` is
`LoginError` (a `NetError`: the target failed), its `LoginError::Probe` a
plain `ProbeError` ("denied", "invalid-config"), as everywhere in this SDK.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import _host
from ._errors import ProbeError
from .net import NetError
from .tls import Session

# How a handle starts: `$(secret:NAME)`, or `$(base64:...)` around text and
# secret handles.
_HANDLES = ("$(secret:", "$(base64:")


def has_handle(text: str) -> bool:
    """Whether `text` holds a handle (well formed or not): text the host must
    expand, which only the host's logins and transports can send."""
    return any(h in text for h in _HANDLES)


@dataclass(frozen=True)
class Login:
    """What a login came to: `Accepted` or `Refused`."""

    @property
    def accepted(self) -> bool:
        """Whether the server accepted the login."""
        return isinstance(self, Accepted)


@dataclass(frozen=True)
class Accepted(Login):
    """The server accepted the login."""

    method: str
    """`trust`, `password`, `md5` or `scram-sha-256` (PostgreSQL), `auth` (Redis)."""


@dataclass(frozen=True)
class Refused(Login):
    """The server refused the login."""

    error: str
    """Its error (PostgreSQL: `SEVERITY CODE: message (detail)`; Redis: the
    error reply without its `-`), withheld whole when it reflects a secret."""


class LoginError(NetError):
    """The server failed during a login: it closed the connection
    ("connect"), did not answer in time ("timeout"), or broke the protocol
    ("protocol": a SCRAM signature that does not verify, a malformed
    message). A `NetError`, so of kind "io": catch it to report a failure."""

    def __repr__(self) -> str:
        return f"LoginError({self.failure!r}, {self.detail!r})"


# What the host answers, as this module gives it: the component's glue
# (`_wit`) passes each WIT variant as its case's name and payload.


def _login(case: str, value: str) -> Login:
    """The WIT `login` variant: `accepted(method)` or `refused(error)`."""
    if case == "accepted":
        return Accepted(value)
    if case == "refused":
        return Refused(value)
    raise ProbeError.internal(f"login: unknown case {case!r}")


def _login_error(case: str, message: str) -> ProbeError:
    """A login's `tls-error`: the server's failure (LoginError: "dns",
    "connect", "timeout", or "protocol" for the host's `handshake`), or the
    check's (a secret or peer denied, a malformed handle, a login the host
    does not speak)."""
    if case == "denied":
        return ProbeError.denied(message)
    if case == "invalid":
        return ProbeError.invalid_config(message)
    return LoginError("protocol" if case == "handshake" else case, message)


def _client_certificate_error(case: str, message: str, host: str, port: int) -> ProbeError:
    """`client-certificate`'s `tls-error`: denied, invalid-config, or (what
    the host does not answer today) an i/o error naming the peer."""
    if case == "denied":
        return ProbeError.denied(message)
    if case == "invalid":
        return ProbeError.invalid_config(message)
    return ProbeError.io(f"client certificate for {host}:{port}: {message}")


def _session(session: Session) -> object:
    raw = getattr(session, "_raw", None)
    if raw is None:
        raise ProbeError.internal("log in on an open session (from tcp.connect or tls.connect), not a closed one")
    return raw


def postgres_login(session: Session, user: str, password: str, timeout: float = 1.0) -> Login:
    """Logs in to the PostgreSQL server at the other end of `session` as
    `user`, the host answering its authentication requests (cleartext, md5,
    SCRAM-SHA-256 with the server's signature verified) with `password`, a
    handle such as `$(secret:pg-password)`. Call it right after sending the
    StartupMessage naming `user`; on `Accepted`, the messages that follow
    AuthenticationOk (ParameterStatus, BackendKeyData, ReadyForQuery) are
    yours to read. Waits at most `timeout` seconds in all.

    A failing server raises `LoginError`; a secret not granted toward this
    peer `ProbeError("denied")`; a malformed handle, a session holding
    unread data, or a login the host does not speak (GSSAPI)
    `ProbeError("invalid-config")`."""
    return _host.current().postgres_login(_session(session), user, password, max(1, int(timeout * 1000)))


def redis_login(session: Session, username: Optional[str], password: str, timeout: float = 1.0) -> Login:
    """Logs in to the Redis server at the other end of `session` with `AUTH
    [username] password` (`password` a handle) and reads its reply: `+OK` is
    `Accepted("auth")`, an error reply `Refused`. Call it right after
    connecting. Waits at most `timeout` seconds. Errors as `postgres_login`."""
    return _host.current().redis_login(_session(session), username, password, max(1, int(timeout * 1000)))


def client_certificate(host: str, port: int, cert: str, key: str) -> None:
    """From now until the call ends, every TLS handshake the host makes for
    the call with `host:port` presents this client certificate: `cert` (a PEM
    chain) and `key` (a PEM private key), each PEM text or a handle such as
    `$(secret:client-key)`. The peer must be the target or a `net` grant; at
    most 4 per call, and a second one for a peer replaces the first. A denied
    peer or secret is ProbeError("denied"), a certificate that does not parse
    ProbeError("invalid-config")."""
    _host.current().client_certificate(host, port, cert, key)


@dataclass(repr=False)
class ClientCert:
    """A client certificate as a plugin's config gives it,
    `"client_cert": {"cert": "$(secret:crt)", "key": "$(secret:key)"}`: each
    part a handle or PEM text. A config dataclass field
    `client_cert: Optional[ClientCert] = None` reads it (unknown keys refused)."""

    cert: str
    """The certificate chain (PEM), or a handle."""
    key: str
    """The private key (PEM), or a handle."""

    def present(self, host: str, port: int) -> None:
        """Has the host present it to `host:port` (`client_certificate`)."""
        client_certificate(host, port, self.cert, self.key)

    def __repr__(self) -> str:
        # PEM text may be a private key: only handles are shown.
        def shown(v: str) -> str:
            return repr(v) if has_handle(v) else f"<{len(v)} chars of PEM>"

        return f"ClientCert(cert={shown(self.cert)}, key={shown(self.key)})"


__all__ = ["Accepted", "ClientCert", "Login", "LoginError", "Refused", "client_certificate", "has_handle",
           "postgres_login", "redis_login"]
