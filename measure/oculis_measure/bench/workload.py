"""Benchmark workloads, pure: a profile (built in, or a YAML/JSON file) and a seed become the same list of
chat requests and arrival times on every machine, with a dataset hash (what was sent) and a workload
fingerprint (what was sent, how fast, for how long, to which route), so that `--compare` can refuse to
compare two runs of different workloads.

Shared-prefix variants start some requests with one of a few fixed prefixes (system prompts, RAG
documents) so a prefix cache can hit; multi-turn variants resend a conversation with each turn
appended, as a chat client does. Arrivals are open-loop: Poisson at the requested rate, or gamma with
`burstiness` < 1 for bursts (vLLM bench serve's convention: shape = burstiness, mean gap = 1/rate).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oculis_measure.inputs import InputError, load_yaml, read_text

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(raw: str, flag: str = "--duration") -> float:
    """Seconds from a Prometheus-style duration (`600s`, `10m`, `1h30m`, `500ms`); InputError otherwise."""
    text = raw.strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not text or pos != len(text) or not math.isfinite(total):
        raise InputError(f"{flag} {raw!r} is not a duration; give a number with a unit (ms, s, m, h, d, w), "
                         "e.g. 600s, 10m or 1h30m")
    return total


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Lengths(_Strict):
    """Token counts drawn from a log-normal distribution (real prompt and answer lengths are skewed)."""

    median: int = Field(ge=1, le=1_000_000, description="median tokens")
    sigma: float = Field(0.5, ge=0, le=3, description="log-normal sigma (0: every request the median)")
    min: int = Field(1, ge=1)
    max: int = Field(32768, ge=1)


class SharedPrefix(_Strict):
    share: float = Field(ge=0, le=1, description="fraction of conversations that start with a shared prefix")
    groups: int = Field(1, ge=1, le=10_000, description="how many distinct prefixes")
    tokens: int = Field(ge=1, le=1_000_000, description="prefix length in tokens")


class MultiTurn(_Strict):
    share: float = Field(ge=0, le=1, description="fraction of conversations with more than one turn")
    turns: int = Field(2, ge=2, le=100, description="turns in such a conversation")


class Profile(_Strict):
    """What a benchmark sends. Lengths are in words the engine counts as about one token each."""

    name: str = Field(min_length=1, max_length=100)
    description: str = ""
    prompt: Lengths
    output: Lengths
    shared_prefix: SharedPrefix | None = None
    multi_turn: MultiTurn | None = None
    rate: float = Field(1.0, gt=0, le=100_000, description="default requests per second (--rate overrides)")
    cross_run_prefixes: bool = Field(False, description="true: runs send the same prompts, so a run may hit "
                                     "prefixes an earlier run left in the engine's cache (a warm-cache benchmark); "
                                     "false (default): each run salts its prompts (--fresh-cache)")


BUILTIN: dict[str, Profile] = {p.name: p for p in (
    Profile(name="chat", description="short prompts behind 4 system prompts, 30 % three-turn conversations",
            prompt=Lengths(median=200, sigma=0.6, max=4096), output=Lengths(median=150, sigma=0.5, max=1024),
            shared_prefix=SharedPrefix(share=0.5, groups=4, tokens=100), multi_turn=MultiTurn(share=0.3, turns=3),
            rate=2.0),
    Profile(name="rag", description="long prompts: 80 % start with one of 8 reused 1000-token documents",
            prompt=Lengths(median=500, sigma=0.4, max=8192), output=Lengths(median=200, sigma=0.4, max=1024),
            shared_prefix=SharedPrefix(share=0.8, groups=8, tokens=1000), rate=1.0),
    Profile(name="batch", description="cold: unique long prompts and answers, nothing a prefix cache can reuse",
            prompt=Lengths(median=800, sigma=0.3, max=8192), output=Lengths(median=400, sigma=0.3, max=2048),
            rate=1.0),
    Profile(name="mixed", description="chat, RAG and batch shapes together: shared prefixes and multi-turn",
            prompt=Lengths(median=400, sigma=1.0, max=8192), output=Lengths(median=200, sigma=0.8, max=2048),
            shared_prefix=SharedPrefix(share=0.4, groups=6, tokens=400), multi_turn=MultiTurn(share=0.2, turns=3),
            rate=2.0),
)}


def load_profile(name_or_file: str) -> Profile:
    """A built-in profile by name, or one from a YAML/JSON file; InputError naming the field otherwise."""
    if name_or_file in BUILTIN:
        return BUILTIN[name_or_file]
    path = Path(name_or_file)
    if not path.exists():
        raise InputError(f"--profile {name_or_file!r}: neither a built-in profile ({', '.join(BUILTIN)}) nor a file")
    data = load_yaml(read_text(path, "--profile"), f"--profile {path}")
    if isinstance(data, dict):
        data.setdefault("name", path.stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise InputError(f"--profile {path}: {where}: {err['msg']} (got {err.get('input')!r}); see the built-in "
                         "profiles in `oculis bench run --help`") from None


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    messages: list[dict[str, str]]
    max_tokens: int
    conversation: int
    turn: int


@dataclass(frozen=True, slots=True)
class Workload:
    profile: str
    seed: int
    requests: list[PlannedRequest]
    arrivals: list[float] | None  # seconds from the start (open loop), None for closed loop (--concurrency)
    dataset_hash: str
    fingerprint: dict[str, Any]
    fingerprint_hash: str


_WORDS = (  # noqa: SIM905 (one readable string)
    "time person year way day thing man world life hand part child eye woman place work week case point "
          "number group problem fact system program question government company night water room mother area "
          "money story month lot right study book job word business issue side kind head house service friend "
          "father power hour game line end member law car city community name team minute idea kid body "
          "information back parent face others level office door health art war history party result change "
          "morning reason research girl guy moment air teacher force education").split()


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(_WORDS[i] for i in rng.integers(len(_WORDS), size=n))


def _length(rng: np.random.Generator, d: Lengths) -> int:
    value = d.median * math.exp(d.sigma * float(rng.standard_normal())) if d.sigma else d.median
    return int(min(max(round(value), d.min), d.max))


def build(profile: Profile, seed: int, count: int) -> list[PlannedRequest]:
    """`count` requests, the same for the same profile, seed and count. A multi-turn conversation's
    later turns come a few requests after the earlier one (as a user reads, then answers); its earlier
    answers are placeholder text of the requested length, so the list never depends on what a server said."""
    rng = np.random.default_rng(seed)
    prefixes = ([_words(np.random.default_rng([seed, 1, g]), profile.shared_prefix.tokens)
                 for g in range(profile.shared_prefix.groups)] if profile.shared_prefix else [])
    out: list[PlannedRequest] = []
    # conversations with turns still to send: (due index, conversation, history, this turn, of how many)
    pending: list[tuple[int, int, list[dict[str, str]], int, int]] = []
    conversation = 0
    while len(out) < count:
        if pending and pending[0][0] <= len(out):
            _, conv, history, turn, turns = pending.pop(0)
        else:
            conv, history, turn, turns = conversation, [], 0, 1
            conversation += 1
            sp, mt = profile.shared_prefix, profile.multi_turn
            if sp and float(rng.random()) < sp.share:
                history = [{"role": "system", "content": prefixes[int(rng.integers(len(prefixes)))]}]
            if mt and float(rng.random()) < mt.share:
                turns = mt.turns
        messages = [*history, {"role": "user", "content": _words(rng, _length(rng, profile.prompt))}]
        max_tokens = _length(rng, profile.output)
        out.append(PlannedRequest(messages, max_tokens, conv, turn))
        if turn + 1 < turns:
            answer = {"role": "assistant", "content": _words(rng, max_tokens)}
            pending.append((len(out) + 3, conv, [*messages, answer], turn + 1, turns))
            pending.sort(key=lambda p: p[0])
    return out


def arrivals(rate: float, duration_s: float, seed: int, burstiness: float = 1.0) -> list[float]:
    """Open-loop send times in [0, duration): gaps are gamma(shape=burstiness, mean=1/rate); burstiness 1
    is a Poisson process, below 1 burstier, above 1 more regular."""
    rng = np.random.default_rng([seed, 2])
    out: list[float] = []
    t = 0.0
    while True:
        t += float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))
        if t >= duration_s:
            return out
        out.append(t)


def dataset_hash(requests: list[PlannedRequest]) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(json.dumps([r.messages, r.max_tokens], separators=(",", ":")).encode())
    return "sha256:" + h.hexdigest()[:16]


def plan(profile: Profile, *, seed: int, route: str, duration_s: float, warmup_s: float, rate: float | None,
         concurrency: int | None, burstiness: float, salted: bool = False) -> Workload:
    """The whole workload of one run. Closed loop (--concurrency) sends from a pool of requests in order,
    sized for the run (C x duration x 4 at least 512), wrapping around if the engine is faster. `salted`:
    each prompt starts with a word unique to the run (the word is not in the dataset hash; that there is
    one is in the fingerprint, so a salted run is never compared with an unsalted one)."""
    if concurrency is not None:
        times = None
        count = max(512, math.ceil(concurrency * (duration_s + warmup_s) * 4))
    else:
        times = arrivals(rate or profile.rate, duration_s + warmup_s, seed, burstiness)
        count = len(times)
    requests = build(profile, seed, count)
    ds = dataset_hash(requests)
    fp: dict[str, Any] = {"profile": profile.name, "dataset_hash": ds, "seed": seed, "route": route,
                          "duration_s": duration_s, "warmup_s": warmup_s,
                          "load": {"concurrency": concurrency} if concurrency is not None
                          else {"rate": rate or profile.rate, "burstiness": burstiness}, "salted": salted}
    fp_hash = hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]
    return Workload(profile.name, seed, requests, times, ds, fp, fp_hash)
