"""The capacity plan against what real vLLM start-up logs printed (../shared/notes/kv-observed.md), and
the Hugging Face configs in tests/fixtures/hf-configs against the built-in catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oculis import gpus
from oculis.engine import Engine, ModelConfig
from oculis.placement import GPUProductName
from oculis_operator import capacity, catalog, engine_args, hfconfig

GiB = 1024**3
FIXTURES = Path(__file__).parents[2] / "fixtures" / "hf-configs"
H100 = gpus.lookup("H100-80GB")


def hf(name: str) -> ModelConfig:
    return hfconfig.parse((FIXTURES / f"{name}.json").read_text(), name)


def logged_engine(mml: int, gmu: float, seqs: int = 1024, batched: int = 8192) -> Engine:
    return Engine(max_model_len=mml, max_num_seqs=seqs, max_num_batched_tokens=batched, gpu_memory_utilization=gmu)


def test_worked_case_llama_8b_h100_vllm_0_19_matches_the_log() -> None:
    # kv-observed C01: 0.95 x 79.19 GiB, weights 14.99, activation 1.89, non-torch 0.25, KV 58.11 GiB = 476,016 tokens
    p = capacity.plan(catalog.lookup("meta-llama/Llama-3.1-8B-Instruct"), H100, 1, logged_engine(8192, 0.95),
                      vllm_version=(0, 19))
    assert p.requested_bytes / GiB == pytest.approx(75.23, abs=0.01)
    assert p.weights_bytes_per_gpu / GiB == pytest.approx(14.99, abs=0.01)
    assert p.activation_bytes / GiB == pytest.approx(1.89, abs=0.02)
    assert p.non_torch_bytes / GiB == pytest.approx(0.25, abs=0.01) and p.cuda_graph_bytes == 0
    assert p.kv_budget_bytes / GiB == pytest.approx(58.11, abs=0.02)
    assert abs(p.kv_cache_tokens - 476_016) * p.kv_bytes_per_token < 0.05 * GiB


# vLLM 0.11 on H100 (79.18 GiB), gmu 0.9, defaults 1024 seqs / 8192 batched tokens, max_model_len 16000:
# (model, TP, logged weights GiB, logged activation GiB, logged available KV GiB), from
# llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md.
LLM_D = [
    ("Llama-3.1-8B-Instruct", 1, 14.99, 4.76, 51.38),
    ("Qwen3-0.6B", 1, 1.12, 5.56, 64.45),
    ("Qwen3-32B", 1, 61.03, 5.64, 4.45),
    ("Llama-3.3-70B-Instruct-FP8-dynamic", 2, 33.88, 4.84, 32.0),
    ("gpt-oss-20b", 1, 13.47, 7.38, 50.28),
]


@pytest.mark.parametrize(("name", "tp", "weights", "activation", "kv"), LLM_D)
def test_vllm_0_11_budget_terms_match_the_logs(name: str, tp: int, weights: float, activation: float,
                                               kv: float) -> None:
    p = capacity.plan(hf(name), H100, tp, logged_engine(16000, 0.9), vllm_version=(0, 11))
    assert p.weights_bytes_per_gpu / GiB == pytest.approx(weights, abs=0.05)
    assert p.activation_bytes / GiB == pytest.approx(activation, abs=0.05)
    assert p.kv_budget_bytes / GiB == pytest.approx(kv, abs=max(0.1, 0.02 * kv))


def test_tensor_parallel_adds_non_torch_memory_from_0_16() -> None:
    m = catalog.lookup("meta-llama/Llama-3.1-70B-Instruct")
    tp1 = capacity.non_torch_bytes(1, (0, 19))
    tp4 = capacity.non_torch_bytes(4, (0, 19))
    assert tp4 - tp1 == pytest.approx(1.95 * GiB, abs=0.2 * GiB)  # NCCL / custom all-reduce buffers per GPU
    assert capacity.non_torch_bytes(2, (0, 11)) < 0.6 * GiB
    # the whole overhead outside weights and KV at TP >= 2 (kv-observed pattern 2: 3.3-4.4 GiB on 0.19)
    p = capacity.plan(m, H100, 4, logged_engine(8192, 0.9), vllm_version=(0, 19))
    assert 3.3 * GiB <= p.activation_bytes + p.non_torch_bytes <= 4.4 * GiB


def test_activation_peak_follows_the_vocabulary_and_dropped_in_0_17() -> None:
    qwen, llama = catalog.lookup("Qwen/Qwen2.5-7B-Instruct"), catalog.lookup("meta-llama/Llama-3.1-8B-Instruct")
    new = [capacity.activation_bytes(m, 1, 1024, 8192, (0, 19)) / GiB for m in (llama, qwen)]
    assert all(1.85 <= a <= 2.3 for a in new) and new[1] > new[0]  # pattern 2: 1.9-2.3 GiB; larger vocab, higher
    assert capacity.activation_bytes(qwen, 1, 1024, 8192, (0, 16)) > 2.4 * capacity.activation_bytes(
        qwen, 1, 1024, 8192, (0, 17))
    # fewer sequences in the profile run, smaller sampler peak
    assert capacity.activation_bytes(llama, 1, 128, 2048, (0, 19)) < 0.5 * GiB


def test_cuda_graph_estimate_is_subtracted_only_from_0_21_and_not_when_eager() -> None:
    m = catalog.lookup("meta-llama/Llama-3.1-8B-Instruct")
    old = capacity.plan(m, H100, 1, logged_engine(8192, 0.92), vllm_version=(0, 20))
    new = capacity.plan(m, H100, 1, logged_engine(8192, 0.92), vllm_version=(0, 21))
    assert old.cuda_graph_bytes == 0 and new.cuda_graph_bytes == pytest.approx(0.84 * GiB, abs=0.01 * GiB)
    assert old.kv_budget_bytes - new.kv_budget_bytes == new.cuda_graph_bytes
    eager = logged_engine(8192, 0.92).model_copy(update={"extra_args": ["--enforce-eager"]})
    assert capacity.plan(m, H100, 1, eager, vllm_version=(0, 21)).cuda_graph_bytes == 0


@pytest.mark.parametrize(("image", "version"), [
    ("vllm/vllm-openai:v0.19.0", (0, 19)), ("vllm/vllm-openai:v0.21.1-cu129", (0, 21)),
    ("registry.local:5000/vllm/vllm-openai:0.17.0@sha256:abc", (0, 17)), ("vllm/vllm-openai:latest", None),
    ("vllm/vllm-openai", None), ("vllm/vllm-openai@sha256:abc", None), (None, None),
])
def test_vllm_version_is_read_from_the_image_tag(image: str | None, version: tuple[int, int] | None) -> None:
    assert capacity.vllm_version(image) == version


def test_default_version_is_the_pinned_engine_image() -> None:
    assert capacity.vllm_version(engine_args.VLLM_IMAGE) == capacity.DEFAULT_VLLM
    p = capacity.plan(catalog.lookup("Qwen/Qwen3-8B"), H100, 1, vllm_version=None)
    assert p.vllm_version == "0.20" and any("names no vLLM version" in n for n in p.notes)


def test_quantized_weights_keep_embeddings_and_lm_head_16_bit() -> None:
    bf16, fp8 = hf("Llama-3.1-70B-Instruct"), hf("Llama-3.3-70B-Instruct-FP8-dynamic")
    assert fp8.quantization == "fp8" and bf16.quantization is None
    vocab = 2 * 128256 * 8192
    full = capacity.weights_bytes_per_gpu(bf16, 2)
    half = capacity.weights_bytes_per_gpu(fp8, 2)
    assert full - half == pytest.approx((bf16.params_billions * 1e9 - vocab) / 2, rel=1e-6)
    awq = hf("Qwen2.5-7B-Instruct-AWQ")
    assert awq.quantization == "awq"
    assert 5.0 * GiB < capacity.weights_bytes_per_gpu(awq, 1) < 5.6 * GiB  # 4-bit layers, 16-bit 152k x 3584 x 2


def test_fp8_kv_doubles_tokens_and_mla_is_not_split_by_tp() -> None:
    m = catalog.lookup("meta-llama/Llama-3.1-8B-Instruct")
    assert capacity.kv_bytes_per_token(m, 1, "fp8") * 2 == capacity.kv_bytes_per_token(m, 1, "auto")
    ds = hf("DeepSeek-V3")
    assert ds.mla_latent_dim == 576
    assert capacity.kv_bytes_per_token(ds, 8) == capacity.kv_bytes_per_token(ds, 1) == 61 * 576 * 2


def test_sliding_window_models_use_vllm_kv_groups() -> None:
    gemma = hf("gemma-2-9b-it")
    assert (gemma.sliding_window, gemma.full_attention_layers) == (4096, 21)
    available = 20 * GiB
    page = capacity.BLOCK * capacity.kv_bytes_per_layer(gemma, 1)
    tokens, note = capacity.kv_tokens(gemma, 1, "auto", available, 8192, 8192)
    blocks = available // (page * 21)  # two groups of 21 layers share one pool
    assert tokens == int(blocks / (512 + 513) * 8192) and note and "concurrency x maxModelLen" in note
    # a window shorter than the context: each request holds fewer blocks, so more tokens are logged
    oss = hf("gpt-oss-20b")
    long, _ = capacity.kv_tokens(oss, 1, "auto", available, 131072, 2048)
    flat, none = capacity.kv_tokens(oss, 1, "auto", available, 131072, 2048, hybrid=False)
    assert long > 1.9 * flat and none is None


def test_architectures_without_attention_pages_are_refused_not_guessed() -> None:
    with pytest.raises(hfconfig.HFConfigError, match="does not model it"):
        hf("Qwen3-Next-80B-A3B-Instruct")
    with pytest.raises(hfconfig.HFConfigError, match="num_hidden_layers is missing"):
        hfconfig.parse(json.dumps({"hidden_size": 8}))
    with pytest.raises(hfconfig.HFConfigError, match="quant_method 'bitsandbytes'"):
        hfconfig.from_dict({**json.loads((FIXTURES / "Qwen3-8B.json").read_text()),
                            "quantization_config": {"quant_method": "bitsandbytes"}})


CATALOG_FIXTURES = {
    "meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct":
    "Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-7B-Instruct": "Qwen2.5-7B-Instruct", "Qwen/Qwen3-8B": "Qwen3-8B",
    "Qwen/Qwen3-0.6B": "Qwen3-0.6B", "mistralai/Mixtral-8x7B-Instruct-v0.1": "Mixtral-8x7B-Instruct-v0.1",
    "deepseek-ai/DeepSeek-V3": "DeepSeek-V3", "meta-llama/Llama-3.3-70B-Instruct": "Llama-3.1-70B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct": "Qwen2.5-72B-Instruct", "Qwen/Qwen3-32B": "Qwen3-32B",
    "Qwen/Qwen3-30B-A3B": "Qwen3-30B-A3B", "mistralai/Mistral-Small-24B-Instruct-2501":
    "Mistral-Small-24B-Instruct-2501", "openai/gpt-oss-20b": "gpt-oss-20b", "openai/gpt-oss-120b": "gpt-oss-120b",
    "google/gemma-3-27b-it": "gemma-3-27b-it",
}


@pytest.mark.parametrize(("model", "fixture"), sorted(CATALOG_FIXTURES.items()))
def test_catalog_matches_the_real_config_json(model: str, fixture: str) -> None:
    entry, real = catalog.lookup(model), hf(fixture)
    for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size",
              "max_position_embeddings", "mla_latent_dim", "tie_word_embeddings", "intermediate_size",
              "num_experts", "num_experts_per_tok", "moe_intermediate_size", "quantization", "sliding_window",
              "full_attention_layers", "head_dim"):
        assert getattr(entry, f) == getattr(real, f), f
    assert capacity.kv_bytes_per_token(entry, 1) == capacity.kv_bytes_per_token(real, 1)
    assert entry.params_billions == pytest.approx(real.params_billions, rel=0.005)  # model card vs counted


def test_every_gpu_product_has_a_torch_total_below_its_label() -> None:
    assert set(GPUProductName.__args__) == set(gpus.GPU_PRODUCTS)  # type: ignore[attr-defined]
    for p in gpus.GPU_PRODUCTS.values():
        assert 0.3 * GiB < p.memory_bytes - p.torch_total_bytes < 1.0 * GiB, p.key
    assert gpus.lookup("NVIDIA-B200").torch_total_gib == 178.35
    assert capacity.vllm_defaults(gpus.lookup("A100-80GB")) == (256, 2048)  # "a100" in the name: small tier
    assert capacity.vllm_defaults(H100) == (1024, 8192)
    assert capacity.vllm_defaults(gpus.lookup("B200-180GB"), (0, 33)) == (1024, 16384)


def test_multimodal_config_reads_the_text_config_class_defaults_and_vision_tower() -> None:
    gemma3 = hf("gemma-3-27b-it")  # text_config omits vocab_size, max_position_embeddings, the 5:1 pattern
    assert (gemma3.vocab_size, gemma3.max_position_embeddings, gemma3.tie_word_embeddings) == (262208, 131072, True)
    assert (gemma3.sliding_window, gemma3.full_attention_layers) == (1024, 10)
    assert gemma3.params_billions == pytest.approx(27.4, abs=0.1)  # the model card's 27.4B includes SigLIP


def test_startup_log_parser_reads_what_real_logs_print() -> None:
    from oculis_operator import enginelog

    text = ("(EngineCore_DP0 pid=7) INFO 03-01 10:00:00 [core.py:77] Initializing a V1 LLM engine (v0.17.1) with "
            "config: model='Qwen/Qwen3-8B', speculative_config=None, max_seq_len=16384, tensor_parallel_size=2, "
            "quantization=fp8, enforce_eager=False, kv_cache_dtype=fp8_e4m3, device_config=cuda\n"
            "(APIServer pid=1) INFO non-default args: {'model': 'Qwen/Qwen3-8B', 'compilation_config': "
            "CompilationConfig(level=3), 'max_num_seqs': 256}\n"
            "(Worker_TP0 pid=9) INFO Available KV cache memory: 61.2 GiB\n"
            "(EngineCore_DP0 pid=7) INFO GPU KV cache size: 1,234,560 tokens\n")
    log = enginelog.parse(text)
    assert (log.version, log.model, log.tensor_parallel, log.max_model_len) == ((0, 17), "Qwen/Qwen3-8B", 2, 16384)
    assert (log.quantization, log.kv_cache_dtype, log.max_num_seqs) == ("fp8", "fp8_e4m3", 256)
    assert (log.available_kv_gib, log.kv_tokens) == (61.2, 1_234_560)
    v0 = enginelog.parse("INFO distributed_gpu_executor.py:45] # GPU blocks: 507, # CPU blocks: 1024")
    assert v0.kv_tokens == 507 * 16
