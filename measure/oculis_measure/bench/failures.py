"""Why a benchmark's requests fail, in one line, and which exit code says so. Pure functions, no I/O.

A run whose requests all fail the same way measures nothing: a wrong URL (every request HTTP 404), a
missing key (401), nothing listening (connection refused). Such a run stops early, after the first
EARLY_N finished requests if they all failed alike, or at its end if none succeeded, with one line naming
the cause and the likely fix, and a non-zero exit code:

  2  the command line is wrong (404: --url or --route; 401/403: --api-key-env; 400/422: a request the
     server refuses)
  5  the target cannot serve (connection refused, timeouts, 429, 5xx, broken streams)

A base URL may end in /v1 or not (`http://host:8080` and `http://host:8080/v1` are the same server):
api_base() strips it and the callers append the API paths.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

EXIT_USAGE, EXIT_UNREACHABLE = 2, 5
DETAIL_CHARS = 1000  # of a server's error message kept per request (a router's 503 names the fix at its end)
SAID_CHARS = 400  # of it quoted in the one-line diagnosis, cut between words
EARLY_N = 8  # this many finished requests, all failed alike and none succeeded: stop the run


def api_base(url: str) -> str:
    """The server's root for `/v1/...` paths: `http://h:8080/v1/` -> `http://h:8080`."""
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    kind: str  # the error kind every failed request shared (http_404, connection, ...)
    count: int
    exit_code: int
    line: str  # the one line to print after `oculis bench run: `


def early_failure(finished: Sequence[tuple[bool, str | None]], n: int = EARLY_N) -> str | None:
    """The shared error kind when the first `n` finished requests (ok, kind) in completion order all failed
    alike; None otherwise (or while fewer than n have finished)."""
    if len(finished) < n:
        return None
    kinds = {kind for ok, kind in finished[:n] if not ok}
    first_ok = any(ok for ok, _ in finished[:n])
    return next(iter(kinds)) if not first_ok and len(kinds) == 1 else None


def dominant_failure(kinds: Sequence[str | None]) -> tuple[str, int]:
    """The most common error kind of failed requests and its count (`unknown` for none given)."""
    (kind, count), = Counter(k or "unknown" for k in kinds).most_common(1)
    return kind, count


def diagnose(kind: str, count: int, total: int, url: str, route: str, key_env: str | None,
             detail: str | None = None, early: bool = False) -> Diagnosis:
    """One line: how many requests failed how, the likely cause and the fix; and the exit code."""
    where = f"{api_base(url)}/v1/chat/completions"
    # whole words, and a mark where it was cut (QA3 Part 2 #24: "(vLLM --lora-m): the target failed")
    said = f" (the server said: {textwrap.shorten(detail, SAID_CHARS, placeholder=' [...]')})" if detail else ""
    scope = (f"the first {count} requests all failed" if early else
             f"every request failed ({count} of {total})" if count == total else
             f"no request succeeded ({count} of {total} failed, most often)")
    code, cause = EXIT_UNREACHABLE, ""
    if kind == "http_404":
        code, cause = EXIT_USAGE, (f"HTTP 404 from {where}{said}: the --url path or the --route is wrong; give the "
                                   f"server's base URL (with or without /v1) and a model it lists at /v1/models")
    elif kind in ("http_401", "http_403"):
        fix = (f"the key in ${key_env} was refused; give a key this server accepts" if key_env else
               "the server wants an API key; export it and pass --api-key-env VAR")
        code, cause = EXIT_USAGE, f"HTTP {kind[5:]} from {where}{said}: {fix}"
    elif kind in ("http_400", "http_422"):
        code, cause = EXIT_USAGE, (f"HTTP {kind[5:]} from {where}{said}: the server refuses the requests; check that "
                                   f"--route {route!r} is a chat model there and the server is OpenAI-compatible")
    elif kind == "connection":
        cause = f"could not connect to {api_base(url)}{said}: start the router or engine, or give the right --url"
    elif kind == "timeout":
        cause = ("timed out (--request-timeout): the target is overloaded or hung; lower --rate or --concurrency, "
                 "or raise --request-timeout")
    elif kind == "http_429":
        cause = f"HTTP 429 (rate limited) from {where}{said}: lower --rate or raise the key's or route's limits"
    elif kind.startswith("http_5"):
        cause = f"HTTP {kind[5:]} from {where}{said}: the target failed; see its logs"
    elif kind in ("stream_cut", "stream_error", "bad_stream"):
        cause = (f"{kind.replace('_', ' ')}: the answers were not complete server-sent event streams ending in "
                 f"[DONE]{said}; is {api_base(url)} an OpenAI-compatible server?")
    elif kind.startswith("http_"):
        cause = f"HTTP {kind[5:]} from {where}{said}"
    else:
        cause = f"{kind}{said}"
    return Diagnosis(kind, count, code, f"{scope}: {cause}")


def error_text(body: bytes) -> str:
    """The message of an error body (OpenAI's {"error": {"message"}}, FastAPI's {"detail"}) or its text."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:DETAIL_CHARS]
    if isinstance(data, dict):
        err = data.get("error")
        msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else data.get("detail")
        if msg:
            return str(msg)[:DETAIL_CHARS]
    return body.decode("utf-8", "replace")[:200]
