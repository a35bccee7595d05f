"""What the reporting commands (`cost report`, `cache advise`, `route analyze --since`, `eval run`) read
before they compute: the window, the config (a --config file or the cluster's routes), the route, the
router's counters in Prometheus; and how they write a report. Each reader prints the command's one-line
error and returns its exit code instead of a value, so a command stops with `if isinstance(x, int)`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from oculis import ConfigError, Route
from oculis_cli import checks_output as out
from oculis_cli.cost_sources import EXIT_USAGE, Catalog, SourceError, counters, load_catalog, open_prometheus
from oculis_measure.cost.core import Counters
from oculis_measure.route import window as route_window_core


@dataclass(frozen=True)
class WindowInputs:
    t0: datetime
    t1: datetime
    catalog: Catalog
    counters: Counters
    route: Route | None  # with `route=True`: the --route of the catalog's config


def resolve_window(args: argparse.Namespace, command: str) -> tuple[datetime, datetime] | None:
    """--since / --from / --to (default the last 7 days); None after printing why."""
    try:
        since = "7d" if args.since is None and args.start is None else args.since
        return route_window_core.window(since, args.start, args.end, datetime.now(UTC))
    except ValueError as exc:
        print(f"oculis {command}: {exc}", file=sys.stderr)
        return None


def catalog_route(args: argparse.Namespace, command: str) -> tuple[Catalog, Route] | int:
    """The catalog and its --route, or the exit code after printing why."""
    try:
        catalog = load_catalog(args)
        return catalog, catalog.config.route(args.route)
    except SourceError as exc:
        print(f"oculis {command}: {exc}", file=sys.stderr)
        return exc.code
    except ConfigError as exc:
        print(f"oculis {command}: --route {exc}", file=sys.stderr)
        return EXIT_USAGE


def window_inputs(args: argparse.Namespace, command: str, route: bool = False) -> WindowInputs | int:
    """The window, the catalog (and with `route`, its --route: a bad one is refused before Prometheus is
    asked) and the router's counters over the window; or the exit code after printing why."""
    w = resolve_window(args, command)
    if w is None:
        return EXIT_USAGE
    t0, t1 = w
    chosen: Route | None = None
    if route:
        got = catalog_route(args, command)
        if isinstance(got, int):
            return got
        catalog, chosen = got
    try:
        if not route:
            catalog = load_catalog(args)
        with open_prometheus(args) as prom:
            c = counters(prom, t0, t1, args.router_selector)
    except SourceError as exc:
        print(f"oculis {command}: {exc}", file=sys.stderr)
        return exc.code
    return WindowInputs(t0, t1, catalog, c, chosen)


def emit(rep: dict[str, Any], output: str, stdout: TextIO, rows: str, render: Callable[[dict[str, Any], TextIO], None]
         ) -> None:
    """json/yaml as they are, csv the report's `rows` list, else the command's own rendering."""
    if out.dump(rep, output, stdout):
        return
    if output == "csv":
        out.write_csv(rep[rows], stdout)
        return
    render(rep, stdout)
