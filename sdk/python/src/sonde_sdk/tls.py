"""TLS by the host (`sonde:probe/tls`), and the TLS options `http` takes.

The host runs the TLS client (the system's roots or a CA the plugin passes);
no TLS code runs in the sandbox. `handshake` connects, completes a handshake
and closes; `connect` keeps the connection open as a `Session`. Both reach
only the probe's target and its `net` grants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from . import _host
from ._errors import ProbeError
from .net import NetError, SessionError, read_until as _read_until


@dataclass
class TlsOptions:
    """How the host verifies a server."""

    ca_pem: Optional[str] = None
    """PEM text of the CA certificates to trust instead of the system's roots."""
    insecure_skip_verify: bool = False
    """Accept any certificate (still reported)."""
    server_name: Optional[str] = None
    """The name sent as SNI and verified, instead of the host connected to."""

    @classmethod
    def from_config(cls, ca_file: Optional[str] = None, ca_pem: Optional[str] = None,
                    insecure_skip_verify: bool = False, server_name: Optional[str] = None) -> "TlsOptions":
        """Options from the usual config keys. Both `ca_file` and `ca_pem`, or a
        CA with `insecure_skip_verify`, is invalid-config; a `ca_file` no
        `files` grant covers is denied."""
        if ca_file is not None and ca_pem is not None:
            raise ProbeError.invalid_config("give ca_file or ca_pem, not both")
        if ca_file is not None:
            from . import fs

            try:
                ca_pem = fs.read_to_string(ca_file)
            except fs.FsError as e:
                if e.kind == "denied":
                    raise ProbeError.denied(f"ca_file {ca_file!r}: {e} (grant it under files)")
                raise ProbeError.invalid_config(f"ca_file {ca_file!r}: {e}")
        if ca_pem is not None and insecure_skip_verify:
            raise ProbeError.invalid_config(
                "a CA and insecure_skip_verify exclude each other: a CA is not checked when verification is off")
        return cls(ca_pem, insecure_skip_verify, server_name)


@dataclass
class TlsInfo:
    """What a TLS handshake established."""

    version: str
    alpn: Optional[str]
    not_before: int
    not_after: int
    subject: str
    issuer: str

    def expires_in_seconds(self) -> float:
        """Seconds until the server certificate expires (negative once it has)."""
        return self.not_after - _host.unix_seconds()


@dataclass
class Handshake:
    """A completed handshake, and the seconds each phase took."""

    info: TlsInfo
    dns_seconds: float = 0.0
    connect_seconds: float = 0.0
    tls_seconds: float = 0.0


class Session:
    """A connection the host holds for the plugin (TLS, or plain TCP from
    `tcp.connect`). Use it as a context manager, or call `close()`: closing
    resets the connection. A call may hold at most 4 at once."""

    def __init__(self, raw: Any, read_timeout: float):
        self._raw = raw
        self.read_timeout = read_timeout

    def send(self, data: bytes) -> None:
        """Sends all of `data`; raises SessionError."""
        self._raw.send(bytes(data))

    def read(self, max_bytes: int = 65536) -> bytes:
        """Waits at most `read_timeout` seconds for data; returns what arrived
        (at most `max_bytes`, at most 64 KiB), b"" when the peer closed.
        Raises SessionError (kind "timed-out" at the timeout)."""
        return self._raw.receive(min(max_bytes, 65536), int(self.read_timeout * 1000))

    def read_until(self, max_bytes: int, done: Callable[[bytes], bool]) -> Tuple[bytes, Optional[SessionError]]:
        """Reads until `done(what arrived)`, the peer closes, `max_bytes` or an error."""
        return _read_until(self.read, max_bytes, done)

    def starttls(self, options: Optional[TlsOptions] = None, timeout: Optional[float] = None) -> Handshake:
        """Upgrades this plain session (from `tcp.connect`) to TLS in place,
        after the exchange that asked for it (SMTP's or IMAP's STARTTLS,
        PostgreSQL's SSLRequest): the host completes a handshake over the same
        connection within `timeout` seconds (the read timeout when None), with
        the same verification as `connect` (the name is the host the session
        was opened to unless `options.server_name`); what is sent and read
        afterwards goes over TLS. A session that is TLS already raises
        ProbeError (invalid config); a failed handshake, unread data the peer
        sent before the upgrade, or a closed peer raise NetError ("tls",
        "connect" or "timeout"); a failed handshake leaves the session closed."""
        wait = self.read_timeout if timeout is None else timeout
        return self._raw.starttls(options or TlsOptions(), max(1, int(wait * 1000)))

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None and hasattr(raw, "close"):
            raw.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


def handshake(host: str, port: int, options: Optional[TlsOptions] = None, timeout: float = 1.0) -> Handshake:
    """Connects to host:port, completes a TLS handshake within `timeout`
    seconds and closes. A failing server raises NetError (reason "dns",
    "connect", "timeout" or "tls"); a denial or bad options a ProbeError."""
    return _host.current().tls_handshake(host, port, options or TlsOptions(), int(timeout * 1000))


def connect(host: str, port: int, options: Optional[TlsOptions] = None, timeout: float = 1.0) -> Tuple[Session, Handshake]:
    """As `handshake`, but keeps the connection open as a Session."""
    raw, hs = _host.current().tls_connect(host, port, options or TlsOptions(), int(timeout * 1000))
    return Session(raw, timeout), hs


__all__ = ["TlsOptions", "TlsInfo", "Handshake", "Session", "SessionError", "NetError", "handshake", "connect"]
