"""The kind guard in front of the complexity head: prompts of a kind the head has no evidence for (open-ended
chat, kinds it never saw) get a coin (a digest of the prompt, uniform in [0, 1]), so a route on them is as
good as a random split at every strong-call share, never the below-random ranking the head gave chat."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from oculis_router import classify
from oculis_router import head_fit as hf


@pytest.fixture(scope="module")
def packaged() -> classify.Head:
    return classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head


def test_coin_is_fixed_per_prompt_and_uniform_over_prompts() -> None:
    assert classify.coin("hello there") == classify.coin("hello there")
    assert classify.coin("hello there") != classify.coin("hello there!")
    values = np.array([classify.coin(f"prompt number {i}") for i in range(4000)])
    assert values.min() >= 0 and values.max() < 1
    counts, _ = np.histogram(values, bins=10, range=(0, 1))
    assert counts.min() > 320 and counts.max() < 480  # 400 expected per bin


def test_coin_routes_like_a_random_split_in_expectation() -> None:
    rng = np.random.default_rng(0)
    got = []
    for trial in range(60):
        weak = (rng.random(300) < 0.6).astype(float)
        strong = (rng.random(300) < 0.8).astype(float)
        score = np.array([classify.coin(f"t{trial} p{i}") for i in range(300)])
        got.append(hf.apgr(score, weak, strong))
    assert abs(float(np.nanmean(got)) - 0.5) < 0.03


def test_a_prompt_outside_the_evidence_gets_the_coin_and_one_inside_the_head(packaged: classify.Head) -> None:
    vocab = packaged.token_weights.shape[1]
    text = "Write a friendly note to my neighbour about the party on Saturday"
    outside = classify.ComplexityClassifier(dataclasses.replace(
        packaged, guard_weights=np.full(vocab, -1.0, np.float32), guard_bias=0.0), cache_ttl_seconds=0)
    inside = classify.ComplexityClassifier(dataclasses.replace(
        packaged, guard_weights=np.full(vocab, 1.0, np.float32), guard_bias=0.0), cache_ttl_seconds=0)
    unguarded = classify.ComplexityClassifier(dataclasses.replace(packaged, guard_weights=None), cache_ttl_seconds=0)
    assert outside.score_text(text).complexity == round(classify.coin(text), 4)
    assert inside.score_text(text).complexity == unguarded.score_text(text).complexity
    assert outside.score_text("").complexity == 0.0  # an empty prompt is still the cheapest tier


def test_the_packaged_guard_knows_multiple_choice_and_word_problems_not_chat(packaged: classify.Head) -> None:
    assert packaged.guard_weights is not None
    mmlu = ("What is true for a type-Ia supernova?\nA. This type occurs in binary systems.\nB. This type occurs "
            "in young galaxies.\nC. This type produces gamma-ray bursts.\nD. This type produces high amounts of "
            "X-rays.\nAnswer:")
    gsm8k = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
             "many clips did Natalia sell altogether in April and May?")
    chat = ["Write a short poem about autumn leaves for my daughter's birthday card.",
            "Can you help me plan a three-day trip to Lisbon with kids?",
            "I'm feeling stuck in my career. What should I do?"]
    assert packaged.in_evidence(classify.prompt_pieces(mmlu).ids)
    assert packaged.in_evidence(classify.prompt_pieces(gsm8k).ids)
    assert not any(packaged.in_evidence(classify.prompt_pieces(c).ids) for c in chat)


def test_a_head_without_a_guard_loads_and_scores_as_before(packaged: classify.Head, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "h.npz"
    hf.save_head(dataclasses.replace(packaged, guard_weights=None), path)
    head = classify.load_head_file(path)
    assert head.guard_weights is None and head.in_evidence(np.array([1, 2, 3]))
