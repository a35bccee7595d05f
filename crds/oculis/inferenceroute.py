"""InferenceRoute: semantic tiers over GPUUpstreams in the same namespace, escalation and cache.

The spec is the router's route (`oculis.router.RouteBody`): tiers name GPUUpstreams. The operator
renders every InferenceRoute of a namespace, with the upstreams they use, into one router config
ConfigMap (`oculis-config.yaml`), which the router reloads on change.
"""

from __future__ import annotations

from pydantic import Field

from oculis.base import Model
from oculis.router import NAME_PATTERN, RouteBody
from oculis.upstream import Condition

DEFAULT_CONFIG_MAP = "oculis-router-config"


class InferenceRouteSpec(RouteBody):
    """Semantic tiers over GPUUpstreams of this namespace, with escalation and a response cache."""

    config_map: str = Field(DEFAULT_CONFIG_MAP, pattern=NAME_PATTERN,
                            description="ConfigMap the router config is rendered into (shared per namespace)")


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
