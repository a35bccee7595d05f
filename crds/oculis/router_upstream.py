"""The router configuration's upstreams: a model the router can call, its prices, timeouts, canary
revision and replicas (`oculis-config.yaml`'s `upstreams`; the operator renders one per GPUUpstream)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from oculis.adapters import AdapterName
from oculis.base import NAME_PATTERN as NAME_PATTERN  # re-exported: the name rule's long-standing home
from oculis.base import Model

Provider = Literal["vllm", "openai", "anthropic", "openai-compatible"]
# Where a hosted provider answers when no base URL is given.
PROVIDER_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com/v1"}

class Pricing(Model):
    """Dollars per million tokens, for the router's cost metrics."""

    input_per_mtok: float = Field(0.0, ge=0, description="Dollars per million prompt tokens")
    output_per_mtok: float = Field(0.0, ge=0, description="Dollars per million completion tokens")
    cached_input_per_mtok: float | None = Field(None, ge=0, description="Dollars per million cached prompt tokens")
    cache_write_per_mtok: float | None = Field(None, ge=0, description="Dollars per million cache-write tokens")


class PromptCache(Model):
    """Provider prompt caching."""

    enabled: bool = True
    """Place cache markers / count cached tokens"""
    min_prefix_tokens: int = Field(1024, ge=0, description="OpenAI: prefixes shorter than this are not cached")
    breakpoints: int = Field(4, ge=0, le=4, description="Anthropic: cache_control markers to place (at most 4)")
    ttl: Literal["5m", "1h"] = "5m"
    """Anthropic: cache lifetime, 5m or 1h"""


# Defaults of `Timeouts` (seconds), used where neither the tier nor the upstream sets one.
DEFAULT_CONNECT_SECONDS = 10.0
DEFAULT_FIRST_BYTE_SECONDS = 120.0
DEFAULT_IDLE_SECONDS = 60.0


class Timeouts(Model):
    """How long the router waits on an upstream, per attempt. There is no cap on a whole generation:
    a stream that keeps sending chunks is never cut. Unset fields inherit (tier, then upstream, then
    the default)."""

    connect_seconds: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Opening the connection (TCP and TLS); default 10"""
    first_byte_seconds: float | None = Field(None, gt=0, allow_inf_nan=False)
    """From sending the request to the first byte of the answer: a stream's first chunk, or a non-streamed
    answer's headers (so for those it bounds the whole generation); default 120"""
    idle_seconds: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Longest silence between two reads once the answer has started (between stream chunks); default 60"""


class CanaryRevision(Model):
    """A second revision of the same upstream (a canary of an engine change) taking a share of its
    requests. Rendered by the operator while a GPUUpstream's canary is analysed."""

    base_url: str = Field(min_length=1, description="Base URL of the canary revision (e.g. "
                          "http://llama-vllm-canary.ns.svc:8000/v1)")
    percent: int = Field(ge=1, le=99, description="Share of the upstream's requests sent to the canary, 1-99 "
                         "(each request is drawn at random; a failed canary attempt is retried on the stable one)")


# How the router picks the replica of a self-hosted upstream (oculis_router.picking, one name each).
PickerName = Literal["random", "round-robin", "least-loaded", "prefix", "kv-events"]
# The default: what bench/endpoint_picking.py shows best where there is something to win (shared
# prefixes under KV pressure) and within a few % of the best where there is not.
DEFAULT_PICKER: PickerName = "prefix"
EXTERNAL_PROVIDERS = ("openai", "anthropic")
# The ZMQ port of an engine pod's KV-event publisher: the operator renders `--kv-events-config` with it and
# the router (kv-events picker) subscribes to it on each Ready pod.
KV_EVENTS_PORT = 5557


class Endpoint(Model):
    """One replica of an upstream outside Kubernetes: its base URL, and where it publishes KV events."""

    url: str = Field(min_length=1, description="Base URL of this replica (e.g. http://10.0.0.7:8000/v1)")
    kv_events: str | None = Field(None, min_length=1, description="Its vLLM KV-event ZMQ publisher "
                                  "(--kv-events-config endpoint as seen from the router, e.g. tcp://10.0.0.7:5557)")

    @field_validator("kv_events")
    @classmethod
    def _zmq_address(cls, value: str | None) -> str | None:
        if value is not None and (problem := _zmq_problem(value)):
            raise ValueError(f"kv_events: {problem}")
        return value


def _zmq_problem(value: Any) -> str | None:
    # Without its transport ZMQ refuses the address in the subscriber's task, which then reads as a silent engine.
    if isinstance(value, str) and value.partition("://")[0] not in ("tcp", "ipc"):
        return f"{value!r} is not a ZMQ address; give the engine's publisher with its transport, e.g. tcp://10.0.0.7:5557"
    return None


def _http_url(value: str) -> bool:
    head, sep, rest = value.partition("://")
    return bool(sep) and head.lower() in ("http", "https") and bool(rest.split("/", 1)[0])


class Upstream(Model):
    """A model the router can call."""

    name: str = Field(pattern=NAME_PATTERN)
    """Name routes and requests use"""
    provider: Provider
    """vllm, openai, anthropic or openai-compatible"""
    base_url: str | None = None
    """Base URL of the OpenAI-style API (default for openai/anthropic: their public API)"""
    model: str | None = None
    """Model id sent upstream"""
    api_key_env: str | None = Field(None, description="Environment variable holding the API key (never logged)")
    api_key_file: str | None = Field(None, min_length=1, description="File holding the API key (never logged), "
                                     "re-read on every call (a mounted Secret's file changes in place); a "
                                     "relative path is taken from the router's --engine-keys-dir (default "
                                     "/etc/oculis-engine-keys, where the chart mounts the Secret "
                                     "oculis-engine-keys). The operator names each self-hosted upstream's key so")
    pricing: Pricing = Field(default_factory=Pricing)
    """Dollars per million tokens"""
    prompt_cache: PromptCache | None = None
    """Provider prompt caching"""
    revision: str = Field("1", description="Bump when the model behind this upstream changes; part of cache keys")
    timeouts: Timeouts | None = None
    """Connect, first-byte and idle timeouts of each call"""
    timeout_seconds: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="Deprecated: the old name of timeouts.first_byte_seconds (it never capped a whole stream)")
    anthropic_version: str = Field("2023-06-01", description="Anthropic: the anthropic-version header")
    default_max_tokens: int = Field(1024, ge=1, description="Anthropic: max_tokens when the request sets none")
    scaled_to_zero: bool = Field(False, description="Rendered by the operator for an autoscaled upstream with no "
                                 "replica: a route's tier on it applies the route's cold_start (its demand is "
                                 "counted, which wakes it)")
    canary: CanaryRevision | None = None
    """A canary revision taking `percent` of this upstream's requests (x-oculis-revision says which answered)"""
    endpoints: list[str | Endpoint] | None = Field(None, min_length=1, description="Replicas of this one "
                                                   "model outside Kubernetes (base URLs, or {url, kv_events}): "
                                                   "the router picks one per request (picker); in a cluster it "
                                                   "finds the Ready pods itself")
    adapters: list[AdapterName] | None = Field(
        None, description="Self-hosted: LoRA adapters the engine serves beside the base model (vLLM model names); "
        "tiers name them in `adapter`, requests as `<route or upstream>/<adapter>`")
    picker: PickerName | None = Field(None, description="How a replica is picked per request: random, round-robin, "
                                      f"least-loaded, prefix or kv-events (default {DEFAULT_PICKER}); "
                                      "self-hosted upstreams only")
    priority_scheduling: bool = Field(False, description="Self-hosted: the engine runs vLLM's --scheduling-policy "
                                      "priority (a GPUUpstream's engine.schedulerPolicy: priority); the router then "
                                      "sends each request's flow-control priority as vLLM's `priority` field, so a "
                                      "batch request already running yields to interactive ones inside the engine")
    tokenizer: str | None = Field(None, min_length=1, description="Self-hosted: the model's tokenizer as a local "
                                  "absolute path (its directory with tokenizer.json and tokenizer_config.json / "
                                  "chat_template.jinja, or the tokenizer.json): the prefix pickers then hash the "
                                  "prompt's real token ids, chat template applied as vLLM does, so kv-events "
                                  "matches a real engine's KV events; without it they hash the prompt's text")

    @field_validator("endpoints", mode="before")
    @classmethod
    def _endpoint_urls(cls, value: Any) -> Any:
        # One line naming the entry: pydantic's own error for a str | Endpoint union is two paragraphs.
        for i, e in enumerate(value if isinstance(value, list) else []):
            url = e.get("url") if isinstance(e, dict) else e
            if isinstance(url, str) and not _http_url(url):
                raise ValueError(f"endpoints[{i}]: {url!r} is not an http(s) URL; give the replica's base URL, "
                                 "e.g. http://10.0.0.7:8000/v1")
            if isinstance(e, dict) and (problem := _zmq_problem(e.get("kv_events"))):
                raise ValueError(f"endpoints[{i}].kv_events: {problem}")
        # The router keys replicas by URL (a trailing '/' aside), so a repeated one would be merged into one
        # replica silently: a copy-paste typo leaves the fleet a replica short (QA3 Part 2 #5).
        seen: dict[str, int] = {}
        for i, e in enumerate(value if isinstance(value, list) else []):
            url = e.get("url") if isinstance(e, dict) else e
            if not isinstance(url, str):
                continue
            key = url.rstrip("/")
            if key in seen:
                raise ValueError(f"endpoints[{i}]: {url!r} repeats endpoints[{seen[key]}]; list each replica once "
                                 "(a second engine needs its own host or port)")
            seen[key] = i
        return value

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapter_names(cls, value: Any) -> Any:
        # A GPUUpstream's adapters are objects ({name, source, rank}); the router config lists only their names.
        for i, a in enumerate(value if isinstance(value, list) else []):
            if isinstance(a, dict):
                raise ValueError(f"adapters[{i}]: {a!r} is an object; the router config lists adapter names (the "
                                 f"model names requests use), e.g. adapters: [{a.get('name') or 'sql'}]")
        return value

    @property
    def replica_endpoints(self) -> list[Endpoint]:
        return [e if isinstance(e, Endpoint) else Endpoint(url=e) for e in self.endpoints or []]

    @property
    def picker_name(self) -> PickerName:
        return self.picker or DEFAULT_PICKER

    @model_validator(mode="after")
    def _reachable(self) -> Upstream:
        if self.picker is not None and self.provider in EXTERNAL_PROVIDERS:
            raise ValueError(f"upstream {self.name!r}: picker applies to self-hosted replicas; provider "
                             f"{self.provider} has none to pick from, remove picker")
        if self.tokenizer is not None and self.provider in EXTERNAL_PROVIDERS:
            raise ValueError(f"upstream {self.name!r}: tokenizer serves the replica picker of a self-hosted "
                             f"model; provider {self.provider} has none, remove tokenizer")
        if self.tokenizer is not None and not self.tokenizer.startswith("/"):
            raise ValueError(f"upstream {self.name!r}: tokenizer {self.tokenizer!r} is not an absolute path; give "
                             "the model's directory as the router sees it, e.g. /models/llama-8b")
        if self.adapters and self.provider in EXTERNAL_PROVIDERS:
            raise ValueError(f"upstream {self.name!r}: adapters are LoRA adapters a self-hosted engine serves; "
                             f"provider {self.provider} has none (the name would reach it as a model), remove adapters")
        twice = sorted({a for a in self.adapters or [] if (self.adapters or []).count(a) > 1})
        if twice:
            raise ValueError(f"upstream {self.name!r}: adapters lists {', '.join(map(repr, twice))} more than once; "
                             "list each adapter once")
        if self.endpoints and self.provider in EXTERNAL_PROVIDERS:
            raise ValueError(f"upstream {self.name!r}: endpoints list replicas of a self-hosted model; provider "
                             f"{self.provider} has none, remove endpoints")
        if self.base_url and self.endpoints:
            # The replicas are the endpoints alone, so the base_url's engine would leave the rotation without a
            # word (QA3 Part 2 #4).
            raise ValueError(f"upstream {self.name!r}: give base_url or endpoints, not both (the router calls only "
                             f"the endpoints); to keep {self.base_url} as a replica, add it to endpoints and remove "
                             "base_url")
        if self.provider in ("vllm", "openai-compatible") and not (self.base_url or self.endpoints):
            raise ValueError(f"upstream {self.name!r}: provider {self.provider} needs base_url (e.g. "
                             "http://host:8000/v1) or endpoints")
        if self.api_key_env and self.api_key_file:
            raise ValueError(f"upstream {self.name!r}: api_key_env and api_key_file both give its API key; keep one")
        if self.timeout_seconds is not None and self.timeouts and self.timeouts.first_byte_seconds is not None:
            raise ValueError(f"upstream {self.name!r}: timeout_seconds ({self.timeout_seconds:g}) is the deprecated "
                             "name of timeouts.first_byte_seconds; remove timeout_seconds")
        return self

    @property
    def url(self) -> str:
        """Where a call goes when no replica is picked (with `endpoints` and no base_url: the first one)."""
        first = self.replica_endpoints[0].url if self.endpoints else None
        return (self.base_url or first or PROVIDER_URLS.get(self.provider, "")).rstrip("/")
