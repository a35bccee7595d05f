"""Real vLLM's own verdict on `vllm serve` argvs. Run with the engine virtualenv's Python.

stdin: JSON {"argvs": [[...], ...], "deep": [[...], ...]}: each argv is what follows `vllm serve`
(model first). Every argv goes through vLLM's serve parser (make_arg_parser) and
validate_parsed_serve_args; each "deep" one also builds the engine config
(AsyncEngineArgs.from_cli_args(...).create_engine_config()), which reads the model's config.json, so deep
argvs name a local model. Writes JSON [{"ok": bool, "error": str}] for argvs, then deep, in order, to
the file named by its one argument (vLLM logs to stdout).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def parser() -> Any:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))  # it adds the model_tag positional


def parse(p: Any, argv: list[str]) -> Any:
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
    except SystemExit:
        raise ValueError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "refused") from None
    validate_parsed_serve_args(ns)
    ns.model = ns.model_tag
    return ns


def main() -> None:
    job = json.load(sys.stdin)
    p = parser()
    out: list[dict[str, Any]] = []
    for argv in job.get("argvs", []):
        try:
            parse(p, argv)
            out.append({"ok": True, "error": ""})
        except Exception as exc:
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    from vllm.engine.arg_utils import AsyncEngineArgs

    for argv in job.get("deep", []):
        try:
            AsyncEngineArgs.from_cli_args(parse(p, argv)).create_engine_config()
            out.append({"ok": True, "error": ""})
        except Exception as exc:
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
