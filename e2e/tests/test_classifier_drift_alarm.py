"""A shift of a route's traffic mix raises ClassifierDrift: requests through a local `oculis serve` over
simulator pods, the router's counters scraped by the sandbox's real Prometheus, the operator comparing
the short window with the baseline (InferenceRoute spec.classifierDrift) into status.traffic and the
condition. Windows of seconds; only 127.0.0.1 is dialled."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import eventually, localcluster, oculis_serve
from kubernetes import client
from operator_fixture import free_port
from skips import needs_command
from test_autoscaling import ENGINE, served, sim_ports  # noqa: F401 (served: the fixture)
from test_gpuupstream import World, upstream
from test_inferenceroute import route

pytestmark = needs_command("prometheus", "prometheus")
G, V = "oculis.dev", "v1alpha1"


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def route_status(world: World, name: str) -> dict[str, Any]:
    obj: Any = world.custom.get_namespaced_custom_object(G, V, world.ns, "inferenceroutes", name)
    status: dict[str, Any] = obj.get("status") or {}
    return status


def drift(world: World) -> dict[str, Any]:
    conds: list[dict[str, Any]] = route_status(world, "mix").get("conditions", [])
    return next((c for c in conds if c["type"] == "ClassifierDrift"), {})


def test_a_shift_of_the_traffic_mix_raises_classifier_drift(world: World, served: dict[str, Any],  # noqa: F811
                                                            tmp_path: Path) -> None:
    ns = world.ns
    for name in ("short-up", "long-up"):
        world.create(upstream(name, replicas=1, engine=ENGINE))
    # Deterministic tiers: prompt length, not the classifier's score, decides (no escalation either).
    body = route("mix", [{"name": "short", "match": {"maxPromptTokens": 24}, "upstream": "short-up"},
                         {"name": "long", "match": {}, "upstream": "long-up"}])
    body["spec"].update(cache={"enabled": False}, escalation={"enabled": False},
                        classifierDrift={"shortWindow": "15s", "longWindow": "10m", "factor": 2, "minRequests": 10})
    world.custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", body)
    for name in ("short-up", "long-up"):
        eventually(lambda n=name: world.ready(n), timeout=120, what=f"{name} Ready")  # type: ignore[misc]
        eventually(lambda n=name: sim_ports(served, f"{n}-vllm.{ns}.svc"), timeout=60,  # type: ignore[misc]
                   what=f"{name}'s simulator in the endpoint map")

    def rendered() -> str:
        text = (world.core.read_namespaced_config_map("oculis-router-config", ns).data or {})["oculis-config.yaml"]
        return text if "long-up" in text and "short-up" in text else ""

    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(eventually(rendered, what="the route rendered"))
    port, mport = free_port(), free_port()
    (localcluster.SIM / "extra-router.json").write_text(json.dumps(
        [{"targets": [f"127.0.0.1:{mport}"], "labels": {"namespace": ns, "job": "router"}}]))
    url = f"http://127.0.0.1:{port}"

    def ask(long: bool, i: int) -> None:
        text = (f"request {i}: " + "please explain in detail how the scheduler batches sequences " * 4) if long \
            else f"hi {i}"
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "mix", "max_tokens": 4, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
        assert r.headers["x-oculis-tier"] == ("long" if long else "short")

    with oculis_serve(cfg, served["endpoints"], tmp_path / "router.log", port, mport):
        ask(False, -1)
        ask(True, -1)  # both tiers' series exist before the counted traffic (increase() skips a series' birth)
        time.sleep(4)
        for i in range(30):  # the baseline: mostly short prompts
            ask(i % 10 == 0, i)
        time.sleep(17)  # the baseline leaves the 15 s short window
        assert drift(world).get("status") != "True", drift(world)
        for i in range(30):  # the shift: mostly long prompts
            ask(i % 10 != 0, i)

        def raised() -> dict[str, Any] | None:
            c = drift(world)
            return c if c.get("status") == "True" else None

        cond = eventually(raised, timeout=30, what="ClassifierDrift=True")
        assert cond is not None and "tier long share" in cond["message"] and "baseline" in cond["message"]
        traffic = route_status(world, "mix")["traffic"]
        assert traffic["window"] == "15s" and traffic["baseline"]["window"] == "10m"
        assert traffic["tierShares"]["long"] > 2 * traffic["baseline"]["tierShares"]["long"]
        print(f"ClassifierDrift: {cond['message']}")
