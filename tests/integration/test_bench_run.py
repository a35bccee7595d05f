"""`oculis bench run` against real processes: two `oculis sim serve` engines (one with a single batch slot
of the other's 16, so 7 of the benchmark's 8 concurrent requests wait), an `oculis serve` router in
front of each (same route name), and a real Prometheus scraping all four. The same engine twice gives
PASS, the smaller engine FAIL (about half the throughput), another seed INCONCLUSIVE, and the figures
say they are simulated."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from router_support import start_prometheus, start_router
from sim_support import start_sim
from skips import needs_command

from oculis_cli.main import main

pytestmark = needs_command("prometheus", "prometheus")

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]
SPEC = '--speculative-config={"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}'
PROFILE = {"name": "tiny-chat", "prompt": {"median": 48, "sigma": 0.3}, "output": {"median": 24, "sigma": 0},
           "shared_prefix": {"share": 0.5, "groups": 2, "tokens": 64}, "multi_turn": {"share": 0.2, "turns": 2}}


@dataclass
class Stack:
    fast: str  # router URL in front of the engine with 16 batch slots
    slow: str  # ... and in front of the one with 1
    prom: str
    config: Path
    profile: Path


def _sim(max_num_seqs: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_sim(MODEL, "--gpu", "H100-80GB", f"--max-num-seqs={max_num_seqs}", "--max-model-len=4096", SPEC,
                     log=log)


def _config(engine: str) -> dict[str, object]:
    return {"oculis": {
        "upstreams": [{"name": "engine", "provider": "vllm", "base_url": engine + "/v1", "model": MODEL,
                       "pricing": {"input_per_mtok": 0.05, "output_per_mtok": 0.08}}],
        "routes": [{"name": "bench", "tiers": [{"name": "only", "upstream": "engine"}]}]}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("bench")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fast_sim, fast_engine = _sim(16, tmp / "sim-fast.log")
        # one slot, not 4: on a loaded 2-core machine the baseline's noise floor hides a 4-slot engine's
        # -12 % to -35 % (INCONCLUSIVE, honestly); one slot is a change no noise explains
        slow_sim, slow_engine = _sim(1, tmp / "sim-slow.log")
        procs += [fast_sim, slow_sim]
        urls, targets = [], [fast_engine[7:], slow_engine[7:]]
        for name, engine in (("fast", fast_engine), ("slow", slow_engine)):
            cfg = tmp / f"{name}.yaml"
            cfg.write_text(yaml.safe_dump(_config(engine)))
            router, url, mport = start_router(cfg, tmp / f"router-{name}.log")
            procs.append(router)
            urls.append(url)
            targets.append(f"127.0.0.1:{mport}")
        proc, prom = start_prometheus(tmp, {"oculis": targets})
        procs.append(proc)

        def scraping() -> bool:
            try:
                r = httpx.get(f"{prom}/api/v1/query", params={"query": "sum(up)"}).json()
                return bool(r["data"]["result"]) and float(r["data"]["result"][0]["value"][1]) == 4
            except (httpx.HTTPError, KeyError, ValueError):
                return False

        eventually(scraping, timeout=30, what="Prometheus scrapes both engines and both routers")
        profile = tmp / "tiny-chat.yaml"
        profile.write_text(yaml.safe_dump(PROFILE))
        yield Stack(urls[0], urls[1], prom, tmp / "fast.yaml", profile)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def bench(stack: Stack, url: str, tmp: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    out = tmp / "out.json"
    argv = [sys.executable, "-m", "oculis_cli.main", "bench", "run", "--route", "bench", "--profile",
            str(stack.profile), "--url", url, "--concurrency", "8", "--duration", "3s", "--warmup", "1s",
            "--prometheus-url", stack.prom, "--config", str(stack.config), "-o", "json",
            # two shared CPU cores run the engines, routers, Prometheus and this client: their scheduling
            # moves a ~40 ms TTFT by up to ~10 ms between identical runs, which is not the change under test
            "--latency-floor-ms", "25", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    out.write_text(proc.stdout)
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, doc, proc.stderr


def test_compare_never_fails_an_unchanged_engine_and_fails_one_that_halves_throughput(
        stack: Stack, tmp_path: Path) -> None:
    base = tmp_path / "baseline.json"
    # three runs: the baseline's noise floor (how far a figure moves between runs of the same thing on
    # this loaded machine) widens every interval of the comparisons below
    code, doc, err = bench(stack, stack.fast, tmp_path, "--save", str(base), "--repeat", "3")
    assert code == 0, err  # nothing to judge yet: exit 0, verdict null
    cur = doc["current"]
    assert doc["verdict"] is None and doc["simulated"] is True and "SIMULATED" in doc["note"]
    for key in ("throughput_tok_s", "requests_per_s", "ttft_ms", "e2e_ms", "errors", "goodput_rps",
                "cost_per_1k_requests"):
        assert key in cur, key
    assert set(cur["ttft_ms"]) >= {"p50", "p95", "p99"} and set(cur["e2e_ms"]) >= {"p50", "p95", "p99"}
    assert cur["errors"] == 0 and cur["requests"]["succeeded"] >= 20 and cur["runs"] == 3
    # every answer is 24 tokens: the cost is the config's prices on the real usage
    assert cur["output_tokens"] == 24 * cur["requests"]["succeeded"]
    expected = (cur["input_tokens"] * 0.05 + cur["output_tokens"] * 0.08) / 1e6 / cur["requests"]["succeeded"] * 1000
    assert cur["cost_per_1k_requests"] == pytest.approx(expected)
    server = cur["server"]  # Prometheus deltas over the run window: the shared prefixes hit the prefix cache
    assert server["prefix_cache_hit_share"] is not None and server["prefix_cache_hit_share"] > 0
    assert server["preemptions"] == 0
    assert 0 < server["spec_decode_acceptance"] <= 1  # accepted / proposed draft tokens, both engines' counters

    code, doc, err = bench(stack, stack.fast, tmp_path, "--compare", str(base), "--report",
                           str(tmp_path / "report.html"))
    # 3 s runs on a shared machine: the intervals may be too wide to say PASS, never FAIL (issue 31)
    assert (code, doc["verdict"]) in ((0, "PASS"), (4, "INCONCLUSIVE")), doc.get("reasons")
    assert doc["baseline"]["throughput_tok_s"] == json.loads(base.read_text())["current"]["throughput_tok_s"]
    assert doc["delta"]["throughput_tok_s"]["better"] == "higher"
    page = (tmp_path / "report.html").read_text()
    assert "SIMULATED" in page and "TTFT CDF" in page and "https://" not in page.split("<body>")[0]

    code, doc, err = bench(stack, stack.slow, tmp_path, "--compare", str(base))
    assert (code, doc["verdict"]) == (3, "FAIL"), doc.get("reasons")
    d = doc["delta"]["throughput_tok_s"]
    # Half the slots: clearly fewer tokens/s. How much fewer depends on how saturated the simulated engine is
    # at this rate under the engine version's step times (about -24 % with vLLM >= 0.12's async scheduling).
    assert d["change_pct"] < -15
    # one slot for 8 concurrent requests: 7 of them queue, and their TTFT is certain to regress whatever
    # the machine's noise; throughput too when the noise floor allows it
    regressed = {k for k, v in doc["delta"].items() if v["status"] == "regressed"}
    assert regressed & {"throughput_tok_s", "ttft_ms.p50", "ttft_ms.p95", "e2e_ms.p50", "e2e_ms.p95"}, regressed
    assert "past the limit" in doc["reasons"][0]

    code, doc, err = bench(stack, stack.fast, tmp_path, "--compare", str(base), "--seed", "7")
    assert (code, doc["verdict"]) == (4, "INCONCLUSIVE")
    assert "workload mismatch" in doc["reasons"][0] and "seed" in doc["reasons"][0]


def test_table_output_says_simulated_and_names_the_verdict(stack: Stack, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "oculis_cli.main", "bench", "run", "--route", "bench", "--profile",
            str(stack.profile), "--url", stack.fast, "--rate", "20", "--duration", "2s", "--warmup", "0s",
            "--slo", "ttft_p95<1ms"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("SIMULATED") and "verdict: FAIL: SLO ttft_p95<1ms missed" in proc.stdout
    assert "achieved" in proc.stdout and "req/s requested" in proc.stdout


@pytest.mark.parametrize(("extra", "code", "says"), [
    (["--url", "http://127.0.0.1:9"], 5, "--url http://127.0.0.1:9: target unreachable"),
    (["--prometheus-url", "http://127.0.0.1:9"], 5, "Prometheus at http://127.0.0.1:9 is unreachable"),
    (["--route", "nope"], 2, "--route 'nope'"),
    (["--profile", "nope"], 2, "--profile 'nope': neither a built-in profile"),
    (["--duration", "ten"], 2, "--duration 'ten' is not a duration"),
    (["--slo", "ttft<1s"], 2, "--slo 'ttft<1s': say which statistic"),
])
def test_bad_input_is_one_line_with_the_documented_exit_code(stack: Stack, extra: list[str], code: int, says: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "run", "--route", "bench", "--url", stack.fast, "--duration", "1s", "--no-progress", *extra]
    assert main(argv) == code  # in-process: the same entry point as the `oculis` command
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
