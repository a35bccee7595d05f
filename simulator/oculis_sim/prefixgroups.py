"""Prefix groups as the endpoint-picking issue spells them, and conversations that continue.

    prefix_groups: {count: 150, tokens: 6000, users_per_group: 5, multi_turn: false}

is `prefix_groups: 150` with `shared_prefix_tokens: 6000` and `prompts_per_group: 5`: each request draws a
group (its `tokens`-token system prompt) and, with users, one of the group's users, whose question is
fixed (drawn once from `prompt_tokens`), so a user's requests repeat whole prompts, as in llm-d's
shared-prefix benchmarks (150 groups x 5 users, 6,000-token prefix). With `multi_turn: true` each request
of a user continues that user's conversation: its prompt is the prefix, every earlier question and answer
of that user, then a new question (drawn per request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class PrefixGroupError(ValueError):
    pass


@dataclass(frozen=True)
class PrefixGroups:
    count: int
    tokens: int
    users_per_group: int | None
    multi_turn: bool


def parse(value: Any) -> PrefixGroups:
    where = "prefix_groups"
    unknown = sorted(set(value) - {"count", "tokens", "users_per_group", "multi_turn"})
    if unknown:
        raise PrefixGroupError(f"{where}.{unknown[0]}: unknown key; use count, tokens, users_per_group, multi_turn")

    def integer(key: str, lo: int) -> int:
        v = value.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise PrefixGroupError(f"{where}.{key}: {v!r} must be an integer >= {lo}")
        return v

    users = integer("users_per_group", 1) if value.get("users_per_group") is not None else None
    multi = value.get("multi_turn", False)
    if not isinstance(multi, bool):
        raise PrefixGroupError(f"{where}.multi_turn: {multi!r} must be true or false")
    if multi and users is None:
        raise PrefixGroupError(f"{where}.multi_turn: needs users_per_group (whose conversations continue)")
    return PrefixGroups(integer("count", 1), integer("tokens", 0), users, multi)


def conversations(prefix: int, users: np.ndarray, questions: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Whole prompts of multi-turn traffic: `users` names each request's conversation (in arrival order)."""
    history: dict[int, int] = {}
    prompts = np.empty(len(users), dtype=np.int64)
    for i, (u, q, o) in enumerate(zip(users.tolist(), questions.tolist(), outputs.tolist(), strict=True)):
        before = history.get(u, 0)
        prompts[i] = prefix + before + q
        history[u] = before + q + o
    return prompts
