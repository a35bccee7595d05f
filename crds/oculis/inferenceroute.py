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
    config_map: str = Field(DEFAULT_CONFIG_MAP, pattern=NAME_PATTERN,
                            description="ConfigMap the router config is rendered into (shared per namespace)")


class InferenceRouteStatus(Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    tiers: str | None = Field(None, description="Printer column: tier -> upstream, in order")
    config_map: str | None = None
    config_hash: str | None = None
