"""`oculis eval run --by-tier`: per-tier accuracy of a route against the all-strongest-tier baseline,
with a paired verdict. Pure functions, no I/O.

Every suite item is answered twice, by the tier the route picks and by the strongest tier, so the two
accuracies are paired: McNemar's exact test (scipy's binomial test on the discordant pairs) says
whether they differ, and the 95 % interval of the difference (Agresti-Min adjusted Wald: half an item
added to each cell, so a small tier with no disagreements still gets a wide interval, not [0, 0])
says whether the drop is within the tolerance. PASS only when the whole interval lies above
-tolerance; FAIL when the drop exceeds the tolerance and McNemar finds it significant; otherwise
INCONCLUSIVE, so a tier too small to tell never passes by default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oculis import Route
from oculis.router_upstream import Upstream
from oculis_measure.figures import absent, share
from oculis_measure.route import cascade

if TYPE_CHECKING:
    from oculis_measure.eval.kinds import Scored

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
EXIT_CODES = {PASS: 0, FAIL: 3, INCONCLUSIVE: 4}
MATCH_KINDS = ("exact", "regex", "json_field")
ALPHA = 0.05


class SuiteLineError(ValueError):
    """One bad suite line; the message starts with `line N:` and says how to fix it."""


@dataclass(frozen=True)
class Item:
    lineno: int
    payload: dict[str, Any]  # {"prompt"} or {"messages"}: what the router classifies / is sent
    outcomes: dict[str, bool] | None  # offline: correctness per upstream
    expected: str | None  # online: the answer to match
    match: str  # exact | regex | json_field
    field: str | None  # json_field: dotted path into the answer's JSON
    kind: str | None = None  # the kind of traffic (e.g. chat, mmlu): routing quality is reported per kind


def parse_line(lineno: int, line: str, offline: bool) -> Item:
    """One suite line; SuiteLineError naming the line, the field and the fix."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SuiteLineError(f"line {lineno}: not JSON ({exc.msg} at column {exc.colno}); write one JSON object "
                             "per line") from None
    except RecursionError:
        raise SuiteLineError(f"line {lineno}: nested too deeply; flatten the object") from None
    if not isinstance(raw, dict):
        raise SuiteLineError(f"line {lineno}: expected a JSON object, got {type(raw).__name__}")
    if isinstance(raw.get("messages"), list) and raw["messages"]:
        payload: dict[str, Any] = {"messages": raw["messages"]}
    elif isinstance(raw.get("prompt"), str) and raw["prompt"]:
        payload = {"prompt": raw["prompt"]}
    else:
        raise SuiteLineError(f"line {lineno}: needs \"prompt\" (a non-empty string) or \"messages\" (a non-empty "
                             "list of {role, content})")
    kind = raw.get("kind")
    if kind is not None and (not isinstance(kind, str) or not kind.strip() or len(kind) > 64):
        raise SuiteLineError(f"line {lineno}: kind must be a short non-empty string naming the kind of traffic "
                             "(e.g. \"chat\", \"mmlu\"), at most 64 characters; or leave it out")
    kind = kind.strip() if isinstance(kind, str) else None
    outcomes = raw.get("outcomes")
    if offline:
        if not isinstance(outcomes, dict) or not outcomes:
            raise SuiteLineError(f"line {lineno}: offline mode needs \"outcomes\": {{\"<upstream>\": true|false, "
                                 "...}; add it or run online with --url")
        bad = next(((k, v) for k, v in outcomes.items() if not isinstance(v, bool)), None)
        if bad is not None:
            raise SuiteLineError(f"line {lineno}: outcomes.{bad[0]} must be true or false (whether that upstream "
                                 f"answered correctly), not {json.dumps(bad[1])}")
        return Item(lineno, payload, dict(outcomes), None, "exact", None, kind)
    expected = raw.get("expected")
    if not isinstance(expected, str | int | float) or isinstance(expected, bool):
        raise SuiteLineError(f"line {lineno}: online mode needs \"expected\" (the answer: a string or number)")
    match = raw.get("match", "exact")
    if match not in MATCH_KINDS:
        raise SuiteLineError(f"line {lineno}: match {match!r} is not one of {', '.join(MATCH_KINDS)}")
    field = raw.get("field")
    if match == "json_field" and (not isinstance(field, str) or not field):
        raise SuiteLineError(f"line {lineno}: match json_field needs \"field\", a dotted path such as answer.value")
    if match == "regex":
        try:
            re.compile(str(expected))
        except re.error as exc:
            raise SuiteLineError(f"line {lineno}: expected is not a valid regex ({exc}); escape it or use "
                                 "exact") from None
    return Item(lineno, payload, None, str(expected), match, field if isinstance(field, str) else None, kind)


def parse_suite(lines: Iterable[str], offline: bool) -> tuple[list[Item], list[str]]:
    """Items and the messages of bad lines (blank lines are skipped)."""
    items, errors = [], []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(parse_line(lineno, line, offline))
        except SuiteLineError as exc:
            errors.append(str(exc))
    return items, errors


def grade(answer: str, item: Item) -> bool:
    """Whether an answer matches the item's expectation (exact after trimming, regex search, or a JSON
    field equal to the expected text)."""
    expected = item.expected or ""
    if item.match == "regex":
        return re.search(expected, answer) is not None
    if item.match == "json_field":
        try:
            value: Any = json.loads(answer)
        except (json.JSONDecodeError, RecursionError):
            return False
        for part in (item.field or "").split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return False
        return (value if isinstance(value, str) else json.dumps(value)).strip() == expected.strip()
    return answer.strip() == expected.strip()


@dataclass(frozen=True)
class Result:
    tier: str
    escalated: bool
    correct: bool  # the routed answer
    baseline_correct: bool  # the strongest tier's answer
    # For the cascade cost (cascade.py): the tier's index, the prompt's tokens (offline: the classifier's
    # count; online: the answer's usage), the answer's output tokens where measured (online),
    # each tier's outcome where the suite line has one (offline), and whether the router replaced an
    # answer by either check, logprobs or verifier (online: x-oculis-escalation-reason: answer).
    tier_index: int = -1
    prompt_tokens: int = 0
    output_tokens: int | None = None
    outcomes: tuple[bool | None, ...] = ()
    answer_escalated: bool = False
    replaced: tuple[str, ...] = ()  # online: the tiers whose answers were replaced, in order (x-oculis-replaced-tiers)
    kind: str | None = None  # the suite line's kind of traffic
    complexity: float | None = None  # the route classifier's score of the prompt (offline)


def tier_outcomes(item: Item, tiers: Sequence[tuple[str, str]]) -> tuple[bool | None, ...]:
    """Each (tier, upstream)'s outcome on the line, by upstream else by tier name; None where absent."""
    outcomes = item.outcomes or {}
    return tuple(outcomes.get(up, outcomes.get(name)) for name, up in tiers)


def offline_result(item: Item, tier: str, upstream: str, escalated: bool, strongest_upstream: str,
                   strongest_tier: str = "", index: int = -1, prompt_tokens: int = 0,
                   tiers: Sequence[tuple[str, str]] = (), complexity: float | None = None) -> Result:
    """The routed tier's and the strongest tier's outcome from the suite line itself, keyed by upstream
    (as ../shared/data/routing is, per model) or else by tier name. `tiers`: the route's (name,
    upstream) pairs, for every tier's outcome (the oracle cascade); `complexity`: the classifier's score
    (for the per-kind routing quality)."""
    outcomes = item.outcomes or {}
    found = []
    wanted = ((upstream, tier, f"tier {tier}"), (strongest_upstream, strongest_tier, "the strongest tier"))
    for up, name, role in wanted:
        key = up if up in outcomes else name if name in outcomes else None
        if key is None:
            raise SuiteLineError(f"line {item.lineno}: outcomes has no entry for upstream {up} ({role}); add "
                                 f"\"{up}\": true|false")
        found.append(outcomes[key])
    return Result(tier, escalated, found[0], found[1], index, prompt_tokens, None, tier_outcomes(item, tiers),
                  kind=item.kind, complexity=complexity)


@dataclass(frozen=True)
class Paired:
    n: int
    accuracy: float
    baseline_accuracy: float
    delta_pp: float
    ci_pp: tuple[float, float]
    p_value: float
    better: int  # routed right, baseline wrong
    worse: int  # routed wrong, baseline right


def paired(results: list[Result]) -> Paired:
    n = len(results)
    b = sum(r.correct and not r.baseline_correct for r in results)
    c = sum(r.baseline_correct and not r.correct for r in results)
    acc = sum(r.correct for r in results) / n
    base = sum(r.baseline_correct for r in results) / n
    # Agresti-Min: half an item more in each of the four cells.
    ba, ca, na = b + 0.5, c + 0.5, n + 2
    d = (ba - ca) / na
    se = math.sqrt(max(ba + ca - (ba - ca) ** 2 / na, 0.0)) / na
    # scipy is imported here, not at module load: `oculis` imports this module for every command,
    # and scipy.stats alone costs ~0.85 s and ~50 MiB (the simulator's pods run `oculis sim serve`).
    from scipy.stats import binomtest, norm

    z = float(norm.ppf(1 - ALPHA / 2))
    p = 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5).pvalue)
    lo, hi = 100 * max(d - z * se, -1.0), 100 * min(d + z * se, 1.0)
    return Paired(n, acc, base, 100 * (acc - base), (round(lo, 2), round(hi, 2)), p, b, c)


def verdict(p: Paired, tolerance_pp: float) -> tuple[str, str]:
    """The verdict and its reason, against `Δaccuracy >= -tolerance_pp`."""
    lo, hi = p.ci_pp
    if lo >= -tolerance_pp:
        return PASS, f"95% CI of delta [{lo:+.2f}, {hi:+.2f}] pp lies above -{tolerance_pp:g} pp"
    if p.delta_pp < -tolerance_pp and p.p_value < ALPHA:
        return FAIL, (f"delta {p.delta_pp:+.2f} pp is below -{tolerance_pp:g} pp and McNemar p={p.p_value:.3g} < "
                      f"{ALPHA:g} ({p.worse} items lost, {p.better} gained)")
    return INCONCLUSIVE, (f"95% CI of delta [{lo:+.2f}, {hi:+.2f}] pp reaches below -{tolerance_pp:g} pp at n={p.n}"
                          f" (McNemar p={p.p_value:.3g}); more items would tell")


def summarise(results: list[Result], tier_order: list[str], tolerance_pp: float) -> dict[str, Any]:
    """The JSON-ready report: overall and per tier. The strongest tier (last of `tier_order`) is the
    baseline itself, so it gets no verdict of its own; the overall verdict is the worst of the pooled
    one and every other tier's."""
    if not results:
        raise ValueError("the suite has no items to evaluate")
    strongest = tier_order[-1]
    tiers = []
    worst = [PASS]
    for name in tier_order:
        rs = [r for r in results if r.tier == name]
        row: dict[str, Any] = {"name": name, "n": len(rs)}
        if not rs:
            row.update(accuracy=None, baseline_accuracy=None, delta_pp=None, verdict=None,
                       escalated=absent("no item started at this tier"))  # a share of none: not 0 %
            tiers.append(row)
            continue
        p = paired(rs)
        row.update(accuracy=round(p.accuracy, 4), baseline_accuracy=round(p.baseline_accuracy, 4),
                   delta_pp=round(p.delta_pp, 2), ci_pp=list(p.ci_pp), mcnemar_p=round(p.p_value, 4),
                   escalated=round(sum(r.escalated for r in rs) / len(rs), 4))
        if name == strongest:
            row.update(verdict=None, reason="the baseline itself")
        else:
            v, why = verdict(p, tolerance_pp)
            row.update(verdict=v, reason=why)
            worst.append(v)
        tiers.append(row)
    p = paired(results)
    v, why = verdict(p, tolerance_pp)
    worst.append(v)
    overall_v = FAIL if FAIL in worst else INCONCLUSIVE if INCONCLUSIVE in worst else PASS
    if overall_v != v:
        why = f"{why}; a tier is {overall_v}"
    # Only a request that started below the strongest tier can be escalated.
    escalatable = len(results) - sum(r.tier == strongest and not r.escalated for r in results)
    escalated = sum(r.escalated for r in results)
    return {
        "overall": {"n": p.n, "accuracy": round(p.accuracy, 4), "baseline_accuracy": round(p.baseline_accuracy, 4),
                    "delta_pp": round(p.delta_pp, 2), "ci_pp": list(p.ci_pp), "mcnemar_p": round(p.p_value, 4),
                    "verdict": overall_v, "reason": why, "tolerance_pp": tolerance_pp,
                    "escalated": escalated,
                    "escalation_rate": share(escalated, escalatable, "no request started below the strongest tier",
                                             4),
                    "escalation_denominator": f"{escalatable} requests that started below the strongest tier"},
        "tiers": tiers,
    }


ORACLE_BOUNDS = ("oracle verifier: escalates exactly the wrong answers of each checked tier (p_esc = its observed "
                 "error rate; a tier without an outcome on the line is passed through). Its accuracy is an upper bound "
                 "on any answer check's on this route; its cost is a lower bound on the cost of any check that "
                 "escalates every wrong answer (a real one also escalates some right ones), not on one that misses "
                 "some")


def _checked(route: Route, upstreams: Mapping[str, Upstream]) -> tuple[list[cascade.Tier], dict[str, str], set[int]]:
    """The route's tiers for the model, why the unchecked ones are not, and the checked indices. A route
    without escalation.on_answer is judged as if it had it (the suite asks what it would do)."""
    what_if = route.escalation.on_answer is None
    tiers, why = cascade.tiers_for(route, upstreams, 1.0, what_if)
    return tiers, why, cascade.checked_tiers(route, upstreams, what_if)


def oracle_cascade(route: Route, upstreams: Mapping[str, Upstream], results: Sequence[Result], output_tokens: int
                   ) -> dict[str, Any]:
    """Offline: routed-only vs cascade cost and accuracy when an ideal verifier escalates every wrong
    answer of a checked tier to the next tier, whose outcome the suite line gives."""
    tiers, why, checked = _checked(route, upstreams)
    last = len(tiers) - 1
    requests, finals, wrong_at, arrived_at = [], [], [0] * len(tiers), [0] * len(tiers)
    unknown = 0
    for r in results:
        outs = list(r.outcomes) or [None] * len(tiers)
        outs[r.tier_index] = r.correct  # the routed tier's outcome, as the verdict read it
        outs[last] = r.baseline_correct
        p = [0.0] * len(tiers)
        final: bool | None = None
        for j in range(r.tier_index, len(tiers)):
            arrived_at[j] += 1
            if j in checked and outs[j] is not True:  # wrong, or unknown: passed on up
                wrong_at[j] += 1
                p[j] = 1.0
                continue
            final = outs[j]
            break
        if final is None:
            unknown += 1
        finals.append(bool(final))
        requests.append(cascade.Request(r.tier_index, r.prompt_tokens, output_tokens, p_esc=tuple(p)))
    # Each tier as the router configures it (its verifier too: the oracle decides, the real one is paid for)
    shown = [dataclasses.replace(t, p_esc=wrong_at[i] / arrived_at[i] if arrived_at[i] else 0.0)
             for i, t in enumerate(tiers)]
    what_if = "" if route.escalation.on_answer is not None else (
        "what-if (the route has no escalation.on_answer: the tiers the router would check with it); ")
    rep = cascade.report(shown, requests, f"{what_if}oracle verifier (offline): PER ITEM, each item escalates from a "
                         "checked tier exactly when its answer there is wrong (0 or 1); the p_esc column is each "
                         "tier's average of those (its error rate on the answers it gave, routed there or escalated "
                         "to it), shown for reading, not the cascade $'s input",
                         f"prompt tokens of each suite prompt by the classifier's tokenizer; {output_tokens} output "
                         "tokens per answer assumed (--output-tokens)", why,
                         "estimated per suite prompt: its classifier tokens and --output-tokens, as above")
    rep["formula"] = ("per item: cascade = attempt(i) + verifier(i) + [wrong at i] x cascade(i+1), summed over the "
                      "items (their own tokens and outcomes); " + cascade.FORMULA)
    # the printed formula at the printed (average) p_esc, for a reader who checks the table by hand
    mean = cascade.report(shown, [dataclasses.replace(r, p_esc=None) for r in requests], "", "")
    rep["total"]["cascade_cost_at_mean_p_esc"] = mean["total"]["cascade_cost"]
    for i, (row, m) in enumerate(zip(rep["tiers"], mean["tiers"], strict=True)):
        row["cascade_cost_at_mean_p_esc"] = m["cascade_cost"]
        if row["p_esc"] is not None and not arrived_at[i]:  # an error rate over no answer is no rate (figures.py)
            row["p_esc"] = absent("no item reached this tier")
    n = len(results)
    rep["accuracy"] = {"routed": round(sum(r.correct for r in results) / n, 4),
                       "cascade": round(sum(finals) / n, 4),
                       "all_strongest": round(sum(r.baseline_correct for r in results) / n, 4),
                       "unknown_final_outcomes": unknown,
                       "rule": "a wrong answer of a checked tier escalated gets the next tier's outcome"}
    rep["bounds"] = ORACLE_BOUNDS
    return rep


def online_cascade(route: Route, upstreams: Mapping[str, Upstream], results: Sequence[Result]) -> dict[str, Any]:
    """Online: the router replaced answers itself. p_esc per checked tier from the router's headers:
    x-oculis-replaced-tiers names every tier whose answer was replaced, in order (the first is the tier
    the request was routed to); from a router without that header, x-oculis-escalation-reason: answer is
    taken as one step from the tier below the one that answered. The verifier's gradings are estimated
    from the answers' usage: the router's answer does not carry the grading's."""
    tiers, why, checked = _checked(route, upstreams)
    index = {t.name: i for i, t in enumerate(route.tiers)}
    known = [r for r in results if r.tier in index and all(t in index for t in r.replaced)]
    chains = [[index[t] for t in r.replaced] if r.replaced else
              ([max(index[r.tier] - 1, 0)] if r.answer_escalated else []) for r in known]
    routed = [c[0] if c else index[r.tier] for r, c in zip(known, chains, strict=True)]
    replaced, produced = [0] * len(tiers), [0] * len(tiers)
    for r, chain in zip(known, chains, strict=True):
        produced[index[r.tier]] += 1  # the answer the client got
        for i in chain:
            replaced[i] += 1
            produced[i] += 1  # ... and each one it replaced
    shown = [dataclasses.replace(t, p_esc=replaced[i] / produced[i] if i in checked and produced[i] else 0.0)
             for i, t in enumerate(tiers)]
    src = (f"measured online: {sum(replaced)} answers replaced (x-oculis-escalation-reason: answer) of "
           f"{sum(produced[i] for i in checked)} the checked tiers gave")
    requests = [cascade.Request(i, r.prompt_tokens, r.output_tokens or 0) for r, i in zip(known, routed, strict=True)]
    return cascade.report(shown, requests, src, "the answers' usage (prompt and completion tokens; the replaced "
                          "answer assumed as long as the one sent)", why,
                          "estimated from the answers' usage, not measured: the router's answer carries its own "
                          "usage, not the grading's (that is in oculis_prompt_tokens_total of the verifier upstream, "
                          "shared with whatever else it serves)")


def kind_items(results: Sequence[Result]) -> list[Scored]:
    """Offline results as the per-kind routing-quality inputs (eval/kinds.py): the complexity, the
    cheapest tier's outcome from the line and the strongest tier's."""
    from oculis_measure.eval import kinds  # numpy: only when a report is made

    return [kinds.Scored(r.kind, r.complexity, r.outcomes[0] if r.outcomes else None, r.baseline_correct)
            for r in results if r.complexity is not None]
