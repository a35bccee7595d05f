"""Tier choice: from a prompt's classification to the tier of a route that should answer it.

Pure: no I/O, no metrics. Tiers are tried in order and the first whose rules all hold wins; the
last tier catches everything. Low classifier confidence moves the request one tier up.

A prompt with image (or audio) parts goes to a tier that declares that modality (`modalities`):
the first from the decided tier upward, else the nearest below; escalation on upstream errors only
tries such tiers too. When no tier of the route declares it, the tiers are tried as for text.
Tiers whose upstream cannot serve the endpoint at all (`skip`: Anthropic for /v1/completions) are
left out of the order the same way.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oculis import Route, SemanticTier
from oculis_router.classify import Classification, ComplexityClassifier

# The modality an OpenAI content part needs from the model.
PART_MODALITY = {"image_url": "image", "input_audio": "audio"}
TEXT = frozenset({"text"})


@dataclass(frozen=True, slots=True)
class Decision:
    tier: SemanticTier
    index: int
    escalated: bool
    reason: str
    order: tuple[int, ...] = ()  # tier indices to try, `index` first; empty: no tier can take the request


def matches(tier: SemanticTier, c: Classification) -> bool:
    m = tier.match
    if m.complexity_below is not None and not c.complexity < m.complexity_below:
        return False
    return m.max_prompt_tokens is None or c.prompt_tokens <= m.max_prompt_tokens


def modalities_of(payload: dict[str, Any]) -> frozenset[str]:
    """What a request's prompt holds: text, plus image or audio for such content parts."""
    needs = set(TEXT)
    for m in payload.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            needs.update(PART_MODALITY[p["type"]] for p in content
                         if isinstance(p, dict) and p.get("type") in PART_MODALITY)
    return frozenset(needs)


def takes(tier: SemanticTier, needs: frozenset[str]) -> bool:
    return needs - TEXT <= set(tier.modalities or ())  # every tier takes text, declared or not


def tier_order(route: Route, start: int, needs: frozenset[str], skip: Collection[str]) -> tuple[int, ...]:
    """Tiers to try: from `start` upward, then downward, keeping those that take `needs` when any tier
    of the route does, and never one whose upstream is in `skip`."""
    n = len(route.tiers)
    able = [i for i in range(n) if takes(route.tiers[i], needs)] or list(range(n))
    up = [i for i in able if i >= start]
    # Below the decided tier only for a modality: text prompts keep today's "never downward".
    down = [i for i in reversed(able) if i < start] if needs != TEXT else []
    return tuple(i for i in up + down if route.tiers[i].upstream not in skip)


def choose_tier(route: Route, c: Classification, needs: frozenset[str] = TEXT,
                skip: Collection[str] = ()) -> Decision:
    index = next((i for i, t in enumerate(route.tiers) if matches(t, c)), len(route.tiers) - 1)
    esc = route.escalation
    escalated = False
    reason = f"matched tier {route.tiers[index].name}"
    if (esc.enabled and esc.on_low_confidence and c.confidence < esc.confidence_threshold
            and index < len(route.tiers) - 1):
        escalated = True
        reason = (f"confidence {c.confidence:.2f} < {esc.confidence_threshold}: "
                  f"{route.tiers[index].name} -> {route.tiers[index + 1].name}")
        index += 1
    order = tier_order(route, index, needs, skip)
    if order and order[0] != index:
        why = "+".join(sorted(needs - TEXT)) or "the endpoint"
        reason += f"; {why}: {route.tiers[index].name} -> {route.tiers[order[0]].name}"
    chosen = order[0] if order else index
    return Decision(route.tiers[chosen], chosen, escalated, reason, order)


def head_file(head_path: str, config_dir: Path | None = None) -> Path:
    p = Path(head_path).expanduser()
    return p if p.is_absolute() or config_dir is None else config_dir / p


class RouteScorer:
    """Classifier plus tier choice for one route: the path both the router and `oculis route score` use."""

    def __init__(self, route: Route, config_dir: Path | None = None) -> None:
        """`config_dir`: where a relative `classifier.head_path` is looked up (the config file's folder)."""
        self.route = route
        cfg = route.classifier
        if cfg.head_path:
            self.head_file: Path | None = head_file(cfg.head_path, config_dir)
            self.classifier = ComplexityClassifier.from_file(self.head_file, cfg.cache_ttl_seconds, cfg.max_entries)
        else:
            self.head_file = None
            self.classifier = ComplexityClassifier.packaged(cfg.model, cfg.cache_ttl_seconds, cfg.max_entries)

    def score(self, payload: dict[str, Any], skip: Collection[str] = ()) -> tuple[Classification, Decision]:
        """`skip`: upstreams that cannot serve this request's endpoint."""
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
        return c, choose_tier(self.route, c, modalities_of(payload), skip)


@dataclass(frozen=True, slots=True)
class ColdStart:
    """What a request does about tiers whose upstream is scaled to zero (route `cold_start`)."""

    action: str  # "none" (first tier serves), "escalated", "wait", "fail"
    order: tuple[int, ...]  # positions in the planned tier list to try, in order


def cold_start(scaled_to_zero: list[bool], mode: str) -> ColdStart:
    """`scaled_to_zero[i]`: the i-th planned tier's upstream has no replica. escalate: the tiers that
    serve, in order (a later tier at zero would only fail its connection); with none left it waits,
    since answering nothing at once helps nobody. wait/fail: about the first tier only."""
    every = tuple(range(len(scaled_to_zero)))
    if not scaled_to_zero or not scaled_to_zero[0]:
        return ColdStart("none", tuple(i for i in every if not scaled_to_zero[i]) or every)
    if mode == "escalate":
        serving = tuple(i for i in every if not scaled_to_zero[i])
        return ColdStart("escalated", serving) if serving else ColdStart("wait", every)
    return ColdStart("fail" if mode == "fail" else "wait", every)
