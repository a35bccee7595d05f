"""Tier choice: from a prompt's classification to the tier of a route that should answer it.

Pure: no I/O, no metrics. Tiers are tried in order and the first whose rules all hold wins; the
last tier catches everything. Low classifier confidence moves the request one tier up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oculis import Route, SemanticTier
from oculis_router.classify import Classification, ComplexityClassifier


@dataclass(frozen=True, slots=True)
class Decision:
    tier: SemanticTier
    index: int
    escalated: bool
    reason: str


def matches(tier: SemanticTier, c: Classification) -> bool:
    m = tier.match
    if m.complexity_below is not None and not c.complexity < m.complexity_below:
        return False
    return m.max_prompt_tokens is None or c.prompt_tokens <= m.max_prompt_tokens


def choose_tier(route: Route, c: Classification) -> Decision:
    index = next((i for i, t in enumerate(route.tiers) if matches(t, c)), len(route.tiers) - 1)
    esc = route.escalation
    if (esc.enabled and esc.on_low_confidence and c.confidence < esc.confidence_threshold
            and index < len(route.tiers) - 1):
        return Decision(route.tiers[index + 1], index + 1, True,
                        f"confidence {c.confidence:.2f} < {esc.confidence_threshold}: "
                        f"{route.tiers[index].name} -> {route.tiers[index + 1].name}")
    return Decision(route.tiers[index], index, False, f"matched tier {route.tiers[index].name}")


class RouteScorer:
    """Classifier plus tier choice for one route: the path both the router and `oculis route score` use."""

    def __init__(self, route: Route) -> None:
        self.route = route
        cfg = route.classifier
        self.classifier = ComplexityClassifier.packaged(cfg.model, cfg.cache_ttl_seconds, cfg.max_entries)

    def score(self, payload: dict[str, Any]) -> tuple[Classification, Decision]:
        if "messages" in payload:
            messages = payload["messages"]
            if not isinstance(messages, list):
                raise ValueError("`messages` must be a list of {role, content} objects")
            c = self.classifier.score_messages(messages)
        elif "prompt" in payload:
            prompt = payload["prompt"]
            if isinstance(prompt, list):  # the completions API accepts a list of strings
                prompt = "\n".join(str(p) for p in prompt)
            if not isinstance(prompt, str):
                raise ValueError("`prompt` must be a string")
            c = self.classifier.score_text(prompt)
        else:
            raise ValueError("expected `prompt` (string) or `messages` (list)")
        return c, choose_tier(self.route, c)
