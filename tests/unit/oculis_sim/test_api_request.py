"""The simulator's request checks refuse as vLLM 0.32 does, in its order; logprob values are plausible."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oculis_sim import logprobs
from oculis_sim.api_request import ApiError, parse

SERVED = ("tiny", "alias")
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def refusal(body: dict[str, object], chat: bool = True, limit: int = 64) -> dict[str, object]:
    with pytest.raises(ApiError) as exc:
        parse(body, chat, SERVED, limit)
    return {"status": exc.value.status, **exc.value.body()["error"]}


def test_api_shapes_errors_name_the_parameter_in_vllms_words() -> None:
    assert refusal({**CHAT, "model": "x"}) == {
        "status": 404, "message": "The model `x` does not exist. Valid aliases: tiny, alias.", "type": "NotFoundError",
        "param": "model", "code": 404}
    assert refusal({**CHAT, "temperature": 2.5})["message"] == (
        "temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)")
    assert refusal({**CHAT, "top_p": 0})["param"] == "top_p"
    assert refusal({**CHAT, "max_tokens": 0})["message"] == "max_tokens must be at least 1, got 0. " \
        "(parameter=max_tokens, value=0)"
    assert refusal({**CHAT, "max_completion_tokens": 65})["message"].startswith(  # type: ignore[union-attr]
        "max_completion_tokens=65 cannot be greater than max_model_len=64.")
    assert refusal({**CHAT, "n": 2, "temperature": 0}) == {
        "status": 400, "message": "n must be 1 when using greedy sampling, got 2.", "type": "BadRequestError",
        "param": None, "code": 400}
    assert refusal({**CHAT, "top_logprobs": 2})["param"] == "top_logprobs"
    assert refusal({**CHAT, "stream_options": {"include_usage": True}})["param"] == "stream_options"
    assert refusal({"prompt": [1] * 70}, chat=False)["message"].startswith(  # type: ignore[union-attr]
        "This model's maximum context length is 64 tokens. However, your prompt contains 70 input tokens")
    assert refusal({"model": "tiny"})["type"] == "Bad Request"  # the schema's: messages missing


def test_api_shapes_the_context_cuts_max_tokens_and_names_answer_with_the_first_alias() -> None:
    gen = parse({"prompt": "a b c", "max_tokens": 63, "model": "alias"}, False, SERVED, 64)
    assert gen.prompts[0].max_tokens == 61 and gen.n_prompt == 3
    assert parse({"prompt": "a"}, False, SERVED, 64).prompts[0].max_tokens == 16  # vLLM's completions default
    assert parse(CHAT, True, SERVED, 64).prompts[0].max_tokens is None  # chat: the answer stops by itself
    batch = parse({"prompt": ["a b", [1, 2, 3, 4]], "max_tokens": 61}, False, SERVED, 64)  # vLLM batches prompts
    assert [(p.n, p.max_tokens) for p in batch.prompts] == [(2, 61), (4, 60)] and batch.n_prompt == 6


@given(mean=st.floats(-6, -0.05), n=st.integers(1, 60), top=st.integers(0, 5), seed=st.integers(0, 2**31))
def test_api_shapes_modelled_logprobs_are_plausible_and_deterministic(mean: float, n: int, top: int,
                                                                      seed: int) -> None:
    toks = ["a"] + [" b"] * (n - 1)
    items = logprobs.draw(toks, mean, (seed,), top)
    assert items == logprobs.draw(toks, mean, (seed,), top)
    for t in items:
        assert t.logprob <= 0 and t.top[0] == (t.token, t.logprob)
        assert sum(math.exp(lp) for _, lp in t.top) <= 1 + 1e-9
        assert len({tok for tok, _ in t.top}) == len(t.top)
    shaped = logprobs.completion_logprobs(items, top, 5)
    assert shaped["text_offset"][0] == 5 and len(shaped["top_logprobs"][0]) == top + 1
