"""Workload files: request shapes and arrival times, generated reproducibly from a seed.

YAML or JSON:
    prompt_tokens: 512                       # after the shared prefix; a number, or a distribution:
    output_tokens: {mean: 256, stdev: 100, min: 1, max: 1024}    # normal (default), lognormal,
                                             # uniform (min..max) or exponential, clipped to min..max
    shared_prefix_tokens: 0                  # a prefix common to every request (prefix caching)
    prefix_groups: 1                         # optional: N distinct prefixes of that length (system prompts),
                                             # each request drawn uniformly from one group
    prompts_per_group: 5                     # optional: each group has this many fixed prompts that requests
                                             # repeat whole (inference-perf's shared_prefix data): the prompt
                                             # after the prefix is cacheable too; lengths drawn once per prompt
    prefix_groups: {count: 150, tokens: 6000, users_per_group: 5, multi_turn: false}
                                             # the same three as one mapping (oculis_sim.prefixgroups); with
                                             # multi_turn each user's requests continue one conversation
    stages: [{rate: 10, seconds: 3600}]      # Poisson arrivals per stage; {rate: 10, requests: N}: exactly N;
                                             # {rate: inf, requests: N} sends N at once
    burstiness: 1.0                          # gamma shape of the gaps, as vLLM's benchmark (1 = Poisson)
    max_concurrency: 64                      # optional: at most this many in flight (vLLM bench's flag)
    seed: 0
or explicit shapes: `requests: [{prompt_tokens: 900, output_tokens: 128, at: 0.0}, ...]` (`at` optional:
then the stages' arrival process, or all at once without stages).

`prompt_tokens` has one meaning everywhere: the tokens AFTER the shared prefix. A request's whole prompt
is shared_prefix_tokens + prompt_tokens, in the distribution form and in explicit `requests` alike (as
vLLM's benchmark prefix_len + input_len and inference-perf's system_prompt_len + question_len).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oculis_measure.inputs import load_yaml, read_text
from oculis_sim import prefixgroups

SHARED = "shared-prefix"


class WorkloadError(ValueError):
    pass


@dataclass(frozen=True)
class Workload:
    arrivals: np.ndarray  # seconds from the start, ascending
    prompt_tokens: np.ndarray  # int per request
    output_tokens: np.ndarray
    shared_prefix_tokens: int
    max_concurrency: int | None
    prefix_groups: np.ndarray | None = None  # which prefix each request starts with (None: one for all)
    prompt_ids: np.ndarray | None = None  # which fixed prompt of its group a request repeats (None: all unique)
    warnings: tuple[str, ...] = ()  # keys that parse but change nothing (the CLI prints them)

    def __len__(self) -> int:
        return len(self.arrivals)

    def block_keys(self, block: int) -> Callable[[int], tuple[object, ...]]:
        """Request i's prompt blocks as the prefix cache keys them: its group's prefix blocks, then (for a
        fixed prompt or a conversation) that prompt's own blocks by position; blocks nobody else has are
        left off. One tuple per distinct (group, prompt, length), shared by the requests that repeat it."""
        prefix_blocks = self.shared_prefix_tokens // block
        groups = self.prefix_groups.tolist() if self.prefix_groups is not None else None
        ids = self.prompt_ids.tolist() if self.prompt_ids is not None else None
        prompts = self.prompt_tokens.tolist()
        known: dict[tuple[int, int, int], tuple[object, ...]] = {}
        # each distinct block gets the next integer: the cache's and the picker's dicts hash small ints
        # fastest and spread consecutive ones evenly (tuples were a third of a fleet replay's time)
        interned: dict[tuple[object, ...], int] = {}

        def keys(i: int) -> tuple[object, ...]:
            g = groups[i] if groups is not None else 0
            p = ids[i] if ids is not None else -1
            whole = prompts[i] // block if p >= 0 else min(prefix_blocks, prompts[i] // block)
            key = (g, p, whole)
            got = known.get(key)
            if got is None:
                got = known[key] = tuple(interned.setdefault((g, b) if b < prefix_blocks else (g, p, b), len(interned))
                                         for b in range(whole))
            return got

        return keys


def _number(where: str, value: Any, lo: float = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < lo:
        raise WorkloadError(f"{where}: {value!r} must be a number >= {lo:g}")
    return float(value)


def _draw(where: str, spec: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return np.full(n, max(1, round(_number(where, spec, 1))), dtype=np.int64)
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: {spec!r} must be a number or a distribution such as "
                            "{mean: 256, stdev: 100, min: 1, max: 1024}")
    kind = spec.get("distribution", "normal")
    lo = _number(f"{where}.min", spec.get("min", 1), 1)
    hi = _number(f"{where}.max", spec.get("max", math.inf), lo)
    if kind == "uniform":
        values = rng.uniform(lo, hi if math.isfinite(hi) else lo, n)
    else:
        if "mean" not in spec:
            raise WorkloadError(f"{where}: a {kind} distribution needs `mean`")
        mean = _number(f"{where}.mean", spec["mean"], 1)
        sd = _number(f"{where}.stdev", spec.get("stdev", 0), 0)
        if kind == "normal":
            values = rng.normal(mean, sd, n) if sd else np.full(n, mean)
        elif kind == "lognormal":
            sigma2 = math.log(1 + (sd / mean) ** 2)
            values = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
        elif kind == "exponential":
            values = rng.exponential(mean, n)
        else:
            raise WorkloadError(f"{where}.distribution: {kind!r} is not one of normal, lognormal, uniform, exponential")
    return np.clip(np.rint(values), lo, hi).astype(np.int64)


def _arrivals(stages: Any, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    if not isinstance(stages, list) or not stages:
        raise WorkloadError("stages: must be a non-empty list such as [{rate: 10, seconds: 60}]")
    out: list[np.ndarray] = []
    start = 0.0
    for i, st in enumerate(stages):
        if not isinstance(st, dict):
            raise WorkloadError(f"stages[{i}]: {st!r} must be a mapping {{rate, seconds}}")
        rate_v = st.get("rate")
        if rate_v in ("inf", float("inf")):  # everything at the stage's start (vLLM bench's --request-rate inf)
            count = st.get("requests")
            if not isinstance(count, int) or count < 1:
                raise WorkloadError(f"stages[{i}]: rate inf needs `requests: N` (how many to send at once)")
            out.append(np.full(count, start))
            start += _number(f"stages[{i}].seconds", st.get("seconds", 0), 0)
            continue
        rate = _number(f"stages[{i}].rate", rate_v, 0)
        count = st.get("requests")
        if count is not None:  # exactly N arrivals at this rate (vLLM bench's --num-prompts with --request-rate)
            if not isinstance(count, int) or count < 1 or rate <= 0:
                raise WorkloadError(f"stages[{i}]: `requests` must be a positive integer with a rate > 0")
            times = np.cumsum(rng.gamma(burstiness, 1.0 / (rate * burstiness), count))
            times -= times[0]  # the first request goes at the stage's start, as vLLM's benchmark sends it
            out.append(start + times)
            start += max(float(times[-1]), _number(f"stages[{i}].seconds", st.get("seconds", 0), 0))
            continue
        seconds = _number(f"stages[{i}].seconds", st.get("seconds"), 0)
        if rate > 0 and seconds > 0:
            expected = rate * seconds
            times = np.empty(0)
            t0 = 0.0
            while t0 < seconds:
                gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), int(expected * 1.1) + 16)
                chunk = t0 + np.cumsum(gaps)
                times = np.concatenate([times, chunk])
                t0 = float(chunk[-1])
            out.append(start + times[times < seconds])
        start += seconds
    return np.concatenate(out) if out else np.empty(0)


def parse(data: Any) -> Workload:
    if not isinstance(data, dict):
        raise WorkloadError("the workload must be a mapping with prompt_tokens, output_tokens and stages")
    known = {"prompt_tokens", "output_tokens", "shared_prefix_tokens", "stages", "burstiness", "seed", "requests",
             "max_concurrency", "prefix_groups", "prompts_per_group"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise WorkloadError(f"{unknown[0]}: unknown key; use {', '.join(sorted(known))}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise WorkloadError(f"seed: {seed!r} must be an integer")
    rng = np.random.default_rng(seed)
    burst = _number("burstiness", data.get("burstiness", 1.0), 1e-6)
    shared = int(_number("shared_prefix_tokens", data.get("shared_prefix_tokens", 0), 0))
    conc = data.get("max_concurrency")
    if conc is not None and (not isinstance(conc, int) or conc < 1):
        raise WorkloadError(f"max_concurrency: {conc!r} must be a positive integer")
    n_groups = data.get("prefix_groups", 1)
    multi_turn = False
    if isinstance(n_groups, dict):  # {count, tokens, users_per_group, multi_turn}: the three keys in one
        clash = sorted({"shared_prefix_tokens", "prompts_per_group", "requests"} & set(data))
        if clash:
            raise WorkloadError(f"prefix_groups: a mapping sets the prefix itself; drop {clash[0]}")
        try:
            pg = prefixgroups.parse(n_groups)
        except prefixgroups.PrefixGroupError as exc:
            raise WorkloadError(str(exc)) from None
        n_groups, shared, multi_turn = pg.count, pg.tokens, pg.multi_turn
        if pg.users_per_group:
            data = {**data, "prompts_per_group": pg.users_per_group}
    if isinstance(n_groups, bool) or not isinstance(n_groups, int) or n_groups < 1:
        raise WorkloadError(f"prefix_groups: {n_groups!r} must be a positive integer (how many distinct prefixes) "
                            "or a mapping {count, tokens, users_per_group, multi_turn}")

    per_group = data.get("prompts_per_group")
    if per_group is not None and (isinstance(per_group, bool) or not isinstance(per_group, int) or per_group < 1):
        raise WorkloadError(f"prompts_per_group: {per_group!r} must be a positive integer (fixed prompts per group)")

    notes: tuple[str, ...] = ()
    if n_groups > 1 and shared == 0 and per_group is None:  # QA3 #7: groups of an empty prefix share nothing
        notes = (f"prefix_groups: {n_groups} has no effect without shared_prefix_tokens (the groups' prefix "
                 "length, 0 here); add shared_prefix_tokens: N, or use prefix_groups: {count, tokens}",)

    def grouped(n: int) -> np.ndarray | None:
        return rng.integers(0, n_groups, n) if n_groups > 1 else None
    if "requests" in data:
        reqs = data["requests"]
        if not isinstance(reqs, list) or not reqs:
            raise WorkloadError("requests: must be a non-empty list of {prompt_tokens, output_tokens[, at]}")
        # What explicit requests leave unused is refused, not dropped without a word (QA3 Part 2 #20)
        for key in ("prompt_tokens", "output_tokens"):
            if key in data:
                raise WorkloadError(f"{key}: explicit `requests` give each request its own {key}; drop the top-level "
                                    f"{key} (or drop `requests` to draw them from it)")
        if "stages" in data and all(isinstance(r, dict) and "at" in r for r in reqs):
            raise WorkloadError(f"stages: every one of the {len(reqs)} requests gives its own `at`, so stages would "
                                "time none of them; drop stages, or drop the `at`s to have stages time the requests")
        prompts = np.array([int(_number(f"requests[{i}].prompt_tokens", r.get("prompt_tokens"), 1))
                            for i, r in enumerate(reqs)], dtype=np.int64)
        outputs = np.array([int(_number(f"requests[{i}].output_tokens", r.get("output_tokens"), 1))
                            for i, r in enumerate(reqs)], dtype=np.int64)
        if all("at" in r for r in reqs):
            arrivals = np.array([_number(f"requests[{i}].at", r["at"]) for i, r in enumerate(reqs)])
        elif "stages" in data:
            arrivals = _arrivals(data["stages"], burst, rng)[: len(reqs)]
            if len(arrivals) < len(reqs):
                raise WorkloadError(f"stages: produce {len(arrivals)} arrivals for {len(reqs)} requests; lengthen them")
        else:
            arrivals = np.zeros(len(reqs))
        order = np.argsort(arrivals, kind="stable")
        groups = grouped(len(reqs))
        # prompt_tokens are after the shared prefix here too (one meaning: see the module docstring)
        return Workload(arrivals[order], prompts[order] + shared, outputs[order], shared, conc,
                        groups[order] if groups is not None else None, warnings=notes)
    for key in ("prompt_tokens", "output_tokens", "stages"):
        if key not in data:
            raise WorkloadError(f"{key}: missing (or give explicit `requests`)")
    arrivals = _arrivals(data["stages"], burst, rng)
    n = len(arrivals)
    if multi_turn and per_group is not None:  # each request continues its user's conversation
        pick = rng.integers(0, n_groups * per_group, n)
        questions = _draw("prompt_tokens", data["prompt_tokens"], n, rng)
        outputs = _draw("output_tokens", data["output_tokens"], n, rng)
        prompts = prefixgroups.conversations(shared, pick, questions, outputs)
        return Workload(arrivals, prompts, outputs, shared, conc, pick // per_group, pick)
    if per_group is not None:  # a fixed set of prompts, each request one of them (clients as inference-perf's)
        pick = rng.integers(0, n_groups * per_group, n)
        prompts = _draw("prompt_tokens", data["prompt_tokens"], n_groups * per_group, rng)[pick]
        outputs = _draw("output_tokens", data["output_tokens"], n_groups * per_group, rng)[pick]
        return Workload(arrivals, prompts + shared, outputs, shared, conc, pick // per_group, pick % per_group)
    prompts = _draw("prompt_tokens", data["prompt_tokens"], n, rng)
    outputs = _draw("output_tokens", data["output_tokens"], n, rng)
    return Workload(arrivals, prompts + shared, outputs, shared, conc, grouped(n), warnings=notes)


def load(path: Path, what: str = "--workload") -> Workload:
    """The workload file; InputError (one line naming `what` and the path) when it cannot be read, is not
    UTF-8 or is nested too deeply to parse (the CLI's own reader), WorkloadError when its fields are wrong."""
    return parse(load_yaml(read_text(path, what), f"{what} {path}"))
