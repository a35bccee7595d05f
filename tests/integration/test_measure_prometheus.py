"""The measurement commands against a real Prometheus scraping a real `oculis serve` after a burst of
traffic, the router then stopped (as a replaced pod is): `route analyze --since` gives the seed's table
with the router's own counts, `cost report` agrees with oculis_cost_dollars_total, `cache advise` reads
the cached-token share; an unreachable Prometheus is one line and exit 5."""

from __future__ import annotations

import csv
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import free_port
from router_support import Fakes, start_prometheus
from skips import needs_command, removable, skip_or_fail
from test_router_processes import start_router

from oculis_cli.main import main
from oculis_measure.prom import Prometheus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training"))
from routing_data import data_dir  # type: ignore[import-not-found]

pytestmark = needs_command("prometheus", "prometheus")
HARD = data_dir() / "mmlu" / "mmlu_college_mathematics.csv"
PRICES = {"llama-8b": (0.05, 0.08, None), "llama-70b": (0.35, 0.4, None), "gpt4o": (2.5, 10.0, 1.25)}


@dataclass
class World:
    config: Path
    prom: str
    tiers: Counter[str]  # X-Oculis-Tier of every answer the route gave
    hits: int  # answers served from the response cache
    upstream_calls: Counter[str]  # answers that reached each upstream
    cost_metric: float  # sum(oculis_cost_dollars_total), every upstream
    route_cost: float  # the upstreams of route adaptive (claude serves only via-claude)


def _prompts() -> list[str]:
    # Without the shared data beside the checkout (a bare clone), long multi-step questions of our own reach
    # the upper tiers the same way: the classifier is length-led.
    hard: list[str] = [
        "This question refers to the following information. In 1215 the barons of England compelled King John "
        "to seal a charter at Runnymede that limited royal power, guaranteed certain legal procedures and "
        "protected church rights. Later generations reinterpreted it as a foundation of constitutional "
        f"government and the rule of law. Question {i}: which of the following best explains why the charter "
        "acquired lasting significance? A. It created the first elected parliament B. It was repeatedly "
        "reissued and later read as a statement of general liberties C. It abolished feudal obligations "
        "D. It was enforced by the papacy. Explain each step of your reasoning." for i in range(12)]
    if HARD.is_file():
        with HARD.open() as f:
            reader = csv.reader(f)
            next(reader)
            hard = [row[0] for row in list(reader)[:12]]
    easy = ["hi", "thanks!", "what time is it?", "say hello", "good morning", "ok"]
    return easy * 3 + hard


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("measure")
    fakes = Fakes()
    for s in fakes.servers.values():
        s.__enter__()
    fakes.scripts["frontier"].cached_tokens = 4  # 4 of gpt-4o's 10 prompt tokens come from its prompt cache
    fakes.scripts["claude"].cached_tokens = 20  # cache reads on top of Claude's input tokens (Anthropic's usage)
    cfg = tmp / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump(fakes.config()))
    router, url, mport = start_router(cfg, tmp / "router.log")
    prom, purl = start_prometheus(tmp, {"oculis": [f"127.0.0.1:{mport}"]})
    try:
        tiers: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        hits = 0
        with httpx.Client(timeout=30, headers={"authorization": "Bearer sk-client"}) as client:
            bodies: list[dict[str, Any]] = [
                {"messages": [{"role": "user", "content": p}], "temperature": 0.7} for p in _prompts()]
            bodies += [{"messages": [{"role": "user", "content": "cache me"}], "temperature": 0}] * 3
            for body in bodies:
                r = client.post(url + "/v1/chat/completions", json={"model": "adaptive", **body})
                assert r.status_code == 200, r.text
                tiers[r.headers["x-oculis-tier"]] += 1
                if r.headers["x-oculis-cache"] == "hit":
                    hits += 1
                else:
                    calls[r.headers["x-oculis-upstream"]] += 1
            for i in range(2):  # another route, on an Anthropic upstream
                r = client.post(url + "/v1/chat/completions", json={
                    "model": "via-claude", "messages": [{"role": "user", "content": f"hello {i}"}]})
                assert r.status_code == 200, r.text
        assert hits == 2 and len(tiers) >= 2, (tiers, hits)  # the burst reaches more than one tier
        with Prometheus(purl) as p:
            # Prometheus up (a PromError until then), and a scrape of every target after the last request
            eventually(lambda: p.wait_scraped(time.time(), timeout=10), timeout=30, what="a scrape after")
            cost = p.scalar("sum(oculis_cost_dollars_total)")
            route_cost = p.scalar('sum(oculis_cost_dollars_total{upstream!="claude"})')
            assert cost is not None and route_cost is not None and cost > route_cost > 0
            # The router goes away (a replaced pod): its series go stale, and its counts must still add up.
            router.terminate()
            router.wait(10)
            eventually(lambda: p.scalar("sum(oculis_cost_dollars_total)") is None, timeout=30,
                       what="Prometheus marks the stopped router's series stale")
        yield World(cfg, purl, tiers, hits, calls, cost, route_cost)
    finally:
        prom.terminate()
        router.terminate()
        prom.wait(10)
        router.wait(10)
        for s in fakes.servers.values():
            s.__exit__()


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, Any]:
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else out


def test_route_analyze_since_gives_the_seed_table_from_the_routers_counters(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = _json(capsys, ["route", "analyze", "--route", "adaptive", "--since", "15m", "--config",
                               str(world.config), "--prometheus-url", world.prom, "-o", "json"])
    assert code == 0
    tiers = {t["tier"]: t for t in rep["tiers"]}
    assert {k: v["requests"] for k, v in tiers.items() if v["requests"]} == dict(world.tiers)
    assert rep["total"]["requests"] == sum(world.tiers.values())
    assert rep["total"]["cost"] == pytest.approx(world.route_cost, rel=1e-6)
    # Every upstream call used 10 prompt and 3 completion tokens (4 of gpt-4o's prompt tokens cached):
    # the baseline re-prices each call's own tokens at gpt-4o's prices; cache hits cost nothing either way.
    own = world.upstream_calls["llama-8b"] + world.upstream_calls["llama-70b"]  # no prompt cache there
    expected = own * (10 * 2.5 + 3 * 10) + world.upstream_calls["gpt4o"] * (6 * 2.5 + 4 * 1.25 + 3 * 10)
    assert rep["baseline"]["cost"] == pytest.approx(expected / 1e6, rel=1e-6)
    for name, t in tiers.items():
        upstream = t["upstream"]
        if world.upstream_calls[upstream]:
            inp, outp, cached = PRICES[upstream]
            per_call = (6 * inp + 4 * cached + 3 * outp) if cached else (10 * inp + 3 * outp)
            assert t["cost"] == pytest.approx(world.upstream_calls[upstream] * per_call / 1e6, rel=1e-6), name
    assert rep["scale"] == pytest.approx(30 * 86400 / 900)
    assert rep["escalation"]["of_requests"] == rep["total"]["requests"]
    code, text = _json(capsys, ["route", "analyze", "--route", "adaptive", "--since", "15m", "--config",
                                str(world.config), "--prometheus-url", world.prom])
    assert code == 0 and "est_monthly = window cost x 30 d" in text and "saving vs all-complex" in text
    # "took, any outcome" with the answered count beside it: errors are no answers (QA3 Part 2 #8)
    assert "escalation rate:" in text and "requests the route took, any outcome" in text and "answered" in text


def test_cost_report_agrees_with_the_cost_metric(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = _json(capsys, ["cost", "report", "--since", "15m", "--group-by", "route,tier,upstream",
                               "--config", str(world.config), "--prometheus-url", world.prom, "-o", "json"])
    assert code == 0
    assert rep["total"]["token_dollars"] == pytest.approx(world.cost_metric, rel=1e-6)
    assert sum(r["token_dollars"] for r in rep["rows"]) == pytest.approx(world.cost_metric, rel=1e-5)
    gpt = [r for r in rep["rows"] if r["upstream"] == "gpt4o"]
    if gpt:  # cached prompt tokens priced as the saving they are
        assert gpt[0]["cache_saving_dollars"] == pytest.approx(gpt[0]["cached_tokens"] * (2.5 - 1.25) / 1e6)
    assert "estimates" in rep["note"]
    code, rep = _json(capsys, ["cost", "report", "--since", "15m", "--group-by", "upstream", "--gpu", "llama-8b=2.5x2",
                               "--config", str(world.config), "--prometheus-url", world.prom, "-o", "json"])
    rows = {r["upstream"]: r for r in rep["rows"]}
    assert rows["llama-8b"]["gpu_dollars"] == pytest.approx(2.5 * 2 * 0.25)  # 2 GPUs for the whole 15 min
    assert rows["llama-70b"]["gpu_dollars"] == 0 and rep["basis"]["gpu_dollars"].startswith("allocation")
    assert main(["cost", "report", "--gpu", "llama-8b=lots", "--config", str(world.config)]) == 2
    assert "UPSTREAM=DOLLARS_PER_GPU_HOUR" in capsys.readouterr().err
    code, out = _json(capsys, ["cost", "report", "--since", "15m", "--config", str(world.config),
                               "--prometheus-url", world.prom, "-o", "csv"])
    assert code == 0 and out.splitlines()[0].startswith("route,tier,requests")


def test_cache_advise_reads_the_cached_token_share(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    if not world.upstream_calls["gpt4o"]:
        skip_or_fail(removable("the burst did not reach gpt-4o", "_prompts()'s hard prompts must reach the top tier"))
    code, rep = _json(capsys, ["cache", "advise", "--upstream", "gpt4o", "--since", "15m", "--config",
                               str(world.config), "--prometheus-url", world.prom, "-o", "json"])
    assert code == 0
    assert {"break_even_hits", "min_hits"} <= set(rep)
    # gpt-4o here: writes at the input price (w 1.0), reads at half (r 0.5): every hit pays
    assert rep["break_even_hits"] == 0 and rep["min_hits"] == 1
    assert rep["cache_read_token_share"] == pytest.approx(0.4) and rep["verdict"] == "pays"
    code, rep = _json(capsys, ["cache", "advise", "--upstream", "gpt4o", "--since", "15m", "--config",
                               str(world.config), "--prometheus-url", world.prom, "-o", "json",
                               "--write-multiplier", "2", "--read-multiplier", "0.1"])
    assert rep["min_hits"] == 2 and rep["verdict"] == "undetermined"  # >= 0.67 hits per write, break-even 1.11


def test_cache_advise_recommends_an_anthropic_ttl(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    code, rep = _json(capsys, ["cache", "advise", "--upstream", "claude", "--since", "15m", "--config",
                               str(world.config), "--prometheus-url", world.prom, "-o", "json",
                               "--write-multiplier", "1.25", "--read-multiplier", "0.1"])
    assert code == 0 and rep["cache_read_token_share"] > 0, rep
    assert rep["break_even_by_ttl"] == {"5m": 0.2778, "1h": 1.1111}
    h = rep["hits_per_write"]
    assert rep["recommended_ttl"] == ("1h" if h > 1.1111 else "5m" if h > 0.2778 else "undetermined")


def test_unreachable_prometheus_and_bad_input_are_one_line(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for argv in (["route", "analyze", "--route", "adaptive", "--since", "1h"],
                 ["cost", "report", "--since", "1h"], ["cache", "advise", "--since", "1h"]):
        assert main([*argv, "--config", str(world.config), "--prometheus-url", dead]) == 5
        err = capsys.readouterr().err
        assert "unreachable" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert main(["route", "analyze", "--route", "nope", "--since", "1h", "--config", str(world.config),
                 "--prometheus-url", world.prom]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["cost", "report", "--since", "7days", "--config", str(world.config)]) == 2
    assert "not a duration" in capsys.readouterr().err
