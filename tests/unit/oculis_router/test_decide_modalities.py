"""Multimodal prompts are routed by a rule (tiers that declare `modalities`), not scored as empty text;
tiers whose upstream cannot serve the endpoint are skipped."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from oculis import Route, SemanticTier, TierMatch, parse_config
from oculis.inferenceroute import InferenceRouteSpec
from oculis_operator import routeconfig, router_configmap
from oculis_router.classify import MEDIA_PART_TOKENS, Classification, ComplexityClassifier
from oculis_router.decide import RouteScorer, choose_tier, modalities_of

IMAGE = frozenset({"text", "image"})
TEXT = frozenset({"text"})


def route(*modalities: list[str] | None, confidence_escalation: bool = False) -> Route:
    names, ups = ("simple", "standard", "complex"), ("s", "m", "l")
    matches = (TierMatch(complexity_below=0.35), TierMatch(complexity_below=0.75), TierMatch())
    return Route(name="r", escalation={"on_low_confidence": confidence_escalation},
                 tiers=[SemanticTier(name=n, upstream=u, match=m, modalities=mod)
                        for n, u, m, mod in zip(names, ups, matches, modalities, strict=True)])


SURE_SIMPLE = Classification(0.1, 0.9, 10)
SURE_STANDARD = Classification(0.5, 0.9, 10)


@pytest.mark.parametrize(
    ("mods", "c", "needs", "tier", "order"),
    [
        # no tier declares image: today's behaviour, from the decided tier upward
        ((None, None, None), SURE_SIMPLE, IMAGE, "simple", (0, 1, 2)),
        # the first tier from the decided one upward that declares image, and only such tiers after it
        ((None, ["text", "image"], ["text", "image"]), SURE_SIMPLE, IMAGE, "standard", (1, 2)),
        ((None, None, ["text", "image"]), SURE_SIMPLE, IMAGE, "complex", (2,)),
        # none upward: the nearest below that does
        ((["text", "image"], None, None), SURE_STANDARD, IMAGE, "simple", (0,)),
        ((["text", "image"], None, ["image"]), SURE_STANDARD, IMAGE, "complex", (2, 0)),
        # text prompts ignore modalities: every tier takes text, and never go below the decided tier
        ((None, ["text", "image"], None), SURE_SIMPLE, TEXT, "simple", (0, 1, 2)),
        ((["text", "image"], None, None), SURE_STANDARD, TEXT, "standard", (1, 2)),
        # audio needs a tier that declares audio; image alone is not enough
        ((None, ["text", "image"], ["text", "audio"]), SURE_SIMPLE, frozenset({"text", "audio"}), "complex", (2,)),
    ],
)
def test_a_multimodal_prompt_goes_to_a_tier_that_declares_its_modality(
        mods: tuple[Any, ...], c: Classification, needs: frozenset[str], tier: str, order: tuple[int, ...]) -> None:
    d = choose_tier(route(*mods), c, needs)
    assert (d.tier.name, d.order, d.index) == (tier, order, order[0])


def test_low_confidence_escalation_and_modality_compose() -> None:
    d = choose_tier(route(["text", "image"], None, ["text", "image"], confidence_escalation=True),
                    Classification(0.1, 0.1, 10), IMAGE)
    assert d.escalated and d.tier.name == "complex" and d.order == (2, 0)
    assert "image: standard -> complex" in d.reason


def test_tiers_whose_upstream_cannot_serve_the_endpoint_are_skipped() -> None:
    r = route(None, None, None)
    assert choose_tier(r, SURE_SIMPLE, TEXT, skip={"s"}).order == (1, 2)
    assert choose_tier(r, SURE_SIMPLE, TEXT, skip={"m"}).order == (0, 2)
    assert choose_tier(r, SURE_STANDARD, TEXT, skip={"m", "l"}).order == ()  # none left: the caller answers 400


@pytest.mark.parametrize(
    ("content", "needs"),
    [
        ("just text", TEXT),
        ([{"type": "text", "text": "x"}], TEXT),
        ([{"type": "image_url", "image_url": {"url": "data:x"}}], IMAGE),
        ([{"type": "text", "text": "x"}, {"type": "input_audio", "input_audio": {}}], frozenset({"text", "audio"})),
        ([{"type": "image_url"}, {"type": "input_audio"}], frozenset({"text", "image", "audio"})),
        (None, TEXT),
    ],
)
def test_modalities_of_a_prompt(content: Any, needs: frozenset[str]) -> None:
    assert modalities_of({"messages": [{"role": "user", "content": content}]}) == needs


@pytest.fixture(scope="module")
def clf() -> ComplexityClassifier:
    return ComplexityClassifier.packaged()


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
        [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
        [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}],
    ],
)
def test_media_parts_are_not_scored_as_empty_text(clf: ComplexityClassifier, content: list[Any]) -> None:
    c = clf.score_messages([{"role": "user", "content": content}])
    # Before: complexity 0.0 at confidence 1.0, the cheapest tier for sure. Now the part counts as a
    # fixed token cost the classifier cannot read: low confidence, so escalation can act on it.
    assert c.prompt_tokens >= MEDIA_PART_TOKENS
    assert c.confidence < 0.6 and (c.complexity, c.confidence) != (0.0, 1.0)
    text = [p["text"] for p in content if p["type"] == "text"]
    assert c.prompt_tokens == clf.score_text(text[0] if text else "").prompt_tokens + MEDIA_PART_TOKENS


def test_route_scorer_routes_an_image_prompt_like_the_router() -> None:
    # `oculis route score` and the router share RouteScorer: the image rule applies to both.
    r = Route(name="adaptive", tiers=[
        SemanticTier(name="simple", upstream="s", match=TierMatch(complexity_below=0.35, max_prompt_tokens=2000)),
        SemanticTier(name="vision", upstream="v", match=TierMatch(complexity_below=0.999),
                     modalities=["text", "image"]),
        SemanticTier(name="complex", upstream="l")])
    scorer = RouteScorer(r)
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}]}
    assert scorer.score(image)[1].tier.name == "vision"
    assert scorer.score({"messages": [{"role": "user", "content": "hi"}]})[1].tier.name == "simple"


def test_modalities_are_validated_and_rendered_into_the_router_config() -> None:
    with pytest.raises(ValidationError, match="modalities"):
        SemanticTier(name="t", upstream="u", modalities=["video"])
    with pytest.raises(ValidationError, match="modalities"):
        SemanticTier(name="t", upstream="u", modalities=[])
    spec = {"tiers": [{"name": "small", "match": {"complexityBelow": 0.5}, "upstream": "small"},
                      {"name": "vision", "match": {}, "upstream": "small", "modalities": ["text", "image"]}]}
    assert InferenceRouteSpec.model_validate(spec).tiers[1].modalities == ["text", "image"]
    up = {"metadata": {"name": "small", "namespace": "ns", "generation": 1},
          "spec": {"provider": "vllm", "model": "m", "gpu": {"product": "H100-80GB", "count": 1}},
          "status": {"engineHash": "h", "conditions": [{"type": "Ready", "status": "True"}]}}
    out = routeconfig.render_namespace([{"metadata": {"name": "r", "namespace": "ns"}, "spec": spec}], [up])
    cfg = parse_config(out.data[router_configmap.CONFIG_KEY])
    assert [t.modalities for t in cfg.route("r").tiers] == [None, ["text", "image"]]
