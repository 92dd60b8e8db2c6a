"""`python -m sonde_sdk build MODULE -o FILE.wasm [--app-dir DIR]` and
`python -m sonde_sdk bindings DIR` (for editors; never committed)."""

from __future__ import annotations

import argparse
import sys

from . import build


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sonde_sdk", description="Build sonde probe plugins written in Python.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build MODULE into a component with componentize-py")
    b.add_argument("module", help="the module that assigns WitWorld = sonde_sdk.export(...)")
    b.add_argument("-o", "--out", required=True, help="the .wasm to write")
    b.add_argument("--app-dir", default=".", help="where MODULE is [default: .]")
    b.add_argument("--wit", help="sdk/wit of a sonde checkout [default: $SONDE_WIT or the one above this package]")
    g = sub.add_parser("bindings", help="write the generated bindings into DIR (for editors only)")
    g.add_argument("dir")
    g.add_argument("--wit")
    args = parser.parse_args(argv)
    if args.command == "build":
        seconds = build.componentize(args.module, args.out, args.app_dir, args.wit)
        print(f"built {args.out} in {seconds:.1f}s")
    else:
        build.bindings(args.dir, args.wit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
