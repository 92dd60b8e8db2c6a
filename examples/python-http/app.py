"""A sonde probe plugin in Python, built with componentize-py.

It checks an HTTP endpoint through the host's probe transport
(`sonde:probe/http`): success when the status is 200-399 and the body
contains the configured text, failure otherwise. The host reaches only the
probe's target and its grants, exactly as for a Rust plugin.

Config (JSON): {"path": "/healthz", "contains": "ok"}; both optional.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import http, tls, types

SCHEMA = json.dumps({
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "python-http",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "path": {"type": "string", "default": "/", "description": "Path appended to the host:port target."},
        "contains": {"type": "string", "description": "Text the response body must contain."},
    },
})


def invalid_config(message: str) -> Err:
    return Err(types.ProbeError_InvalidConfig(message))


class WitWorld(wit_world.WitWorld):
    def describe(self) -> types.PluginInfo:
        return types.PluginInfo(
            name="python-http",
            version="0.1.0",
            vendor="sonde examples",
            description="HTTP check written in Python: status 200-399 and an optional body text.",
            config_schema=SCHEMA,
            capabilities=[],
        )

    def check(self, req: types.Request) -> types.Outcome:
        try:
            config = json.loads(req.config or "{}")
        except ValueError as e:
            raise invalid_config(f"config is not JSON: {e}")
        if not isinstance(config, dict):
            raise invalid_config("config must be an object")
        unknown = set(config) - {"path", "contains"}
        if unknown:
            raise invalid_config(f"unknown field(s): {', '.join(sorted(unknown))}")
        path = config.get("path", "/")
        contains = config.get("contains")

        url = req.target if "://" in req.target else f"http://{req.target}{path}"
        request = http.Request(
            method="GET",
            url=url,
            headers=[("user-agent", "sonde-python-example")],
            body=b"",
            timeout_ms=req.timeout_ms,
            max_body=10 * 1024,
            # https:// targets are verified against the system's roots.
            tls=tls.Options(ca_pem=None, insecure_skip_verify=False, server_name=None),
            keepalive=False,
        )
        try:
            response = http.send(request)
        except Err as e:
            error = e.value
            if isinstance(error, http.HttpError_Denied):
                raise Err(types.ProbeError_Denied(error.value))
            if isinstance(error, http.HttpError_Invalid):
                raise invalid_config(error.value)
            return outcome(types.Status.FAILURE, f"GET {url}: {type(error).__name__.split('_')[-1].lower()}: {error.value}")

        metrics = [
            types.Metric(name="status_code", value=float(response.status), unit=""),
            types.Metric(name="total_seconds", value=response.timings.total, unit="seconds"),
        ]
        if not 200 <= response.status < 400:
            return outcome(types.Status.FAILURE, f"GET {url}: status {response.status}", metrics)
        if contains is not None and contains.encode() not in response.body:
            return outcome(types.Status.FAILURE, f"GET {url}: body does not contain {contains!r}", metrics)
        return outcome(types.Status.SUCCESS, f"GET {url}: status {response.status}", metrics)


def outcome(status: types.Status, message: str, metrics=None) -> types.Outcome:
    return types.Outcome(status=status, message=message, metrics=metrics or [], detail=None)
