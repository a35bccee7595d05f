"""`oculis serve`: the router, standalone, from an `oculis-config.yaml` (reloaded on change)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from oculis.router import ConfigError, redis_url_problem
from oculis_cli.inputs import InputError, finite_float, one_line, port_number, read_config

DEFAULT_METRICS_PORT = 9464


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible router from a config file")
    p.add_argument("--config", required=True, type=Path, help="oculis-config.yaml (reloaded when it changes)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8080)
    # Not 9090: that is Prometheus's own default port (and the analysis commands' --prometheus-url), so a local
    # Prometheus started with its defaults clashed with the router (QA3 Part 2 #11). 9464: the usual exporter port.
    p.add_argument("--metrics-port", type=port_number, default=DEFAULT_METRICS_PORT,
                   help=f"Prometheus metrics (0: off; default {DEFAULT_METRICS_PORT}, apart from Prometheus's 9090)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--wait-for-config", action="store_true",
                   help="if the config file does not exist yet, start anyway: not ready (503) until it appears")
    p.add_argument("--client-keys-env", metavar="VAR",
                   help="accept only clients whose bearer key is listed (comma-separated) in this environment "
                   "variable; overrides the config's server.client_keys_env")
    p.add_argument("--endpoints", type=Path, metavar="FILE",
                   help="endpoint map {HOST: {ports: [...]}} (re-read on change): dial those base_url hosts at "
                   "127.0.0.1 ports, e.g. the sandbox cluster's simulated pods (e2e/cluster serve-pods)")
    p.add_argument("--redis-url", default=os.environ.get("OCULIS_REDIS_URL") or None, metavar="URL",
                   help="redis://[:password@]host:port/db shared by every replica: the response cache and the rate "
                   "limiter both use it, overriding the config's server section (the operator renders none); "
                   "default $OCULIS_REDIS_URL")
    p.add_argument("--server-settings", default=os.environ.get("OCULIS_SERVER_SETTINGS") or None, metavar="JSON",
                   help='server sections replacing the config\'s, e.g. {"batch": {"enabled": true}, "flowControl": '
                   '{"enabled": true}} (the chart\'s router.batch and router.flowControl; the operator renders no '
                   "server section); default $OCULIS_SERVER_SETTINGS")
    p.add_argument("--shutdown-grace", type=finite_float, default=120, metavar="SECONDS",
                   help="after SIGTERM, how long in-flight requests and streams may take to finish (default 120)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if not (args.wait_for_config and not args.config.exists()):
            read_config(args.config)  # refuse a bad file before binding anything
    except InputError as exc:
        print(f"oculis serve: {exc}", file=sys.stderr)
        return 2
    if args.endpoints is not None:
        from oculis_router.endpoints import EndpointsError, load_endpoints

        try:
            load_endpoints(args.endpoints)
        except EndpointsError as exc:
            print(f"oculis serve: {exc}", file=sys.stderr)
            return 2
    if args.client_keys_env is not None and not args.client_keys_env.isidentifier():
        print(f"oculis serve: --client-keys-env {args.client_keys_env!r} is not an environment variable name",
              file=sys.stderr)
        return 2
    if args.redis_url is not None and (why := redis_url_problem(args.redis_url, "--redis-url")):
        print(f"oculis serve: {why}", file=sys.stderr)
        return 2
    sections = None
    if args.server_settings is not None:
        from oculis_router.state import server_settings

        try:
            sections = server_settings(args.server_settings)
        except ValueError as exc:
            print(f"oculis serve: {exc}", file=sys.stderr)
            return 2
    if args.shutdown_grace < 0:
        print(f"oculis serve: --shutdown-grace {args.shutdown_grace:g} is negative; give seconds >= 0", file=sys.stderr)
        return 2
    if args.port and args.port == args.metrics_port:  # the second bind would fail after the preflight passed
        print(f"oculis serve: --metrics-port {args.metrics_port} is also --port; give another port, or 0 to turn "
              "metrics off", file=sys.stderr)
        return 2
    for flag, port in (("--port", args.port), ("--metrics-port", args.metrics_port)):
        problem = bind_problem(args.host, port, flag) if port else None
        if problem is not None:
            code, message = problem
            print(f"oculis serve: {message}", file=sys.stderr)
            return code
    import uvicorn
    from prometheus_client import start_http_server

    from oculis_router.app import build_app
    from oculis_router.metrics import Metrics

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    metrics = Metrics()
    try:  # builds the config (its classifier heads, decision-log sinks, stores): refused before binding anything
        app = build_app(config_path=args.config, metrics=metrics, wait_for_config=args.wait_for_config,
                        client_keys_env=args.client_keys_env, endpoints=args.endpoints, redis_url=args.redis_url,
                        server=sections)
    except (ConfigError, ValueError) as exc:  # the file changed since the preflight, or a file it reads is bad
        print(f"oculis serve: {args.config}: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"oculis serve: {args.config}: cannot be read: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
    # On SIGTERM (a rolling restart) uvicorn stops accepting, lets in-flight requests and streams
    # finish for up to --shutdown-grace seconds, then exits: no answer is cut short by a restart.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                loop="uvloop", http="httptools", backlog=4096, timeout_graceful_shutdown=args.shutdown_grace)
    return 0


def bind_problem(host: str, port: int, flag: str = "--port") -> tuple[int, str] | None:
    """Why `host:port` cannot be listened on, as (exit code, message), or None when it can.

    Told apart because the fixes differ: a host that does not resolve or is not an address of this
    machine is a bad argument (2); a port another process holds is a busy machine (1)."""
    try:
        addrs = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        return 2, f"--host {host!r} does not resolve ({reason}); give an address of this machine such as 127.0.0.1"
    unavailable: OSError | None = None
    bound = 0
    for family, kind, proto, _, addr in addrs:  # every address the server will bind, as asyncio's server does
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                s.bind(addr)
                bound += 1
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    if exc.errno == errno.EADDRINUSE:
                        return 1, (f"{flag} {port}: {host}:{port} is already in use; stop what holds it "
                                   f"(`ss -ltnp 'sport = :{port}'`) or pick another {flag}")
                    return 1, f"{flag} {port}: cannot listen on {host}:{port}: {exc.strerror}"
                unavailable = exc  # asyncio skips such an address (its family may be off) and binds the rest
    if not bound and unavailable is not None:
        return 2, (f"cannot bind --host {host!r} ({unavailable.strerror}): not an address of this machine; give "
                   "127.0.0.1, 0.0.0.0 or an address of one of its interfaces")
    return None
