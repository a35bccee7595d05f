"""Entry point of the `oculis` command: parses arguments and dispatches to one module per command.

Exit codes: 0 success, 1 failure, 2 bad arguments (argparse's own convention).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from oculis import __version__
from oculis_cli import bench, cache_advise, capacity, classifier, cost, deps, epp, eval_run, route, serve


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (the usage block is what `--help` is for); subcommands
    inherit this class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _register_sim(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    # The simulator ships in neither image: import it only when `oculis sim` runs.
    p = sub.add_parser("sim", help="simulated vLLM engine: `oculis sim replay|serve ...` (see `oculis sim --help`)",
                       add_help=False)
    p.add_argument("-h", "--help", dest="sim_help", action="store_true")  # the simulator's own parser answers
    p.add_argument("sim_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_run_sim)


def _run_sim(args: argparse.Namespace) -> int:
    try:
        from oculis_sim.cli import main as sim_main
    except ImportError as exc:
        print(f"oculis sim: error: the engine simulator is not installed ({exc}); install it with "
              "`pip install -e '.[sim]'` from an Oculis checkout", file=sys.stderr)
        return 2
    return sim_main(["--help"] if args.sim_help else args.sim_args)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="oculis", description="Oculis: cheaper, faster self-hosted LLM inference")
    parser.add_argument("--version", action="version", version=f"oculis {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    deps.register(sub)
    route.register(sub)
    capacity.register(sub)
    serve.register(sub)
    epp.register(sub)
    bench.register(sub)
    eval_run.register(sub)
    cost.register(sub)
    cache_advise.register(sub)
    classifier.register(sub)
    _register_sim(sub)
    return parser


# What a shell reports for a command a closed pipe stopped (128 + SIGPIPE), as `cat` killed by it does.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
        sys.stdout.flush()  # here, not at exit, where a closed pipe's error can no longer be caught
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly, as the CLI tools it is piped with do, never a traceback
        # (QA3 Part 2 #14). Python's own recipe: point stdout at devnull so the flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
