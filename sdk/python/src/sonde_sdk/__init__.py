"""Write sonde probe plugins in Python.

A plugin is a Python module built into a WebAssembly component with
componentize-py against sonde's WIT contract (sdk/wit/probe.wit, world
`plugin`); the SDK owns the generated bindings, so a plugin writes no WIT
glue:

    from dataclasses import dataclass
    import sonde_sdk as sonde

    @dataclass
    class Config:
        path: str = "/"

    class Up(sonde.Probe):
        Config = Config

        def check(self, req):
            config = req.config()
            return sonde.Outcome.success("up")

    WitWorld = sonde.export(Up)

The same surface as the Rust SDK: Outcome / Status / Metric / ProbeError /
Request / PluginInfo, typed config (`config`), `duration`, and the host's
capabilities in `http`, `tcp`, `tls`, `grpc`, `log`, `exec`, `fs`, `time`,
and `credentials` (logins and client certificates from secret handles,
which the plugin passes and never reads).
`sonde_sdk.testing` runs a check in plain CPython against a fake host (a
unit-test double), and builds the component and runs it with the real
`sonde` binary.
"""

from . import _host
from ._core import Capability, CapabilityKind, Metric, Outcome, PluginInfo, ProbeError, Request, Status
from .duration import Duration
from .net import NetError, SessionError
from .probe import Probe, export, probe
from . import config, credentials, duration, exec, fs, grpc, http, log, net, tcp, time, tls  # noqa: E402

# Inside a component the generated bindings are the host: imported now, at
# build time, so componentize-py's snapshot holds them. An error here is a
# build problem and must not pass for "no host".
try:
    import componentize_py_runtime  # noqa: F401  (only inside a component)
except ImportError:
    pass
else:
    from . import _wit

    _host.install(_wit.WitBackend())

__version__ = "0.1.0"

__all__ = [
    "Capability", "CapabilityKind", "Duration", "Metric", "NetError", "Outcome", "PluginInfo", "Probe",
    "ProbeError", "Request", "SessionError", "Status", "config", "credentials", "duration", "exec", "export", "fs", "grpc",
    "http", "log", "net", "probe", "tcp", "time", "tls",
]
