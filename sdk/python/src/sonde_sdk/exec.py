"""Running a granted program on the host (`sonde:probe/exec`): only the
programs the probe's `exec` grant names; no stdin, the granted environment
only, the process group killed at the timeout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from . import _host


@dataclass
class ExecOutput:
    exit_code: Optional[int]
    """None when a signal or the timeout ended it."""
    timed_out: bool = False
    stdout: bytes = b""
    """The start of its stdout (at most 4 KiB)."""
    stderr: bytes = b""


def run(argv: Sequence[str], timeout: float = 1.0) -> ExecOutput:
    """Runs `argv` (an absolute path, then arguments) for at most `timeout`
    seconds. Not granted: ProbeError("denied"); could not start: ProbeError("io")."""
    return _host.current().exec_run([str(a) for a in argv], int(timeout * 1000))
