"""A three-replica GPUUpstream in the sandbox, picked per request by the router: each engine pod is its
own replica (the stand-in's endpoint map names them), shared-prefix traffic keeps to the pods holding
its prefix, and a rolling update of engine settings moves the traffic to the new pods without a single
failed request (a pod whose process goes away mid-call is set aside and the call retried on another
replica). The operator also renders the upstream's InferencePool (the CRD is installed for the suite).

Only 127.0.0.1 is dialled: the router's config names the in-cluster Service host, the endpoint map
sends that host's pods to the simulators' loopback ports."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import eventually, oculis_serve
from kubernetes import client
from operator_fixture import free_port
from skips import needs_command
from test_gpuupstream import World, upstream
from test_inferenceroute import route

pytestmark = needs_command("prometheus", "prometheus")
G, V = "oculis.dev", "v1alpha1"
PREFIXES = [" ".join(f"g{g}w{i}" for i in range(300)) for g in range(3)]


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def test_three_replicas_are_picked_per_request_and_a_rolling_update_fails_no_request(
        world: World, served: dict[str, Any], tmp_path: Path) -> None:
    ns, endpoints = world.ns, Path(served["endpoints"])
    host = f"llm-vllm.{ns}.svc"
    # Ready only once its simulator would be serving, as a readiness probe gates a real engine pod: kwok
    # makes a pod Ready at once, and a rollout that outpaces the simulators' start would leave no pod up.
    world.create(upstream("llm", replicas=3, routing={"picker": "prefix"},
                          podAnnotations={"oculis.dev/e2e-ready-delay": "10s"},
                          engine={"maxModelLen": 4096, "maxNumSeqs": 32, "maxNumBatchedTokens": 4096}))
    world.custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", route("chat", [
        {"name": "only", "match": {}, "upstream": "llm"}]))
    eventually(lambda: world.ready("llm"), timeout=120, what="upstream Ready")

    def serving() -> set[str]:
        entry = json.loads(endpoints.read_text()).get(host, {})
        live = {p.metadata.name for p in world.pods("llm")
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
        ours = {p["pod"] for p in entry.get("pods", [])}
        return ours if ours == live else set()

    first = eventually(lambda: (s := serving()) and len(s) == 3 and s, timeout=120,
                       what="three pods' simulators in the endpoint map")

    pool = world.custom.get_namespaced_custom_object("inference.networking.k8s.io", "v1", ns, "inferencepools",
                                                     "llm-vllm")
    assert pool["spec"] == {"selector": {"matchLabels": {"oculis.dev/upstream": "llm",
                                                         "app.kubernetes.io/name": "vllm"}},
                            "targetPorts": [{"number": 8000}]}

    def rendered() -> str:
        text = (world.core.read_namespaced_config_map("oculis-router-config", ns).data or {})["oculis-config.yaml"]
        return text if host in text and "picker: prefix" in text else ""

    (tmp_path / "oculis-config.yaml").write_text(eventually(rendered, what="the picker in the router config"))
    with oculis_serve(tmp_path / "oculis-config.yaml", endpoints, tmp_path / "router.log", free_port()) as url:

        def ask(n: int, stream: bool) -> tuple[int, str, str]:
            body = {"model": "chat", "max_tokens": 6, "stream": stream,
                    "messages": [{"role": "system", "content": PREFIXES[n % 3]},
                                 {"role": "user", "content": f"question {n}"}]}
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
                text = resp.read().decode()
                return resp.status_code, resp.headers.get("x-oculis-replica", ""), text

        picked: dict[int, set[str]] = {}
        for n in range(12):
            status, replica, _ = ask(n, False)
            assert status == 200
            picked.setdefault(n % 3, set()).add(replica)
        assert set().union(*picked.values()) <= first  # each pod is its own replica, named by the pod
        assert all(len(r) == 1 for r in picked.values())  # a prefix group keeps to the pod that holds it

        # Traffic during a rolling update of engine settings: every request answered, no stream broken.
        results: list[tuple[int, str, str]] = []
        stop = threading.Event()

        def load(k: int) -> None:
            n = k
            while not stop.is_set():
                results.append(ask(n, n % 2 == 0))
                n += 2

        threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        try:
            world.patch("llm", {"engine": {"gpuMemoryUtilization": 0.85}})
            eventually(lambda: (s := serving()) and len(s) == 3 and not (s & first), timeout=240,
                       what="three new pods serve, none of the old")
            eventually(lambda: world.ready("llm"), timeout=120, what="upstream Ready after the rollout")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        failed = [(s, r, t[:300]) for s, r, t in results if s != 200 or "stream_interrupted" in t]
        assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:3]}"
        after = {r for _, r, _ in results[-6:]}
        assert after and not (after & first)  # the traffic moved to the new pods
        assert len(results) >= 10
        print(f"\n{len(results)} requests during the rollout, none failed; answered last by {sorted(after)}")
