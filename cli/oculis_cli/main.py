"""Entry point of the `oculis` command: parses arguments and dispatches to one module per command.

Exit codes: 0 success, 1 failure, 2 bad arguments (argparse's own convention).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from oculis import __version__
from oculis_cli import capacity, deps, route, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oculis", description="Oculis: cheaper, faster self-hosted LLM inference")
    parser.add_argument("--version", action="version", version=f"oculis {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    deps.register(sub)
    route.register(sub)
    capacity.register(sub)
    serve.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
