"""Router configuration: upstreams, routes with semantic tiers, escalation and response cache.

The same models are the Python API (`from oculis import Route, SemanticTier, ...`), the body of
`oculis-config.yaml` (snake_case) and the InferenceRoute CRD (camelCase).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from oculis.base import Model, format_errors

Provider = Literal["vllm", "openai", "anthropic", "openai-compatible"]
# Where a hosted provider answers when no base URL is given.
PROVIDER_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com/v1"}
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names each bad field."""


class Pricing(Model):
    input_per_mtok: float = Field(0.0, ge=0, description="Dollars per million prompt tokens")
    output_per_mtok: float = Field(0.0, ge=0, description="Dollars per million completion tokens")
    cached_input_per_mtok: float | None = Field(None, ge=0, description="Dollars per million cached prompt tokens")
    cache_write_per_mtok: float | None = Field(None, ge=0, description="Dollars per million cache-write tokens")


class PromptCache(Model):
    enabled: bool = True
    min_prefix_tokens: int = Field(1024, ge=0, description="OpenAI: prefixes shorter than this are not cached")
    breakpoints: int = Field(4, ge=0, le=4, description="Anthropic: cache_control markers to place (at most 4)")
    ttl: Literal["5m", "1h"] = "5m"


class Upstream(Model):
    name: str = Field(pattern=NAME_PATTERN)
    provider: Provider
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = Field(None, description="Environment variable holding the API key (never logged)")
    pricing: Pricing = Field(default_factory=Pricing)
    prompt_cache: PromptCache | None = None
    revision: str = Field("1", description="Bump when the model behind this upstream changes; part of cache keys")
    timeout_seconds: float = Field(120.0, gt=0, description="Per-attempt timeout of one upstream call")
    anthropic_version: str = Field("2023-06-01", description="Anthropic: the anthropic-version header")
    default_max_tokens: int = Field(1024, ge=1, description="Anthropic: max_tokens when the request sets none")

    @model_validator(mode="after")
    def _reachable(self) -> Upstream:
        if self.provider in ("vllm", "openai-compatible") and not self.base_url:
            raise ValueError(f"upstream {self.name!r}: provider {self.provider} needs base_url (e.g. http://host:8000/v1)")
        return self

    @property
    def url(self) -> str:
        return (self.base_url or PROVIDER_URLS.get(self.provider, "")).rstrip("/")


class TierMatch(Model):
    complexity_below: float | None = Field(None, gt=0, le=1)
    max_prompt_tokens: int | None = Field(None, ge=1)


class SemanticTier(Model):
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    match: TierMatch = Field(default_factory=TierMatch)
    upstream: str = Field(max_length=253)


class Classifier(Model):
    model: str | None = Field(None, description="Classifier to use; empty selects the packaged default")
    cache_ttl_seconds: int = Field(3600, ge=0, description="How long a prompt's score is memoised")
    max_entries: int = Field(100_000, ge=0, description="Bound on memoised scores")


class Escalation(Model):
    enabled: bool = True
    on_low_confidence: bool = True
    confidence_threshold: float = Field(0.6, ge=0, le=1)
    on_upstream_error: bool = True
    max_retries: int = Field(2, ge=0, le=10)


class CacheWhen(Model):
    temperature_below: float | None = Field(0.01, ge=0)


CacheKeyPart = Literal["model", "messages", "temperature", "max_tokens", "tools", "prompt"]


def _default_cache_key() -> list[CacheKeyPart]:
    return ["model", "messages", "temperature"]


class ResponseCache(Model):
    enabled: bool = False
    ttl_seconds: int = Field(3600, ge=1)
    key: list[CacheKeyPart] = Field(default_factory=_default_cache_key)
    max_entries: int = Field(100_000, ge=1)
    only_when: CacheWhen = Field(default_factory=CacheWhen)


class RouteBody(Model):
    """A route without its name: the InferenceRoute's spec (the name comes from metadata)."""

    strategy: Literal["semantic"] = "semantic"
    classifier: Classifier = Field(default_factory=Classifier)
    tiers: list[SemanticTier] = Field(min_length=1, max_length=16)
    escalation: Escalation = Field(default_factory=Escalation)
    cache: ResponseCache = Field(default_factory=ResponseCache)

    @model_validator(mode="after")
    def _tiers_are_usable(self) -> RouteBody:
        names = [t.name for t in self.tiers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tier names must be unique; repeated: {', '.join(dupes)}")
        last = self.tiers[-1]
        if last.match.complexity_below is not None or last.match.max_prompt_tokens is not None:
            raise ValueError(f"the last tier ({last.name!r}) must catch all: give it `match: {{}}`")
        return self


class ServerSettings(Model):
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413")
    cache_backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = Field(None, description="redis://host:port/db for cache_backend: redis")

    @model_validator(mode="after")
    def _redis(self) -> ServerSettings:
        if self.cache_backend == "redis" and not self.redis_url:
            raise ValueError("server.redis_url is required when server.cache_backend is redis")
        return self


class Route(RouteBody):
    name: str = Field(pattern=NAME_PATTERN)


class RouterConfig(Model):
    upstreams: list[Upstream] = Field(min_length=1)
    routes: list[Route] = Field(default_factory=list)
    server: ServerSettings = Field(default_factory=ServerSettings)

    @model_validator(mode="after")
    def _references_resolve(self) -> RouterConfig:
        known = [u.name for u in self.upstreams]
        for kind, names in (("upstream", known), ("route", [r.name for r in self.routes])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind} names must be unique; repeated: {', '.join(dupes)}")
        for i, route in enumerate(self.routes):
            for j, tier in enumerate(route.tiers):
                if tier.upstream not in known:
                    raise ValueError(
                        f"routes[{i}].tiers[{j}].upstream: {tier.upstream!r} is not a declared upstream "
                        f"(declared: {', '.join(known)})"
                    )
        return self

    def upstream(self, name: str) -> Upstream:
        return next(u for u in self.upstreams if u.name == name)

    def to_yaml(self) -> str:
        """This config as an `oculis-config.yaml` (what `oculis serve --config` reads): only the
        fields that were set, so defaults stay defaults and an explicit null stays null."""
        body = self.model_dump(mode="json", exclude_unset=True)
        body["routes"] = [{"name": r.pop("name"), **r} for r in body.get("routes", [])]  # name first, for readers
        return yaml.safe_dump({"oculis": body}, sort_keys=False)

    def route(self, name: str) -> Route:
        for route in self.routes:
            if route.name == name:
                return route
        raise ConfigError(f"unknown route {name!r}; routes in this config: {', '.join(r.name for r in self.routes)}")


def parse_config(text: str, source: str = "<config>") -> RouterConfig:
    """Parse an `oculis-config.yaml` document (root key `oculis`)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("oculis"), dict):
        raise ConfigError(f"{source}: expected a mapping with a top-level `oculis:` key")
    try:
        return RouterConfig.model_validate(doc["oculis"])
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid configuration:\n{format_errors(exc, 'oculis')}") from None


def load_config(path: str | Path) -> RouterConfig:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return parse_config(text, str(path))
