"""Autoscaling on the sandbox with simulator pods and a real Prometheus (e2e/cluster serve-pods): a
burst of requests queued in vLLM (vllm:num_requests_waiting) scales an upstream up within its
stabilisation window, Prometheus killed mid-run never scales it down, and quiet brings it back after
the delay; an idle upstream goes to zero and the next request through a local `oculis serve` wakes
it while, with coldStart: escalate, the next tier answers; a minimum the GPU pool cannot place names
the pool. Short windows (seconds); the operator evaluates every recheck round (1 s here).

Only 127.0.0.1 is dialled: simulators on loopback ports, the router through the endpoint map."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import CLUSTER, engine_auth, eventually, localcluster, oculis_serve
from kubernetes import client
from operator_fixture import free_port
from skips import needs_command
from test_gpuupstream import World, upstream
from test_inferenceroute import route

pytestmark = needs_command("prometheus", "prometheus")
G, V = "oculis.dev", "v1alpha1"
ENGINE = {"maxModelLen": 8192, "maxNumSeqs": 2, "maxNumBatchedTokens": 4096, "gpuMemoryUtilization": 0.9}


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def restart_prometheus() -> None:
    """A fresh Prometheus, with the config this checkout writes (it scrapes extra-*.json targets too)."""
    kill_prometheus()
    assert localcluster.start_prometheus()


def kill_prometheus() -> None:
    pid = localcluster.running_pid("prometheus")
    if pid:
        os.kill(pid, signal.SIGKILL)
        # Its /proc entry empties before its socket closes: wait for the port itself.
        eventually(lambda: localcluster.port_free(localcluster.prometheus_port()), timeout=20,
                   what="prometheus gone (its port free)")


@pytest.fixture
def served(world: World) -> Iterator[dict[str, Any]]:
    proc = subprocess.run([str(CLUSTER), "serve-pods", f"--namespace={world.ns}"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    files: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert files["prometheus"], "prometheus did not start"
    restart_prometheus()
    yield files
    for extra in localcluster.SIM.glob("extra-*.json"):
        extra.unlink()
    subprocess.run([str(CLUSTER), "serve-pods", "--stop"], capture_output=True, check=False)


def replicas(world: World, name: str) -> int:
    dep = world.apps.read_namespaced_deployment(f"{name}-vllm", world.ns)
    return int(dep.spec.replicas or 0)


def sim_ports(served: dict[str, Any], host: str) -> list[int]:
    ports: list[int] = json.loads(Path(served["endpoints"]).read_text()).get(host, {}).get("ports", [])
    return ports


def autoscaling(world: World, name: str) -> dict[str, Any]:
    out: dict[str, Any] = (world.get(name).get("status") or {}).get("autoscaling") or {}
    return out


def test_a_burst_scales_up_an_outage_never_scales_down_and_quiet_scales_back(world: World,
                                                                              served: dict[str, Any]) -> None:
    world.create(upstream("burst", replicas=1, engine=ENGINE, autoscaling={
        "minReplicas": 1, "maxReplicas": 3, "targets": {"waitingPerReplica": 2},
        "scaleUpStabilization": "2s", "scaleDownDelay": "10s", "scaleToZeroAfter": "1h"}))
    eventually(lambda: world.ready("burst"), timeout=120, what="upstream Ready")
    port = eventually(lambda: sim_ports(served, f"burst-vllm.{world.ns}.svc"), what="the pod's simulator")[0]
    eventually(lambda: autoscaling(world, "burst").get("reason") == "Steady", timeout=60,
               what="metrics read: Steady at 1")

    stop = threading.Event()

    def client_loop() -> None:  # keeps 2 running and more waiting in the one pod's queue
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):  # a timed-out call in the load loop is no failure
                httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                           headers=engine_auth(served["endpoints"], "burst"), json={
                    "model": "burst", "max_tokens": 200, "messages": [{"role": "user", "content": "go"}]})

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(12)]
    for t in threads:
        t.start()
    try:
        t0 = time.monotonic()
        eventually(lambda: replicas(world, "burst") >= 2, timeout=60, what="scaled up from 1 on the queue")
        took = time.monotonic() - t0
        assert world.get("burst")["spec"]["replicas"] == 1  # the user's spec is never written
        peak = replicas(world, "burst")
        print(f"scale-up 1 -> {peak} after {took:.1f} s of queueing (scaleUpStabilization 2s, scrape 1s, "
              "recheck 1s)")

        # Prometheus dies mid-run: metrics missing hold the count, for longer than scaleDownDelay.
        kill_prometheus()
        stop.set()
        eventually(lambda: autoscaling(world, "burst").get("reason") == "MetricsMissing", timeout=30,
                   what="MetricsMissing")
        cond = world.cond("burst", "ScalingActive")
        assert (cond["status"], cond["reason"]) == ("False", "MetricsMissing")
        held = replicas(world, "burst")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert replicas(world, "burst") >= held, "scaled down while Prometheus was gone"
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(70)
    restart_prometheus()
    eventually(lambda: replicas(world, "burst") == 1, timeout=120, what="back to 1 after the quiet delay")
    assert autoscaling(world, "burst")["reason"] in ("ScaleDown", "Steady")


def test_idle_goes_to_zero_and_a_request_wakes_it_while_the_next_tier_answers(world: World, served: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    ns, endpoints = world.ns, Path(served["endpoints"])
    world.create(upstream("cold", replicas=1, engine=ENGINE, autoscaling={
        "minReplicas": 0, "maxReplicas": 1, "scaleUpStabilization": "0s", "scaleDownDelay": "0s",
        "scaleToZeroAfter": "5s"}))
    world.create(upstream("warm", replicas=1, engine=ENGINE))
    body = route("chat", [{"name": "small", "match": {"complexityBelow": 0.99}, "upstream": "cold"},
                          {"name": "big", "match": {}, "upstream": "warm"}])
    body["spec"]["coldStart"] = "escalate"
    body["spec"]["cache"] = {"enabled": False}
    world.custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", body)
    eventually(lambda: world.ready("warm"), timeout=120, what="warm Ready")
    eventually(lambda: replicas(world, "cold") == 0, timeout=120, what="idle cold upstream scaled to zero")
    assert autoscaling(world, "cold")["reason"] == "ScaledToZero"

    def rendered() -> str:
        text = (world.core.read_namespaced_config_map("oculis-router-config", ns).data or {})["oculis-config.yaml"]
        return text if "scaled_to_zero: true" in text else ""

    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(eventually(rendered, what="the router config says cold is scaled to zero"))
    port, mport = free_port(), free_port()
    (localcluster.SIM / "extra-router.json").write_text(json.dumps(
        [{"targets": [f"127.0.0.1:{mport}"], "labels": {"namespace": ns, "job": "router"}}]))
    with oculis_serve(cfg, endpoints, tmp_path / "router.log", port, mport) as url:
        prom = served["prometheus"]
        eventually(lambda: httpx.get(f"{prom}/api/v1/query", params={
            "query": f'oculis_upstream_demand_total{{namespace="{ns}",upstream="cold"}}'}).json()["data"]["result"],
            timeout=30, what="Prometheus scrapes the router's demand series")
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text  # answered meanwhile, no error
        assert (r.headers["x-oculis-cold-start"], r.headers["x-oculis-upstream"]) == ("escalated", "warm")
        t0 = time.monotonic()
        eventually(lambda: replicas(world, "cold") == 1, timeout=60, what="the request's demand woke cold")
        print(f"woken {time.monotonic() - t0:.1f} s after the request (scrape 1 s, recheck 1 s)")
        assert autoscaling(world, "cold")["reason"] in ("WakeUp", "MetricsMissing", "Steady", "WaitingForReady")


def test_a_minimum_the_pool_cannot_place_names_the_pool_and_the_shortfall(world: World,
                                                                           served: dict[str, Any]) -> None:
    # The sandbox's H100 pool: 2 nodes x 8 GPUs, so at most 2 replicas of 8 GPUs.
    world.create(upstream("wide", replicas=1, gpu={"product": "H100-80GB", "count": 8}, engine=ENGINE,
                          autoscaling={"minReplicas": 3, "maxReplicas": 3}))

    def waiting() -> dict[str, Any] | None:
        c = world.cond("wide", "Progressing")
        return c if c.get("reason") == "WaitingForGPUs" else None

    cond = eventually(waiting, timeout=120, what="Progressing=True WaitingForGPUs")
    assert cond is not None and cond["status"] == "True"
    assert "H100-80GB pool" in cond["message"] and "short" in cond["message"]
    # The operator writes the status before it creates the workload (a refused write must not leave a
    # stale Ready), so the Deployment may follow the condition by a moment.
    eventually(lambda: world.deployment("wide"), timeout=60, what="Deployment wide-vllm")
    assert replicas(world, "wide") <= 2  # never asks for a replica no node can host
    events = world.core.list_namespaced_event(world.ns, field_selector="reason=WaitingForGPUs").items
    time.sleep(5)  # five more evaluations
    again = world.core.list_namespaced_event(world.ns, field_selector="reason=WaitingForGPUs").items
    assert len(events) <= 1 and sum(e.count or 1 for e in again) <= 1 + sum(e.count or 1 for e in events), \
        "the shortfall is reported once, not per evaluation"
