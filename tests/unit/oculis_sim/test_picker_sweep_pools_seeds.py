"""The picker sweep (bench/picker_sweep.py) pools each cell's workload seeds and judges least-loaded against
round-robin on the seeds' spread, not on one run's tail: a bursty cell's p99 is one burst's last requests,
and one seed's ratio moved 0.85-1.34 with the seed where the pooled ratio was 0.98 (issue 30)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from oculis_sim import config, fleet, workload
from oculis_sim.replay import stats_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import picker_sweep as ps

CELL = ps.Cell(2, 0.6, 0, 50, "bursty", "single")


def result(ll: dict[str, list[float]], rr: dict[str, list[float]]) -> dict[str, object]:
    """A cell's result as run_cell writes it, from per-seed p90/p99 (ms) of least-loaded and round-robin."""
    seeds = {"least-loaded": ll, "round-robin": rr, "random": {q: [2 * x for x in v] for q, v in rr.items()},
             "prefix": rr, "kv-events": rr}
    pooled = {n: {q: float(np.mean(v)) for q, v in s.items()} for n, s in seeds.items()}
    out: dict[str, object] = {"cell": CELL.__dict__, "seeds": [1, 2, 3], "ttft_ms": pooled, "seed_ttft_ms": seeds}
    for q in ("p90", "p99"):
        out[f"ratio_{q}"] = {n: pooled[n][q] / pooled["round-robin"][q] for n in pooled}
    return out


def test_fleet_reports_each_requests_ttft_by_its_index() -> None:
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", max_num_seqs=32)
    wl = workload.parse({"prompt_tokens": 300, "output_tokens": 20, "stages": [{"rate": 40, "requests": 80}],
                         "seed": 2})
    res = fleet.run(s, wl, 2, "least-loaded")
    assert res.ttft_s is not None and len(res.ttft_s) == len(wl)
    assert not np.isnan(res.ttft_s).any() and (res.ttft_s > 0).all()
    assert stats_ms(res.ttft_s) == res.summary["ttft_ms"]  # the same samples as the summary's


def test_one_seed_has_no_interval_and_spread_seeds_give_one_around_their_geometric_mean() -> None:
    assert ps.interval([1.2]) == pytest.approx((1.2, 1.2, 1.2))
    mean, lo, hi = ps.interval([0.9, 1.0, 1.2, 1.1])
    assert mean == pytest.approx(math.exp(np.mean(np.log([0.9, 1.0, 1.2, 1.1]))))
    assert lo < 1.0 < hi and lo < mean < hi
    assert ps.interval([1.1, 1.1, 1.1])[1] == pytest.approx(1.1)  # no spread: the interval is the ratio


def test_a_cell_worse_on_one_seed_only_is_noise_and_one_worse_on_every_seed_is_a_miss() -> None:
    noisy = result({"p90": [110.0, 90.0, 101.0], "p99": [134.0, 88.0, 95.0]},
                   {"p90": [100.0, 100.0, 100.0], "p99": [100.0, 100.0, 100.0]})
    lines = ps.goals([noisy])
    assert "(interval wholly above 1): 0 of 2: none shown worse" in lines[1], lines
    worse = result({"p90": [120.0, 121.0, 119.0], "p99": [100.0, 100.0, 100.0]},
                   {"p90": [100.0, 100.0, 100.0], "p99": [100.0, 100.0, 100.0]})
    lines = ps.goals([noisy, worse])
    assert "1 of 4: MISSED" in lines[1] and "p90: pooled 1.200" in lines[2], lines


def test_without_seeds_the_goal_says_one_run_is_no_verdict() -> None:
    r = result({"p90": [105.0], "p99": [100.0]}, {"p90": [100.0], "p99": [100.0]})
    del r["seed_ttft_ms"]
    lines = ps.goals([r])
    assert "worst 1.050x" in lines[0] and "no interval" in lines[1], lines


def test_run_cell_pools_its_seeds_and_keeps_each_seeds_figures() -> None:
    r = ps.run_cell(CELL, 120, ("random", "round-robin", "least-loaded"), seeds=(1, 2))
    assert r["seeds"] == [1, 2]
    for n in ("random", "round-robin", "least-loaded"):
        for q in ("p90", "p99"):
            per = r["seed_ttft_ms"][n][q]
            assert len(per) == 2
            # a pooled percentile lies within the seeds' own (the pooled distribution is their mixture)
            assert min(per) * 0.999 <= r["ttft_ms"][n][q] <= max(per) * 1.001, (n, q, r)
            lo, hi = r[f"spread_{q}"][n]
            assert lo <= hi
    assert min(r["ratio_p90"][n] for n in ps.BLIND) == 1.0


def test_a_cell_is_read_from_its_six_factors_and_a_bad_one_is_one_line() -> None:
    assert ps.parse_cell("4,0.6,128,50,bursty,multi") == ps.Cell(4, 0.6, 128, 50, "bursty", "multi")
    assert ps.parse_cell("3,0.75,64,10,poisson,single").replicas == 3  # off the grid: an unseen shape
    for bad in ("4,0.6,128,50,bursty", "4,0.6,128,50,steady,multi", "x,0.6,128,50,bursty,multi",
                "0,0.6,128,50,bursty,multi"):
        with pytest.raises(SystemExit) as e:
            ps.parse_cell(bad)
        assert str(e.value).startswith(f"--cell {bad!r}") and "\n" not in str(e.value)
