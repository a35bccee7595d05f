"""Token usage and its dollar cost (what `oculis_cost_dollars_total` adds up)."""

from __future__ import annotations

import pytest

from oculis import Pricing
from oculis_router.usage import Usage, cost_dollars


def test_openai_usage_with_cached_prompt_tokens() -> None:
    u = Usage.parse({"prompt_tokens": 2000, "completion_tokens": 100,
                     "prompt_tokens_details": {"cached_tokens": 1024}})
    assert u == Usage(prompt=2000, completion=100, cached=1024, cache_written=0)
    p = Pricing(input_per_mtok=2.5, output_per_mtok=10, cached_input_per_mtok=1.25)
    assert cost_dollars(p, u) == pytest.approx((976 * 2.5 + 100 * 10 + 1024 * 1.25) / 1e6)


def test_cache_writes_and_missing_prices_fall_back_to_the_input_price() -> None:
    u = Usage(prompt=3000, completion=0, cached=0, cache_written=2000)
    assert cost_dollars(Pricing(input_per_mtok=3), u) == pytest.approx(3000 * 3 / 1e6)
    assert cost_dollars(Pricing(input_per_mtok=3, cache_write_per_mtok=3.75), u) == pytest.approx(
        (1000 * 3 + 2000 * 3.75) / 1e6)


def test_no_or_empty_usage_counts_nothing() -> None:
    assert Usage.parse(None) is None and Usage.parse({}) is None
    assert cost_dollars(Pricing(), Usage(10, 10, 0, 0)) == 0.0


def test_usage_of_any_shape_counts_what_it_can_and_never_raises() -> None:
    for odd in ([1, 2], "12", 7, {"prompt_tokens": "12"}, {"prompt_tokens": -5}, {"prompt_tokens": float("nan")},
                {"prompt_tokens": [1]}, {"prompt_tokens": 3, "prompt_tokens_details": [1]},
                {"completion_tokens": True}):
        u = Usage.parse(odd)
        assert u is None or min(u.prompt, u.completion, u.cached, u.cache_written) >= 0
    assert Usage.parse({"prompt_tokens": 3, "prompt_tokens_details": "x"}) == Usage(3, 0, 0, 0)
