"""A real `oculis sim serve` process on 127.0.0.1: streams placeholder words at the modelled pace, says
it is simulated everywhere, exports vLLM's metric names, and refuses an over-long request with vLLM's
400 shape."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from sim_support import start_sim, stop

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_LEN = 512


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    # a pod's rendered arguments (incl. a flag the simulator ignores), then the stand-in's overrides
    proc, base = start_sim(MODEL, "--host=0.0.0.0", "--port=8000", f"--served-model-name={MODEL}",
                           "--tensor-parallel-size=1", f"--max-model-len={MAX_LEN}", "--max-num-seqs=32",
                           "--max-num-batched-tokens=2048", "--gpu-memory-utilization=0.92", "--enable-prefix-caching",
                           "--enforce-eager",
                           '--speculative-config={"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}',
                           "--gpu", "NVIDIA-H100-80GB-HBM3", log=log)
    yield base
    stop(proc)
    err = log.read_text()
    assert "ignoring what vLLM accepts and the simulator does not model: --enforce-eager" in err
    assert "SIMULATED" in err


def test_stream_counts_words_as_tokens_and_says_it_is_simulated(sim: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something, please."}],
            "max_tokens": 40, "stream": True, "stream_options": {"include_usage": True}}
    text = ""
    chunks = []
    with httpx.stream("POST", f"{sim}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["x-oculis-simulated"] == "true"
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            chunks.append(chunk)
            for choice in chunk["choices"]:
                text += choice["delta"].get("content") or ""
    usage = chunks[-1]["usage"]
    # vLLM sends system_fingerprint in the usage chunk only; the simulator's value says it is simulated
    assert chunks[-1]["system_fingerprint"] == "oculis-simulator"
    assert all("system_fingerprint" not in c for c in chunks[:-1])
    assert usage["completion_tokens"] == 40 == len(text.split())
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] > 0


def test_stop_and_non_streamed_completions_keep_usage_equal_to_words(sim: str) -> None:
    resp = httpx.post(f"{sim}/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 60,
                                                      "stop": ["magna"]}, timeout=30)
    data = resp.json()
    assert resp.headers["x-oculis-simulated"] == "true" and data["system_fingerprint"] == "oculis-simulator"
    words = data["choices"][0]["text"].split()
    assert "magna" not in words and data["usage"]["completion_tokens"] == len(words)
    assert data["choices"][0]["finish_reason"] == "stop" and len(words) < 60


def test_models_are_owned_by_the_simulator(sim: str) -> None:
    resp = httpx.get(f"{sim}/v1/models")
    assert resp.headers["x-oculis-simulated"] == "true"
    assert [(m["id"], m["owned_by"]) for m in resp.json()["data"]] == [(MODEL, "oculis-simulator")]


def test_request_longer_than_max_model_len_gets_vllms_400(sim: str) -> None:
    resp = httpx.post(f"{sim}/v1/completions", json={"model": MODEL, "prompt": "word " * 600, "max_tokens": 5})
    assert resp.status_code == 400 and resp.headers["x-oculis-simulated"] == "true"
    err = resp.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] == "input_tokens"
    assert err["message"].startswith(f"This model's maximum context length is {MAX_LEN} tokens. However, your "
                                     f"prompt contains at least {MAX_LEN + 1} input tokens")
    resp = httpx.post(f"{sim}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": MAX_LEN + 1})
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith(
        f"max_tokens={MAX_LEN + 1} cannot be greater than max_model_len={MAX_LEN}.")
    resp = httpx.post(f"{sim}/v1/completions", json={"model": "other", "prompt": "hi"})
    assert resp.status_code == 404 and resp.json()["error"] == {
        "message": f"The model `other` does not exist. Valid aliases: {MODEL}.", "type": "NotFoundError",
        "param": "model", "code": 404}


def test_metrics_use_vllm_v1_names(sim: str) -> None:
    httpx.post(f"{sim}/v1/completions", json={"model": MODEL, "prompt": "x " * 64, "max_tokens": 8}, timeout=30)
    httpx.post(f"{sim}/v1/completions", json={"model": MODEL, "prompt": "x " * 64, "max_tokens": 8}, timeout=30)
    text = httpx.get(f"{sim}/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"):
        assert name in text, name
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    assert 'block_size="16"' in info and 'engine="0"' in info
    assert 'le="2560.0"' in text and "vllm:prompt_tokens_created" in text  # vLLM exports `_created` series
    hits = next(line for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))
    assert float(hits.split()[-1]) >= 48  # the second identical 64-token prompt reused 3 of its 4 blocks


def test_the_role_chunk_arrives_with_the_first_token(sim: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{sim}/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["choices"][0]["delta"]["content"].strip()  # the first word right behind it
