"""How long one engine step takes: a roofline over the step's work, corrected by published fits.

Per step (../shared/notes/simulator.md sections 2 and 4):
    memory  = beta3 x weight bytes / BW  +  beta2b x KV bytes read and written / BW
    compute = prefill FLOPs / (peak x MFU_prefill) + decode FLOPs / (peak x MFU_decode)
    step    = max(memory, compute) + beta5 x layers + beta6 x requests + beta7 + TP all-reduce
Weights stream once per step (split by tensor parallelism); KV is read for every token already in
context of every scheduled request. A pure roofline at datasheet peak under-predicts ITL ~2x (BLIS
accuracy study); the corrections below are BLIS `defaults.yaml` trained-physics constants (fit on
H100) and BLIS `hardware_config.json` MFUs per GPU family.
"""

from __future__ import annotations

from dataclasses import dataclass

from oculis.gpus import GPUProduct
from oculis.upstream import ModelConfig

# BLIS trained-physics coefficients (defaults.yaml): beta3 weight-load correction (weights stream at
# ~73 % of peak), beta2b decode-KV correction (~51 %), beta4 TP all-reduce, beta5/6/7 fixed overheads.
BETA_WEIGHTS = 1.36
BETA_KV = 1.95
BETA_TP = 0.75
PER_LAYER_S = 32e-6
PER_REQUEST_S = 4.4e-6
PER_STEP_S = 126e-6
# Request-level overheads (BLIS alpha0/1/2): API server and queue insertion before the scheduler sees
# a request, post-decode finish, and per-output-token streaming/detokenisation.
API_OVERHEAD_S = 15.6e-3
FINISH_OVERHEAD_S = 0.78e-3
PER_TOKEN_OUTPUT_S = 46e-6
# One small-message all-reduce on NVLink (launch + sync; two per layer at TP > 1). An estimate: at 8 us
# the 70B TP4 point (B4) came out 18 % fast and TP2 sped an 8B up 1.5x where vllm#31826's TP2 run shows
# ~6.3 ms ITL (about 1.2x over TP1's ~7.5 ms); 20 us is consistent with both.
ALLREDUCE_LATENCY_S = 20e-6

# Achieved fraction of peak FLOPS per GPU family, (prefill, decode). Prefill: BLIS hardware_config.json
# (Discussion #589). Decode: BLIS ships 0.30 / 0.18 / 0.08 for its pure-roofline mode, which has no
# overhead terms; here the overheads are separate, and at 0.30 a decode batch of ~1000 on an H100 takes
# ~50 ms where vLLM measured a 38 ms mean ITL (vllm#18566, B9), while 0.55 under-predicts the
# 256-sequence points (B3, B4). 0.40 on Hopper and Ampere balances the two (so B3, B4 and B9 are
# in-sample for this one constant); 0.35 on Ada is an assumption (no calibration point).
MFU: dict[str, tuple[float, float]] = {
    "hopper": (0.45, 0.40),
    "blackwell": (0.45, 0.40),  # no calibration point: Hopper's fractions (assumption)
    "ampere": (0.38, 0.40),
    "ada-lovelace": (0.32, 0.35),
}


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Pre-computed constants for one (model, GPU, TP, dtype) so a step costs a few multiplications."""

    weight_time_s: float  # beta3 x weight bytes per GPU / BW
    kv_time_per_token_s: float  # beta2b x KV bytes per token per GPU / BW
    flops_per_token: float  # linear-layer FLOPs per scheduled token, per GPU
    attn_flops_per_pair: float  # attention FLOPs per (query token, context token) pair, per GPU
    peak_flops: float
    mfu_prefill: float
    mfu_decode: float
    fixed_s: float  # beta5 x layers + beta7 (+ all-reduce launches at TP > 1)
    allreduce_per_token_s: float  # beta4 x all-reduce bytes per token / BW

    def step_seconds(self, prefill_tokens: int, prefill_pairs: float, decode_tokens: int, decode_pairs: float,
                     context_tokens: int, requests: int) -> float:
        """prefill_pairs / decode_pairs: sum over scheduled requests of new tokens x (context before + new / 2),
        the attention work; context_tokens: KV tokens already stored that the step's attention reads."""
        if requests == 0:
            return 0.0
        tokens = prefill_tokens + decode_tokens
        memory = self.weight_time_s + self.kv_time_per_token_s * (context_tokens + tokens)
        pf = self.flops_per_token * prefill_tokens + self.attn_flops_per_pair * prefill_pairs
        dc = self.flops_per_token * decode_tokens + self.attn_flops_per_pair * decode_pairs
        compute = pf / (self.peak_flops * self.mfu_prefill) + dc / (self.peak_flops * self.mfu_decode)
        return (max(memory, compute) + self.fixed_s + PER_REQUEST_S * requests
                + self.allreduce_per_token_s * tokens)


def cost_model(model: ModelConfig, gpu: GPUProduct, tp: int, weights_bytes_per_gpu: int, kv_bytes_per_token: int,
               fp8_compute: bool = False) -> StepCostModel:
    """weights_bytes_per_gpu and kv_bytes_per_token come from the operator's capacity plan (one source)."""
    bw = gpu.bandwidth_gb_s * 1e9
    # The input embedding is a gather of a few rows, not a stream: only the rest is read every step.
    embed = model.vocab_size * model.hidden_size * model.dtype_bytes / tp
    streamed = max(weights_bytes_per_gpu - embed, weights_bytes_per_gpu * 0.5)
    params_per_gpu = model.params_billions * 1e9 / tp - model.vocab_size * model.hidden_size / tp
    heads = model.num_attention_heads / tp
    peak = (gpu.fp8_tflops if fp8_compute and gpu.fp8_tflops else gpu.bf16_tflops) * 1e12
    mfu_pf, mfu_dc = MFU.get(gpu.family, MFU["ampere"])
    fixed = PER_LAYER_S * model.num_layers + PER_STEP_S
    allreduce = 0.0
    if tp > 1:
        fixed += 2 * model.num_layers * ALLREDUCE_LATENCY_S
        allreduce = BETA_TP * 2 * model.num_layers * model.hidden_size * 2 * 2 * (tp - 1) / tp / bw
    return StepCostModel(
        weight_time_s=BETA_WEIGHTS * streamed / bw,
        kv_time_per_token_s=BETA_KV * kv_bytes_per_token / bw,
        flops_per_token=2 * params_per_gpu,
        attn_flops_per_pair=4 * model.num_layers * heads * model.head_dim,
        peak_flops=peak, mfu_prefill=mfu_pf, mfu_decode=mfu_dc, fixed_s=fixed, allreduce_per_token_s=allreduce,
    )
