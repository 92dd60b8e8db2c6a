"""A check: subclass `Probe` (or decorate a function with `@probe`), then
export it as the component's `describe` and `check`:

    class HttpJson(Probe):
        name = "http-json"
        Config = Config                # a dataclass: typed config + schema

        def check(self, req: Request) -> Outcome:
            config = req.config()      # a Config
            ...

    WitWorld = export(HttpJson)        # componentize-py looks for WitWorld

`export` is Rust's `sonde_sdk::export!`: the class it returns converts the
SDK's types to the generated bindings' and back. In plain CPython it is
inert, so the same module imports in a unit test."""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Callable, List, Optional, Type, Union

from ._core import Capability, Outcome, PluginInfo, ProbeError, Request


class Probe:
    """A probe handler. Override `check`; set the class attributes (or
    override `describe`) to publish who the plugin is and what it needs."""

    name: str = ""
    """The plugin's name [default: the class name, lower-case]."""
    version: str = "0.1.0"
    vendor: str = ""
    description: str = ""
    Config: Optional[type] = None
    """A dataclass: `req.config()` returns one, and `describe` publishes its schema."""
    capabilities: List[Capability] = []

    @classmethod
    def describe(cls) -> PluginInfo:
        from . import config as _config

        name = cls.name or cls.__name__.lower()
        schema = _config.schema(cls.Config, title=name) if cls.Config is not None else None
        doc = (cls.__doc__ or "").strip()
        return PluginInfo(name=name, version=cls.version, vendor=cls.vendor,
                          description=cls.description or doc.split("\n\n")[0].replace("\n", " "),
                          config_schema=schema, capabilities=list(cls.capabilities))

    def check(self, req: Request) -> Outcome:
        raise NotImplementedError("a Probe overrides check(self, req)")


def probe(name: str = "", *, config: Optional[type] = None, vendor: str = "", version: str = "0.1.0",
          description: str = "", capabilities: Optional[List[Capability]] = None) -> Callable[[Callable[[Request], Outcome]], Type[Probe]]:
    """Makes a Probe of a function `check(req) -> Outcome`."""

    def wrap(fn: Callable[[Request], Outcome]) -> Type[Probe]:
        attrs = {
            "name": name or fn.__name__.replace("_", "-"), "version": version, "vendor": vendor,
            "description": description or (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
            "Config": config, "capabilities": list(capabilities or []),
            "check": lambda self, req: fn(req), "__doc__": fn.__doc__, "__module__": fn.__module__,
        }
        return type(fn.__name__, (Probe,), attrs)

    return wrap


def _location(e: BaseException) -> str:
    """Where an exception was raised, without reading source files (a
    component has no files to read)."""
    frames = traceback.StackSummary.extract(traceback.walk_tb(e.__traceback__), lookup_lines=False)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name})"


def run(p: Union[Type[Probe], Probe], req: Request) -> Outcome:
    """Runs one check as the component does: the typed config attached to
    `req`, an Outcome back, a ProbeError raised as it is, any other
    exception (a bug) as ProbeError("internal") naming its type and place."""
    instance = p() if isinstance(p, type) else p
    if instance.Config is not None:
        req._config_cls = instance.Config  # type: ignore[attr-defined]
    try:
        outcome = instance.check(req)
    except ProbeError:
        raise
    except Exception as e:  # noqa: BLE001  (a plugin bug must not trap the sandbox)
        raise ProbeError.internal(f"{type(e).__name__}: {e}{_location(e)}") from e
    if not isinstance(outcome, Outcome):
        raise ProbeError.internal(f"check returned {type(outcome).__name__}, not an Outcome")
    return outcome


def describe(p: Union[Type[Probe], Probe]) -> PluginInfo:
    return (p if isinstance(p, type) else type(p)).describe()


def export(p: Type[Probe]) -> type:
    """The class componentize-py exports as the world `plugin`: assign it to
    `WitWorld` in the module you componentize."""

    class WitWorld:
        probe = p

        def describe(self) -> Any:
            from . import _wit

            return _wit.plugin_info(describe(p))

        def check(self, wreq: Any) -> Any:
            from . import _wit

            try:
                return _wit.outcome(run(p, _wit.request(wreq)))
            except ProbeError as e:
                raise _wit.error(e) from None

    WitWorld.__qualname__ = WitWorld.__name__ = "WitWorld"
    return WitWorld


__all__ = ["Probe", "probe", "export", "run", "describe", "dataclasses"]
