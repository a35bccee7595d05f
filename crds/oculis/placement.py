"""Where a self-hosted GPUUpstream's pods run: the GPU product and count, tolerations, and the CPU and
memory of the engine container.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from oculis.base import Model
from oculis.formats import LABEL_VALUE, LABEL_VALUE_RULE, QUANTITY, key_problem, quantity
from oculis.gpus import GPU_PRODUCTS

GPUProductName = Literal["A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe-80GB", "H100-NVL-94GB", "H200-141GB",
                         "L4-24GB", "L40S-48GB", "A10G-24GB", "B200-180GB"]
assert set(GPUProductName.__args__) == set(GPU_PRODUCTS)  # type: ignore[attr-defined]


class GPU(Model):
    """The GPUs each replica gets: product and count (the tensor-parallel size)."""

    product: GPUProductName = Field(description="GPU model; mapped to the nvidia.com/gpu.product node label")
    count: int = Field(1, ge=1, le=16, description="GPUs per replica = tensor-parallel size")


class Toleration(Model):
    """A pod toleration, as in the core API; the GPU taint nvidia.com/gpu is always tolerated."""

    key: str | None = None
    """Taint key to tolerate"""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal"""
    value: str | None = None
    """Taint value (with Equal)"""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty matches all"""

    @model_validator(mode="after")
    def _as_the_api_server(self) -> Toleration:
        # The pod template's own rules: without them a spec passed `kubectl apply` and its Deployment
        # was refused later (found by e2e/tests/test_schema_dry_run.py).
        if self.key and (why := key_problem(self.key)):
            raise ValueError(f"tolerations[].key: {why}")
        if not self.key and self.operator != "Exists":
            raise ValueError("tolerations[]: a toleration without `key` needs `operator: Exists` (it then "
                             "tolerates every taint)")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"tolerations[].value: must be empty with `operator: Exists` (got {self.value!r})")
        if self.value and not re.fullmatch(LABEL_VALUE, self.value):
            raise ValueError(f"tolerations[].value: {self.value!r} {LABEL_VALUE_RULE}")
        return self


class ResourceList(Model):
    """CPU and memory quantities (GPUs come from `gpu`)."""

    cpu: str | None = Field(None, pattern=QUANTITY)
    """CPU quantity, e.g. 8 or 500m"""
    memory: str | None = Field(None, pattern=QUANTITY)
    """Memory quantity, e.g. 64Gi"""


class Resources(Model):
    """CPU and memory for the engine container; GPU limits are set from `gpu`."""

    requests: ResourceList | None = None
    """Guaranteed CPU and memory"""
    limits: ResourceList | None = None
    """CPU and memory ceilings"""

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for kind in ("cpu", "memory"):
            want = getattr(self.requests, kind, None) if self.requests else None
            cap = getattr(self.limits, kind, None) if self.limits else None
            if want and cap and quantity(want) > quantity(cap):
                raise ValueError(f"resources.requests.{kind} {want} is more than resources.limits.{kind} {cap}; "
                                 "a request must be at most its limit")
        return self
