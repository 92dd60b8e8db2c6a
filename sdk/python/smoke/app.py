"""A smoke-test plugin: each `mode` calls one host capability through the
real bindings, so smoke.sh can check the SDK's glue to every interface of
probe.wit (not a user example; see examples/http-json)."""

import json
from dataclasses import dataclass

import sonde_sdk as sonde
from sonde_sdk import NetError, Outcome, ProbeError, exec, grpc, http, log, net, tcp, time, tls


@dataclass
class Config:
    mode: str


class Smoke(sonde.Probe):
    name = "smoke-py"
    Config = Config

    def check(self, req):
        mode = req.config().mode
        host, port = net.host_port(req.target) if "://" not in req.target else ("", 0)
        start = time.Instant.now()
        if mode == "log":
            for level in ("trace", "debug", "info", "warn", "error"):
                getattr(log, level)(f"smoke {level}")
            return Outcome.success(f"logged; unix {int(time.unix_seconds())} > 1.7e9: {time.unix_seconds() > 1.7e9}")
        if mode == "exec":
            out = exec.run(["/bin/echo", "hi"], timeout=2)
            timed_out = "yes" if out.timed_out else "no"
            return Outcome.success(f"exit {out.exit_code} timed_out {timed_out} stdout {json.dumps(out.stdout.decode())}")
        if mode == "tls":
            hs = tls.handshake(host, port, tls.TlsOptions(insecure_skip_verify=True), req.remaining())
            session, hs2 = tls.connect(host, port, tls.TlsOptions(insecure_skip_verify=True, server_name="localhost"), req.remaining())
            with session:
                session.send(b"ping\n")
                data, error = session.read_until(100, lambda b: b"\n" in b)
            days = round(hs.info.expires_in_seconds() / 86400)
            return Outcome.success(f"{hs.info.version} {hs.info.subject} days {days} echo {json.dumps(data.decode())} error {error or 'none'}",
                                   metrics=[("tls_seconds", hs.tls_seconds, "seconds")])
        if mode == "tcp-timeout":
            session, _ = tcp.connect(host, port, req.remaining())
            session.read_timeout = 0.2
            try:
                session.read()
            except sonde.SessionError as e:
                return Outcome.success(f"read: {e.kind} {e.describe()}")
            return Outcome.failure("read returned")
        if mode == "grpc":
            try:
                r = grpc.call(grpc.GrpcRequest(req.target, "/grpc.health.v1.Health/Check", timeout=req.remaining()))
            except NetError as e:
                return Outcome.success(f"grpc NetError {e.failure}")
            return Outcome.success(f"grpc code {r.code.name}")
        if mode == "https":
            try:
                http.send(http.HttpRequest(f"https://{req.target}/", timeout=req.remaining()))
            except NetError as e:
                return Outcome.success(f"https NetError {e.failure}")
            return Outcome.failure("an untrusted certificate was accepted")
        if mode == "denied":
            http.get("http://127.0.0.2:9/", timeout=1)  # not the target: ProbeError denied
            return Outcome.failure("reached a host not granted")
        if mode == "bug":
            return {}["missing"]
        raise ProbeError.invalid_config(f"mode {mode!r}")


WitWorld = sonde.export(Smoke)
