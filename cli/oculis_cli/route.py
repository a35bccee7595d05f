"""`oculis route score`: score JSON lines from stdin with exactly the router's classifier path.

Each input line is `{"prompt": str}` or `{"messages": [...]}`; each output line, in order, is
`{"complexity": float, "confidence": float, "tier": str}`, or `{"error": ...}` for a bad line
(then the exit code is 1). A bad config or route exits 2 before reading input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from oculis import ConfigError, load_config


def register(sub: Any) -> None:
    route = sub.add_parser("route", help="inspect how a route classifies and tiers prompts")
    route_sub = route.add_subparsers(dest="route_command", required=True, metavar="COMMAND")
    score = route_sub.add_parser("score", help="score JSON lines from stdin: complexity, confidence, tier")
    score.add_argument("--config", required=True, help="oculis-config.yaml")
    score.add_argument("--route", required=True, help="route name in the config")
    score.set_defaults(run=run_score)


def run_score(args: argparse.Namespace, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    try:
        route = load_config(args.config).route(args.route)
    except ConfigError as exc:
        print(f"oculis route score: {exc}", file=sys.stderr)
        return 2
    from oculis_router.decide import RouteScorer  # the router's own path; loads the model once

    try:
        scorer = RouteScorer(route)
    except ValueError as exc:
        print(f"oculis route score: routes[{route.name}].classifier.model: {exc}", file=sys.stderr)
        return 2
    failed = False
    for lineno, line in enumerate(stdin, 1):
        if not line.strip():
            continue
        try:
            payload = json.loads(line)
            if not isinstance(payload, dict):
                raise ValueError("expected a JSON object")
            c, decision = scorer.score(payload)
            out: dict[str, Any] = {"complexity": c.complexity, "confidence": c.confidence, "tier": decision.tier.name}
        except (ValueError, TypeError) as exc:
            failed = True
            out = {"error": f"line {lineno}: {exc}"}
        stdout.write(json.dumps(out) + "\n")
        stdout.flush()
    return 1 if failed else 0
