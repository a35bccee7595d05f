"""`capacity plan` planned max_num_seqs 128 / max_num_batched_tokens 2048 (its --profile's) without saying so,
while `sim serve` on the same model and GPU runs vLLM's own 1024 / 8192: two KV figures for "the same" engine and
no way to tell why (QA3 Part 2 #22). The plan now prints the settings it used and, for unset ones, vLLM's own
defaults on that GPU; --help names the defaults. With vLLM's values given, the two agree (456,528 tokens)."""

from __future__ import annotations

import pytest

from oculis_cli.main import main

PLAN = ["capacity", "plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"]


def test_the_plan_names_its_engine_settings_and_vllm_s_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(PLAN) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs 128, max_num_batched_tokens 2048" in text
    assert "vLLM started without them uses max_num_seqs 1024, max_num_batched_tokens 8192" in text
    # 1024 planned sequences of 1280 tokens exceed the cache: a plan that does not fit (exit 3), the same KV figure
    assert main([*PLAN, "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192"]) == 3
    given = capsys.readouterr().out
    assert "456528" in given and "unset" not in given  # sim serve's GPU KV cache size for the same engine


def test_help_names_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["capacity", "plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "interactive 128" in text and "interactive 2048" in text and "the model's context length" in text
