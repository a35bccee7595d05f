"""Config values the schema took and quietly did less with, or refused in words a user cannot act on (QA3
Part 2): `base_url` beside `endpoints` left the base_url's engine out of the rotation (#4); a repeated
endpoint (or the same one with a trailing '/') was merged into one replica (#5); a bad name quoted the
regular expression instead of the rule (#16); a tier's bad complexity was two errors, one per spelling (#17).
Each is now one line naming the field, the value and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from oculis.router import ConfigError, SemanticTier, parse_config


def config(upstream: str) -> str:
    return f"oculis:\n  upstreams:\n    - {upstream}\n  routes: []\n"


@pytest.mark.parametrize(("upstream", "words"), [
    ('{name: a, provider: vllm, model: m, base_url: "http://127.0.0.1:1/v1", endpoints: ["http://127.0.0.1:2/v1"]}',
     ["upstream 'a'", "base_url or endpoints, not both", "add it to endpoints and remove base_url",
      "http://127.0.0.1:1/v1"]),
    ('{name: a, provider: vllm, model: m, endpoints: ["http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1"]}',
     ["endpoints[1]", "'http://127.0.0.1:1/v1'", "repeats endpoints[0]", "list each replica once"]),
    ('{name: a, provider: vllm, model: m, endpoints: ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", '
     '{url: "http://127.0.0.1:1/v1/"}]}', ["endpoints[2]", "repeats endpoints[0]"]),
    ('{name: Llama_8B, provider: vllm, model: m, base_url: "http://127.0.0.1:1/v1"}',
     ["upstreams.0.name", "lowercase letters, digits and '-'", "e.g. llama-8b", "'Llama_8B'"]),
], ids=["base_url beside endpoints", "endpoint twice", "endpoint twice with a slash", "name with capitals"])
def test_a_config_that_would_lose_a_replica_or_hide_the_rule_is_one_line(upstream: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(config(upstream), "c.yaml")
    msg = str(exc.value)
    assert msg.count("oculis.upstreams.0") == 1 and all(w in msg for w in words), msg
    assert "^[a-z0-9]" not in msg  # never the regular expression


def test_distinct_endpoints_still_load_as_replicas() -> None:
    cfg = parse_config(config('{name: a, provider: vllm, model: m, '
                              'endpoints: ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]}'))
    assert [e.url for e in cfg.upstreams[0].replica_endpoints] == ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]


@pytest.mark.parametrize("kwargs", [{"complexity_below": 2}, {"match": {"complexity_below": 2}},
                                    {"max_prompt_tokens": 0}], ids=["flat", "match", "flat tokens"])
def test_a_bad_tier_rule_is_one_error_whichever_spelling(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as exc:
        SemanticTier(name="t", upstream="a", **kwargs)  # type: ignore[arg-type]
    assert exc.value.error_count() == 1, exc.value
    assert SemanticTier(name="t", upstream="a", complexity_below=0.3).complexity_below == 0.3  # still read back
