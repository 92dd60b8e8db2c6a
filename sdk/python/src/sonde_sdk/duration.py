"""Durations as people write them in a probe's config (`500ms`, `1.5s`,
`1m 30s`, `2 hours`) and back: humantime's grammar, as the Rust SDK's
`duration` module and the agent's own config use it.

`Duration` is a float of seconds that a config dataclass field can be
annotated with: the JSON value is then a string parsed here."""

from __future__ import annotations

_S = 1_000_000_000
_UNITS = {}
for _names, _nanos in [
    (("nanos", "nsec", "ns"), 1),
    (("usec", "us", "\u00b5s"), 1_000),
    (("millis", "msec", "ms"), 1_000_000),
    (("seconds", "second", "secs", "sec", "s"), _S),
    (("minutes", "minute", "min", "mins", "m"), 60 * _S),
    (("hours", "hour", "hr", "hrs", "h"), 3_600 * _S),
    (("days", "day", "d"), 86_400 * _S),
    (("weeks", "week", "wk", "wks", "w"), 7 * 86_400 * _S),
    (("months", "month", "M"), 2_630_016 * _S),
    (("years", "year", "yr", "yrs", "y"), 31_557_600 * _S),
]:
    for _n in _names:
        _UNITS[_n] = _nanos


def parse_nanos(text: str) -> int:
    """Parses a sum of NUMBER UNIT terms into nanoseconds; ValueError says why."""
    rest = text.lstrip()
    if not rest:
        raise ValueError("value was empty")
    total = 0
    while rest:
        at = len(text) - len(rest)
        i = 0
        while i < len(rest) and (rest[i].isdigit() and rest[i].isascii() or rest[i] == "."):
            i += 1
        number, after = rest[:i], rest[i:].lstrip()
        if not number or number.startswith(".") or number.count(".") > 1:
            raise ValueError(f"expected number at {at}")
        j = 0
        while j < len(after) and after[j].isalpha():
            j += 1
        unit, after = after[:j], after[j:]
        if unit not in _UNITS:
            if not unit:
                raise ValueError(f"time unit needed, for example {number}sec or {number}ms")
            raise ValueError(f"unknown time unit {unit!r}, supported units: ns, us/\u00b5s, ms, sec, min, hours, days, weeks, months, years")
        whole, _, fraction = number.partition(".")
        nanos = int(whole) * _UNITS[unit]
        scale = _UNITS[unit]
        for digit in fraction:
            part = int(digit) * scale
            scale //= 10
            if part % 10 and scale == 0:
                raise ValueError("number is too large or below 1ns")
            nanos += part // 10
        total += nanos
        rest = after.lstrip()
        if rest and not rest[0].isdigit():
            raise ValueError(f"expected number at {len(text) - len(rest)}")
    return total


def parse(text: str) -> "Duration":
    """Parses `text` into a Duration (seconds); ValueError says why."""
    return Duration(parse_nanos(text) / _S)


def format(seconds: float) -> str:
    """As humantime writes a duration: `1h 2m 3s`, `2days`, `0s`."""
    total = round(seconds * _S)
    if total <= 0:
        return "0s"
    secs, nanos = divmod(total, _S)
    years, rest = divmod(secs, 31_557_600)
    months, rest = divmod(rest, 2_630_016)
    days, rest = divmod(rest, 86_400)
    parts = [(years, "year", True), (months, "month", True), (days, "day", True),
             (rest // 3_600, "h", False), (rest % 3_600 // 60, "m", False), (rest % 60, "s", False),
             (nanos // 1_000_000, "ms", False), (nanos // 1_000 % 1_000, "us", False), (nanos % 1_000, "ns", False)]
    out = []
    for value, unit, plural in parts:
        if value:
            out.append(f"{value}{unit}{'s' if plural and value > 1 else ''}")
    return " ".join(out)


class Duration(float):
    """Seconds, parsed from a humantime string in a config (`"300ms"`)."""

    @classmethod
    def parse(cls, text: str) -> "Duration":
        return parse(text)

    def __str__(self) -> str:
        return format(self)

    def __repr__(self) -> str:
        return f"Duration({format(self)!r})"
