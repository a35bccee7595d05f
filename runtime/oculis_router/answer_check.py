"""Escalation on the answer (`escalation.on_answer`): pure functions over request and response bodies.

The prompt classifier guesses before anything is generated; the answer's own token log-probabilities
say afterwards how sure the cheap model was. A self-hosted tier (vLLM and OpenAI-compatible engines
return logprobs at no extra cost) is asked for them; an answer whose mean token log-probability is
below the route's bar is replaced by the next tier's answer. Hosted providers are not asked (some
refuse the field, and their tier is usually the last anyway).
"""

from __future__ import annotations

import math
from typing import Any

from oculis.router import AnswerCheck, Route, Upstream

SELF_HOSTED = ("vllm", "openai-compatible")
STREAM_FIELDS = ("stream", "stream_options")


def check_for(route: Route | None, up: Upstream, i: int, n_tiers: int) -> AnswerCheck | None:
    """The check tier i's answer must pass, or None: no route rule, escalation off, the last tier
    (nothing to escalate to) or an upstream that is not asked for logprobs."""
    if route is None or not route.escalation.enabled or route.escalation.on_answer is None:
        return None
    if i + 1 >= n_tiers or up.provider not in SELF_HOSTED:
        return None
    return route.escalation.on_answer


def client_wants_logprobs(body: dict[str, Any]) -> bool:
    v = body.get("logprobs")
    return bool(v) or (v == 0 and not isinstance(v, bool))


def with_logprobs(body: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """The body as sent to a checked tier: logprobs asked for unless the client already did."""
    if client_wants_logprobs(body):
        return body
    return {**body, "logprobs": True if endpoint == "chat" else 1}


def unbuffered(body: dict[str, Any]) -> dict[str, Any]:
    """A streamed request as one non-streamed call (buffer_streams)."""
    return {k: v for k, v in body.items() if k not in STREAM_FIELDS}


def mean_logprob(data: dict[str, Any], endpoint: str) -> float | None:
    """Mean token log-probability of the first choice; None when the answer carries none (a tool call
    without content, an engine that ignored the field): such an answer is not judged."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    lp = choices[0].get("logprobs")
    if not isinstance(lp, dict):
        return None
    values: list[Any] = []
    if endpoint == "chat" and isinstance(content := lp.get("content"), list):
        values = [t.get("logprob") for t in content if isinstance(t, dict)]
    elif endpoint != "chat" and isinstance(tokens := lp.get("token_logprobs"), list):
        values = tokens
    nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(float(v))]
    return sum(nums) / len(nums) if nums else None


def without_logprobs(data: dict[str, Any]) -> dict[str, Any]:
    """The answer as the client asked for it: logprobs the router added are removed."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        return data
    return {**data, "choices": [{**c, "logprobs": None} if isinstance(c, dict) and "logprobs" in c else c
                                for c in choices]}
