"""What the rate limiter adds per request, in one run: the same route through `oculis serve` without
limits, with limits counted in memory, and with limits counted in a real redis-server (Lua scripts),
against one fast fake upstream. Every request is admitted (the limits are far above the load), so
the figures are the cost of reserving and settling, not of refusing.

Load comes from wrk (keep-alive, one fixed chat request; the classifier memo is warm, the response
cache off). Prints p50/p99 latency, the added p50/p99 over the router without limits, requests/s
and the router's CPU time per request.

    .venv/bin/python bench/limiter_overhead.py [--seconds 10] [--concurrency 1 32]
Needs `wrk` and `redis-server` (Debian packages).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from router_overhead import ROOT, cpu_seconds, free_port, wait_http, wrk

LIMITS = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "tokens_per_day": 10**13, "per": "tenant"}
BUDGET = {"dollars": 10**9, "period": "day", "per": "key"}


def config(fake: str, server: dict[str, Any] | None, limited: bool) -> dict[str, Any]:
    route: dict[str, Any] = {"name": "adaptive", "tiers": [
        {"name": "simple", "match": {"complexity_below": 0.35}, "upstream": "fake"},
        {"name": "complex", "match": {}, "upstream": "fake"}]}
    if limited:
        route |= {"limits": LIMITS, "budget": BUDGET}
    cfg: dict[str, Any] = {"upstreams": [{"name": "fake", "provider": "vllm", "base_url": fake + "/v1", "model": "fake",
                                          "pricing": {"input_per_mtok": 0.05, "output_per_mtok": 0.08}}],
                           "routes": [route]}
    if server:
        cfg["server"] = server
    return {"oculis": cfg}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = ap.parse_args()
    for tool in ("wrk", "redis-server"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} not found: apt-get install -y {tool}")
    work = Path(tempfile.mkdtemp(prefix="oculis-limiter-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fport, rport = free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "fake_upstream.py"), str(fport)]))
        procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", str(work)], stdout=subprocess.DEVNULL))
        fake = f"http://127.0.0.1:{fport}"
        time.sleep(0.5)
        redis = {"limiter": {"backend": "redis"}, "redis_url": f"redis://127.0.0.1:{rport}/0"}
        variants = [("no limits", None, False), ("memory", None, True), ("redis", redis, True)]
        targets: list[tuple[str, str, int]] = []
        for name, server, limited in variants:
            path = work / f"{name.replace(' ', '-')}.yaml"
            path.write_text(yaml.safe_dump(config(fake, server, limited)))
            port = free_port()
            p = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path),
                                  "--port", str(port), "--metrics-port", str(free_port()), "--log-level", "warning"])
            procs.append(p)
            wait_http(f"http://127.0.0.1:{port}/healthz")
            targets.append((name, f"http://127.0.0.1:{port}/v1/chat/completions", p.pid))
        for _, url, _ in targets:  # warm up: connections, classifier memo, Lua scripts loaded
            wrk(url, "adaptive", 4, 2, work)
        print(f"{'conc':>4} {'limiter':10} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10} "
              f"{'req/s':>9} {'CPU ms/req':>10} {'errors':>6}")
        for conns in args.concurrency:
            base: dict[str, float] | None = None
            for name, url, pid in targets:
                cpu0 = cpu_seconds(pid)
                r = wrk(url, "adaptive", conns, args.seconds, work)
                cpu = (cpu_seconds(pid) - cpu0) * 1000 / max(r["requests"], 1)
                base = base or r
                print(f"{conns:>4} {name:10} {r['p50']:8.3f} {r['p99']:8.3f} {r['p50'] - base['p50']:10.3f} "
                      f"{r['p99'] - base['p99']:10.3f} {r['rps']:9.0f} {cpu:10.3f} {int(r['errors']):>6}", flush=True)
    finally:
        for p in reversed(procs):  # routers first, each to its end: their upstream or Redis going first is logged
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
