"""The step-time model against its anchors: batch-1 decode of Llama-3.1-8B on an H100 is vLLM's
~7.5 ms (vllm#16937), not the 4.8 ms of a pure roofline; the model scales the way the hardware does."""

from oculis import gpus
from oculis_operator import capacity, catalog
from oculis_sim import steptime

MODEL = catalog.lookup("meta-llama/Llama-3.1-8B-Instruct")


def cost(gpu: str, tp: int = 1) -> steptime.StepCostModel:
    return steptime.cost_model(MODEL, gpus.lookup(gpu), tp, capacity.weights_bytes_per_gpu(MODEL, tp),
                               capacity.kv_bytes_per_token(MODEL, tp))


def decode(c: steptime.StepCostModel, batch: int, ctx: int = 300) -> float:
    return c.step_seconds(0, 0.0, batch, batch * (ctx + 0.5), batch * ctx, batch)


def test_single_stream_decode_matches_vllm_not_the_pure_roofline() -> None:
    itl = decode(cost("H100-80GB"), 1) + steptime.PER_TOKEN_OUTPUT_S
    assert 0.0068 < itl < 0.0080  # measured 133 tok/s = 7.5 ms; pure roofline 16.06 GB / 3.35 TB/s = 4.8 ms


def test_decode_follows_bandwidth_and_prefill_follows_flops() -> None:
    h100, h200, a100 = cost("H100-80GB"), cost("H200-141GB"), cost("A100-80GB")
    assert decode(h200, 1) < decode(h100, 1) < decode(a100, 1)  # 4.8 > 3.35 > 2.04 TB/s
    pf = {n: c.step_seconds(4096, 4096 * 2048, 0, 0.0, 0, 1) for n, c in (("h100", h100), ("h200", h200),
                                                                        ("a100", a100))}
    assert abs(pf["h100"] - pf["h200"]) / pf["h100"] < 0.05  # same Hopper compute die
    assert pf["a100"] > 2 * pf["h100"]  # 312 vs 989 TFLOPS


def test_tensor_parallelism_helps_but_pays_for_its_all_reduces() -> None:
    one, two = decode(cost("H100-80GB", 1), 64), decode(cost("H100-80GB", 2), 64)
    assert one / 2 < two < one


def test_a_bigger_batch_costs_more_per_step_but_less_per_token() -> None:
    c = cost("H100-80GB")
    assert decode(c, 256) > decode(c, 1) and decode(c, 256) / 256 < decode(c, 1) / 10
