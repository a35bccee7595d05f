"""`oculis sim serve --api-key` (or VLLM_API_KEY) behaves as vLLM 0.32's `--api-key`: /v1 without the key,
or with another, is 401 {"error": "Unauthorized"}, adapter loading included; /health and /metrics stay open.
Through real HTTP: the operator's adapter sync loads an adapter with the key and reports the engine's
refusal without it, and the router, given the key as a file (api_key_file, as the chart mounts the Secret),
serves through the keyed engine and is refused with the wrong key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from router_support import start_router
from sim_support import start_sim, stop

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import adapter_sync

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
KEY = "k-" + "7" * 40
BODY = {"model": "qwen", "prompt": "hi", "max_tokens": 2}


def status(base: str, method: str, path: str, key: str | None = None, body: Any = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, base + path, json=body, headers=headers, timeout=30).status_code


@pytest.mark.parametrize("how", ["flag", "env"])
def test_v1_needs_the_key_and_health_and_metrics_stay_open(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    if how == "env":
        monkeypatch.setenv("VLLM_API_KEY", KEY)
    proc, base = start_sim(MODEL, "--gpu", "H100-80GB", "--served-model-name", "qwen", "--enable-lora",
                           *(["--api-key", KEY] if how == "flag" else []))
    try:
        r = httpx.post(base + "/v1/completions", json=BODY, timeout=30)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})  # vLLM's own answer
        assert status(base, "POST", "/v1/completions", "not-it", BODY) == 401
        assert status(base, "GET", "/v1/models", KEY[:-1]) == 401  # exactly the key
        assert status(base, "POST", "/v1/load_lora_adapter", None, {"lora_name": "a", "lora_path": "/a"}) == 401
        assert status(base, "GET", "/health") == status(base, "GET", "/metrics") == 200
        assert status(base, "POST", "/v1/completions", KEY, BODY) == 200
        assert status(base, "GET", "/v1/models", KEY) == 200
    finally:
        stop(proc)


def test_the_adapter_sync_and_the_router_use_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    proc, base = start_sim(MODEL, "--gpu", "H100-80GB", "--served-model-name", "qwen", "--enable-lora",
                           "--api-key", KEY)
    router = None
    try:
        port = int(base.rsplit(":", 1)[1])
        sql = tmp_path / "sql"
        sql.mkdir()
        (sql / "adapter_config.json").write_text(json.dumps({"r": 8}))
        spec = GPUUpstreamSpec.model_validate({"provider": "vllm", "model": MODEL, "gpu": {"product": "H100-80GB"},
                                               "adapters": [{"name": "sql", "source": {"path": str(sql)}}]})
        pod = {"metadata": {"name": "p0", "namespace": "demo"}, "spec": {"containers": [{}]},
               "status": {"phase": "Running", "podIP": "10.9.9.9",
                          "conditions": [{"type": "Ready", "status": "True"}]}}
        ports = {("demo", "p0"): port}
        refused, _ = adapter_sync.sync(spec, [pod], adapter_sync.State(), 0.0, ports)  # no key
        assert refused.report is not None and "Unauthorized (HTTP 401)" in str(refused.report)
        _, lines = adapter_sync.sync(spec, [pod], adapter_sync.State(), 0.0, ports, key=KEY)
        assert lines == ["Loaded adapter 'sql' on 1 replica(s) (p0) without a restart"]

        keys = tmp_path / "engine-keys"
        keys.mkdir()
        (keys / "qwen").write_text(KEY + "\n")  # a Secret's file, maybe with a newline
        monkeypatch.setenv("OCULIS_ENGINE_KEYS_DIR", str(keys))
        cfg = tmp_path / "oculis-config.yaml"
        cfg.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "qwen", "provider": "vllm", "model": "qwen", "base_url": f"{base}/v1",
                           "api_key_file": "qwen"}],
            "routes": [{"name": "chat", "tiers": [{"name": "t", "match": {}, "upstream": "qwen"}]}]}}))
        router, url, _ = start_router(cfg, tmp_path / "router.log")
        ask = {"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=ask, timeout=30).status_code == 200
        (keys / "qwen").write_text("zz-rotated")  # re-read on every call: a rotated or wrong key is seen at once
        r = httpx.post(f"{url}/v1/chat/completions", json=ask, timeout=30)
        assert r.status_code == 502 and KEY not in r.text and "zz-rotated" not in r.text, r.text
        assert KEY not in (tmp_path / "router.log").read_text()
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        stop(proc)
