"""JSON as the wire should carry it, for client bodies and upstream answers alike.

Python's `json` accepts more than RFC 8259 and builds values the rest of the router cannot pass on:
`NaN`/`Infinity` (and `1e400`, which overflows to inf) are re-sent as tokens no JSON parser accepts;
a lone UTF-16 surrogate (`"\\ud800"`) cannot be encoded as UTF-8 (cache keys, relayed answers) nor
tokenised; nesting deep enough to hit the recursion limit raises `RecursionError` in whichever
`json.dumps` or walk meets it first. `loads` refuses all three up front with a `ValueError` whose
message says what was wrong, so callers turn it into one clean error (400 or a retryable upstream
fault) instead of a traceback later.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 128  # far deeper than any real request (JSON schemas in tools included); far below the recursion limit
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # only a \u escape can produce a lone surrogate


def _no_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON (send a finite number or null)")


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"the number {token[:40]} is out of range (overflows a double)")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)  # built once: json.loads with
# hooks builds a decoder per call, a third of the cost of parsing a stream event


def loads(raw: bytes | str, what: str = "the request body") -> Any:
    """Parse strictly; `what` names the document in the error message."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not valid UTF-8 (byte {exc.start}); JSON must be sent as UTF-8") from None
    try:
        doc = _DECODER.decode(text)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels of arrays/objects)") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    # The walk is skipped when it cannot find anything: fewer brackets than the depth limit, no \u escape.
    deep = text.count("[") + text.count("{") > MAX_DEPTH
    surrogates = "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None
    if deep or surrogates:
        _check_tree(doc, what, surrogates)
    return doc


def _check_tree(doc: Any, what: str, surrogates: bool) -> None:
    """Iterative (a recursive walk would fail on the very input it is checking)."""
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth >= MAX_DEPTH:
                raise ValueError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels of arrays/objects)")
            for k, v in node.items():
                if surrogates:
                    _check_text(k, what)
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels of arrays/objects)")
            stack.extend((v, depth + 1) for v in node)
        elif surrogates and isinstance(node, str):
            _check_text(node, what)


def _check_text(s: str, what: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} contains a lone UTF-16 surrogate ({s[exc.start]!a}), which is not a Unicode "
                         "character; send valid Unicode text") from None
