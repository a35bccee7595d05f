"""Oculis engine simulator: a GPU-free stand-in for a vLLM V1 engine.

One discrete-event core (`engine`) on a virtual clock, driven by `replay` (a workload in simulated time)
or by `server` (an OpenAI-compatible server on the wall clock). Everything it reports is simulated.
"""

FINGERPRINT = "oculis-simulator"
VLLM_VERSION = "0.32.0"  # the vLLM release whose API, metrics and flags the simulator answers with
