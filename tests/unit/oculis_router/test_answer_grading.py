"""The verifier check's pure parts (answer_check): what a verifier is asked, how its score is read,
which tiers it grades, and what a grading adds to the limiter's dollar reservation."""

from __future__ import annotations

import pytest

from oculis import Pricing, Route, Upstream
from oculis.router import DEFAULT_RUBRIC, Verifier
from oculis_router import answer_check as answers
from oculis_router.limits import worst_cost


def reply(text: str) -> dict[str, object]:
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}


@pytest.mark.parametrize(("text", "score"), [
    ("Score: 7", 7), ("score=10", 10), ("SCORE 3/10", 3), ("I'd give it 8 out of 10.", 8), ("**Score:** 9", 9),
    ("7", 7), ("Score: 7.5", None), ("Score: 11", None), ("0", None), ("no idea", None), ("", None),
    ("The answer cites 1999; Score: 4", 4),  # the labelled score wins over an earlier number
])
def test_the_score_is_the_labelled_one_else_a_lone_number_from_1_to_10(text: str, score: int | None) -> None:
    assert answers.score_of(reply(text)) == score


def test_a_grading_request_has_the_rubric_the_conversation_and_the_answer() -> None:
    v = Verifier(upstream="judge", min_score=7)
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                      {"type": "image_url", "image_url": {"url": "data:..."}}]}]}
    req = answers.grading_request(v, body, reply("A cat."), "chat")
    assert req is not None
    assert req["messages"][0] == {"role": "system", "content": DEFAULT_RUBRIC}
    assert req["messages"][1]["content"] == ("Conversation:\nsystem: Be brief.\nuser: What is this?\n[image_url]"
                                             "\n\nAnswer to grade:\nA cat.")
    assert (req["max_tokens"], req["temperature"]) == (8, 0)
    completion = answers.grading_request(v, {"prompt": "2+2="}, {"choices": [{"text": "4"}]}, "completions")
    assert completion is not None
    assert "Conversation:\n2+2=\n\nAnswer to grade:\n4" in completion["messages"][1]["content"]


def test_an_answer_without_text_is_not_graded_and_a_long_conversation_keeps_its_end() -> None:
    v = Verifier(upstream="judge", min_score=7)
    tool_call = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}}]}
    assert answers.grading_request(v, {"messages": []}, tool_call, "chat") is None
    long = {"messages": [{"role": "user", "content": "x" * 50_000 + " the question"}]}
    text = answers.conversation_text(long, "chat")
    assert len(text) == answers.MAX_GRADED_CHARS and text.endswith("the question")


def route(enabled: bool = True, **on_answer: object) -> Route:
    return Route.model_validate({"name": "r", "escalation": {"enabled": enabled, "on_answer": on_answer}, "tiers": [
        {"name": "a", "match": {"complexity_below": 0.5}, "upstream": "cheap"},
        {"name": "b", "match": {}, "upstream": "dear"}]})


def test_the_verifier_grades_every_tier_but_the_last_and_logprobs_only_self_hosted_ones() -> None:
    hosted = Upstream(name="cheap", provider="openai", model="gpt-4o-mini", api_key_env="K")
    r = route(verifier={"upstream": "judge", "min_score": 6})
    assert answers.verifier_for(r, 0, 2) is not None and answers.verifier_for(r, 1, 2) is None
    assert answers.check_for(r, hosted, 0, 2) is None  # no min_mean_logprob: no logprob check
    assert answers.replaceable(r, hosted, 0, 2) and not answers.replaceable(r, hosted, 1, 2)
    assert answers.verifier_for(route(False, verifier={"upstream": "judge", "min_score": 6}), 0, 2) is None


def test_a_grading_is_part_of_the_worst_case_dollars() -> None:
    cheap, dear, judge = Pricing(input_per_mtok=1, output_per_mtok=1), Pricing(input_per_mtok=10, output_per_mtok=10), \
        Pricing(input_per_mtok=100, output_per_mtok=100)
    plain = worst_cost([cheap, dear], 1000, 1000, [True, False])
    graded = worst_cost([cheap, dear], 1000, 1000, [True, False], [answers.Grading("judge", judge, 100, 8), None])
    # the grading reads prompt + answer + 100 overhead tokens and writes at most 8
    assert graded - plain == pytest.approx((2100 * 100 + 8 * 100) / 1e6)
