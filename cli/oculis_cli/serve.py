"""`oculis serve`: the router, standalone, from an `oculis-config.yaml` (reloaded on change)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from oculis import ConfigError, load_config


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible router from a config file")
    p.add_argument("--config", required=True, type=Path, help="oculis-config.yaml (reloaded when it changes)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics (0: off)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        load_config(args.config)  # refuse a bad file before binding anything
    except ConfigError as exc:
        print(f"oculis serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn
    from prometheus_client import start_http_server

    from oculis_router.app import build_app
    from oculis_router.metrics import Metrics

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    metrics = Metrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
    app = build_app(config_path=args.config, metrics=metrics)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                loop="uvloop", http="httptools", backlog=4096)
    return 0
