"""http-json: an HTTP JSON health endpoint check, written with sonde_sdk.

GETs the target (a URL, or host:port plus `path`), requires the JSON field
`field` (a dotted path; array indices allowed: `checks.0.status`) to equal
`expected`, reports the response time, and warns when the exchange took
longer than `warn_after`.

    {"path": "/health", "field": "status", "expected": "ok", "warn_after": "300ms"}
"""

from dataclasses import dataclass, field as _field
from typing import Any, Optional

import sonde_sdk as sonde
from sonde_sdk import Duration, NetError, Outcome, http


@dataclass
class Config:
    field: str = _field(metadata={"description": "Dotted path of the JSON field to check (`status`, `checks.db.state`, `items.0.ok`)."})
    expected: Any = _field(metadata={"description": "The JSON value the field must equal."})
    path: str = _field(default="/health", metadata={"description": "Path appended to a host:port target (a URL target is used as it is)."})
    warn_after: Optional[Duration] = _field(default=None, metadata={"description": "A slower exchange is a warning (\"300ms\")."})


_MISSING = object()


def lookup(doc: Any, dotted: str) -> Any:
    """The value at `a.b.0.c` in a JSON document, or _MISSING."""
    for key in dotted.split("."):
        if isinstance(doc, dict) and key in doc:
            doc = doc[key]
        elif isinstance(doc, list) and key.isdigit() and int(key) < len(doc):
            doc = doc[int(key)]
        else:
            return _MISSING
    return doc


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def show(value: Any) -> str:
    import json

    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


class HttpJson(sonde.Probe):
    """Checks that a JSON health endpoint reports the expected value, and how fast."""

    name = "http-json"
    version = "0.1.0"
    vendor = "sonde examples"
    Config = Config

    def check(self, req: sonde.Request) -> Outcome:
        config: Config = req.config()
        url = req.target if "://" in req.target else f"http://{req.target}{config.path}"
        request = http.HttpRequest.get(url, timeout=req.remaining())
        request.headers.append(("accept", "application/json"))
        try:
            response = http.send(request)
        except NetError as e:
            # The target failed (refused, timeout...): a verdict, not an error.
            return Outcome.failure(f"GET {url}: {e.message}")
        seconds = response.timings.total
        metrics = [("response_seconds", seconds, "seconds"), ("status_code", response.status, "")]
        if not 200 <= response.status < 300:
            return Outcome.failure(f"GET {url}: status {response.status}", metrics, detail=response.text()[:256])
        try:
            doc = response.json()
        except ValueError:
            return Outcome.failure(f"GET {url}: the body is not JSON", metrics, detail=response.text()[:256])
        value = lookup(doc, config.field)
        if value is _MISSING:
            return Outcome.failure(f"{config.field}: no such field", metrics, detail=response.text()[:256])
        if not json_equal(value, config.expected):
            return Outcome.failure(f"{config.field} is {show(value)}, expected {show(config.expected)}", metrics)
        took = sonde.duration.format(round(seconds, 3))
        if config.warn_after is not None and seconds > config.warn_after:
            return Outcome.warning(f"{config.field} is {show(value)}, but the answer took {took} (over {config.warn_after})", metrics)
        sonde.log.debug(f"{url}: {config.field} = {show(value)} in {took}")
        return Outcome.success(f"{config.field} is {show(value)} ({took})", metrics)


# componentize-py exports the class named WitWorld in this module.
WitWorld = sonde.export(HttpJson)
