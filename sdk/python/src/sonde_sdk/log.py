"""Logging into the host's log (`sonde:probe/log`), tagged with the probe's
name; the host caps records and bytes per call."""

from . import _host


def trace(message: str) -> None:
    _host.current().log("trace", str(message))


def debug(message: str) -> None:
    _host.current().log("debug", str(message))


def info(message: str) -> None:
    _host.current().log("info", str(message))


def warn(message: str) -> None:
    _host.current().log("warn", str(message))


def error(message: str) -> None:
    _host.current().log("error", str(message))
