"""Pure parts of the router: cache eligibility and keys, Anthropic translation and markers."""

from __future__ import annotations

import json

from oculis import ResponseCache, Upstream
from oculis_router import cache
from oculis_router.providers import anthropic

UP = Upstream(name="u", provider="vllm", base_url="http://127.0.0.1:1/v1", model="m")
CFG = ResponseCache(enabled=True)
BODY = {"model": "r", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def test_only_deterministic_single_choice_requests_are_cached() -> None:
    assert cache.cacheable(CFG, BODY)
    assert not cache.cacheable(CFG, {**BODY, "temperature": 0.7})
    assert not cache.cacheable(CFG, {k: v for k, v in BODY.items() if k != "temperature"})  # OpenAI default is 1
    assert not cache.cacheable(CFG, {**BODY, "n": 2})
    assert not cache.cacheable(ResponseCache(enabled=False), BODY)


def test_keys_separate_tenants_revisions_and_configured_parts() -> None:
    key = cache.cache_key(CFG, BODY, "t1", UP, "chat")
    assert key == cache.cache_key(CFG, dict(BODY), "t1", UP, "chat")
    assert key != cache.cache_key(CFG, BODY, "t2", UP, "chat")
    assert key != cache.cache_key(CFG, BODY, "t1", UP.model_copy(update={"revision": "2"}), "chat")
    assert key != cache.cache_key(CFG, {**BODY, "messages": [{"role": "user", "content": "ho"}]}, "t1", UP, "chat")
    # max_tokens changes the answer (it may cut it), so it splits the cache
    assert key != cache.cache_key(CFG, {**BODY, "max_tokens": 5}, "t1", UP, "chat")


def test_cached_answer_replays_as_sse() -> None:
    resp = {
        "id": "x",
        "created": 1,
        "model": "m",
        "usage": {"prompt_tokens": 1},
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hey"}, "finish_reason": "stop"}],
    }
    events = cache.sse_from_response(resp)
    assert events[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["content"] == "hey" and chunks[1]["choices"][0]["finish_reason"] == "stop"


def request(breakpoints: int) -> dict:  # type: ignore[type-arg]
    up = Upstream(name="c", provider="anthropic", model="claude", prompt_cache={"breakpoints": breakpoints})
    body = {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
            {"role": "user", "content": "q2b"},
        ],
        "stop": "END",
    }
    return anthropic.build_request(up, "chat", body)[2]


def marked(req: dict) -> list[str]:  # type: ignore[type-arg]
    blocks = req.get("system", []) + [b for m in req["messages"] for b in m["content"]]
    return [b["text"] for b in blocks if "cache_control" in b]


def test_anthropic_request_shape() -> None:
    req = request(0)
    assert req["system"] == [{"type": "text", "text": "sys"}]
    assert [m["role"] for m in req["messages"]] == ["user", "assistant", "user"]  # same-role turns merged
    assert req["max_tokens"] == 1024 and req["stop_sequences"] == ["END"] and marked(req) == []


def test_cache_markers_go_on_the_longest_stable_prefixes_first() -> None:
    assert marked(request(1)) == ["a1"]
    assert marked(request(2)) == ["sys", "a1"]
    assert marked(request(4)) == ["sys", "q1", "a1"]  # only three stable places exist


def test_stream_translation() -> None:
    t = anthropic.StreamTranslator()
    raw = b"".join(
        f"event: {e}\ndata: {json.dumps(d)}\n\n".encode()
        for e, d in [
            (
                "message_start",
                {"type": "message_start", "message": {"id": "m1", "model": "c", "usage": {"input_tokens": 3}}},
            ),
            ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hel"}}),
            ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "lo"}}),
            (
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 2}},
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    )
    out = t.feed(raw[:37]) + t.feed(raw[37:])  # split mid-event: buffered
    assert out[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(o[6:]) for o in out[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "hello"
    assert any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in chunks)
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
        "cache_creation_input_tokens": 0,
    }
