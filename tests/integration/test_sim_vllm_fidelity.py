"""`oculis sim serve` answers as vLLM 0.32 does where clients and the router rely on it (QA pass 2 findings
8, 9, 17, 24, 25, 26; issue 22 item 5). Each test is named after the class of finding it guards."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2e_support import eventually
from fake_upstreams import free_port
from sim_support import start_sim, stop

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]
MAX_LEN = 512


def start(*flags: str) -> tuple[subprocess.Popen[bytes], str]:
    return start_sim(MODEL, "--gpu", "H100-80GB", f"--max-model-len={MAX_LEN}", *flags)


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    proc, base = start("--served-model-name", "first", "second", "--max-num-seqs", "4")
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def doubtful() -> Iterator[str]:
    proc, base = start("--sim-mean-logprob", "-2.5")
    yield base
    stop(proc)


def chat(base: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], **extra}, timeout=30)


def sse(base: str, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    with httpx.stream("POST", f"{base}{path}", json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_api_shapes_logprobs_in_both_vllm_shapes_streamed_and_not(sim: str, doubtful: str) -> None:
    """Finding 8: logprobs were always null, so the router's min_mean_logprob check never fired."""
    body = chat(sim, max_tokens=6, logprobs=True, top_logprobs=2, seed=7).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 6 and "".join(t["token"] for t in content) == body["choices"][0]["message"]["content"]
    for t in content:
        assert t["logprob"] <= 0 and t["bytes"] == list(t["token"].encode()) and len(t["top_logprobs"]) == 2
        assert t["top_logprobs"][0]["token"] == t["token"]  # vLLM lists the sampled token first
    assert chat(sim, max_tokens=6, logprobs=True, top_logprobs=2, seed=7).json()["choices"][0]["logprobs"] == (
        body["choices"][0]["logprobs"])  # deterministic per seed
    comp = httpx.post(f"{sim}/v1/completions", json={"prompt": "hi", "max_tokens": 5, "logprobs": 1}).json()
    lp = comp["choices"][0]["logprobs"]
    assert set(lp) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    assert "".join(lp["tokens"]) == comp["choices"][0]["text"] and len(lp["top_logprobs"][0]) == 2
    assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
    chunks = sse(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                               "logprobs": True})
    streamed = [t for c in chunks for ch in c["choices"] if ch["logprobs"] for t in ch["logprobs"]["content"]]  # type: ignore[index,union-attr]
    assert len(streamed) == 4
    chunks = sse(sim, "/v1/completions", {"prompt": "x", "max_tokens": 4, "logprobs": 0})
    assert sum(len(ch["logprobs"]["tokens"]) for c in chunks for ch in c["choices"]) == 4  # type: ignore[index,union-attr]
    # a doubtful model's answers fall below a router's min_mean_logprob of -1.0; a confident one's do not
    low = chat(doubtful, max_tokens=40, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    high = chat(sim, max_tokens=40, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert mean([t["logprob"] for t in low]) < -1.0 < mean([t["logprob"] for t in high])


def test_client_disconnect_aborts_a_non_streamed_request(sim: str) -> None:
    """Finding 9: a non-streamed request whose client left kept generating."""
    def leave() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{sim}/v1/completions", json={"prompt": "hi", "max_tokens": 500}, timeout=1.5)

    def running() -> float:
        text = httpx.get(f"{sim}/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_running{"))
        return float(line.split()[-1])

    threads = [threading.Thread(target=leave) for _ in range(3)]
    for t in threads:
        t.start()
    eventually(lambda: running() == 3, timeout=5, what="three requests running")
    for t in threads:
        t.join()
    eventually(lambda: running() == 0, timeout=3, what="the clients' requests aborted")
    text = httpx.get(f"{sim}/metrics").text
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="first"} 3.0' in text


def test_every_histogram_is_observed_per_request(sim: str) -> None:
    """Finding 17: request_queue_time_seconds was declared and never observed; the prefill, decode,
    inference-time, iteration and request-parameter histograms were missing."""
    threads = [threading.Thread(target=chat, args=(sim,), kwargs={"max_tokens": 30}) for _ in range(6)]
    for t in threads:  # 6 requests on 4 slots: two of them queue
        t.start()
    for t in threads:
        t.join()
    text = httpx.get(f"{sim}/metrics").text
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE") and line.endswith(
        "histogram")]
    assert len(families) == 16
    for fam in families:
        count = next(x for x in text.splitlines() if x.startswith(f"{fam}_count{{"))
        assert float(count.split()[-1]) > 0, fam
    queued = next(x for x in text.splitlines() if x.startswith('vllm:request_queue_time_seconds_sum{'))
    assert float(queued.split()[-1]) > 0


def test_api_shapes_as_vllm(sim: str) -> None:
    """Finding 25 and the note's API gaps: validation, the max_model_len cut, n, aliases, echo, endpoints."""
    err = chat(sim, temperature=-1).json()["error"]
    assert err == {"message": "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
                   "type": "BadRequestError", "param": "temperature", "code": 400}
    # prompt + max_tokens past max_model_len: cut at the limit, finish_reason length (vLLM 0.32: 200)
    resp = httpx.post(f"{sim}/v1/completions", json={"prompt": "a b c", "max_tokens": MAX_LEN - 1}, timeout=60)
    assert resp.status_code == 200
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "length" and resp.json()["usage"]["total_tokens"] == MAX_LEN
    two = chat(sim, model="second", max_tokens=3, n=2).json()
    assert [c["index"] for c in two["choices"]] == [0, 1] and two["model"] == "first"  # vLLM's first served name
    assert two["usage"]["completion_tokens"] == 6
    assert httpx.post(f"{sim}/v1/completions", json={"prompt": "hello", "max_tokens": 2, "echo": True}
                      ).json()["choices"][0]["text"].startswith("hello")
    batch = httpx.post(f"{sim}/v1/completions", json={"prompt": ["one two", "three"], "max_tokens": 2, "n": 2,
                                                      "echo": True}).json()  # vLLM batches prompts
    assert [(c["index"], c["text"][:5]) for c in batch["choices"]] == [
        (0, "one t"), (1, "one t"), (2, "three"), (3, "three")]
    assert batch["usage"] == {**batch["usage"], "prompt_tokens": 3, "completion_tokens": 8}
    resp = httpx.get(f"{sim}/no/such/path")
    assert resp.status_code == 404 and resp.json() == {"detail": "Not Found"}
    assert httpx.get(f"{sim}/version").json() == {"version": "0.32.0"}
    assert set(httpx.get(f"{sim}/load").json()) == {"server_load"}
    assert httpx.post(f"{sim}/ping").status_code == 200
    tok = httpx.post(f"{sim}/tokenize", json={"prompt": "hello world"}).json()
    assert tok["count"] == 2 and tok["max_model_len"] == MAX_LEN and len(tok["tokens"]) == 2
    assert isinstance(httpx.post(f"{sim}/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"], str)
    assert "vllm:spec_decode" not in httpx.get(f"{sim}/metrics").text  # no speculative decoding configured
    info = next(x for x in httpx.get(f"{sim}/metrics").text.splitlines() if x.startswith("vllm:cache_config_info{"))
    assert 'engine="0"' in info and info.count('="') == 37


def test_defaults_are_the_vllm_versions(tmp_path: Path) -> None:
    """Finding 24: the simulator's defaults are vLLM 0.32's (gpu_memory_utilization 0.92 since vLLM 0.20,
    vllm/config/cache.py; 0.9 was vLLM 0.11's)."""
    from oculis_sim.cli import build_parser, settings_from

    args = build_parser().parse_args(["serve", MODEL, "--gpu", "H100-80GB"])
    assert settings_from(args).gpu_memory_utilization == 0.92


def test_error_figures_use_the_override() -> None:
    """Finding 26: the 'available KV cache memory' figure ignored --num-gpu-blocks-override."""
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
                           "--num-gpu-blocks-override", "64", "--max-model-len", "1024", "--port", str(free_port())],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stderr.endswith("\n")
    assert "(0.12 GiB KV cache is needed, which is larger than the available KV cache memory (0.12 GiB)" in (
        proc.stderr)
    assert "estimated maximum model length is 1008" in proc.stderr


def test_unknown_flags_are_refused_as_vllm_refuses_them() -> None:
    """The note: unknown `vllm serve` flags were warned about and ignored (vLLM 0.32 exits 2)."""
    start_s = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
                           "--preemption-mode", "recompute", "--port", str(free_port())],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and time.monotonic() - start_s < 30
    assert proc.stderr == "oculis sim serve: error: unrecognized arguments: --preemption-mode recompute\n"


def test_usage_reports_cached_prompt_tokens_with_vllms_flag() -> None:
    """usage.prompt_tokens_details (cached prompt tokens) as vLLM gives it with --enable-prompt-tokens-details;
    null without the flag, as vLLM."""
    proc, base = start("--enable-prompt-tokens-details")
    try:
        prompt = "the same long prompt " * 20  # 80 tokens: four full blocks of 16
        first = httpx.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 2}).json()["usage"]
        again = httpx.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 2}).json()["usage"]
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        assert again["prompt_tokens_details"] == {"cached_tokens": 64, "created_cache_tokens": None,
                                                  "multimodal_tokens": None}
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
        chat = httpx.post(f"{base}/v1/chat/completions", json=body).json()["usage"]["prompt_tokens_details"]
        assert set(chat) == {"cached_tokens", "created_cache_tokens", "multimodal_tokens"}
        assert isinstance(chat["created_cache_tokens"], int)
    finally:
        stop(proc)


def test_api_shapes_a_doubtful_simulated_engine_makes_the_router_escalate_on_the_answer(doubtful: str, sim: str,
                                                                                      tmp_path: Path) -> None:
    """Finding 8 end to end: behind the router, the simulator's modelled logprobs feed min_mean_logprob, so a
    doubtful engine's answer is replaced by the next tier's (the demo and the e2e stand-in can show it)."""
    import yaml
    from router_support import start_router

    ups = [{"name": n, "provider": "vllm", "base_url": f"{b}/v1", "model": m}
           for n, b, m in (("doubtful", doubtful, MODEL), ("sure", sim, "first"))]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": ups, "routes": [{
        "name": "lp", "escalation": {"on_low_confidence": False, "on_answer": {"min_mean_logprob": -1.0}},
        "tiers": [{"name": "small", "match": {"complexity_below": 0.99}, "upstream": "doubtful"},
                  {"name": "big", "upstream": "sure"}]}]}}))
    proc, url, _ = start_router(cfg, tmp_path / "router.log")
    try:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "lp", "max_tokens": 20, "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, r.text
        assert (r.headers["x-oculis-tier"], r.headers["x-oculis-escalation-reason"]) == ("big", "answer")
        assert float(r.headers["x-oculis-answer-logprob"]) < -1.0  # the replaced answer's mean, modelled
        assert r.json()["choices"][0].get("logprobs") is None  # the client did not ask for them
    finally:
        proc.terminate()
        proc.wait(timeout=10)
