"""`oculis status --check-deps`: which optional parts of Oculis this installation can run.

The router image deliberately lacks kopf and the Kubernetes client, so a missing extra is reported
as "not installed" with the pip command that adds it, not as an error, unless it was asked for.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

from oculis import __version__


@dataclass(frozen=True)
class Extra:
    name: str
    modules: tuple[str, ...]
    purpose: str


# Import names of each extra's requirements in pyproject.toml (a unit test keeps the two in step).
EXTRAS = (
    Extra("core", ("pydantic", "yaml", "jinja2"), "schema, config and CLI"),
    Extra("operator", ("kopf", "kubernetes", "tenacity", "prometheus_client"), "the Kubernetes operator"),
    Extra("router", ("aiohttp", "tenacity", "prometheus_client", "cachetools", "numpy", "tokenizers", "starlette",
                     "uvicorn", "redis", "hiredis", "msgpack", "zmq", "grpc", "grpc_health", "envoy",
                     "python_multipart"), "router and endpoint picker"),
    Extra("bench", ("httpx", "rich", "plotly", "numpy", "scipy"), "bench, eval, cost and cache commands"),
)
IMPORT_NAMES = {"pyyaml": "yaml", "prometheus-client": "prometheus_client", "pyzmq": "zmq", "grpcio": "grpc",
                "grpcio-health-checking": "grpc_health", "xds-protos": "envoy", "python-multipart": "python_multipart"}


def check(extra: Extra) -> list[str]:
    """Names of the modules of `extra` that cannot be imported here."""
    return [m for m in extra.modules if importlib.util.find_spec(m) is None]


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show the installation and, with --check-deps, its optional parts")
    p.add_argument("--check-deps", action="store_true", help="check the dependencies of each extra")
    p.add_argument("--require", action="append", default=[], choices=[e.name for e in EXTRAS],
                   help="exit 1 unless this extra is fully installed (repeatable)")
    from oculis_cli import checks  # the cluster, metrics, cost, bench and permission checks

    checks.add_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.check_deps and args.output != "table":  # one machine-readable report, the extras included
        from oculis_cli import checks

        return checks.run(args)
    print(f"oculis {__version__}")
    if not args.check_deps and not args.require:
        return 0
    failed = False
    for extra in EXTRAS:
        missing = check(extra)
        if missing:
            state = f"missing {', '.join(missing)}: pip install 'oculis[{extra.name}]'"
            failed |= extra.name in args.require
        else:
            versions = ", ".join(f"{m} {_version(m)}" for m in extra.modules)
            state = f"ok ({versions})"
        print(f"  {extra.name:9} {extra.purpose:28} {state}")
    if args.check_deps:
        from oculis_cli import checks

        failed |= checks.run(args, python=False) != 0
    return 1 if failed else 0


def _version(module: str) -> str:
    dist = {v: k for k, v in IMPORT_NAMES.items()}.get(module, module)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"
