"""LoRA slots in `oculis sim fleet`'s virtual time: the slot bookkeeping on hand-checked sequences, and a
small fleet where adapter affinity keeps adapters on their replicas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oculis_sim import config, fleet, workload
from oculis_sim.cli import main
from oculis_sim.fleetlora import Slots, draw
from oculis_sim.lora import LOAD_S


def test_slots_admit_wait_load_and_release_in_order() -> None:
    s = Slots(2)
    assert s.admit("a", 1) == LOAD_S and s.admit("b", 2) == LOAD_S  # two slots: both load
    assert s.admit("a", 3) == 0.0  # a runs: joins, nothing to load
    assert s.admit("c", 4) is None and s.admit("d", 5) is None  # both slots taken: they wait
    assert s.state() == (frozenset({"a", "b"}), frozenset({"c", "d"}))
    assert s.release("a") == []  # a still runs (request 3)
    assert s.release("a") == [(4, LOAD_S)]  # a's slot frees: c (first waiting) loads into it, d still waits
    assert s.admit("b", 6) == 0.0  # b runs: a new request for it skips the queue, as vLLM's scheduler does
    assert s.release("b") == [] and s.release("b") == [(5, LOAD_S)]
    assert s.resident == ["c", "d"] and (s.loads, s.waits) == (4, 2)
    s.release("c")
    assert s.admit("c", 7) == 0.0  # still resident in its slot: no load


def test_affinity_keeps_adapters_on_fewer_replicas_with_fewer_loads_and_waits() -> None:
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB")
    wl = workload.parse({"prompt_tokens": 200, "output_tokens": 100, "stages": [{"rate": 30, "seconds": 20}],
                         "seed": 5})
    lora = draw(len(wl), 4, 0.0, 5)  # drawn, not cyclic: a cycle of 4 over 2 replicas is partitioned by rotation
    blind = fleet.run(s, wl, 2, "least-loaded", adapters=lora, max_loras=2, lora_affinity=False).summary
    aff = fleet.run(s, wl, 2, "least-loaded", adapters=lora, max_loras=2).summary
    assert blind["requests"] == aff["requests"] == len(wl)
    assert aff["lora"]["slot_waits"] < blind["lora"]["slot_waits"]
    assert aff["lora"]["adapter_loads"] < blind["lora"]["adapter_loads"]
    assert "lora" not in fleet.run(s, wl, 2, "least-loaded").summary  # no adapters: the summary as before


@pytest.mark.parametrize("strategy", ["random", "prefix"])
def test_every_request_is_served_with_adapters(strategy: str) -> None:
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB")
    wl = workload.parse({"prompt_tokens": 100, "output_tokens": 20, "stages": [{"rate": 10, "seconds": 5}],
                         "seed": 1})
    lora: list[str | None] = [None if i % 3 == 0 else f"a{i % 5}" for i in range(len(wl))]
    out = fleet.run(s, wl, 3, strategy, adapters=lora, max_loras=1).summary  # type: ignore[arg-type]
    assert out["requests"] == len(wl) and out["lora"]["max_loras"] == 1


def test_sim_fleet_takes_lora_adapters(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    wl = tmp_path / "wl.yaml"
    wl.write_text(json.dumps({"prompt_tokens": 200, "output_tokens": 50, "stages": [{"rate": 20, "seconds": 5}],
                              "seed": 2}))
    args = ["fleet", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--replicas", "2", "--workload",
            str(wl), "--lora-adapters", "4", "--max-loras", "2", "--picker", "least-loaded", "-o", "json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lora"]["max_loras"] == 2 and out["lora"]["affinity"] is True and out["lora"]["adapter_loads"] >= 4
    assert main([*args, "--lora-blind"]) == 0
    assert json.loads(capsys.readouterr().out)["lora"]["affinity"] is False
    assert main([*args[:-2], "--max-loras", "0"]) == 2
    assert "--max-loras 0: must be at least 1" in capsys.readouterr().err
