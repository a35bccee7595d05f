"""LoRA adapters in the schema: GPUUpstream.spec.adapters, engine maxLoras/maxLoraRank, a tier's adapter."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from oculis import crdgen
from oculis.adapters import Adapter
from oculis.base import format_errors
from oculis.router import ConfigError, parse_config
from oculis.upstream import GPUUpstreamSpec


def spec(**extra: Any) -> dict[str, Any]:
    return {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct",
            "gpu": {"product": "H100-80GB", "count": 1}, **extra}


def refusal(body: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as exc:
        GPUUpstreamSpec.model_validate(body)
    text = format_errors(exc.value, "spec")
    assert "\n" not in text  # one line
    return text


def test_sources_are_a_tagged_union_rendered_as_module_paths() -> None:
    got = GPUUpstreamSpec.model_validate(spec(
        engine={"maxLoras": 4, "maxLoraRank": 64},
        adapters=[{"name": "sql", "source": {"huggingFace": "org/sql-lora"}, "rank": 64},
                  {"name": "support", "source": {"path": "/models/support"}},
                  {"name": "style", "source": {"pvc": {"name": "adapters", "subPath": "style/v2"}}},
                  {"name": "tiny", "source": {"configMap": {"name": "tiny-lora"}}}]))
    assert got.engine is not None and got.engine.max_loras == 4 and got.engine.max_lora_rank == 64
    assert [a.module_path() for a in got.adapters or []] == [
        "org/sql-lora", "/models/support", "/adapters/style/style/v2", "/adapters/tiny"]


def test_a_source_names_exactly_one_place() -> None:
    assert "exactly one of huggingFace, path, pvc or configMap (got huggingFace, path)" in refusal(spec(
        adapters=[{"name": "a", "source": {"huggingFace": "o/a", "path": "/a"}}]))
    with pytest.raises(ValidationError, match="got none"):
        Adapter.model_validate({"name": "a", "source": {}})


def test_duplicate_names_and_ranks_above_the_cap_are_refused_with_the_fix() -> None:
    dup = refusal(spec(adapters=[{"name": "sql", "source": {"path": "/a"}}, {"name": "sql", "source": {"path": "/b"}}]))
    assert "spec.adapters: names must be unique, 'sql' is repeated" in dup
    # vLLM's default --max-lora-rank is 16
    rank = refusal(spec(adapters=[{"name": "sql", "source": {"path": "/a"}, "rank": 32}]))
    assert "spec.adapters[0].rank: 32 ('sql') is above engine.maxLoraRank 16" in rank
    assert "32, 64, 128, 256, 320, 512" in rank
    assert GPUUpstreamSpec.model_validate(spec(engine={"maxLoraRank": 32},
                                               adapters=[{"name": "sql", "source": {"path": "/a"}, "rank": 32}]))


def test_vllm_rank_choices_and_external_providers() -> None:
    assert "maxLoraRank" in refusal(spec(engine={"maxLoraRank": 24}))  # vLLM's parser takes only its choices
    text = refusal({"provider": "openai", "model": "gpt-4o", "adapters": [{"name": "a", "source": {"path": "/a"}}]})
    assert "spec.adapters apply only to provider vllm" in text


@pytest.mark.parametrize(("name", "said"), [
    ("llama/sql", "an adapter name has no '/': requests name an adapter as <route or upstream>/<adapter>, so write "
                  "the part after the '/'"),
    ("SQL lora", "not an adapter name: use lowercase letters, digits, '-', '_' and '.'"),
])
def test_a_bad_adapter_name_is_refused_with_the_rule_wherever_it_is_named(name: str, said: str) -> None:
    # QA3 Q25: pydantic's own message only quoted the regular expression.
    text = refusal(spec(adapters=[{"name": name, "source": {"path": "/a"}}]))
    assert text.startswith(f"spec.adapters.0.name: {said}") and f"(got {name!r})" in text
    for config in (CONFIG.replace("[sql, support]", f"[sql, {json.dumps(name)}]") % "sql",
                   CONFIG % json.dumps(name)):
        with pytest.raises(ConfigError) as exc:
            parse_config(config)
        assert said in str(exc.value)


def test_the_crd_carries_the_same_rules() -> None:
    text = str(crdgen.gpuupstream_crd())
    for needle in ("exists_one(b, b.name == a.name)", "self.engine.maxLoraRank", "filter(x, x).size() == 1",
                   "maxLoras", "huggingFace"):
        assert needle in text
    assert "'adapter'" in str(crdgen.inferenceroute_crd())


CONFIG = """
oculis:
  upstreams:
    - {name: llama-8b, provider: vllm, base_url: "http://127.0.0.1:1/v1", adapters: [sql, support]}
  routes:
    - name: chat
      tiers:
        - {name: sql, upstream: llama-8b, adapter: %s}
"""


def test_a_tier_may_name_only_an_adapter_its_upstream_declares() -> None:
    cfg = parse_config(CONFIG % "sql")
    assert cfg.routes[0].tiers[0].adapter == "sql"
    with pytest.raises(ConfigError) as exc:
        parse_config(CONFIG % "billing")
    assert ("routes[0].tiers[0].adapter: adapter 'billing' is not declared by upstream 'llama-8b' (its adapters: "
            "sql, support)") in str(exc.value)


def test_runtime_loading_with_several_api_servers_is_refused_as_vllm_would() -> None:
    adapters = [{"name": "sql", "source": {"path": "/a"}}]
    msg = refusal(spec(adapters=adapters, engine={"extraArgs": ["--api-server-count=2"]}))
    assert "2 API servers" in msg and "runtimeLoraUpdating: false" in msg
    assert "4 API servers" in refusal(spec(adapters=adapters, engine={"extraArgs": ["-dp", "4"]}))
    for ok in (["--api-server-count", "1", "-dp", "4"], ["--max-cpu-loras=4"]):
        GPUUpstreamSpec.model_validate(spec(adapters=adapters, engine={"extraArgs": ok}))
    GPUUpstreamSpec.model_validate(spec(adapters=adapters, engine={"runtimeLoraUpdating": False,
                                                                   "extraArgs": ["--api-server-count=2"]}))
    assert GPUUpstreamSpec.model_validate(spec(engine={"maxLoras": 2})).lora_enabled
    assert not GPUUpstreamSpec.model_validate(spec()).lora_enabled
