"""Router configuration: upstreams, routes with semantic tiers, escalation and response cache.

The same models are the Python API (`from oculis import Route, SemanticTier, ...`), the body of
`oculis-config.yaml` (snake_case) and the InferenceRoute CRD (camelCase).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from oculis.adapters import AdapterName, unknown_adapter
from oculis.base import Model, format_errors
from oculis.router_upstream import NAME_PATTERN, Timeouts, Upstream


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names each bad field."""


class TierMatch(Model):
    """Rules a prompt must meet to take this tier; all given rules must hold. Empty matches all."""

    complexity_below: float | None = Field(None, gt=0, le=1)
    """Classifier complexity must be below this (0-1]"""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Prompt must have at most this many tokens"""


# What a prompt can hold besides text (OpenAI content parts: image_url, input_audio).
Modality = Literal["text", "image", "audio"]


# The rules a tier may also give flat, beside its name (`SemanticTier(name=..., complexity_below=0.35)`, as
# the Throughput & Cost page writes them), in both spellings the schema accepts.
FLAT_RULES = {"complexity_below": "complexityBelow", "max_prompt_tokens": "maxPromptTokens"}
# CRD: a tier gives its rules flat or under `match`, never both (the same check as _one_spelling).
ONE_SPELLING_RULE: dict[str, Any] = {
    "rule": "!((has(self.complexityBelow) || has(self.maxPromptTokens)) && has(self.match))",
    "message": "give complexityBelow/maxPromptTokens either flat on the tier or under match, not both",
}


class SemanticTier(Model):
    """One tier of a route: tried in order, the first whose match holds answers. Its rules are given
    under `match` or flat on the tier (`complexity_below=0.35, max_prompt_tokens=2000`): both spellings
    give the same tier and serialise as `match`; a tier with neither matches everything else."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [ONE_SPELLING_RULE]})

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    """Tier name (shown in X-Oculis-Tier and metrics)"""
    match: TierMatch = Field(default_factory=TierMatch)
    """Rules for this tier; the last tier must have none"""
    # The flat spellings' bounds are the CRD's only (the API server checks what a user writes flat); in Python
    # their value is the match's, checked there once (a bad value was two errors, one per spelling: QA3 Part 2 #17).
    complexity_below: float | None = Field(None, exclude=True, json_schema_extra={
        "minimum": 0, "exclusiveMinimum": True, "maximum": 1})
    """Flat spelling of match.complexityBelow (one spelling per tier); reads back the match's value"""
    max_prompt_tokens: int | None = Field(None, exclude=True, json_schema_extra={"minimum": 1})
    """Flat spelling of match.maxPromptTokens (one spelling per tier); reads back the match's value"""
    upstream: str = Field(max_length=253)
    """Upstream (GPUUpstream name) that answers"""
    adapter: AdapterName | None = None
    """A LoRA adapter of the upstream this tier asks for (sent as the model name); unset: the base model"""
    modalities: list[Modality] | None = Field(None, min_length=1)
    """What this tier's model takes, e.g. [text, image]: image prompts go to tiers that declare image"""
    timeouts: Timeouts | None = None
    """Timeouts for this tier's calls; set fields override the upstream's"""

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        """Flat rules move under `match` (and the match's rules are mirrored flat), so both spellings
        build the same object; `match` is always set, so both serialise the same way."""
        if not isinstance(data, dict):
            return data
        flat = {k: v for snake, camel in FLAT_RULES.items() for k in (snake, camel) if k in data
                for v in [data[k]] if v is not None}
        has_match = "match" in data and data["match"] is not None
        if flat and has_match:
            name = data.get("name", "?")
            raise ValueError(f"tier {name!r} gives {', '.join(flat)} flat and also `match`: use one spelling, "
                             f"either flat keywords or match={{...}}, not both")
        out = {k: v for k, v in data.items() if k not in FLAT_RULES and k not in FLAT_RULES.values()}
        if flat:
            out["match"] = {snake: data.get(snake, data.get(camel)) for snake, camel in FLAT_RULES.items()
                            if data.get(snake, data.get(camel)) is not None}
        elif not has_match:
            out["match"] = {}
        rules = out["match"]
        if isinstance(rules, TierMatch):
            rules = rules.model_dump(exclude_none=True)
        if isinstance(rules, dict):
            for snake, camel in FLAT_RULES.items():
                value = rules.get(snake, rules.get(camel))
                if value is not None:
                    out[snake] = value
        return out


# The classifiers the router image ships (runtime/oculis_router/classifier_data/<name with / as ->.npz;
# a test keeps the two in step), so a wrong name is refused at `kubectl apply` or config load, not at
# serve. The shipped one is named as the docs name it; older names are accepted and normalised to it,
# so docs, status and metrics show one name.
CLASSIFIER_MODEL = "oculis/router-small-v2"
CLASSIFIER_MODELS = (CLASSIFIER_MODEL,)
CLASSIFIER_ALIASES = {"oculis-minilm-static-v1": CLASSIFIER_MODEL}


def classifier_name(value: Any) -> Any:
    """A known classifier name or alias -> its one name; anything else is refused listing the known ones."""
    if not isinstance(value, str):
        return value
    name = CLASSIFIER_ALIASES.get(value, value)
    if name not in CLASSIFIER_MODELS:
        aliases = ", ".join(f"{a} (alias of {n})" for a, n in CLASSIFIER_ALIASES.items())
        raise ValueError(f"unknown classifier {value!r}; known: {', '.join(CLASSIFIER_MODELS)}, {aliases}; "
                         "leave it empty for the packaged default")
    return name


ClassifierModel = Annotated[str, BeforeValidator(classifier_name),
                            WithJsonSchema({"type": "string", "enum": [*CLASSIFIER_MODELS, *CLASSIFIER_ALIASES]})]


class Classifier(Model):
    """The complexity classifier behind the tiers."""

    model: ClassifierModel | None = Field(None, description=(
        f"Classifier to use: {CLASSIFIER_MODEL} (the router's packaged prompt-complexity model; "
        f"{', '.join(CLASSIFIER_ALIASES)} is an older name for it); empty selects it"))
    head_path: str | None = Field(None, min_length=1, max_length=4096, description=(
        "A head written by `oculis classifier fit` (.npz), used instead of the packaged one; a relative path "
        "is relative to the config file's folder (for the router and `oculis route`/`eval` alike). "
        "The router reloads it when the file changes"))
    cache_ttl_seconds: int = Field(3600, ge=0, description="How long a prompt's score is memoised")
    max_entries: int = Field(100_000, ge=0, description="Bound on memoised scores")


# The grading instruction a verifier gets unless the route gives its own rubric. It asks for a number
# on one line, which `answer_check.score_of` reads (the first "score" followed by 1-10, else the first
# number 1-10 on its own).
DEFAULT_RUBRIC = ("You grade an AI assistant's answer to the user's last message. Judge whether it is correct, "
                  "complete and follows the request. Reply with one line and nothing else: 'Score: N', where N is "
                  "an integer from 1 (wrong or useless) to 10 (correct and complete).")


class Verifier(Model):
    """A model that grades each checked answer against a rubric; an answer scored below `min_score` is
    replaced by the next tier's. It is called once per checked answer (non-streamed, temperature 0),
    and its tokens are counted and billed like any call."""

    upstream: str = Field(pattern=NAME_PATTERN, max_length=63)
    """The upstream that grades: one of the config's upstreams (in an InferenceRoute, a GPUUpstream of
    its namespace); it may also be one of the route's tiers"""
    min_score: int = Field(ge=1, le=10)
    """Score (1-10) an answer must reach, e.g. 7; below it the next tier answers"""
    rubric: str = Field(DEFAULT_RUBRIC, min_length=1, max_length=8192)
    """The grading instruction (the verifier's system message); it must ask for 'Score: N' with N in 1-10"""
    max_tokens: int = Field(8, ge=1, le=1024)
    """The verifier's answer length limit (a score needs a few tokens)"""


class AnswerCheck(Model):
    """Escalation on the answer: by the answer's token log-probabilities (self-hosted tiers: vllm,
    openai-compatible, which return them at no extra call), by a verifier model's grade (any tier), or
    both; an answer that fails either is replaced by the next tier's."""

    min_mean_logprob: float | None = Field(None, le=0)
    """Mean token log-probability an answer must reach, e.g. -1.0 (about 37% per token); below it the next
    tier answers (the first answer's tokens are still counted and billed); unset: not checked by logprobs"""
    verifier: Verifier | None = None
    """A model that grades the answer; unset: no verifier call"""
    buffer_streams: bool = False
    """Check streamed requests too: the stream is buffered, checked, then sent (the client sees no token
    until the answer is final); false: streams are relayed as they come, unchecked"""

    @model_validator(mode="after")
    def _checks_something(self) -> AnswerCheck:
        if self.min_mean_logprob is None and self.verifier is None:
            raise ValueError("on_answer checks nothing: set min_mean_logprob (e.g. -1.0), verifier "
                             "{upstream, min_score}, or both")
        return self


class Escalation(Model):
    """When a request moves to the next tier."""

    enabled: bool = True
    """Escalate at all"""
    on_low_confidence: bool = True
    """Move one tier up when the classifier's confidence is low"""
    confidence_threshold: float = Field(0.6, ge=0, le=1)
    """Confidence below this counts as low"""
    on_upstream_error: bool = True
    """Try the next tier after an upstream failed its retries"""
    on_answer: AnswerCheck | None = None
    """Escalate on the answer: its token log-probabilities and/or a verifier's grade; unset: not checked"""
    max_retries: int = Field(2, ge=0, le=10)
    """Retries on one upstream (connection errors, timeouts, 429, 5xx) before escalating; 0: one attempt.
    A 429/503 whose Retry-After is over 2 s, a refused router credential (401/403), a context-length
    400, and a first-byte or idle timeout while a next tier can answer are not retried: they escalate at once"""


class CacheWhen(Model):
    """Which requests may be cached."""

    temperature_below: float | None = Field(0.01, ge=0)
    """Only requests with temperature below this (null: any)"""


# The parts an old allow-list `cache.key` could name: still accepted so old configs load, never used.
CacheKeyPart = Literal["model", "messages", "temperature", "max_tokens", "tools", "prompt"]
# Fields that carry the question itself: `cache.ignore` cannot leave them out of the key, so no
# configuration can make two different prompts share an answer.
CACHE_KEY_REQUIRED = ("model", "messages", "prompt", "suffix")
CACHE_IGNORE_RULE: dict[str, Any] = {
    "rule": "self.all(f, !(f in " + repr(list(CACHE_KEY_REQUIRED)) + "))",
    "message": "cache.ignore cannot list " + ", ".join(CACHE_KEY_REQUIRED) + ": they carry the question itself",
}


class ResponseCache(Model):
    """Response cache for deterministic requests; keys always include the tenant and the upstream revision."""

    enabled: bool = False
    """Cache responses"""
    ttl_seconds: int = Field(3600, ge=1)
    """How long an answer is served from cache"""
    key: list[CacheKeyPart] = Field(default_factory=list)
    """Deprecated, no effect: the key is always the whole request less the fields that never change an answer"""
    ignore: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=32, json_schema_extra={"x-kubernetes-validations": [CACHE_IGNORE_RULE]},
        description="More request fields left out of the key because here they never change the answer (stream, "
        "stream_options, user, safety_identifier, metadata, store and prompt_cache_key always are); model, messages, "
        "prompt and suffix cannot be listed")
    max_entries: int = Field(100_000, ge=1)
    """Bound on cached answers (LRU)"""
    only_when: CacheWhen = Field(default_factory=CacheWhen)
    """Which requests may be cached"""

    @field_validator("ignore")
    @classmethod
    def _question_stays_in_the_key(cls, ignore: list[str]) -> list[str]:
        named = [f for f in ignore if f in CACHE_KEY_REQUIRED]
        if named:
            raise ValueError(f"{named[0]!r} carries the question itself and is always part of the cache key; "
                             "remove it from the list")
        return ignore


LimitPer = Literal["tenant", "key", "route"]


class Limits(Model):
    """Request and token rates, counted over a rolling window (60 slices of it: a request is refused
    when it would take the last minute's or day's count past the limit, never by a window that resets)."""

    per: LimitPer = "key"
    """Who shares one count: key (the API key, whatever X-Oculis-Tenant says; the default, because a
    client can send any header and would get a fresh count per value), tenant (the key subdivided by
    X-Oculis-Tenant: for a gateway in front that sets the header) or route (everyone together)"""
    requests_per_minute: int | None = Field(None, ge=1)
    """Requests admitted in any 60 s"""
    tokens_per_minute: int | None = Field(None, ge=1)
    """Prompt plus completion tokens in any 60 s; a request reserves its estimated prompt plus its
    max_tokens before it is admitted, and the reservation is replaced by the real usage at its end"""
    tokens_per_day: int | None = Field(None, ge=1)
    """Prompt plus completion tokens in any 24 h, reserved and settled like tokens_per_minute"""


class Budget(Model):
    """Dollars that may be spent per calendar period (UTC), priced as the cost metrics price them
    (`oculis_cost_dollars_total`: the upstream's pricing, cached tokens at their price)."""

    dollars: float = Field(gt=0, allow_inf_nan=False)
    """Spend allowed per period; a request reserves its worst-case cost (the priciest tier it may reach)"""
    period: Literal["hour", "day", "month"] = "day"
    """The spend starts again from zero at each UTC hour, day or month"""
    per: LimitPer = "key"
    """Who shares one budget: key (the default), tenant or route, as for limits"""


class LimitMatch(Model):
    """Which requests an override applies to; all given fields must hold."""

    tenant: str | None = Field(None, min_length=1, max_length=256)
    """The X-Oculis-Tenant header's value: trust it only when a gateway in front sets the header (any
    client can send it), else match key_sha256 too"""
    key_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{8,64}$")
    """The API key's SHA-256 in hex, or its first 8 or more digits (`printf %s "$KEY" | sha256sum`):
    the key itself never appears in a config"""

    @model_validator(mode="after")
    def _names_someone(self) -> LimitMatch:
        if self.tenant is None and self.key_sha256 is None:
            raise ValueError("match needs tenant or key_sha256 (an empty match would apply to everyone: set the "
                             "route's limits or budget instead)")
        return self


# Flow-control priorities a request may have (higher is served first); batch work runs below all of them.
PRIORITY_MIN, PRIORITY_MAX = -100, 100
Priority = Annotated[int, Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)]


class LimitOverride(Model):
    """Limits, budget and flow-control standing for some tenants or keys instead of the route's (or the server's)."""

    match: LimitMatch
    """Which requests it applies to"""
    limits: Limits | None = None
    """Their limits (unset: the general ones)"""
    budget: Budget | None = None
    """Their budget (unset: the general one)"""
    priority: Priority | None = None
    """Their requests' flow-control priority when they send no X-Oculis-Priority (unset: the route's)"""
    max_priority: Priority | None = None
    """The highest X-Oculis-Priority they may ask for (unset: server.flow_control.max_priority)"""
    weight: float | None = Field(None, gt=0, le=1000, allow_inf_nan=False)
    """Their flow's share among flows of the same priority when requests queue (unset: 1)"""


class Limiter(Model):
    """Where counts are kept and what happens when that store fails."""

    backend: Literal["memory", "redis"] | None = None
    """memory (this replica only) or redis (shared by replicas, at server.redis_url); unset: the cache_backend"""
    on_backend_error: Literal["allow", "deny"] = "allow"
    """When Redis cannot be reached: allow (admit uncounted; the default, because an outage of a counter
    should not become an outage of the API, and it is logged and counted in
    oculis_limiter_backend_errors_total) or deny (429 until Redis is back: for hard spend caps)"""
    reserve_max_tokens: int = Field(1024, ge=1)
    """Completion tokens a request reserves when it sets neither max_tokens nor max_completion_tokens"""


class DecisionLog(Model):
    """One JSON line per request of this route: what the router decided and how the answer went (tier,
    complexity, confidence, escalated and why, answer log-probability, status), to audit routing and to
    build an `oculis classifier fit` suite from real traffic."""

    sink: str = Field("stdout", min_length=1, max_length=4096, pattern=r"^(stdout|/.*)$")
    """stdout, or an absolute file path (appended to)"""
    include_prompts: bool = False
    """Write the prompt or messages themselves (as a suite line has them); false: only their SHA-256"""


class RouteFlowControl(Model):
    """How this route's requests wait when its tier's replicas have no free seat (server.flow_control)."""

    priority: Priority = 0
    """Priority of its requests (higher is served first), unless the key's override or X-Oculis-Priority says"""
    queue_ttl_seconds: float | None = Field(None, gt=0, le=3600, allow_inf_nan=False)
    """How long a request may wait for a seat before a 429 with Retry-After (unset: the server's)"""
    max_queue: int | None = Field(None, ge=0, le=1_000_000)
    """Requests of this route that may wait at once; one more gets a 429 (unset: the server's)"""


class RouteBody(Model):
    """A route without its name: the InferenceRoute's spec (the name comes from metadata)."""

    strategy: Literal["semantic"] = "semantic"
    """Routing strategy (semantic)"""
    classifier: Classifier = Field(default_factory=Classifier)
    """The complexity classifier"""
    tiers: list[SemanticTier] = Field(min_length=1, max_length=16)
    """Tiers, cheapest first; the last catches all"""
    escalation: Escalation = Field(default_factory=Escalation)
    """When requests move up a tier"""
    cache: ResponseCache = Field(default_factory=ResponseCache)
    """Response cache"""
    limits: Limits | None = None
    """Request and token rate limits of this route (unset: server.limits)"""
    budget: Budget | None = None
    """Dollar budget of this route (unset: server.budget)"""
    limit_overrides: list[LimitOverride] = Field(default_factory=list, max_length=256)
    """Other limits or budget for some tenants or keys; the first that matches applies (then server.limit_overrides)"""
    decision_log: DecisionLog | None = None
    """Log each request's routing decision and outcome as a JSON line (unset: not logged)"""
    cold_start: Literal["escalate", "wait", "fail"] = Field(
        "escalate", description="A request whose tier's upstream is scaled to zero (it is woken either way): "
        "escalate (the next tier whose upstream serves answers it; the product's default), wait (held up to "
        "coldStartWaitSeconds for the upstream, then 503) or fail (503 at once, with Retry-After)")
    cold_start_wait_seconds: float = Field(60, gt=0, le=600, allow_inf_nan=False)
    """coldStart wait: how long a request is held for a woken upstream before the 503"""
    flow_control: RouteFlowControl = Field(default_factory=RouteFlowControl)
    """Its requests' priority and queue bounds when the fleet is full (with the router's flow control on)"""

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


REDIS_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url accepts


def redis_url_problem(url: str, field: str = "server.redis_url") -> str | None:
    """Why redis-py would refuse this URL when the router builds its cache or limiter (a traceback at
    start, a rejected reload), as one line naming `field` (the password not echoed)."""
    parts = urlsplit(url)
    shown = url.replace(f":{parts.password}@", ":***@", 1) if parts.password else url
    if parts.scheme not in REDIS_SCHEMES:
        return (f"{field} {shown!r}: the scheme must be one of {', '.join(s + '://' for s in REDIS_SCHEMES)}; "
                "e.g. redis://redis:6379/0")
    if parts.scheme != "unix" and not parts.hostname:
        return f"{field} {shown!r}: names no host; e.g. redis://redis:6379/0"
    try:
        parts.port  # noqa: B018 -- raises for a port that is not a number or out of range
    except ValueError as exc:
        return f"{field} {shown!r}: {exc}; e.g. redis://redis:6379/0"
    return None


class FlowControl(Model):
    """Flow control: when the replicas of a request's tier have no free seat (the picker's saturation guard:
    every replica at `seats_per_replica` requests, or its KV cache full), the request waits in the router,
    in one queue per flow, served by priority and fairly among the flows of one priority, instead of
    piling into an engine's first-come-first-served queue."""

    enabled: bool = False
    """Queue requests in the router when the fleet is full; false: every request goes to an engine at once"""
    fairness: Literal["tenant", "key", "route"] = "tenant"
    """What one flow is: tenant (the API key subdivided by X-Oculis-Tenant, as the cache partitions), key
    (the API key) or route"""
    seats_per_replica: int | None = Field(None, ge=1, le=100_000)
    """Requests one replica runs at once (vLLM's max_num_seqs, or fewer to keep its TTFT); unset: only its
    KV cache bounds it. An upstream without replicas (a plain base_url) then counts as one replica"""
    queue_ttl_seconds: float = Field(30, gt=0, le=3600, allow_inf_nan=False)
    """How long a request may wait for a seat before a 429 with Retry-After (a route may set its own)"""
    max_queue: int = Field(1000, ge=0, le=1_000_000)
    """Requests of one route that may wait at once; one more gets a 429 (a route may set its own)"""
    max_priority: Priority = 0
    """The highest X-Oculis-Priority a request may ask for unless its key's override allows more"""


class BatchSettings(Model):
    """The OpenAI Batch API (/v1/files, /v1/batches): jobs run at the lowest flow-control priority,
    through the same routes, on the seats interactive traffic leaves free."""

    enabled: bool = False
    """Serve /v1/files and /v1/batches"""
    directory: str = Field("/var/lib/oculis/batch", min_length=1, max_length=4096, pattern=r"^/")
    """Where files and batch state are kept (one folder per tenant); an absolute path"""
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1024, le=2**40)
    """Largest file a client may upload (OpenAI's limit for batch input is 200 MB)"""
    max_requests_per_batch: int = Field(50_000, ge=1, le=1_000_000)
    """Most lines one batch input file may hold (OpenAI's limit is 50,000)"""
    concurrency: int = Field(16, ge=1, le=10_000)
    """Lines of one router's batches in flight at once (each still waits for a free seat)"""


class ServerSettings(Model):
    """Router process settings."""

    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Larger request bodies get 413")
    max_header_bytes: int = Field(32 * 1024, ge=4096, le=1024 * 1024,
                                  description="Requests whose headers (names and values) are larger get 431")
    max_messages: int = Field(2048, ge=1, le=100_000,
                              description="Chat requests with more messages get 400 (OpenAI's own limit is 2048)")
    cache_backend: Literal["memory", "redis"] = "memory"
    """memory (per process) or redis (shared by replicas)"""
    redis_url: str | None = Field(None, description="redis://host:port/db for cache_backend: redis")
    client_keys_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Environment variable holding the client API keys the router accepts (comma-separated). When set,
    /v1 requests without one of them get 401; when that variable is empty, every /v1 request is refused."""
    limits: Limits | None = None
    """Rate limits of every route that sets none, and of requests naming an upstream directly; counted
    across all of them (a route's own limits count that route only)"""
    budget: Budget | None = None
    """Dollar budget of every route that sets none (and of direct upstream calls), counted across them"""
    limit_overrides: list[LimitOverride] = Field(default_factory=list, max_length=256)
    """Other limits or budget for some tenants or keys, on every route (after the route's own overrides)"""
    limiter: Limiter = Field(default_factory=Limiter)
    """Where the limits' counts are kept"""
    flow_control: FlowControl = Field(default_factory=FlowControl)
    """Requests wait in the router, by priority and fair share, when their tier's replicas are full"""
    batch: BatchSettings = Field(default_factory=BatchSettings)
    """The OpenAI Batch API on this router"""

    @model_validator(mode="after")
    def _redis(self) -> ServerSettings:
        if self.cache_backend == "redis" and not self.redis_url:
            raise ValueError("server.redis_url is required when server.cache_backend is redis")
        if self.limiter.backend == "redis" and not self.redis_url:
            raise ValueError("server.redis_url is required when server.limiter.backend is redis")
        if self.redis_url is not None and (why := redis_url_problem(self.redis_url)):
            raise ValueError(why)
        return self


class Route(RouteBody):
    """A named route: requests whose model is this name are classified and tiered."""

    name: str = Field(pattern=NAME_PATTERN)
    """Route name clients send as `model`"""


class RouterConfig(Model):
    """A whole oculis-config.yaml (under its `oculis:` key)."""

    upstreams: list[Upstream]
    """Models the router can call. Empty (with no routes) is valid: the router then answers 404 to
    every model, which is what the operator renders when no route of a ConfigMap can be served"""
    routes: list[Route] = Field(default_factory=list)
    """Semantic routes over the upstreams"""
    server: ServerSettings = Field(default_factory=ServerSettings)
    """Router process settings"""

    @model_validator(mode="after")
    def _references_resolve(self) -> RouterConfig:
        known = [u.name for u in self.upstreams]
        for kind, names in (("upstream", known), ("route", [r.name for r in self.routes])):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind} names must be unique; repeated: {', '.join(dupes)}")
        # Clients name either in `model`, and the router looks upstreams up first, so a shared name
        # would silently shadow the route.
        shared = sorted(set(known) & {r.name for r in self.routes})
        if shared:
            raise ValueError(f"a route and an upstream cannot share a name (a request for that model would "
                             f"reach the upstream, never the route); rename one of: {', '.join(shared)}")
        for i, route in enumerate(self.routes):
            for j, tier in enumerate(route.tiers):
                if tier.upstream not in known:
                    raise ValueError(
                        f"routes[{i}].tiers[{j}].upstream: {tier.upstream!r} is not a declared upstream "
                        f"(declared: {', '.join(known)})"
                    )
                declared = self.upstream(tier.upstream).adapters or []
                if tier.adapter is not None and tier.adapter not in declared:
                    raise ValueError(unknown_adapter(tier.adapter, tier.upstream, declared,
                                                     f"routes[{i}].tiers[{j}].adapter"))
            check = route.escalation.on_answer
            if check is not None and check.verifier is not None and check.verifier.upstream not in known:
                raise ValueError(
                    f"routes[{i}].escalation.on_answer.verifier.upstream: {check.verifier.upstream!r} is not a "
                    f"declared upstream (declared: {', '.join(known)})")
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
