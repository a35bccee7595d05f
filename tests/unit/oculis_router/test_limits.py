"""Rate limits and budgets, the pure policy (oculis_router.limits) and the memory backend: which limit
applies, what a request reserves and settles, when it is refused and what it is told."""

from __future__ import annotations

import asyncio
import calendar
import time
from typing import Any

import pytest

from oculis import ConfigError, Pricing, parse_config
from oculis.inferenceroute import InferenceRouteSpec
from oculis.router import Budget, LimitMatch, LimitOverride, Limits, Route, ServerSettings
from oculis_operator import routeconfig, router_configmap
from oculis_router import limits as L
from oculis_router.limits_store import MemoryBackend
from oculis_router.usage import Usage, cost_dollars

ALICE = L.identity_of({"authorization": "Bearer sk-alice"}, "key-aaaa")
ALICE_TEAM = L.identity_of({"authorization": "Bearer sk-alice", "x-oculis-tenant": "team-a"}, "key-aaaa/team-a")
BOB = L.identity_of({"authorization": "Bearer sk-bob"}, "key-bbbb")
NOW = 1_800_000_000.0  # a fixed instant: every test passes the clock in


def route(**fields: Any) -> Route:
    return Route(name="adaptive", tiers=[{"name": "only", "upstream": "u"}], **fields)


def test_the_key_digest_is_of_the_bearer_key_never_the_key_itself() -> None:
    import hashlib

    assert ALICE.key_sha256 == hashlib.sha256(b"sk-alice").hexdigest()
    assert "sk-alice" not in repr(ALICE)
    assert L.identity_of({}, "anonymous").key_sha256 == "anonymous"


R_LIM, S_LIM = Limits(tokens_per_minute=100), Limits(tokens_per_minute=999)
O_LIM = Limits(requests_per_minute=5)
O_BUD, R_BUD = Budget(dollars=1), Budget(dollars=50)


@pytest.mark.parametrize(("server", "rt", "who", "want"), [
    # Nothing anywhere: nothing applies.
    (ServerSettings(), route(), ALICE, (None, "", None, "")),
    # The server default applies to a route without its own, counted across routes ("*").
    (ServerSettings(limits=S_LIM), route(), ALICE, (S_LIM, "*", None, "")),
    # A route's own replaces the default and counts that route only.
    (ServerSettings(limits=S_LIM, budget=O_BUD), route(limits=R_LIM), ALICE, (R_LIM, "adaptive", O_BUD, "*")),
    # A matching override wins, for what it sets; the rest stays general.
    (ServerSettings(limits=S_LIM), route(limits=R_LIM, budget=R_BUD, limit_overrides=[
        LimitOverride(match=LimitMatch(tenant="team-a"), limits=O_LIM)]), ALICE_TEAM,
     (O_LIM, "adaptive", R_BUD, "adaptive")),
    # The header alone is not the key: Alice without the header does not match a tenant override.
    (ServerSettings(), route(limits=R_LIM, limit_overrides=[
        LimitOverride(match=LimitMatch(tenant="team-a"), limits=O_LIM)]), ALICE, (R_LIM, "adaptive", None, "")),
    # A server override applies on every route, after the route's own overrides.
    (ServerSettings(limit_overrides=[LimitOverride(match=LimitMatch(key_sha256=BOB.key_sha256[:8]), budget=O_BUD)]),
     route(limits=R_LIM), BOB, (R_LIM, "adaptive", O_BUD, "*")),
    # All given match fields must hold.
    (ServerSettings(limit_overrides=[LimitOverride(match=LimitMatch(tenant="team-a", key_sha256=BOB.key_sha256),
                                                   limits=O_LIM)]), None, ALICE_TEAM, (None, "", None, "")),
    # A direct upstream call (no route) takes the server's.
    (ServerSettings(budget=O_BUD), None, ALICE, (None, "", O_BUD, "*")),
])
def test_the_first_matching_override_then_the_route_then_the_server_decides(
        server: ServerSettings, rt: Route | None, who: L.Identity, want: tuple[Any, ...]) -> None:
    p = L.policy_for(server, rt, who)
    assert (p.limits, p.limits_scope, p.budget, p.budget_scope) == want


def test_who_shares_a_count_follows_per() -> None:
    pol = L.Policy(Limits(tokens_per_minute=10, per="tenant"), "adaptive", None, "")
    keys = {w.tenant: L.counters_for(pol, w, "adaptive", NOW)[0].key for w in (ALICE, ALICE_TEAM, BOB)}
    assert len(set(keys.values())) == 3  # per tenant: the X-Oculis-Tenant subdivision has its own count
    by_key = L.Policy(Limits(tokens_per_minute=10, per="key"), "adaptive", None, "")
    assert L.counters_for(by_key, ALICE, "r", NOW)[0].key == L.counters_for(by_key, ALICE_TEAM, "r", NOW)[0].key
    by_route = L.Policy(Limits(tokens_per_minute=10, per="route"), "adaptive", None, "")
    shared = {L.counters_for(by_route, w, "adaptive", NOW)[0].key for w in (ALICE, BOB)}
    assert len(shared) == 1
    assert L.counters_for(by_route, ALICE, "adaptive", NOW)[0].subject == "adaptive"
    # Redis keys and metric labels carry digests, never the tenant's header value or the key
    c = L.counters_for(pol, ALICE_TEAM, "adaptive", NOW)[0]
    assert "team-a" not in c.key and "team-a" not in c.subject and "alice" not in c.key


@pytest.mark.parametrize(("period", "at", "end"), [
    ("hour", (2026, 12, 1, 7, 59, 59), (2026, 12, 1, 8, 0, 0)),
    ("day", (2026, 12, 1, 23, 0, 0), (2026, 12, 2, 0, 0, 0)),
    ("month", (2026, 12, 31, 23, 59, 0), (2027, 1, 1, 0, 0, 0)),
    ("month", (2028, 2, 10, 0, 0, 0), (2028, 3, 1, 0, 0, 0)),
])
def test_budget_periods_end_at_the_next_utc_hour_day_or_month(period: str, at: tuple[int, ...],
                                                              end: tuple[int, ...]) -> None:
    n, ends = L.period_bounds(period, float(calendar.timegm((*at, 0, 0, 0))))
    assert ends == calendar.timegm((*end, 0, 0, 0))
    assert L.period_bounds(period, ends)[0] == n + 1  # the next period is a fresh count


@pytest.mark.parametrize(("body", "want"), [
    ({"max_tokens": 50}, 50),
    ({"max_completion_tokens": 70, "max_tokens": 50}, 70),  # the newer name wins, as OpenAI reads it
    ({"max_tokens": True}, 256),  # not a count: the default
    ({"max_tokens": "9"}, 256),
    ({}, 256),
    ({"max_tokens": 50, "n": 3}, 150),  # n choices: n times the cap (QA pass 2, finding 15)
    ({"n": 2}, 512),
    ({"max_tokens": 10, "best_of": 4, "n": 2}, 40),  # /v1/completions generates best_of sequences
])
def test_a_request_reserves_its_prompt_and_max_tokens_or_the_default(body: dict[str, Any], want: int) -> None:
    r = L.reservation(body, 40, 256, [])
    assert (r.prompt_tokens, r.max_completion, r.tokens) == (40, want, 40 + want)


def test_the_dollar_reservation_is_the_worst_case_over_the_tiers_by_the_metrics_cost_math() -> None:
    cheap = Pricing(input_per_mtok=0.05, output_per_mtok=0.08)
    dear = Pricing(input_per_mtok=3, output_per_mtok=15, cache_write_per_mtok=3.75)
    r = L.reservation({"max_tokens": 1000}, 2000, 256, [cheap, dear])
    # every prompt token written to the provider's cache is the dearest way to pay for it
    assert r.dollars == pytest.approx(cost_dollars(dear, Usage(2000, 1000, 0, 2000)))
    assert r.dollars == pytest.approx((2000 * 3.75 + 1000 * 15) / 1e6)


def test_the_dollar_reservation_covers_answers_billed_and_replaced_on_escalation() -> None:
    """With escalation.on_answer a checked tier's answer is billed and then replaced by the next tier's:
    admission must reserve the whole chain, not only the dearest tier."""
    cheap = Pricing(input_per_mtok=0.05, output_per_mtok=0.08)
    dear = Pricing(input_per_mtok=3, output_per_mtok=15)
    one = L.reservation({"max_tokens": 1000}, 2000, 256, [cheap, dear]).dollars
    chained = L.reservation({"max_tokens": 1000}, 2000, 256, [cheap, dear], [True, False]).dollars
    assert one == pytest.approx(cost_dollars(dear, Usage(2000, 1000, 0, 0)))
    assert chained == pytest.approx(cost_dollars(cheap, Usage(2000, 1000, 0, 0)) + one)
    # a chain stops at a tier whose answer is not checked
    mid = Pricing(input_per_mtok=1, output_per_mtok=1)
    assert L.worst_cost([cheap, mid, dear], 2000, 1000, [False, True, False]) == pytest.approx(
        cost_dollars(mid, Usage(2000, 1000, 0, 0)) + one)


def rate(limit: float, kind: L.Kind = "tokens_per_minute") -> L.Counter:
    pol = L.Policy(Limits(**{kind: int(limit)}), "adaptive", None, "")
    return L.counters_for(pol, ALICE, "adaptive", NOW)[0]


def test_counts_slide_with_time_instead_of_resetting_at_a_window_boundary() -> None:
    c = rate(100)
    assert c.slot_s == 1.0
    full = {c.slot - 59: 90.0}  # 59 s ago: still inside the last minute
    assert not L.fits(full, c, 20)
    later = L.counters_for(L.Policy(Limits(tokens_per_minute=100), "adaptive", None, ""), ALICE, "adaptive", NOW + 2)[0]
    assert L.fits(full, later, 20)  # 61+ s ago: gone, slice by slice, not all at once on the minute
    # a fixed window would admit 90 more just after its boundary; this window still holds the 90
    half = {c.slot - 30: 90.0}
    assert not L.fits(half, rate(100), 20)


def test_retry_after_is_when_enough_of_the_count_leaves_the_window() -> None:
    c = rate(100)
    slots = {c.slot - 50: 30.0, c.slot - 20: 60.0}
    assert L.wait_until_fits(slots, c, 20, NOW) == pytest.approx(c.leaves_at(c.slot - 50) - NOW)
    assert L.wait_until_fits(slots, c, 50, NOW) == pytest.approx(c.leaves_at(c.slot - 20) - NOW)
    assert L.wait_until_fits(slots, c, 101, NOW) is None  # more than the whole limit: never
    assert L.wait_until_fits({}, c, 100, NOW) == 0.0


def test_a_rate_refusal_says_slow_down_with_openai_code_headers_and_when() -> None:
    c = rate(2000)
    slots = {c.slot - 10: 1990.0}
    v = L.judge([c], [slots], [50.0], False, NOW)
    err = L.refusal_error(v, "adaptive", NOW)
    body = err.body()["error"]
    assert (err.status, body["code"], body["type"]) == (429, "rate_limit_exceeded", "tokens")
    assert "tokens_per_minute is 2000 per key" in body["message"] and "used 1990" in body["message"]
    assert "needs 50" in body["message"] and "try again in" in body["message"]
    wait = c.leaves_at(c.slot - 10) - NOW
    assert err.headers["retry-after"] == str(int(-(-wait // 1)))
    assert err.headers["retry-after-ms"] == str(int(-(-wait * 1000 // 1)))
    assert err.headers["x-ratelimit-limit-tokens"] == "2000" and err.headers["x-ratelimit-remaining-tokens"] == "10"
    assert "x-should-retry" not in err.headers
    resp = err.response()
    assert resp.status_code == 429 and resp.headers["retry-after"] == err.headers["retry-after"]


def test_a_request_larger_than_the_whole_limit_is_told_it_can_never_fit() -> None:
    c = rate(100)
    err = L.refusal_error(L.judge([c], [{}], [500.0], False, NOW), "adaptive", NOW)
    assert "more than the whole limit: lower max_tokens" in err.message
    assert err.headers["x-should-retry"] == "false" and "retry-after" not in err.headers


def budget_counter(dollars: float = 1.0, per: str = "key") -> L.Counter:
    pol = L.Policy(None, "", Budget(dollars=dollars, period="day", per=per), "adaptive")
    return L.counters_for(pol, ALICE, "adaptive", NOW)[0]


def test_an_exhausted_budget_says_stop_until_its_period_ends_and_outranks_a_rate_limit() -> None:
    b, r = budget_counter(), rate(10)
    v = L.judge([r, b], [{r.slot: 10.0}, {b.slot: 0.999}], [20.0, 0.01], False, NOW)
    err = L.refusal_error(v, "adaptive", NOW)
    body = err.body()["error"]
    assert (err.status, body["code"], body["type"]) == (429, "insufficient_quota", "insufficient_quota")
    assert "$1.00 per day per key" in body["message"] and "resets at" in body["message"]
    assert err.headers["x-should-retry"] == "false"  # SDKs retry 429s: a spent budget is not worth retrying
    assert int(err.headers["retry-after"]) == pytest.approx(b.period_end - NOW, abs=1)
    assert err.kind == "budget"


def test_answers_carry_openais_headers_for_the_tighter_token_limit() -> None:
    pol = L.Policy(Limits(requests_per_minute=60, tokens_per_minute=1000, tokens_per_day=5000), "r", None, "")
    cs = L.counters_for(pol, ALICE, "r", NOW)
    states = [{cs[0].slot: 10.0}, {cs[1].slot: 100.0}, {cs[2].slot - 5: 4800.0}]
    h = L.judge(cs, states, [1.0, 50.0, 50.0], True, NOW).headers
    assert h["x-ratelimit-limit-requests"] == "60" and h["x-ratelimit-remaining-requests"] == "49"
    assert h["x-ratelimit-limit-tokens"] == "5000" and h["x-ratelimit-remaining-tokens"] == "150"  # the day binds
    assert h["x-ratelimit-reset-tokens"].endswith("s") and h["x-ratelimit-reset-requests"] == L.duration(
        cs[0].leaves_at(cs[0].slot) - NOW)


@pytest.mark.parametrize(("seconds", "text"), [
    (0.02, "20ms"), (1.5, "1.5s"), (60.0, "1m0s"), (360.0, "6m0s"), (7384.25, "2h3m4.25s"), (0.0, "0ms")])
def test_reset_durations_read_as_openai_writes_them(seconds: float, text: str) -> None:
    assert L.duration(seconds) == text


def ticket(kinds: list[L.Counter], reserved: list[float], res: L.Reservation) -> L.Ticket:
    return L.Ticket(kinds, reserved, res, {})


def test_settling_replaces_the_reservation_by_the_real_usage_priced_as_the_metrics_price_it() -> None:
    p = Pricing(input_per_mtok=2.5, output_per_mtok=10, cached_input_per_mtok=1.25)
    res = L.Reservation(100, 500, 0.02)
    cs = [rate(60, "requests_per_minute"), rate(10000), budget_counter()]
    t = ticket(cs, [1.0, 600.0, 0.02], res)
    u = Usage(prompt=120, completion=30, cached=100, cache_written=0)
    t.record(p, u)
    assert L.settlement(t) == pytest.approx([0.0, 150 - 600, cost_dollars(p, u) - 0.02])


def test_a_stream_cut_before_its_usage_settles_what_it_relayed_and_an_unanswered_request_nothing() -> None:
    p = Pricing(input_per_mtok=1, output_per_mtok=2)
    res = L.Reservation(100, 500, 0.5)
    cut = ticket([rate(10000), budget_counter()], [600.0, 0.5], res)
    cut.record(p, None)
    cut.events = 40
    assert L.settlement(cut) == pytest.approx([140 - 600, cost_dollars(p, Usage(100, 40, 0, 0)) - 0.5])
    failed = ticket([rate(60, "requests_per_minute"), rate(10000)], [1.0, 600.0], res)  # no upstream answered
    assert L.settlement(failed) == [0.0, -600.0]  # the request still counts, its tokens do not


def test_an_answer_replaced_on_escalation_stays_charged_to_the_budget_with_the_final_one() -> None:
    cheap, strong = Pricing(input_per_mtok=0.2, output_per_mtok=0.6), Pricing(input_per_mtok=5, output_per_mtok=15)
    res = L.Reservation(100, 500, 0.5)
    t = ticket([rate(10000), budget_counter()], [600.0, 0.5], res)
    first, final = Usage(100, 300, 0, 0), Usage(100, 200, 0, 0)
    t.record(cheap, first)  # the unsure answer, replaced by the next tier's (both are in the metrics)
    t.record(strong, final)
    assert L.spent(t) == pytest.approx((700, cost_dollars(cheap, first) + cost_dollars(strong, final)))
    assert L.settlement(t) == pytest.approx([700 - 600, cost_dollars(cheap, first) + cost_dollars(strong, final)
                                             - 0.5])


def test_the_memory_backend_charges_all_counters_or_none() -> None:
    async def run() -> None:
        be = MemoryBackend()
        roomy, tight = rate(1000), rate(1, "requests_per_minute")
        ok, _ = await be.reserve([roomy, tight], [10.0, 1.0])
        assert ok
        ok, states = await be.reserve([roomy, tight], [10.0, 1.0])
        assert not ok and L.used(states[0], roomy) == 10.0  # the refusal added nothing to the roomy one
        ok, states = await be.reserve([roomy], [10.0])
        assert ok and L.used(states[0], roomy) == 10.0
        assert await be.settle([roomy], [-15.0]) == [5.0]  # 20 reserved in one slice, 15 of it given back
    asyncio.run(run())


@pytest.mark.parametrize(("snippet", "names"), [
    ("server: {limits: {tokens_per_minute: 0}}", "oculis.server.limits.tokens_per_minute"),
    ("server: {budget: {dollars: -1}}", "oculis.server.budget.dollars"),
    ("server: {budget: {dollars: 5, period: week}}", "oculis.server.budget.period"),
    ("server: {limits: {per: user}}", "oculis.server.limits.per"),
    ("server: {limit_overrides: [{match: {}}]}", "match needs tenant or key_sha256"),
    ("server: {limit_overrides: [{match: {key_sha256: sk-live-123}}]}", "key_sha256"),
    ("server: {limiter: {backend: redis}}", "server.redis_url is required when server.limiter.backend is redis"),
    ("server: {limiter: {on_backend_error: maybe}}", "oculis.server.limiter.on_backend_error"),
])
def test_bad_limit_settings_are_refused_naming_the_field(snippet: str, names: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(f"oculis:\n  upstreams: []\n  {snippet}\n")
    assert names in str(exc.value) and "Traceback" not in str(exc.value)


def test_an_inferenceroute_takes_limits_in_camel_case_and_the_operator_renders_them() -> None:
    spec = {"tiers": [{"name": "only", "upstream": "small"}],
            "limits": {"per": "key", "tokensPerMinute": 2000, "requestsPerMinute": 60},
            "budget": {"dollars": 25, "period": "month"},
            "limitOverrides": [{"match": {"tenant": "batch"}, "limits": {"tokensPerDay": 1_000_000}}]}
    parsed = InferenceRouteSpec.model_validate(spec)
    assert parsed.limits is not None and parsed.limits.tokens_per_minute == 2000
    gu = {"metadata": {"name": "small", "namespace": "ns", "generation": 1},
          "spec": {"provider": "vllm", "model": "m", "gpu": {"product": "H100-80GB", "count": 1}},
          "status": {"engineHash": "h", "conditions": [{"type": "Ready", "status": "True"}]}}
    out = routeconfig.render_namespace([{"metadata": {"name": "adaptive", "namespace": "ns", "generation": 1},
                                         "spec": spec}], [gu])
    cfg = parse_config(out.data[router_configmap.CONFIG_KEY])
    r = cfg.route("adaptive")
    assert r.limits == Limits(per="key", tokens_per_minute=2000, requests_per_minute=60)
    assert r.budget == Budget(dollars=25, period="month")
    assert r.limit_overrides[0].limits == Limits(tokens_per_day=1_000_000)


def test_nothing_limited_builds_no_limiter() -> None:
    assert not L.limited_anywhere(ServerSettings(), [route()])
    assert L.limited_anywhere(ServerSettings(), [route(budget=Budget(dollars=1))])
    assert L.limited_anywhere(ServerSettings(limits=Limits()), [])


def test_the_budget_gauge_shows_a_bounded_number_of_subjects_closest_to_their_budget() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from oculis_router.limits_store import BudgetGauge, LimitMetrics

    reg = CollectorRegistry()
    m = LimitMetrics.of(reg)
    assert LimitMetrics.of(reg) is m  # a reload builds a limiter, never a second set of metrics
    pol = L.Policy(None, "", Budget(dollars=10, period="day"), "adaptive")
    for i in range(500):  # many tenants: the series stay TOP_N, the ones with the least left
        who = L.identity_of({"authorization": f"Bearer sk-{i}"}, f"key-{i}")
        m.budget.observe(L.counters_for(pol, who, "adaptive", time.time())[0], total=i / 100)
    assert BudgetGauge.TOP_N == 20
    text = generate_latest(reg).decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("oculis_budget_remaining_dollars{")]
    assert len(lines) == 20
    assert min(float(ln.rsplit(" ", 1)[1]) for ln in lines) == pytest.approx(10 - 4.99)
    assert all('subject="k-' in ln and "sk-" not in ln for ln in lines)  # per key by default: digests


class DownBackend:
    name = "redis"

    def __init__(self) -> None:
        self.calls = 0

    async def reserve(self, counters: Any, amounts: Any) -> Any:
        self.calls += 1
        raise ConnectionError("Connection refused")

    async def settle(self, counters: Any, deltas: Any) -> Any:
        raise AssertionError("nothing was counted, so nothing is settled")

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("policy", ["allow", "deny"])
def test_a_store_that_is_down_is_answered_per_on_backend_error_and_left_alone_a_moment(policy: str) -> None:
    from prometheus_client import CollectorRegistry

    from oculis_router.limits_store import Limiter, LimitMetrics

    async def run() -> list[str]:
        be = DownBackend()
        lim = Limiter(be, LimitMetrics.of(CollectorRegistry()), policy)
        server = ServerSettings(limits=Limits(requests_per_minute=10))
        seen = []
        for _ in range(5):
            try:
                hold = await lim.admit(server, None, "up", ALICE, {}, 5, [])
                assert hold is not None and not hold.ticket.counted
                await hold.settle()
                seen.append("allowed")
            except L.LimitRefusal as err:
                assert err.status == 429 and err.code == "rate_limit_exceeded" and err.kind == "backend_error"
                assert err.headers["retry-after"] == "1" and "on_backend_error is deny" in err.message
                seen.append("refused")
        assert be.calls == 1  # the next calls within BACK_OFF_S do not wait on a dead store
        await asyncio.sleep(0)
        return seen

    assert asyncio.run(run()) == ["allowed" if policy == "allow" else "refused"] * 5


def test_by_default_a_client_cannot_get_fresh_counts_by_varying_x_oculis_tenant() -> None:
    pol = L.policy_for(ServerSettings(limits=Limits(tokens_per_minute=10)), None, ALICE)
    spoofed = [L.identity_of({"authorization": "Bearer sk-alice", "x-oculis-tenant": f"t{i}"}, f"key-aaaa/t{i}")
               for i in range(3)]
    assert len({L.counters_for(pol, w, "r", NOW)[0].key for w in [ALICE, *spoofed]}) == 1
