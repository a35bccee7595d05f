"""How long one engine step takes: a roofline over the step's work at the fractions of peak a vLLM
release achieves, plus the CPU work around the kernels (`oculis_sim.versions`, one profile per era).

Per step (../shared/notes/simulator.md sections 2 and 4):
    memory  = streamed weight bytes / (BW x weight_bw)  +  KV bytes read and written / (BW x kv_bw)
    compute = prefill FLOPs / (peak x mfu_prefill) + decode FLOPs / (peak x mfu_decode)
    gpu     = max(memory, compute) + layers x launch (CUDA-graph replay for pure decode steps)
              + 2 x layers x (all-reduce latency + bytes / interconnect)       (TP > 1)
    cpu     = step_cpu + request_cpu x scheduled requests
    step    = max(gpu, cpu) with async scheduling (the CPU work hides under the GPU), else gpu + cpu
Weights stream once per step (split by tensor parallelism; an MoE layer reads only the experts its tokens
route to); KV is read for every token already in context of every scheduled request, so an MHA model with
long outputs is bound by its KV reads, a GQA model by its weights. FLOPs count active parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from oculis.gpus import GPUProduct
from oculis.upstream import ModelConfig
from oculis_sim.versions import V0, VersionProfile

# The request-level overheads of the oldest profile, for callers that have no cost model at hand.
API_OVERHEAD_S = V0.api_s
PER_TOKEN_OUTPUT_S = V0.per_token_s

# GPU-to-GPU bandwidth per direction for the all-reduce bytes (NVIDIA datasheets: H100 SXM NVLink 900 GB/s
# and A100 SXM 600 GB/s bidirectional; L40S/L4 have no NVLink: PCIe Gen4 x16 ~32 GB/s).
INTERCONNECT_BYTES_S = {"hopper": 450e9, "blackwell": 900e9, "ampere": 300e9, "ada-lovelace": 32e9}


@dataclass(frozen=True, slots=True)
class StepCostModel:
    """Pre-computed constants for one (model, GPU, TP, dtype, vLLM era) so a step costs a few multiplications."""

    weight_time_s: float  # streamed dense weights per GPU / achieved BW
    expert_time_s: float  # all routed experts of all MoE layers per GPU / achieved BW (0 for dense models)
    expert_tokens_to_all: float  # routed (token, expert) picks per layer that touch every expert once
    kv_time_per_token_s: float  # KV bytes per token per GPU / achieved BW
    flops_per_token: float  # linear-layer FLOPs per scheduled token, per GPU (active parameters)
    attn_flops_per_pair: float  # attention FLOPs per (query token, context token) pair, per GPU
    peak_flops: float  # the datasheet dense peak the fractions apply to (FP8 rate for 8-bit weights)
    prefill_flops_s: float  # achieved FLOP/s on prefill tokens
    decode_flops_s: float  # achieved FLOP/s on decode tokens
    eager_s: float  # per-step launch cost when a prefill chunk is in the batch
    graph_s: float  # per-step launch cost of a pure decode step (CUDA graph)
    allreduce_per_token_s: float  # all-reduce bytes per token / interconnect
    step_cpu_s: float
    request_cpu_s: float
    overlap: bool
    api_s: float
    finish_s: float
    per_token_s: float
    api_serial_s: float = 0.0  # the API server's CPU work per request, one request at a time (its event loop)
    new_request_cpu_s: float = 0.0  # per request a step schedules for the first time (or resumes after preemption)
    join_cpu_s: float = 0.0  # once per step that some request joins (first scheduled, or resumed)
    batch_change_cpu_s: float = 0.0  # once per step whose persistent batch changed: requests joined or left

    def step_seconds(self, prefill_tokens: int, prefill_pairs: float, decode_tokens: int, decode_pairs: float,
                     context_tokens: int, requests: int, new_requests: int = 0, batch_changed: bool = False) -> float:
        """prefill_pairs / decode_pairs: sum over scheduled requests of new tokens x (context before + new / 2),
        the attention work; context_tokens: KV tokens already stored that the step's attention reads;
        new_requests: how many of the requests this step schedules for the first time (since a preemption);
        batch_changed: requests joined the batch or left it (finished in the step before, preempted in this)."""
        if requests == 0:
            return 0.0
        tokens = prefill_tokens + decode_tokens
        weights = self.weight_time_s
        if self.expert_time_s:
            weights += self.expert_time_s * min(1.0, tokens / self.expert_tokens_to_all)
        memory = weights + self.kv_time_per_token_s * (context_tokens + tokens)
        compute = ((self.flops_per_token * prefill_tokens + self.attn_flops_per_pair * prefill_pairs)
                   / self.prefill_flops_s
                   + (self.flops_per_token * decode_tokens + self.attn_flops_per_pair * decode_pairs)
                   / self.decode_flops_s)
        gpu = (max(memory, compute) + (self.eager_s if prefill_tokens else self.graph_s)
               + self.allreduce_per_token_s * tokens)
        cpu = self.step_cpu_s + self.request_cpu_s * requests + self.new_request_cpu_s * new_requests
        if batch_changed:
            cpu += self.batch_change_cpu_s
        if new_requests:
            cpu += self.join_cpu_s
        return max(gpu, cpu) if self.overlap else gpu + cpu


def cost_model(model: ModelConfig, gpu: GPUProduct, tp: int, weights_bytes_per_gpu: int, kv_bytes_per_token: int,
               fp8_compute: bool = False, version: VersionProfile = V0) -> StepCostModel:
    """weights_bytes_per_gpu and kv_bytes_per_token come from the operator's capacity plan (one source)."""
    v = version
    bw = gpu.bandwidth_gb_s * 1e9
    h, layers = model.hidden_size, model.num_layers
    # The input embedding is a gather of a few rows, not a stream: only the rest is read every step.
    embed = model.vocab_size * h * model.dtype_bytes / tp
    streamed = max(weights_bytes_per_gpu - embed, weights_bytes_per_gpu * 0.5)
    params = model.params_billions * 1e9
    active = params
    expert_bytes = 0.0
    to_all = 1.0
    if model.num_experts and model.num_experts_per_tok and model.moe_intermediate_size:
        per_expert = 3 * h * model.moe_intermediate_size  # gate, up, down
        experts = per_expert * model.num_experts * layers
        active = params - experts + per_expert * model.num_experts_per_tok * layers
        expert_bytes = streamed * experts / params
        streamed -= expert_bytes
        to_all = model.num_experts / model.num_experts_per_tok
    params_per_gpu = (active - model.vocab_size * h) / tp
    heads = model.num_attention_heads / tp
    peak = (gpu.fp8_tflops if fp8_compute and gpu.fp8_tflops else gpu.bf16_tflops) * 1e12
    allreduce = 0.0
    allreduce_fixed = 0.0
    if tp > 1:
        allreduce_fixed = 2 * layers * v.allreduce_s * (tp - 1)  # latency grows with the peers synchronised
        ring = 2 * (tp - 1) / tp  # bytes each GPU sends per byte reduced (ring all-reduce)
        link = INTERCONNECT_BYTES_S.get(gpu.family, INTERCONNECT_BYTES_S["ada-lovelace"])
        allreduce = 2 * layers * h * 2 * ring / link
    return StepCostModel(
        weight_time_s=streamed / (bw * v.weight_bw), expert_time_s=expert_bytes / (bw * v.weight_bw),
        expert_tokens_to_all=to_all, kv_time_per_token_s=kv_bytes_per_token / (bw * v.kv_bw),
        flops_per_token=2 * params_per_gpu, attn_flops_per_pair=4 * layers * heads * model.head_dim,
        peak_flops=peak, prefill_flops_s=peak * v.mfu_prefill, decode_flops_s=peak * v.mfu_decode,
        eager_s=layers * v.layer_launch_s + allreduce_fixed, graph_s=layers * v.graph_layer_s + allreduce_fixed,
        allreduce_per_token_s=allreduce, step_cpu_s=v.step_cpu_s, request_cpu_s=v.request_cpu_s, overlap=v.overlap,
        api_s=v.api_s, finish_s=v.finish_s, per_token_s=v.per_token_s,
    )


@dataclass(frozen=True, slots=True)
class FittedSteps:
    """A step-time model fitted on the machine itself (e.g. vLLM's CPU backend, where no datasheet roofline
    applies): step = step_s + request_s x requests + prefill_token_s x prefill tokens + decode_token_s x
    decode tokens + pair_s x attention pairs + new_request_s x requests scheduled for the first time +
    join_s when some joined + batch_change_s when requests joined or left the batch, CPU and compute serial.
    Loaded from `--step-profile FILE`; `bench/cpu_profile.py` fits one from an engine's own calibration runs."""

    step_s: float
    request_s: float
    prefill_token_s: float
    decode_token_s: float
    pair_s: float = 0.0
    api_s: float = 0.0
    finish_s: float = 0.0
    per_token_s: float = 0.0
    api_serial_s: float = 0.0  # per request, serialised in the API server (bursts wait in line)
    new_request_s: float = 0.0  # per request in its first step (or its first after a preemption)
    join_s: float = 0.0  # once per step that some request joins
    # once per step whose persistent batch changed (vLLM's model runner then condenses the batch and rebuilds
    # its sampling metadata): a request joined, or left (finished in the step before, preempted in this one)
    batch_change_s: float = 0.0
    source: str = ""

    def cost_model(self) -> StepCostModel:
        pf = 1 / self.prefill_token_s if self.prefill_token_s > 0 else 1e30
        dc = 1 / self.decode_token_s if self.decode_token_s > 0 else 1e30
        return StepCostModel(
            weight_time_s=0.0, expert_time_s=0.0, expert_tokens_to_all=1.0, kv_time_per_token_s=0.0,
            flops_per_token=1.0, attn_flops_per_pair=self.pair_s * pf, peak_flops=pf, prefill_flops_s=pf,
            decode_flops_s=dc, eager_s=0.0, graph_s=0.0, allreduce_per_token_s=0.0, step_cpu_s=self.step_s,
            request_cpu_s=self.request_s, overlap=False, api_s=self.api_s, finish_s=self.finish_s,
            per_token_s=self.per_token_s, api_serial_s=self.api_serial_s, new_request_cpu_s=self.new_request_s,
            join_cpu_s=self.join_s, batch_change_cpu_s=self.batch_change_s)
