"""The router config schema: the seed file parses; bad input names the field, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis import Classifier, ConfigError, Escalation, Route, SemanticTier, load_config, parse_config

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"


def test_seed_config_parses() -> None:
    cfg = load_config(SEED)
    route = cfg.route("adaptive")
    assert [t.name for t in route.tiers] == ["simple", "standard", "complex"]
    assert route.tiers[0].match.max_prompt_tokens == 2000
    assert route.classifier.model is None and route.classifier.cache_ttl_seconds == 3600
    assert route.escalation.confidence_threshold == 0.6
    assert route.cache.only_when.temperature_below == 0.01


def test_python_api_matches_the_file() -> None:
    route = Route(
        name="adaptive",
        strategy="semantic",
        classifier=Classifier(cache_ttl_seconds=3600),
        tiers=[
            SemanticTier(
                name="simple", match={"complexity_below": 0.35, "max_prompt_tokens": 2000}, upstream="llama-8b"
            ),
            SemanticTier(name="standard", match={"complexity_below": 0.75}, upstream="llama-70b"),
            SemanticTier(name="complex", match={}, upstream="openai-gpt4o"),
        ],
        escalation=Escalation(enabled=True, on_low_confidence=True, confidence_threshold=0.6),
    )
    seed = load_config(SEED).route("adaptive")
    assert route.tiers == seed.tiers and route.escalation == seed.escalation
    # camelCase (the CRD's spelling) is accepted too
    assert Route.model_validate({"name": "r", "tiers": [{"name": "t", "upstream": "u"}],
                                 "escalation": {"confidenceThreshold": 0.5}}).escalation.confidence_threshold == 0.5


def base(routes: str) -> str:
    return f"""oculis:
  upstreams:
    - {{name: small, provider: vllm, base_url: http://127.0.0.1:1/v1}}
  routes:
{routes}"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (base("    - {name: r, tiers: [{name: a, upstream: nope}]}"),
         "routes[0].tiers[0].upstream: 'nope' is not a declared upstream (declared: small)"),
        (base("    - {name: r, tiers: [{name: a, match: {complexity_below: 0.3}, upstream: small}]}"),
         "the last tier ('a') must catch all: give it `match: {}`"),
        (base("    - {name: r, tiers: [{name: a, upstream: small}], escalation: {confidence_threshold: 2}}"),
         "oculis.routes.0.escalation.confidence_threshold: Input should be less than or equal to 1 (got 2)"),
        (base("    - {name: r, tierz: []}"), "oculis.routes.0.tierz: unknown field; remove it or check its spelling"),
        (base("    - {name: r, tiers: [{name: a, upstream: small}, {name: a, upstream: small}]}"),
         "tier names must be unique; repeated: a"),
        (base("    - {name: r, tiers: [{name: a, upstream: small}], escalation: {on_answer: {verifier: "
              "{upstream: judge, min_score: 7}}}}"),
         "routes[0].escalation.on_answer.verifier.upstream: 'judge' is not a declared upstream (declared: small)"),
        (base("    - {name: r, tiers: [{name: a, upstream: small}], escalation: {on_answer: {buffer_streams: true}}}"),
         "on_answer checks nothing: set min_mean_logprob (e.g. -1.0), verifier {upstream, min_score}, or both"),
        (base("    - {name: r, tiers: [{name: a, upstream: small}], escalation: {on_answer: {verifier: "
              "{upstream: small, min_score: 11}}}}"),
         "oculis.routes.0.escalation.on_answer.verifier.min_score: Input should be less than or equal to 10"),
        ("oculis: [1]", "expected a mapping with a top-level `oculis:` key"),
        ("oculis: {", "not valid YAML"),
        ("oculis:\n  upstreams: [{name: x, provider: grpc}]", "oculis.upstreams.0.provider: Input should be"),
    ],
)
def test_bad_config_names_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "test.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("test.yaml")


def test_unknown_route_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown route 'x'; routes in this config: adaptive"):
        load_config(SEED).route("x")
