"""Oculis' one schema: the CRD models, the router configuration and the Python API."""

from oculis.router import (
    AnswerCheck,
    BatchSettings,
    CacheWhen,
    Classifier,
    ConfigError,
    Escalation,
    ResponseCache,
    Route,
    RouterConfig,
    SemanticTier,
    ServerSettings,
    TierMatch,
    Verifier,
    load_config,
    parse_config,
)
from oculis.router_upstream import Pricing, PromptCache, Timeouts, Upstream

__version__ = "0.1.0"

__all__ = [
    "AnswerCheck",
    "BatchSettings",
    "CacheWhen",
    "Classifier",
    "ConfigError",
    "Escalation",
    "Pricing",
    "PromptCache",
    "ResponseCache",
    "Route",
    "RouterConfig",
    "SemanticTier",
    "ServerSettings",
    "TierMatch",
    "Timeouts",
    "Upstream",
    "Verifier",
    "load_config",
    "parse_config",
]
