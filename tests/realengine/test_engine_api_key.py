"""The engine's API key on real vLLM 0.32 on CPU (issue 35, "engines only Oculis can reach"): started as
the operator starts it (VLLM_API_KEY from its Secret, runtime LoRA updating on), it refuses a request and
an adapter load without the key or with another (401 {"error": "Unauthorized"}), serves both with it, and
leaves /health and /metrics open for probes and scrapes. The operator's adapter sync loads an adapter with
the key, the router given the key as a file (api_key_file, as the chart mounts the Secret) serves through
the engine, and `oculis sim serve` with the engine's argv and key answers the refusals alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import realvllm
import yaml
from fake_upstreams import Server
from sim_support import start_sim, stop

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import adapter_sync
from oculis_router.app import build_app

BASE = realvllm.SERVED_NAME
COMP = {"model": BASE, "prompt": "def main():", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def keyed(engines: Any, tiny_adapters: dict[str, Path]) -> realvllm.Engine:
    engine: realvllm.Engine = engines.get("keyed")
    return engine


def call(url: str, path: str, body: Any = None, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if body is None:
        return httpx.get(url + path, headers=headers, timeout=120)
    return httpx.post(url + path, json=body, headers=headers, timeout=120)


def refusals(url: str, adapter: Path) -> list[tuple[int, Any]]:
    load = {"lora_name": "style", "lora_path": str(adapter)}
    out = []
    for path, body, key in (("/v1/completions", COMP, None), ("/v1/completions", COMP, "not-the-key"),
                            ("/v1/models", None, None), ("/v1/load_lora_adapter", load, None),
                            ("/v1/unload_lora_adapter", {"lora_name": "style"}, "not-the-key")):
        r = call(url, path, body, key)
        out.append((r.status_code, r.json()))
    return out


def test_without_the_key_v1_is_refused_and_with_it_served_health_and_metrics_open(
        keyed: realvllm.Engine, tiny_adapters: dict[str, Path]) -> None:
    key = keyed.env["VLLM_API_KEY"]
    assert key not in keyed.argv  # the operator's way: the environment, never the argv
    assert refusals(keyed.url, tiny_adapters["style"]) == [(401, {"error": "Unauthorized"})] * 5
    assert call(keyed.url, "/health").status_code == 200
    metrics = call(keyed.url, "/metrics")
    assert metrics.status_code == 200 and "vllm:num_requests_running" in metrics.text
    ok = call(keyed.url, "/v1/completions", COMP, key)
    assert ok.status_code == 200, ok.text
    load = call(keyed.url, "/v1/load_lora_adapter", {"lora_name": "style", "lora_path": str(tiny_adapters["style"])},
                key)
    assert load.status_code == 200, load.text
    served = call(keyed.url, "/v1/completions", {**COMP, "model": "style"}, key)
    assert served.status_code == 200 and served.json()["model"] == "style"
    assert call(keyed.url, "/v1/unload_lora_adapter", {"lora_name": "style"}, key).status_code == 200


def test_the_adapter_sync_and_the_router_use_the_key(keyed: realvllm.Engine, tiny_adapters: dict[str, Path],
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = keyed.env["VLLM_API_KEY"]
    port = int(keyed.url.rsplit(":", 1)[1])
    sql = {"name": "sql", "source": {"path": str(tiny_adapters["sql"])}}
    spec = GPUUpstreamSpec.model_validate({"provider": "vllm", "model": BASE, "gpu": {"product": "H100-80GB"},
                                           "adapters": [sql]})
    pod = {"metadata": {"name": "p0", "namespace": "demo"}, "spec": {"containers": [{}]},
           "status": {"phase": "Running", "podIP": "10.9.9.9", "conditions": [{"type": "Ready", "status": "True"}]}}
    refused, _ = adapter_sync.sync(spec, [pod], adapter_sync.State(), 0.0, {("demo", "p0"): port})
    assert refused.report is not None and "Unauthorized (HTTP 401)" in str(refused.report)
    state, lines = adapter_sync.sync(spec, [pod], adapter_sync.State(), 0.0, {("demo", "p0"): port}, key=key)
    assert lines == ["Loaded adapter 'sql' on 1 replica(s) (p0) without a restart"], state.report

    keys = tmp_path / "engine-keys"
    keys.mkdir()
    (keys / "tiny").write_text(key)
    monkeypatch.setenv("OCULIS_ENGINE_KEYS_DIR", str(keys))
    cfg = tmp_path / "oculis-config.yaml"
    plain = {"escalation": {"enabled": False}, "cache": {"enabled": False}}
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "tiny", "provider": "vllm", "base_url": f"{keyed.url}/v1", "model": BASE,
                       "adapters": ["sql"], "api_key_file": "tiny"}],
        "routes": [{"name": "base", "tiers": [{"name": "only", "upstream": "tiny"}], **plain},
                   {"name": "sql-tier", "tiers": [{"name": "sql", "upstream": "tiny", "adapter": "sql"}], **plain}]}}))
    with Server(build_app(config_path=cfg, reload_interval=0.5, backoff=0.001)) as router:
        for model in ("base", "sql-tier"):
            r = httpx.post(f"{router.url}/v1/completions", json={**COMP, "model": model}, timeout=120)
            assert r.status_code == 200, r.text
        (keys / "tiny").write_text("not-the-key")  # the engine's refusal is the router's failure, not relayed
        r = httpx.post(f"{router.url}/v1/completions", json={**COMP, "model": "base"}, timeout=120)
        assert r.status_code == 502 and key not in r.text, r.text


@pytest.fixture(scope="module")
def keyed_sim(keyed: realvllm.Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        for name in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY"):
            env.setenv(name, keyed.env[name])
        proc, base = start_sim(*keyed.argv[2:], "--gpu", "H100-80GB",
                               log=tmp_path_factory.mktemp("sim") / "sim.log", timeout=60)
    yield base
    stop(proc)


def test_the_simulator_refuses_as_the_engine_does(keyed: realvllm.Engine, keyed_sim: str,
                                                  tiny_adapters: dict[str, Path]) -> None:
    assert refusals(keyed_sim, tiny_adapters["style"]) == refusals(keyed.url, tiny_adapters["style"])
    for path in ("/health", "/metrics"):
        assert call(keyed_sim, path).status_code == call(keyed.url, path).status_code == 200
