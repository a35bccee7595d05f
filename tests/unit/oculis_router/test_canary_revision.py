"""An upstream's canary revision: the schema that declares it, the pure choice of revision per call on a
random draw, and what stays the same at either revision (the response cache's key among it)."""

from __future__ import annotations

import pytest
import yaml

from oculis import ConfigError, Upstream, parse_config
from oculis.router import ResponseCache
from oculis_router import cache as rcache
from oculis_router.revisions import at_revision, revision

STABLE = "http://llama-vllm.ns.svc:8000/v1"
CANARY = "http://llama-vllm-canary.ns.svc:8000/v1"


def up(percent: int | None = 25) -> Upstream:
    return Upstream.model_validate({"name": "llama", "provider": "vllm", "base_url": STABLE, "model": "llama",
                                    "revision": "h1", **({"canary": {"base_url": CANARY, "percent": percent}}
                                                         if percent is not None else {})})


@pytest.mark.parametrize("percent", [1, 10, 25, 50, 99])
def test_the_canary_takes_exactly_its_percent_of_evenly_spread_draws(percent: int) -> None:
    draws = [i / 1000 for i in range(1000)]
    picked = [revision(up(percent), d) for d in draws]
    assert picked.count("canary") == 10 * percent
    assert all(r == "canary" for r in picked[:10 * percent])  # low draws go to the canary, the rest stable


def test_an_upstream_without_a_canary_is_always_stable() -> None:
    assert {revision(up(None), d) for d in (0.0, 0.001, 0.5, 0.999)} == {"stable"}


def test_the_canary_revision_differs_only_in_where_it_is_called() -> None:
    u = up()
    c = at_revision(u, "canary")
    assert c.url == CANARY and at_revision(u, "stable").url == STABLE
    assert (c.name, c.model, c.revision, c.pricing, c.timeouts) == (u.name, u.model, u.revision, u.pricing, u.timeouts)


def test_the_response_cache_key_is_the_same_with_or_without_a_canary() -> None:
    cfg = ResponseCache(enabled=True)
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    keys = {rcache.cache_key(cfg, body, "t", u, "chat") for u in (up(None), up(10), at_revision(up(10), "canary"))}
    assert len(keys) == 1


FIELD = "oculis.upstreams.0.canary."


@pytest.mark.parametrize("canary, words", [
    ({"base_url": CANARY, "percent": 0}, [FIELD + "percent", "greater than or equal to 1", "got 0"]),
    ({"base_url": CANARY, "percent": 100}, [FIELD + "percent", "less than or equal to 99", "got 100"]),
    ({"percent": 10}, [FIELD, "required"]),  # base_url, named as the file spells it
    ({"base_url": "", "percent": 10}, [FIELD + "base_url", "at least 1 character"]),
])
def test_a_bad_canary_entry_is_refused_in_one_line_naming_the_field(canary: dict[str, object],
                                                                    words: list[str]) -> None:
    doc = {"oculis": {"upstreams": [{"name": "llama", "provider": "vllm", "base_url": STABLE, "canary": canary}],
                      "routes": []}}
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(doc))
    line = next(li for li in str(err.value).splitlines() if "canary" in li)
    assert all(w in line for w in words), line


def test_a_canary_entry_reads_from_the_router_config() -> None:
    doc = (f"oculis:\n  upstreams:\n  - {{name: llama, provider: vllm, base_url: '{STABLE}', "
           f"canary: {{base_url: '{CANARY}', percent: 10}}}}\n  routes: []\n")
    canary = parse_config(doc).upstream("llama").canary
    assert canary is not None and (canary.base_url, canary.percent) == (CANARY, 10)
