"""`oculis cache advise [--upstream U] [--write-multiplier W --read-multiplier R]`: whether provider
prompt caching pays for the observed traffic (oculis_measure.cache.advise decides)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO
from urllib.parse import urlsplit

from oculis_cli import checks_output as out
from oculis_cli.clusterinputs import window_inputs
from oculis_cli.cost import add_window_flags
from oculis_cli.cost_sources import (
    EXIT_USAGE,
    Catalog,
    SourceError,
    add_source_flags,
    open_prometheus,
)
from oculis_cli.inputs import finite_float
from oculis_measure.cache import advise as core


def register(sub: Any) -> None:
    cache = sub.add_parser("cache", help="prompt caching: `oculis cache advise`")
    cache_sub = cache.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    p = cache_sub.add_parser("advise", help="break-even hits per cache write, and whether caching pays here")
    p.add_argument("--upstream", action="append", default=[], help="upstream to advise on (repeatable; default: "
                   "every upstream with prompt tokens in the window)")
    p.add_argument("--write-multiplier", type=finite_float, metavar="W",
                   help="cache-write price / input price (Anthropic 5m: 1.25, 1h: 2.0; default: from pricing)")
    p.add_argument("--read-multiplier", type=finite_float, metavar="R",
                   help="cache-read price / input price (Anthropic: 0.1; default: from pricing)")
    p.add_argument("--no-traffic", action="store_true", help="only the break-even arithmetic, no Prometheus")
    add_window_flags(p)
    add_source_flags(p)
    out.add_output_flag(p)
    p.set_defaults(run=run)


def _given(args: argparse.Namespace) -> core.Multipliers | None:
    """Both multipliers from the flags; None when neither or only one is given (the other then comes
    from each upstream's pricing: _one)."""
    if args.write_multiplier is None or args.read_multiplier is None:
        return None
    return core.Multipliers(args.write_multiplier, args.read_multiplier, "--write-multiplier/--read-multiplier")


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    given = _given(args)
    for flag, v in (("--write-multiplier", args.write_multiplier), ("--read-multiplier", args.read_multiplier)):
        if v is not None and v < 0:
            print(f"oculis cache advise: {flag} {v:g} is negative; give a price ratio such as 1.25", file=sys.stderr)
            return EXIT_USAGE
    if args.no_traffic:
        if given is None:
            missing = " and ".join(f for f, v in (("--write-multiplier", args.write_multiplier),
                                                  ("--read-multiplier", args.read_multiplier)) if v is None)
            print(f"oculis cache advise: --no-traffic needs {missing} too (no upstream's pricing to take "
                  "it from), e.g. --write-multiplier 1.25 --read-multiplier 0.1", file=sys.stderr)
            return EXIT_USAGE
        reports = [core.advise(",".join(args.upstream) or "-", given, None, 0.0)]
        return emit({"window": None, "upstreams": reports}, args.output, stdout)
    got = window_inputs(args, "cache advise")
    if isinstance(got, int):
        return got
    t0, t1, catalog, c = got.t0, got.t1, got.catalog, got.counters
    names = args.upstream or sorted(u for u, v in c.prompt_tokens.items() if v > 0)
    known = {u.name for u in catalog.config.upstreams}
    unknown = [u for u in names if u not in known]
    if unknown:
        print(f"oculis cache advise: --upstream {unknown[0]} is not an upstream of {catalog.source}; choose one of "
              f"{', '.join(sorted(known))}", file=sys.stderr)
        return EXIT_USAGE
    reports = []
    for name in names:
        up = next(u for u in catalog.config.upstreams if u.name == name)
        if up.provider == "vllm":  # the engines' counters whatever the flags (QA3 Part 2 #6)
            try:
                labels = {name, up.model or name}
                alike = sorted(u.name for u in catalog.config.upstreams if u.provider == "vllm" and u.name != name
                               and labels & {u.name, u.model or u.name})
                with open_prometheus(args) as prom:
                    reports.append(_self_hosted(prom, name, up.model, t0.timestamp(), t1.timestamp(),
                                                str(urlsplit(str(up.base_url)).netloc) if alike else None, alike,
                                                core.self_hosted_multipliers(args.write_multiplier,
                                                                             args.read_multiplier),
                                                catalog.pricing[name].input_per_mtok))
            except SourceError as exc:
                print(f"oculis cache advise: {exc}", file=sys.stderr)
                return exc.code
            continue
        try:
            reports.append(_one(catalog, name, given, c, args.write_multiplier, args.read_multiplier))
        except ValueError as exc:
            print(f"oculis cache advise: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from oculis_measure.route.window import describe_window

    return emit({"window": describe_window(t0, t1), "upstreams": reports}, args.output, stdout)


def _self_hosted(prom: Any, name: str, model: str | None, start: float, end: float, instance: str | None = None,
                 alike: list[str] | None = None, m: core.Multipliers = core.SELF_HOSTED,
                 input_per_mtok: float = 0.0) -> dict[str, Any]:
    """The engines' prefix-cache token counters for this upstream: vLLM labels them with the served
    model name (the upstream's name in a cluster, its `model` in a standalone config). When other
    upstreams serve the same model name (`alike`), the series are narrowed to the scrape target at the
    upstream's base_url (`instance`); if none matches, the figure pools every engine and says so."""
    from oculis_measure.prom import PromError

    def grown(metric: str, where: str = "") -> float | None:
        """Growth over the window per engine series (`deltas`: an engine pod that stopped before the
        window's end, scaled to zero or replaced, still counts), summed; None when none was scraped."""
        found: list[float] = []
        for n in sorted({name, model or name}):  # exact label matches (a PromQL string is JSON-quoted text)
            found += prom.deltas(f"{metric}{{model_name={json.dumps(n)}{where}}}", ("model_name", "instance", "pod"),
                                 start, end).values()
        return sum(found) if found else None

    try:
        where = f", instance={json.dumps(instance)}" if instance else ""
        hits, queries = grown("vllm:prefix_cache_hits_total", where), grown("vllm:prefix_cache_queries_total", where)
        matched = bool(where) and queries is not None
        if where and not matched:
            hits, queries = grown("vllm:prefix_cache_hits_total"), grown("vllm:prefix_cache_queries_total")
    except PromError as exc:
        raise SourceError(str(exc), 5) from None
    out = core.advise_self_hosted(name, hits, queries, m, input_per_mtok)
    if alike:
        out["engines"] = (f"matched by instance {instance} (the upstream's base_url): upstreams {', '.join(alike)} "
                          "serve the same model name" if matched else
                          f"POOLED: upstreams {', '.join([name, *alike])} serve the same model name and no engine "
                          f"series has instance {instance}, so this figure is all their engines together")
        out["reason"] += f"; engines {out['engines']}"
    return out


def _one(catalog: Catalog, name: str, given: core.Multipliers | None, c: Any,
         write: float | None = None, read: float | None = None) -> dict[str, Any]:
    """One upstream's advice; a multiplier given alone (`write` or `read`) is used with the other from the
    upstream's pricing, and the report says which came from where."""
    pricing = catalog.pricing[name]
    m = given or core.multipliers_from_pricing(pricing, name)
    if given is None and (write is not None or read is not None):
        flag = "--write-multiplier" if write is not None else "--read-multiplier"
        m = core.Multipliers(m.write if write is None else write, m.read if read is None else read,
                             f"{flag}, the other from upstream {name}'s pricing")
    up = next(u for u in catalog.config.upstreams if u.name == name)
    # Only Anthropic reports cache writes: elsewhere a 0 means "not reported", not "nothing written".
    writes = c.cache_write_tokens.get(name) if up.provider == "anthropic" else None
    obs = core.Observed(c.prompt_tokens.get(name, 0.0), c.cached_tokens.get(name, 0.0), writes)
    out = core.advise(name, m, obs, pricing.input_per_mtok)
    if up.provider == "anthropic":  # a TTL to choose: say which one the observed reuse pays for
        out |= core.recommend_ttl(m.read, out.get("hits_per_write"),
                                  exact=not str(out.get("hits_per_write_basis", "")).startswith("lower bound"))
    return out


def emit(rep: dict[str, Any], fmt: str, stdout: TextIO) -> int:
    ups = rep["upstreams"]
    if len(ups) == 1:  # one upstream: its fields at the top level (break_even_hits, min_hits, ...), once
        rep = {**ups[0], "window": rep["window"]}
    if out.dump(rep, fmt, stdout):
        return 0
    if fmt == "csv":
        out.write_csv(ups, stdout)
        return 0
    if rep["window"]:
        out.line(f"window {rep['window']}", stdout)
    cols = ["upstream", "w", "r", "break-even h >", "min hits", "cached-token share", "hits/write", "verdict"]
    rows = [[u["upstream"], f"{u['write_multiplier']:g}", f"{u['read_multiplier']:g}",
             "-" if u["break_even_hits"] is None else f"{u['break_even_hits']:.3f}", u["min_hits"],
             out.pct(u.get("cache_read_token_share", u.get("prefix_hit_token_share"))), u.get("hits_per_write"),
             u["verdict"]] for u in ups]
    out.table(None, cols, rows, stdout, right=cols[1:7])
    for u in ups:
        out.line(f"{u['upstream']}: {u['reason']} (w, r from {u['multipliers_from']})", stdout)
        if "recommended_ttl" in u:
            out.line(f"{u['upstream']}: prompt_cache.ttl {u['recommended_ttl'] or '(no reuse measured)'} "
                     f"(break-even 5m {u['break_even_by_ttl']['5m']}, 1h {u['break_even_by_ttl']['1h']})", stdout)
    out.line("rule: caching pays when hits per write h > (w - 1) / (1 - r)", stdout)
    return 0
