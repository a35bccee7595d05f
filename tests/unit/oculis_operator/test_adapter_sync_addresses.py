"""How the adapter sync reaches an engine pod: its pod IP on the engine port in a cluster; with
OCULIS_ENGINE_ENDPOINTS (the sandbox) only the pod stand-in's 127.0.0.1 port, never the pod IP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import adapter_loading as al
from oculis_operator import adapter_sync


def pod(name: str, ip: str | None = "10.1.2.3", ready: bool = True, mounts: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "demo"},
            "spec": {"containers": [{"volumeMounts": [{"name": "v", "mountPath": m} for m in mounts]}]},
            "status": {"phase": "Running", **({"podIP": ip} if ip else {}),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pod_ip_in_a_cluster_and_only_the_endpoint_map_in_the_sandbox(tmp_path: Path) -> None:
    assert adapter_sync.engine_url(pod("a"), None) == ("http://10.1.2.3:8000", "")
    assert adapter_sync.engine_url(pod("a", "fd00::5"), None) == ("http://[fd00::5]:8000", "")
    assert adapter_sync.engine_url(pod("a", None), None) == (None, adapter_sync.NO_IP)
    # Outside the cluster (no KUBERNETES_SERVICE_HOST) a pod IP is never dialled.
    assert adapter_sync.engine_url(pod("a"), None, in_cluster=False) == (None, adapter_sync.OUTSIDE)
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({
        "llm-vllm.demo.svc": {"namespace": "demo", "upstream": "llm", "ports": [31001],
                              "pods": [{"pod": "a", "port": 31001, "pid": 7}]},
        "llm-vllm.other.svc": {"namespace": "other", "upstream": "llm", "ports": [31002],
                               "pods": [{"pod": "b", "port": 31002}]}}))
    ports = adapter_sync.loopback_ports(endpoints)
    assert ports == {("demo", "a"): 31001, ("other", "b"): 31002}
    assert adapter_sync.engine_url(pod("a"), ports) == ("http://127.0.0.1:31001", "")
    assert adapter_sync.engine_url(pod("b"), ports) == (None, adapter_sync.NOT_LISTED)  # another namespace's b
    assert adapter_sync.loopback_ports(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert adapter_sync.loopback_ports(tmp_path / "bad.json") == {}


def test_a_pod_without_an_address_is_not_dialled_and_counts_as_unreadable() -> None:
    spec_pods = [pod("a", ready=True, mounts=("/adapters/style",)), pod("b", ready=False)]
    assert adapter_sync.ready(spec_pods[0]) and not adapter_sync.ready(spec_pods[1])
    assert adapter_sync.adapter_mounts(spec_pods[0]) == frozenset({"/adapters/style"})
    seen = adapter_sync.read_pod("a", None, adapter_sync.OUTSIDE)
    assert seen.loaded is None and seen.problem == adapter_sync.OUTSIDE
    spec = GPUUpstreamSpec.model_validate({"provider": "vllm", "model": "m", "gpu": {"product": "H100-80GB"},
                                           "adapters": [{"name": "sql", "source": {"path": "/a"}}]})
    state, lines = adapter_sync.sync(spec, spec_pods, adapter_sync.State(), 0.0, None, in_cluster=False)
    assert lines == [] and state.report is not None
    assert "the operator runs outside the cluster" in (state.report.adapters[0].reason or "")


def test_the_event_lines_say_what_was_done_per_adapter() -> None:
    done: list[tuple[al.Action, str | None]] = [
        (al.Action("p2", "load", "sql", "org/sql"), None), (al.Action("p1", "load", "sql", "org/sql"), None),
        (al.Action("p1", "load", "bad", "/nope"), "No adapter found (HTTP 404)"),
        (al.Action("p1", "unload", "old"), None)]
    assert adapter_sync.summary(done) == [
        "Unloaded adapter 'old' on 1 replica(s) (p1) without a restart",
        "Loaded adapter 'sql' on 2 replica(s) (p1, p2) without a restart"]
