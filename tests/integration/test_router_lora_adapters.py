"""LoRA adapters end to end over real HTTP: the router in front of `oculis sim serve --enable-lora`.
A tier's adapter and `model: <upstream>/<adapter>` / `<route>/<adapter>` reach the engine as the
adapter's model name; an undeclared adapter is a 404 naming the known ones; the decision log, the
response headers and oculis_adapter_requests carry the adapter. The simulator answers /v1/models,
/v1/load_lora_adapter and /v1/unload_lora_adapter as vLLM 0.32 does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from router_support import start_router
from sim_support import start_sim, stop

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder vLLM would read as an adapter (a runtime load reads its adapter_config.json)."""
    folder = tmp_path_factory.mktemp("extra")
    (folder / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
    return folder


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:  # the load/unload endpoints exist only with it, as in vLLM
        env.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        env.setenv("OCULIS_SIM_POD_PATHS", "1")  # /adapters/* are a pod's volumes, not on this machine
        proc, base = start_sim(MODEL, "--gpu", "H100-80GB", "--served-model-name", "qwen", "--enable-lora",
                               "--max-loras", "1", "--max-lora-rank", "16", "--lora-modules", "sql=/adapters/sql",
                               "support=/adapters/support")
    yield base
    stop(proc)


def test_the_simulator_serves_adapters_as_vllm_does(sim: str, adapter_dir: Path) -> None:
    models = httpx.get(f"{sim}/v1/models").json()["data"]
    cards = {m["id"]: m for m in models}
    assert cards["sql"]["parent"] == "qwen" and cards["sql"]["root"] == "/adapters/sql"
    assert cards["qwen"]["parent"] is None
    answer = httpx.post(f"{sim}/v1/completions", json={"model": "sql", "prompt": "hi", "max_tokens": 2}).json()
    assert answer["model"] == "sql"
    missing_source = httpx.post(f"{sim}/v1/load_lora_adapter", json={"lora_name": "extra",
                                                                     "lora_path": "/adapters/extra"})
    assert missing_source.status_code == 404 and missing_source.json()["error"]["message"] == \
        "Loading lora extra failed: No adapter found for /adapters/extra"
    loaded = httpx.post(f"{sim}/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": str(adapter_dir)})
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'extra' added successfully."
    again = httpx.post(f"{sim}/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": "/x"})
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    gone = httpx.post(f"{sim}/v1/unload_lora_adapter", json={"lora_name": "extra"})
    assert gone.status_code == 200 and gone.text == "Success: LoRA adapter 'extra' removed successfully."
    missing = httpx.post(f"{sim}/v1/unload_lora_adapter", json={"lora_name": "extra"})
    assert missing.status_code == 404 and missing.json()["error"]["message"] == \
        "The lora adapter 'extra' cannot be found."
    unloaded = httpx.post(f"{sim}/v1/completions", json={"model": "extra", "prompt": "hi", "max_tokens": 2})
    assert unloaded.status_code == 404  # real vLLM 0.32 lists only the base model's names here (measured)
    assert unloaded.json()["error"]["message"] == "The model `extra` does not exist. Valid aliases: qwen."
    metrics = httpx.get(f"{sim}/metrics").text
    assert 'vllm:lora_requests_info{max_lora="1"' in metrics


def test_the_router_sends_the_adapter_as_the_model(sim: str, tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "qwen", "provider": "vllm", "base_url": f"{sim}/v1", "model": "qwen",
                       "adapters": ["sql", "support"]}],
        "routes": [{"name": "chat", "decision_log": {"sink": str(log)},
                    "tiers": [{"name": "sql", "upstream": "qwen", "adapter": "sql"}]}]}}))
    proc, url, mport = start_router(cfg, tmp_path / "router.log")
    try:
        def ask(model: str) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
                "model": model, "max_tokens": 3, "messages": [{"role": "user", "content": "SELECT what?"}]})

        tier = ask("chat")
        assert tier.status_code == 200, tier.text
        assert tier.json()["model"] == "sql" and tier.headers["x-oculis-adapter"] == "sql"
        direct = ask("qwen/support")
        assert direct.status_code == 200 and direct.json()["model"] == "support"
        via_route = ask("chat/sql")
        assert via_route.status_code == 200 and via_route.headers["x-oculis-tier"] == "sql"
        base = ask("qwen")
        assert base.json()["model"] == "qwen" and "x-oculis-adapter" not in base.headers
        unknown = ask("chat/billing")
        assert unknown.status_code == 404
        assert "its adapters: sql, support" in unknown.json()["error"]["message"]
        assert ask("qwen/billing").status_code == 404
        listed = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
        assert listed["qwen/sql"]["parent"] == "qwen" and listed["qwen/sql"]["kind"] == "adapter"
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert lines[0]["adapter"] == "sql"
        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
        assert 'oculis_adapter_requests_total{adapter="support",route="qwen",upstream="qwen"} 1.0' in metrics
        assert 'oculis_adapter_requests_total{adapter="sql",route="chat",upstream="qwen"} 2.0' in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=10)
