"""The text of an OpenAI message's content, for the classifier and the answer verifier alike.

Its own module, free of numpy and the tokenizer (classify's), so that what imports it without
classifying (answer_check, and through it the CLI's cost reports in an operator-only install) stays light.
"""

from __future__ import annotations

from typing import Any


def content_text(content: Any, name_media: bool = False) -> str:
    """OpenAI content is a string or a list of parts; only text parts count (a part whose `text` is
    not a string has none: scoring is no place to refuse a request, and a TypeError here was a 500).
    `name_media`: every other part is named in its place as `[type]` (for a reader told what is there:
    the answer verifier)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "text":
                if isinstance(t := p.get("text"), str):
                    out.append(t)
            elif name_media:
                out.append(f"[{p.get('type')}]")
        return "\n".join(out)
    return ""
