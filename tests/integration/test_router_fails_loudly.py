"""The router cannot fail quietly: whatever an upstream answers and whatever a client sends, the
client gets an OpenAI error (or, mid-stream, an SSE error event), the failure is logged once (no
traceback for what is the upstream's or the client's fault), and `oculis_requests_total` counts the
request exactly once by its final outcome. A real `oculis serve` process in front of a provider that
misbehaves in every way (misbehaving_upstreams.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import Server
from misbehaving_upstreams import A_BODIES, A_STREAMS, BODIES, STREAMS, Misbehaving, upstreams
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router

from oculis_router.app import build_app

# badusage is a good answer with odd usage (200); refusals (e4xx) have their own policy (timeouts tests)
BAD_BODIES = sorted(b for b in BODIES if b != "badusage" and not b.startswith("e4"))
GOOD_STREAMS = ("ok", "crlfsse", "splitsse")
BAD_STREAMS = sorted(set(STREAMS) - set(GOOD_STREAMS))
BAD_A_STREAMS = sorted(set(A_STREAMS) - {"a-ok"})
BAD_A_BODIES = sorted(set(A_BODIES) - {"a-ok"})
MSG = [{"role": "user", "content": "x"}]


@dataclass
class Deployed:
    url: str
    metrics_url: str
    fake: Misbehaving
    log: Path
    config: Path

    def post(self, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> httpx.Response:
        if "content" not in kw:
            kw["json"] = body
        return httpx.post(self.url + path, timeout=30, **kw)

    def requests_total(self) -> dict[tuple[str, ...], float]:
        text = httpx.get(self.metrics_url).text
        out: dict[tuple[str, ...], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == "oculis_requests_total":
                    out[(s.labels["route"], s.labels["tier"], s.labels["upstream"], s.labels["outcome"])] = s.value
        return out

    def sample(self, name: str, **labels: str) -> float:
        text = httpx.get(self.metrics_url).text
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def config(url: str) -> dict[str, Any]:
    ups = upstreams(url)
    names = [u["name"] for u in ups]
    routes = [{"name": f"via-{n}", "escalation": {"on_low_confidence": False, "max_retries": 0},
               "tiers": [{"name": "first", "match": {}, "upstream": n},
                         {"name": "fallback", "upstream": "a-ok" if n.startswith("a-") else "ok"}]}
              for n in names if n not in ("ok", "a-ok")]
    routes.append({"name": "adaptive", "tiers": [
        {"name": "small", "match": {"complexity_below": 0.5}, "upstream": "ok"}, {"name": "large", "upstream": "ok"}]})
    return {"oculis": {"upstreams": ups, "routes": routes}}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    tmp = tmp_path_factory.mktemp("loud")
    fake = Misbehaving()
    with Server(fake.app) as server:
        path = tmp / "oculis-config.yaml"
        path.write_text(yaml.safe_dump(config(server.url)))
        proc, url, mport = start_router(path, tmp / "router.log")
        try:
            yield Deployed(url, f"http://127.0.0.1:{mport}/metrics", fake, tmp / "router.log", path)
        finally:
            proc.kill()
            proc.wait(10)


def openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text[:300]
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    return dict(err)


def sse_events(r: httpx.Response) -> list[Any]:
    """Every data line a client reads, parsed as the openai SDK would (each must parse)."""
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text[:300]
    out = []
    for line in r.text.replace("\r\n", "\n").split("\n"):
        if line.startswith("data:"):
            payload = line[5:].strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def assert_interrupted(events: list[Any]) -> None:
    """The stream ends with our error event: a client knows the answer is incomplete."""
    assert events, "no event at all"
    last = events[-1]
    assert isinstance(last, dict) and last["error"]["code"] == "stream_interrupted", events
    assert "[DONE]" not in events
    assert all(isinstance(e, dict) for e in events)  # no malformed event reached the client


@pytest.mark.parametrize("name", ["hang", *BAD_BODIES, *BAD_A_BODIES])
def test_any_upstream_answer_that_is_no_completion_is_a_502_retried_and_failed_over(
        deployed: Deployed, name: str) -> None:
    before = deployed.fake.calls[name]
    err = openai_error(deployed.post({"model": name, "messages": MSG}), 502)
    assert err["code"] == "upstream_failed"
    assert deployed.fake.calls[name] - before == 3  # retried like invalid JSON (2 retries by default)
    r = deployed.post({"model": f"via-{name}", "messages": MSG})
    assert r.status_code == 200, r.text[:300]
    assert r.headers["x-oculis-escalated"] == "true" and r.json()["choices"][0]["message"]["content"] == "fine"


def test_an_answer_with_usage_of_another_shape_is_still_answered(deployed: Deployed) -> None:
    r = deployed.post({"model": "badusage", "messages": MSG})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "fine"


@pytest.mark.parametrize("name", GOOD_STREAMS)
def test_well_formed_streams_pass_whole_in_any_framing(deployed: Deployed, name: str) -> None:
    events = sse_events(deployed.post({"model": name, "messages": MSG, "stream": True}))
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]) == "fine"


@pytest.mark.parametrize("name", BAD_STREAMS + BAD_A_STREAMS)
def test_a_broken_stream_ends_with_an_error_event_and_counts_stream_broken(deployed: Deployed, name: str) -> None:
    before = deployed.sample("oculis_requests_total", upstream=name, outcome="stream_broken")
    r = deployed.post({"model": name, "messages": MSG, "stream": True})
    if name == "errorsse":  # the provider's own error event is relayed as it came (it explains itself)
        events = sse_events(r)
        assert events[-1]["error"]["message"] == "engine died" and "[DONE]" not in events
    else:
        assert_interrupted(sse_events(r))
    assert deployed.sample("oculis_requests_total", upstream=name, outcome="stream_broken") == before + 1


@pytest.mark.parametrize(("what", "raw"), [
    ("deep nesting", b'{"model": "ok", "messages": [{"role": "user", "content": "x"}], "metadata": '
     + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    ("a lone surrogate in a routed prompt",
     b'{"model": "adaptive", "messages": [{"role": "user", "content": "\\ud800 x"}]}'),
    ("NaN", b'{"model": "ok", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}'),
    ("Infinity", b'{"model": "ok", "temperature": -Infinity, "messages": [{"role": "user", "content": "x"}]}'),
    ("a number that overflows", b'{"model": "ok", "top_p": 1e400, "messages": [{"role": "user", "content": "x"}]}'),
    ("not UTF-8", b'{"model": "ok", "messages": [{"role": "user", "content": "\xff"}]}'),
])
def test_client_json_the_router_cannot_pass_on_is_a_400_invalid_json(deployed: Deployed, what: str,
                                                                      raw: bytes) -> None:
    before = deployed.fake.calls["ok"]
    err = openai_error(deployed.post(None, content=raw, headers={"content-type": "application/json"}), 400)
    assert err["code"] == "invalid_json", what
    assert deployed.fake.calls["ok"] == before  # nothing invalid was forwarded


@pytest.mark.parametrize("parts", [[{"type": "text", "text": None}], [{"type": "text", "text": ["x"]}],
                                   [{"type": "text"}], [1, None, "x"], [{"type": "image_url"}]])
def test_content_parts_of_any_shape_are_answered_never_a_500(deployed: Deployed, parts: list[Any]) -> None:
    r = deployed.post({"model": "adaptive", "messages": [{"role": "user", "content": parts}]})
    assert r.status_code in (200, 400), r.text[:300]


def test_an_unknown_model_is_a_404_that_names_no_internal_upstream(deployed: Deployed) -> None:
    err = openai_error(deployed.post({"model": "gpt-4o", "messages": MSG}), 404)
    assert err["code"] == "model_not_found" and "GET /v1/models" in err["message"]
    assert "listjson" not in err["message"] and "via-" not in err["message"]


def test_each_request_is_counted_once_by_its_final_outcome(deployed: Deployed) -> None:
    def total() -> float:
        return sum(deployed.requests_total().values())

    def count(**labels: str) -> float:
        return deployed.sample("oculis_requests_total", **labels)

    start = total()
    ok0, failed0 = count(route="via-listjson", outcome="ok"), count(outcome="error_502")
    down0 = deployed.sample("oculis_upstream_failures_total", upstream="listjson")
    assert deployed.post({"model": "via-listjson", "messages": MSG}).status_code == 200  # a failover
    assert deployed.post({"model": "listjson", "messages": MSG}).status_code == 502  # no tier left
    assert deployed.post({"model": "nope", "messages": MSG}).status_code == 404  # refused by the router
    assert deployed.post({"model": "ok", "messages": MSG}).status_code == 200
    assert deployed.post({"model": "cutstream", "messages": MSG, "stream": True}).status_code == 200
    assert total() == start + 5
    assert count(route="via-listjson", outcome="ok") == ok0 + 1  # the failover: one ok, from the tier that answered
    assert count(route="via-listjson", tier="fallback", upstream="ok", outcome="ok") >= 1
    assert count(outcome="error_502") == failed0 + 1
    assert count(outcome="upstream_failed") == 0  # a tier's failure is not a request outcome
    assert deployed.sample("oculis_upstream_failures_total", upstream="listjson") == down0 + 2


def test_each_failure_is_one_log_line_and_none_is_a_traceback(deployed: Deployed) -> None:
    start = len(deployed.log.read_text())
    deployed.post({"model": "nulljson", "messages": MSG})
    deployed.post({"model": "a-badsse", "messages": MSG, "stream": True})
    deployed.post({"model": "via-choicenotobject", "messages": MSG})
    log = eventually(lambda: "a-badsse" in (t := deployed.log.read_text()[start:]) and t, timeout=10,
                     interval=0.05, what="the broken stream to be logged")
    assert isinstance(log, str)
    assert len([ln for ln in log.splitlines() if "nulljson" in ln]) == 1
    assert len([ln for ln in log.splitlines() if "a-badsse" in ln]) == 1
    assert len([ln for ln in log.splitlines() if "choicenotobject" in ln]) == 1  # the failover
    whole = deployed.log.read_text()  # and nothing this module sent raised a traceback
    assert "Traceback" not in whole and "Exception in ASGI application" not in whole


def test_a_bad_config_write_is_rejected_and_the_next_good_one_applies(deployed: Deployed) -> None:
    good = deployed.config.read_text()
    try:
        deployed.config.write_bytes(b"oculis:\n  upstreams: []\n\xff\xfe\n")
        eventually(lambda: "not UTF-8" in deployed.log.read_text(), timeout=10, interval=0.1,
                   what="the invalid UTF-8 write to be rejected")
        assert httpx.get(deployed.url + "/readyz").status_code == 200
        cfg = yaml.safe_load(good)
        cfg["oculis"]["routes"].append({"name": "newroute", "tiers": [{"name": "a", "upstream": "ok"}]})
        deployed.config.write_text(yaml.safe_dump(cfg))
        eventually(lambda: "newroute" in {m["id"] for m in httpx.get(deployed.url + "/v1/models").json()["data"]},
                   timeout=10, interval=0.1, what="the next good config to apply")
    finally:
        deployed.config.write_text(good)


# In-process: the parts that need a hand on the app.

def small_config(url: str = "http://127.0.0.1:9/v1") -> dict[str, Any]:
    return {"oculis": {"upstreams": [{"name": "ok", "provider": "vllm", "base_url": url, "model": "m"}],
                       "routes": [{"name": "adaptive", "tiers": [{"name": "a", "upstream": "ok"}]}],
                       "server": {"max_body_bytes": 64 * 1024}}}


SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
         "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
         "query_string": b"", "headers": [(b"content-type", b"application/json")],
         "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


def test_a_chunked_body_stops_being_read_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(small_config()))
    app = build_app(config_path=path)
    chunk, chunks = b"a" * 4096, 10_000  # 40 MB offered, no Content-Length
    read = 0
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": read < chunks}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(dict(SCOPE), receive, send))
    assert sent[0]["status"] == 413
    assert read * len(chunk) <= 64 * 1024 + len(chunk)  # stopped at the limit, not at the end of the body


def test_a_client_that_leaves_while_sending_is_counted_as_such_not_as_an_internal_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(small_config()))
    app = build_app(config_path=path)
    messages = iter([{"type": "http.request", "body": b'{"model": "ok", "mess', "more_body": True},
                     {"type": "http.disconnect"}])

    async def receive() -> MutableMapping[str, Any]:
        return next(messages)

    async def send(message: MutableMapping[str, Any]) -> None:
        pass

    asyncio.run(app(dict(SCOPE), receive, send))
    registry = app.state.metrics.registry
    assert registry.get_sample_value("oculis_requests_total", {"route": "-", "tier": "-", "upstream": "-",
                                                               "outcome": "client_closed"}) == 1
    assert not [r for r in caplog.records if r.exc_info]


def test_a_stopped_reload_watcher_turns_readyz_503_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(small_config()))
    app = build_app(config_path=path, reload_interval=0.01)

    class Pulled(BaseException):
        """What no except-Exception can catch."""

    def pulled() -> None:
        raise Pulled("the watcher was pulled")

    monkeypatch.setattr(app.state.holder, "tick", pulled)
    with Server(app) as server:
        r = eventually(lambda: (r := httpx.get(server.url + "/readyz")).status_code == 503 and r, timeout=10,
                       interval=0.02, what="/readyz to report the stopped watcher")
        assert isinstance(r, httpx.Response)
        assert "config reload watcher stopped" in r.json()["status"] and "Pulled" in r.json()["status"]


def test_the_classifier_memo_holds_digests_not_prompts(tmp_path: Path) -> None:
    fake = Misbehaving()
    with Server(fake.app) as up:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({**small_config(up.url + "/v1")}))
        app = build_app(config_path=path)
        with Server(app) as server:
            prompt = "why is the sky blue? " * 2_500  # 52 kB, under this config's body limit
            r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                           json={"model": "adaptive", "messages": [{"role": "user", "content": prompt}]})
            assert r.status_code == 200
    memo = app.state.holder.current.routes["adaptive"].scorer.classifier._memo
    assert memo and all(len(k) <= 64 for k in memo)  # a digest per prompt, not the prompt
