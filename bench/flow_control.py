"""Flow control and the Batch API, measured: real `oculis sim serve` engines behind the real router.

1. capacity: closed-loop interactive requests at every seat -> C requests/s (the fleet's physical limit
   for this request shape);
2. interactive chat, Poisson at --load x C (default 60 %), three ways: no batch; with a batch job submitted
   through the openai SDK to the router's /v1/batches (lowest priority, only free seats); with the same
   batch sent straight to the engines (first come, first served). Printed: interactive TTFT p50/p95/p99,
   the batch's completion time against the ideal (its requests over the idle capacity (1 - load) x C), and
   the engines' busy share (requests served over C x elapsed);
3. fairness: two tenants at one priority past saturation, one sending 5x the other's rate: each one's
   dispatches against its max-min fair share, and the light tenant's p95 wait.

    .venv/bin/python bench/flow_control.py [--replicas 1] [--seats 4] [--batch 200] [--seconds 20]

The issue's full run is --batch 20000 on a GPU-sized fleet; on a shared 2-core machine the defaults are
small, and every figure comes with the run's own capacity and ideal beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests" / "suite"))  # the support modules' deadlines (time_scale)
sys.path.insert(0, str(ROOT / "e2e" / "tests"))
from router_support import start_router  # noqa: E402
from sim_support import start_sim, stop  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OUT_TOKENS = 32


def q(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


async def one(client: httpx.AsyncClient, url: str, tag: str, headers: dict[str, str] | None = None) -> float | None:
    """TTFT of one streamed chat request through `url`, or None when it failed."""
    body = {"model": "chat", "max_tokens": OUT_TOKENS, "stream": True,
            "messages": [{"role": "user", "content": f"question {tag} {random.random():.6f}"}]}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers or {}) as r:
            if r.status_code != 200:
                await r.aread()
                return None
            ttft = None
            async for line in r.aiter_lines():
                if ttft is None and line.startswith("data: {"):
                    ttft = time.perf_counter() - t0
            return ttft
    except httpx.HTTPError:
        return None


async def capacity(url: str, workers: int, seconds: float) -> float:
    done = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as client:
        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                if await one(client, url, "cap") is not None:
                    done += 1
        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return done / (time.monotonic() - t0)


async def poisson(url: str, rate: float, until: threading.Event | None, seconds: float,
                  headers: dict[str, str] | None = None, sent: list[int] | None = None,
                  timeline: list[tuple[float, float]] | None = None) -> tuple[list[float], int]:
    """Open-loop arrivals at `rate`/s for `seconds` (and, with `until`, until it is set): TTFTs, failures;
    `sent` gets how many were sent (a loaded client falls behind the nominal rate), `timeline` each
    request's (start, TTFT)."""
    ttfts: list[float] = []
    t_zero = time.monotonic()
    failed = 0
    rng = random.Random(7)
    tasks = []
    t_end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=2000)) as client:
        async def fire(i: int) -> None:
            nonlocal failed
            start = time.monotonic() - t_zero
            t = await one(client, url, str(i), headers)
            if t is None:
                failed += 1
            else:
                ttfts.append(t)
                if timeline is not None:
                    timeline.append((start, t))
        i = 0
        while time.monotonic() < t_end or (until is not None and not until.is_set()):
            tasks.append(asyncio.create_task(fire(i)))
            i += 1
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    if sent is not None:
        sent.append(len(tasks))
    return ttfts, failed


def batch_lines(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "chat", "max_tokens": OUT_TOKENS, "messages": [{"role": "user", "content": f"summarise doc {i}"}]}
    }).encode() + b"\n" for i in range(n))


def run_batch(url: str, n: int, done: threading.Event, out: dict[str, float]) -> None:
    c = openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=2)
    t0 = time.monotonic()
    f = c.files.create(file=("jobs.jsonl", io.BytesIO(batch_lines(n))), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    while (b := c.batches.retrieve(b.id)).status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.5)
    out["seconds"] = time.monotonic() - t0
    out["completed"] = b.request_counts.completed if b.request_counts else 0
    done.set()


def direct_batch(engines: list[str], n: int, concurrency: int, done: threading.Event, out: dict[str, float]) -> None:
    async def main() -> None:
        lines = [json.loads(x)["body"] for x in batch_lines(n).splitlines()]
        it = iter(enumerate(lines))
        ok = 0
        async with httpx.AsyncClient(timeout=600) as client:
            async def worker() -> None:
                nonlocal ok
                for i, body in it:
                    r = await client.post(engines[i % len(engines)] + "/v1/chat/completions",
                                          json={**body, "model": MODEL})
                    ok += r.status_code == 200
            t0 = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            out["seconds"], out["completed"] = time.monotonic() - t0, ok
    asyncio.run(main())
    done.set()


def sample_queue(mport: int, stop_: threading.Event, out: list[tuple[float, float, float]]) -> None:
    """(time, interactive waiting, batch lines waiting) in the router, every 0.25 s until `stop_`."""
    t0 = time.monotonic()
    while not stop_.wait(0.25):
        try:
            total = metric(mport, "oculis_flow_queue_length")
            batch = metric(mport, "oculis_flow_queue_length", priority="-101")
        except httpx.HTTPError:
            continue
        out.append((time.monotonic() - t0, total - batch, batch))


def plot(path: str, runs: list[tuple[str, list[tuple[float, float]], list[tuple[float, float, float]]]]) -> None:
    import plotly.graph_objects as go  # type: ignore[import-untyped]  # plotly ships no type hints
    from plotly.subplots import make_subplots  # type: ignore[import-untyped]

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=(
        "interactive TTFT (s) by arrival time", "requests waiting in the router"))
    for mode, timeline, queue in runs:
        fig.add_trace(go.Scatter(x=[t for t, _ in timeline], y=[v for _, v in timeline], mode="markers",
                                 name=f"TTFT, {mode}", marker={"size": 4}), row=1, col=1)
        if mode != "no batch":
            fig.add_trace(go.Scatter(x=[t for t, _, _ in queue], y=[i for _, i, _ in queue],
                                     name=f"interactive waiting, {mode}"), row=2, col=1)
            fig.add_trace(go.Scatter(x=[t for t, _, _ in queue], y=[b for _, _, b in queue],
                                     name=f"batch lines waiting, {mode}"), row=2, col=1)
    fig.update_xaxes(title_text="seconds into the run", row=2, col=1)
    fig.update_layout(title="Flow control: interactive TTFT and the router's queues while a batch runs")
    fig.write_html(path, include_plotlyjs="cdn")


def metric(mport: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--seats", type=int, default=4, help="the router's seats_per_replica (interactive concurrency "
                    "each replica is sized for; C is measured at it)")
    ap.add_argument("--max-num-seqs", type=int, default=0, help="each engine's max_num_seqs (default 2 x seats: "
                    "room to run interactive requests beside batch lines)")
    ap.add_argument("--load", type=float, default=0.6, help="interactive load as a share of capacity")
    ap.add_argument("--batch", type=int, default=200, help="batch job lines")
    ap.add_argument("--direct-concurrency", type=int, default=64, help="the batch sent straight to the engines: "
                    "requests in flight at once (a client pushing a job through as fast as it can)")
    ap.add_argument("--seconds", type=float, default=20, help="interactive phase length (at least)")
    ap.add_argument("--html", help="where to write the plot of TTFT and queue length over time (default: in the "
                    "run's temporary folder)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="oculis-flow-bench-"))
    seqs = a.max_num_seqs or 2 * a.seats
    sims = [start_sim(MODEL, "--gpu", "H100-80GB", "--max-num-seqs", str(seqs), "--max-model-len", "4096",
                      "--scheduling-policy", "priority", "--seed", str(i)) for i in range(a.replicas)]
    engines = [u for _, u in sims]
    cfg = tmp / "bench.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "llama", "provider": "vllm", "model": MODEL, "picker": "least-loaded",
                       "endpoints": [u + "/v1" for u in engines], "priority_scheduling": True}],
        "routes": [{"name": "chat", "tiers": [{"name": "only", "upstream": "llama"}],
                    "flow_control": {"queue_ttl_seconds": 600, "max_queue": 100_000}}],
        "server": {"flow_control": {"enabled": True, "seats_per_replica": a.seats},
                   "batch": {"enabled": True, "directory": str(tmp / "batch"), "concurrency": a.seats * a.replicas,
                             "max_requests_per_batch": max(a.batch, 1)}}}}))
    proc, url, mport = start_router(cfg, tmp / "router.log")
    try:
        cap = asyncio.run(capacity(url, a.seats * a.replicas, 8))
        rate = a.load * cap
        print(f"fleet: {a.replicas} simulated H100 x Llama-3.1-8B (max_num_seqs {seqs}, --scheduling-policy priority), "
              f"{a.seats} router seats each; {OUT_TOKENS} output tokens "
              f"a request; capacity C = {cap:.1f} req/s (closed loop at every seat); interactive at "
              f"{a.load:.0%} = {rate:.1f} req/s")
        rows = []
        plots: list[tuple[str, list[tuple[float, float]], list[tuple[float, float, float]]]] = []
        for mode in ("no batch", "batch via Oculis", "batch to engines"):
            done, out = threading.Event(), {"seconds": float("nan"), "completed": 0.0}
            t0 = time.monotonic()
            th = None
            if mode == "batch via Oculis":
                th = threading.Thread(target=run_batch, args=(url, a.batch, done, out), daemon=True)
            elif mode == "batch to engines":
                th = threading.Thread(target=direct_batch, args=(engines, a.batch, a.direct_concurrency, done, out),
                                      daemon=True)
            timeline: list[tuple[float, float]] = []
            queue: list[tuple[float, float, float]] = []
            sampling = threading.Event()
            sampler = threading.Thread(target=sample_queue, args=(mport, sampling, queue), daemon=True)
            sampler.start()
            if th is not None:
                th.start()
            ttfts, failed = asyncio.run(poisson(url, rate, done if th else None, a.seconds, timeline=timeline))
            if th is not None:
                th.join()
            sampling.set()
            sampler.join()
            plots.append((mode, timeline, queue))
            elapsed = time.monotonic() - t0
            served = len(ttfts) + (out["completed"] if th else 0)
            rows.append((mode, ttfts, failed, out if th else None, served / (cap * elapsed)))
        ideal = a.batch / ((1 - a.load) * cap)
        print(f"\n{'run':<18}{'n':>6}{'fail':>6}{'TTFT p50':>10}{'p95':>9}{'p99':>9}{'batch s':>9}{'/ideal':>8}"
              f"{'busy':>7}")
        for mode, ttfts, failed, out, busy in rows:
            bs = f"{out['seconds']:9.1f}{out['seconds'] / ideal:8.2f}" if out else f"{'-':>9}{'-':>8}"
            print(f"{mode:<18}{len(ttfts):>6}{failed:>6}{q(ttfts, .5) * 1e3:9.0f}ms{q(ttfts, .95) * 1e3:7.0f}ms"
                  f"{q(ttfts, .99) * 1e3:7.0f}ms{bs}{busy:7.0%}")
        base = rows[0][1]
        for mode, ttfts, *_ in rows[1:]:
            p95, p99 = q(ttfts, .95) / q(base, .95) - 1, q(ttfts, .99) / q(base, .99) - 1
            print(f"{mode}: TTFT p95 {p95:+.0%}, p99 {p99:+.0%} against no batch (goal: within +10 %)")
        print(f"ideal batch time: {a.batch} requests / ({1 - a.load:.0%} x {cap:.1f} req/s) = {ideal:.1f} s "
              "(goal: within 1.3x via Oculis)")
        html = a.html or str(tmp / "flow_control.html")
        plot(html, plots)
        print(f"plot of TTFT and router queue length over time: {html}")
        fairness(url, mport, cap, a.seconds)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        for p, _ in sims:
            stop(p)


def fairness(url: str, mport: int, cap: float, seconds: float) -> None:
    """Two tenants at one priority, 1.5 x C together, heavy at 5x light."""
    total = 1.5 * cap
    light_rate, heavy_rate = total / 6, total * 5 / 6
    before = {t: metric(mport, "oculis_flow_dispatches_total", flow=f"anonymous/{t}") for t in ("light", "heavy")}

    sent_light: list[int] = []

    async def both() -> tuple[tuple[list[float], int], tuple[list[float], int]]:
        return await asyncio.gather(
            poisson(url, light_rate, None, seconds, {"x-oculis-tenant": "light"}, sent_light),
            poisson(url, heavy_rate, None, seconds, {"x-oculis-tenant": "heavy"}))
    t0 = time.monotonic()
    (lt, lf), (ht, hf) = asyncio.run(both())
    elapsed = time.monotonic() - t0
    got = {t: metric(mport, "oculis_flow_dispatches_total", flow=f"anonymous/{t}") - before[t]
           for t in ("light", "heavy")}
    served = got["light"] + got["heavy"]
    # max-min fair: the light tenant gets all it asked (what it sent) up to half; the heavy one the rest
    fair_light = min(float(sent_light[0]), served / 2)
    fair = {"light": fair_light, "heavy": served - fair_light}
    print(f"\nfairness past saturation ({total:.1f} req/s offered = 1.5 C; heavy 5x light), {elapsed:.0f} s:")
    print(f"{'tenant':<8}{'nominal/s':>10}{'dispatched':>11}{'fair':>7}{'vs fair':>9}{'E2E p95':>9}{'429':>6}")
    for t, rate, ttfts, failed in (("light", light_rate, lt, lf), ("heavy", heavy_rate, ht, hf)):
        print(f"{t:<8}{rate:10.1f}{got[t]:11.0f}{fair[t]:7.0f}{got[t] / fair[t] - 1:+9.0%}"
              f"{q(ttfts, .95):8.2f}s{failed:6d}")
    print("(goal: each within 10 % of fair; the light tenant's TTFT p95 bounded while the heavy one queues)")


if __name__ == "__main__":
    main()
