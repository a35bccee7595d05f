"""Benchmark workloads: durations, profiles and the seeded request lists behind the workload fingerprint."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oculis_measure.bench.workload import (
    BUILTIN,
    PlannedRequest,
    Workload,
    arrivals,
    build,
    load_profile,
    parse_duration,
    plan,
)
from oculis_measure.inputs import InputError


@pytest.mark.parametrize(("raw", "seconds"), [("600s", 600), ("10m", 600), ("1h30m", 5400), ("500ms", 0.5),
                                              ("1.5s", 1.5), ("2d", 172800), ("1m30s500ms", 90.5), ("0s", 0)])
def test_durations_are_prometheus_style(raw: str, seconds: float) -> None:
    assert parse_duration(raw) == seconds


@pytest.mark.parametrize("raw", ["ten", "10", "", "5x", "s", "10m 5s", "-5s", "1h30", "m10"])
def test_an_unparseable_duration_names_the_flag_and_the_form(raw: str) -> None:
    with pytest.raises(InputError, match=r"--duration .* is not a duration; give a number with a unit"):
        parse_duration(raw)


def _plan(seed: int = 42, **kw: Any) -> Workload:
    args: dict[str, Any] = {"seed": seed, "route": "r", "duration_s": 20.0, "warmup_s": 2.0, "rate": 5.0,
                               "concurrency": None, "burstiness": 1.0}
    args.update(kw)
    return plan(BUILTIN["mixed"], **args)


def test_same_profile_and_seed_give_the_same_requests_and_fingerprint() -> None:
    a, b = _plan(), _plan()
    assert a.requests == b.requests and a.arrivals == b.arrivals
    assert a.dataset_hash == b.dataset_hash and a.fingerprint_hash == b.fingerprint_hash
    c = _plan(seed=7)
    assert c.dataset_hash != a.dataset_hash and c.fingerprint_hash != a.fingerprint_hash


@pytest.mark.parametrize("change", [{"route": "other"}, {"rate": 6.0}, {"duration_s": 30.0}, {"burstiness": 0.5},
                                    {"concurrency": 4, "rate": None}])
def test_the_fingerprint_covers_every_workload_changing_input(change: dict[str, Any]) -> None:
    assert _plan(**change).fingerprint_hash != _plan().fingerprint_hash


def test_shared_prefix_and_multi_turn_variants_repeat_what_a_cache_can_reuse() -> None:
    reqs = build(BUILTIN["chat"], 42, 400)
    systems = [r.messages[0]["content"] for r in reqs if r.messages[0]["role"] == "system"]
    assert 0.3 < len(systems) / len(reqs) < 0.8 and len(set(systems)) == 4  # the chat profile's groups
    by_conv: dict[int, list[PlannedRequest]] = {}
    for r in reqs:
        by_conv.setdefault(r.conversation, []).append(r)
    multi = [turns for turns in by_conv.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for earlier, later in itertools.pairwise(turns):
            # the later turn resends the earlier request, its answer, and a new user message
            assert later.messages[:len(earlier.messages)] == earlier.messages
            assert later.messages[len(earlier.messages)]["role"] == "assistant"
            assert later.turn == earlier.turn + 1
    batch = build(BUILTIN["batch"], 42, 100)  # the cold profile: nothing shared, one turn each
    assert all(len(r.messages) == 1 for r in batch)


def test_poisson_arrivals_average_the_rate_and_burstiness_below_one_clumps_them() -> None:
    poisson = np.diff(arrivals(10.0, 200.0, 1))
    bursty = np.diff(arrivals(10.0, 200.0, 1, burstiness=0.25))
    assert poisson.mean() == pytest.approx(0.1, rel=0.1)
    assert bursty.mean() == pytest.approx(0.1, rel=0.2)
    assert bursty.std() / bursty.mean() > 1.5 > poisson.std() / poisson.mean()  # CV: 2 vs 1


def test_closed_loop_plans_a_pool_without_arrival_times() -> None:
    wl = _plan(concurrency=4, rate=None)
    assert wl.arrivals is None and len(wl.requests) >= 512
    assert wl.fingerprint["load"] == {"concurrency": 4}


def test_a_profile_file_is_checked_field_by_field(tmp_path: Path) -> None:
    good = tmp_path / "p.yaml"
    good.write_text("prompt: {median: 10}\noutput: {median: 5, sigma: 0}\n")
    p = load_profile(str(good))
    assert p.name == "p" and p.output.median == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("prompt: {median: -1}\noutput: {median: 5}\n")
    with pytest.raises(InputError, match=r"--profile .*bad.yaml: prompt.median: .*greater than or equal to 1"):
        load_profile(str(bad))
    typo = tmp_path / "typo.yaml"
    typo.write_text("prompt: {median: 10}\noutput: {median: 5}\nshared_prefx: {}\n")
    with pytest.raises(InputError, match=r"shared_prefx: Extra inputs are not permitted"):
        load_profile(str(typo))
    with pytest.raises(InputError, match=r"--profile 'nope': neither a built-in profile \(chat, rag, batch, mixed\)"):
        load_profile("nope")
