"""Files through the probe's read-only `files` grants (WASI preopens in the
sandbox, plain files in a unit test). A path no grant covers does not exist
for the plugin; without any grant the host refuses (the run is `denied`)."""

from __future__ import annotations

import os
import stat as _stat
from dataclasses import dataclass
from typing import Optional


class FsError(Exception):
    """kind: "not-found", "denied" or "other"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class Metadata:
    kind: str
    """"file", "directory" or "other"."""
    size: int
    modified: Optional[float]
    """Unix seconds of the last data modification."""


def _error(e: OSError) -> FsError:
    if isinstance(e, FileNotFoundError):
        return FsError("not-found", e.strerror or str(e))
    if isinstance(e, PermissionError):
        return FsError("denied", e.strerror or str(e))
    return FsError("other", e.strerror or str(e))


def metadata(path: str) -> Metadata:
    """The metadata of the file at absolute `path`, symlinks followed."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _error(e) from None
    kind = "file" if _stat.S_ISREG(st.st_mode) else "directory" if _stat.S_ISDIR(st.st_mode) else "other"
    return Metadata(kind, st.st_size, st.st_mtime)


def read_to_string(path: str) -> str:
    """The contents of the file at `path` as UTF-8 text."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise _error(e) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FsError("other", "stream did not contain valid UTF-8") from None
