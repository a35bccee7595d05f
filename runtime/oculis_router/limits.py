"""Rate limits and dollar budgets per tenant, key or route: the policy, pure (no I/O, the clock passed in).

Which limits apply to a request (`policy_for`: the first matching override, else the route's own,
else the server's defaults), the counters it is checked against (`counters_for`), what it reserves
before it is admitted (`reservation`: the estimated prompt plus max_tokens, and the worst-case cost
over the tiers it may reach), the verdict over the counts a backend returns (`judge`: admit with the
x-ratelimit-* headers, or an OpenAI-shaped 429), and what it settles at its end (`settlement`: the
reservation replaced by the real usage, priced by `usage.cost_dollars` like `oculis_cost_dollars_total`).

Rates are counted over a rolling window cut into SLICES slices: a request is admitted when the sum of
every slice still inside the window (the oldest one whole, so the count never under-states the last
60 s or 24 h) plus its reservation stays within the limit. That is a sliding window, not a window that
resets: no burst of twice the limit across a boundary. Budgets are cumulative per calendar period (UTC
hour, day, month) and start again from zero at its end. The backends (limits_store.py) keep the slices
and apply `judge`'s rule atomically; everything else is decided here.
"""

from __future__ import annotations

import calendar
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Literal

from starlette.responses import JSONResponse

from oculis.router import Budget, LimitMatch, LimitOverride, Limits, Route, ServerSettings
from oculis.router_upstream import Pricing
from oculis_router.answer_check import Grading
from oculis_router.errors import APIError
from oculis_router.usage import Usage, cost_dollars

Kind = Literal["requests_per_minute", "tokens_per_minute", "tokens_per_day", "budget"]
RATE_KINDS: tuple[Kind, ...] = ("requests_per_minute", "tokens_per_minute", "tokens_per_day")
SPAN_S: dict[str, float] = {"requests_per_minute": 60.0, "tokens_per_minute": 60.0, "tokens_per_day": 86400.0}
SLICES = 60  # a minute counted in seconds, a day in 24-minute slices
EPSILON = 1e-9  # dollars are floats: a sum that equals the budget to the nanodollar fits


@dataclass(frozen=True)
class Identity:
    """Who sent a request: the tenant (as the cache partitions: `inbound.tenant_of`), the API key's
    SHA-256 (never the key) and the X-Oculis-Tenant header."""

    tenant: str
    key_sha256: str
    tenant_header: str | None


def identity_of(headers: Mapping[str, str], tenant: str) -> Identity:
    auth = headers.get("authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else auth
    key = hashlib.sha256(token.encode()).hexdigest() if token else "anonymous"
    return Identity(tenant, key, headers.get("x-oculis-tenant"))


def matches(m: LimitMatch, who: Identity) -> bool:
    if m.tenant is not None and m.tenant != who.tenant_header:
        return False
    return m.key_sha256 is None or who.key_sha256.startswith(m.key_sha256)


@dataclass(frozen=True)
class Policy:
    """The limits and budget of one request, each with the scope whose counters it uses: a route's
    own settings count that route; the server's count across every route that has none."""

    limits: Limits | None
    limits_scope: str
    budget: Budget | None
    budget_scope: str


SERVER_SCOPE = "*"


def policy_for(server: ServerSettings, route: Route | None, who: Identity) -> Policy:
    """The first override that matches (the route's, then the server's) decides what it sets; what it
    leaves unset, and every request no override matches, takes the route's own, else the server's."""
    limits: tuple[Limits, str] | None = None
    budget: tuple[Budget, str] | None = None
    overrides: list[tuple[LimitOverride, str]] = []
    if route is not None:
        overrides += [(o, route.name) for o in route.limit_overrides]
    overrides += [(o, SERVER_SCOPE) for o in server.limit_overrides]
    for o, scope in overrides:
        if matches(o.match, who):
            if o.limits is not None and limits is None:
                limits = (o.limits, scope)
            if o.budget is not None and budget is None:
                budget = (o.budget, scope)
            break
    if limits is None:
        if route is not None and route.limits is not None:
            limits = (route.limits, route.name)
        elif server.limits is not None:
            limits = (server.limits, SERVER_SCOPE)
    if budget is None:
        if route is not None and route.budget is not None:
            budget = (route.budget, route.name)
        elif server.budget is not None:
            budget = (server.budget, SERVER_SCOPE)
    return Policy(limits[0] if limits else None, limits[1] if limits else "",
                  budget[0] if budget else None, budget[1] if budget else "")


def limited_anywhere(server: ServerSettings, routes: Sequence[Route]) -> bool:
    """Whether any request could meet a limit (else the router builds no limiter and pays nothing)."""
    return bool(server.limits or server.budget or server.limit_overrides
                or any(r.limits or r.budget or r.limit_overrides for r in routes))


@dataclass(frozen=True)
class Counter:
    """One count a request is checked against: the slices of one key, `slot` the one this request
    is recorded in, slices below `oldest` no longer counting."""

    key: str
    kind: Kind
    limit: float
    per: str
    scope: str
    subject: str  # what the metrics may show: a route's name, else a short digest
    slot: int
    oldest: int
    slot_s: float  # a rolling slice's length (0 for a calendar budget)
    period_end: float  # a budget's reset (epoch seconds); 0 for rates
    ttl_s: int  # the key outlives its last write by this much

    def leaves_at(self, slot: int) -> float:
        """When what is recorded in `slot` stops counting (epoch seconds)."""
        if self.kind == "budget":
            return self.period_end
        return (slot + SLICES + 1) * self.slot_s


def _subject(per: str, who: Identity, route_name: str) -> tuple[str, str]:
    """The key part and the metric label of who shares a count; a digest, so neither keys, tenants'
    header values nor anything of unbounded length ends up in Redis keys or labels."""
    if per == "route":
        return route_name, route_name
    raw = who.key_sha256 if per == "key" else who.tenant
    digest = hashlib.sha256(raw.encode()).hexdigest()
    return digest[:32], f"{per[0]}-{digest[:12]}"


def period_bounds(period: str, now: float) -> tuple[int, float]:
    """A budget period's number and its end (epoch seconds), in UTC."""
    if period == "hour":
        n = int(now // 3600)
        return n, (n + 1) * 3600.0
    if period == "day":
        n = int(now // 86400)
        return n, (n + 1) * 86400.0
    t = datetime.fromtimestamp(now, UTC)
    n = t.year * 12 + t.month - 1
    y, m = divmod(n + 1, 12)
    return n, float(calendar.timegm((y, m + 1, 1, 0, 0, 0)))


def counters_for(policy: Policy, who: Identity, route_name: str, now: float) -> list[Counter]:
    out: list[Counter] = []
    if policy.limits is not None:
        lim = policy.limits
        key_part, label = _subject(lim.per, who, route_name)
        for kind in RATE_KINDS:
            limit = getattr(lim, kind)
            if limit is None:
                continue
            slot_s = SPAN_S[kind] / SLICES
            slot = int(now // slot_s)
            out.append(Counter(f"oculis:rl:{policy.limits_scope}:{kind}:{lim.per}:{key_part}", kind, float(limit),
                               lim.per, policy.limits_scope, label, slot, slot - SLICES, slot_s, 0.0,
                               int(SPAN_S[kind] + 2 * slot_s)))
    if policy.budget is not None:
        b = policy.budget
        key_part, label = _subject(b.per, who, route_name)
        n, end = period_bounds(b.period, now)
        out.append(Counter(f"oculis:rl:{policy.budget_scope}:budget-{b.period}:{b.per}:{key_part}", "budget",
                           b.dollars, b.per, policy.budget_scope, label, n, n, 0.0, end,
                           int(end - now) + 3600))
    return out


@dataclass(frozen=True)
class Reservation:
    """What a request holds while it runs: its estimated prompt, the completion it may produce, and
    the most it may cost (at the priciest tier it may reach)."""

    prompt_tokens: int
    max_completion: int
    dollars: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_completion


def max_completion_of(body: Mapping[str, Any], default: int) -> int:
    """The most completion tokens the request may produce: its cap per choice, times the sequences the
    engine generates (`n` choices; `best_of` on /v1/completions)."""
    sequences = max([1] + [v for name in ("n", "best_of") if isinstance(v := body.get(name), int)
                           and not isinstance(v, bool)])
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v * sequences
    return default * sequences


def worst_cost(prices: Sequence[Pricing], prompt: int, completion: int,
               replaceable: Sequence[bool] = (), graded: Sequence[Grading | None] = ()) -> float:
    """The most `prompt` + `completion` tokens can cost on these tiers (in attempt order): every prompt
    token uncached, or written to the provider's cache when that is dearer. `replaceable[i]`: tier i's
    answer may be replaced by tier i+1's (escalation.on_answer), so both are billed; the worst case is
    then the dearest run of attempts chained that way, not one tier. `graded[i]`: a verifier grades
    tier i's answer (the conversation, the answer and the rubric in, its score out), billed as well."""
    plain, written = Usage(prompt, completion, 0, 0), Usage(prompt, completion, 0, prompt)
    each = [max(cost_dollars(p, plain), cost_dollars(p, written)) for p in prices]
    for i, g in enumerate(graded[:len(each)]):
        if g is not None:
            each[i] += g.cost(prompt, completion)
    worst = 0.0
    for start in range(len(each)):
        total, i = each[start], start
        while i + 1 < len(each) and i < len(replaceable) and replaceable[i]:
            i += 1
            total += each[i]
        worst = max(worst, total)
    return worst


def reservation(body: Mapping[str, Any], prompt_tokens: int, default_max: int, prices: Sequence[Pricing],
                replaceable: Sequence[bool] = (), graded: Sequence[Grading | None] = ()) -> Reservation:
    """Tokens are reserved for one answer (a replaced one is settled at the end); dollars for the worst
    chain of billed answers (and their gradings)."""
    out = max_completion_of(body, default_max)
    return Reservation(prompt_tokens, out, worst_cost(prices, prompt_tokens, out, replaceable, graded))


def amount(c: Counter, r: Reservation) -> float:
    if c.kind == "requests_per_minute":
        return 1.0
    if c.kind == "budget":
        return r.dollars
    return float(r.tokens)


def used(slots: Mapping[int, float], c: Counter) -> float:
    return sum(v for s, v in slots.items() if s >= c.oldest)


def fits(slots: Mapping[int, float], c: Counter, amount_: float) -> bool:
    """The backends' admission rule (the Lua script applies the same)."""
    return used(slots, c) + amount_ <= c.limit + EPSILON


def wait_until_fits(slots: Mapping[int, float], c: Counter, amount_: float, now: float) -> float | None:
    """Seconds until enough of what is counted leaves the window for `amount_` to fit; None if it
    never can (more than the whole limit)."""
    if amount_ > c.limit + EPSILON:
        return None
    total = used(slots, c)
    if total + amount_ <= c.limit + EPSILON:
        return 0.0
    for s in sorted(k for k in slots if k >= c.oldest):
        total -= slots[s]
        if total + amount_ <= c.limit + EPSILON:
            return max(c.leaves_at(s) - now, 0.0)
    return max(c.leaves_at(c.slot) - now, 0.0)


def duration(seconds: float) -> str:
    """OpenAI's form of the x-ratelimit-reset-* headers: `20ms`, `1.5s`, `6m0s`, `2h3m4s`."""
    if seconds < 1:
        return f"{max(math.ceil(seconds * 1000), 0)}ms"
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, _ = divmod(rest, 60)
    s = seconds - h * 3600 - m * 60
    sec = f"{s:.3f}".rstrip("0").rstrip(".") + "s"
    return (f"{h}h{m}m" if h else f"{m}m" if m else "") + sec


@dataclass(frozen=True)
class Refusal:
    counter: Counter
    used: float
    requested: float
    retry_after: float | None  # None: the request can never fit


class LimitRefusal(APIError):
    """A 429 with its headers; `response()` sends them (the router answers APIErrors that way)."""

    def __init__(self, status: int, message: str, type_: str, code: str, headers: dict[str, str],
                 kind: str) -> None:
        super().__init__(status, message, type_=type_, code=code)
        self.headers, self.kind = headers, kind

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return super().response({**self.headers, **(headers or {})})


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    headers: dict[str, str]
    refusal: Refusal | None = None


@lru_cache(maxsize=64)
def iso(ts: float) -> str:
    """A period's end as UTC ISO 8601 (the same few values all period long: memoised)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _money(d: float) -> str:
    """Cents always, tenths of a cent and below only when there are some: $0.50, $0.013, $1,234.00."""
    whole, frac = f"{d:,.6f}".split(".")
    return f"${whole}.{frac.rstrip('0').ljust(2, '0')}"


def rate_headers(counters: Sequence[Counter], states: Sequence[Mapping[int, float]], amounts: Sequence[float],
                 now: float, admitted: bool) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers after this request: for tokens, the tighter of the token limits.
    Reset: when the count is back to nothing (the newest counted slice leaves the window)."""
    h: dict[str, str] = {}
    best: tuple[float, Counter, float, Mapping[int, float]] | None = None
    for c, slots, a in zip(counters, states, amounts, strict=True):
        after = used(slots, c) + (a if admitted else 0.0)
        remaining = max(c.limit - after, 0.0)
        live = [s for s, v in slots.items() if s >= c.oldest and v > 0]
        if admitted:
            live.append(c.slot)
        reset = max(c.leaves_at(max(live)) - now, 0.0) if live else 0.0
        if c.kind == "requests_per_minute":
            h["x-ratelimit-limit-requests"] = str(int(c.limit))
            h["x-ratelimit-remaining-requests"] = str(int(remaining))
            h["x-ratelimit-reset-requests"] = duration(reset)
        elif c.kind == "budget":
            h["x-oculis-budget-remaining-dollars"] = f"{remaining:.6f}"
            h["x-oculis-budget-reset"] = iso(c.period_end)
        elif best is None or remaining < best[0]:
            best = (remaining, c, reset, slots)
    if best is not None:
        h["x-ratelimit-limit-tokens"] = str(int(best[1].limit))
        h["x-ratelimit-remaining-tokens"] = str(int(best[0]))
        h["x-ratelimit-reset-tokens"] = duration(best[2])
    return h


def judge(counters: Sequence[Counter], states: Sequence[Mapping[int, float]], amounts: Sequence[float],
          admitted: bool, now: float) -> Verdict:
    """The backend said whether every counter had room (it adds the amounts only then); this says
    which limit refused, and when to come back."""
    headers = rate_headers(counters, states, amounts, now, admitted)
    if admitted:
        return Verdict(True, headers)
    # Budget first: "stop" outranks "slow down". Then the longest wait, which is the one to honour.
    worst: Refusal | None = None
    for c, slots, a in sorted(zip(counters, states, amounts, strict=True), key=lambda t: t[0].kind != "budget"):
        if fits(slots, c, a):
            continue
        r = Refusal(c, used(slots, c), a, wait_until_fits(slots, c, a, now))
        if worst is None or (worst.counter.kind != "budget" and (
                c.kind == "budget" or r.retry_after is None
                or (worst.retry_after is not None and r.retry_after > worst.retry_after))):
            worst = r
    if worst is None:  # counts moved between the backend's check and now: still refused, retry at once
        worst = Refusal(counters[0], used(states[0], counters[0]), amounts[0], 0.0)
    return Verdict(False, headers, worst)


def _who(c: Counter) -> str:
    return "everyone on it" if c.per == "route" else f"per {c.per}"


def _where(c: Counter, route_name: str) -> str:
    return f"route {route_name!r}" if c.scope != SERVER_SCOPE else "this router (server defaults)"


def refusal_error(v: Verdict, route_name: str, now: float) -> LimitRefusal:
    """The 429: `rate_limit_exceeded` (slow down: Retry-After says when it fits) or
    `insufficient_quota` (stop: the budget is spent until its period ends; SDKs told not to retry)."""
    r = v.refusal
    assert r is not None
    c = r.counter
    headers = dict(v.headers)
    if c.kind == "budget":
        reset = iso(c.period_end)
        wait = max(c.period_end - now, 0.0)
        msg = (f"budget exhausted on {_where(c, route_name)}: {_money(c.limit)} per {_period(c)} {_who(c)}; "
               f"spent {_money(r.used)}, this request may cost up to {_money(r.requested)}; it resets at {reset} "
               f"(in {duration(wait)}); raise `budget.dollars` or wait")
        headers.update({"retry-after": str(max(math.ceil(wait), 1)), "x-should-retry": "false"})
        return LimitRefusal(429, msg, "insufficient_quota", "insufficient_quota", headers, "budget")
    unit = "requests" if c.kind == "requests_per_minute" else "tokens"
    what = "" if unit == "requests" else " (its prompt estimate plus max_tokens)"
    head = (f"rate limit reached on {_where(c, route_name)}: {c.kind} is {int(c.limit)} {_who(c)}; "
            f"used {int(r.used)}, this request needs {int(r.requested)}{what}")
    if r.retry_after is None:
        headers["x-should-retry"] = "false"
        return LimitRefusal(429, f"{head}, more than the whole limit: lower max_tokens or shorten the prompt",
                            unit, "rate_limit_exceeded", headers, c.kind)
    wait = r.retry_after
    # The true wait, even past 60 s (openai-python then backs off on its own): a shorter one would only
    # bring the client back to another 429.
    headers.update({"retry-after": str(max(math.ceil(wait), 1)), "retry-after-ms": str(max(math.ceil(wait * 1000), 1))})
    return LimitRefusal(429, f"{head}; try again in {duration(max(wait, 0.001))}", unit, "rate_limit_exceeded",
                        headers, c.kind)


def _period(c: Counter) -> str:
    return c.key.split(":")[3].removeprefix("budget-")


def backend_down_error(backend: str) -> LimitRefusal:
    """`on_backend_error: deny` while the counts cannot be read."""
    return LimitRefusal(429, f"rate limits cannot be checked: the limiter's store ({backend}) is unreachable and "
                        "server.limiter.on_backend_error is deny; try again shortly", "requests",
                        "rate_limit_exceeded", {"retry-after": "1", "retry-after-ms": "1000"}, "backend_error")


@dataclass
class Ticket:
    """One admitted request's hold on its counters, until it settles (once)."""

    counters: list[Counter]
    reserved: list[float]
    reservation: Reservation
    headers: dict[str, str]
    counted: bool = True  # False: admitted while the backend was down, nothing to settle
    usage: Usage | None = None
    pricing: Pricing | None = None  # of the upstream that answered
    answered: bool = False
    events: int = 0  # SSE events relayed, for a stream cut before its usage chunk
    settled: bool = field(default=False)
    earlier: tuple[int, float] = (0, 0.0)  # tokens and dollars of answers replaced by a later tier's

    def record(self, pricing: Pricing, usage: Usage | None) -> None:
        # An answer replaced on escalation.on_answer was generated and billed all the same (the metrics
        # count it): it stays charged, on top of the answer that is finally sent.
        if self.answered:
            tokens, dollars = spent(self)
            self.earlier = (tokens, dollars)
        self.answered, self.pricing, self.usage = True, pricing, usage


def spent(t: Ticket) -> tuple[int, float]:
    """What the request really used: the upstream's usage; a stream cut before it reported usage
    counts its prompt estimate and one token per event relayed (engines stream about one token per
    event); a request no upstream answered (a cache hit, a failure, a refusal) used nothing; an answer
    replaced by a later tier's (escalation.on_answer) was used too."""
    if not t.answered:
        return 0, 0.0
    u = t.usage
    if u is None:
        u = Usage(t.reservation.prompt_tokens, min(t.events, t.reservation.max_completion), 0, 0)
    dollars = cost_dollars(t.pricing, u) if t.pricing else 0.0
    return t.earlier[0] + u.prompt + u.completion, t.earlier[1] + dollars


def settlement(t: Ticket) -> list[float]:
    """Per counter, what to add to the reservation so the count holds what was really used."""
    tokens, dollars = spent(t)
    out = []
    for c, r in zip(t.counters, t.reserved, strict=True):
        real = 1.0 if c.kind == "requests_per_minute" else dollars if c.kind == "budget" else float(tokens)
        out.append(real - r)
    return out
