"""Metric-gated canary on the sandbox for real: engine pods are simulators (e2e/podstandin.py), a real
Prometheus scrapes them, the operator (OCULIS_PROMETHEUS_URL) compares the canary's TTFT/ITL/E2E with
the stable pods' every interval. A change that makes serving worse (maxNumBatchedTokens far too low for
1,500-token prompts: prefill split into many steps) is rolled back with its figures, the stable pods
untouched; a harmless change is promoted and rolls; a canary nobody sends traffic to never promotes.

Traffic goes to every Running engine pod's simulator on 127.0.0.1 (the endpoint map), as a Service
spreading requests over stable and canary pods would."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import shutil
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import eventually
from kubernetes import client
from test_gpuupstream import World, upstream

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
ENGINE = {"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 8192, "gpuMemoryUtilization": 0.9}
CANARY = {"strategy": "Canary", "canary": {"replicas": 1, "duration": "24s", "interval": "8s", "failureLimit": 0,
                                          "minRequests": 5, "checks": {"maxRegressionPercent": 100}}}


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


class Load:
    """Requests to every engine pod's simulator, a few at a time each, until stopped."""

    def __init__(self, endpoints: Path, host: str) -> None:
        self.endpoints, self.host, self.stop = endpoints, host, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def ports(self) -> list[int]:
        try:
            pods: list[dict[str, Any]] = json.loads(self.endpoints.read_text()).get(self.host, {}).get("pods", [])
        except (OSError, ValueError):
            return []
        return [int(p["port"]) for p in pods]

    @staticmethod
    def one(port: int) -> None:
        # a pod going away mid-request: the next round picks the pods that are there
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30, json={
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

    with Load(endpoints, f"cn-vllm.{ns}.svc"):
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
