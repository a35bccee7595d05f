"""The upstream policy as tables: what each error answer leads to (retry, escalate, relay), the
Retry-After decision, and which timeouts a call gets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from oculis import ConfigError, SemanticTier, Timeouts, Upstream, parse_config
from oculis.upstream import GPUUpstreamSpec
from oculis_router.upstreams import Limits, limits
from oculis_router.verdicts import RETRY_AFTER_WAIT_MAX_S, UpstreamFailed, Verdict, judge, retry_after_seconds

NOW = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)


def date(seconds: float) -> str:
    return format_datetime(NOW + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(("headers", "seconds"), [
    ({}, None),
    ({"Retry-After": "3"}, 3.0),
    ({"retry-after": "0"}, 0.0),
    ({"RETRY-AFTER": " 120 "}, 120.0),
    ({"Retry-After": "1.5"}, 1.5),
    ({"Retry-After": date(30)}, 30.0),  # an HTTP date
    ({"Retry-After": date(-30)}, 0.0),  # a date already past: now
    ({"Retry-After": "Tue, 01 Dec 2026 08:00:30"}, 30.0),  # no zone given: GMT, as HTTP dates are
    ({"Retry-After": "soon"}, None),
    ({"Retry-After": "-5"}, None),
    ({"Retry-After": "nan"}, None),
    ({"Retry-After": "inf"}, None),
    ({"retry-after-ms": "250"}, 0.25),  # OpenAI's finer header wins over Retry-After
    ({"retry-after-ms": "250", "Retry-After": "1"}, 0.25),
    ({"retry-after-ms": "x", "Retry-After": "1"}, 1.0),
])
def test_retry_after_reads_seconds_milliseconds_and_http_dates(headers: dict[str, str], seconds: float | None) -> None:
    got = retry_after_seconds(headers, NOW)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


CONTEXT_BODIES = [
    b'{"error": {"message": "This model\'s maximum context length is 4096 tokens. However, you requested 5000"}}',
    b'{"error": {"message": "The decoder prompt (length 9000) is longer than the maximum model length of 8192."}}',
    b'{"error": {"message": "...", "code": "context_length_exceeded"}}',
    b'{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens"}}',
]


@pytest.mark.parametrize(("status", "headers", "body", "action", "client_status"), [
    (500, {}, b"", "retry", 502),
    (502, {}, b"<html>bad gateway</html>", "retry", 502),
    (503, {}, b"", "retry", 502),
    (429, {}, b"", "retry", 429),  # no Retry-After: backoff
    (429, {"Retry-After": "1"}, b"", "retry", 429),
    (429, {"Retry-After": str(RETRY_AFTER_WAIT_MAX_S)}, b"", "retry", 429),
    (429, {"Retry-After": "3"}, b"", "escalate", 429),  # too long to wait here: the next tier, at once
    (429, {"Retry-After": date(60)}, b"", "escalate", 429),
    (503, {"Retry-After": "60"}, b"", "escalate", 503),
    (401, {}, b'{"error": {"message": "Incorrect API key provided: sk-upstr***"}}', "escalate", 502),
    (403, {}, b"", "escalate", 502),
    *[(400, {}, body, "escalate", 400) for body in CONTEXT_BODIES],
    (400, {}, b'{"error": {"message": "temperature must be <= 2"}}', "relay", 400),
    (404, {}, b'{"error": {"message": "The model `x` does not exist."}}', "relay", 404),
    (422, {}, b'{"detail": "bad"}', "relay", 422),
    (408, {}, b"", "relay", 408),
])
def test_which_errors_retry_escalate_or_relay(status: int, headers: dict[str, str], body: bytes, action: str,
                                              client_status: int) -> None:
    v = judge(status, headers, body, NOW)
    assert (v.action, v.status) == (action, client_status)


def test_a_short_retry_after_is_the_wait_a_long_one_is_relayed() -> None:
    assert judge(429, {"Retry-After": "2"}, b"", NOW).wait == 2.0
    assert judge(429, {}, b"", NOW).wait is None  # exponential backoff
    long = judge(429, {"Retry-After": "30"}, b"", NOW)
    assert long.wait is None and long.retry_after == 30.0
    err = UpstreamFailed("llama: status 429", long).client_error("llama")
    assert err.status == 429 and err.code == "rate_limit_exceeded"
    assert err.response().headers["retry-after"] == "30"
    assert "retry-after" not in UpstreamFailed("x", judge(429, {}, b"", NOW)).client_error("x").response().headers


def test_a_refused_credential_never_echoes_the_providers_text() -> None:
    v = judge(401, {}, b'{"error": {"message": "Incorrect API key provided: sk-upstr***1234"}}', NOW)
    assert v.credential and "sk-upstr" not in v.reason
    err = UpstreamFailed(f"gpt: {v.reason}", v).client_error("gpt")
    assert err.status == 502 and "sk-upstr" not in err.message and "credential" in err.message


def test_a_failure_without_a_verdict_is_a_502() -> None:
    assert UpstreamFailed("gpt: key unset").client_error("gpt").status == 502
    assert UpstreamFailed("x", Verdict("retry", "status 500")).client_error("x").code == "upstream_failed"


def up(**kw: object) -> Upstream:
    return Upstream.model_validate({"name": "u", "provider": "vllm", "base_url": "http://127.0.0.1:1/v1", **kw})


@pytest.mark.parametrize(("upstream", "tier", "want"), [
    ({}, None, Limits(10.0, 120.0, 60.0)),
    ({"timeout_seconds": 30}, None, Limits(10.0, 30.0, 60.0)),  # the old name is the first-byte timeout
    ({"timeouts": {"connect_seconds": 2, "idle_seconds": 5}}, None, Limits(2.0, 120.0, 5.0)),
    ({"timeouts": {"first_byte_seconds": 300}}, None, Limits(10.0, 300.0, 60.0)),
    ({"timeouts": {"connect_seconds": 2}}, {"first_byte_seconds": 600}, Limits(2.0, 600.0, 60.0)),
    ({"timeout_seconds": 30}, {"first_byte_seconds": 600}, Limits(10.0, 600.0, 60.0)),  # the tier wins
    ({"timeouts": {"idle_seconds": 5}}, {"idle_seconds": 1, "connect_seconds": 1}, Limits(1.0, 120.0, 1.0)),
])
def test_timeouts_resolve_tier_then_upstream_then_default(upstream: dict[str, object],
                                                          tier: dict[str, float] | None, want: Limits) -> None:
    assert limits(up(**upstream), Timeouts.model_validate(tier) if tier else None) == want


@pytest.mark.parametrize("bad", [0, -1, "nan", "inf"])
def test_a_timeout_must_be_a_positive_finite_number(bad: object) -> None:
    with pytest.raises(ValueError, match="first_byte_seconds"):
        Timeouts.model_validate({"first_byte_seconds": bad})


def test_the_old_and_the_new_first_byte_setting_cannot_both_be_given() -> None:
    text = """oculis:
  upstreams:
    - {name: u, provider: vllm, base_url: "http://127.0.0.1:1/v1", timeout_seconds: 30,
       timeouts: {first_byte_seconds: 60}}
"""
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert "timeout_seconds (30) is the deprecated name of timeouts.first_byte_seconds; remove timeout_seconds" \
        in str(err.value)


def test_timeouts_are_settable_from_the_crds_in_camel_case() -> None:
    spec = GPUUpstreamSpec.model_validate({"provider": "openai", "model": "gpt-4o",
                                           "timeouts": {"connectSeconds": 3, "firstByteSeconds": 90,
                                                        "idleSeconds": 20}})
    assert spec.timeouts == Timeouts(connect_seconds=3, first_byte_seconds=90, idle_seconds=20)
    tier = SemanticTier.model_validate({"name": "t", "upstream": "u", "timeouts": {"firstByteSeconds": 600}})
    assert tier.timeouts and tier.timeouts.first_byte_seconds == 600
