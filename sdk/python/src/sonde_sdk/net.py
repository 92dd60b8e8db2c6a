"""Addresses and the errors of the host's network capabilities.

`NetError` is what `http.send`, `tls.handshake`, `tls.connect`,
`tcp.connect` and `grpc.call` raise when the *target* failed (the name did
not resolve, the connection was refused, the timeout passed, TLS or the
protocol broke). It is a ProbeError of kind "io", so a check that lets it
escape reports the run as `unknown`, as a Rust check returning
`Err(ProbeError::Io)` does; catch it to return `Outcome.failure` instead. A
denial or a malformed request is a plain ProbeError ("denied" /
"invalid-config")."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from ._errors import ProbeError

TIMED_OUT = "timed out"
NOT_GRANTED = "denied by the host: not granted"


class NetError(ProbeError):
    """The target failed. `failure` is one of "dns", "connect", "timeout",
    "protocol", "tls"; the message starts with it (`connect: refused`)."""

    def __init__(self, failure: str, message: str):
        super().__init__("io", f"{failure}: {message}")
        self.failure = failure
        self.detail = message

    def __repr__(self) -> str:
        return f"NetError({self.failure!r}, {self.detail!r})"


class SessionError(Exception):
    """Why a session could not send or read. `kind` is "timed-out",
    "denied", "invalid" or "other"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def describe(self) -> str:
        """A short reason: `timed out`, `denied by the host: not granted`, or the host's message."""
        if self.kind == "timed-out":
            return TIMED_OUT
        if self.kind == "denied":
            return NOT_GRANTED
        return self.message


def host_port(target: str) -> Tuple[str, int]:
    """Splits `host:port` (`[::1]:80` too); anything else is ProbeError("invalid-config")."""
    bad = ProbeError.invalid_config(f"target {target!r}: expected HOST:PORT")
    host, sep, port = target.rpartition(":")
    host = host.lstrip("[").rstrip("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise bad
    return host, int(port)


def read_until(read: Callable[[int], bytes], max_bytes: int,
               done: Callable[[bytes], bool]) -> Tuple[bytes, Optional[SessionError]]:
    """Calls `read(n)` until `done(what arrived)` is true, the peer closes
    (an empty read), `max_bytes` arrived or a read fails. Returns what was
    read and the error that ended it, if any."""
    buf = b""
    while len(buf) < max_bytes and not done(buf):
        try:
            chunk = read(min(1024, max_bytes - len(buf)))
        except SessionError as e:
            return buf, e
        if not chunk:
            break
        buf += chunk[: max_bytes - len(buf)]
    return buf, None
