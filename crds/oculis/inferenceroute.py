"""InferenceRoute: semantic tiers over GPUUpstreams in the same namespace, escalation and cache.

The spec is the router's route (`oculis.router.RouteBody`): tiers name GPUUpstreams of the route's
namespace. The operator renders the InferenceRoutes that name one ConfigMap (`spec.configMap`), with
the upstreams they use, into that ConfigMap (`oculis-config.yaml`), which the router reloads on change.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from oculis.base import Model
from oculis.router import NAME_PATTERN, RouteBody, SemanticTier
from oculis.upstream import Condition

DEFAULT_CONFIG_MAP = "oculis-router-config"
# A GPUUpstream's name: a DNS-1035 label (its Service must be able to exist), in the route's namespace.
UPSTREAM_REF = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
SAME_NAMESPACE = ("upstreams must be in the route's namespace: name a GPUUpstream of this namespace, "
                  "without a namespace/ prefix")


class RouteTier(SemanticTier):
    """One tier of an InferenceRoute: tried in order, the first whose match holds answers."""

    upstream: str = Field(max_length=63, pattern=UPSTREAM_REF, json_schema_extra={
        "x-kubernetes-validations": [{"rule": "!self.contains('/')", "message": SAME_NAMESPACE}]})
    """GPUUpstream of this namespace that answers (its name, without a namespace)"""

    @field_validator("upstream", mode="before")
    @classmethod
    def _same_namespace(cls, value: Any) -> Any:
        # Before the pattern, which would only say "should match '^[a-z]...'".
        if isinstance(value, str) and "/" in value:
            raise ValueError(SAME_NAMESPACE)
        if isinstance(value, str) and not re.fullmatch(UPSTREAM_REF, value):
            raise ValueError("must be a GPUUpstream name: lowercase letters, digits and '-', starting with a "
                             "letter, at most 63 characters")
        return value


class InferenceRouteSpec(RouteBody):
    """Semantic tiers over GPUUpstreams of this namespace, with escalation and a response cache."""

    tiers: list[RouteTier] = Field(min_length=1, max_length=16)  # type: ignore[assignment]
    """Tiers, cheapest first: the first whose match holds answers; the last catches all"""

    config_map: str = Field(DEFAULT_CONFIG_MAP, pattern=NAME_PATTERN,
                            description="ConfigMap this route is rendered into; it holds only the routes that name it")


class InferenceRouteStatus(Model):
    """What the operator rendered."""

    observed_generation: int | None = None
    """The spec generation last rendered"""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (in the router config, upstreams Ready)"""
    tiers: str | None = Field(None, description="Printer column: tier -> upstream, in order")
    config_map: str | None = None
    """ConfigMap the route was rendered into"""
    config_hash: str | None = None
    """Hash of the rendered router config"""


class InferenceRoute(Model):
    """A route of the Oculis router: the model name clients send, classified per prompt and answered by
    the first of its tiers (GPUUpstreams of this namespace, cheapest first) whose match holds, with
    escalation on low confidence or errors and an optional response cache. The operator renders it
    into the router's ConfigMap (spec.configMap)."""

    api_version: Literal["oculis.dev/v1alpha1"] = "oculis.dev/v1alpha1"
    kind: Literal["InferenceRoute"] = "InferenceRoute"
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    spec: InferenceRouteSpec
