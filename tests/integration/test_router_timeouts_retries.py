"""Timeouts and retries that fit LLM traffic, over real HTTP against fake upstreams on 127.0.0.1:
connect / first-byte / idle timeouts instead of a cap on a whole generation, `escalation.max_retries`,
Retry-After, the router's own credential refused, and a prompt over a small tier's context."""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2e_support import eventually
from router_support import Fakes, RouterHandle

CHAT = "/v1/chat/completions"
HI = {"messages": [{"role": "user", "content": "hi"}]}  # the classifier sends it to tier `simple` (llama-8b)
CONTEXT_400 = {"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested "
                                    "5000 tokens (4000 in the messages, 1000 in the completion).",
                         "type": "BadRequestError", "param": None, "code": 400}}
KEY_401 = {"error": {"message": "Incorrect API key provided: sk-upstr********************1234.",
                     "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def reconfigure(router: RouterHandle, fakes: Fakes, upstreams: dict[str, dict[str, Any]] | None = None,
                routes: list[dict[str, Any]] | None = None, **route_overrides: Any) -> None:
    """Serve the fakes' config with `upstreams` settings merged in and `routes` added, once reloaded."""
    cfg = fakes.config(**route_overrides)
    for up in cfg["oculis"]["upstreams"]:
        up.update((upstreams or {}).get(up["name"], {}))
    cfg["oculis"]["routes"] += routes or []
    before = router.app.state.holder.current.digest
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.digest != before, timeout=10, interval=0.05,
               what="the router to load the new config")


def only(tier_upstream: str, **escalation: Any) -> dict[str, Any]:
    """A one-tier route named `only`."""
    return {"name": "only", "tiers": [{"name": "t", "upstream": tier_upstream}], "escalation": escalation}


def post(router: RouterHandle, model: str, stream: bool = False, **kw: Any) -> httpx.Response:
    return httpx.post(router.server.url + CHAT, json={"model": model, "stream": stream, **HI, **kw}, timeout=30)


def stream_text(router: RouterHandle, model: str = "adaptive") -> tuple[httpx.Response, str, list[dict[str, Any]]]:
    """The streamed text and every event, read to the end."""
    text, events = "", []
    with httpx.stream("POST", router.server.url + CHAT, json={"model": model, "stream": True, **HI},
                      timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                events.append(event)
                for choice in event.get("choices", []):
                    text += choice["delta"].get("content") or ""
    return r, text, events


@pytest.mark.parametrize("timeouts", [{"timeouts": {"first_byte_seconds": 0.6, "idle_seconds": 0.6}},
                                      {"timeout_seconds": 0.6}])  # the old name: now the first-byte timeout
def test_a_stream_that_keeps_sending_is_never_cut_by_a_timeout(router: RouterHandle, fakes: Fakes,
                                                               timeouts: dict[str, Any]) -> None:
    # A generation lasting much longer than every timeout, sending a chunk every 0.25 s.
    reconfigure(router, fakes, {"llama-8b": timeouts})
    fakes.scripts["small"].stream_delay = 0.25
    fakes.scripts["small"].reply = "a b c d e f g"
    r, text, events = stream_text(router)
    assert r.headers["x-oculis-upstream"] == "llama-8b"
    assert text.strip() == "a b c d e f g from small"
    assert not [e for e in events if "error" in e]
    assert fakes.scripts["small"].streams_done == 1 and len(fakes.scripts["small"].received) == 1


def test_a_stream_silent_past_the_idle_timeout_ends_with_an_error_event_and_is_never_retried(
        router: RouterHandle, fakes: Fakes) -> None:
    reconfigure(router, fakes, {"llama-8b": {"timeouts": {"idle_seconds": 0.5}}})
    script = fakes.scripts["small"]
    script.reply, script.stall_after, script.stall_seconds = "one two three four", 2, 30
    _, text, events = stream_text(router)
    assert text == "one two "  # what came before the silence reached the client
    assert events[-1]["error"]["code"] == "stream_interrupted"
    assert len(script.received) == 1  # bytes had reached the client: no retry, no second generation
    assert len(fakes.scripts["large"].received) == 0
    eventually(lambda: script.streams_cut, timeout=5, interval=0.05, what="the stalled upstream stream to be closed")


def test_a_stream_that_sends_headers_then_nothing_is_escalated_before_its_first_byte(
        router: RouterHandle, fakes: Fakes) -> None:
    reconfigure(router, fakes, {"llama-8b": {"timeouts": {"first_byte_seconds": 0.3}}},
                routes=[only("llama-8b", max_retries=1)])
    small = fakes.scripts["small"]
    small.first_chunk_delay = 30
    r, text, events = stream_text(router)
    assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"
    assert text.strip() == "hello from large" and not [e for e in events if "error" in e]
    # A timed-out try is not repeated while another tier can answer (it would cost the timeout again)...
    assert len(small.received) == 1
    r = post(router, "only", stream=True)
    assert r.status_code == 502 and "no answer within 0.3 s" in r.json()["error"]["message"]
    assert len(small.received) == 3  # ...but on the last tier it is retried, max_retries times


@pytest.mark.parametrize(("behaviour", "timeouts", "reason"), [
    ({"reply_delay": 30}, {"first_byte_seconds": 0.5}, "no answer within 0.5 s (timeouts.first_byte_seconds)"),
    ({"body_stall": 30}, {"idle_seconds": 0.5}, "the answer stalled for 0.5 s (timeouts.idle_seconds)"),
])
def test_a_non_streamed_answer_gets_a_first_byte_then_an_idle_timeout(
        router: RouterHandle, fakes: Fakes, behaviour: dict[str, float], timeouts: dict[str, float],
        reason: str) -> None:
    reconfigure(router, fakes, {"llama-8b": {"timeouts": timeouts}}, routes=[only("llama-8b", max_retries=0)])
    for k, v in behaviour.items():
        setattr(fakes.scripts["small"], k, v)
    r = post(router, "adaptive")
    assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"
    assert len(fakes.scripts["small"].received) == 1
    r = post(router, "only")
    assert r.status_code == 502 and reason in r.json()["error"]["message"]


@pytest.fixture
def hanging_connect() -> Iterator[str]:
    """A base URL whose TCP connect never completes: a listener with a full accept queue, where Linux
    drops further SYNs (as a firewall that blackholes a dead node's address does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # a non-blocking connect is under way
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    yield f"http://127.0.0.1:{port}/v1"
    for s in (*fillers, listener):
        s.close()


def test_a_connect_that_hangs_times_out_and_escalates(router: RouterHandle, fakes: Fakes,
                                                      hanging_connect: str) -> None:
    reconfigure(router, fakes, {"llama-8b": {"base_url": hanging_connect, "timeouts": {"connect_seconds": 0.3}}},
                escalation={"max_retries": 0}, routes=[only("llama-8b", max_retries=1)])
    for stream in (False, True):
        r = post(router, "adaptive", stream=stream)
        assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"
    r = post(router, "only")
    assert r.status_code == 502
    assert "connect timed out after 0.3 s (timeouts.connect_seconds) (2 attempts)" in r.json()["error"]["message"]


@pytest.mark.parametrize(("max_retries", "calls"), [(0, 1), (3, 4)])
def test_escalation_max_retries_bounds_the_attempts_on_one_tier(router: RouterHandle, fakes: Fakes,
                                                                max_retries: int, calls: int) -> None:
    reconfigure(router, fakes, routes=[only("llama-8b", max_retries=max_retries)])
    script = fakes.scripts["small"]
    for stream in (False, True):
        script.received.clear()
        script.fail_times, script.fail_status = 100, 500
        r = post(router, "only", stream=stream)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        assert len(script.received) == calls


def http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_a_long_retry_after_fails_over_at_once_and_is_relayed_when_no_tier_can_answer(
        router: RouterHandle, fakes: Fakes, form: str) -> None:
    reconfigure(router, fakes, routes=[only("llama-8b")])
    script = fakes.scripts["small"]
    retry_after = "30" if form == "seconds" else http_date(30)
    script.fail_times, script.fail_status, script.fail_headers = 100, 429, {"Retry-After": retry_after}
    r = post(router, "only")
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert 28 <= int(r.headers["retry-after"]) <= 30
    assert len(script.received) == 1  # never hammered: one call, no retry inside the Retry-After
    r = post(router, "adaptive", stream=True)  # another tier can answer: at once, not after 30 s
    assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"
    assert len(script.received) == 2


def test_a_short_retry_after_is_waited_out_on_the_same_tier(router: RouterHandle, fakes: Fakes) -> None:
    script = fakes.scripts["small"]
    script.fail_times, script.fail_status, script.fail_headers = 1, 429, {"retry-after-ms": "200"}
    t0 = time.monotonic()
    r = post(router, "adaptive")
    assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-8b"
    assert len(script.received) == 2
    assert time.monotonic() - t0 >= 0.2  # the retry came no sooner than the provider asked


def test_a_503_with_retry_after_is_relayed_with_it(router: RouterHandle, fakes: Fakes) -> None:
    reconfigure(router, fakes, routes=[only("llama-8b")])
    script = fakes.scripts["small"]
    script.fail_times, script.fail_status, script.fail_headers = 100, 503, {"Retry-After": "120"}
    r = post(router, "only")
    assert r.status_code == 503 and r.headers["retry-after"] == "120" and len(script.received) == 1


def test_the_routers_own_credential_refused_escalates_and_is_never_blamed_on_the_client(
        router: RouterHandle, fakes: Fakes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="oculis.router")
    reconfigure(router, fakes, routes=[only("llama-8b")])
    script = fakes.scripts["small"]
    for status in (401, 403):
        script.received.clear()
        script.fail_times, script.fail_status, script.fail_body = 100, status, KEY_401
        for stream in (False, True):
            r = post(router, "adaptive", stream=stream)
            assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"
        r = post(router, "only")
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed"
        assert "refused the router's credential" in r.json()["error"]["message"]
        assert "sk-upstr" not in r.text and "Incorrect API key" not in r.text
        assert len(script.received) == 3  # one attempt per request: retrying cannot fix a credential
    refusals = [rec for rec in caplog.records if "refused the router's credential" in rec.getMessage()]
    assert len(refusals) == 1  # once per upstream, not once per request
    assert "sk-upstr" not in caplog.text


def test_a_context_length_400_escalates_to_a_tier_with_a_longer_context(router: RouterHandle, fakes: Fakes) -> None:
    small = fakes.scripts["small"]
    small.fail_times, small.fail_status, small.fail_body = 100, 400, CONTEXT_400
    for stream in (False, True):
        r = post(router, "adaptive", stream=stream)
        assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"
    assert len(small.received) == 2  # not retried on the same tier
    for name in ("large", "frontier"):  # over every tier's context: the last tier's 400 is relayed as is
        fakes.scripts[name].fail_times, fakes.scripts[name].fail_status = 100, 400
        fakes.scripts[name].fail_body = CONTEXT_400
    r = post(router, "adaptive")
    assert r.status_code == 400 and r.headers["x-oculis-upstream"] == "gpt4o"
    assert "maximum context length" in r.json()["error"]["message"]


def test_other_client_errors_are_still_relayed_without_retry_or_escalation(router: RouterHandle,
                                                                           fakes: Fakes) -> None:
    small = fakes.scripts["small"]
    small.fail_times, small.fail_status = 1, 422
    small.fail_body = {"error": {"message": "temperature must be <= 2", "type": "BadRequestError"}}
    r = post(router, "adaptive")
    assert r.status_code == 422 and r.headers["x-oculis-upstream"] == "llama-8b" and len(small.received) == 1


def test_an_answer_that_is_json_but_no_object_is_a_failed_attempt_not_a_500(router: RouterHandle,
                                                                           fakes: Fakes) -> None:
    for raw in (b"[1, 2, 3]", b"null"):
        fakes.scripts["small"].reply_raw = raw
        r = post(router, "adaptive")
        assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-70b"


# (status, headers, body) -> the client's status on a one-tier route, calls made there, and whether a
# route with a next tier answers from it instead.
SWEEP = [
    (500, {}, None, 502, 3, True), (502, {}, None, 502, 3, True), (504, {}, None, 502, 3, True),
    (529, {}, None, 502, 3, True),  # Anthropic's "overloaded"
    (503, {}, None, 502, 3, True), (503, {"Retry-After": "30"}, None, 503, 1, True),
    (429, {}, None, 429, 3, True), (429, {"Retry-After": "30"}, None, 429, 1, True),
    (401, {}, KEY_401, 502, 1, True), (403, {}, KEY_401, 502, 1, True),
    (400, {}, CONTEXT_400, 400, 1, True),
    (400, {}, {"error": {"message": "bad temperature"}}, 400, 1, False), (404, {}, None, 404, 1, False),
    (408, {}, None, 408, 1, False), (409, {}, None, 409, 1, False), (413, {}, None, 413, 1, False),
    (422, {}, None, 422, 1, False),
]


@pytest.mark.parametrize(("status", "headers", "body", "client", "calls", "escalates"), SWEEP)
def test_every_upstream_error_gets_the_policys_answer_streamed_or_not(
        router: RouterHandle, fakes: Fakes, status: int, headers: dict[str, str], body: dict[str, Any] | None,
        client: int, calls: int, escalates: bool) -> None:
    reconfigure(router, fakes, routes=[only("llama-8b")])
    small = fakes.scripts["small"]
    for stream in (False, True):
        small.received.clear()
        small.fail_times, small.fail_status, small.fail_headers, small.fail_body = 100, status, headers, body
        r = post(router, "only", stream=stream)
        assert (r.status_code, len(small.received)) == (client, calls), r.text
        assert r.json()["error"]["message"]
        r = post(router, "adaptive", stream=stream)
        assert r.status_code == (200 if escalates else status)
        assert r.headers["x-oculis-upstream"] == ("llama-70b" if escalates else "llama-8b")
