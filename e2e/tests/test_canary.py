"""Metric-gated canary on the sandbox for real: engine pods are simulators (e2e/podstandin.py), a real
Prometheus scrapes them, the operator (OCULIS_PROMETHEUS_URL) compares the canary's TTFT/ITL/E2E with
the stable pods' every interval. A change that makes serving worse (maxNumBatchedTokens far too low for
1,500-token prompts: prefill split into many steps) is rolled back with its figures, the stable pods
untouched; a harmless change is promoted and rolls; a canary nobody sends traffic to never promotes.

The analysis tests' load goes to every Running engine pod's simulator on 127.0.0.1 (the endpoint map's
stable and canary Service hosts). The traffic-split test goes through a local `oculis serve` on the
router config the operator writes: during the analysis the canary answers its trafficPercent of the
requests (x-oculis-revision), within a binomial bound; once the canary ends its Service is gone and
every answer is stable."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import math
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import engine_auth, eventually, oculis_serve
from kubernetes import client
from operator_fixture import free_port
from skips import needs_command
from test_gpuupstream import World, upstream
from test_inferenceroute import route

pytestmark = needs_command("prometheus", "prometheus")
ENGINE = {"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 8192, "gpuMemoryUtilization": 0.9}
CANARY = {"strategy": "Canary", "canary": {"replicas": 1, "duration": "24s", "interval": "8s", "failureLimit": 0,
                                          "minRequests": 5, "checks": {"maxRegressionPercent": 100}}}


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


class Load:
    """Requests to every engine pod's simulator, a few at a time each, until stopped."""

    def __init__(self, endpoints: Path, *hosts: str) -> None:
        self.endpoints, self.hosts, self.stop = endpoints, hosts, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def ports(self) -> list[int]:
        try:
            doc = json.loads(self.endpoints.read_text())
        except (OSError, ValueError):
            return []
        pods: list[dict[str, Any]] = [p for h in self.hosts for p in doc.get(h, {}).get("pods", [])]
        return [int(p["port"]) for p in pods]

    def one(self, port: int) -> None:
        # a pod going away mid-request: the next round picks the pods that are there
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                       headers=engine_auth(self.endpoints, self.hosts[0]), json={
                "model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": f"{uuid.uuid4()} " + "word " * 1500,
                "max_tokens": 16})  # a fresh first word: no prefix-cache hit hides the prefill

    def run(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            while not self.stop.is_set():
                ports = self.ports()
                list(pool.map(self.one, ports * 3))
                if not ports:
                    self.stop.wait(0.5)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join(60)


def hash_of(dep: client.V1Deployment) -> str:
    return str(dep.spec.template.metadata.annotations["oculis.dev/engine-hash"])


def canary_of(world: World, name: str) -> dict[str, Any]:
    found: dict[str, Any] = (world.get(name).get("status") or {}).get("canary") or {}
    return found


def test_a_worse_change_is_rolled_back_with_figures_and_a_good_one_promoted(
        world: World, served: dict[str, Any], kubeconfig: Path, bin_dir: Path) -> None:
    ns, endpoints = world.ns, Path(served["endpoints"])
    world.create(upstream("cn", replicas=1, engine=ENGINE, rollout=CANARY))
    eventually(lambda: world.ready("cn"), what="upstream Ready")
    stable = world.apps.read_namespaced_deployment("cn-vllm", ns)
    stable_hash, stable_pods = hash_of(stable), {p.metadata.name for p in world.pods("cn")}

    with Load(endpoints, f"cn-vllm.{ns}.svc", f"cn-vllm-canary.{ns}.svc"):  # stable and canary pods alike
        # Worse: 32 tokens per engine step for 1,500-token prompts.
        world.patch("cn", {"engine": {**ENGINE, "maxNumBatchedTokens": 32}})
        eventually(lambda: world.apps.read_namespaced_deployment("cn-vllm-canary", ns), what="canary Deployment")
        assert canary_of(world, "cn")["phase"] == "Analyzing"
        cond = world.cond("cn", "Progressing")
        assert cond["status"] == "True" and cond["reason"] == "CanaryAnalysis"  # Argo CD health: Progressing
        done = eventually(lambda: (c := canary_of(world, "cn")).get("phase") == "RolledBack" and c, timeout=150,
                          what="the canary rolled back")
        assert done["decision"] == "Rollback", done
        ttft = next(c for c in done["checks"] if c["name"] == "ttftP95Ms")
        assert not ttft["ok"] and ttft["canary"] > ttft["stable"] > 0, done
        assert "rolled back" in done["summary"] and "ttft FAIL" in done["summary"]
        # stable untouched, canary gone, the reason in an Event and in Degraded
        after = world.apps.read_namespaced_deployment("cn-vllm", ns)
        assert hash_of(after) == stable_hash and {p.metadata.name for p in world.pods("cn")
                                                  if "canary" not in p.metadata.name} == stable_pods
        eventually(lambda: not [d for d in world.apps.list_namespaced_deployment(ns).items
                                if d.metadata.name == "cn-vllm-canary"], what="canary Deployment deleted")
        assert world.cond("cn", "Degraded")["reason"] == "CanaryRolledBack"
        eventually(lambda: [e for e in world.core.list_namespaced_event(ns, field_selector="involvedObject.name=cn")
                            .items if e.reason == "CanaryRolledBack" and "ttftP95Ms" in (e.message or "")],
                   what="a CanaryRolledBack Event naming the failed check")  # kopf posts events in the background
        table = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "-n", ns, "get", "gu", "cn"],
                               capture_output=True, text=True, check=True).stdout
        header, row = table.splitlines()[:2]
        assert "CANARY" in header and "rolled back" in row
        # not retried for the same generation
        assert canary_of(world, "cn")["generation"] == world.get("cn")["metadata"]["generation"]

        # Harmless: back to 8192 tokens per step, a little less memory.
        world.patch("cn", {"engine": {**ENGINE, "gpuMemoryUtilization": 0.88}})
        promoted = eventually(lambda: (c := canary_of(world, "cn")).get("phase") == "Promoted" and c, timeout=150,
                              what="the canary promoted")
        assert promoted["decision"] == "Promote" and all(c["ok"] for c in promoted["checks"]), promoted
        eventually(lambda: world.ready("cn"), timeout=150, what="the promoted change rolled to every replica")
    assert hash_of(world.apps.read_namespaced_deployment("cn-vllm", ns)) == promoted["engineHash"] != stable_hash


def test_a_canary_without_traffic_is_inconclusive_and_never_promotes(world: World, served: dict[str, Any]) -> None:
    ns = world.ns
    world.create(upstream("quiet", replicas=1, engine=ENGINE, rollout={
        **CANARY, "canary": {**CANARY["canary"], "duration": "10s", "interval": "5s"}}))
    eventually(lambda: world.ready("quiet"), what="upstream Ready")
    before = hash_of(world.apps.read_namespaced_deployment("quiet-vllm", ns))
    world.patch("quiet", {"engine": {**ENGINE, "gpuMemoryUtilization": 0.88}})
    done = eventually(lambda: (c := canary_of(world, "quiet")).get("phase") == "RolledBack" and c, timeout=120,
                      what="no traffic: rolled back")
    assert done["decision"] == "Inconclusive" and "not promoted" in done["message"], done
    assert hash_of(world.apps.read_namespaced_deployment("quiet-vllm", ns)) == before


class SyncedRouter:
    """`oculis serve --endpoints` on the router ConfigMap the operator writes, copied to its config file
    whenever it changes (a kubelet updates a mounted ConfigMap the same way), as a router in the
    cluster would serve it."""

    def __init__(self, world: World, endpoints: Path, folder: Path) -> None:
        self.world, self.config, self.stop = world, folder / "oculis-config.yaml", threading.Event()
        self.text = ""
        self.thread = threading.Thread(target=self.sync, daemon=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoints, self.log = endpoints, folder / "router.log"

    def current(self) -> str:
        cm = self.world.core.read_namespaced_config_map("oculis-router-config", self.world.ns)
        return str((cm.data or {}).get("oculis-config.yaml") or "")

    def sync(self) -> None:
        while not self.stop.wait(0.3):
            with contextlib.suppress(client.ApiException, OSError):
                text = self.current()
                if text and text != self.text:
                    tmp = self.config.with_name(".config.tmp")
                    tmp.write_text(text)
                    os.replace(tmp, self.config)
                    self.text = text

    def digest(self) -> str:
        return str(httpx.get(f"{self.url}/readyz", timeout=5).json().get("config", ""))

    @contextlib.contextmanager
    def running(self) -> Iterator[SyncedRouter]:
        self.text = eventually(self.current, what="the router ConfigMap")
        self.config.write_text(self.text)
        self.thread.start()
        try:
            with oculis_serve(self.config, self.endpoints, self.log, self.port):
                yield self
        finally:
            self.stop.set()

    def serving(self, text: str) -> bool:
        """Whether the router has loaded `text` (its /readyz names the loaded file's sha256)."""
        return self.digest() == hashlib.sha256(text.encode()).hexdigest()[:12]


def burst(url: str, model: str, n: int) -> list[str]:
    """`n` distinct requests, 8 at a time; the revision that answered each."""
    def one(i: int) -> str:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": model, "max_tokens": 4, "temperature": 0.7,
            "messages": [{"role": "user", "content": f"{uuid.uuid4()} question {i}"}]})
        assert r.status_code == 200, r.text
        return r.headers["x-oculis-revision"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(n)))


def test_the_router_gives_the_canary_its_traffic_percent_then_all_traffic_to_stable(
        world: World, served: dict[str, Any], tmp_path: Path) -> None:
    ns, endpoints, percent, n = world.ns, Path(served["endpoints"]), 50, 200
    # Lenient checks and one request suffice: the burst must fall inside the analysis, never be cut by a
    # rollback of its first interval; after it the canary sees no traffic and ends (either way).
    policy = {**CANARY, "canary": {**CANARY["canary"], "trafficPercent": percent, "duration": "60s",
                                   "interval": "30s", "minRequests": 1, "checks": {"maxRegressionPercent": 400}}}
    world.create(upstream("split", replicas=1, engine=ENGINE, rollout=policy))
    world.custom.create_namespaced_custom_object("oculis.dev", "v1alpha1", ns, "inferenceroutes", route(
        "split-chat", [{"name": "only", "match": {}, "upstream": "split"}]))
    eventually(lambda: world.ready("split"), what="upstream Ready")
    canary_host = f"split-vllm-canary.{ns}.svc"

    def endpoint_ports(host: str) -> list[int]:
        ports: list[int] = json.loads(endpoints.read_text()).get(host, {}).get("ports", [])
        return ports

    with SyncedRouter(world, endpoints, tmp_path).running() as router:
        world.patch("split", {"engine": {**ENGINE, "gpuMemoryUtilization": 0.88}})
        # the analysis under way (the canary replicas up), and the router config says so
        text = eventually(lambda: (t := router.current()) and canary_host in t and t, timeout=120,
                          what="the canary in the router config")
        assert f"percent: {percent}" in text and canary_of(world, "split")["phase"] == "Analyzing"
        svc = world.core.read_namespaced_service("split-vllm-canary", ns)
        stable_svc = world.core.read_namespaced_service("split-vllm", ns)
        pod_labels = {p.metadata.name: p.metadata.labels for p in world.pods("split")}
        canary_pods = {name for name in pod_labels if name.startswith("split-vllm-canary-")}

        def selected(selector: dict[str, str]) -> set[str]:
            return {n for n, labels in pod_labels.items() if all(labels.get(k) == v for k, v in selector.items())}

        assert canary_pods and selected(svc.spec.selector) == canary_pods  # the canary Service: canary pods only
        assert selected(stable_svc.spec.selector) == set(pod_labels) - canary_pods  # the stable one: the rest
        eventually(lambda: endpoint_ports(canary_host), what="the canary pod's simulator in the endpoint map")
        eventually(lambda: router.serving(text), what="the router serving the config with the canary")
        seen = burst(router.url, "split-chat", n)
        assert canary_of(world, "split")["phase"] == "Analyzing"  # the whole burst fell inside the analysis
        canary = seen.count("canary")
        sigma = math.sqrt(n * percent / 100 * (1 - percent / 100))
        assert abs(canary - n * percent / 100) <= 4 * sigma, f"{canary} of {n} answered by the canary"
        assert seen.count("stable") == n - canary

        done = eventually(lambda: (c := canary_of(world, "split")).get("phase") in ("Promoted", "RolledBack") and c,
                          timeout=150, what="the canary decided")
        eventually(lambda: not [s for s in world.core.list_namespaced_service(ns).items
                                if s.metadata.name == "split-vllm-canary"], what="canary Service deleted")
        eventually(lambda: not [p for p in world.pods("split") if p.metadata.name.startswith("split-vllm-canary-")],
                   timeout=120, what="the canary pods gone")
        if done["phase"] == "Promoted":  # then the stable Deployment rolls to the new engine first
            eventually(lambda: world.ready("split"), timeout=150, what="the promoted change on every replica")
        after = eventually(lambda: (t := router.current()) and canary_host not in t and t,
                           what="the canary gone from the router config")
        eventually(lambda: router.serving(after), what="the router serving the config without the canary")
        assert set(burst(router.url, "split-chat", 40)) == {"stable"}
