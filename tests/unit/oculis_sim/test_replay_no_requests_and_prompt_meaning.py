"""`oculis sim replay` (QA2 #27, #28): `prompt_tokens` means the tokens after the shared prefix in both
workload forms; a replay with no requests says so instead of a table of zeros, and `-o json` carries every
figure the text prints, marked simulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oculis_cli.main import main
from oculis_sim import workload

MODEL = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"]


def test_prompt_tokens_are_after_the_shared_prefix_in_both_forms() -> None:
    drawn = workload.parse({"shared_prefix_tokens": 800, "prompt_tokens": 1000, "output_tokens": 10,
                            "stages": [{"rate": 1, "requests": 3}]})
    explicit = workload.parse({"shared_prefix_tokens": 800, "requests": [
        {"prompt_tokens": 1000, "output_tokens": 10, "at": t} for t in (0, 1, 2)]})
    assert drawn.prompt_tokens.tolist() == explicit.prompt_tokens.tolist() == [1800] * 3


def test_a_replay_with_no_requests_says_so_and_json_has_every_figure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    none = tmp_path / "none.yaml"
    none.write_text("prompt_tokens: 100\noutput_tokens: 10\nstages: [{rate: 0, seconds: 5}]\n")
    assert main(["sim", "replay", *MODEL, "--workload", str(none)]) == 0
    out = capsys.readouterr().out
    assert "no request completed (0 in the workload)" in out and "0.0" not in out
    assert main(["sim", "replay", *MODEL, "--workload", str(none), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ttft_ms"] is None and doc["requests"] == 0 and "no_requests" in doc
    some = tmp_path / "some.yaml"
    some.write_text("shared_prefix_tokens: 800\nprompt_tokens: 100\noutput_tokens: 10\n"
                    "stages: [{rate: 2, requests: 4}]\n")
    assert main(["sim", "replay", *MODEL, "--workload", str(some), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated"] is True and doc["requests"] == 4 and doc["refused"] == 0
    assert {"peak_kv_usage", "prefix_cache_hit_rate", "kv_cache_tokens", "mean_acceptance_length"} <= set(doc)
    assert doc["prefix_cache_hit_rate"] > 0 and doc["ttft_ms"]["p50"] > 0
