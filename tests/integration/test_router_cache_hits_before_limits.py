"""A stored answer needs no upstream (QA pass 2, finding 30 and its siblings): the cache is looked up
before the cold start and the limits, so a hit is never held or refused for a tier at zero, nor refused
by a token limit or a budget (it spends nothing). It still counts as a request and the request limit
paces it like any other (documented in README). Memory backend; the real router over real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
from e2e_support import eventually
from router_support import Fakes, RouterHandle

BODY = {"model": "adaptive", "temperature": 0, "max_tokens": 2000, "messages": [{"role": "user", "content": "hi"}]}


def serve(router: RouterHandle, cfg: dict[str, Any]) -> None:
    before = router.app.state.holder.current.digest
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.digest != before, timeout=10, interval=0.05,
               what="the config to apply")


def post(router: RouterHandle, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(router.server.url + "/v1/chat/completions", json=body, timeout=30)


def test_a_hit_is_not_refused_by_a_token_limit_and_is_paced_by_the_request_limit(router: RouterHandle,
                                                                                  fakes: Fakes) -> None:
    assert post(router, BODY).headers["x-oculis-cache"] == "miss"  # stored, before any limit
    serve(router, fakes.config(limits={"tokens_per_minute": 1000, "requests_per_minute": 2}))
    calls = len(fakes.scripts["small"].received)
    for _ in range(2):
        r = post(router, BODY)  # reserves nothing: its 2000 max_tokens are more than the whole token limit
        assert r.status_code == 200 and r.headers["x-oculis-cache"] == "hit", r.text
    assert len(fakes.scripts["small"].received) == calls
    r = post(router, {**BODY, "messages": [{"role": "user", "content": "another"}]})
    assert r.status_code == 429 and "more than the whole limit" in r.json()["error"]["message"]  # not cached
    r = post(router, BODY)
    assert r.status_code == 429 and "requests" in r.json()["error"]["message"]  # the third request this minute


def test_a_hit_is_served_while_its_tier_is_at_zero(router: RouterHandle, fakes: Fakes) -> None:
    assert post(router, BODY).headers["x-oculis-cache"] == "miss"
    cfg = fakes.config(cold_start="fail")
    next(u for u in cfg["oculis"]["upstreams"] if u["name"] == "llama-8b")["scaled_to_zero"] = True
    serve(router, cfg)
    r = post(router, BODY)
    assert r.status_code == 200 and r.headers["x-oculis-cache"] == "hit" and "x-oculis-cold-start" not in r.headers
    r = post(router, {**BODY, "messages": [{"role": "user", "content": "another"}]})
    assert r.status_code == 503 and r.headers["x-oculis-cold-start"] == "failed"  # not cached: the cold start applies
