"""The base of every Oculis schema model: camelCase on the wire (CRDs), snake_case in Python and in
`oculis-config.yaml`, unknown fields refused, and errors rendered as `field.path: problem (got value)`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

# Names of upstreams, routes and tiers: DNS labels, so each can be a Kubernetes object's name and a metric label.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
NAME_RULE = ("not a name: use lowercase letters, digits and '-', starting and ending with a letter or digit, at most "
             "63 characters (a DNS label), e.g. llama-8b")


class Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,  # snake_case (config file, Python) and camelCase (CRD) both accepted
        extra="forbid",
        frozen=True,
        validate_default=True,
        protected_namespaces=(),  # `modelConfig` is a field of ours, not pydantic's
        use_attribute_docstrings=True,  # a field's docstring is its description (`kubectl explain`)
    )


def format_errors(exc: ValidationError, root: str = "") -> str:
    """One line per problem, naming the field path, the value and what is expected."""
    lines = []
    for err in exc.errors(include_url=False):
        path = ".".join(str(p) for p in (root, *err["loc"]) if p != "")
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"{path or '<root>'}: {_message(err)}{shown}")
    return "\n".join(lines)


def _message(err: Any) -> str:
    msg = str(err["msg"])
    if err["type"] == "extra_forbidden":
        return "unknown field; remove it or check its spelling"
    if err["type"] == "string_pattern_mismatch" and (err.get("ctx") or {}).get("pattern") == NAME_PATTERN:
        # The rule in words, not the regular expression (QA3 Part 2 #16)
        return NAME_RULE
    return msg.removeprefix("Value error, ")
