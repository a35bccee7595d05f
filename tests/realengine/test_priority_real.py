"""Real vLLM on CPU takes what flow control sends it (issue 32): with `--scheduling-policy priority` the
request's `priority` field, as the router sets it for an upstream marked priority_scheduling (batch lines
at the lowest priority); without the policy vLLM 0.32 takes a non-zero priority too and ignores it (the
simulator does the same), so an upstream wrongly marked costs nothing but the ordering."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import realvllm
import yaml
from fake_upstreams import Server

from oculis_router.app import build_app


def router(engine_url: str, tmp: Path) -> Any:
    path = tmp / "oculis-config.yaml"
    path.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "tiny", "provider": "vllm", "base_url": engine_url + "/v1",
                       "model": realvllm.SERVED_NAME, "priority_scheduling": True}],
        "routes": [{"name": "real", "tiers": [{"name": "only", "upstream": "tiny"}],
                    "escalation": {"enabled": False}, "cache": {"enabled": False}}],
        "server": {"flow_control": {"enabled": True, "seats_per_replica": 2},
                   "limit_overrides": [{"match": {"tenant": "vip"}, "max_priority": 10}],
                   "batch": {"enabled": True, "directory": str(tmp / "batch")}}}}))
    return build_app(config_path=path, reload_interval=0.5, backoff=0.001)


def ask(url: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers=headers, timeout=120, json={
        "model": "real", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def test_an_engine_without_priority_scheduling_takes_a_priority_and_ignores_it(engines: Any, tmp: Path) -> None:
    engine = engines.get("default")
    with Server(router(engine.url, tmp)) as server:
        assert ask(server.url, {}).status_code == 200  # priority 0: every engine's default
        r = ask(server.url, {"x-oculis-tenant": "vip", "x-oculis-priority": "5"})
        assert r.status_code == 200, r.text  # measured: vLLM 0.32 answers (an older one said 400)


def test_priority_scheduling_takes_interactive_and_batch_priorities(engines: Any, tmp: Path) -> None:
    engine = engines.get("priority")
    with Server(router(engine.url, tmp)) as server:
        assert ask(server.url, {"x-oculis-tenant": "vip", "x-oculis-priority": "5"}).status_code == 200
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
        lines = b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                     "body": {"model": "real", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": f"doc {i}"}]}}).encode()
                         + b"\n" for i in range(3))
        f = c.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 300
        while (b := c.batches.retrieve(b.id)).status != "completed" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert b.status == "completed" and b.request_counts and b.request_counts.completed == 3, b
        assert b.output_file_id
        out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
        assert all(x["response"]["status_code"] == 200 for x in out)  # vLLM took priority 101 on each
