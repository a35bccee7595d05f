"""LoRA adapters across replicas, over real HTTP: the real router in front of three real `oculis sim serve
--enable-lora --max-loras 1` processes holding different adapters (one upstream, `endpoints:` listing them).
A request for an adapter lands only on replicas whose engine lists it (`x-oculis-replica`); one whose only
slot another adapter's request holds is passed over; a route's tier whose replicas lack the adapter escalates
to the next tier that has it; an adapter declared but loaded nowhere is a 503
`adapter_not_loaded` naming it, with Retry-After, until an engine loads it at run time; an engine that
unloads an adapter behind the router's back costs a retry on another replica, not a 404; and the
per-adapter metrics (picks, tokens, dollars) carry the adapter label."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_support import eventually
from router_support import start_router
from sim_support import ports_from, stop_all, wait_healthy

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
PORT_BASE = 32100  # this suite's range (32000-32999)
# replica -> the adapters its engine serves at start: sql on a and b, support on b only, none on c
HELD = {"a": ["sql"], "b": ["sql", "support"], "c": []}


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    procs, urls = [], {}
    for (name, held), port in zip(HELD.items(), ports_from(PORT_BASE, len(HELD)), strict=True):
        modules = ["--lora-modules", *(f"{a}=/adapters/{a}" for a in held)] if held else []
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
             "--served-model-name", "qwen", "--enable-lora", "--max-loras", "1", "--max-lora-rank", "16", *modules,
             "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # the load/unload endpoints, as vLLM; /adapters/* are a pod's volumes (not on this machine)
            env={**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "OCULIS_SIM_POD_PATHS": "1"}))
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(urls.values())
        yield urls
    finally:
        stop_all(procs)


def test_adapter_requests_land_only_where_the_adapter_is_loaded(sims: dict[str, str], tmp_path: Path) -> None:
    replica = {f"{url}/v1": name for name, url in sims.items()}  # x-oculis-replica is the endpoint's URL
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "qwen", "provider": "vllm", "model": "qwen", "endpoints": list(replica),
                       "adapters": ["sql", "support", "style"],
                       "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}},
                      # a route whose cheap tier's replicas (a, c) lack `support`: its big tier's (b) answers
                      {"name": "qwen-ac", "provider": "vllm", "model": "qwen", "adapters": ["sql", "support"],
                       "endpoints": [f"{sims['a']}/v1", f"{sims['c']}/v1"]},
                      {"name": "qwen-b", "provider": "vllm", "model": "qwen", "adapters": ["support"],
                       "endpoints": [f"{sims['b']}/v1"]}],
        "routes": [{"name": "chat", "tiers": [{"name": "small", "upstream": "qwen-ac"},
                                              {"name": "big", "upstream": "qwen-b"}]}]}}))
    proc, url, mport = start_router(cfg, tmp_path / "router.log")
    try:
        def ask(model: str, i: int = 0) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": f"question {i}: why?"}]})

        # `style` is declared but no engine has it: once the router has read the three engines' adapter
        # lists (before that an unread replica might have it), the client is told so, never a silent 404
        missing = eventually(lambda: (r := ask("qwen/style")).status_code == 503 and r, timeout=30,
                             what="the router has read every replica's /v1/models")
        err = missing.json()["error"]
        assert err["code"] == "adapter_not_loaded" and "'style'" in err["message"] and "qwen" in err["message"]
        assert missing.headers["retry-after"] == "5" and missing.headers["x-oculis-adapter"] == "style"

        sql = [ask("qwen/sql", i) for i in range(12)]
        assert all(r.status_code == 200 and r.json()["model"] == "sql" for r in sql), [r.text for r in sql]
        assert {replica[r.headers["x-oculis-replica"]] for r in sql} <= {"a", "b"}  # never c: vLLM would 404
        support = [ask("qwen/support", i) for i in range(6)]
        assert {replica[r.headers["x-oculis-replica"]] for r in support} == {"b"}
        assert {replica[ask("qwen", i).headers["x-oculis-replica"]] for i in range(12)} <= {"a", "b", "c"}

        escalated = ask("chat/support")
        assert escalated.status_code == 200, escalated.text
        assert escalated.headers["x-oculis-tier"] == "big" and replica[escalated.headers["x-oculis-replica"]] == "b"
        assert escalated.headers["x-oculis-escalation-reason"] == "upstream_error"

        # b's one LoRA slot held by a long `support` stream: `sql` would wait there, so it goes to a
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60, json={
                "model": "qwen/support", "max_tokens": 4000, "stream": True,
                "messages": [{"role": "user", "content": "a long answer, please"}]}) as long:
            assert replica[long.headers["x-oculis-replica"]] == "b"
            busy = [ask("qwen/sql", 100 + i) for i in range(6)]
            assert {replica[r.headers["x-oculis-replica"]] for r in busy} == {"a"}

        # the operator (here: the test) loads `style` on c at run time: the router finds it there
        folder = tmp_path / "style"  # the engine reads the adapter's config from its folder
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
        loaded = httpx.post(f"{sims['c']}/v1/load_lora_adapter", json={"lora_name": "style", "lora_path": str(folder)})
        assert loaded.status_code == 200, loaded.text
        styled = eventually(lambda: (r := ask("qwen/style")).status_code == 200 and r, timeout=30,
                            what="the router reads c's new adapter list")
        assert replica[styled.headers["x-oculis-replica"]] == "c" and styled.json()["model"] == "style"

        # `sql` unloaded from a behind the router's back: a call that meets vLLM's 404 there strikes it from
        # a's list and is served by b, never relayed as a 404 while another replica has the adapter
        gone = httpx.post(f"{sims['a']}/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert gone.status_code == 200, gone.text
        after = [ask("qwen/sql", 200 + i) for i in range(6)]
        assert all(r.status_code == 200 for r in after), [r.text for r in after]
        assert {replica[r.headers["x-oculis-replica"]] for r in after} == {"b"}

        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
        for line in ('oculis_adapter_picks_total{adapter="sql",slot=', 'oculis_adapter_picks_total{adapter="support"',
                     'oculis_adapter_cost_dollars_total{adapter="sql",upstream="qwen"}',
                     'oculis_adapter_prompt_tokens_total{adapter="style",upstream="qwen"}',
                     'oculis_upstream_failures_total{kind="adapter_not_loaded",revision="stable",upstream="qwen"}'):
            assert line in metrics, line
        assert 'adapter="billing"' not in metrics  # only declared adapters: bounded labels
    finally:
        proc.terminate()
        proc.wait(timeout=10)
