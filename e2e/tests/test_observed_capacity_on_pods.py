"""The KV plan checked against the running engines for real: simulator pods (e2e/podstandin.py) export
vllm:cache_config_info, a real Prometheus scrapes it, the operator (OCULIS_PROMETHEUS_URL) reads it and
writes status.capacity {plannedTokens, observedTokens, errorPercent}, shown as OBSERVED-KV."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from e2e_support import eventually
from kubernetes import client
from skips import needs_command
from test_gpuupstream import World, upstream

pytestmark = needs_command("prometheus", "prometheus")


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def test_status_shows_planned_and_observed_kv_from_the_simulated_engines(world: World, served: dict[str, Any],
                                                                         kubeconfig: Any, bin_dir: Any) -> None:
    world.create(upstream("kv", replicas=1, engine={"maxModelLen": 8192, "maxNumSeqs": 32,
                                                    "maxNumBatchedTokens": 4096, "gpuMemoryUtilization": 0.9}))

    def observed() -> dict[str, Any] | None:
        cap: dict[str, Any] = (world.get("kv").get("status") or {}).get("capacity") or {}
        return cap if cap.get("observedTokens") else None

    cap = eventually(observed, timeout=120, what="status.capacity.observedTokens from Prometheus")
    # the simulator sizes its blocks with the operator's own plan: the same figure, no drift
    assert cap["plannedTokens"] == cap["kvCacheTokens"] and abs(cap["errorPercent"]) < 1
    conds = {c["type"]: c for c in world.get("kv")["status"]["conditions"]}
    assert conds["CapacityOK"]["reason"] == "Fits"
    table = subprocess.run([str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "-n", world.ns, "get", "gu", "kv"],
                           capture_output=True, text=True, check=True).stdout
    header, row = table.splitlines()[:2]
    assert "OBSERVED-KV" in header and str(cap["observedTokens"]) in row
