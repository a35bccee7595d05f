"""`oculis bench run`: load a route (or any OpenAI-compatible server) with a seeded workload, measure what
a user sees, join the engines' Prometheus counters over exactly the run window, and judge the run
against SLOs and a baseline.

The thin shell: arguments, the HTTP load (open-loop arrivals or a fixed concurrency, warm-up excluded,
in-flight requests drained), Prometheus, progress and output. Decisions live in oculis_measure.bench: workload (what
to send) and stats (metrics, goodput, deltas, verdict). It speaks only OpenAI HTTP and the
Prometheus API, so it runs unchanged against the simulator, real vLLM and hosted providers.

Exit codes (also in --help and README): 0 PASS, or nothing to judge; 3 FAIL (an SLO missed, or a compared
figure's change interval past its limit: requests cut at the drain enter at a lower bound, so that holds
whatever was cut); 4 INCONCLUSIVE (too little data: fewer than --min-requests succeeded, more than 5 % cut at
the drain, no request succeeded, or a comparison that cannot tell: an interval across its limit); 2 bad
input, including requests every one of which the server refused for a
reason the command line can fix (404: --url or --route, 401/403: --api-key-env); 5 the target or Prometheus
unreachable, or every request failed for a reason on the server's side (connection, timeout, 429, 5xx).
A run whose first requests all fail alike stops early with one line naming the cause and the fix.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from oculis import ConfigError, Pricing
from oculis_cli.inputs import InputError, finite_float, load_yaml, read_config, read_text, writable
from oculis_measure.bench.failures import api_base

EXIT = {"PASS": 0, None: 0, "FAIL": 3, "INCONCLUSIVE": 4}
USAGE, UNREACHABLE = 2, 5
EXIT_HELP = ("Exit codes: 0 PASS (or nothing to judge), 3 FAIL, 4 INCONCLUSIVE (fewer than --min-requests "
             "succeeded, over 5% cut at the drain, or a comparison that cannot tell), 2 bad input or every request "
             "refused for a reason the command line fixes (HTTP 404: --url/--route; 401/403: --api-key-env), "
             "5 target unreachable or every request failed on its side (connection, timeout, 429, 5xx). A run whose "
             "first 8 requests all fail alike stops there with one line naming the cause.")
SIM_NOTE = "SIMULATED upstream (oculis-simulator): modelled figures, not measurements of a real engine"


class Unreachable(RuntimeError):
    """The target or Prometheus could not be reached (exit 5)."""


def register(sub: Any) -> None:
    try:  # numpy may be absent (the operator image has no bench extra): `oculis --help` must still work
        from oculis_measure.bench.workload import BUILTIN

        names, profiles = "|".join(BUILTIN), "; ".join(f"{p.name}: {p.description}" for p in BUILTIN.values())
    except ImportError:
        names, profiles = "mixed|chat|rag|batch", "install the bench extra to list them"
    bench = sub.add_parser("bench", help="benchmark a route: latency, throughput, goodput, cost; compare runs")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    p = bench_sub.add_parser(
        "run", help="run a seeded workload against a route and judge it (SLOs, --compare baseline)",
        description="Open-loop (Poisson, --rate) or closed-loop (--concurrency) load; warm-up excluded; "
        "in-flight requests drained; every rate is over the measured window (warm-up end to the later of the "
        "planned end and the last request's end, any outcome). Each run salts its prompts (--fresh-cache) unless "
        f"the profile sets cross_run_prefixes. {EXIT_HELP} Built-in profiles: {profiles}.")
    p.add_argument("--route", required=True, help="route (the `model` the router is called with)")
    p.add_argument("--profile", default="mixed", help=f"{names} or a YAML/JSON file (default mixed)")
    p.add_argument("--duration", default="60s", help="measured time after the warm-up, e.g. 600s, 10m (default 60s)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=finite_float, help="open loop: requests per second (default: the profile's)")
    load.add_argument("--concurrency", type=int, help="closed loop: this many requests always in flight")
    p.add_argument("--burstiness", type=finite_float, default=1.0,
                   help="arrival gaps gamma(shape=B): 1 Poisson (default), < 1 bursty")
    p.add_argument("--warmup", help="sent first and not measured (default 10%% of --duration)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--url", default="http://127.0.0.1:8080",
                   help="router or OpenAI-compatible base URL, with or without /v1 (default http://127.0.0.1:8080)")
    p.add_argument("--api-key-env", metavar="VAR", help="send the bearer key held in this environment variable")
    p.add_argument("--prometheus-url", help="Prometheus scraping the engines: preemptions, spec-decode acceptance, "
                   "prefix-cache hit share over the run window")
    p.add_argument("--prometheus-selector", default="", metavar="MATCHERS",
                   help="label matchers for the engine series, e.g. 'job=\"engines\"'")
    p.add_argument("--config", type=Path, help="oculis-config.yaml: prices of the upstream that answered")
    p.add_argument("--pricing", metavar="IN,OUT", help="dollars per million input,output tokens (overrides --config)")
    p.add_argument("--slo", help="e.g. ttft_p95<1500ms,tpot_p95<60ms,e2e_p99<=5s,error_rate<1%%")
    p.add_argument("--save", type=Path, metavar="FILE", help="write this run (metrics, workload, samples) as JSON")
    p.add_argument("--compare", type=Path, metavar="FILE",
                   help="baseline: an `oculis bench run --save` file or a `vllm bench serve --save-result` file")
    p.add_argument("--force-compare", action="store_true",
                   help="judge against a baseline without a workload fingerprint (a vLLM file)")
    p.add_argument("--tolerance", type=finite_float, default=10.0, metavar="PCT",
                   help="throughput, goodput or requests/s drop that fails (default 10)")
    p.add_argument("--latency-tolerance", type=finite_float, default=20.0, metavar="PCT",
                   help="p50/p95 latency rise that fails, if also above --latency-floor-ms (default 20)")
    p.add_argument("--latency-floor-ms", type=finite_float, default=5.0)
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the workload N times (same seed, fresh salt each) and judge on all of them: the "
                   "spread between runs is the noise floor that widens every interval (default 1; save a "
                   "baseline with --repeat 3 or more to measure it)")
    p.add_argument("--min-requests", type=int, default=20, help="fewer succeeded requests: INCONCLUSIVE (default 20)")
    p.add_argument("--drain-timeout", default="60s", help="how long in-flight requests may finish (default 60s)")
    p.add_argument("--request-timeout", default="300s", help="one request's limit (default 300s)")
    p.add_argument("--report", type=Path, metavar="FILE.html", help="self-contained HTML page with plots")
    p.add_argument("-o", "--output", choices=["table", "json", "yaml", "csv"], default="table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines on stderr")
    p.add_argument("--fresh-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="start every prompt with a word unique to this run, so nothing is reused from an earlier "
                   "run's prefix cache (shared prefixes within the run still are); default on, off when the profile "
                   "sets cross_run_prefixes: true; part of the fingerprint, so --compare judges like with like")
    p.set_defaults(run=run)


# ---- inputs --------------------------------------------------------------------------------------------

def _pricing(args: argparse.Namespace) -> tuple[dict[str, Pricing], Pricing | None]:
    if args.pricing is not None:
        parts = args.pricing.split(",")
        try:
            values = [float(x) for x in parts]
        except ValueError:
            values = []
        if len(values) != 2 or not all(math.isfinite(v) and v >= 0 for v in values):
            raise InputError(f"--pricing {args.pricing!r}: give two non-negative numbers, dollars per million "
                             "input and output tokens, e.g. 0.15,0.60")
        return {}, Pricing(input_per_mtok=values[0], output_per_mtok=values[1])
    if args.config is not None:
        try:
            cfg = read_config(args.config)
        except ConfigError as exc:
            raise InputError(str(exc).splitlines()[0]) from None
        # by upstream name (the router's x-oculis-upstream header), and by model for a server called
        # directly (vLLM answers without that header; --route is then the model)
        by_model = {u.model: u.pricing for u in cfg.upstreams if u.model}
        return {**by_model, **{u.name: u.pricing for u in cfg.upstreams}}, None
    return {}, None


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    from oculis_measure.bench import stats as bench_stats
    from oculis_measure.bench import workload as bench_workload

    duration = bench_workload.parse_duration(args.duration)
    if duration <= 0:
        raise InputError(f"--duration {args.duration!r} is zero; give a positive duration such as 60s")
    warmup = (bench_workload.parse_duration(args.warmup, "--warmup") if args.warmup is not None
              else round(duration * 0.1, 3))
    profile = bench_workload.load_profile(args.profile)
    if args.rate is not None and args.rate <= 0:
        raise InputError(f"--rate {args.rate:g} is not positive; give requests per second > 0")
    if args.concurrency is not None and args.concurrency < 1:
        raise InputError(f"--concurrency {args.concurrency} is below 1; give at least 1")
    if args.burstiness <= 0:
        raise InputError(f"--burstiness {args.burstiness:g} is not positive; 1 is Poisson, 0.5 bursty")
    if args.api_key_env is not None and args.api_key_env not in os.environ:
        raise InputError(f"--api-key-env {args.api_key_env}: not set in this environment; export it first")
    for flag, value in (("--tolerance", args.tolerance), ("--latency-tolerance", args.latency_tolerance),
                        ("--latency-floor-ms", args.latency_floor_ms)):
        if value < 0:
            raise InputError(f"{flag} {value:g} is negative; give a value >= 0")
    if args.repeat < 1:
        raise InputError(f"--repeat {args.repeat} is below 1; give the number of runs, e.g. 3")
    if not args.url.startswith(("http://", "https://")):
        raise InputError(f"--url {args.url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8080")
    slos = bench_stats.parse_slos(args.slo) if args.slo is not None else []
    for out_flag, out_path, example in (("--save", args.save, "run.json"), ("--report", args.report, "run.html")):
        if out_path is not None:
            writable(out_path, out_flag, example)  # before the run, not after it (QA3 Part 2 #9)
    baseline, base_runs = None, None
    if args.compare is not None:
        path = str(args.compare)
        raw = load_yaml(read_text(args.compare, "--compare"), f"--compare {path}")
        baseline = bench_stats.read_baseline(raw, path)
        base_runs = bench_stats.baseline_runs(raw)
    by_upstream, flat = _pricing(args)
    salted = args.fresh_cache if args.fresh_cache is not None else not profile.cross_run_prefixes
    wl = bench_workload.plan(profile, seed=args.seed, route=args.route, duration_s=duration, warmup_s=warmup,
                             rate=args.rate, concurrency=args.concurrency, burstiness=args.burstiness, salted=salted)
    return {"duration": duration, "warmup": warmup, "drain": bench_workload.parse_duration(args.drain_timeout,
                                                                                        "--drain-timeout"),
            "timeout": bench_workload.parse_duration(args.request_timeout, "--request-timeout"),
            "slos": slos, "baseline": baseline, "base_runs": base_runs, "prices": by_upstream, "flat_price": flat,
            "workload": wl,
            "profile": profile, "salted": salted}


# ---- the load ------------------------------------------------------------------------------------------

class ProgressView:
    """A rich progress bar on a terminal; a plain line every 5 s when stderr is piped; nothing if off."""

    def __init__(self, total_s: float, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self.total, self.stream, self.enabled = total_s, stream, enabled
        self.tty = enabled and stream.isatty()
        self.last = 0.0
        self.bar: Any = None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            # on the stream it checked (stderr), never stdout: `-o json > out.json` must still show the bar
            self.bar = Progress(TextColumn("bench"), BarColumn(), TextColumn("{task.description}"),
                                TimeRemainingColumn(), transient=True, console=Console(file=stream))
            self.task = self.bar.add_task("", total=total_s)
            self.bar.start()

    def update(self, elapsed: float, sent: int, done: int, inflight: int, phase: str) -> None:
        text = f"{phase}: {sent} sent, {done} done, {inflight} in flight"
        if self.bar is not None:
            self.bar.update(self.task, completed=min(elapsed, self.total), description=text)
        elif self.enabled and elapsed - self.last >= 5:
            self.last = elapsed
            print(f"oculis bench run: {elapsed:5.0f}s/{self.total:.0f}s {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _preflight(args: argparse.Namespace) -> None:
    """Unreachable target: Unreachable (exit 5). A route the server does not list: InputError (exit 2)."""
    import httpx

    headers = {"authorization": f"Bearer {os.environ[args.api_key_env]}"} if args.api_key_env else {}
    try:
        resp = httpx.get(f"{api_base(args.url)}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise Unreachable(f"--url {args.url}: target unreachable ({type(exc).__name__}: {exc}); start the router "
                          "or give the right --url") from None
    if resp.status_code != 200:
        return  # some providers hide the list; the run itself will say what is wrong
    try:
        ids = [m.get("id") for m in resp.json().get("data", [])]
    except (ValueError, AttributeError):
        return
    if ids and args.route not in ids:
        shown = ", ".join(str(i) for i in ids[:10])
        raise InputError(f"--route {args.route!r}: {args.url} does not serve it (it serves: {shown}); give one of "
                         "those")


def _server_metrics(args: argparse.Namespace, window: dict[str, float]) -> dict[str, Any]:
    from oculis_measure.prom import PromError, Prometheus

    sel = args.prometheus_selector.strip().strip("{}")
    braces = f"{{{sel}}}" if sel else ""
    try:
        with Prometheus(args.prometheus_url) as prom:
            complete = prom.wait_scraped(window["wall_end"])
            start, end = window["wall_measure_start"], window["wall_end"]

            def d(name: str) -> float | None:
                return prom.delta(f"{name}{braces}", start, end)

            pre = d("vllm:num_preemptions_total")
            acc, drafts = d("vllm:spec_decode_num_accepted_tokens_total"), d("vllm:spec_decode_num_draft_tokens_total")
            hits, queries = d("vllm:prefix_cache_hits_total"), d("vllm:prefix_cache_queries_total")
    except PromError as exc:
        raise Unreachable(str(exc)) from None
    return {"window": {"start": start, "end": end}, "complete": complete, "preemptions": pre,
            "spec_decode_acceptance": acc / drafts if acc is not None and drafts else None,
            "prefix_cache_hit_share": hits / queries if hits is not None and queries else None,
            "source": f"Prometheus {args.prometheus_url}, counter deltas over the measured window"}


# ---- output --------------------------------------------------------------------------------------------

def render_table(doc: dict[str, Any], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    from oculis_measure.bench.stats import FORMULAS, fmt, table_cells

    console = Console(file=out, width=120, highlight=False, soft_wrap=True)
    cur, wl = doc["current"], doc["workload"]
    if doc["simulated"]:
        console.print(SIM_NOTE)
    load = wl["load"]
    req = cur["requests"]
    console.print(f"route {wl['route']}, profile {wl['profile']} (dataset {wl['dataset_hash']}, seed {wl['seed']}, "
                  f"fingerprint {doc['workload_hash']}), {wl['duration_s']:g}s of sends after {wl['warmup_s']:g}s "
                  f"warm-up, " + (f"concurrency {load['concurrency']}" if "concurrency" in load else
                                  f"{load['rate']:g} req/s requested (burstiness {load['burstiness']:g})")
                  + (", prompts salted for this run (nothing reused from an earlier run's prefix cache)"
                     if doc.get("fresh_cache") else ", prompts not salted (may hit prefixes an earlier run cached)"))
    win = cur.get("window")
    if win:
        runs = cur.get("runs") or 1
        console.print(f"window: {win['window_s']:,.1f}s = {win['sending_s']:g}s of sends + {win['drain_s']:,.1f}s "
                      "until the last measured request ended (any outcome)"
                      + (f", summed over {runs} runs" if runs > 1 else "") + "; every rate below divides by it")
    if cur.get("achieved_rate") is not None and "rate" in load:
        lag = cur.get("send_lag_ms") or {}
        console.print(f"achieved {cur['achieved_rate']:.2f} req/s sent ({doc['scheduled_rate']:.2f} scheduled by the "
                      f"seeded arrivals), send lag p99 {fmt(lag.get('p99'))} ms")
    console.print(f"requests: {req['succeeded']} succeeded, {req['failed']} failed, {req['cancelled']} cancelled "
                  f"(not drained), {req['warmup_excluded']} warm-up excluded")
    for w in doc.get("warnings", []):
        console.print(f"warning: {w}")
    table = Table(show_edge=False, pad_edge=False)
    cols, rows = table_cells(doc)
    for col in cols:
        table.add_column(col, justify="left" if col in ("metric", "") else "right")
    for cells in rows:
        table.add_row(*cells)
    console.print(table)
    console.print("formulas: " + "; ".join(f"{k} = {v}" for k, v in FORMULAS.items()))
    if any("change_low" in d for d in (doc.get("delta") or {}).values()):
        console.print("95% interval: of the change, bootstrap over requests drawn by time slot (percentiles, means, "
                      "shares) or over time slots paired run by run (rates), widened to the noise floor; noise sd: "
                      "the figure's standard deviation between the baseline's runs (- when it ran once: save it "
                      "with --repeat 3 to measure it)")
    if cur.get("errors_by_kind"):
        console.print("errors by kind: " + ", ".join(f"{k} {v}" for k, v in cur["errors_by_kind"].items()))
    if cur.get("usage_estimated"):
        console.print(f"usage: {cur['usage_estimated']} answers came without usage; their tokens (and cost) are "
                      "estimated from the text (prompt words, content chunks), never counted as 0")
    if cur.get("cost_per_1k_requests") is None:
        console.print(f"cost: {doc.get('cost_note', 'not priced')}")
    srv = cur.get("server")
    if srv:
        console.print(f"engine (Prometheus deltas over the run window): preemptions {fmt(srv['preemptions'], 0)}, "
                      f"spec-decode acceptance {fmt(srv['spec_decode_acceptance'], 3)}, prefix-cache hit share "
                      f"{fmt(srv['prefix_cache_hit_share'], 3)}")
    for s in doc.get("slos", []):
        console.print(f"SLO {s['slo']}: observed {fmt(s['observed'])} -> "
                      f"{'met' if s['met'] else 'MISSED' if s['met'] is False else 'not measured'}")
    verdict = doc["verdict"]
    reasons = [r for r in doc["reasons"] if r]
    console.print(f"verdict: {verdict or 'none'}" + (f": {reasons[0]}" if reasons else "")
                  + (" (simulated)" if doc["simulated"] else ""))
    for r in reasons[1:]:
        console.print(f"  also: {r}")


def render_csv(doc: dict[str, Any], out: TextIO) -> None:
    from oculis_measure.bench.stats import comparison_rows

    w = csv.writer(out)
    w.writerow(["metric", "baseline", "current", "change", "change_pct", "status", "verdict", "simulated",
                "change_low", "change_high", "noise_sd"])
    deltas = doc.get("delta") or {}
    for row in comparison_rows(doc):
        d = deltas.get(row[0], {})
        w.writerow([*("" if v is None else v for v in row), doc["verdict"] or "", str(doc["simulated"]).lower(),
                    *("" if d.get(k) is None else d[k] for k in ("change_low", "change_high", "noise_sd"))])


# ---- the command ---------------------------------------------------------------------------------------

def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    try:
        return _run(args, stdout or sys.stdout)
    except InputError as exc:
        print(f"oculis bench run: {exc}", file=sys.stderr)
        return USAGE
    except Unreachable as exc:
        print(f"oculis bench run: {exc}", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; nothing is saved from a cut run
        print("oculis bench run: interrupted; nothing saved", file=sys.stderr)
        return 130
    except ImportError as exc:
        print(f"oculis bench run: error: a library is missing ({exc}); install it with `pip install -e "
              "'.[bench,router]'` from an Oculis checkout", file=sys.stderr)
        return USAGE


def _baseline_warnings(baseline: dict[str, Any] | None, base_runs: list[dict[str, Any]] | None,
                       runs: list[dict[str, Any]], current: dict[str, Any]) -> list[str]:
    """What the comparison's intervals cannot cover: a busier machine than the baseline's (and how far the
    latency intervals were widened for it), a baseline without samples or that ran once."""
    from oculis_measure import figures
    from oculis_measure.bench.intervals import HOPS, machine_slack_ms

    out = []
    slack = machine_slack_ms(base_runs, runs) if base_runs else 0.0
    if slack and base_runs:
        blag = figures.dist([v for r in base_runs for v in r.get("loop_lag_ms") or []], "none", (99,))
        out.append(f"the machine was busier than during the baseline: this client's 0.25 s ticker woke "
                   f"{figures.text(figures.pick(current['client_loop_lag_ms'], 'p99'))} ms late (p99) against "
                   f"{figures.text(figures.pick(blag, 'p99'))} ms then, so latency rises up to {slack:,.0f} ms "
                   f"(x{HOPS} hops) may be the machine's; the latency intervals reach down that far")
    if baseline is not None and not base_runs:
        out.append("the baseline has no per-request samples (a vLLM file, or saved before Oculis kept them): "
                   "judged on point values, without intervals; save a baseline with `oculis bench run --save`")
    elif baseline is not None and base_runs and len(base_runs) == 1:
        out.append("the baseline ran once, so its noise floor (how far a figure moves between two runs of the same "
                   "thing on this machine) is unmeasured and the intervals cover only the spread within each run; "
                   "save the baseline with --repeat 3 or more to measure it")
    return out


def _loads(args: argparse.Namespace, inp: dict[str, Any]) -> list[Any] | int:
    """--repeat runs of the same seeded workload, each with its own salt; the exit code instead when a run's
    requests all failed alike (one line names the cause)."""
    from oculis_measure.bench.load import LoadPlan, run_load

    headers = {"authorization": f"Bearer {os.environ[args.api_key_env]}"} if args.api_key_env else {}
    loads: list[Any] = []
    for _ in range(args.repeat):
        progress = ProgressView(inp["warmup"] + inp["duration"], enabled=not args.no_progress)
        plan = LoadPlan(url=args.url, route=args.route, warmup_s=inp["warmup"], duration_s=inp["duration"],
                        drain_s=inp["drain"], timeout_s=inp["timeout"], concurrency=args.concurrency,
                        headers=headers, salt=f"run{os.urandom(4).hex()}" if inp["salted"] else "")
        try:
            load = asyncio.run(run_load(plan, inp["workload"], progress.update))
        finally:
            progress.close()
        failing = _all_failed(load, args)
        if failing is not None:
            print(f"oculis bench run: {failing.line}", file=sys.stderr)
            return int(failing.exit_code)
        loads.append(load)
    return loads


def _run(args: argparse.Namespace, stdout: TextIO) -> int:
    from oculis_measure import figures
    from oculis_measure.bench import stats as bench_stats
    from oculis_measure.bench.intervals import SOURCES, noise, run_samples
    from oculis_measure.figures import with_reasons
    from oculis_router.usage import cost_dollars

    inp = _inputs(args)
    _preflight(args)
    if args.prometheus_url:
        from oculis_measure.prom import PromError, Prometheus

        try:
            with Prometheus(args.prometheus_url) as prom:
                prom.ready()
        except PromError as exc:
            raise Unreachable(str(exc)) from None
    wl = inp["workload"]
    loads = _loads(args, inp)
    if isinstance(loads, int):
        return loads
    results = [r for load in loads for r in load.results]
    measured = [r for r in results if not r.warmup]
    wins = [bench_stats.measured_window(load.results, inp["warmup"], inp["duration"]) for load in loads]
    win = {k: sum(w[k] for w in wins) for k in ("window_s", "sending_s", "drain_s")}
    window = {"wall_measure_start": loads[0].wall_start + inp["warmup"],
              "wall_end": loads[-1].wall_start + inp["warmup"] + wins[-1]["window_s"], **win}
    cost_note = "not priced: give --config (the router's config) or --pricing IN,OUT"
    for r in results:
        u = r.usage
        price = inp["flat_price"] or inp["prices"].get(r.upstream or args.route)
        if r.ok and price is not None:
            from oculis_router.usage import Usage

            r.cost = cost_dollars(price, u if u is not None else Usage(r.prompt_tokens, r.output_tokens, 0, 0))
    if inp["prices"] and any(r.ok and r.cost is None for r in measured):
        cost_note = "not priced: some answers came from an upstream without pricing in --config"
    # a generator that lags sends past the planned end: its achieved rate drops
    send_window = sum(max(inp["duration"], max((r.sent_s for r in load.results), default=0) - inp["warmup"])
                      for load in loads)
    current = bench_stats.summarize(results, win["window_s"], slos=inp["slos"], requested_rate=args.rate or (
        None if args.concurrency else inp["profile"].rate), send_window_s=send_window)
    runs = [{**run_samples(load.results, inp["warmup"], w["window_s"],
                           lambda r: bench_stats.good(r, inp["slos"]), inp["duration"]),
             "loop_lag_ms": [round(v * 1000, 2) for v in load.loop_lag_s]}
            for load, w in zip(loads, wins, strict=True)]
    lags = [v for r in runs for v in r["loop_lag_ms"]]
    current["client_loop_lag_ms"] = figures.dist(lags, "the run measured for less than 0.25 s", (50, 99))
    current["window"] = win
    current["runs"] = len(loads)
    warnings = []
    scheduled = None
    if args.concurrency is None and current["achieved_rate"] is not None:
        lag = (current.get("send_lag_ms") or {}).get("p99") or 0.0
        scheduled = sum(1 for t in wl.arrivals or [] if t >= inp["warmup"]) / inp["duration"]
        # inference-perf's rule of thumb: sends should leave within ~10 ms of schedule; 50 ms p99 is lagging
        if lag > 50:
            warnings.append(f"the load generator sent late: send lag p99 {lag:,.0f} ms behind the seeded schedule "
                            "(> 50 ms), so the load was burstier than asked; use a faster client machine or a "
                            "lower --rate")
        if current["achieved_rate"] < 0.95 * scheduled:
            warnings.append(f"the load generator fell behind: it sent {current['achieved_rate']:.2f} req/s of the "
                            f"{scheduled:.2f} req/s the seeded arrivals scheduled; the figures understate the load")
    if 0 < current["requests"]["succeeded"] < args.min_requests and not (inp["slos"] or inp["baseline"]):
        warnings.append(f"only {current['requests']['succeeded']} requests succeeded (< --min-requests "
                        f"{args.min_requests}): too few for stable percentiles")
    if args.prometheus_url:
        current["server"] = _server_metrics(args, window)
        if not current["server"]["complete"]:
            warnings.append("Prometheus had not scraped every target after the run ended; engine deltas may "
                            "miss the last seconds")
    tol = bench_stats.Tolerances(throughput_pct=args.tolerance, latency_pct=args.latency_tolerance,
                                 latency_floor_ms=args.latency_floor_ms, min_requests=args.min_requests)
    slo_results = bench_stats.check_slos(current, inp["slos"])
    baseline, base_fp = inp["baseline"] if inp["baseline"] else (None, None)
    if baseline is not None and base_fp is None and args.force_compare:
        base_fp = wl.fingerprint  # the user vouches that the workloads match
    deltas = (bench_stats.delta(baseline, current, tol, inp["base_runs"], runs) if baseline is not None
              else None)
    warnings += _baseline_warnings(baseline, inp["base_runs"], runs, current)
    verdict, reasons = bench_stats.verdict(current, wl.fingerprint, slo_results, baseline, base_fp, deltas, tol)
    simulated = bool(current["simulated"] or (baseline or {}).get("simulated"))
    doc: dict[str, Any] = {
        "schema_version": 1, "verdict": verdict, "reasons": [r for r in reasons if r], "simulated": simulated,
        "note": SIM_NOTE if simulated else None, "target": args.url, "workload": wl.fingerprint,
        "workload_hash": wl.fingerprint_hash, "current": current, "baseline": baseline, "delta": deltas,
        "slos": slo_results, "warnings": warnings, "scheduled_rate": scheduled, "fresh_cache": inp["salted"],
        "cost_note": None if current["cost_per_1k_requests"] is not None else cost_note,
        # each figure's standard deviation between this invocation's runs (None: it ran once)
        "noise_floor": {k: noise(k, runs) for k in SOURCES},
    }
    doc = with_reasons(doc)  # a figure that cannot exist is null, its reason under "absent" (figures.py)
    if args.save is not None:
        _write(args.save, json.dumps({**doc, "samples": _samples(results), "runs": runs}, indent=1) + "\n",
               "--save")
    if args.report is not None:
        from oculis_measure.bench.report import html

        base_samples = None
        if args.compare is not None:
            raw = json.loads(read_text(args.compare, "--compare"))
            base_samples = raw.get("samples") if isinstance(raw, dict) else None
        _write(args.report, html(doc, _samples(results), base_samples), "--report")
    if args.output == "json":
        stdout.write(json.dumps(doc, indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        stdout.write(yaml.safe_dump(doc, sort_keys=False))
    elif args.output == "csv":
        render_csv(doc, stdout)
    else:
        render_table(doc, stdout)
    return EXIT[verdict]


def _all_failed(load: Any, args: argparse.Namespace) -> Any:
    """The one-line diagnosis of a run that measured nothing because its requests failed: the first
    requests all failed alike (the run stopped early), or no request succeeded and some failed."""
    from oculis_measure.bench.failures import diagnose, dominant_failure

    results = load.results
    failed = [r for r in results if not r.ok and r.error]
    if load.aborted is not None:
        same = [r for r in failed if r.error == load.aborted]
        return diagnose(load.aborted, len(same), len(results), args.url, args.route, args.api_key_env,
                        same[0].error_detail if same else None, early=True)
    measured = [r for r in results if not r.warmup] or results
    if not failed or any(r.ok for r in measured) or not any(not r.ok and r.error for r in measured):
        return None
    kind, count = dominant_failure([r.error for r in measured if not r.ok and r.error])
    detail = next((r.error_detail for r in measured if r.error == kind and r.error_detail), None)
    return diagnose(kind, count, len(measured), args.url, args.route, args.api_key_env, detail)


def _samples(results: list[Any]) -> dict[str, list[float]]:
    ok = [r for r in results if r.ok and not r.warmup]
    return {"ttft_ms": [round(r.ttft_s * 1000, 3) for r in ok if r.ttft_s is not None],
            "e2e_ms": [round(r.e2e_s * 1000, 3) for r in ok if r.e2e_s is not None],
            "done_s": [round(r.sent_s + (r.e2e_s or 0), 3) for r in ok],
            "output_tokens": [r.output_tokens for r in ok]}


def _write(path: Path, text: str, flag: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write: {exc.strerror}") from None

