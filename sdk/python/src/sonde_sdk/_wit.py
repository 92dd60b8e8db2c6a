"""The component side: the componentize-py bindings of sdk/wit/probe.wit
(world `plugin`), generated at build time and never committed.

Importable only inside a component (componentize-py provides
`componentize_py_runtime` there): `sonde_sdk` imports this module when it is
itself imported, at build time, so the snapshot holds it and a check
reads no file at run time."""

from __future__ import annotations

import time as _time
from typing import Any, List, Optional

import componentize_py_runtime  # noqa: F401  (raises ImportError outside a component)
from componentize_py_types import Err
from wit_world.imports import credentials as w_credentials
from wit_world.imports import exec as w_exec
from wit_world.imports import grpc as w_grpc
from wit_world.imports import http as w_http
from wit_world.imports import log as w_log
from wit_world.imports import tcp as w_tcp
from wit_world.imports import tls as w_tls
from wit_world.imports import types as w_types

from ._core import CapabilityKind, Outcome, PluginInfo, ProbeError, Request, Status
from .credentials import Login, _client_certificate_error, _login, _login_error
from .exec import ExecOutput
from .grpc import Code, GrpcRequest, GrpcResponse
from .http import HttpRequest, HttpResponse, Timings
from .net import NetError, SessionError
from .tcp import Connected
from .tls import Handshake, TlsInfo, TlsOptions

_LEVELS = {"trace": w_log.Level.TRACE, "debug": w_log.Level.DEBUG, "info": w_log.Level.INFO,
           "warn": w_log.Level.WARN, "error": w_log.Level.ERROR}


def _case(value: Any) -> str:
    """`HttpError_Connect` -> `connect`."""
    return type(value).__name__.rsplit("_", 1)[-1].lower()


def _net_error(e: Any) -> ProbeError:
    """A host error variant (tls/http/grpc) as the SDK raises it."""
    case, message = _case(e), e.value
    if case == "denied":
        return ProbeError.denied(message)
    if case == "invalid":
        return ProbeError.invalid_config(message)
    return NetError("tls" if case == "handshake" else case, message)


def _tls_options(o: TlsOptions) -> w_tls.Options:
    return w_tls.Options(ca_pem=o.ca_pem, insecure_skip_verify=o.insecure_skip_verify, server_name=o.server_name)


def _tls_info(i: Optional[Any]) -> Optional[TlsInfo]:
    if i is None:
        return None
    return TlsInfo(i.version, i.alpn, i.not_before, i.not_after, i.subject, i.issuer)


def _timings(t: Any) -> Timings:
    return Timings(t.dns, t.connect, t.tls, t.first_byte, t.total)


class _RawSession:
    def __init__(self, session: Any):
        self._session = session

    def _error(self, e: Any) -> SessionError:
        case = _case(e)
        kind = {"timeout": "timed-out", "denied": "denied", "invalid": "invalid"}.get(case, "other")
        return SessionError(kind, e.value)

    def send(self, data: bytes) -> None:
        try:
            self._session.send(data)
        except Err as e:
            raise self._error(e.value) from None

    def receive(self, max_bytes: int, timeout_ms: int) -> bytes:
        try:
            return bytes(self._session.receive(max_bytes, timeout_ms))
        except Err as e:
            raise self._error(e.value) from None

    def starttls(self, options: TlsOptions, timeout_ms: int) -> Handshake:
        try:
            r = self._session.starttls(_tls_options(options), timeout_ms)
        except Err as e:
            raise _net_error(e.value) from None
        return Handshake(_tls_info(r.info), r.timings.dns, r.timings.connect, r.timings.tls)

    def close(self) -> None:
        self._session.__exit__(None, None, None)


class WitBackend:
    """Every capability through the component's imports."""

    def log(self, level: str, message: str) -> None:
        w_log.log(_LEVELS[level], message)

    def monotonic(self) -> float:
        return _time.monotonic()

    def unix_seconds(self) -> float:
        return _time.time()

    def http_send(self, req: HttpRequest, keep: Optional[List[str]]) -> HttpResponse:
        wreq = w_http.Request(
            method=req.method, url=req.url, headers=[(str(n), str(v)) for n, v in req.headers],
            body=bytes(req.body), timeout_ms=max(1, int(req.timeout * 1000)), max_body=int(req.max_body),
            tls=_tls_options(req.tls), keepalive=bool(req.keepalive))
        try:
            r = w_http.send(wreq) if keep is None else w_http.send_keeping(wreq, keep)
        except Err as e:
            raise _net_error(e.value) from None
        return HttpResponse(r.status, list(r.headers), bytes(r.body), _timings(r.timings), _tls_info(r.tls), r.reused)

    def tls_handshake(self, host: str, port: int, options: TlsOptions, timeout_ms: int) -> Handshake:
        try:
            r = w_tls.handshake(host, port, _tls_options(options), timeout_ms)
        except Err as e:
            raise _net_error(e.value) from None
        return Handshake(_tls_info(r.info), r.timings.dns, r.timings.connect, r.timings.tls)

    def tls_connect(self, host: str, port: int, options: TlsOptions, timeout_ms: int):
        try:
            session, r = w_tls.connect(host, port, _tls_options(options), timeout_ms)
        except Err as e:
            raise _net_error(e.value) from None
        return _RawSession(session), Handshake(_tls_info(r.info), r.timings.dns, r.timings.connect, r.timings.tls)

    def tcp_connect(self, host: str, port: int, timeout_ms: int):
        try:
            session, t = w_tcp.connect(host, port, timeout_ms)
        except Err as e:
            raise _net_error(e.value) from None
        return _RawSession(session), Connected(t.dns, t.connect)

    def grpc_call(self, req: GrpcRequest) -> GrpcResponse:
        wreq = w_grpc.Request(
            authority=req.authority, path=req.method, message=bytes(req.message), metadata=list(req.metadata),
            timeout_ms=max(1, int(req.timeout * 1000)), tls=None if req.tls is None else _tls_options(req.tls))
        try:
            r = w_grpc.call(wreq)
        except Err as e:
            raise _net_error(e.value) from None
        return GrpcResponse(Code(r.code), r.status_message, None if r.message is None else bytes(r.message),
                            list(r.metadata), _timings(r.timings), _tls_info(r.tls))

    # A login borrows the session the plugin opened (`tcp.connect`).
    def postgres_login(self, raw: _RawSession, user: str, password: str, timeout_ms: int) -> Login:
        try:
            r = w_credentials.postgres_login(raw._session, user, password, timeout_ms)
        except Err as e:
            raise _login_error(_case(e.value), e.value.value) from None
        return _login(_case(r), r.value)

    def redis_login(self, raw: _RawSession, username: Optional[str], password: str, timeout_ms: int) -> Login:
        try:
            r = w_credentials.redis_login(raw._session, username, password, timeout_ms)
        except Err as e:
            raise _login_error(_case(e.value), e.value.value) from None
        return _login(_case(r), r.value)

    def client_certificate(self, host: str, port: int, cert: str, key: str) -> None:
        try:
            w_credentials.client_certificate(host, port, cert, key)
        except Err as e:
            raise _client_certificate_error(_case(e.value), e.value.value, host, port) from None

    def exec_run(self, argv: List[str], timeout_ms: int) -> ExecOutput:
        try:
            o = w_exec.run(w_exec.Command(argv=argv, timeout_ms=timeout_ms))
        except Err as e:
            case = _case(e.value)
            raise (ProbeError.denied(e.value.value) if case == "denied" else ProbeError.io(e.value.value)) from None
        return ExecOutput(o.exit_code, o.timed_out, bytes(o.stdout), bytes(o.stderr))


_STATUS = {Status.SUCCESS: w_types.Status.SUCCESS, Status.WARNING: w_types.Status.WARNING,
           Status.FAILURE: w_types.Status.FAILURE, Status.UNKNOWN: w_types.Status.UNKNOWN}
_ERRORS = {"invalid-config": w_types.ProbeError_InvalidConfig, "denied": w_types.ProbeError_Denied,
           "io": w_types.ProbeError_Io, "internal": w_types.ProbeError_Internal}
_KINDS = {CapabilityKind.NET: w_types.CapabilityKind.NET, CapabilityKind.EXEC: w_types.CapabilityKind.EXEC,
          CapabilityKind.FILES: w_types.CapabilityKind.FILES}


def plugin_info(info: PluginInfo) -> w_types.PluginInfo:
    return w_types.PluginInfo(
        name=info.name, version=info.version, vendor=info.vendor, description=info.description,
        config_schema=info.config_schema,
        capabilities=[w_types.Capability(kind=_KINDS[c.kind], value=c.value, why=c.why) for c in info.capabilities])


def request(wreq: w_types.Request) -> Request:
    return Request(wreq.target, wreq.config, wreq.timeout_ms / 1000, probe=wreq.probe, attempt=wreq.attempt)


def outcome(o: Outcome) -> w_types.Outcome:
    return w_types.Outcome(
        status=_STATUS[o.status], message=o.message,
        metrics=[w_types.Metric(name=m.name, value=float(m.value), unit=m.unit) for m in o.metrics],
        detail=o.detail)


def error(e: ProbeError) -> Err:
    return Err(_ERRORS[e.kind](e.message))
