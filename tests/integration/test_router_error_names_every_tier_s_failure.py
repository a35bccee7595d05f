"""When no tier can answer, the client's error names each tier's failure, not only the last one's (QA3 Part 2
#12): the README quick start without its engines said only "set OPENAI_API_KEY" (the last tier), so a user
would set it and pay OpenAI for every prompt while the self-hosted tiers kept failing over. A refused
connection names the address it could not reach (#24: it said only `ClientConnectorError`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from fake_upstreams import free_port
from router_support import start_router


def test_the_502_names_every_tier_that_failed_and_the_address_refused(tmp_path: Path) -> None:
    dead_a, dead_b = free_port(), free_port()  # nothing listens there
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [
            {"name": "small", "provider": "vllm", "model": "m", "base_url": f"http://127.0.0.1:{dead_a}/v1"},
            {"name": "large", "provider": "vllm", "model": "m", "base_url": f"http://127.0.0.1:{dead_b}/v1"},
            {"name": "hosted", "provider": "openai", "model": "gpt-4o", "api_key_env": "OCULIS_TEST_UNSET_KEY_QA3"}],
        "routes": [{"name": "chat", "strategy": "semantic", "tiers": [
            {"name": "simple", "match": {}, "upstream": "small"},
            {"name": "standard", "match": {}, "upstream": "large"},
            {"name": "complex", "match": {}, "upstream": "hosted"}],
            "escalation": {"enabled": True, "max_retries": 0}}]}}))
    proc, url, _ = start_router(cfg, tmp_path / "router.log")
    try:
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    message = r.json()["error"]["message"]
    assert r.status_code == 502 and r.headers["x-oculis-failed-tiers"] == "simple,standard", r.text
    assert "OCULIS_TEST_UNSET_KEY_QA3 is not set" in message, message
    assert f"simple (small): ClientConnectorError (127.0.0.1:{dead_a})" in message, message
    assert f"standard (large): ClientConnectorError (127.0.0.1:{dead_b})" in message, message
