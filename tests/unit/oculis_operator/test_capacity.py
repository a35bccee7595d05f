"""Capacity math pinned against hand-computed cases from the vLLM facts
(../shared/notes/vllm-engine.md sections 2 and 7)."""

from __future__ import annotations

import pytest

from oculis import gpus
from oculis.engine import Engine, Speculative, Traffic
from oculis_operator import capacity, catalog

L8, L70 = "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"
L1 = "meta-llama/Llama-3.2-1B-Instruct"
H100, A100_40 = gpus.lookup("H100-80GB"), gpus.lookup("A100-40GB")


@pytest.mark.parametrize(
    ("model", "tp", "dtype", "expected"),
    [
        (L8, 1, "auto", 131072),  # 2 x 32 layers x 8 kv heads x 128 x 2 bytes
        (L8, 1, "fp8", 65536),  # fp8 halves
        (L70, 4, "auto", 81920),  # 2 x 80 x (8 / 4) x 128 x 2: GQA heads split by TP
        (L70, 16, "auto", 40960),  # TP beyond the kv heads replicates: max(1, 8 // 16) = 1
        ("deepseek-ai/DeepSeek-V3", 8, "auto", 70272),  # MLA: 61 x 576 x 2, not divided by TP
        ("deepseek-ai/DeepSeek-V3", 1, "auto", 70272),
        ("Qwen/Qwen3-8B", 1, "auto", 147456),  # 144 KiB
    ],
)
def test_kv_bytes_per_token(model: str, tp: int, dtype: str, expected: int) -> None:
    assert capacity.kv_bytes_per_token(catalog.lookup(model), tp, dtype) == expected


def test_weights_split_by_tensor_parallelism_and_quantization() -> None:
    m = catalog.lookup(L70)
    rope = 131072 * 128 * 2  # the rotary cos/sin cache, replicated on every GPU
    vocab = 2 * 128256 * 8192  # embeddings and lm_head: 16-bit whatever the linear layers are
    assert capacity.weights_bytes_per_gpu(m, 4) == round(70.55e9 * 2 / 4) + rope
    assert capacity.weights_bytes_per_gpu(m, 4, "fp8") == round(((70.55e9 - vocab) + vocab * 2) / 4) + rope
    awq = capacity.weights_bytes_per_gpu(m, 4, "awq")
    assert round(((70.55e9 - vocab) * 0.5 + vocab * 2) / 4) + rope < awq < capacity.weights_bytes_per_gpu(m, 4, "fp8")


def test_llama_8b_on_h100_fits_with_hundreds_of_thousands_of_tokens() -> None:
    p = capacity.plan(catalog.lookup(L8), H100, 1)
    assert p.fits and p.error_code is None
    # (81559 MiB x 0.92 - 16.06 GB weights - overheads) / 128 KiB, close to the note's ~440k estimate
    assert 400_000 < p.kv_cache_tokens < 480_000 and p.kv_cache_tokens % capacity.BLOCK == 0
    assert p.max_concurrency == p.kv_cache_tokens // 1280


def test_one_sequence_that_cannot_fit_is_refused_with_the_safe_values() -> None:
    p = capacity.plan(catalog.lookup(L8), A100_40, 1, Engine(max_model_len=131072, gpu_memory_utilization=0.5))
    assert not p.fits and p.error_code == capacity.KV_EXHAUSTED and p.refuse_at_admission
    assert f"largest safe maxModelLen is {p.kv_cache_tokens}" in p.message
    assert "ERR_OCULIS_KV_CACHE_EXHAUSTED" in p.message


def test_weights_that_cannot_fit_are_refused() -> None:
    p = capacity.plan(catalog.lookup(L70), H100, 1)
    assert not p.fits and p.refuse_at_admission and "weights and runtime overhead do not fit" in p.message


def test_preemption_storm_is_reported_but_not_an_admission_refusal() -> None:
    p = capacity.plan(catalog.lookup(L8), H100, 1, Engine(max_model_len=8192, max_num_seqs=1000),
                      Traffic(avg_prompt_tokens=4000, avg_output_tokens=1000))
    assert not p.fits and not p.refuse_at_admission
    assert p.safe_max_num_seqs == p.kv_cache_tokens // 5000
    assert f"largest safe maxNumSeqs is {p.safe_max_num_seqs}" in p.message and "preemption storm" in p.message


def test_fp8_kv_doubles_the_tokens() -> None:
    base = capacity.plan(catalog.lookup(L8), H100, 1, Engine(max_model_len=8192))
    fp8 = capacity.plan(catalog.lookup(L8), H100, 1, Engine(max_model_len=8192, kv_cache_dtype="fp8"))
    assert abs(fp8.kv_cache_tokens - 2 * base.kv_cache_tokens) <= 2 * capacity.BLOCK


def test_draft_model_layers_and_weights_are_added() -> None:
    eng = Engine(max_model_len=8192, speculative=Speculative(draft_model=L1))
    p = capacity.plan(catalog.lookup(L8), H100, 1, eng, draft=catalog.lookup(L1))
    assert p.kv_bytes_per_token == 131072 + 32768
    assert p.weights_bytes_per_gpu == (capacity.weights_bytes_per_gpu(catalog.lookup(L8), 1)
                                       + capacity.weights_bytes_per_gpu(catalog.lookup(L1), 1))


def test_tensor_parallel_must_divide_heads() -> None:
    p = capacity.plan(catalog.lookup("Qwen/Qwen2.5-7B-Instruct"), H100, 8)  # 28 heads
    assert not p.fits and p.error_code == capacity.TP_MISMATCH and "must divide" in p.message


def test_tokenizer_mismatch() -> None:
    msg = capacity.draft_mismatch(catalog.lookup("Qwen/Qwen2.5-7B-Instruct"), catalog.lookup(L1), "qwen", "llama")
    assert msg and msg.startswith("ERR_OCULIS_TOKENIZER_MISMATCH") and "152064" in msg
    assert capacity.draft_mismatch(catalog.lookup(L8), catalog.lookup(L1), "a", "b") is None


def test_profiles_set_engine_defaults() -> None:
    m = catalog.lookup(L8)
    assert capacity.resolve_engine(None, Traffic(profile="batch"), m) == (131072, 256, 16384, 3072)
    assert capacity.resolve_engine(Engine(max_num_seqs=10), Traffic(profile="rag"), m)[1:3] == (10, 8192)


def test_unknown_model_names_the_fix() -> None:
    with pytest.raises(KeyError, match=r"add spec\.modelConfig"):
        catalog.lookup("acme/secret-model")


def test_admission_refuses_a_model_outside_the_catalog_without_model_config() -> None:
    from oculis_operator.admission import admission_verdict

    spec = {"provider": "vllm", "model": "acme/unknown", "gpu": {"product": "H100-80GB", "count": 1}}
    refusal = admission_verdict(spec)
    assert refusal is not None and "ERR_OCULIS_UNKNOWN_MODEL" in refusal and "spec.modelConfig" in refusal
    inline = {"paramsBillions": 8.03, "numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 8,
              "headDim": 128, "vocabSize": 128256, "maxPositionEmbeddings": 131072}
    assert admission_verdict({**spec, "modelConfig": inline}) is None
    assert admission_verdict({"provider": "openai", "model": "anything"}) is None  # external: no catalog
