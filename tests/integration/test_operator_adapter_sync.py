"""The operator's adapter sync (adapter_sync.sync) over real HTTP against two `oculis sim serve
--enable-lora` engines with VLLM_ALLOW_RUNTIME_LORA_UPDATING, reached through an endpoint map as in the
sandbox: a declared adapter is loaded on both, an unreadable source is the engine's 404 kept per pod (the
other adapter serves), a removed adapter is unloaded; an engine without runtime updating lists the
adapters it started with and is asked nothing it cannot do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sim_support import start_sim, stop

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import adapter_sync

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
LORA = ("--served-model-name", "qwen", "--enable-lora", "--max-loras", "2")


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "demo"}, "spec": {"containers": [{}]},
            "status": {"phase": "Running", "podIP": "10.9.9.9", "conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[tuple[str, str], int]]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        started = [start_sim(MODEL, "--gpu", "H100-80GB", *LORA) for _ in range(2)]
    yield {("demo", f"p{i}"): int(base.rsplit(":", 1)[1]) for i, (_, base) in enumerate(started)}
    for proc, _ in started:
        stop(proc)


def spec(adapters: list[dict[str, Any]], runtime: bool = True) -> GPUUpstreamSpec:
    return GPUUpstreamSpec.model_validate({"provider": "vllm", "model": MODEL, "gpu": {"product": "H100-80GB"},
                                           "engine": {"maxLoras": 2, "runtimeLoraUpdating": runtime},
                                           "adapters": adapters})


def listed(port: int) -> dict[str, str]:
    data = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()["data"]
    return {m["id"]: m["root"] for m in data if m.get("parent")}


def test_the_sync_loads_reports_and_unloads_on_every_engine(engines: dict[tuple[str, str], int],
                                                           tmp_path: Path) -> None:
    sql = tmp_path / "sql"
    sql.mkdir()
    (sql / "adapter_config.json").write_text(json.dumps({"r": 8}))
    pods = [pod("p0"), pod("p1")]
    two = spec([{"name": "sql", "source": {"path": str(sql)}}, {"name": "bad", "source": {"path": "/nope/bad"}}])
    state, lines = adapter_sync.sync(two, pods, adapter_sync.State(), 1000.0, engines)
    assert lines == ["Loaded adapter 'sql' on 2 replica(s) (p0, p1) without a restart"]
    assert all(listed(port) == {"sql": str(sql)} for port in engines.values())
    assert state.report is not None
    ok, bad = state.report.adapters
    assert (ok.ready, ok.pods, ok.ok) == (2, 2, True)
    assert bad.failed and bad.ready == 0 and bad.reason is not None
    assert "Loading lora bad failed: No adapter found for /nope/bad (HTTP 404)" in bad.reason
    assert set(state.failures) == {("p0", "bad"), ("p1", "bad")}
    again, lines = adapter_sync.sync(two, pods, state, 1001.0, engines)  # nothing new to ask within a minute
    assert lines == [] and again.report == state.report

    removed, lines = adapter_sync.sync(spec([]), pods, again, 1002.0, engines)
    assert lines == ["Unloaded adapter 'sql' on 2 replica(s) (p0, p1) without a restart"]
    assert all(listed(port) == {} for port in engines.values())
    assert removed.failures == {} and removed.report is not None and removed.report.adapters == ()


def test_an_engine_without_runtime_updating_is_only_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCULIS_SIM_POD_PATHS", "1")  # /adapters/sql is a pod's volume, not on this machine
    proc, base = start_sim(MODEL, "--gpu", "H100-80GB", *LORA, "--lora-modules", "sql=/adapters/sql")
    try:
        ports = {("demo", "p0"): int(base.rsplit(":", 1)[1])}
        restart = spec([{"name": "sql", "source": {"path": "/adapters/sql"}}, {"name": "new", "source": {
            "path": "/adapters/new"}}], runtime=False)
        state, lines = adapter_sync.sync(restart, [pod("p0")], adapter_sync.State(), 0.0, ports)
        assert lines == [] and state.failures == {}
        assert state.report is not None
        assert [(r.name, r.ready) for r in state.report.adapters] == [("sql", 1), ("new", 0)]
        refused = httpx.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
        assert refused.status_code == 404  # the endpoint is not there without VLLM_ALLOW_RUNTIME_LORA_UPDATING
    finally:
        stop(proc)
