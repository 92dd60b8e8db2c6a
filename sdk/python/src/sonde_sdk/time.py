"""Clocks: a monotonic clock for measuring phases and the wall clock, the
host's WASI clocks in the sandbox (a fake host may set them in tests)."""

from __future__ import annotations

from . import _host


def monotonic() -> float:
    """Seconds on the monotonic clock (only differences mean anything)."""
    return _host.monotonic()


def unix_seconds() -> float:
    """Seconds since the Unix epoch, by the wall clock."""
    return _host.unix_seconds()


class Instant:
    """A point on the monotonic clock: `start = Instant.now(); ...; start.elapsed()`."""

    __slots__ = ("_at",)

    def __init__(self, at: float):
        self._at = at

    @classmethod
    def now(cls) -> "Instant":
        return cls(monotonic())

    def elapsed(self) -> float:
        """Seconds since this instant (never below 0)."""
        return max(0.0, monotonic() - self._at)
