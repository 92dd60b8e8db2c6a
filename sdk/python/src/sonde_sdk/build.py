"""Building a component with componentize-py, against the WIT of this sonde
checkout (`sdk/wit`, never a copy): the bindings are generated at build
time, inside componentize-py, and never written into the source tree.

    python -m sonde_sdk build app --app-dir examples/http-json/python -o http-json.wasm

componentize-py is `$COMPONENTIZE_PY`, else `componentize-py` on PATH; it
must be the version `REQUIRED_COMPONENTIZE_PY` names (what the repository
tests with)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

REQUIRED_COMPONENTIZE_PY = "0.25.1"
WORLD = "plugin"


def sdk_path() -> Path:
    """The directory holding the `sonde_sdk` package (put on componentize-py's path)."""
    return Path(__file__).resolve().parents[1]


def wit_dir() -> Path:
    """`$SONDE_WIT`, else the sdk/wit of the checkout this package sits in."""
    env = os.environ.get("SONDE_WIT")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "wit" / "probe.wit"
        if candidate.exists():
            return candidate.parent
    raise FileNotFoundError(
        "cannot find sdk/wit/probe.wit above the sonde_sdk package; set SONDE_WIT to the sdk/wit directory of a sonde checkout")


def componentize_py() -> str:
    exe = os.environ.get("COMPONENTIZE_PY") or shutil.which("componentize-py")
    if not exe:
        raise FileNotFoundError(
            f"componentize-py not found: pip install componentize-py=={REQUIRED_COMPONENTIZE_PY} (in a venv), or set COMPONENTIZE_PY")
    return exe


def componentize(module: str, out: os.PathLike, app_dir: os.PathLike = ".", wit: Optional[os.PathLike] = None,
                 quiet: bool = True) -> float:
    """Builds module `module` (found in `app_dir`) into the component `out`;
    returns the seconds it took. Raises CalledProcessError on a failed build."""
    exe = componentize_py()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.split()
    if version[-1:] != [REQUIRED_COMPONENTIZE_PY]:
        print(f"warning: {exe} is {' '.join(version)}; sonde tests with {REQUIRED_COMPONENTIZE_PY}")
    cmd = [exe, "-d", str(wit or wit_dir()), "-w", WORLD, "componentize", module,
           "-p", str(Path(app_dir).resolve()), "-p", str(sdk_path()), "-o", str(Path(out).resolve())]
    start = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if quiet else None)
    return time.monotonic() - start


def bindings(out_dir: os.PathLike, wit: Optional[os.PathLike] = None) -> None:
    """Writes the generated bindings (`wit_world`) into `out_dir`, for an
    editor or type checker only: never commit them, the build makes its own."""
    subprocess.run([componentize_py(), "-d", str(wit or wit_dir()), "-w", WORLD, "bindings", str(out_dir)], check=True)
