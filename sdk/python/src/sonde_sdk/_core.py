"""The types every check uses: Status, Metric, Outcome, ProbeError (from
`_errors`), Request, PluginInfo, Capability."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Type, TypeVar, Union

from . import _host
from ._errors import ProbeError

T = TypeVar("T")


class Status(enum.Enum):
    """The verdict of one check (`types.status` in probe.wit)."""

    SUCCESS = "success"
    """The target is healthy."""
    WARNING = "warning"
    """The target works but something deserves attention; counts as success for readiness."""
    FAILURE = "failure"
    """The target is unhealthy."""
    UNKNOWN = "unknown"
    """The check could not tell."""


@dataclass
class Metric:
    """One measurement: a Prometheus-style name, a value, a unit ("seconds", "bytes" or "")."""

    name: str
    value: float
    unit: str = ""


MetricLike = Union[Metric, Tuple[str, float], Tuple[str, float, str]]


def _metric(m: MetricLike) -> Metric:
    if isinstance(m, Metric):
        return m
    if isinstance(m, tuple) and len(m) in (2, 3):
        return Metric(str(m[0]), float(m[1]), str(m[2]) if len(m) == 3 else "")
    raise TypeError(f"a metric is a Metric or a (name, value[, unit]) tuple, not {m!r}")


@dataclass
class Outcome:
    """What a check found: a status, a one-line message, metrics and an optional detail.

    Build it with `Outcome.success("...")`, `Outcome.warning(...)`,
    `Outcome.failure(...)` or `Outcome.unknown(...)`; each takes
    `metrics=[Metric(...) or ("name", value, "unit"), ...]` and `detail=`.
    """

    status: Status
    message: str
    metrics: List[Metric] = field(default_factory=list)
    detail: Optional[str] = None

    @classmethod
    def new(cls, status: Status, message: str, metrics: Sequence[MetricLike] = (), detail: Optional[str] = None) -> "Outcome":
        return cls(status, str(message), [_metric(m) for m in metrics], detail)

    @classmethod
    def success(cls, message: str, metrics: Sequence[MetricLike] = (), detail: Optional[str] = None) -> "Outcome":
        """The target is healthy."""
        return cls.new(Status.SUCCESS, message, metrics, detail)

    @classmethod
    def warning(cls, message: str, metrics: Sequence[MetricLike] = (), detail: Optional[str] = None) -> "Outcome":
        """The target works but deserves attention."""
        return cls.new(Status.WARNING, message, metrics, detail)

    @classmethod
    def failure(cls, message: str, metrics: Sequence[MetricLike] = (), detail: Optional[str] = None) -> "Outcome":
        """The target is unhealthy."""
        return cls.new(Status.FAILURE, message, metrics, detail)

    @classmethod
    def unknown(cls, message: str, metrics: Sequence[MetricLike] = (), detail: Optional[str] = None) -> "Outcome":
        """The check could not tell."""
        return cls.new(Status.UNKNOWN, message, metrics, detail)

    def with_metric(self, name: str, value: float, unit: str = "") -> "Outcome":
        """Adds a metric; returns self."""
        self.metrics.append(Metric(name, float(value), unit))
        return self

    def with_detail(self, detail: str) -> "Outcome":
        """Sets the detail excerpt; returns self."""
        self.detail = detail
        return self

    def metric(self, name: str) -> Optional[float]:
        """The value of metric `name`, if reported."""
        return next((m.value for m in self.metrics if m.name == name), None)


class Request:
    """One call of `check`: the target, the plugin config and the time left."""

    def __init__(self, target: str, config: Union[str, dict, None] = "{}", timeout: float = 1.0,
                 probe: str = "test", attempt: int = 1):
        """Builds a request by hand (for unit tests); `timeout` in seconds,
        `config` as JSON text or a dict."""
        self.probe = probe
        self.target = target
        self.config_json = config if isinstance(config, str) else json.dumps(config or {})
        self.timeout = float(timeout)
        self.attempt = attempt
        self._started = _host.monotonic()

    def config(self, cls: Optional[Type[T]] = None, *, allow_unknown: bool = False) -> Any:
        """The plugin config. With a dataclass `cls` (by default the Probe's
        `Config`), an instance of it, typed and checked
        (`sonde_sdk.config.load`); without one, the parsed JSON object. A mismatch raises ProbeError("invalid-config") naming the field."""
        from . import config as _config

        cls = cls or getattr(self, "_config_cls", None)
        if cls is None:
            return _config.parse_object(self.config_json)
        return _config.load(cls, self.config_json, allow_unknown=allow_unknown)

    @property
    def timeout_ms(self) -> int:
        return int(self.timeout * 1000)

    def remaining(self) -> float:
        """Seconds left before the host stops this call (never below 0)."""
        return max(0.0, self.timeout - (_host.monotonic() - self._started))

    def __repr__(self) -> str:
        return f"Request(target={self.target!r}, config={self.config_json!r}, timeout={self.timeout})"


class CapabilityKind(enum.Enum):
    """The kinds of capability a plugin may ask the operator to grant."""

    NET = "net"
    """Connections beyond the target: host:port patterns."""
    EXEC = "exec"
    """Programs the host may run for the plugin."""
    FILES = "files"
    """Read-only paths."""


@dataclass
class Capability:
    """A capability a plugin needs, and why."""

    kind: CapabilityKind
    value: str
    why: str


@dataclass
class PluginInfo:
    """Who a plugin is and what it needs (`describe`)."""

    name: str = ""
    version: str = ""
    vendor: str = ""
    description: str = ""
    config_schema: Optional[str] = None
    capabilities: List[Capability] = field(default_factory=list)
