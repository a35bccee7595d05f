"""A fresh sweep of the inputs the QA pass found defects with: generated request bodies (valid ones,
odd shapes and types of every field, raw bytes) to every endpoint, routed to upstreams of every
misbehaviour (misbehaving_upstreams.py) and routes that fail over from them. Whatever the
combination, the router answers: never a 500, a 5xx only as an OpenAI `upstream_failed` error,
every error an OpenAI error body, every 200 a completion or a stream a client can read to its end
(`[DONE]` or an error event), no traceback in the log, and each request counted exactly once.

Over real HTTP: the router app and the fake provider each run under uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from fake_upstreams import Server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from misbehaving_upstreams import Misbehaving, upstreams
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from oculis_router.app import build_app

SWEPT = 800  # examples per run: about 15 s of requests


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Swept:
    def __init__(self, url: str, app: Any, names: list[str]) -> None:
        self.url, self.app, self.names = url, app, names
        self.http = httpx.Client(base_url=url, timeout=30)
        self.sent = 0

    def counted(self) -> float:
        text = generate_latest(self.app.state.metrics.registry).decode()
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "oculis_requests_total")


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Swept, Records]]:
    records = Records()
    fake = Misbehaving()
    saved = os.environ.get("OCULIS_TEST_ANTHROPIC_KEY")
    os.environ["OCULIS_TEST_ANTHROPIC_KEY"] = "sk-ant-sweep"
    with Server(fake.app) as provider:
        ups = [u for u in upstreams(provider.url) if u["name"] != "hang"]  # timeouts: test_router_fails_loudly
        names = [u["name"] for u in ups]
        routes = [{"name": f"via-{n}", "escalation": {"on_low_confidence": False},
                   "tiers": [{"name": "first", "match": {}, "upstream": n},
                             {"name": "fallback", "upstream": "a-ok" if n.startswith("a-") else "ok"}]}
                  for n in names if n not in ("ok", "a-ok")]
        routes.append({"name": "adaptive", "cache": {"enabled": True}, "tiers": [
            {"name": "small", "match": {"complexity_below": 0.5}, "upstream": "ok"},
            {"name": "large", "upstream": "a-ok"}]})
        path = tmp_path_factory.mktemp("sweep") / "oculis-config.yaml"
        path.write_text(yaml.safe_dump({"oculis": {"upstreams": ups, "routes": routes,
                                                   "server": {"max_body_bytes": 256 * 1024}}}))
        app = build_app(config_path=path, backoff=0.0, max_retries=1)
        with Server(app) as router:
            # After the servers start: uvicorn configures its loggers (which do not propagate) then.
            loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
            for lg in loggers:
                lg.addHandler(records)
            try:
                yield Swept(router.url, app, names + [r["name"] for r in routes]), records
            finally:
                for lg in loggers:
                    lg.removeHandler(records)
                if saved is None:
                    os.environ.pop("OCULIS_TEST_ANTHROPIC_KEY", None)
                else:
                    os.environ["OCULIS_TEST_ANTHROPIC_KEY"] = saved


# ---- the inputs ------------------------------------------------------------------------------------

json_leaf = (st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
             | st.text(max_size=30))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
text = st.text(max_size=60) | st.sampled_from(["hi", "\U0001f9ff" * 5, "\u202e rtl", "word " * 600, ""])
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio", "nonsense"])},
                             optional={"text": text | json_value,
                                       "image_url": st.fixed_dictionaries({"url": st.sampled_from(
                                           ["https://example.invalid/a.png", "data:image/png;base64,AAAA", "x"])})})
content = text | st.lists(part, max_size=3) | json_value
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]) | json_value},
    optional={"content": content, "tool_calls": json_value, "tool_call_id": st.text(max_size=5), "name": text})
tool = st.fixed_dictionaries({"type": st.just("function") | json_value,
                              "function": st.fixed_dictionaries({"name": st.text(max_size=8)},
                                                                optional={"parameters": json_value})})
odd = json_value  # any field may arrive with any JSON value


def plausible(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """What real clients send: well-formed, with the optional fields they use."""
    user = st.fixed_dictionaries({"role": st.just("user"), "content": text | st.lists(part, min_size=1, max_size=2)})
    turn = st.fixed_dictionaries({"role": st.sampled_from(["system", "assistant", "user"]), "content": text})
    return st.fixed_dictionaries(
        {"model": st.sampled_from(names), "messages": st.tuples(st.lists(turn, max_size=2), user).map(
            lambda t: [*t[0], t[1]]), "prompt": text},
        optional={"stream": st.booleans(), "temperature": st.sampled_from([0, 0.2, 1.0]),
                  "max_tokens": st.integers(1, 100), "stop": text, "tools": st.lists(tool, min_size=1, max_size=1),
                  "response_format": st.just({"type": "json_object"}), "logprobs": st.booleans(),
                  "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "top_k": st.integers(1, 9),
                  "seed": st.integers(0, 9), "user": st.text(max_size=5)})


def bodies(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Plausible requests, the same with one field given any JSON value, and bodies of anything."""
    model = st.sampled_from(names) | st.sampled_from(["", "gpt-4o", "via-"]) | json_value
    extra = st.dictionaries(st.text(min_size=1, max_size=10), odd, max_size=2)  # fields nobody knows
    anything = st.tuples(extra, st.fixed_dictionaries(
        {"model": model},
        optional={"messages": st.lists(message, min_size=1, max_size=3) | odd,
                  "prompt": text | st.lists(text, max_size=2) | odd,
                  "stream": st.booleans() | odd, "temperature": odd, "max_tokens": odd, "n": odd, "stop": odd,
                  "tools": st.lists(tool, max_size=2) | odd, "tool_choice": odd, "response_format": odd,
                  "stream_options": odd, "logprobs": odd, "metadata": odd})).map(lambda p: {**p[0], **p[1]})
    one_odd = st.tuples(plausible(names), st.sampled_from(["model", "messages", "prompt", "stream", "temperature",
                                                           "max_tokens", "n", "stop", "tools", "tool_choice",
                                                           "response_format", "stream_options", "logprobs"]),
                        odd).map(lambda t: {**t[0], t[1]: t[2]})
    return st.one_of(plausible(names), plausible(names), one_odd, anything)


raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"model": "ok", "messages": [{"role": "user", '
                     b'"content": "\\ud800"}]}', b'{"model": "ok", "temperature": NaN, "messages": []}',
                     b'{"model": "ok", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                     b'{"model": "ok", "messages": [{"role": "user", "content": "x"}], "top_p": 1e999}',
                     b'{"model": "ok", "messages": [{"role": "user", "content": "' + b"a" * 300_000 + b'"}]}']))


# ---- what every answer must be ---------------------------------------------------------------------

def check_answer(r: httpx.Response, sent: Any) -> None:
    where = f"{r.request.url.path} {str(sent)[:300]!r} -> {r.status_code} {r.text[:300]!r}"
    assert r.status_code != 500, where
    ctype = r.headers.get("content-type", "")
    if 400 <= r.status_code < 500 and r.status_code not in (429, 499) and "x-oculis-upstream" in r.headers:
        return  # the upstream refused the request: relayed as it answered (its content-type included)
    if r.status_code >= 400:
        assert ctype.startswith("application/json"), where
        err = r.json()["error"]
        assert isinstance(err, dict) and err.get("message"), where
        if r.status_code >= 500:
            assert err.get("code") in ("upstream_failed", "upstream_unavailable"), where
        return
    assert r.status_code == 200, where
    if ctype.startswith("text/event-stream"):
        events = []
        for line in r.text.replace("\r\n", "\n").split("\n"):
            if line.startswith("data:"):
                payload = line[5:].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        assert events, where
        assert all(e == "[DONE]" or isinstance(e, dict) for e in events), where  # every event readable
        last = events[-1]
        assert last == "[DONE]" or (isinstance(last, dict) and "error" in last), where  # never a silent stop
        return
    data = r.json()
    assert isinstance(data, dict) and isinstance(data.get("choices"), list) and data["choices"], where


def post(s: Swept, path: str, **kw: Any) -> httpx.Response:
    s.sent += 1
    return s.http.post(path, headers={"content-type": "application/json"}, **kw)


def test_no_body_to_any_upstream_gets_a_500_a_traceback_or_a_silent_drop(swept: tuple[Swept, Records]) -> None:
    s, records = swept
    start = s.counted()

    @settings(max_examples=SWEPT, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), body=bodies(s.names))
    def generated(path: str, body: dict[str, Any]) -> None:
        check_answer(post(s, path, content=json.dumps(body).encode()), body)

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), raw=raw_bodies)
    def raw(path: str, raw: bytes) -> None:
        check_answer(post(s, path, content=raw), raw)

    generated()
    raw()
    for name in s.names:  # and every upstream and route once, streamed and not, with a plain valid body
        for stream in (False, True):
            body = {"model": name, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}
            check_answer(post(s, "/v1/chat/completions", json=body), body)

    bad = [r for r in records.records if (r.exc_info or "Exception in ASGI application" in r.getMessage())
           and not (r.exc_info and r.exc_info[0] is ConnectionAbortedError)]  # the fake provider's own cut
    assert not bad, "\n".join(f"{r.name}: {r.getMessage()}" for r in bad[:5])
    assert s.counted() - start == s.sent  # every request counted, and only once
