"""QA finding Q20: the simulator sizes its KV cache as vLLM 0.32 does when told a size. On the CPU backend
VLLM_CPU_KVCACHE_SPACE (whole GiB) wins over --kv-cache-memory-bytes, which wins over the
gpu-memory-utilization plan; on GPUs --kv-cache-memory-bytes replaces the plan. The block counts are the
real engine's: the tiny model (1,024 B/token) with 1M has 8 blocks of 128 tokens (tests/realengine/
test_operator_real_metrics.py), with VLLM_CPU_KVCACHE_SPACE=1 8,192 (REALENGINE.md)."""

import json
from pathlib import Path

import pytest

from oculis.engine import ModelConfig
from oculis_cli.main import main
from oculis_operator import capacity, catalog
from oculis_sim import cli, config, metrics

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "bench" / "data" / "cpu_step_profile.json"
TINY = ModelConfig(params_billions=0.003, num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                   head_dim=64, vocab_size=4096, max_position_embeddings=2048)
L8 = "meta-llama/Llama-3.1-8B-Instruct"


def cpu(**kw: str | None) -> config.Settings:
    return config.resolve("tiny", "CPU", model_config=TINY, max_model_len="512", max_num_seqs=4,
                          step_profile=PROFILE, **kw)  # type: ignore[arg-type]


def test_cpu_kv_cache_memory_bytes_gives_the_real_engines_blocks() -> None:
    s = cpu(kv_cache_memory_bytes="1M")
    assert s.kv_bytes_per_token == 1024 and s.block_size == 128
    assert (s.num_blocks, s.kv_cache_tokens) == (8, 1024)  # real vLLM 0.32: num_gpu_blocks 8
    assert metrics.cache_config_labels(s)["kv_cache_memory_bytes"] == "1048576"
    assert metrics.cache_config_labels(s)["num_gpu_blocks"] == "8"


def test_cpu_kvcache_space_overrides_the_flag() -> None:
    s = cpu(kv_cache_memory_bytes="1M", cpu_kvcache_space="1")
    assert (s.num_blocks, s.kv_cache_tokens) == (8192, 1_048_576)  # real vLLM 0.32 with both: the variable's
    assert s.kv_cache_memory_bytes == 1 << 30


def test_cpu_without_a_size_keeps_the_memory_plan_and_override_still_wins() -> None:
    default = cpu()
    assert default.kv_cache_memory_bytes is None and default.num_blocks > 8192
    assert cpu(kv_cache_memory_bytes="1M", num_gpu_blocks_override=20).num_blocks == 20  # type: ignore[arg-type]


def test_gpu_flag_replaces_the_utilization_budget_and_ignores_the_cpu_variable() -> None:
    per_block = capacity.BLOCK * capacity.kv_bytes_per_token(catalog.lookup(L8), 1)  # 16 x 131,072 B
    for util in (0.5, 0.92):
        s = config.resolve(L8, "H100-80GB", gpu_memory_utilization=util, max_model_len="4096",
                           kv_cache_memory_bytes="1G",
                           cpu_kvcache_space="4")
        assert s.num_blocks == (1 << 30) // per_block == 512
    assert config.resolve(L8, "H100-80GB").num_blocks > 512


@pytest.mark.parametrize(("kw", "words"), [
    ({"cpu_kvcache_space": ""}, "VLLM_CPU_KVCACHE_SPACE=''"),
    ({"cpu_kvcache_space": "1.5"}, "whole number of GiB"),
    ({"cpu_kvcache_space": "0"}, "whole number of GiB"),
    ({"kv_cache_memory_bytes": "lots"}, "--kv-cache-memory-bytes 'lots'"),
    ({"kv_cache_memory_bytes": "0"}, "must be positive"),
    ({"kv_cache_memory_bytes": "64K"}, "--max-model-len 512"),  # 64 tokens: not one sequence of 512
])
def test_bad_sizes_are_one_line_naming_the_input(kw: dict[str, str], words: str) -> None:
    with pytest.raises(config.SimConfigError) as err:
        cpu(**kw)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_serve_takes_the_flag_instead_of_ignoring_it() -> None:
    args, ignored = cli.build_parser().parse_known_args(["serve", "--model", "tiny", "--kv-cache-memory-bytes", "1M"])
    assert args.kv_cache_memory_bytes == "1M" and ignored == []


def test_a_one_mib_cpu_cache_preempts_a_burst_and_the_variable_overrides_it(capsys, tmp_path,  # type: ignore[no-untyped-def]
                                                                            monkeypatch) -> None:
    model = tmp_path / "tiny.yaml"
    model.write_text(json.dumps(TINY.model_dump(by_alias=True, exclude_none=True)))
    wl = tmp_path / "burst.yaml"
    wl.write_text("prompt_tokens: 200\noutput_tokens: 64\nstages: [{rate: inf, requests: 8}]\n")
    argv = ["sim", "replay", "--model", "tiny", "--model-config", str(model), "--gpu", "CPU", "--step-profile",
            str(PROFILE), "--max-model-len", "512", "--max-num-seqs", "4", "--kv-cache-memory-bytes", "1M",
            "--workload", str(wl), "-o", "json"]
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert main(argv) == 0
    small = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert main(argv) == 0
    roomy = json.loads(capsys.readouterr().out)
    assert (small["kv_blocks"], roomy["kv_blocks"]) == (8, 8192)
    assert small["preemptions"] > 0 and roomy["preemptions"] == 0
