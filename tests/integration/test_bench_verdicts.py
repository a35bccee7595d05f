"""Verdicts people can bet on (issue 31), against real processes: two `oculis sim serve` engines, one with
64 batch slots and one restarted as it were with 4 (`--max-num-seqs 64 -> 4`), each behind an `oculis
serve` router, loaded over real HTTP by `oculis bench run` at 20 req/s.

- The unchanged engine compared with its own baseline (saved with --repeat 5, so its noise floor is
  measured) is PASS or INCONCLUSIVE, never FAIL, in 5 comparisons, one of them while a CPU-bound process
  competes for the machine's cores.
- The 4-slot engine under the same load collapses (its queue grows, the slowest requests are cut at the
  drain): FAIL, exit 3, whatever share was cut.
- A run where no request succeeds is INCONCLUSIVE, exit 4, with one line naming why.

The tests assert verdict classes and exit codes, never timings."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from router_support import start_router
from sim_support import start_sim

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]
PROFILE = {"name": "chat-64", "prompt": {"median": 48, "sigma": 0.3}, "output": {"median": 64, "sigma": 0}}
# every answer takes far longer than the drain allows: nothing can succeed
STALL = {"name": "stall", "prompt": {"median": 48, "sigma": 0}, "output": {"median": 4000, "sigma": 0}}


@dataclass
class Stack:
    wide: str  # router URL in front of the engine with 64 batch slots
    narrow: str  # ... and in front of the one with 4
    config: Path
    tmp: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("verdicts")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for slots in (64, 4):
            sim, engine = start_sim(MODEL, "--gpu", "H100-80GB", f"--max-num-seqs={slots}", "--max-model-len=8192",
                                    log=tmp / f"sim-{slots}.log")
            procs.append(sim)
            cfg = tmp / f"router-{slots}.yaml"
            cfg.write_text(yaml.safe_dump({"oculis": {
                "upstreams": [{"name": "engine", "provider": "vllm", "base_url": engine + "/v1", "model": MODEL,
                               "pricing": {"input_per_mtok": 0.05, "output_per_mtok": 0.08}}],
                "routes": [{"name": "bench", "tiers": [{"name": "only", "upstream": "engine"}]}]}}))
            router, url, _ = start_router(cfg, tmp / f"router-{slots}.log")
            procs.append(router)
            urls.append(url)
        for name, profile in (("chat-64", PROFILE), ("stall", STALL)):
            (tmp / f"{name}.yaml").write_text(yaml.safe_dump(profile))
        yield Stack(urls[0], urls[1], tmp / "router-64.yaml", tmp)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def bench(stack: Stack, url: str, *extra: str, profile: str = "chat-64") -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "oculis_cli.main", "bench", "run", "--route", "bench", "--profile",
            str(stack.tmp / f"{profile}.yaml"), "--url", url, "--rate", "20", "--duration", "2s", "--warmup", "0.5s",
            "--drain-timeout", "2s", "--config", str(stack.config), "--no-progress", "-o", "json", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, doc, proc.stderr


@pytest.fixture(scope="module")
def baseline(stack: Stack) -> Path:
    base = stack.tmp / "baseline.json"
    # five runs: how far a figure moves between runs of the same thing on this machine (its noise floor)
    code, doc, err = bench(stack, stack.wide, "--repeat", "5", "--save", str(base))
    assert code == 0 and doc["current"]["runs"] == 5, err
    assert all(v is not None for k, v in doc["noise_floor"].items() if k.startswith(("ttft", "e2e")))
    return base


def busy_loop(seconds: float) -> subprocess.Popen[bytes]:
    """A CPU-bound process, bounded in time whatever happens to the test."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def test_an_unchanged_engine_is_never_fail_in_5_comparisons_one_under_cpu_contention(
        stack: Stack, baseline: Path) -> None:
    seen = []
    for i in range(5):
        hog = busy_loop(60) if i == 2 else None
        try:
            # two runs a comparison: their own spread joins the baseline's in the noise floor
            code, doc, err = bench(stack, stack.wide, "--compare", str(baseline), "--repeat", "2")
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        seen.append((code, doc.get("verdict"), (doc.get("reasons") or [err])[0]))
        assert (code, doc.get("verdict")) in ((0, "PASS"), (4, "INCONCLUSIVE")), seen
        d = doc["delta"]["e2e_ms.p95"]  # every compared figure carries its interval and the baseline's noise
        assert d["change_low"] <= d["change"] <= d["change_high"] and d["noise_sd"] is not None
        for reason in doc["reasons"]:
            assert "straddles" not in reason or "settle" in reason, reason  # it says what would settle it


def test_an_engine_cut_from_64_to_4_slots_under_load_is_fail(stack: Stack, baseline: Path) -> None:
    code, doc, err = bench(stack, stack.narrow, "--compare", str(baseline), "--repeat", "2")
    assert (code, doc.get("verdict")) == (3, "FAIL"), (doc.get("reasons"), err)
    regressed = [k for k, d in doc["delta"].items() if d["status"] == "regressed"]
    assert any(k.startswith(("ttft", "e2e")) for k in regressed), regressed
    assert "past the limit" in doc["reasons"][0]


def test_a_run_where_nothing_succeeds_is_inconclusive_naming_why(stack: Stack) -> None:
    argv = [sys.executable, "-m", "oculis_cli.main", "bench", "run", "--route", "bench", "--profile",
            str(stack.tmp / "stall.yaml"), "--url", stack.narrow, "--rate", "4", "--duration", "1s", "--warmup", "0s",
            "--drain-timeout", "1s", "--no-progress", "--slo", "ttft_p95<10s"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 4, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("verdict:")]
    assert len(lines) == 1 and lines[0].startswith("verdict: INCONCLUSIVE: no measured request succeeded"), lines
