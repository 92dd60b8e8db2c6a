"""The host behind the helpers: the component's imports (probe.wit) inside
a component (installed by the package when it is imported there, so that
this module imports none of the helpers it serves), a fake host under
`sonde_sdk.testing`, nothing otherwise.

Every helper module (`http`, `tls`, `tcp`, `grpc`, `log`, `exec`) calls the
current backend with the SDK's own types, so a check's code is the same in
the sandbox and in a unit test."""

from __future__ import annotations

import time as _time
from typing import Any, Optional

_backend: Optional[Any] = None


class _NoHost:
    """Outside a component and outside `sonde_sdk.testing`: every capability
    call is a ProbeError("internal") saying so."""

    def __getattr__(self, name: str) -> Any:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            from ._errors import ProbeError

            raise ProbeError.internal(
                f"no sonde host for {name}: build the check into a component, "
                "or run it under sonde_sdk.testing with a FakeHost"
            )

        return refuse

    def log(self, level: str, message: str) -> None:
        pass

    def monotonic(self) -> float:
        return _time.monotonic()

    def unix_seconds(self) -> float:
        return _time.time()


def current() -> Any:
    """The backend in use."""
    global _backend
    if _backend is None:
        _backend = _NoHost()
    return _backend


def install(backend: Any) -> Any:
    """Makes `backend` the host (None: back to the default); returns the previous one."""
    global _backend
    previous = _backend
    _backend = backend
    return previous


def monotonic() -> float:
    return current().monotonic()


def unix_seconds() -> float:
    return current().unix_seconds()
