"""The base of every Oculis schema model: camelCase on the wire (CRDs), snake_case in Python and in
`oculis-config.yaml`, unknown fields refused, and errors rendered as `field.path: problem (got value)`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


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
    return msg.removeprefix("Value error, ")
