"""Testing a check two ways.

1. **Unit tests in plain CPython** (`run` with a `FakeHost`): the check's
   own code runs in this interpreter, and every host capability it calls
   (`http.send`, `tcp.connect`, `tls.*`, `grpc.call`, `exec.run`, `log.*`,
   `credentials.*`, the clocks) is answered by the fake host you program. **This is a
   unit-test double, not sonde**: no sandbox, no WIT boundary, no deadline,
   fuel or memory cap, no real network; the fake's grant check only mimics
   the host's (target and `allow_net` host:port pairs). It tests your
   logic: config handling, verdicts, messages, metrics.

       host = FakeHost(http={"http://127.0.0.1:8080/health": respond(200, {"status": "ok"}, seconds=0.05)})
       outcome = run(HttpJson, "127.0.0.1:8080", {"field": "status", "equals": "ok"}, host=host)
       assert outcome.status is Status.SUCCESS

2. **The real thing** (`Plugin`): builds the component with componentize-py
   and runs it with the `sonde` binary (`sonde check FILE.wasm --output
   json`), in its sandbox, against a real target. Slower (a build takes
   tens of seconds, the first run compiles the component), and what CI runs.

       plugin = Plugin.build("examples/http-json/python")
       result = plugin.check("127.0.0.1:8080").config({"field": "status", "equals": "ok"}).run()
       assert result.status == "success", result
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time as _time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

from . import _host
from ._core import Outcome, ProbeError, Request
from .credentials import Accepted, Login, LoginError, Refused
from .exec import ExecOutput
from .grpc import GrpcRequest, GrpcResponse
from .http import HttpRequest, HttpResponse, Timings
from .net import NetError, SessionError
from .probe import Probe, run as _run
from .tcp import Connected
from .tls import Handshake, TlsInfo, TlsOptions


def respond(status: int = 200, body: Union[bytes, str, dict, list, None] = b"",
            headers: Sequence[Tuple[str, str]] = (), seconds: float = 0.001,
            tls: Optional[TlsInfo] = None) -> HttpResponse:
    """A fake response; a dict or list body is sent as JSON, `seconds` is the
    exchange's total time (the other phases are split from it)."""
    hdrs = list(headers)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        if not any(n.lower() == "content-type" for n, _ in hdrs):
            hdrs.append(("content-type", "application/json"))
    elif isinstance(body, str):
        body = body.encode()
    elif body is None:
        body = b""
    t = Timings(dns=0.0, connect=seconds / 4, tls=0.0, first_byte=seconds * 3 / 4, total=seconds)
    return HttpResponse(status, [(n.lower(), v) for n, v in hdrs], body, t, tls)


def tls_info(days_left: float = 90, subject: str = "CN=example", issuer: str = "CN=Test CA",
             version: str = "TLSv1.3") -> TlsInfo:
    """A fake certificate that expires in `days_left` days."""
    now = int(_time.time())
    return TlsInfo(version, None, now - 86400, now + int(days_left * 86400), subject, issuer)


class FakeSession:
    """A scripted connection: `receive` returns `replies` one by one, then b""
    (the peer closed), or times out when `hang` is set. What the check sent
    is in `sent`."""

    def __init__(self, replies: Sequence[bytes] = (), hang: bool = False,
                 tls: Union[TlsInfo, Exception, None] = None):
        self.replies = [bytes(r) for r in replies]
        self.hang = hang
        self.tls = tls
        """What `starttls` gives: the certificate (a `tls_info()` when None),
        or the error it raises."""
        self.upgraded: Optional[TlsOptions] = None
        """The options of the `starttls` the check made, if it made one."""
        self.sent: List[bytes] = []
        self.closed = False
        self.peer: Optional[Tuple[str, int]] = None
        """(host, port) it was connected to (set by the FakeHost)."""

    def send(self, data: bytes) -> None:
        if self.closed:
            raise SessionError("other", "connection closed")
        self.sent.append(bytes(data))

    def receive(self, max_bytes: int, timeout_ms: int) -> bytes:
        if self.replies:
            head = self.replies[0]
            chunk, rest = head[:max_bytes], head[max_bytes:]
            if rest:
                self.replies[0] = rest
            else:
                self.replies.pop(0)
            return chunk
        if self.hang:
            raise SessionError("timed-out", f"no data within {timeout_ms}ms")
        return b""

    def starttls(self, options: TlsOptions, timeout_ms: int) -> Handshake:
        if self.upgraded is not None:
            raise ProbeError.invalid_config("starttls: the session is TLS already")
        if isinstance(self.tls, Exception):
            self.closed = True
            raise self.tls
        self.upgraded = options
        return Handshake(self.tls or tls_info(), tls_seconds=0.001)

    def close(self) -> None:
        self.closed = True


Handler = Union[Callable[..., Any], Mapping[str, Any], None]


@dataclass
class LoginAttempt:
    """A `credentials.postgres_login` or `redis_login` the check made, as the
    fake host's `logins` handler gets it and `FakeHost.login_attempts` keeps it."""

    kind: str
    """"postgres" or "redis"."""
    host: str
    port: int
    user: Optional[str]
    """The PostgreSQL user, the Redis username (None: plain `AUTH password`)."""
    password: str
    """The password as the check passed it: a handle such as `$(secret:pw)`
    (which the real host expands; the fake only checks it is granted)."""
    session: Any
    """The FakeSession it was made on (its `sent` holds a PostgreSQL StartupMessage)."""
    timeout: float
    """The seconds the check gave it."""


_SECRET, _BASE64 = "$(secret:", "$(base64:"
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def _valid_secret_name(name: str) -> bool:
    return 1 <= len(name) <= 63 and name[0].isalnum() and set(name) <= _NAME_CHARS


def secret_names(text: str) -> List[str]:
    """The names of the secrets `text`'s handles use, as the host parses
    them: `$(secret:NAME)`, and `$(base64:...)` around text and such
    handles. A malformed handle is ProbeError("invalid-config"), as the
    host refuses it (a typo is never sent as text)."""
    names: List[str] = []
    inside = False
    while True:
        starts = [i for i in (text.find(_SECRET), text.find(_BASE64)) if i >= 0]
        handle = min(starts) if starts else -1
        close = text.find(")") if inside else -1
        if close >= 0 and (handle < 0 or close < handle):
            text, inside = text[close + 1:], False
            continue
        if handle < 0:
            if inside:
                raise ProbeError.invalid_config(f"{text[:40]!r} has no closing `)`")
            return names
        rest = text[handle:]
        if rest.startswith(_SECRET):
            end = rest.find(")", len(_SECRET))
            if end < 0:
                raise ProbeError.invalid_config(f"{rest[:40]!r} has no closing `)`")
            name = rest[len(_SECRET):end]
            if not _valid_secret_name(name):
                raise ProbeError.invalid_config(
                    f"secret handle {rest[:end + 1]!r}: {name!r} is not a secret name (1 to 63 of a-z, 0-9, `-`, `_`, `.`)")
            names.append(name)
            text = rest[end + 1:]
        else:
            if inside:
                raise ProbeError.invalid_config("`$(base64:` cannot enclose another `$(base64:`")
            text, inside = rest[len(_BASE64):], True


def _answer(handler: Handler, keys: Sequence[str], *args: Any) -> Any:
    if handler is None:
        raise NetError("connect", "connection refused (no fake answer for " + keys[0] + ")")
    if callable(handler):
        value = handler(*args)
    else:
        value = next((handler[k] for k in keys if k in handler), None)
        if value is None:
            raise NetError("connect", "connection refused (no fake answer for " + keys[0] + ")")
    if isinstance(value, BaseException):
        raise value
    return value


def _peer(session: Any, host: str, port: int) -> Any:
    """Marks whom a fake session is connected to (a login goes toward it)."""
    try:
        session.peer = (host, port)
    except AttributeError:
        pass
    return session


def _authority(address: str) -> Tuple[str, int]:
    if "://" in address:
        u = urllib.parse.urlsplit(address)
        return (u.hostname or "", u.port or (443 if u.scheme == "https" else 80))
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else 0


class FakeHost:
    """A fake sonde host for unit tests (a test double, not sonde).

    Each capability takes a handler: a callable given what the check asked
    for, or a dict. Either returns the answer, or an exception to raise
    (`NetError("connect", "connection refused")`, `ProbeError.denied(...)`).
    A capability with no handler answers like a closed port.

    - http: `fn(HttpRequest)` or {"URL" or "METHOD URL": HttpResponse}
    - tcp: `fn(host, port)` or {"host:port": FakeSession}
    - tls: `fn(host, port, TlsOptions)` or {"host:port": TlsInfo or (FakeSession, TlsInfo)}
    - grpc: `fn(GrpcRequest)` or {"/pkg.Service/Method": GrpcResponse}
    - exec: `fn(argv)` or {"/abs/program": ExecOutput}
    - logins (`credentials.postgres_login`, `redis_login`): `fn(LoginAttempt)`
      or {"redis host:port" / "postgres host:port" / "host:port": Login},
      a Login being `Accepted("auth")` or `Refused("WRONGPASS ...")`, or a
      `LoginError("timeout", ...)` to raise

    `allow_net` lists the host:port pairs granted besides the target;
    anything else is refused as the host refuses it (ProbeError "denied").
    `secrets` lists the secret names granted (as `sonde check --secret
    NAME=FILE` does): a handle naming another is denied, a malformed one
    invalid-config, as the host answers. `now` (Unix seconds) fixes the
    wall clock. Records: `logs` (level, message), `http_requests`,
    `grpc_requests`, `exec_calls`, `login_attempts` (LoginAttempt),
    `client_certs` ({"host:port": (cert, key)} as registered: handles or
    PEM text, as the check passed them).
    """

    def __init__(self, http: Handler = None, tcp: Handler = None, tls: Handler = None, grpc: Handler = None,
                 exec: Handler = None, logins: Handler = None, allow_net: Sequence[str] = (),
                 secrets: Sequence[str] = (), now: Optional[float] = None):
        self.http, self.tcp, self.tls, self.grpc, self.exec = http, tcp, tls, grpc, exec
        self.logins = logins
        self.allow_net = list(allow_net)
        self.secrets = list(secrets)
        self.now = now
        self.target: Optional[str] = None
        self.logs: List[Tuple[str, str]] = []
        self.http_requests: List[HttpRequest] = []
        self.grpc_requests: List[GrpcRequest] = []
        self.exec_calls: List[List[str]] = []
        self.login_attempts: List[LoginAttempt] = []
        self.client_certs: Dict[str, Tuple[str, str]] = {}

    # The grant check, as the host makes it: the target and allow_net only.
    def _granted(self, host: str, port: int) -> None:
        if self.target is None:
            return
        allowed = [_authority(self.target)] + [_authority(a) for a in self.allow_net]
        if (host, port) not in allowed:
            raise ProbeError.denied(f"{host}:{port}: not the target and not granted")

    # The secret check, as the host makes it before it expands a handle.
    def _secrets_toward(self, text: str, host: str, port: int) -> None:
        for name in secret_names(text):
            if name not in self.secrets:
                raise ProbeError.denied(
                    f'secret "{name}" is not in the probe\'s grants.secrets ({", ".join(self.secrets)})' if self.secrets
                    else f'secret "{name}" is not granted: the probe\'s grants.secrets is empty')
            self._granted(host, port)

    def log(self, level: str, message: str) -> None:
        self.logs.append((level, message))

    def monotonic(self) -> float:
        return _time.monotonic()

    def unix_seconds(self) -> float:
        return self.now if self.now is not None else _time.time()

    def http_send(self, req: HttpRequest, keep: Optional[List[str]]) -> HttpResponse:
        if not req.url.startswith(("http://", "https://")):
            raise ProbeError.invalid_config(f"url {req.url!r}: not an absolute http:// or https:// URL")
        self._granted(*_authority(req.url))
        self.http_requests.append(req)
        r = _answer(self.http, [f"{req.method} {req.url}", req.url], req)
        if keep is not None:
            wanted = {k.lower() for k in keep}
            r = HttpResponse(r.status, [(n, v) for n, v in r.headers if n.lower() in wanted], r.body, r.timings, r.tls, r.reused)
        if len(r.body) > req.max_body:
            r = HttpResponse(r.status, r.headers, r.body[: req.max_body], r.timings, r.tls, r.reused)
        return r

    def _tls(self, host: str, port: int, options: TlsOptions) -> Tuple[Optional[FakeSession], TlsInfo]:
        self._granted(host, port)
        answer = _answer(self.tls, [f"{host}:{port}"], host, port, options)
        if isinstance(answer, tuple):
            return answer
        return None, answer

    def tls_handshake(self, host: str, port: int, options: TlsOptions, timeout_ms: int) -> Handshake:
        _, info = self._tls(host, port, options)
        return Handshake(info, 0.0, 0.001, 0.002)

    def tls_connect(self, host: str, port: int, options: TlsOptions, timeout_ms: int):
        session, info = self._tls(host, port, options)
        session = _peer(session or FakeSession(), host, port)
        return session, Handshake(info, 0.0, 0.001, 0.002)

    def tcp_connect(self, host: str, port: int, timeout_ms: int):
        self._granted(host, port)
        session = _answer(self.tcp, [f"{host}:{port}"], host, port)
        _peer(session, host, port)
        return session, Connected(0.0, 0.001)

    def _login(self, kind: str, session: Any, user: Optional[str], password: str, timeout_ms: int) -> Login:
        peer = getattr(session, "peer", None) or (_authority(self.target) if self.target else ("", 0))
        host, port = peer
        self._secrets_toward(password, host, port)
        attempt = LoginAttempt(kind, host, port, user, password, session, timeout_ms / 1000)
        self.login_attempts.append(attempt)
        if self.logins is None:
            raise LoginError("connect", f"the server closed the connection during the login (no fake answer for {host}:{port})")
        if callable(self.logins):
            answer = self.logins(attempt)
        else:
            answer = next((self.logins[k] for k in (f"{kind} {host}:{port}", f"{host}:{port}") if k in self.logins), None)
            if answer is None:
                raise LoginError("connect", f"the server closed the connection during the login (no fake answer for {host}:{port})")
        if isinstance(answer, BaseException):
            raise answer
        if not isinstance(answer, Login):
            raise TypeError(f"a fake login answers Accepted(...), Refused(...) or an exception, not {answer!r}")
        return answer

    def postgres_login(self, session: Any, user: str, password: str, timeout_ms: int) -> Login:
        return self._login("postgres", session, user, password, timeout_ms)

    def redis_login(self, session: Any, username: Optional[str], password: str, timeout_ms: int) -> Login:
        return self._login("redis", session, username, password, timeout_ms)

    def client_certificate(self, host: str, port: int, cert: str, key: str) -> None:
        if not host:
            raise ProbeError.invalid_config("no host")
        self._granted(host, port)
        self._secrets_toward(cert, host, port)
        self._secrets_toward(key, host, port)
        for what, text in (("certificate", cert), ("private key", key)):
            if not secret_names(text) and "-----BEGIN" not in text:
                raise ProbeError.invalid_config(f"client certificate for {host}:{port}: the {what} is neither PEM nor a handle")
        peer = f"{host}:{port}"
        if peer not in self.client_certs and len(self.client_certs) >= 4:
            raise ProbeError.invalid_config("at most 4 client certificates per call")
        self.client_certs[peer] = (cert, key)

    def grpc_call(self, req: GrpcRequest) -> GrpcResponse:
        self._granted(*_authority(req.authority))
        self.grpc_requests.append(req)
        return _answer(self.grpc, [req.method], req)

    def exec_run(self, argv: List[str], timeout_ms: int) -> ExecOutput:
        self.exec_calls.append(list(argv))
        if self.exec is None:
            raise ProbeError.denied(f"{argv[0] if argv else '?'}: not granted")
        return _answer(self.exec, [argv[0]], argv)


def run(probe: Union[Type[Probe], Probe], target: str = "", config: Union[str, dict, None] = None,
        host: Optional[FakeHost] = None, timeout: float = 1.0, attempt: int = 1) -> Outcome:
    """Runs `probe`'s check once in this interpreter against `host` (a
    FakeHost; a fresh one when None) and returns its Outcome. A ProbeError
    is raised as the check raised it; a bug (any other exception) as
    ProbeError("internal"), as the component reports it."""
    host = host or FakeHost()
    host.target = target or None
    previous = _host.install(host)
    try:
        return _run(probe, Request(target, config if config is not None else "{}", timeout, attempt=attempt))
    finally:
        _host.install(previous)


# --- the real thing: componentize-py + the sonde binary -------------------


@dataclass
class CheckResult:
    """One `sonde check --output json`, as it printed it."""

    status: str
    reason: Optional[str]
    message: str
    metrics: List[Tuple[str, float, str]] = field(default_factory=list)
    detail: Optional[str] = None
    exit_code: int = -1
    seconds: float = 0.0
    """Wall time of the `sonde check` process (compile included on first use)."""
    stderr: str = ""

    def metric(self, name: str) -> Optional[float]:
        return next((v for n, v, _ in self.metrics if n == name), None)


def sonde_bin() -> str:
    """`$SONDE_BIN`, else `sonde` on PATH."""
    return os.environ.get("SONDE_BIN") or shutil.which("sonde") or "sonde"


class Plugin:
    """A component and the `sonde` binary that runs it."""

    def __init__(self, wasm: Union[str, Path], build_seconds: float = 0.0):
        self.wasm = Path(wasm)
        self.build_seconds = build_seconds
        # sonde's compile budget scales with the component's size; set this
        # (e.g. "300s") to give the first compile a fixed, longer one.
        self.compile_timeout: Optional[str] = None
        self.cache_dir: Optional[str] = os.environ.get("SONDE_TEST_CACHE_DIR")

    @classmethod
    def build(cls, app_dir: Union[str, Path], module: str = "app", out: Optional[Union[str, Path]] = None) -> "Plugin":
        """Builds `module` in `app_dir` with componentize-py (a fresh build
        every time, so a test never runs a stale component)."""
        from . import build

        out = Path(out) if out else Path(tempfile.mkdtemp(prefix="sonde-py-")) / f"{module}.wasm"
        seconds = build.componentize(module, out, app_dir)
        return cls(out, seconds)

    @classmethod
    def from_file(cls, wasm: Union[str, Path]) -> "Plugin":
        return cls(wasm)

    def check(self, target: str) -> "Check":
        return Check(self, target)


class Check:
    """One `sonde check` to run: target, config, grants, timeout."""

    def __init__(self, plugin: Plugin, target: str):
        self.plugin = plugin
        self.args = ["--target", target]

    def config(self, config: Union[str, dict]) -> "Check":
        self.args += ["--config", config if isinstance(config, str) else json.dumps(config)]
        return self

    def timeout(self, seconds: float) -> "Check":
        self.args += ["--timeout", f"{max(1, int(seconds * 1000))}ms"]
        return self

    def allow_net(self, pattern: str) -> "Check":
        self.args += ["--allow-net", pattern]
        return self

    def allow_file(self, path: str) -> "Check":
        self.args += ["--allow-file", path]
        return self

    def allow_exec(self, program: str) -> "Check":
        self.args += ["--allow-exec", program]
        return self

    def secret(self, name: str, file: Union[str, Path]) -> "Check":
        """Grants the secret `name`, read from `file` (which sonde refuses if
        every user may read it: chmod 600); the config names it `$(secret:NAME)`."""
        self.args += ["--secret", f"{name}={file}"]
        return self

    def run(self) -> CheckResult:
        p = self.plugin
        cmd = [sonde_bin()]
        if p.compile_timeout:
            cmd += ["--compile-timeout", p.compile_timeout, "--compile-timeout-max", p.compile_timeout]
        if p.cache_dir:
            cmd += ["--cache-dir", p.cache_dir]
        cmd += ["check", str(p.wasm), *self.args, "--output", "json"]
        start = _time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True)
        seconds = _time.monotonic() - start
        try:
            v = json.loads(out.stdout)
        except ValueError:
            raise AssertionError(f"sonde printed no result (exit {out.returncode}): {out.stderr.strip()}") from None
        return CheckResult(
            status=v.get("status", "unknown"), reason=v.get("reason"), message=v.get("message", ""),
            metrics=[(m.get("name", ""), float(m.get("value", "nan")), m.get("unit", "")) for m in v.get("metrics") or []],
            detail=v.get("detail"), exit_code=out.returncode, seconds=seconds, stderr=out.stderr)


__all__ = ["Accepted", "FakeHost", "FakeSession", "LoginAttempt", "LoginError", "Refused", "respond", "tls_info", "run",
           "secret_names", "Plugin", "Check", "CheckResult", "sonde_bin"]
