"""gRPC through the host (`sonde:probe/grpc`): one unary call.

The plugin serializes the request message and decodes the response; the
host owns the HTTP/2 connection (new per call, closed with a reset), the
framing and the status. A status other than OK is an answer, not an error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from . import _host
from .http import Timings
from .net import NetError
from .tls import TlsInfo, TlsOptions

_NAMES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
          "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
          "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]


class Code(int):
    """A gRPC status code; `Code(12).name == "UNIMPLEMENTED"`."""

    OK: "Code"
    NOT_FOUND: "Code"
    UNIMPLEMENTED: "Code"
    UNAVAILABLE: "Code"

    @property
    def name(self) -> str:
        return _NAMES[self] if 0 <= self < len(_NAMES) else f"CODE_{int(self)}"

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Code({int(self)})"


Code.OK, Code.NOT_FOUND, Code.UNIMPLEMENTED, Code.UNAVAILABLE = Code(0), Code(5), Code(12), Code(14)


@dataclass
class GrpcRequest:
    """A unary call: `method` is the full path `/package.Service/Method`;
    `tls` None for plaintext h2c; `timeout` in seconds."""

    authority: str
    method: str
    message: bytes = b""
    metadata: List[Tuple[str, str]] = field(default_factory=list)
    timeout: float = 1.0
    tls: Optional[TlsOptions] = None


@dataclass
class GrpcResponse:
    code: Code
    status_message: str = ""
    message: Optional[bytes] = None
    metadata: List[Tuple[str, str]] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    tls: Optional[TlsInfo] = None


def call(req: GrpcRequest) -> GrpcResponse:
    """Makes the call and waits for its status. What kept it from getting
    one raises: NetError (target), ProbeError "denied" / "invalid-config"."""
    return _host.current().grpc_call(req)


__all__ = ["Code", "GrpcRequest", "GrpcResponse", "NetError", "call"]
