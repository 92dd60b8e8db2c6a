"""ProbeError, which every other module may raise: a leaf, importing no
other module of the SDK."""

from __future__ import annotations


class ProbeError(Exception):
    """Why a check could not produce an Outcome (`types.probe-error`).

    Raise it when the *check* could not be made; return `Outcome.failure`
    when the *target* is unhealthy. Errors never flip a probe's state: the
    host retries and finally records `unknown` with the kind as the reason.
    Kinds: "invalid-config", "denied", "io", "internal".
    """

    KINDS = ("invalid-config", "denied", "io", "internal")

    def __init__(self, kind: str, message: str):
        if kind not in self.KINDS:
            raise ValueError(f"probe error kind {kind!r}: one of {', '.join(self.KINDS)}")
        super().__init__(message)
        self.kind = kind
        self.message = message

    @classmethod
    def invalid_config(cls, message: str) -> "ProbeError":
        """The plugin config does not fit the plugin."""
        return ProbeError("invalid-config", message)

    @classmethod
    def denied(cls, message: str) -> "ProbeError":
        """A capability the plugin needs was refused."""
        return ProbeError("denied", message)

    @classmethod
    def io(cls, message: str) -> "ProbeError":
        """An I/O error that says nothing about the target's health."""
        return ProbeError("io", message)

    @classmethod
    def internal(cls, message: str) -> "ProbeError":
        """A bug in the plugin."""
        return ProbeError("internal", message)

    def __str__(self) -> str:
        label = {"invalid-config": "invalid config", "io": "i/o error", "internal": "internal error"}.get(self.kind, self.kind)
        return f"{label}: {self.message}"

    def __repr__(self) -> str:
        return f"ProbeError({self.kind!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProbeError) and (self.kind, self.message) == (other.kind, other.message)

    __hash__ = Exception.__hash__
