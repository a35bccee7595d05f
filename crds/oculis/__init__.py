"""Oculis' one schema: the CRD models, the router configuration and the Python API."""

from oculis.router import (
    CacheWhen,
    Classifier,
    ConfigError,
    Escalation,
    Pricing,
    PromptCache,
    ResponseCache,
    Route,
    RouterConfig,
    SemanticTier,
    ServerSettings,
    TierMatch,
    Timeouts,
    Upstream,
    load_config,
    parse_config,
)

__version__ = "0.1.0"

__all__ = [
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
    "load_config",
    "parse_config",
]
