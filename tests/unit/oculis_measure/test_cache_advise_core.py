"""`oculis cache advise`: the break-even arithmetic h > (w - 1) / (1 - r) and the verdict from reuse."""

from __future__ import annotations

import json

import pytest

from oculis import Pricing
from oculis_cli.main import main
from oculis_measure.cache import advise as core
from oculis_measure.cache.advise import Multipliers, Observed, advise, break_even_hits, min_hits


@pytest.mark.parametrize(("w", "r", "break_even", "hits"), [
    (1.25, 0.10, 0.2778, 1),   # Anthropic 5-minute TTL
    (2.00, 0.10, 1.1111, 2),   # Anthropic 1-hour TTL
    (1.25, 0.025, 0.2564, 1),  # Fable 5.1, 5 minutes
    (2.00, 0.025, 1.0256, 2),  # Fable 5.1, 1 hour
    (1.00, 0.50, 0.0, 1),      # OpenAI before GPT-5.6: no write premium, any hit pays
    (3.00, 0.00, 2.0, 3),      # exactly on the break-even is not above it
])
def test_break_even_hits_follow_the_write_and_read_multipliers(w: float, r: float, break_even: float,
                                                               hits: int) -> None:
    be = break_even_hits(w, r)
    assert be == pytest.approx(break_even, abs=1e-4)
    assert min_hits(be) == hits
    # min_hits really is the first whole number where caching is cheaper than sending uncached
    assert (w + hits * r) / (1 + hits) < 1 and (hits == 1 or (w + (hits - 1) * r) / hits >= 1)


def test_reads_without_discount_never_pay() -> None:
    assert break_even_hits(1.25, 1.0) is None and min_hits(None) is None
    out = advise("u", Multipliers(1.25, 1.0, "flags"), Observed(1000, 900, None), 3.0)
    assert out["verdict"] == "does-not-pay" and out["break_even_hits"] is None


def test_multipliers_come_from_the_upstreams_prices() -> None:
    opus = Pricing(input_per_mtok=5.0, output_per_mtok=25.0, cached_input_per_mtok=0.5, cache_write_per_mtok=6.25)
    m = core.multipliers_from_pricing(opus, "claude")
    assert (m.write, m.read) == (1.25, 0.1)
    gpt4o = Pricing(input_per_mtok=2.5, output_per_mtok=10, cached_input_per_mtok=1.25)  # writes billed as input
    m = core.multipliers_from_pricing(gpt4o, "gpt4o")
    assert (m.write, m.read) == (1.0, 0.5)
    with pytest.raises(ValueError, match="input_per_mtok is 0"):
        core.multipliers_from_pricing(Pricing(), "free")


def test_verdict_uses_writes_when_counted_and_a_lower_bound_from_the_share_otherwise() -> None:
    m = Multipliers(2.0, 0.1, "flags")  # break-even 1.11
    # 3 reads per write: pays
    assert advise("u", m, Observed(10_000, 3_000, 1_000), 3.0)["verdict"] == "pays"
    # 1 read per write: does not
    assert advise("u", m, Observed(10_000, 1_000, 1_000), 3.0)["verdict"] == "does-not-pay"
    # no write counter, share 0.8 -> at least 4 hits per write: pays
    out = advise("u", m, Observed(10_000, 8_000, None), 3.0)
    assert out["verdict"] == "pays" and out["hits_per_write"] == 4.0 and out["cache_read_token_share"] == 0.8
    # share 0.3 -> at least 0.43: cannot tell without writes
    assert advise("u", m, Observed(10_000, 3_000, None), 3.0)["verdict"] == "undetermined"
    # dollars saved: reads at (1 - r), writes cost (w - 1) more
    assert advise("u", m, Observed(10_000, 3_000, 1_000), 3.0)["saving_dollars"] == pytest.approx(
        (3_000 * 0.9 - 1_000 * 1.0) * 3.0 / 1e6)


@pytest.mark.parametrize(("w", "r", "be", "hits"), [("1.25", "0.10", 0.2778, 1), ("2", "0.10", 1.1111, 2)])
def test_cli_json_has_break_even_and_min_hits(w: str, r: str, be: float, hits: int,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "advise", "--no-traffic", "--write-multiplier", w, "--read-multiplier", r, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["break_even_hits"] == pytest.approx(be, abs=1e-4) and out["min_hits"] == hits


def test_cli_bad_multiplier_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "advise", "--no-traffic", "--write-multiplier", "-1", "--read-multiplier", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--write-multiplier -1 is negative" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_self_hosted_prefix_cache_pays_on_any_reuse_and_reports_the_hit_token_share() -> None:
    out = core.advise_self_hosted("llama", 750, 1000)
    assert (out["break_even_hits"], out["min_hits"]) == (0.0, 1)
    assert out["prefix_hit_token_share"] == 0.75 and out["verdict"] == "pays"
    assert core.advise_self_hosted("llama", 0, 1000)["verdict"] == "no-reuse"
    assert core.advise_self_hosted("llama", None, None)["verdict"] == "no-traffic"


@pytest.mark.parametrize(("h", "ttl"), [(0.2, "none"), (0.5, "5m"), (1.5, "1h"), (None, None)])
def test_a_ttl_is_recommended_only_when_the_observed_hits_pay_for_its_write(h: float | None, ttl: str | None) -> None:
    out = core.recommend_ttl(0.1, h)  # Anthropic: break-even 0.278 (5m), 1.111 (1h)
    assert out["recommended_ttl"] == ttl and out["break_even_by_ttl"] == {"5m": 0.2778, "1h": 1.1111}

    assert core.recommend_ttl(0.1, 0.2, exact=False)["recommended_ttl"] == "undetermined"  # only a lower bound
    assert core.recommend_ttl(0.1, 0.5, exact=False)["recommended_ttl"] == "5m"


def test_cache_advise_reads_hits_per_write_from_anthropics_write_counter() -> None:
    """Anthropic reports cache writes, so hits per write is exact; elsewhere a 0 write count means
    "not reported" and the read share gives only a lower bound."""
    from oculis import RouterConfig
    from oculis_cli.cache_advise import _one
    from oculis_cli.cost_sources import Catalog
    from oculis_measure.cost.core import Counters

    cfg = RouterConfig.model_validate({"upstreams": [
        {"name": "claude", "provider": "anthropic", "model": "claude-sonnet-4", "api_key_env": "K",
         "pricing": {"input_per_mtok": 3, "output_per_mtok": 15, "cached_input_per_mtok": 0.3,
                     "cache_write_per_mtok": 3.75}},
        {"name": "gpt", "provider": "openai", "model": "gpt-4o", "api_key_env": "K",
         "pricing": {"input_per_mtok": 2.5, "output_per_mtok": 10, "cached_input_per_mtok": 1.25}}],
        "routes": [{"name": "r", "tiers": [{"name": "a", "upstream": "claude"}, {"name": "b", "upstream": "gpt"}]}]})
    c = Counters(prompt_tokens={"claude": 1000, "gpt": 1000}, cached_tokens={"claude": 500, "gpt": 500},
                 cache_write_tokens={"claude": 100, "gpt": 0})
    claude = _one(Catalog(cfg), "claude", None, c)
    assert claude["hits_per_write"] == 5.0 and claude["hits_per_write_basis"].startswith("cache-read tokens")
    gpt = _one(Catalog(cfg), "gpt", None, c)
    assert gpt["hits_per_write_basis"].startswith("lower bound")
