"""The capacity plan counts LoRA serving: vLLM's preallocated adapter buffers (maxLoras x maxLoraRank over
q,k,v,o,gate,up,down) and the shrink step's buffer; an adapter change that does not fit is refused."""

from __future__ import annotations

from typing import Any

from oculis import gpus
from oculis.engine import Engine
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import capacity, capacity_check, catalog, lora_capacity

MiB = 1024**2
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def test_adapter_buffers_by_hand_for_llama_8b() -> None:
    m = catalog.lookup(LLAMA_8B)  # h 4096, 32 heads x 128, 8 kv heads, intermediate 14336, 32 layers
    # per layer, rank 16, TP 1: lora_a of q,k,v,gate,up (input 4096) = 5 x 4096, lora_b of o,down (output 4096)
    # = 2 x 4096 -> 28672; lora_b of q (4096), k, v (1024 each), gate, up (14336 each), lora_a of o (4096),
    # down (14336) -> 53248; (28672 + 53248) x 16 x 32 layers = 41,943,040 elements = 80 MiB in bf16
    assert lora_capacity.lora_weight_elements_per_slot(m, 1, 16) == 41_943_040
    assert lora_capacity.lora_weight_bytes(m, 1, Engine()) == 80 * MiB  # vLLM defaults: 1 slot, rank 16
    assert lora_capacity.lora_weight_bytes(m, 1, Engine(max_loras=4, max_lora_rank=64)) == 1280 * MiB
    # TP 2 splits only the 53248 side: (28672 + 26624) x 16 x 32 x 2 B = 54 MiB
    assert lora_capacity.lora_weight_bytes(m, 2, Engine()) == 54 * MiB
    # shrink buffer: 3 slices x 8192 tokens x rank 64 x 4 B = 6 MiB
    assert lora_capacity.lora_activation_bytes(Engine(max_lora_rank=64), 8192) == 6 * MiB


def test_the_plan_adds_them_to_weights_and_overhead() -> None:
    m = catalog.lookup(LLAMA_8B)
    gpu = gpus.lookup("H100-80GB")
    e = Engine(max_loras=4, max_lora_rank=64, max_num_batched_tokens=8192)
    base, lora = capacity.plan(m, gpu, 1, e), capacity.plan(m, gpu, 1, e, lora=True)
    assert lora.weights_bytes_per_gpu - base.weights_bytes_per_gpu == 1280 * MiB
    assert lora.activation_bytes - base.activation_bytes == 6 * MiB
    assert lora.kv_budget_bytes == base.kv_budget_bytes - 1286 * MiB
    assert any("4 adapter slots at rank 64 take 1.25 GiB/GPU" in n for n in lora.notes)


def spec(**engine: Any) -> GPUUpstreamSpec:
    return GPUUpstreamSpec.model_validate({
        "provider": "vllm", "model": LLAMA_8B, "gpu": {"product": "L4-24GB"},
        "engine": {"maxModelLen": 8192, "maxNumSeqs": 8, **engine},
        "adapters": [{"name": "sql", "source": {"path": "/a"}}] if engine else None})


def test_an_adapter_change_that_does_not_fit_is_refused_before_any_restart() -> None:
    fits = capacity_check.check(spec())
    assert isinstance(fits, capacity.Plan) and fits.fits
    small = capacity_check.check(spec(maxLoras=1, maxLoraRank=16))
    assert isinstance(small, capacity.Plan) and small.fits
    big = capacity_check.check(spec(maxLoras=8, maxLoraRank=256))  # 8 x 16 x 80 MiB = 10 GiB on a 24 GB L4
    assert isinstance(big, capacity.Plan) and not big.fits
    assert capacity.KV_EXHAUSTED in big.message
