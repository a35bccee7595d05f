"""QA finding Q24: `oculis capacity plan --max-loras/--max-lora-rank` shows the LoRA memory budget the operator
plans (README "LoRA adapters as tiers": Llama-3.1-8B at rank 16, one slot = 80 MiB), and refuses what the
GPUUpstream schema refuses in one line naming the flag."""

import json

import pytest

from oculis.engine import Engine
from oculis_cli.main import main
from oculis_operator import catalog, lora_capacity

L8 = ["capacity", "plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"]
MiB = 2**20


def plan_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main([*L8, *extra, "-o", "json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_lora_flags_plan_the_adapter_slots_and_the_shrink_buffer(capsys: pytest.CaptureFixture[str]) -> None:
    base = plan_json(capsys)
    one = plan_json(capsys, "--max-lora-rank", "16")  # either flag means --enable-lora, vLLM's default 1 slot
    four = plan_json(capsys, "--max-loras", "4", "--max-lora-rank", "64")
    assert base["lora_weights_bytes"] == base["lora_shrink_bytes"] == 0
    assert one["lora_weights_bytes"] == 80 * MiB  # README's figure
    assert four["lora_weights_bytes"] == 4 * 4 * 80 * MiB  # slots x rank scale it linearly
    assert one["weights_bytes_per_gpu"] == base["weights_bytes_per_gpu"] + 80 * MiB  # type: ignore[operator]
    batched = one["max_num_batched_tokens"]
    assert one["lora_shrink_bytes"] == 3 * batched * 16 * 4  # type: ignore[operator]
    # the CLI shows the operator's pure plan, not its own arithmetic
    m = catalog.lookup("meta-llama/Llama-3.1-8B-Instruct")
    assert four["lora_weights_bytes"] == lora_capacity.lora_weight_bytes(m, 1, Engine(max_loras=4, max_lora_rank=64))
    assert int(base["kv_cache_tokens"]) > int(four["kv_cache_tokens"])  # type: ignore[call-overload]


def test_text_plan_has_one_lora_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*L8, "--max-loras", "1", "--max-lora-rank", "16"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("LoRA per GPU")]
    assert len(lines) == 1 and "80 MiB adapter slots" in lines[0] and "0.4 MiB shrink buffer" in lines[0]
    assert main(L8) == 0
    assert "LoRA per GPU" not in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "words"), [
    (["--max-lora-rank", "7"], "--max-lora-rank: spec.engine.maxLoraRank: Input should be 1, 8, 16, 32"),
    (["--max-loras", "0"], "--max-loras: spec.engine.maxLoras: Input should be greater than or equal to 1"),
    (["--max-loras", "x"], "--max-loras: invalid int value: 'x'"),
])
def test_bad_lora_flags_are_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                    words: str) -> None:
    try:  # a schema refusal returns 2, argparse's own (not an integer) exits 2
        code = main([*L8, *flags])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
