"""Plain TCP connections the host makes for the plugin (`sonde:probe/tcp`):
the host dials (only the probe's target and its `net` grants), measures,
and closes with a reset when the Session is closed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from . import _host
from .tls import Session


@dataclass
class Connected:
    """Seconds each phase of a connection took."""

    dns_seconds: float = 0.0
    connect_seconds: float = 0.0


def connect(host: str, port: int, timeout: float = 1.0) -> Tuple[Session, Connected]:
    """Connects to host:port within `timeout` seconds and keeps the
    connection open. Refused, unreachable or slow: NetError; not granted:
    ProbeError("denied")."""
    raw, connected = _host.current().tcp_connect(host, port, int(timeout * 1000))
    return Session(raw, timeout), connected
