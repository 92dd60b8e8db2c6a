"""HTTP through the host's probe transport (`sonde:probe/http`).

The host owns the connection: a new one per request, closed with a reset,
each phase timed; or, with `keepalive`, one from the host's pool.
`https://` uses the host's TLS client. Only the probe's target and its
`net` grants are reachable; anything else raises ProbeError("denied").
Redirects are returned, not followed."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from . import _host
from ._errors import ProbeError
from .net import NetError
from .tls import TlsInfo, TlsOptions

MAX_KEPT_HEADERS = 64


@dataclass
class HttpRequest:
    """A request for `send`. `timeout` is in seconds."""

    url: str
    method: str = "GET"
    headers: List[Tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    timeout: float = 1.0
    max_body: int = 10 * 1024
    tls: TlsOptions = field(default_factory=TlsOptions)
    keepalive: bool = False

    @classmethod
    def get(cls, url: str, timeout: float) -> "HttpRequest":
        """A GET of `url` with no headers and a 10 KiB body cap."""
        return cls(url=url, timeout=timeout)


@dataclass
class Timings:
    """Seconds spent in each phase (0 for phases a reused connection skipped)."""

    dns: float = 0.0
    connect: float = 0.0
    tls: float = 0.0
    first_byte: float = 0.0
    total: float = 0.0


@dataclass
class HttpResponse:
    """What came back."""

    status: int
    headers: List[Tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    timings: Timings = field(default_factory=Timings)
    tls: Optional[TlsInfo] = None
    reused: bool = False

    def header(self, name: str) -> Optional[str]:
        """The first value of header `name` (case-insensitive)."""
        name = name.lower()
        return next((v for n, v in self.headers if n.lower() == name), None)

    def text(self) -> str:
        """The body as UTF-8 text (invalid bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON; ValueError when it is not."""
        return _json.loads(self.body)


def send(req: HttpRequest) -> HttpResponse:
    """Sends `req` and reads the response within `req.timeout`. A failing
    target raises NetError ("dns", "connect", "timeout", "protocol", "tls");
    not granted: ProbeError("denied"); malformed: ProbeError("invalid-config")."""
    return _host.current().http_send(req, None)


def send_keeping(req: HttpRequest, keep: Sequence[str]) -> HttpResponse:
    """As `send`, but the response carries only the headers named in `keep`
    (at most 64): cheaper when a check reads one or two."""
    keep = list(keep)
    if len(keep) > MAX_KEPT_HEADERS:
        raise ProbeError.invalid_config(f"at most {MAX_KEPT_HEADERS} header names to keep, not {len(keep)}")
    return _host.current().http_send(req, keep)


def get(url: str, timeout: float = 1.0, **fields: Any) -> HttpResponse:
    """`send(HttpRequest(url, timeout=timeout, **fields))`."""
    return send(HttpRequest(url=url, timeout=timeout, **fields))


__all__ = ["HttpRequest", "HttpResponse", "Timings", "NetError", "send", "send_keeping", "get", "MAX_KEPT_HEADERS"]
