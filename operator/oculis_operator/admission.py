"""What the validating webhook refuses at apply time: a spec whose single `maxModelLen` sequence or
weights cannot fit, a draft model with another vocabulary, a tensor-parallel size that does not
divide the heads, a model (or draft model) outside the catalog without `modelConfig`, a name no
Service can carry (the CRD's CEL rule says the same; this covers a CRD applied before it). (A
preemption-storm plan is admitted and reported in status instead: traffic may differ from the plan.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import rollout
from oculis_operator.capacity_check import check, unhostable
from oculis_operator.reconcile import invalid_name


def admission_verdict(spec_body: dict[str, Any], name: str | None = None) -> str | None:
    if name and (bad := invalid_name(name)):
        return bad
    try:
        spec = GPUUpstreamSpec.model_validate(spec_body)
    except ValidationError as exc:
        return format_errors(exc, "spec").replace("\n", "; ")
    if not spec.self_hosted:
        return None
    verdict = check(spec)
    if isinstance(verdict, tuple):  # a config.json in a ConfigMap is read (and judged) by the reconcile
        return None if verdict[0] == "ModelConfigPending" else verdict[1]
    return verdict.message if verdict.refuse_at_admission else None


def admission_warning(spec_body: dict[str, Any], pool: Callable[[str], rollout.Pool]) -> str | None:
    """A warning shown by kubectl apply (not a refusal: a node pool may scale up from zero) when no node
    of the product can host a replica, or the replicas exceed what its nodes hold."""
    try:
        spec = GPUUpstreamSpec.model_validate(spec_body)
    except ValidationError:
        return None
    if not spec.self_hosted or spec.gpu is None:
        return None
    problem = unhostable(spec, pool(gpus.lookup(spec.gpu.product).gfd_product))
    return f"{problem[0]}: {problem[1]}" if problem else None
