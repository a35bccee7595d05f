"""Calls to upstreams, shaped for LLM traffic.

Timeouts: a connect timeout, a first-byte timeout (a stream's first chunk; a non-streamed answer's
headers) and an idle timeout between reads. There is no total cap, so a long generation that keeps
streaming is never cut (an aiohttp `total` timeout used to end every stream after 120 s).

What a failed attempt leads to is decided by `judge`, a pure function of the status, headers and
body: retry on the same upstream (connection errors, timeouts, 5xx, 429 without a long Retry-After:
exponential backoff, or exactly the Retry-After when it is at most `RETRY_AFTER_WAIT_MAX_S`), move
to the next tier at once (a longer Retry-After, the router's own credential refused, a prompt over
the tier's context length), or relay the upstream's answer (any other 4xx: the client's problem).
Retries stop after `escalation.max_retries`; a first-byte or idle timeout is retried only on the last
tier (each retry costs the whole timeout again). An upstream with a `canary` revision sends each call
there with probability `percent` (`revision`, pure, on a random draw); a canary attempt that fails
retryably is retried on the stable revision, on top of the retry budget, so a bad canary costs a
client at most one wasted attempt, never an escalation the stable revision would have spared it.
Streams are retried only while no byte has reached the client: the first chunk is read here, before
the router starts answering.

The HTTP client is aiohttp, not httpx: httpx's connection pool degrades badly under concurrency
(encode/httpx#3215, open; measured here: 18 ms of CPU per request at 256 concurrent vs 0.6 ms at 1).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_exponential

from oculis import Timeouts, Upstream
from oculis.router import DEFAULT_CONNECT_SECONDS, DEFAULT_FIRST_BYTE_SECONDS, DEFAULT_IDLE_SECONDS
from oculis_router import strictjson
from oculis_router.errors import APIError
from oculis_router.pick import AdapterMissing, Fleet, Lease, Tokenized
from oculis_router.providers import anthropic, openai_compat, relayed_headers

log = logging.getLogger("oculis.router")

# A Retry-After up to this is waited out on the same upstream; a longer one moves to the next tier at
# once (a client should not wait on a rate-limited tier while another could answer), and is relayed
# with the 429 when no tier can answer.
RETRY_AFTER_WAIT_MAX_S = 2.0
# Phrases of a prompt over the model's context: vLLM ("This model's maximum context length is ...",
# "... is longer than the maximum model length"), OpenAI (code context_length_exceeded, "context
# window"), Anthropic ("prompt is too long"). A tier with a longer context may answer it.
CONTEXT_LENGTH_MARKERS = ("maximum context length", "maximum model length", "context_length_exceeded",
                          "context window", "prompt is too long")


# ---- the policy: pure ----------------------------------------------------------------------------

Revision = Literal["canary", "stable"]
REVISION_HEADER = "x-oculis-revision"
REPLICA_HEADER = "x-oculis-replica"  # the replica that answered (a pod's name), when the router picked one


def revision(up: Upstream, draw: float) -> Revision:
    """Which revision of `up` a call goes to, for a uniform `draw` in [0, 1): the canary for draws
    below its percent, so over many calls it takes that share."""
    return "canary" if up.canary is not None and draw * 100 < up.canary.percent else "stable"


def at_revision(up: Upstream, rev: Revision) -> Upstream:
    """`up` as called at `rev`: the canary's base_url (same name, model, key and revision, so the
    response cache's key and the metrics' upstream label do not change)."""
    if rev == "stable" or up.canary is None:
        return up
    return up.model_copy(update={"base_url": up.canary.base_url})


Request = tuple[str, dict[str, str], dict[str, Any]]  # url, headers, payload (a provider's build_request)


class Revisions:
    """The attempts of one call to `up`: the first goes to the revision the draw picked, every retry to
    stable. Within the revision a replica is picked per attempt (pick.py), a different one each time
    while one is left; without replicas each revision's request is built once. `extra`: attempts on
    top of the retry budget (a canary's failed attempt is retried on stable; a failed replica's on
    another replica of the same upstream, before the tier escalates)."""

    def __init__(self, up: Upstream, endpoint: str, body: dict[str, Any], draw: float,
                 fleet: Fleet | None = None) -> None:
        self.up, self.endpoint, self.body, self.fleet = up, endpoint, body, fleet
        self.prov = provider_of(up)
        self.first: Revision = revision(up, draw)
        pool = fleet.pool(up) if fleet is not None else None
        self.pooled = {rev for rev in (self.first, "stable") if pool is not None and pool.members(rev)}
        self._calls: dict[Revision, Request] = {rev: self.prov.build_request(at_revision(up, rev), endpoint, body)
                                                for rev in dict.fromkeys((self.first, "stable"))
                                                if rev not in self.pooled}
        self._tried = 0
        self.tried: set[str] = set()  # replicas this call has tried
        self.tokenized: Tokenized | None = None  # the prompt's model token ids, once (prepare)
        self._prepared = False
        self.extra = int(self.first == "canary") + int(pool is not None and len(pool.members("stable")) > 1)

    async def prepare(self) -> None:
        """Tokenize the prompt for the picker once per call, before its first pick (a long prompt off the
        event loop: Fleet.tokenize); every attempt's pick reuses the ids."""
        if not self._prepared and self.pooled and self.fleet is not None:
            self.tokenized = await self.fleet.tokenize(self.up, self.body, self.endpoint)
        self._prepared = True

    def next(self) -> tuple[Revision, Request, Lease | None]:
        rev: Revision = "stable" if self._tried else self.first
        self._tried += 1
        lease = None
        if rev in self.pooled and self.fleet is not None:
            try:
                lease = self.fleet.lease(self.up, self.body, self.endpoint, rev, self.tried, self.tokenized)
            except AdapterMissing as exc:
                if rev == "canary" and "stable" in self.pooled:  # a canary not loaded yet: the stable revision
                    rev = "stable"
                    lease = self.fleet.lease(self.up, self.body, self.endpoint, rev, self.tried, self.tokenized)
                else:
                    raise AdapterUnavailable(exc) from None
        if lease is None:
            if rev not in self._calls:  # every replica left since the call began: the base URL, as before
                self._calls[rev] = self.prov.build_request(at_revision(self.up, rev), self.endpoint, self.body)
            return rev, self._calls[rev], None
        self.tried.add(lease.replica.id)
        at = at_revision(self.up, rev).model_copy(update={"base_url": lease.url})
        return rev, self.prov.build_request(at, self.endpoint, self.body), lease


def replica_fault(exc: BaseException) -> bool:
    """Whether a failed attempt says something about the replica (set it aside) rather than the request
    or the router's credential: a refused or reset connection, a timeout, a 5xx, a broken answer."""
    if isinstance(exc, Retryable):
        return True
    return isinstance(exc, UpstreamFailed) and not (exc.verdict.credential or exc.verdict.context_length)


@dataclass(frozen=True)
class Verdict:
    """What to do after one failed attempt, and what the client gets if no tier can answer."""

    action: Literal["retry", "escalate", "relay"]
    reason: str  # for logs and the client's 502: never the provider's own text (it can quote the key)
    wait: float | None = None  # retry after exactly this many seconds (Retry-After); None: backoff
    status: int = 502  # the client's status when no tier can answer
    retry_after: float | None = None  # the Retry-After relayed with it
    credential: bool = False  # the router's own API key was refused: the router's misconfiguration
    context_length: bool = False  # the prompt is over this tier's context: relayed as is if no tier is left
    kind: str | None = None  # the failure's label when none of the above names it (failure_kind)


def retry_after_seconds(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds a provider asks to wait: `retry-after-ms` (OpenAI), else `Retry-After` as seconds or as
    an HTTP date (RFC 9110). None when absent or unreadable; a date in the past is 0."""
    h = {k.lower(): v.strip() for k, v in headers.items()}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = h.get(name)
        if not value:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            if name == "retry-after-ms":
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            when = when if when.tzinfo else when.replace(tzinfo=UTC)
            return max(0.0, (when - now).total_seconds())
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def is_context_length(body: bytes) -> bool:
    text = body[:65536].decode("utf-8", "replace").lower()
    return any(m in text for m in CONTEXT_LENGTH_MARKERS)


def judge(status: int, headers: Mapping[str, str], body: bytes, now: datetime) -> Verdict:
    """The policy for an upstream's error answer (status >= 400)."""
    if status in (429, 503):
        after = retry_after_seconds(headers, now)
        final = 429 if status == 429 else (503 if after is not None else 502)
        if after is None:
            return Verdict("retry", f"status {status}", status=final)
        why = f"status {status}, Retry-After {round(after, 1):g} s"
        if after <= RETRY_AFTER_WAIT_MAX_S:
            return Verdict("retry", why, wait=after, status=final, retry_after=after)
        return Verdict("escalate", why, status=final, retry_after=after)
    if status >= 500:
        return Verdict("retry", f"status {status}")
    if status in (401, 403):
        return Verdict("escalate", f"the upstream refused the router's credential (status {status}); the "
                       "router's API key for it is wrong or lacks access", credential=True)
    if status in (400, 413, 422) and is_context_length(body):
        return Verdict("escalate", f"the prompt is over this tier's context length (status {status})",
                       status=status, context_length=True)
    return Verdict("relay", f"status {status}", status=status)


def failure_kind(v: Verdict) -> str:
    """A short, bounded label for why a call failed (`oculis_upstream_failures_total{kind}`)."""
    if v.kind is not None:
        return v.kind
    if v.credential:
        return "credential"
    if v.context_length:
        return "context_length"
    if v.status == 429:
        return "rate_limited"
    reason = v.reason
    if reason.startswith("status ") and reason[7:10].isdigit():
        return f"status_{reason[7:10]}"
    if "Timeout" in reason or "timed out" in reason or "within" in reason or "stalled" in reason:
        return "timeout"
    if "JSON" in reason or "shape" in reason or "choices" in reason:
        return "bad_answer"
    if "not set in the router's environment" in reason:
        return "missing_key"
    return "connection"


@dataclass(frozen=True)
class Limits:
    """The timeouts of one call, in seconds, every one resolved."""

    connect: float
    first_byte: float
    idle: float


def limits(up: Upstream, tier: Timeouts | None = None) -> Limits:
    """The tier's setting, else the upstream's (`timeout_seconds` is the old name of its first-byte
    timeout), else the default."""

    def pick(field: str, fallback: float | None, default: float) -> float:
        for t in (tier, up.timeouts):
            value = getattr(t, field) if t is not None else None
            if value is not None:
                return float(value)
        return default if fallback is None else fallback

    return Limits(pick("connect_seconds", None, DEFAULT_CONNECT_SECONDS),
                  pick("first_byte_seconds", up.timeout_seconds, DEFAULT_FIRST_BYTE_SECONDS),
                  pick("idle_seconds", None, DEFAULT_IDLE_SECONDS))


@dataclass(frozen=True)
class Attempt:
    """How one tier is called: its route's retry budget, its timeouts, and whether a next tier could
    answer (a context-length refusal is relayed as is when none can)."""

    retries: int | None = None  # None: the router's default
    timeouts: Timeouts | None = None
    can_escalate: bool = False


# ---- outcomes ------------------------------------------------------------------------------------

class Retryable(Exception):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


class UpstreamFailed(Exception):
    """This upstream cannot answer (retries spent, or retrying would not help): the next tier may."""

    def __init__(self, message: str, verdict: Verdict | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict or Verdict("escalate", message)

    def client_error(self, upstream: str) -> APIError:
        """What the client gets when no tier is left: a 429/503 with the provider's Retry-After, else
        a 502 naming the upstream and the reason (never the provider's text)."""
        v = self.verdict
        why = str(self).removeprefix(f"{upstream}: ")
        if v.status in (429, 503):
            headers = {"retry-after": str(math.ceil(v.retry_after))} if v.retry_after is not None else {}
            if v.status == 429:
                return RelayedLimit(429, f"upstream {upstream} is rate limited: {why}", headers,
                                    type_="rate_limit_error", code="rate_limit_exceeded")
            return RelayedLimit(503, f"upstream {upstream} is unavailable: {why}", headers,
                                type_="service_unavailable", code="upstream_unavailable")
        return APIError(502, f"upstream {upstream} failed: {why}", type_="upstream_error", code="upstream_failed")


# How long a client asked for an adapter no replica lists yet is told to wait: the router reads each
# replica's adapters every replicas.MODELS_S, and the operator loads a declared adapter within seconds.
ADAPTER_RETRY_AFTER_S = 5


class AdapterUnavailable(UpstreamFailed):
    """No replica of the upstream lists the adapter the call asks for: the next tier may answer; when none
    can, a 503 with Retry-After naming the adapter and why (code `adapter_not_loaded`). Not a 404: the
    adapter is declared (an undeclared one is a 404 at plan time), so it is expected to be loaded shortly,
    and clients retry a 503 after its Retry-After (the openai SDKs do) but never a 404."""

    def __init__(self, missing: AdapterMissing) -> None:
        super().__init__(str(missing), Verdict("escalate", str(missing), status=503,
                                               retry_after=ADAPTER_RETRY_AFTER_S, kind="adapter_not_loaded"))
        self.adapter = missing.adapter

    def client_error(self, upstream: str) -> APIError:
        return RelayedLimit(503, f"{self} (retry after Retry-After)",
                            {"retry-after": str(ADAPTER_RETRY_AFTER_S)}, type_="service_unavailable",
                            code="adapter_not_loaded")


class RelayedLimit(APIError):
    """An APIError answered with headers (Retry-After), so the client's SDK backs off as asked."""

    def __init__(self, status: int, message: str, headers: dict[str, str], type_: str, code: str) -> None:
        super().__init__(status, message, type_=type_, code=code, headers=headers)


class UpstreamRejected(Exception):
    """The upstream refused the request itself (4xx): relayed to the client as is."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body
        self.headers = dict(headers or {})  # its content-type and request id go to the client too


class IdleTimeout(TimeoutError):
    """The upstream went silent for longer than its idle timeout after its answer had started."""


def provider_of(up: Upstream) -> Any:
    return anthropic if up.provider == "anthropic" else openai_compat


def missing_key(up: Upstream) -> str | None:
    """Why `up` cannot be called: its API key variable is named but unset in the router's environment.
    Said as the router's fault (not relayed as the provider's 401), so the next tier can answer."""
    if up.api_key_env and not os.environ.get(up.api_key_env):
        return (f"{up.name}: its API key variable {up.api_key_env} is not set in the router's environment "
                "(in a cluster: router.secretEnv in the chart)")
    return None


async def _read(resp: aiohttp.ClientResponse, idle: float) -> bytes:
    """A whole body, each read bounded by the idle timeout."""
    parts: list[bytes] = []
    while True:
        async with asyncio.timeout(idle):
            chunk = await resp.content.readany()
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


class Stream:
    """An upstream stream whose first chunk has arrived. Iterating yields the chunks; a silence longer
    than the idle timeout raises IdleTimeout (a TimeoutError) instead of hanging forever."""

    def __init__(self, resp: aiohttp.ClientResponse, first: bytes, idle: float,
                 revision: Revision = "stable", lease: Lease | None = None) -> None:
        self.resp, self._first, self.idle = resp, first, idle
        self.headers = resp.headers
        self.revision = revision  # which revision of the upstream answers
        self.lease = lease  # the replica's, held (counted in flight) until the stream ends
        if lease is not None:
            lease.first_token()

    @property
    def replica(self) -> str | None:
        return self.lease.replica.id if self.lease is not None else None

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._first:
            chunk, self._first = self._first, b""
            return chunk
        try:
            async with asyncio.timeout(self.idle):
                chunk = await self.resp.content.readany()
        except TimeoutError:
            raise IdleTimeout(f"no data for {self.idle:g} s (timeouts.idle_seconds)") from None
        if not chunk:
            raise StopAsyncIteration
        return chunk

    def chunks(self) -> Stream:
        return self

    def close(self) -> None:
        self.resp.close()
        if self.lease is not None:
            self.lease.release()

    def release(self) -> None:
        self.resp.release()
        if self.lease is not None:
            self.lease.release()


NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)
T = TypeVar("T")


# ---- the shell -----------------------------------------------------------------------------------

class Caller:
    def __init__(self, http: aiohttp.ClientSession, max_retries: int = 2, backoff: float = 0.05,
                 draw: Callable[[], float] = random.random, fleet: Fleet | None = None,
                 on_canary_failure: Callable[[Upstream, Verdict], None] | None = None) -> None:
        self.http = http
        self.fleet = fleet  # the replicas of self-hosted upstreams (pick.py); None: every call to its base_url
        self.draw = draw  # the canary draw (`revision`); tests pass a fixed sequence
        self.max_retries = max_retries  # for requests that name an upstream (no route, no escalation block)
        self.backoff = backoff
        self._refused: set[str] = set()  # upstreams whose refusal of our credential was logged
        # A canary attempt that failed is retried on stable, so no request shows it: counted here (the
        # router's metrics) and logged once per upstream until its canary answers again.
        self.on_canary_failure = on_canary_failure
        self._canary_failing: set[str] = set()

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Retryable) and exc.verdict.wait is not None:
            return exc.verdict.wait
        return float(wait_exponential(multiplier=self.backoff, max=2.0)(state))

    async def _with_retries(self, up: Upstream, once: Callable[[], Awaitable[T]], at: Attempt,
                            extra: int = 0) -> T:
        """Run `once` until it does not raise Retryable, then give up with UpstreamFailed. `extra`:
        attempts on top of the budget (a canary's failed attempt is retried on stable)."""
        attempts = (self.max_retries if at.retries is None else at.retries) + 1 + extra
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(attempts), wait=self._wait,
                                               retry=retry_if_exception_type(Retryable), reraise=True):
                with attempt:
                    result = await once()
                    self._refused.discard(up.name)
                    return result
        except Retryable as exc:
            tries = f" ({attempts} attempts)" if attempts > 1 else ""
            raise UpstreamFailed(f"{up.name}: {exc}{tries}", exc.verdict) from exc
        raise AssertionError("unreachable")

    async def _tried(self, up: Upstream, revs: Revisions,
                     attempt: Callable[[Revision, Request, Lease | None], Awaitable[T]]) -> tuple[T, Lease | None]:
        """One attempt, on the revision and replica `revs` gives it: a failure sets the replica aside (or
        frees it) and a canary's failure becomes a retry on stable (_canary). The replica's lease is
        returned with the result, still held."""
        await revs.prepare()
        rev, request, lease = revs.next()
        try:
            result = await attempt(rev, request, lease)
        except BaseException as exc:
            if lease is not None:
                lease.failed() if replica_fault(exc) else lease.release()
                if lease.adapter is not None and isinstance(exc, UpstreamRejected) and exc.status == 404:
                    # vLLM's "model does not exist": the adapter left that engine since its list was read.
                    # Struck from the list there, the call tries a replica that lists it (or is told none does).
                    lease.replica.adapters = (lease.replica.adapters or frozenset()) - {lease.adapter}
                    raise Retryable(Verdict("retry", f"replica {lease.replica.id} no longer serves adapter "
                                            f"{lease.adapter!r} (404)", kind="adapter_not_loaded")) from exc
            if (retry := self._canary(up, rev, exc)) is not None:
                raise retry from exc
            raise
        self._canary(up, rev, None)
        return result, lease

    def _canary(self, up: Upstream, rev: Revision, exc: BaseException | None) -> Retryable | None:
        """After an attempt on `rev`: a canary's failure (whatever it was: a 5xx, a refused connection,
        a long Retry-After that would move a stable revision to the next tier) is counted, said once, and
        becomes a retry on stable at once; None when there is nothing to change."""
        if rev != "canary":
            return None
        if exc is None:
            self._canary_failing.discard(up.name)
            return None
        if not isinstance(exc, Retryable | UpstreamFailed):
            return None
        if self.on_canary_failure is not None:
            self.on_canary_failure(up, exc.verdict)
        if up.name not in self._canary_failing:
            self._canary_failing.add(up.name)
            log.warning("canary of upstream %s (%s) failed an attempt, retried on stable: %s (logged once until "
                        "it answers; counted in oculis_upstream_failures_total{revision=\"canary\"})",
                        up.name, up.canary.base_url if up.canary else "?", exc.verdict.reason)
        return Retryable(replace(exc.verdict, action="retry", wait=None))

    def _refuse(self, up: Upstream, status: int, headers: Mapping[str, str], body: bytes, at: Attempt) -> None:
        """Raise what an error answer means for this attempt (see `judge`)."""
        v = judge(status, headers, body, datetime.now(UTC))
        if v.action == "retry":
            raise Retryable(v)
        if v.action == "relay" or (v.context_length and not at.can_escalate):
            raise UpstreamRejected(status, body, headers)
        if v.credential and up.name not in self._refused:
            self._refused.add(up.name)  # once per upstream, not per request; the key itself is never logged
            where = f"the key in {up.api_key_env}" if up.api_key_env else "its API key (none is set: api_key_env)"
            log.warning("upstream %s refused the router's credential (status %d): check %s (in a cluster: "
                        "the GPUUpstream's apiKeySecretRef); requests go to the next tier", up.name, status, where)
        raise UpstreamFailed(f"{up.name}: {v.reason}", v)

    async def _post(self, url: str, headers: dict[str, str], payload: dict[str, Any],
                    lim: Limits) -> aiohttp.ClientResponse:
        try:
            return await self.http.post(url, headers=headers, json=payload,
                                        timeout=aiohttp.ClientTimeout(total=None, sock_connect=lim.connect))
        except aiohttp.ConnectionTimeoutError as exc:
            raise Retryable(Verdict("retry", f"connect timed out after {lim.connect:g} s "
                                    "(timeouts.connect_seconds)")) from exc

    @staticmethod
    def _timed_out(up: Upstream, reason: str, at: Attempt, rev: Revision = "stable") -> Exception:
        """A first-byte or idle timeout: each retry would cost the whole timeout again, so with a next
        tier able to answer it moves on at once; on the last tier it is retried like any failure. On
        the canary it is retried (on stable): the canary's slowness must not move a request up a tier."""
        if at.can_escalate and rev == "stable":
            return UpstreamFailed(f"{up.name}: {reason}", Verdict("escalate", reason))
        return Retryable(Verdict("retry", reason))

    @staticmethod
    def _late(lim: Limits) -> str:
        return f"no answer within {lim.first_byte:g} s (timeouts.first_byte_seconds)"

    async def complete(self, up: Upstream, endpoint: str, body: dict[str, Any],
                       at: Attempt | None = None, headers_out: dict[str, str] | None = None) -> dict[str, Any]:
        """The answer; `headers_out` receives the answer's headers the client gets too (relayed_headers)."""
        at = at or Attempt()
        if why := missing_key(up):
            raise UpstreamFailed(why)
        prov = provider_of(up)
        revs = Revisions(up, endpoint, body, self.draw(), self.fleet)
        lim = limits(up, at.timeouts)

        async def once() -> dict[str, Any]:
            data, lease = await self._tried(up, revs, attempt)
            if lease is not None:
                lease.release()
                if headers_out is not None:
                    headers_out[REPLICA_HEADER] = lease.replica.id
            return data

        async def attempt(rev: Revision, request: Request, lease: Lease | None) -> dict[str, Any]:
            url, headers, payload = request
            try:
                first_byte = asyncio.timeout(lim.first_byte)
                try:
                    async with first_byte:
                        resp = await self._post(url, headers, payload, lim)
                except TimeoutError as exc:
                    if first_byte.expired():
                        raise self._timed_out(up, self._late(lim), at, rev) from exc
                    raise
                try:
                    content = await _read(resp, lim.idle)
                except BaseException as exc:
                    resp.close()  # half-read: never back into the pool
                    if isinstance(exc, TimeoutError):
                        raise self._timed_out(up, f"the answer stalled for {lim.idle:g} s (timeouts.idle_seconds)",
                                              at, rev) from exc
                    raise
                resp.release()
            except NETWORK_ERRORS as exc:
                raise Retryable(Verdict("retry", type(exc).__name__)) from exc
            if resp.status >= 400:
                self._refuse(up, resp.status, resp.headers, content, at)
            try:  # strict: NaN, lone surrogates or deep nesting could not be relayed (a 500 later)
                raw = strictjson.loads(content, "the answer")
            except ValueError as exc:
                raise Retryable(Verdict("retry", "the upstream answered with invalid JSON")) from exc
            if not isinstance(raw, dict):
                raise Retryable(Verdict("retry", f"the upstream answered with a JSON {type(raw).__name__}, "
                                        "not an object"))
            blocks = raw.get("content")
            if up.provider == "anthropic" and not (isinstance(blocks, list)
                                                   and all(isinstance(b, dict) for b in blocks)):
                # else translated as an empty answer: a silent drop of whatever it did say
                raise Retryable(Verdict("retry", "the upstream's answer has no content blocks (not a message)"))
            try:
                data: dict[str, Any] = prov.parse_response(endpoint, raw)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise Retryable(Verdict("retry", "the upstream's answer has an unexpected shape")) from exc
            choices = data.get("choices")
            if not (isinstance(choices, list) and choices and all(isinstance(c, dict) for c in choices)):
                raise Retryable(Verdict("retry", "the upstream's answer has no choices (not a completion)"))
            if headers_out is not None:
                headers_out.update(relayed_headers(resp.headers))
                headers_out[REVISION_HEADER] = rev
            return data

        return await self._with_retries(up, once, at, extra=revs.extra)

    async def open_stream(self, up: Upstream, endpoint: str, body: dict[str, Any],
                          at: Attempt | None = None) -> tuple[Stream, Any]:
        """A stream whose first chunk has arrived (so a stall before it is retried or escalated, as
        nothing has reached the client yet), and a chunk translator (None: pass through)."""
        at = at or Attempt()
        if why := missing_key(up):
            raise UpstreamFailed(why)
        revs = Revisions(up, endpoint, body, self.draw(), self.fleet)
        lim = limits(up, at.timeouts)

        async def once() -> tuple[Stream, Any]:
            return (await self._tried(up, revs, attempt))[0]

        async def attempt(rev: Revision, request: Request, lease: Lease | None) -> tuple[Stream, Any]:
            url, headers, payload = request
            resp: aiohttp.ClientResponse | None = None
            first_byte = asyncio.timeout(lim.first_byte)
            try:
                async with first_byte:
                    resp = await self._post(url, headers, payload, lim)
                    if resp.status >= 400:
                        content = await resp.read()
                        resp.release()
                        self._refuse(up, resp.status, resp.headers, content, at)
                    first = await resp.content.readany()
            except TimeoutError as exc:
                if resp is not None:
                    resp.close()  # half-read: never back into the pool
                if first_byte.expired():
                    raise self._timed_out(up, self._late(lim), at, rev) from exc
                raise Retryable(Verdict("retry", type(exc).__name__)) from exc
            except NETWORK_ERRORS as exc:
                if resp is not None:
                    resp.close()
                raise Retryable(Verdict("retry", type(exc).__name__)) from exc
            assert resp is not None
            if not first:
                resp.release()
                raise Retryable(Verdict("retry", "the upstream ended the stream before sending anything"))
            translator = anthropic.StreamTranslator() if up.provider == "anthropic" else None
            return Stream(resp, first, lim.idle, rev, lease), translator

        return await self._with_retries(up, once, at, extra=revs.extra)
