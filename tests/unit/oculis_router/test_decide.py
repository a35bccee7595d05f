"""Tier choice: rules in order, the last tier catches all, low confidence escalates one tier."""

from __future__ import annotations

import pytest

from oculis import Escalation, Route, SemanticTier, TierMatch
from oculis_router.classify import Classification
from oculis_router.decide import choose_tier


def route(**esc: object) -> Route:
    return Route(
        name="adaptive",
        tiers=[
            SemanticTier(name="simple", match=TierMatch(complexity_below=0.35, max_prompt_tokens=2000), upstream="s"),
            SemanticTier(name="standard", match=TierMatch(complexity_below=0.75), upstream="m"),
            SemanticTier(name="complex", upstream="l"),
        ],
        escalation=Escalation(**esc),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("complexity", "tokens", "tier"),
    [(0.1, 100, "simple"), (0.349, 2000, "simple"), (0.35, 100, "standard"), (0.1, 2001, "standard"),
     (0.74, 5000, "standard"), (0.75, 10, "complex"), (1.0, 0, "complex")],
)
def test_first_matching_tier_wins(complexity: float, tokens: int, tier: str) -> None:
    d = choose_tier(route(), Classification(complexity, 0.9, tokens))
    assert (d.tier.name, d.escalated) == (tier, False)


def test_low_confidence_escalates_one_tier_and_never_past_the_last() -> None:
    d = choose_tier(route(), Classification(0.1, 0.59, 10))
    assert (d.tier.name, d.escalated) == ("standard", True)
    assert "confidence 0.59 < 0.6" in d.reason
    d = choose_tier(route(), Classification(0.9, 0.1, 10))
    assert (d.tier.name, d.escalated) == ("complex", False)


def test_escalation_can_be_switched_off() -> None:
    assert choose_tier(route(enabled=False), Classification(0.1, 0.0, 10)).tier.name == "simple"
    assert choose_tier(route(on_low_confidence=False), Classification(0.1, 0.0, 10)).tier.name == "simple"
