"""Who may call a self-hosted engine: the facts the operator, the router, the chart and the simulator
share about the engine's API key.

Each self-hosted GPUUpstream's engine gets a random API key, generated once by the operator and kept in
the namespace's Secret `oculis-engine-keys` under the upstream's name. vLLM reads it from VLLM_API_KEY
(env from that Secret key, never in the argv: an argv is visible in `ps` and in the pod spec) and then
refuses every /v1 call without `Authorization: Bearer <key>`, adapter loading included, while /health
and /metrics stay open for probes and scrapes. The router reads it from the same Secret mounted at
ENGINE_KEYS_DIR (a directory mount: kubelet updates it, so an upstream created later needs no router
restart); the operator's adapter sync reads it from the Secret through the API.

One Secret per namespace rather than one per upstream: the router pod can mount a Secret only by a name
fixed when its Deployment is written, and upstreams come and go after that.
"""

from __future__ import annotations

from pydantic import Field

from oculis.base import Model

ENGINE_KEYS_SECRET = "oculis-engine-keys"  # per namespace: one data key per self-hosted upstream (its name)
ENGINE_KEYS_DIR = "/etc/oculis-engine-keys"  # where the router pod mounts it (the chart) and reads each key
ENGINE_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable (vllm/envs.py), the same as `--api-key`
KEY_BYTES = 32  # secrets.token_urlsafe(32): 256 bits


class Access(Model):
    """Self-hosted: who may call the engine."""

    api_key: bool = Field(True, description="The engine refuses /v1 calls (requests and LoRA adapter loads) "
                          f"without its API key, which the operator generates once into the Secret "
                          f"{ENGINE_KEYS_SECRET} (key: this upstream's name) and the router and the operator "
                          "send; /health and /metrics stay open. false: anyone who reaches the engine's port "
                          "may call it (the NetworkPolicy still limits who reaches it)")
