"""Typed plugin config: a dataclass from the probe's JSON config.

    @dataclass
    class Config:
        url: str                                   # required
        field: str = "status"
        expect: Any = "ok"                         # any JSON value
        warn_after: Optional[Duration] = None      # "300ms"
        headers: Dict[str, str] = field(default_factory=dict)

    config = req.config(Config)     # or config.load(Config, json_text)

Supported annotations: str, int, float (an integer is accepted), bool, Any,
Duration (a humantime string), Optional[X], List[X], Dict[str, X],
Literal[...], and nested dataclasses. Unknown keys are refused unless
`allow_unknown=True`, as the built-in plugins do. Every mismatch is
ProbeError("invalid-config") naming the field. `schema(Config)` makes the
JSON Schema (draft 2020-12) that `describe` publishes; a field's
`metadata={"description": "..."}` becomes its description."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Dict, Type, TypeVar, Union

from ._errors import ProbeError
from .duration import Duration, parse as _parse_duration

T = TypeVar("T")
_MISSING = dataclasses.MISSING


def parse_object(text: str) -> Dict[str, Any]:
    """The config text as a JSON object (`{}` for empty text)."""
    try:
        value = json.loads(text or "{}")
    except ValueError as e:
        raise ProbeError.invalid_config(f"config is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ProbeError.invalid_config("config must be a JSON object")
    return value


def load(cls: Type[T], config: Union[str, Dict[str, Any]], *, allow_unknown: bool = False) -> T:
    """An instance of dataclass `cls` from JSON text or a parsed object."""
    obj = parse_object(config) if isinstance(config, str) else config
    return _dataclass(cls, obj, "", allow_unknown)


def _hints(cls: type) -> Dict[str, Any]:
    return typing.get_type_hints(cls)


def _where(path: str) -> str:
    return f"field `{path}`" if path else "config"


def _dataclass(cls: type, obj: Any, path: str, allow_unknown: bool) -> Any:
    if not isinstance(obj, dict):
        raise ProbeError.invalid_config(f"{_where(path)}: expected an object")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if not allow_unknown:
        unknown = sorted(set(obj) - set(fields))
        if unknown:
            raise ProbeError.invalid_config(
                f"unknown field `{'`, `'.join(path + '.' + u if path else u for u in unknown)}`, "
                f"expected one of `{'`, `'.join(fields)}`")
    hints = _hints(cls)
    values = {}
    for name, f in fields.items():
        sub = f"{path}.{name}" if path else name
        if name in obj:
            values[name] = _value(hints[name], obj[name], sub, allow_unknown)
        elif f.default is _MISSING and f.default_factory is _MISSING:  # type: ignore[misc]
            raise ProbeError.invalid_config(f"missing field `{sub}`")
    return cls(**values)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def _value(t: Any, v: Any, path: str, allow_unknown: bool) -> Any:
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    bad = lambda what: ProbeError.invalid_config(f"field `{path}`: expected {what}, got {json.dumps(v)[:60]}")  # noqa: E731
    if t is Any:
        return v
    if origin is Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _value(inner[0], v, path, allow_unknown)
        for a in inner:
            try:
                return _value(a, v, path, allow_unknown)
            except ProbeError:
                pass
        raise bad(" or ".join(_type_name(a) for a in inner))
    if origin is typing.Literal:
        if v in args:
            return v
        raise bad("one of " + ", ".join(json.dumps(a) for a in args))
    if origin in (list, typing.List):
        if not isinstance(v, list):
            raise bad("a list")
        item = args[0] if args else Any
        return [_value(item, x, f"{path}[{i}]", allow_unknown) for i, x in enumerate(v)]
    if origin in (dict, typing.Dict):
        if not isinstance(v, dict):
            raise bad("an object")
        item = args[1] if len(args) == 2 else Any
        return {k: _value(item, x, f"{path}.{k}", allow_unknown) for k, x in v.items()}
    if t is Duration:
        if not isinstance(v, str):
            raise bad('a duration such as "500ms"')
        try:
            return _parse_duration(v)
        except ValueError as e:
            raise ProbeError.invalid_config(f"field `{path}`: {v!r}: {e}") from None
    if t is bool:
        if isinstance(v, bool):
            return v
        raise bad("a boolean")
    if t is int:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise bad("an integer")
    if t is float:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        raise bad("a number")
    if t is str:
        if isinstance(v, str):
            return v
        raise bad("a string")
    if dataclasses.is_dataclass(t):
        return _dataclass(t, v, path, allow_unknown)
    raise ProbeError.internal(f"field `{path}`: config type {_type_name(t)} is not supported")


def _schema_of(t: Any) -> Dict[str, Any]:
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if t is Any:
        return {}
    if origin is Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _schema_of(inner[0])
        return {"anyOf": [_schema_of(a) for a in inner]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, typing.List):
        return {"type": "array", "items": _schema_of(args[0]) if args else {}}
    if origin in (dict, typing.Dict):
        return {"type": "object", "additionalProperties": _schema_of(args[1]) if len(args) == 2 else {}}
    if t is Duration:
        return {"type": "string", "description": 'A duration such as "500ms" or "1m 30s".'}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if t in simple:
        return {"type": simple[t]}
    if dataclasses.is_dataclass(t):
        return _object_schema(t)
    return {}


def _object_schema(cls: type) -> Dict[str, Any]:
    hints = _hints(cls)
    props: Dict[str, Any] = {}
    required = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        s = dict(_schema_of(hints[f.name]))
        if "description" in f.metadata:
            s["description"] = f.metadata["description"]
        if f.default is not _MISSING and f.default is not None:
            d = f.default
            s["default"] = str(d) if isinstance(d, Duration) else d
        if f.default is _MISSING and f.default_factory is _MISSING:  # type: ignore[misc]
            required.append(f.name)
        props[f.name] = s
    out: Dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if required:
        out["required"] = required
    return out


def schema(cls: type, title: str = "") -> str:
    """The JSON Schema (draft 2020-12) of dataclass `cls`, as text."""
    s: Dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    if title:
        s["title"] = title
    s.update(_object_schema(cls))
    return json.dumps(s)
