"""The sandbox's pod stand-in (e2e/podstandin.py): a Running engine pod gets a process started with
the pod's own args on a loopback port, listed in the Prometheus targets and the endpoint map only once
it answers /health, and stopped (and unlisted first) when the pod goes or stops Running."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("podstandin", ROOT / "e2e" / "podstandin.py")
assert spec and spec.loader
ps = importlib.util.module_from_spec(spec)
sys.modules["podstandin"] = ps
spec.loader.exec_module(ps)

ARGS = ["meta-llama/Llama-3.1-8B-Instruct", "--host=0.0.0.0", "--port=8000", "--served-model-name", "llm",
        "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs=32"]

# Stands in for `oculis`: records its argv, then serves /health on the last --port it was given.
FAKE_OCULIS = f"""#!{sys.executable}
import http.server, json, sys
argv = sys.argv[1:]
port = int(argv[len(argv) - 1 - argv[::-1].index("--port") + 1])
open(sys.argv[0] + f".{{port}}.argv", "w").write(json.dumps(argv))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def pod(name: str, phase: str = "Running", deleting: bool = False, upstream: str = "llm",
        canary: bool = False) -> dict[str, Any]:
    labels = ({"oculis.dev/upstream": upstream, "app.kubernetes.io/name": "vllm-canary", "oculis.dev/track": "canary"}
              if canary else {"oculis.dev/upstream": upstream, "app.kubernetes.io/name": "vllm"})
    meta: dict[str, Any] = {"namespace": "demo", "name": name, "uid": f"uid-{name}", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "h100-pool-0", "containers": [{"name": "vllm", "args": ARGS}]},
            "status": {"phase": phase}}


def view(obj: dict[str, Any]) -> Any:
    v = ps.pod_view(obj)
    assert v is not None
    return v


def test_pods_map_to_processes_by_phase_and_deletion() -> None:
    running, pending, deleting = view(pod("a")), view(pod("b", "Pending")), view(pod("c", deleting=True))
    assert ps.pod_view({"metadata": {"name": "x", "labels": {}}, "spec": {"containers": [{}]}}) is None
    assert running.service_host == "llm-vllm.demo.svc"  # the base_url host the operator renders
    start, stop = ps.plan([running, pending, deleting], ["demo/c/uid-c", "demo/gone/uid-gone"])
    assert [p.name for p in start] == ["a"] and stop == ["demo/c/uid-c", "demo/gone/uid-gone"]
    assert running.env == ()
    lora = pod("l")
    lora["spec"]["containers"][0]["env"] = [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"},
                                            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s"}}}]
    assert view(lora).env == (("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"),)  # the sim gets the pod's env
    argv = ps.sim_argv("oculis", running, 41000, "NVIDIA-H100-80GB-HBM3")
    assert argv[:3] == ["oculis", "sim", "serve"] and argv[3:3 + len(ARGS)] == ARGS  # the pod's own args
    assert argv[3 + len(ARGS):] == ["--host", "127.0.0.1", "--port", "41000", "--gpu", "NVIDIA-H100-80GB-HBM3"]


def test_stand_in_serves_running_pods_and_stops_them_with_the_pod(tmp_path: Path) -> None:
    oculis = tmp_path / "oculis"
    oculis.write_text(FAKE_OCULIS)
    oculis.chmod(0o755)
    s = ps.StandIn(tmp_path / "sim", str(oculis), gpu_of=lambda node: "NVIDIA-H100-80GB-HBM3")
    targets, endpoints = tmp_path / "sim" / "targets.json", tmp_path / "sim" / "endpoints.json"
    assert json.loads(targets.read_text()) == [] and json.loads(endpoints.read_text()) == {}
    try:
        s.update("ADDED", view(pod("a", "Pending")))
        assert not s.procs  # nothing runs before the pod does
        s.update("MODIFIED", view(pod("a")))
        proc = s.procs["demo/a/uid-a"]

        def listed() -> list[Any]:
            s.reconcile()
            out: list[Any] = json.loads(targets.read_text())
            return out

        deadline = time.monotonic() + 20
        while not listed() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listed() == [{"targets": [f"127.0.0.1:{proc.port}"],
                             "labels": {"namespace": "demo", "pod": "a", "upstream": "llm"}}]
        assert json.loads(endpoints.read_text())["llm-vllm.demo.svc"]["ports"] == [proc.port]
        argv = json.loads(Path(f"{oculis}.{proc.port}.argv").read_text())
        assert argv[-2:] == ["--gpu", "NVIDIA-H100-80GB-HBM3"] and "--port=8000" in argv

        s.update("MODIFIED", view(pod("a", deleting=True)))  # termination starts: unlisted, then SIGTERM
        assert not s.procs and json.loads(targets.read_text()) == []
        assert json.loads(endpoints.read_text())["llm-vllm.demo.svc"]["ports"] == []  # known, none serving
        assert proc.popen.wait(10) is not None
    finally:
        s.shutdown()


def test_canary_pods_map_to_the_canary_service_host_and_stable_pods_to_the_stable_one_only() -> None:
    stable, canary = view(pod("llm-vllm-7c9d-abcde")), view(pod("llm-vllm-canary-5f8b-fghij", canary=True))
    assert (stable.track, canary.track) == ("stable", "canary")
    # the hosts of render.endpoint() and render.canary_endpoint(), as their Services select the pods
    assert stable.service_host == "llm-vllm.demo.svc" and canary.service_host == "llm-vllm-canary.demo.svc"
    doc = ps.endpoint_map([ps.Serving(stable, 41000, 1), ps.Serving(canary, 41001, 2)])
    assert doc["llm-vllm.demo.svc"]["ports"] == [41000] and doc["llm-vllm-canary.demo.svc"]["ports"] == [41001]
    # once the canary goes, its host stays known with no port (the router says nothing serves it)
    gone = ps.endpoint_map([ps.Serving(stable, 41000, 1)], [stable, canary])
    assert gone["llm-vllm-canary.demo.svc"]["ports"] == [] and gone["llm-vllm.demo.svc"]["ports"] == [41000]
    # the watch lists both kinds of engine pod
    assert "app.kubernetes.io/name in (vllm,vllm-canary)" in ps.SELECTOR


def test_a_pod_publishing_kv_events_publishes_on_its_own_loopback_port_listed_in_the_map() -> None:
    import json

    kv = '--kv-events-config={"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","publisher":"zmq","topic":"kv"}'
    obj = pod("a")
    obj["spec"]["containers"][0]["args"] = [*ARGS, kv]
    publishing = view(obj)
    argv = ps.sim_argv("oculis", publishing, 41000, None, 41001)
    last = json.loads(argv[-1].split("=", 1)[1])  # argparse keeps the last one
    assert last == {"enable_kv_cache_events": True, "endpoint": "tcp://*:41001", "publisher": "zmq",
                    "topic": "kv"}
    assert ps.sim_argv("oculis", view(pod("b")), 41000, None, 41001)[-1] == "41000"  # no publisher: nothing added
    doc = ps.endpoint_map([ps.Serving(publishing, 41000, 1, "tcp://127.0.0.1:41001")])
    assert doc["llm-vllm.demo.svc"]["pods"] == [{"pod": "a", "port": 41000, "pid": 1,
                                                 "kv_events": "tcp://127.0.0.1:41001"}]


def test_an_annotated_pod_runs_real_vllm_with_its_flags_fitted_to_the_tiny_model() -> None:
    obj = pod("r")
    obj["metadata"]["annotations"] = {"oculis.dev/e2e-real-vllm": "true"}
    obj["spec"]["containers"][0]["args"] = [*ARGS, "--tensor-parallel-size=2", "--max-model-len=8192",
                                            "--quantization=fp8", "--no-enable-prefix-caching",
                                            '--speculative-config={"model":"m","num_speculative_tokens":2}']
    real, plain = view(obj), view(pod("s"))
    assert real.real and not plain.real
    argv = ps.real_vllm_argv("/v/bin/vllm", "/tiny", real, 41001)
    assert argv[:3] == ["/v/bin/vllm", "serve", "/tiny"]
    assert "--no-enable-prefix-caching" in argv and "--max-num-seqs=32" in argv  # the pod's engine settings
    assert argv[3:6] == ["--served-model-name", "llm", "meta-llama/Llama-3.1-8B-Instruct"]  # its names
    assert not [a for a in argv if a.startswith(("--tensor-parallel-size", "--quantization", "--speculative",
                                                 "--host=", "--port="))]
    assert argv[-7:] == ["--max-model-len=512", "--dtype=bfloat16", "--enforce-eager", "--host", "127.0.0.1",
                         "--port", "41001"]


def test_env_from_a_secret_is_resolved_as_the_kubelet_does_and_the_engine_key_written_for_the_router(
        tmp_path: Path) -> None:
    keyed = pod("k")
    keyed["spec"]["containers"][0]["env"] = [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "oculis-engine-keys", "key": "llm"}}}]
    v = view(keyed)
    assert v.env == () and v.secret_env == (("VLLM_API_KEY", "oculis-engine-keys", "llm"),)
    oculis = tmp_path / "oculis"
    oculis.write_text(FAKE_OCULIS)
    oculis.chmod(0o755)
    found: dict[tuple[str, str, str], str] = {}
    s = ps.StandIn(tmp_path / "sim", str(oculis), secret_of=lambda ns, name, key: found.get((ns, name, key)))
    try:
        s.update("ADDED", v)
        assert not s.procs  # the Secret key is missing: not started (CreateContainerConfigError), retried later
        found[("demo", "oculis-engine-keys", "llm")] = "k-123"
        s.crashed.clear()
        s.update("MODIFIED", v)
        assert "demo/k/uid-k" in s.procs
        key_file = tmp_path / "sim" / "engine-keys" / "llm"
        assert key_file.read_text() == "k-123" and oct(key_file.stat().st_mode & 0o777) == "0o600"
    finally:
        s.shutdown()
