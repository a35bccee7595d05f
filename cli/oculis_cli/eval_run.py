"""`oculis eval run --route R --suite FILE --by-tier [--tolerance-pp 2.0]`: a route's accuracy per
tier against the all-strongest-tier baseline, with a paired verdict (oculis_measure.eval.core decides).

Offline (the default): each suite line carries per-upstream outcomes, and the route's tier for each
prompt comes from exactly the router's classifier path (RouteScorer), so the accuracy is the one the
routing implies. Online (`--url`): each prompt is sent to the router under the route's name and to the
strongest tier's upstream by name, and both answers are graded (exact, regex or a JSON field).
Both report the cascade cost of escalating on the answer next to the routed-only cost (oculis_measure.eval.core,
oculis_measure.route.cascade): offline with an oracle verifier (and the accuracy it would reach), online with the rate
the router's x-oculis-escalation-reason headers show.

Exit codes: 0 PASS, 3 FAIL, 4 INCONCLUSIVE, 2 bad input, 5 router unreachable."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO

from oculis import Route
from oculis_cli import checks_output as out
from oculis_cli.clusterinputs import catalog_route, emit
from oculis_cli.cost_sources import EXIT_UNREACHABLE, EXIT_USAGE, SourceError, add_source_flags
from oculis_cli.inputs import InputError, finite_float, read_text
from oculis_measure.eval import core
from oculis_measure.route import cascade


def register(sub: Any) -> None:
    ev = sub.add_parser("eval", help="quality of a route's tiers: `oculis eval run`")
    ev_sub = ev.add_subparsers(dest="eval_command", required=True, metavar="COMMAND")
    p = ev_sub.add_parser("run", help="per-tier accuracy vs the all-strongest baseline, with a McNemar verdict")
    p.add_argument("--route", required=True, help="route name")
    p.add_argument("--suite", required=True, type=Path, help="JSON lines: {prompt|messages, outcomes} offline, "
                   "{prompt|messages, expected, match?, field?} online")
    p.add_argument("--by-tier", action="store_true", help="a row per tier (always computed; kept for the spelling)")
    p.add_argument("--tolerance-pp", type=finite_float, default=2.0,
                   help="largest accuracy drop allowed, in percentage points (default 2.0)")
    p.add_argument("--skip-bad-lines", action="store_true", help="evaluate the good lines of a suite with bad ones")
    p.add_argument("--url", help="online mode: the router's base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="online: environment variable with the router "
                   "client key (default OPENAI_API_KEY; unset sends none)")
    p.add_argument("--concurrency", type=int, default=8, help="online: requests in flight (default 8)")
    p.add_argument("--max-tokens", type=int, default=256, help="online: max_tokens of each request")
    p.add_argument("--output-tokens", type=int, default=256, metavar="N", help="offline: assumed output tokens per "
                   "answer, for the cascade cost (default 256; online uses the answers' usage)")
    add_source_flags(p, prometheus=False)
    out.add_output_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    if args.tolerance_pp < 0:
        print(f"oculis eval run: --tolerance-pp {args.tolerance_pp:g} is negative; give the allowed drop, e.g. 2.0",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        cascade.parse_output_tokens(args.output_tokens)
    except ValueError as exc:
        print(f"oculis eval run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    got = catalog_route(args, "eval run")
    if isinstance(got, int):
        return got
    route = got[1]
    upstreams = {u.name: u for u in got[0].config.upstreams}
    try:
        text = read_text(args.suite, "--suite")
    except InputError as exc:
        print(f"oculis eval run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    offline = args.url is None
    items, errors = core.parse_suite(text.splitlines(), offline)
    try:
        results, more = (offline_results(route, items, args.config) if offline
                         else online_results(route, items, args))
    except SourceError as exc:
        print(f"oculis eval run: {exc}", file=sys.stderr)
        return exc.code
    errors += more
    if errors:
        for e in errors[:20]:
            print(f"oculis eval run: --suite {args.suite}: {e}", file=sys.stderr)
        if len(errors) > 20:
            print(f"oculis eval run: ... and {len(errors) - 20} more bad lines", file=sys.stderr)
        if not args.skip_bad_lines:
            print(f"oculis eval run: {len(errors)} bad suite lines; fix them, or pass --skip-bad-lines to evaluate "
                  "the rest", file=sys.stderr)
            return EXIT_USAGE
    if not results:
        print(f"oculis eval run: --suite {args.suite} has no items to evaluate", file=sys.stderr)
        return EXIT_USAGE
    rep = core.summarise(results, [t.name for t in route.tiers], args.tolerance_pp)
    rep["route"], rep["mode"], rep["skipped_lines"] = route.name, "offline" if offline else "online", len(errors)
    rep["baseline"] = {"tier": route.tiers[-1].name, "upstream": route.tiers[-1].upstream}
    rep["cascade"] = (core.oracle_cascade(route, upstreams, results, args.output_tokens) if offline
                      else core.online_cascade(route, upstreams, results))
    if offline:  # the routing quality per kind needs each line's outcomes of the cheapest tier too
        from oculis_measure.eval import kinds

        rep["kinds"] = kinds.report(core.kind_items(results), route.tiers[0].name, route.tiers[-1].name)
        rep["decision"] = decide(route, upstreams, results, args.output_tokens, args.tolerance_pp, rep["cascade"])
    code = core.EXIT_CODES[rep["overall"]["verdict"]]
    emit(rep, args.output, stdout, "tiers", render)
    return code


def decide(route: Route, upstreams: dict[str, Any], results: list[core.Result], output_tokens: int,
           tolerance_pp: float, casc: dict[str, Any] | None) -> dict[str, Any]:
    """Fetches each row's costs by the router's formula and hands them to the pure decision."""
    from oculis_measure.eval import decision

    tiers, _ = cascade.tiers_for(route, upstreams, 0.0, False)
    rows = []
    for r in results:
        if r.complexity is None or not r.outcomes or r.outcomes[0] is None:
            continue
        req = cascade.Request(r.tier_index, r.prompt_tokens, output_tokens)
        rows.append(decision.Row(r.complexity, bool(r.outcomes[0]), r.baseline_correct, r.correct,
                                 cascade.attempt(tiers[0], req), cascade.attempt(tiers[-1], req),
                                 cascade.attempt(tiers[r.tier_index], req), r.kind))
    first, last = route.tiers[0].upstream, route.tiers[-1].upstream
    same = _model(upstreams, first) if first == last or _model(upstreams, first) == _model(upstreams, last) else None
    checked = route.escalation.on_answer is not None and casc is not None and casc.get("accuracy")
    pair = (float(casc["accuracy"]["cascade"]), float(casc["total"]["cascade_cost"])) if checked and casc else None
    return decision.decide(rows, tolerance_pp, same, pair)


def _model(upstreams: dict[str, Any], name: str) -> str | None:
    up = upstreams.get(name)
    model = getattr(up, "model", None) if up is not None else None
    return str(model) if model else name


def offline_results(route: Route, items: list[core.Item], config_path: Path | None = None
                    ) -> tuple[list[core.Result], list[str]]:
    """`config_path`: the --config file (a relative head_path is in its folder, as for the router)."""
    from oculis_cli.route import route_scorer  # the router's own classifier path

    try:
        scorer = route_scorer(route, config_path)
    except ValueError as exc:
        raise SourceError(str(exc), EXIT_USAGE) from None
    strongest = route.tiers[-1].upstream
    pairs = [(t.name, t.upstream) for t in route.tiers]
    results, errors = [], []
    for item in items:
        try:
            c, d = scorer.score(item.payload)
            results.append(core.offline_result(item, d.tier.name, d.tier.upstream, d.escalated, strongest,
                                               route.tiers[-1].name, d.index, c.prompt_tokens, pairs,
                                               c.complexity))
        except core.SuiteLineError as exc:
            errors.append(str(exc))
        except (ValueError, TypeError) as exc:
            errors.append(f"line {item.lineno}: {exc}")
    return results, errors


def online_results(route: Route, items: list[core.Item], args: argparse.Namespace
                   ) -> tuple[list[core.Result], list[str]]:
    import os

    import httpx

    from oculis_measure.bench.failures import api_base, diagnose, error_text

    key = os.environ.get(args.api_key_env)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    url = api_base(args.url) + "/v1/chat/completions"
    refused: list[tuple[str, str]] = []  # (error kind, server's message) of answers that were HTTP errors
    strongest = route.tiers[-1].upstream
    client = httpx.Client(timeout=120, headers=headers)

    def ask(item: core.Item, model: str) -> tuple[str, dict[str, str], dict[str, Any]]:
        messages = item.payload.get("messages") or [{"role": "user", "content": item.payload["prompt"]}]
        r = client.post(url, json={"model": model, "messages": messages, "temperature": 0,
                                   "max_tokens": args.max_tokens})
        if r.status_code != 200:
            refused.append((f"http_{r.status_code}", error_text(r.content)))
            raise ValueError(f"{model} answered HTTP {r.status_code}: {r.text[:200]}")
        data = r.json()
        content = data["choices"][0]["message"].get("content") or ""
        usage = data.get("usage")
        return str(content), dict(r.headers), usage if isinstance(usage, dict) else {}

    def one(item: core.Item) -> core.Result | str:
        try:
            answer, h, usage = ask(item, route.name)
            base, _, _ = ask(item, strongest)
        except httpx.TransportError as exc:
            raise SourceError(f"the router at {args.url} is unreachable ({type(exc).__name__}); start it or fix "
                              "--url", EXIT_UNREACHABLE) from None
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            return f"line {item.lineno}: {exc}"
        tokens = [v if isinstance(v, int) and not isinstance(v, bool) else 0
                  for v in (usage.get("prompt_tokens"), usage.get("completion_tokens"))]
        return core.Result(h.get("x-oculis-tier", "?"), h.get("x-oculis-escalated") == "true",
                           core.grade(answer, item), core.grade(base, item), prompt_tokens=tokens[0],
                           output_tokens=tokens[1], answer_escalated=h.get("x-oculis-escalation-reason") == "answer",
                           replaced=tuple(t for t in h.get("x-oculis-replaced-tiers", "").split(",") if t))

    with client, ThreadPoolExecutor(max(1, args.concurrency)) as pool:
        done = list(pool.map(one, items))
    results = [r for r in done if isinstance(r, core.Result)]
    if items and not results and refused and len({k for k, _ in refused}) == 1:
        # every item failed the same way: the server's refusal, not the suite's lines (fail loudly, one line)
        kind, detail = refused[0]
        d = diagnose(kind, len(items), len(items), args.url, route.name, args.api_key_env if key else None, detail)
        raise SourceError(d.line, d.exit_code)
    return results, [r for r in done if isinstance(r, str)]


def render(rep: dict[str, Any], stdout: TextIO) -> None:
    o = rep["overall"]
    cols = ["tier", "n", "accuracy", "baseline", "delta pp", "95% CI pp", "escalated", "verdict"]
    rows = [[t["name"], t["n"], _f(t["accuracy"]), _f(t["baseline_accuracy"]),
             "-" if t["delta_pp"] is None else f"{t['delta_pp']:+.2f}",
             f"[{t['ci_pp'][0]:+.1f}, {t['ci_pp'][1]:+.1f}]" if t.get("ci_pp") else "-",
             out.pct(t["escalated"]), t["verdict"] or "(baseline)"] for t in rep["tiers"]]
    rows.append(["overall", o["n"], _f(o["accuracy"]), _f(o["baseline_accuracy"]), f"{o['delta_pp']:+.2f}",
                 f"[{o['ci_pp'][0]:+.1f}, {o['ci_pp'][1]:+.1f}]", out.pct(o["escalation_rate"]), o["verdict"]])
    out.line(f"route {rep['route']} ({rep['mode']}), baseline: all {rep['baseline']['tier']} "
             f"({rep['baseline']['upstream']}), tolerance -{o['tolerance_pp']:g} pp", stdout)
    out.table(None, cols, rows, stdout, right=cols[1:7])
    out.line(f"escalation: {o['escalated']} of {o['escalation_denominator']}", stdout)
    if rep["skipped_lines"]:
        out.line(f"skipped {rep['skipped_lines']} bad suite lines", stdout)
    out.line(f"verdict {o['verdict']}: {o['reason']}", stdout)
    if rep.get("kinds"):
        render_kinds(rep["kinds"], stdout)
    if rep.get("decision"):
        render_decision(rep["decision"], stdout)
    casc = rep.get("cascade")
    if casc is not None:
        stdout.write(out.cascade_text(casc))
        acc = casc.get("accuracy")
        if acc is not None:
            out.line(f"accuracy: routed-only {acc['routed']:.3f}, cascade {acc['cascade']:.3f}, all-"
                     f"{rep['baseline']['tier']} {acc['all_strongest']:.3f} ({acc['rule']}; "
                     f"{acc['unknown_final_outcomes']} final outcomes unknown, counted wrong)", stdout)
            out.line(f"bounds: {casc['bounds']}", stdout)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def render_kinds(k: dict[str, Any], stdout: TextIO) -> None:
    """The routing quality per kind of traffic, and its verdict (WARN naming each kind the head is not
    shown to route better than random)."""
    cols = ["kind", "n", "weak acc", "strong acc", "APGR", "95% CI", "CPT(50%)", "verdict"]
    rows = [[r["kind"], r["scored"], _f(r["weak_accuracy"]), _f(r["strong_accuracy"]), _f(r["apgr"]),
             f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else "-", _f(r["cpt50"]), r["verdict"]]
            for r in k["rows"]]
    out.line(f"routing quality per kind: {k['weak_tier']} (cheapest) vs {k['strong_tier']} (strongest); "
             "random routing: APGR 0.500, CPT(50%) 0.500", stdout)
    out.table(None, cols, rows, stdout, right=cols[1:7])
    out.line(f"routing {k['verdict']}: {k['reason']}", stdout)


def _cell(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_decision(d: dict[str, Any], stdout: TextIO) -> None:
    """The alternatives' cost at matched quality and the verdict line (oculis_measure.eval.decision)."""
    if d["alternatives"]:
        unit = d.get("cost_unit", "$")
        cols = ["alternative", "accuracy", f"cost ({unit})", "strong share"]
        rows = [[a["name"], _cell(a["accuracy"], ".3f"), _cell(a["cost"], ".4f" if unit == "$" else ".0f"),
                 _cell(a["strong_share"], ".1%")] for a in d["alternatives"]]
        out.line(f"cost at matched quality ({d['rows']} rows with both tiers' outcomes; `-`: the suite cannot give it)",
                 stdout)
        out.table(None, cols, rows, stdout, right=cols[1:])
    for c in d["caveats"]:
        out.line(f"note: {c}", stdout)
    out.line(d["line"], stdout)
