"""Sandbox pods that serve: a GPUUpstream's pods become `oculis sim serve` processes (e2e/podstandin.py)
answering through a local `oculis serve --endpoints`, scraped by a real Prometheus; an engine change
rolls them and what Prometheus scrapes follows; the processes go away with their pods.

Only 127.0.0.1 is dialled: the router's config names the in-cluster Service host, the endpoint map
sends that host to the simulators' loopback ports."""

from __future__ import annotations

import json
import subprocess
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


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def promql(url: str, query: str) -> list[dict[str, Any]]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_engine_pods_serve_simulated_tokens_and_a_rollout_changes_what_prometheus_scrapes(
        world: World, served: dict[str, Any], tmp_path: Path) -> None:
    ns, prom, endpoints = world.ns, served["prometheus"], Path(served["endpoints"])
    host = f"llm-vllm.{ns}.svc"
    world.create(upstream("llm", replicas=1, engine={"maxModelLen": 8192, "maxNumSeqs": 32,
                                                     "maxNumBatchedTokens": 4096, "gpuMemoryUtilization": 0.9}))
    world.custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", route("chat", [
        {"name": "only", "match": {}, "upstream": "llm"}]))
    eventually(lambda: world.ready("llm"), what="upstream Ready")

    def serving() -> list[dict[str, Any]]:
        entry = json.loads(endpoints.read_text()).get(host, {})
        listed: list[Any] = world.pods("llm")
        pods = {p.metadata.name for p in listed if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
        ours: list[dict[str, Any]] = entry.get("pods", [])
        return ours if ours and {p["pod"] for p in ours} == pods else []

    first = eventually(serving, what="the pod's simulator in the endpoint map")
    assert len(first) == 1 and entry_ports(endpoints, host) == [first[0]["port"]]

    # The router the operator configured (ConfigMap), run locally: its base_url is the Service host.
    def rendered() -> str:
        text = (world.core.read_namespaced_config_map("oculis-router-config", ns).data or {})["oculis-config.yaml"]
        return text if host in text else ""

    text = eventually(rendered, what="the route's router config names the Service host")
    (tmp_path / "oculis-config.yaml").write_text(text)
    port = free_port()
    with oculis_serve(tmp_path / "oculis-config.yaml", endpoints, tmp_path / "router.log", port) as url:

        def ask() -> dict[str, Any]:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
                "model": "chat", "max_tokens": 12, "messages": [{"role": "user", "content": "hello there"}]})
            assert r.status_code == 200, r.text
            out: dict[str, Any] = r.json()
            return out

        answer = ask()
        words = answer["choices"][0]["message"]["content"].split()
        assert answer["system_fingerprint"] == "oculis-simulator"  # simulated, and says so
        assert len(words) == answer["usage"]["completion_tokens"] > 0

        # Streamed token by token: the words that arrive are the tokens usage counts.
        deltas, usage = [], None
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
                "model": "chat", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "stream please"}]}) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
                    deltas += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
        assert usage and len("".join(deltas).split()) == usage["completion_tokens"] == 8
        assert len([d for d in deltas if d]) > 1  # more than one chunk: a stream, not one blob

        pod1 = first[0]["pod"]
        sel = f'namespace="{ns}",pod="{pod1}",upstream="llm"'
        eventually(lambda: promql(prom, f"vllm:generation_tokens_total{{{sel}}} >= "
                                        f"{answer['usage']['completion_tokens'] + 8}"),
                   what="Prometheus scrapes the pod's generated tokens")
        old_cfg = eventually(lambda: promql(prom, f"vllm:cache_config_info{{{sel}}}"), what="pod 1 config")
        assert old_cfg[0]["metric"]["gpu_memory_utilization"] == "0.9"

        # An engine change rolls the Deployment: a new pod, a new simulator with the new setting.
        world.patch("llm", {"engine": {"gpuMemoryUtilization": 0.8}})
        second = eventually(lambda: (s := serving()) and s[0]["pod"] != pod1 and s, timeout=120,
                            what="the new pod's simulator replaces the old one in the endpoint map")
        pod2 = second[0]["pod"]
        eventually(lambda: not alive(first[0]["pid"]), what="the old pod's simulator stopped")
        sel2 = f'namespace="{ns}",pod="{pod2}",upstream="llm"'
        new_cfg = eventually(lambda: promql(prom, f"vllm:cache_config_info{{{sel2}}}"), what="pod 2 config")
        assert new_cfg[0]["metric"]["gpu_memory_utilization"] == "0.8"
        assert int(new_cfg[0]["metric"]["num_gpu_blocks"]) < int(old_cfg[0]["metric"]["num_gpu_blocks"])

        def targets() -> set[str]:
            active = httpx.get(f"{prom}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return {t["labels"]["pod"] for t in active if t["labels"].get("namespace") == ns}

        eventually(lambda: targets() == {pod2}, what="Prometheus scrapes only the new pod")
        again = ask()  # the router follows the map to the new pod
        eventually(lambda: promql(prom, f"vllm:generation_tokens_total{{{sel2}}} >= "
                                        f"{again['usage']['completion_tokens']}"),
                   what="the new pod's tokens scraped")

        # The processes go away with their pods.
        world.custom.delete_namespaced_custom_object(G, V, ns, "gpuupstreams", "llm")
        eventually(lambda: not alive(second[0]["pid"]), timeout=120, what="the simulator stopped with its pod")
        eventually(lambda: entry_ports(endpoints, host) == [], what="no port left in the endpoint map")
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "chat", "messages": [{"role": "user", "content": "anyone?"}]})
        assert r.status_code in (502, 503), r.text  # refused here, never sent to DNS or a pod IP


def entry_ports(endpoints: Path, host: str) -> list[int]:
    ports: list[int] = json.loads(endpoints.read_text()).get(host, {}).get("ports", [])
    return ports



ENGINE_POD_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: x-vllm}
spec:
  replicas: 1
  selector: {matchLabels: {app.kubernetes.io/name: vllm, oculis.dev/upstream: x}}
  template:
    metadata: {labels: {app.kubernetes.io/name: vllm, app.kubernetes.io/managed-by: oculis, oculis.dev/upstream: x}}
    spec:
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
      nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.20.0
          args: [meta-llama/Llama-3.1-8B-Instruct, --host=0.0.0.0, --port=8000, --max-num-seqs=8]
"""


def test_cluster_down_stops_the_stand_in_its_simulators_and_prometheus(tmp_path: Path) -> None:
    # A second cluster of its own (as test_cluster_cli does), so `down` touches nobody else's.
    from test_cluster_cli import cluster, pick_ports, procs_under

    state = tmp_path / "state"
    ports = pick_ports()
    env = {"OCULIS_E2E_STATE": str(state), **{f"OCULIS_E2E_{k}_PORT": str(v) for k, v in ports.items()},
           "OCULIS_E2E_PROMETHEUS_PORT": str(free_port())}
    try:
        up = cluster("up", env=env)
        assert up.returncode == 0, up.stderr
        kubeconfig = up.stdout.strip().splitlines()[-1]
        sp = cluster("serve-pods", env=env)
        assert sp.returncode == 0, sp.stderr
        files = json.loads(sp.stdout.strip().splitlines()[-1])
        kubectl = Path(cluster("bin-dir", env=env).stdout.strip().splitlines()[-1]) / "kubectl"
        subprocess.run([str(kubectl), "--kubeconfig", kubeconfig, "-n", "default", "apply", "-f", "-"],
                       input=ENGINE_POD_DEPLOYMENT, text=True, check=True, capture_output=True)

        def pods() -> list[dict[str, Any]]:
            entry = json.loads(Path(files["endpoints"]).read_text()).get("x-vllm.default.svc", {})
            found: list[dict[str, Any]] = entry.get("pods", [])
            return found

        sim = eventually(pods, what="the pod's simulator")[0]
        extras = [int((state / "pids" / f"{n}.pid").read_text()) for n in ("podstandin", "prometheus")]
        assert all(alive(p) for p in [*extras, sim["pid"]])
        assert httpx.get(f"http://127.0.0.1:{sim['port']}/health").status_code == 200
        down = cluster("down", env=env)
        assert down.returncode == 0, down.stderr
        eventually(lambda: not any(alive(p) for p in [*extras, sim["pid"]]) and not procs_under(state),
                   timeout=30, what="the stand-in, its simulator and Prometheus gone")
    finally:
        cluster("down", env=env)
