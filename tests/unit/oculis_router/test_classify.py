"""The packaged complexity classifier: range, stability, edge cases, memoisation."""

from __future__ import annotations

import time

import pytest

from oculis_router.classify import MEDIA_PART_TOKENS, ComplexityClassifier, split_messages

QUESTION = (
    "Which of the following is a consequence of the second law of thermodynamics for a heat engine "
    "operating between two reservoirs?\nA. Its efficiency can reach 100%\nB. Its efficiency is bounded "
    "by the Carnot efficiency\nC. It needs no cold reservoir\nD. Entropy of the universe decreases"
)


@pytest.fixture(scope="module")
def clf() -> ComplexityClassifier:
    return ComplexityClassifier.packaged(cache_ttl_seconds=0)


def test_scores_in_unit_range_and_stable(clf: ComplexityClassifier) -> None:
    a = clf.score_text(QUESTION)
    b = ComplexityClassifier.packaged(cache_ttl_seconds=0).score_text(QUESTION)
    assert a == b
    assert 0.0 <= a.complexity <= 1.0 and 0.0 <= a.confidence <= 1.0
    assert a.prompt_tokens > 50


def test_longer_harder_prompts_score_higher(clf: ComplexityClassifier) -> None:
    short = clf.score_text("What is 2 + 2?")
    long = clf.score_text(QUESTION * 3)
    assert long.complexity > short.complexity


def test_empty_prompt_goes_to_the_cheapest_tier_with_full_confidence(clf: ComplexityClassifier) -> None:
    for text in ("", "   \n\t"):
        c = clf.score_text(text)
        assert (c.complexity, c.confidence) == (0.0, 1.0)


def test_very_long_prompt_is_bounded_and_its_length_still_counts(clf: ComplexityClassifier) -> None:
    text = QUESTION * 400  # ~100k characters, far beyond any encoder window
    c = clf.score_text(text)
    assert 0.0 <= c.complexity <= 1.0
    assert c.prompt_tokens > 20_000  # estimated from the cut, not capped at it
    start = time.perf_counter()
    clf.score_text(text + " ")
    assert time.perf_counter() - start < 1.0  # bounded work: a sanity guard, not a benchmark


def test_non_english_and_unknown_text(clf: ComplexityClassifier) -> None:
    for text in ("Explique la différence entre une fonction injective et surjective.",
                 "量子コンピュータの誤り訂正について詳しく説明してください",
                 "🙂🙃🤖" * 20):
        c = clf.score_text(text)
        assert 0.0 <= c.complexity <= 1.0 and 0.0 <= c.confidence <= 1.0
    # Text the tokenizer cannot read at all gives no confidence, so escalation can act on it.
    assert clf.score_text("\U0001f9ff\U0001fa90" * 30).confidence < 0.6


def test_multi_turn_scores_last_user_turn_with_bounded_context(clf: ComplexityClassifier) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {}}]},
    ]
    text, context = split_messages(messages)
    assert text == QUESTION and "You are terse." in context and "Hi! How can I help?" in context
    c = clf.score_messages(messages)
    # The image is not empty text: it counts as a fixed token cost the classifier cannot read.
    text_only = clf.score_text(QUESTION, context)
    assert c.prompt_tokens == text_only.prompt_tokens + MEDIA_PART_TOKENS and c.confidence < text_only.confidence
    # A huge earlier conversation changes the token count but cannot swamp the last turn's score.
    huge = [{"role": "user", "content": "blah " * 50_000}, *messages]
    h = clf.score_messages(huge)
    assert h.prompt_tokens > 40_000
    assert abs(h.complexity - c.complexity) < 0.5
    assert split_messages([]) == ("", "")


def test_scores_are_memoised_for_the_ttl() -> None:
    clf = ComplexityClassifier.packaged(cache_ttl_seconds=3600)
    first = clf.score_text(QUESTION)
    assert clf.score_text(QUESTION) is first
    assert ComplexityClassifier.packaged(cache_ttl_seconds=0).score_text(QUESTION) is not first


def test_unknown_model_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"unknown classifier .*; known: oculis/router-small-v2.*leave it empty "
                                         r"for the packaged default"):
        ComplexityClassifier.packaged("gpt-classifier-9000")
