"""`oculis route score` and `oculis route analyze`: JSON lines from stdin through exactly the
router's classifier path.

Each input line is `{"prompt": str}` or `{"messages": [...]}`. `score` writes one line per input, in
order: `{"complexity": float, "confidence": float, "tier": str}`, or `{"error": ...}` for a bad line
(then the exit code is 1). `analyze` summarises a sample of traffic (tier shares, complexity
quantiles, the routed-only vs cascade cost of escalating on the answer: oculis_measure.route.cascade) and, with
`--shares`, suggests thresholds for a wanted split; bad lines are reported on
stderr and give exit 1. A bad config, route or `--shares` exits 2 before reading input.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from oculis import ConfigError, Route
from oculis_cli.inputs import InputError, read_config


def register(sub: Any) -> None:
    route = sub.add_parser("route", help="inspect how a route classifies and tiers prompts")
    route_sub = route.add_subparsers(dest="route_command", required=True, metavar="COMMAND")
    score = route_sub.add_parser("score", help="score JSON lines from stdin: complexity, confidence, tier")
    score.add_argument("--config", required=True, type=Path, help="oculis-config.yaml")
    score.add_argument("--route", required=True, help="route name in the config")
    score.set_defaults(run=run_score)
    analyze = route_sub.add_parser("analyze", help="a route's tiers and cost over a window of its metrics "
                                   "(--since/--from), or a traffic sample's tier split (--sample, stdin)")
    analyze.add_argument("--config", type=Path, help="oculis-config.yaml (with --since: default the cluster's "
                         "routes in --namespace)")
    analyze.add_argument("--route", required=True, help="route name in the config")
    analyze.add_argument("--sample", type=Path, help="JSON lines of prompts to score (default: stdin)")
    analyze.add_argument("--shares", help="wanted share per tier, in tier order, e.g. 0.5,0.3,0.2")
    analyze.add_argument("-o", "--output", choices=["table", "text", "json", "yaml", "csv"], default="table",
                         help="table (default; text is the same), json, yaml or csv")
    from oculis_cli.cost import add_window_flags  # Prometheus mode: `--since 7d` or `--from/--to`

    add_window_flags(analyze)
    analyze.add_argument("--answer-escalation-rate", metavar="P", help="share (0..1) of the checked tiers' answers "
                         "replaced by the next tier's (escalation.on_answer), for the cascade cost; default: measured "
                         "over --since, else 0")
    analyze.add_argument("--output-tokens", type=int, default=256, metavar="N", help="a sample's assumed output "
                         "tokens per answer, for its cost (default 256; a --since window uses the measured ones)")
    analyze.add_argument("--namespace", "-n", default="default", help="namespace of the routes (cluster mode)")
    analyze.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    analyze.add_argument("--prometheus-url", help="Prometheus base URL (default: OCULIS_PROMETHEUS_URL or "
                         "http://127.0.0.1:9090)")
    analyze.set_defaults(run=run_analyze)


def route_scorer(route: Route, config_path: Path | None) -> Any:
    """The route's RouteScorer as the router builds it: a relative classifier.head_path is looked up in
    the config file's folder (`config_path`; None for a config rendered from the cluster), not in the
    working directory, so `oculis route`/`eval` score with the head the router loads. ValueError names
    the field when the head or the model cannot be loaded."""
    from oculis_router.decide import RouteScorer  # the router's own path; loads the model once

    field = "head_path" if route.classifier.head_path else "model"
    try:
        return RouteScorer(route, config_path.parent if config_path is not None else None)
    except ValueError as exc:
        raise ValueError(f"routes[{route.name}].classifier.{field}: {exc}") from None


def load_scorer(args: argparse.Namespace, command: str) -> Any:
    """The route's RouteScorer, or None after printing why (exit 2)."""
    try:
        route = read_config(args.config).route(args.route)
        return route_scorer(route, args.config)
    except (InputError, ConfigError, ValueError) as exc:
        print(f"oculis route {command}: {exc}", file=sys.stderr)
        return None


def scored_lines(scorer: Any, stdin: TextIO) -> Iterator[tuple[int, Any]]:
    """(line number, (classification, decision) or the error message) per non-empty input line."""
    for lineno, line in enumerate(stdin, 1):
        if not line.strip():
            continue
        try:
            payload = json.loads(line)
            if not isinstance(payload, dict):
                raise ValueError("expected a JSON object")
            yield lineno, scorer.score(payload)
        except RecursionError:  # json and the classifier recurse into nested values
            yield lineno, f"line {lineno}: nested too deeply; send a flat {{prompt}} or {{messages}} object"
        except (ValueError, TypeError) as exc:
            yield lineno, f"line {lineno}: {exc}"


def run_score(args: argparse.Namespace, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    scorer = load_scorer(args, "score")
    if scorer is None:
        return 2
    failed = False
    for _, result in scored_lines(scorer, stdin):
        if isinstance(result, str):
            failed = True
            out: dict[str, Any] = {"error": result}
        else:
            c, decision = result
            out = {"complexity": c.complexity, "confidence": c.confidence, "tier": decision.tier.name}
        stdout.write(json.dumps(out) + "\n")
        stdout.flush()
    return 1 if failed else 0


def cascade_flags(args: argparse.Namespace) -> float | str | None:
    """--answer-escalation-rate (None when not given) and --output-tokens checked; a str: the error."""
    from oculis_measure.route import cascade

    try:
        cascade.parse_output_tokens(args.output_tokens)
        return None if args.answer_escalation_rate is None else cascade.parse_rate(args.answer_escalation_rate)
    except ValueError as exc:
        return str(exc)


def run_analyze(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    # Looked up per call, not bound at import: a caller (or a test) that swaps sys.stdout is written to.
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    rate = cascade_flags(args)
    if isinstance(rate, str):
        print(f"oculis route analyze: {rate}", file=sys.stderr)
        return 2
    if args.since is not None or args.start is not None:
        from oculis_cli import route_window

        # The router's counters hold no per-request complexity to place thresholds by: flags that need a sample
        # were silently ignored over a window (QA3 Part 2 #13).
        for flag, value in (("--shares", args.shares), ("--sample", args.sample)):
            if value is not None:
                print(f"oculis route analyze: {flag} {value} needs a sample to score, not a metrics window: drop "
                      "--since/--from, and give --sample FILE (or prompts on stdin) with --shares", file=sys.stderr)
                return 2

        return route_window.run(args)  # writes to the current sys.stdout (a test's capture too)
    if args.config is None:
        print("oculis route analyze: give --config FILE to score a sample, or --since 7d for the route's metrics",
              file=sys.stderr)
        return 2
    if args.sample is not None:
        try:
            from oculis_cli.inputs import read_text

            stdin = io.StringIO(read_text(args.sample, "--sample"))
        except InputError as exc:
            print(f"oculis route analyze: {exc}", file=sys.stderr)
            return 2
    scorer = load_scorer(args, "analyze")
    if scorer is None:
        return 2
    # numpy: only where the router's classifier is installed
    from oculis_measure.route import analysis as route_analysis

    route = scorer.route
    shares = None
    if args.shares is not None:
        try:
            shares = route_analysis.parse_shares(args.shares, len(route.tiers))
        except ValueError as exc:
            print(f"oculis route analyze: --shares: {exc}", file=sys.stderr)
            return 2
    scored, errors = [], []
    for _, result in scored_lines(scorer, stdin):
        if isinstance(result, str):
            errors.append(result)
        else:
            c, d = result
            scored.append(route_analysis.Scored(c.complexity, c.confidence, d.tier.name, d.escalated,
                                                d.index, c.prompt_tokens))
    for err in errors[:20]:
        print(f"oculis route analyze: skipped {err}", file=sys.stderr)
    report = route_analysis.analyze(route, scored, shares)
    if scored:
        upstreams = {u.name: u for u in read_config(args.config).upstreams}  # read fine a moment ago
        report["cascade"] = route_analysis.sample_cascade(route, upstreams, scored, rate, args.output_tokens)
    if args.output == "json":
        stdout.write(json.dumps(report, indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        stdout.write(yaml.safe_dump(report, sort_keys=False))
    elif args.output == "csv":
        from oculis_cli.checks_output import write_csv

        write_csv(report.get("tiers", []), stdout)
    else:
        stdout.write(render_text(route.name, report))
    return 1 if errors else 0


def render_text(name: str, report: dict[str, Any]) -> str:
    if not report["prompts"]:
        return f"route {name}: no prompts read\n"
    lines = [f"route {name}: {report['prompts']} prompts"]
    for t in report["tiers"]:
        lines.append(f"  {t['tier']:<12} -> {t['upstream']:<24} {t['share']:7.1%}"
                     f"  (escalated here on low confidence: {t['escalated_share']:.1%})")
    q = report["complexity_quantiles"]
    lines.append("  complexity   " + "  ".join(f"{k} {v:.3f}" for k, v in q.items()))
    lines.append(f"  confidence below the escalation threshold: {report['low_confidence_share']:.1%}")
    if "suggested_complexity_below" in report:
        lines.append("  for the wanted split, set:")
        suggested = report["suggested_complexity_below"]
        lines += [f"    {tier}: match.complexity_below: {v}" if v is not None
                  else f"    {tier}: match: {{}} (no complexity rule: even complexity 1.0 stays here)"
                  for tier, v in suggested.items()]
        lines.append(f"  ({report['note']})")
    text = "\n".join(lines) + "\n"
    if "cascade" in report:
        from oculis_cli.checks_output import cascade_text

        text += cascade_text(report["cascade"])
    return text
