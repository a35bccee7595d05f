"""The plan checked against the running engines: status.capacity observedTokens/errorPercent and
CapacityOK reason PlanDrift from vllm:cache_config_info's num_gpu_blocks (read from Prometheus)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from oculis_operator import promquery
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

SPEC: dict[str, Any] = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct",
                        "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxModelLen": 8192}}


def running(spec: dict[str, Any], blocks: int | None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    """Reconcile twice: create, then observe the Deployment fully rolled with `blocks` reported."""
    dep = reconcile(Observed("x", "ns", "uid", 1, spec, {}), lambda p: 8, "t").create[0]
    dep["metadata"]["generation"] = 1
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                     "availableReplicas": 1}
    out = reconcile(Observed("x", "ns", "uid", 1, spec, status or {}, dep, observed_kv_blocks=blocks),
                    lambda p: 8, "t")
    return {"status": out.status, "warnings": dict(out.warnings),
            "conds": {c["type"]: c for c in out.status["conditions"]}}


def test_observed_tokens_within_five_percent_are_reported_without_drift() -> None:
    plan = running(SPEC, None)["status"]["capacity"]["plannedTokens"]
    out = running(SPEC, plan // 16 - 100)  # 100 blocks fewer: well within 5 %
    cap = out["status"]["capacity"]
    assert cap["observedTokens"] == (plan // 16 - 100) * 16 and 0 < cap["errorPercent"] < 1
    assert out["conds"]["CapacityOK"]["reason"] == "Fits" and "PlanDrift" not in out["warnings"]


def test_an_engine_with_far_fewer_blocks_raises_plan_drift_with_both_figures() -> None:
    plan = running(SPEC, None)["status"]["capacity"]["plannedTokens"]
    out = running(SPEC, plan // 16 // 2)  # the engine got half the plan
    ok, cap = out["conds"]["CapacityOK"], out["status"]["capacity"]
    assert ok["reason"] == "PlanDrift" and ok["status"] == "True"  # half still holds the interactive plan
    assert str(plan) in ok["message"] and str(cap["observedTokens"]) in ok["message"] and cap["errorPercent"] > 99
    assert "PlanDrift" in out["warnings"]
    tiny = running(SPEC, 100)  # 1600 tokens: not even one 8192-token sequence
    assert tiny["conds"]["CapacityOK"]["status"] == "False" and "lower maxNumSeqs" in tiny["conds"]["CapacityOK"][
        "message"]


def test_no_reading_keeps_the_last_one_for_the_same_plan_and_none_without() -> None:
    first = running(SPEC, 20000)
    kept = running(SPEC, None, status=first["status"])
    assert kept["status"]["capacity"]["observedTokens"] == first["status"]["capacity"]["observedTokens"]
    assert "observedTokens" not in running(SPEC, None)["status"]["capacity"]


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    """A stand-in Prometheus HTTP API on 127.0.0.1 answering vllm:cache_config_info for two replicas."""
    queries: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            queries.append(self.path)
            body = {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"__name__": "vllm:cache_config_info", "num_gpu_blocks": "29751", "block_size": "16"},
                 "value": [0, "1"]},
                {"metric": {"__name__": "vllm:cache_config_info", "num_gpu_blocks": "29700", "block_size": "16"},
                 "value": [0, "1"]}]}}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", queries
    server.shutdown()


def test_prometheus_reader_takes_the_smallest_replica_and_selects_the_engine_pods(
        prometheus: tuple[str, list[str]]) -> None:
    url, queries = prometheus
    assert promquery.prometheus_kv_blocks(url, "team-a", "llama") == 29700
    assert "team-a" in queries[0] and "llama-vllm-" in queries[0].replace("%2D", "-")
    assert promquery.prometheus_kv_blocks("", "ns", "x") is None
    assert promquery.prometheus_kv_blocks("http://127.0.0.1:9", "ns", "x", timeout=0.5) is None  # nothing there
