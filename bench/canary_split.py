"""The canary's share of traffic through a real router, side by side with what the Service alone gives.

A canary of an engine change gets `spec.rollout.canary.trafficPercent` of its upstream's requests: the
operator renders `canary: {base_url, percent}` on the upstream, and the router draws each request's
revision. Two fast fake upstreams play the stable and the canary Service; `oculis serve` routes N
requests to the upstream for each percent; the answers' `x-oculis-revision` header says which revision
served each. Printed per percent: the share the canary got, its 95% Wilson interval, the binomial
limit (the standard deviation any per-request draw has at that N), and the share a Service spreading
requests over the pods would give instead (canary replicas / all replicas, whatever trafficPercent).

    .venv/bin/python bench/canary_split.py [--requests 2000] [--percent 10 30 50] [--stable-replicas 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from router_overhead import ROOT, free_port, wait_http


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def serve(work: Path, stable: str, canary: str, percent: int) -> tuple[subprocess.Popen[bytes], str]:
    cfg = {"oculis": {
        "upstreams": [{"name": "llama", "provider": "vllm", "base_url": stable + "/v1", "model": "fake",
                       "canary": {"base_url": canary + "/v1", "percent": percent}}],
        "routes": [{"name": "chat", "tiers": [{"name": "only", "upstream": "llama"}]}]}}
    path = work / f"oculis-{percent}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path), "--port",
                             str(port), "--metrics-port", str(free_port()), "--log-level", "warning"])
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc, f"http://127.0.0.1:{port}"


def burst(url: str, n: int) -> list[str]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(timeout=30) as client:
        def one(_: int) -> str:
            r = client.post(url + "/v1/chat/completions", json=body)
            r.raise_for_status()
            return r.headers["x-oculis-revision"]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return list(pool.map(one, range(n)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--percent", type=int, nargs="+", default=[10, 30, 50])
    ap.add_argument("--stable-replicas", type=int, default=2, help="for the Service-only column (1 canary replica)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oculis-canary-split-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ports = [free_port(), free_port()]
        procs += [subprocess.Popen([sys.executable, str(ROOT / "fake_upstream.py"), str(p)]) for p in ports]
        stable, canary = (f"http://127.0.0.1:{p}" for p in ports)
        time.sleep(0.5)
        service_share = 1 / (args.stable_replicas + 1)
        n = args.requests
        print(f"{n} requests per row through oculis serve; Service-only share: 1 canary of "
              f"{args.stable_replicas + 1} replicas = {service_share:.1%}, whatever trafficPercent says")
        print(f"{'trafficPercent':>14} {'canary got':>11} {'95% CI':>17} {'binomial sd':>12} {'|err|/sd':>9}")
        for percent in args.percent:
            router, url = serve(work, stable, canary, percent)
            procs.append(router)
            seen = burst(url, n)
            router.terminate()
            k = seen.count("canary")
            lo, hi = wilson(k, n)
            sd = math.sqrt(percent / 100 * (1 - percent / 100) / n)
            print(f"{percent:>13}% {k / n:>11.2%} {f'[{lo:.2%}, {hi:.2%}]':>17} {sd:>12.2%} "
                  f"{abs(k / n - percent / 100) / sd:>9.2f}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
