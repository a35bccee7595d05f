"""What a failed upstream attempt means, pure: `judge` turns an error answer's status, headers and body
into a Verdict (retry on the same upstream, move to the next tier at once, or relay the answer), and the
outcomes the caller raises carry it (upstreams.py says when each applies)."""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from oculis_router.errors import APIError
from oculis_router.pick import AdapterMissing

# A Retry-After up to this is waited out on the same upstream; a longer one moves to the next tier at
# once (a client should not wait on a rate-limited tier while another could answer), and is relayed
# with the 429 when no tier can answer.
RETRY_AFTER_WAIT_MAX_S = 2.0
# Phrases of a prompt over the model's context: vLLM ("This model's maximum context length is ...",
# "... is longer than the maximum model length"), OpenAI (code context_length_exceeded, "context
# window"), Anthropic ("prompt is too long"). A tier with a longer context may answer it.
CONTEXT_LENGTH_MARKERS = ("maximum context length", "maximum model length", "context_length_exceeded",
                          "context window", "prompt is too long")


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


def replica_fault(exc: BaseException) -> bool:
    """Whether a failed attempt says something about the replica (set it aside) rather than the request
    or the router's credential: a refused or reset connection, a timeout, a 5xx, a broken answer."""
    if isinstance(exc, Retryable):
        return True
    return isinstance(exc, UpstreamFailed) and not (exc.verdict.credential or exc.verdict.context_length)
