"""Which tensor-core rate the simulated step runs at follows the capacity plan's bytes per weight (one
fact): an fp8 checkpoint is fp8 whatever its compute dtype (dtypeBytes) says."""

import pytest

from oculis.gpus import lookup
from oculis_sim import config

CASES = [
    # (model, gpu, tp, --quantization, 8-bit rate?)
    ("deepseek-ai/DeepSeek-V3", "H200-141GB", 8, None, True),  # fp8 checkpoint, dtypeBytes 2
    ("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 1, None, False),
    ("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 1, "fp8", True),
    ("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 1, "awq", False),  # 4-bit weights, 16-bit compute
]


@pytest.mark.parametrize(("model", "gpu", "tp", "quantization", "eight_bit"), CASES)
def test_fp8_compute_rate_follows_the_plans_bytes_per_weight(
        model: str, gpu: str, tp: int, quantization: str | None, eight_bit: bool) -> None:
    s = config.resolve(model, gpu, tp=tp, quantization=quantization)
    target, _ = config.cost_models(s)
    product = lookup(gpu)
    assert target.peak_flops == (product.fp8_tflops if eight_bit else product.bf16_tflops) * 1e12
