"""Escalation on the answer (`escalation.on_answer`): pure functions over request and response bodies.

The prompt classifier guesses before anything is generated; afterwards the answer itself can be
judged, two ways, either or both:
- its own token log-probabilities say how sure the cheap model was. A self-hosted tier (vLLM and
  OpenAI-compatible engines return logprobs at no extra call) is asked for them; an answer whose mean
  is below the route's bar is replaced by the next tier's. Hosted providers are not asked (some refuse
  the field);
- a verifier model grades the answer against a rubric (one extra, billed call; any tier, hosted ones
  included); an answer scored below `min_score` is replaced by the next tier's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from oculis.router import AnswerCheck, Route, Verifier
from oculis.router_upstream import Pricing, Upstream
from oculis_router.content import content_text
from oculis_router.usage import Usage, cost_dollars

SELF_HOSTED = ("vllm", "openai-compatible")
# oculis_escalations_total{reason} of a replaced answer: by the logprob check, by the verifier
LOW_LOGPROB, LOW_SCORE = "low_answer_confidence", "low_answer_score"
ANSWER_REASONS = (LOW_LOGPROB, LOW_SCORE)
STREAM_FIELDS = ("stream", "stream_options")


def check_for(route: Route | None, up: Upstream, i: int, n_tiers: int) -> AnswerCheck | None:
    """The logprob check tier i's answer must pass, or None: no route rule or no min_mean_logprob,
    escalation off, the last tier (nothing to escalate to) or an upstream that is not asked for logprobs."""
    check = on_answer(route, i, n_tiers)
    if check is None or check.min_mean_logprob is None or up.provider not in SELF_HOSTED:
        return None
    return check


def verifier_for(route: Route | None, i: int, n_tiers: int) -> Verifier | None:
    """The verifier that grades tier i's answer, or None (no verifier, escalation off, the last tier)."""
    check = on_answer(route, i, n_tiers)
    return check.verifier if check is not None else None


def replaceable(route: Route | None, up: Upstream, i: int, n_tiers: int) -> bool:
    """Tier i's answer may be replaced by the next tier's (by either check)."""
    return check_for(route, up, i, n_tiers) is not None or verifier_for(route, i, n_tiers) is not None


def on_answer(route: Route | None, i: int, n_tiers: int) -> AnswerCheck | None:
    if route is None or not route.escalation.enabled or route.escalation.on_answer is None or i + 1 >= n_tiers:
        return None
    return route.escalation.on_answer


# The verifier's request: the rubric, then the conversation and the answer. A long conversation keeps
# its end (the question being answered); the cap bounds what one grading costs.
MAX_GRADED_CHARS = 24_000
GRADE_TEMPLATE = "Conversation:\n{conversation}\n\nAnswer to grade:\n{answer}"
# Extra prompt tokens a grading adds to the conversation and answer (rubric, template): for the
# limiter's dollar reservation, an upper estimate (about 3 characters a token, plus the chat template).
def grading_overhead_tokens(v: Verifier) -> int:
    return len(v.rubric) // 3 + len(GRADE_TEMPLATE) // 3 + 32


@dataclass(frozen=True)
class Grading:
    """One verifier call grading one answer, as `grading_request` makes it: at the verifier upstream's
    price, the conversation and the answer plus the rubric and template in, up to max_tokens out. The
    limiter's dollar reservation and the cascade cost (oculis route analyze, eval run) both price it
    with `cost`: one formula."""

    upstream: str
    pricing: Pricing | None  # None: the upstream is not in the config
    overhead_tokens: int  # rubric and template: grading_overhead_tokens
    max_tokens: int  # the verifier's answer, taken at its limit

    @classmethod
    def of(cls, v: Verifier, up: Upstream | None) -> Grading:
        return cls(v.upstream, up.pricing if up is not None else None, grading_overhead_tokens(v), v.max_tokens)

    def cost(self, prompt_tokens: float, output_tokens: float, count: float = 1.0) -> float:
        """Dollars for grading `count` answers with these prompt and output tokens in all."""
        if self.pricing is None:
            return 0.0
        return cost_dollars(self.pricing, Usage(round(prompt_tokens + output_tokens + self.overhead_tokens * count),
                                                round(self.max_tokens * count), 0, 0))


def conversation_text(body: dict[str, Any], endpoint: str) -> str:
    """The request as the verifier reads it: `role: text` per message, or the prompt."""
    if endpoint == "chat":
        lines = [f"{m.get('role', 'user')}: {content_text(m.get('content'), name_media=True)}"
                 for m in body.get("messages") or [] if isinstance(m, dict)]
        text = "\n".join(lines)
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else (prompt[0] if isinstance(prompt, list) and prompt
                                                       and isinstance(prompt[0], str) else "")
    return text[-MAX_GRADED_CHARS:]


def answer_text(data: dict[str, Any], endpoint: str) -> str | None:
    """The first choice's text; None when it has none to grade (a tool call without content)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    message = c.get("message") or {}
    text = content_text(message.get("content"), name_media=True) if endpoint == "chat" else c.get("text")
    return text[-MAX_GRADED_CHARS:] if isinstance(text, str) and text.strip() else None


def grading_request(v: Verifier, body: dict[str, Any], data: dict[str, Any], endpoint: str) -> dict[str, Any] | None:
    """The chat request that asks the verifier for a score, or None when the answer has no text."""
    answer = answer_text(data, endpoint)
    if answer is None:
        return None
    user = GRADE_TEMPLATE.format(conversation=conversation_text(body, endpoint), answer=answer)
    return {"messages": [{"role": "system", "content": v.rubric}, {"role": "user", "content": user}],
            "max_tokens": v.max_tokens, "temperature": 0}


_SCORE = re.compile(r"score\W{0,3}(10|[1-9])(?![0-9.])", re.I)
_NUMBER = re.compile(r"(?<![0-9.])(10|[1-9])(?![0-9.])")


def score_of(grading: dict[str, Any]) -> int | None:
    """The verifier's score, 1-10: the first "score" followed by one, else the first number 1-10 on its
    own; None when it gave neither (the answer is then kept: an unreadable grade is no evidence)."""
    text = answer_text(grading, "chat")
    if text is None:
        return None
    m = _SCORE.search(text) or _NUMBER.search(text)
    return int(m.group(1)) if m else None


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
