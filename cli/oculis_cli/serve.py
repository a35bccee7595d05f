"""`oculis serve`: the router, standalone, from an `oculis-config.yaml` (reloaded on change)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from oculis import ConfigError, load_config


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible router from a config file")
    p.add_argument("--config", required=True, type=Path, help="oculis-config.yaml (reloaded when it changes)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8080)
    p.add_argument("--metrics-port", type=port_number, default=9090, help="Prometheus metrics (0: off)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--wait-for-config", action="store_true",
                   help="if the config file does not exist yet, start anyway: not ready (503) until it appears")
    p.add_argument("--client-keys-env", metavar="VAR",
                   help="accept only clients whose bearer key is listed (comma-separated) in this environment "
                   "variable; overrides the config's server.client_keys_env")
    p.add_argument("--shutdown-grace", type=float, default=120, metavar="SECONDS",
                   help="after SIGTERM, how long in-flight requests and streams may take to finish (default 120)")
    p.set_defaults(run=run)


def port_number(raw: str) -> int:
    if not raw.isdigit() or int(raw) > 65535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port; give 0-65535")
    return int(raw)


def run(args: argparse.Namespace) -> int:
    try:
        if not (args.wait_for_config and not args.config.exists()):
            load_config(args.config)  # refuse a bad file before binding anything
    except ConfigError as exc:
        print(f"oculis serve: {exc}", file=sys.stderr)
        return 2
    if args.client_keys_env is not None and not args.client_keys_env.isidentifier():
        print(f"oculis serve: --client-keys-env {args.client_keys_env!r} is not an environment variable name",
              file=sys.stderr)
        return 2
    if args.shutdown_grace < 0:
        print(f"oculis serve: --shutdown-grace {args.shutdown_grace:g} is negative; give seconds >= 0", file=sys.stderr)
        return 2
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        if port and not port_free(args.host, port):
            print(f"oculis serve: {flag} {port}: {args.host}:{port} is already in use; stop what holds it "
                  f"(`ss -ltnp 'sport = :{port}'`) or pick another {flag}", file=sys.stderr)
            return 1
    import uvicorn
    from prometheus_client import start_http_server

    from oculis_router.app import build_app
    from oculis_router.metrics import Metrics

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    metrics = Metrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
    app = build_app(config_path=args.config, metrics=metrics, wait_for_config=args.wait_for_config,
                    client_keys_env=args.client_keys_env)
    # On SIGTERM (a rolling restart) uvicorn stops accepting, lets in-flight requests and streams
    # finish for up to --shutdown-grace seconds, then exits: no answer is cut short by a restart.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                loop="uvloop", http="httptools", backlog=4096, timeout_graceful_shutdown=args.shutdown_grace)
    return 0


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
