"""Simulator conformance (issue 22 item 5): `oculis sim serve`, started with the real engine's own argv on
the same tiny model directory, answers the same requests as real vLLM 0.32 with the same status codes,
JSON field sets and types, SSE framing, error shapes and wording, /v1/models entries, metric families,
label names, buckets and `_created` series. The only differences allowed are the simulator's honesty
markers (sim_conformance.DELIBERATE). The real engine is the tier's shared default engine: no extra start."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import realvllm
import sim_conformance as conf
from sim_support import start_sim, stop

from oculis_sim import vllm_flags


@pytest.fixture(scope="module")
def real(engines: Any) -> Iterator[tuple[dict[str, conf.Observed], str, str]]:
    """Every probe sent once to the real engine (the tier's default one: one batch), then its /metrics."""
    engine = engines.get("default")
    observed = conf.capture(engine.url)
    yield observed, httpx.get(f"{engine.url}/metrics").text, engine.url


@pytest.fixture(scope="module")
def sim(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulator posing as the tiny model: the real engine's own argv (`vllm serve DIR ...`, the same
    model directory and flags) plus --gpu; a later --port wins."""
    argv = engines.get("default").argv[2:]  # drop the vllm binary and `serve`
    proc, base = start_sim(*argv, "--gpu", "H100-80GB", log=tmp_path_factory.mktemp("sim") / "sim.log", timeout=60)
    yield base
    stop(proc)


def test_api_answers_as_real_vllm(real: tuple[dict[str, conf.Observed], str, str], sim: str) -> None:
    observed, _, _ = real
    got = conf.capture(sim)
    problems = conf.differences(observed, got)
    assert not problems, "\n".join(problems)


def test_models_entries_match(real: tuple[dict[str, conf.Observed], str, str], sim: str) -> None:
    r = real[0]["models"].data["data"]
    s = httpx.get(f"{sim}/v1/models").json()["data"]
    keep = ("id", "object", "root", "parent", "max_model_len")
    assert [{k: m[k] for k in keep} for m in r] == [{k: m[k] for k in keep} for m in s]
    assert [m["owned_by"] for m in s] == ["oculis-simulator"] * len(s)  # the honesty marker


def test_metric_families_labels_and_buckets_match(real: tuple[dict[str, conf.Observed], str, str],
                                                  sim: str) -> None:
    conf.capture(sim)  # the same traffic, so every series the real engine has exists here too
    problems = conf.metric_differences(real[1], httpx.get(f"{sim}/metrics").text)
    assert not problems, "\n".join(problems)


def test_the_simulators_list_of_vllm_flags_is_vllms(vllm_venv: Path) -> None:
    """sim serve refuses exactly what `vllm serve` refuses: its flag list is the real parser's."""
    code = ("import json, vllm_argcheck; p = vllm_argcheck.parser(); "
            "print(json.dumps(sorted({o for a in p._actions for o in a.option_strings} - {'-h', '--help'})))")
    proc = subprocess.run([str(vllm_venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent, env=realvllm.engine_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    real_flags = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert real_flags == set(vllm_flags.SERVE_FLAGS), (
        f"only in vLLM: {sorted(real_flags - vllm_flags.SERVE_FLAGS)}; "
        f"only in the simulator's list: {sorted(vllm_flags.SERVE_FLAGS - real_flags)}")
