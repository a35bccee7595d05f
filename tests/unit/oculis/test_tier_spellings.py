"""A tier's rules flat (`SemanticTier(name=..., complexity_below=0.35)`, as the docs write them) or under
`match`: the same object and the same YAML either way; both at once is refused naming the conflict."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from oculis import ConfigError, Route, RouterConfig, SemanticTier, TierMatch, Upstream, parse_config
from oculis.inferenceroute import InferenceRouteSpec

UP = [Upstream(name="a", provider="vllm", base_url="http://127.0.0.1:9/v1", model="m")]


def test_flat_and_match_spellings_are_the_same_tier() -> None:
    flat = SemanticTier(name="simple", complexity_below=0.35, max_prompt_tokens=2000, upstream="a")
    nested = SemanticTier(name="simple", match={"complexity_below": 0.35, "max_prompt_tokens": 2000}, upstream="a")
    typed = SemanticTier(name="simple", match=TierMatch(complexity_below=0.35, max_prompt_tokens=2000), upstream="a")
    assert flat == nested == typed
    assert flat.match.complexity_below == flat.complexity_below == nested.complexity_below == 0.35
    assert nested.max_prompt_tokens == 2000
    # No rule at all is "everything else", spelled either way.
    assert SemanticTier(name="rest", upstream="a") == SemanticTier(name="rest", match={}, upstream="a")


def test_both_spellings_serialise_to_the_same_yaml_and_round_trip() -> None:
    def config(*tiers: SemanticTier) -> RouterConfig:
        return RouterConfig(upstreams=UP, routes=[Route(name="r", tiers=list(tiers))])

    flat = config(SemanticTier(name="s", complexity_below=0.4, upstream="a"), SemanticTier(name="c", upstream="a"))
    nested = config(SemanticTier(name="s", match={"complexity_below": 0.4}, upstream="a"),
                    SemanticTier(name="c", match={}, upstream="a"))
    assert flat.to_yaml() == nested.to_yaml()
    tiers = yaml.safe_load(flat.to_yaml())["oculis"]["routes"][0]["tiers"]
    assert tiers == [{"name": "s", "match": {"complexity_below": 0.4}, "upstream": "a"},
                     {"name": "c", "match": {}, "upstream": "a"}]
    assert parse_config(flat.to_yaml()) == flat == nested


def test_the_flat_spelling_loads_from_yaml_and_in_the_crd() -> None:
    text = ("oculis:\n  upstreams: [{name: a, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}]\n"
            "  routes: [{name: r, tiers: [{name: s, complexity_below: 0.3, upstream: a}, {name: c, upstream: a}]}]\n")
    assert parse_config(text).route("r").tiers[0].match.complexity_below == 0.3
    spec = InferenceRouteSpec.model_validate({"tiers": [{"name": "s", "complexityBelow": 0.3, "upstream": "a"},
                                                        {"name": "c", "upstream": "a"}]})
    assert spec.tiers[0].match.complexity_below == 0.3
    dumped = spec.model_dump(by_alias=True, exclude_none=True)["tiers"][0]
    assert dumped["match"] == {"complexityBelow": 0.3} and "complexityBelow" not in dumped


def test_giving_both_spellings_is_refused_naming_the_conflict() -> None:
    with pytest.raises(ValidationError, match=r"tier 'simple' gives complexity_below flat and also `match`"):
        SemanticTier(name="simple", complexity_below=0.35, match={"max_prompt_tokens": 10}, upstream="a")
    text = ("oculis:\n  upstreams: [{name: a, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}]\n"
            "  routes: [{name: r, tiers: [{name: s, max_prompt_tokens: 9, match: {}, upstream: a}, "
            "{name: c, upstream: a}]}]\n")
    with pytest.raises(ConfigError, match=r"oculis\.routes\.0\.tiers\.0: tier 's' gives max_prompt_tokens flat"):
        parse_config(text)


def test_a_flat_rule_on_the_last_tier_or_out_of_range_is_refused() -> None:
    with pytest.raises(ValidationError, match="must catch all"):
        Route(name="r", tiers=[SemanticTier(name="only", complexity_below=0.5, upstream="a")])
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        SemanticTier(name="s", complexity_below=1.5, upstream="a")
    with pytest.raises(ValueError, match=r"spec.tiers\[1\] \('b'\) can never be reached"):
        InferenceRouteSpec.model_validate({"tiers": [{"name": "a", "complexityBelow": 0.5, "upstream": "x"},
                                                     {"name": "b", "complexityBelow": 0.4, "upstream": "x"},
                                                     {"name": "c", "upstream": "x"}]})


def test_the_operator_renders_a_flat_spelled_route_with_match_and_the_one_classifier_name() -> None:
    from oculis_operator.routeconfig import render_namespace

    ready = {"conditions": [{"type": "Ready", "status": "True"}], "engineHash": "h", "readyReplicas": 1}
    route = {"apiVersion": "oculis.dev/v1alpha1", "kind": "InferenceRoute",
             "metadata": {"name": "adaptive", "namespace": "ns", "generation": 1},
             "spec": {"classifier": {"model": "oculis-minilm-static-v1"},
                      "tiers": [{"name": "simple", "complexityBelow": 0.35, "maxPromptTokens": 2000, "upstream": "a"},
                                {"name": "complex", "upstream": "b"}]}}
    ups = [{"apiVersion": "oculis.dev/v1alpha1", "kind": "GPUUpstream", "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct",
                     "gpu": {"product": "H100-80GB", "count": 1}}, "status": ready},
           {"apiVersion": "oculis.dev/v1alpha1", "kind": "GPUUpstream", "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"provider": "openai", "model": "gpt-4o"}, "status": ready}]
    text = render_namespace([route], ups).data["oculis-config.yaml"]
    tiers = yaml.safe_load(text)["oculis"]["routes"][0]["tiers"]
    assert tiers[0]["match"] == {"complexity_below": 0.35, "max_prompt_tokens": 2000} and tiers[1]["match"] == {}
    assert parse_config(text).route("adaptive").classifier.model == "oculis/router-small-v2"
