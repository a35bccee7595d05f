"""One-line errors and honest messages of the reporting commands (QA2 #12, #13, #30): a flag given alone
names what is missing or where the other value came from; an impossible window names the flag that is
wrong; a suite value of the wrong type says the type; engines that cannot be told apart are said to be
pooled; one upstream's JSON is not printed twice; free caching is never advised off."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from oculis_cli.cache_advise import _self_hosted
from oculis_cli.main import main
from oculis_measure.cache.advise import Multipliers, Observed, advise
from oculis_measure.eval.core import SuiteLineError, parse_line
from oculis_measure.route.window import window


@pytest.mark.parametrize(("given", "missing"), [(["--write-multiplier", "1.25"], "--read-multiplier"),
                                                (["--read-multiplier", "0.1"], "--write-multiplier")])
def test_one_line_errors_a_multiplier_given_alone_names_the_other(
        given: list[str], missing: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "advise", "--no-traffic", *given]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--no-traffic needs {missing} too" in err


def test_one_line_errors_one_upstream_json_is_not_repeated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "advise", "--no-traffic", "--write-multiplier", "1.25", "--read-multiplier", "0.1",
                 "-o", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["break_even_hits"] == pytest.approx(0.2778) and "upstreams" not in rep


def test_free_caching_without_reuse_is_not_advised_off() -> None:
    rep = advise("u", Multipliers(1.0, 0.5, "pricing"), Observed(1000, 0, None), 1.0)
    assert rep["verdict"] == "no-reuse" and "turn prompt caching off" not in rep["reason"]
    assert "costs nothing" in rep["reason"]
    paid = advise("u", Multipliers(1.25, 0.1, "pricing"), Observed(1000, 0, 400), 1.0)
    assert paid["verdict"] == "does-not-pay"


def test_one_line_errors_a_future_from_without_to_names_from() -> None:
    now = datetime(2026, 12, 1, 23, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"--from 2026-12-31T23:00:00\+00:00 is in the future .* no --to was given"):
        window(None, "2026-12-31T23:00:00Z", None, now)
    with pytest.raises(ValueError, match="swap them"):
        window(None, "2026-12-01T10:00:00Z", "2026-12-01T09:00:00Z", now)


def test_one_line_errors_an_outcome_that_is_not_a_boolean_says_so() -> None:
    with pytest.raises(SuiteLineError, match=r'line 3: outcomes.small must be true or false .* not "yes"'):
        parse_line(3, json.dumps({"prompt": "hi", "outcomes": {"small": "yes"}}), offline=True)
    with pytest.raises(SuiteLineError, match="offline mode needs"):
        parse_line(3, json.dumps({"prompt": "hi"}), offline=True)


class FakeProm:
    """Engine prefix-cache counters of two engines serving one model name, by instance."""

    def __init__(self, by_instance: dict[str, tuple[float, float]]) -> None:
        self.by_instance = by_instance

    def deltas(self, selector: str, by: tuple[str, ...], start: float, end: float) -> dict[tuple[str, ...], float]:
        i = 0 if "hits" in selector else 1
        return {("m", inst, ""): v[i] for inst, v in self.by_instance.items()
                if f'instance="{inst}"' in selector or "instance=" not in selector}


def test_engines_serving_one_model_name_are_told_apart_by_instance_or_said_pooled() -> None:
    prom = FakeProm({"127.0.0.1:18100": (724.0, 1000.0), "127.0.0.1:18101": (370.0, 1000.0)})
    small = _self_hosted(prom, "small", "m", 0, 1, "127.0.0.1:18100", ["big"])
    big = _self_hosted(prom, "big", "m", 0, 1, "127.0.0.1:18101", ["small"])
    assert (small["prefix_hit_token_share"], big["prefix_hit_token_share"]) == (0.724, 0.37)
    assert "matched by instance 127.0.0.1:18100" in small["engines"]
    pooled = _self_hosted(prom, "small", "m", 0, 1, "10.0.0.9:8000", ["big"])
    assert pooled["prefix_hit_token_share"] == pytest.approx(1094 / 2000)
    assert pooled["engines"].startswith("POOLED: upstreams small, big") and "POOLED" in pooled["reason"]


def test_a_multiplier_given_alone_takes_the_other_from_pricing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from oculis import parse_config
    from oculis_cli.cache_advise import _one
    from oculis_cli.cost_sources import Catalog
    from oculis_measure.cost.core import Counters

    cfg = parse_config("oculis:\n  upstreams:\n    - {name: claude, provider: anthropic, base_url: "
                       "'https://api.anthropic.com', model: c, pricing: {input_per_mtok: 3, output_per_mtok: 15, "
                       "cached_input_per_mtok: 0.3, cache_write_per_mtok: 3.75}}\n  routes: []\n", "t")
    cat: Any = Catalog(cfg, {}, source="t")
    rep = _one(cat, "claude", None, Counters(prompt_tokens={"claude": 100}), write=2.0)
    assert (rep["write_multiplier"], rep["read_multiplier"]) == (2.0, 0.1)
    assert rep["multipliers_from"] == "--write-multiplier, the other from upstream claude's pricing"
