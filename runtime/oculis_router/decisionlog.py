"""Per-request decision log (a route's `decision_log`): one JSON line per request with the decision
inputs and the outcome, so routing can be audited and a labelled suite for `oculis classifier fit`
built from real traffic (join the lines with your own grading on `request_id` or the prompt hash).

`entry` is pure; `DecisionSink` writes lines to stdout or to an append-only file, opened once per
path. A sink that cannot be written is said once in the log and never fails a request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from oculis.router import DecisionLog

log = logging.getLogger("oculis.router")
HEADERS = {"tier": "x-oculis-tier", "upstream": "x-oculis-upstream", "cache": "x-oculis-cache",
           "escalation_reason": "x-oculis-escalation-reason", "request_id": "x-request-id",
           "revision": "x-oculis-revision",  # stable or canary: an engine change's canary, per request
           "replica": "x-oculis-replica",  # the replica (pod) the router picked, when it picked one
           "adapter": "x-oculis-adapter"}  # the LoRA adapter the answering tier was asked for
TIER_LISTS = {"failed_tiers": "x-oculis-failed-tiers", "replaced_tiers": "x-oculis-replaced-tiers"}


def prompt_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """The question, as a suite line holds it."""
    if "messages" in body:
        return {"messages": body["messages"]}
    return {"prompt": body.get("prompt", "")}


def prompt_digest(body: Mapping[str, Any]) -> str:
    text = json.dumps(prompt_of(body), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def entry(cfg: DecisionLog, route: str, body: Mapping[str, Any], complexity: float | None,
          confidence: float | None, prompt_tokens: int | None, status: int, headers: Mapping[str, str],
          now: float | None = None, routed_tier: str | None = None) -> dict[str, Any]:
    """One line: the decision (the tier first routed to, the tier that answered or failed last,
    complexity, confidence, escalated and why, the tiers that failed or whose answers were replaced on
    the way), the outcome (status, answer log-probability when it was checked) and the prompt (hashed
    unless the route opts in)."""
    out: dict[str, Any] = {"ts": round(time.time() if now is None else now, 3), "route": route, "status": status}
    if routed_tier is not None:
        out["routed_tier"] = routed_tier
    for key, header in HEADERS.items():
        if header in headers:
            out[key] = headers[header]
    for key, header in TIER_LISTS.items():
        if header in headers:
            out[key] = headers[header].split(",")
    out.update({"complexity": complexity, "confidence": confidence, "prompt_tokens": prompt_tokens,
                "escalated": headers.get("x-oculis-escalated") == "true"})
    if "x-oculis-answer-logprob" in headers:
        out["answer_logprob"] = float(headers["x-oculis-answer-logprob"])
    if "x-oculis-answer-score" in headers:  # a verifier's grade (escalation.on_answer.verifier)
        out["answer_score"] = int(headers["x-oculis-answer-score"])
    out["prompt_sha256"] = prompt_digest(body)
    if cfg.include_prompts:
        out.update(prompt_of(body))
    return out


def sink_problem(sink: str) -> str | None:
    """Why lines could not be appended to `sink` (a directory, a folder that does not exist, no write
    permission), checked when a config is loaded so it is refused naming the field, instead of every
    line being lost from the first request on. Opening for append creates the file, as the first line
    would."""
    if sink == "stdout":
        return None
    if Path(sink).is_dir():
        return f"{sink!r} is a directory; give a file path in it, e.g. {str(Path(sink) / 'decisions.jsonl')!r}"
    try:
        with open(sink, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"{sink!r} cannot be written ({exc.strerror or exc}); give a file in a writable folder, or stdout"
    return None


class DecisionSink:
    """Appends lines; one open file per path, shared by routes and kept across reloads."""

    def __init__(self, stdout: TextIO | None = None) -> None:
        self._stdout = stdout
        self._files: dict[str, TextIO] = {}
        self._broken: set[str] = set()
        self._lock = threading.Lock()

    def write(self, cfg: DecisionLog, line: dict[str, Any]) -> None:
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            with self._lock:
                if cfg.sink == "stdout":
                    out = self._stdout or sys.stdout
                else:
                    out = self._files.get(cfg.sink) or self._files.setdefault(
                        cfg.sink, open(cfg.sink, "a", encoding="utf-8", buffering=1))  # noqa: SIM115
                out.write(text)
                out.flush()
            self._broken.discard(cfg.sink)
        except (OSError, ValueError) as exc:
            if cfg.sink not in self._broken:
                log.error("decision log %s cannot be written (%s); requests are served, not logged", cfg.sink, exc)
                self._broken.add(cfg.sink)

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
