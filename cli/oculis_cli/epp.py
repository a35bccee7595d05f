"""`oculis epp`: the router's replica (and tier) choice as a Gateway API endpoint picker (Envoy ext_proc over
gRPC), for an InferencePool behind any Gateway. Every bad input is one line and exit 2, before binding."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from oculis.router import ConfigError
from oculis_cli.inputs import InputError, finite_float, one_line, port_number, read_config
from oculis_cli.serve import bind_problem


def register(sub: Any) -> None:
    p = sub.add_parser("epp", help="serve an upstream's (or a route's) replica choice to a Gateway over Envoy ext_proc")
    p.add_argument("--config", required=True, type=Path, help="oculis-config.yaml (reloaded when it changes)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--upstream", metavar="NAME", help="pick among this self-hosted upstream's replicas")
    which.add_argument("--route", metavar="NAME", help="classify as the router does, choose the tier, rewrite the "
                       "body's model to the tier upstream's and pick among that upstream's replicas")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=9002, help="ext_proc and gRPC health (default 9002, GIE's)")
    p.add_argument("--metrics-port", type=port_number, default=9090, help="Prometheus metrics (0: off)")
    p.add_argument("--fallbacks", type=int, default=0, metavar="K",
                   help="also list up to K other replicas after the pick, least loaded first, for a proxy that "
                   "walks the list on retries (GIE gateways); 0 (default): one ip:port, which Envoy's ORIGINAL_DST "
                   "cluster needs (it refuses a list)")
    p.add_argument("--shed-waiting", type=finite_float, metavar="N",
                   help="answer 429 when every replica that may serve has N or more requests waiting (default: "
                   "never shed)")
    p.add_argument("--endpoints", type=Path, metavar="FILE",
                   help="endpoint map {HOST: {ports: [...]}} (as oculis serve): base_url hosts served at 127.0.0.1 "
                   "ports")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(run=run)


def _fail(message: str) -> int:
    print(f"oculis epp: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    try:
        read_config(args.config)  # refuse a bad file before binding anything
    except InputError as exc:
        return _fail(str(exc))
    if args.fallbacks < 0:
        return _fail(f"--fallbacks {args.fallbacks} is negative; give 0 or more")
    if args.shed_waiting is not None and args.shed_waiting <= 0:
        return _fail(f"--shed-waiting {args.shed_waiting:g} must be positive (leave it out to never shed)")
    if args.port and args.port == args.metrics_port:
        return _fail(f"--metrics-port {args.metrics_port} is also --port; give another port, or 0 to turn metrics off")
    if args.endpoints is not None:
        from oculis_router.endpoints import EndpointsError, load_endpoints

        try:
            load_endpoints(args.endpoints)
        except EndpointsError as exc:
            return _fail(str(exc))
    from prometheus_client import start_http_server

    from oculis_router.epp.core import Picker, target_problem
    from oculis_router.epp.server import serve
    from oculis_router.metrics import Metrics
    from oculis_router.state import ConfigHolder

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    metrics = Metrics()
    # Built quietly: its warnings are the router's (an API key missing for a provider the picker never calls),
    # and a refusal below must stay one line.
    logging.disable(logging.WARNING)
    try:
        holder = ConfigHolder(args.config, metrics)
    except (ConfigError, ValueError) as exc:
        return _fail(f"{args.config}: {one_line(exc)}")
    except OSError as exc:
        return _fail(f"{args.config}: cannot be read: {exc.strerror or exc}")
    finally:
        logging.disable(logging.NOTSET)
    if (why := target_problem(holder, args.upstream, args.route)) is not None:
        return _fail(why)
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        problem = bind_problem(args.host, port, flag) if port else None
        if problem is not None:
            print(f"oculis epp: {problem[1]}", file=sys.stderr)
            return problem[0]
    picker = Picker(holder, metrics, upstream=args.upstream, route=args.route, fallbacks=args.fallbacks,
                    shed_waiting=args.shed_waiting)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
    asyncio.run(serve(picker, args.host, args.port, endpoints=args.endpoints))
    return 0
