"""LoRA adapters added to and removed from a running GPUUpstream without a restart (issue 26, "Loading"):
the operator loads them through each engine's /v1/load_lora_adapter (the pods are `oculis sim serve`
processes of the pod stand-in, reached at their loopback ports through its endpoint map, never at pod
IPs), reports per-adapter readiness (status.adapters, `kubectl get gu` ADAPTERS, AdaptersReady), and an
adapter whose source the engine cannot read is a condition and a Warning naming it, with nothing restarted.
A request through the router for the adapter is answered by the adapter once it is loaded."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import engine_auth, eventually, oculis_serve
from kubernetes import client
from skips import needs_command
from test_gpuupstream import World, upstream
from test_inferenceroute import route

pytestmark = needs_command("prometheus", "prometheus")
G, V = "oculis.dev", "v1alpha1"
ROUTER_PORT = 31080


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def adapter_folder(tmp_path: Path, name: str) -> str:
    """An adapter the simulated engines can read, as vLLM reads one: a folder with adapter_config.json."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "peft_type": "LORA"}))
    return str(folder)


def test_adapters_load_and_unload_on_running_pods_without_a_restart(
        world: World, served: dict[str, Any], tmp_path: Path, bin_dir: Path, kubeconfig: Path) -> None:
    ns, endpoints = world.ns, Path(served["endpoints"])
    host = f"llm-vllm.{ns}.svc"
    # adapters: [] turns LoRA on (--enable-lora) from the start; adapters then come and go at runtime.
    world.create(upstream("llm", replicas=2, adapters=[],
                         engine={"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 4096, "maxLoras": 2}))
    world.custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", route("chat", [
        {"name": "only", "match": {}, "upstream": "llm"}]))
    eventually(lambda: world.ready("llm"), what="upstream Ready")

    def serving() -> dict[str, int]:
        entry = json.loads(endpoints.read_text()).get(host, {})
        pods = {p.metadata.name for p in world.pods("llm")
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
        ours = {p["pod"]: p["port"] for p in entry.get("pods", [])}
        return ours if len(ours) == 2 and set(ours) == pods else {}

    ports = eventually(serving, timeout=90, what="both pods' simulators in the endpoint map")
    uids = {p.metadata.name: p.metadata.uid for p in world.pods("llm")}
    replica_sets = sorted(rs.metadata.name for rs in world.apps.list_namespaced_replica_set(
        ns, label_selector="oculis.dev/upstream=llm").items)
    template_hash = world.get("llm")["status"]["engineHash"]
    argv = world.deployment("llm").spec.template.spec.containers[0].args
    assert "--enable-lora" in argv and "--max-loras=2" in argv and "--lora-modules" not in argv

    def adapters_on(port: int) -> dict[str, str]:
        data = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5,
                         headers=engine_auth(endpoints, "llm")).json()["data"]
        return {m["id"]: m["parent"] for m in data if m.get("parent")}

    def status() -> dict[str, Any]:
        st: dict[str, Any] = world.get("llm").get("status") or {}
        return st

    # Add an adapter: loaded on every pod through the engine API.
    sql = adapter_folder(tmp_path, "sql")
    world.patch("llm", {"adapters": [{"name": "sql", "source": {"path": sql}}]})
    eventually(lambda: all(adapters_on(p) == {"sql": "llm"} for p in ports.values()), timeout=60,
               what="the adapter listed by every pod's /v1/models")
    eventually(lambda: status().get("adaptersReady") == "1/1" and status().get("adapters") == [
        {"name": "sql", "ready": 2}] and world.cond("llm", "AdaptersReady").get("status") == "True",
        what="status.adapters: sql on both ready replicas")
    table = subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "-n", ns, "get", "gu", "llm"],
                           capture_output=True, text=True, check=True).stdout
    header, row = table.splitlines()[:2]  # columns are aligned; an empty one (DESIRED) is blank, not <none>
    assert "ADAPTERS" in header and row[header.index("ADAPTERS"):].split()[0] == "1/1", table

    # A request for the adapter through the router the operator configured is answered by the adapter.
    def rendered() -> str:
        text = (world.core.read_namespaced_config_map("oculis-router-config", ns).data or {})["oculis-config.yaml"]
        return text if "sql" in text else ""

    (tmp_path / "oculis-config.yaml").write_text(eventually(rendered, what="the router config lists the adapter"))
    with oculis_serve(tmp_path / "oculis-config.yaml", endpoints, tmp_path / "router.log", ROUTER_PORT) as url:
        def ask() -> httpx.Response:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
                "model": "llm/sql", "max_tokens": 4, "messages": [{"role": "user", "content": "select?"}]})
            assert r.status_code == 200, r.text
            return r

        answer = eventually(ask, timeout=30, what="the router answers for llm/sql")
        assert answer.json()["model"] == "sql" and answer.headers.get("x-oculis-adapter") == "sql"

    # An adapter whose source the engine cannot read: a condition and a Warning naming it; sql still serves.
    world.patch("llm", {"adapters": [{"name": "sql", "source": {"path": sql}},
                                     {"name": "broken", "source": {"path": "/nonexistent/broken"}}]})
    cond = eventually(lambda: (c := world.cond("llm", "AdaptersReady")).get("reason") == "AdapterLoadFailed" and c,
                      timeout=60, what="AdaptersReady=False naming the unreadable adapter")
    assert cond["status"] == "False" and "'broken'" in cond["message"], cond
    assert "No adapter found for /nonexistent/broken" in cond["message"], cond
    assert status()["adaptersReady"] == "1/2" and world.cond("llm", "Ready").get("status") == "True"
    assert all(adapters_on(p) == {"sql": "llm"} for p in ports.values())

    def warned() -> bool:
        events = world.core.list_namespaced_event(ns, field_selector="involvedObject.name=llm").items
        return any(e.reason == "AdapterLoadFailed" and e.type == "Warning" and "broken" in e.message for e in events)

    eventually(warned, what="an AdapterLoadFailed Warning event")

    # Remove them all: unloaded from every pod; LoRA stays on, so still nothing restarts.
    world.patch("llm", {"adapters": []})
    eventually(lambda: all(adapters_on(p) == {} for p in ports.values()), timeout=60,
               what="no adapter left on any pod")
    eventually(lambda: status().get("adaptersReady") == "0/0"
               and world.cond("llm", "AdaptersReady").get("reason") == "NoAdapters", what="status: no adapters")

    # No pod restarted: the same pods (UIDs), ReplicaSets, engine hash and simulator processes.
    assert {p.metadata.name: p.metadata.uid for p in world.pods("llm")} == uids
    assert sorted(rs.metadata.name for rs in world.apps.list_namespaced_replica_set(
        ns, label_selector="oculis.dev/upstream=llm").items) == replica_sets
    assert status()["engineHash"] == template_hash and serving() == ports
    assert all(cs.restart_count == 0 for p in world.pods("llm") for cs in p.status.container_statuses or [])
