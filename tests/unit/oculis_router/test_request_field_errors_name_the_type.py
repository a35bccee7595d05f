"""A `model` that is given but is not a string was answered "you must provide a model" (QA3 Part 2 #18): the
client did provide one. The 400 now says what it must be and what it got; a missing or empty one keeps its
words."""

from __future__ import annotations

from typing import Any

import pytest

from oculis_router.errors import APIError
from oculis_router.inbound import check_body

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("model", "got"), [(5, "number"), (["chat"], "array"), ({"id": "chat"}, "object"),
                                            (True, "boolean")])
def test_a_model_that_is_not_a_string_says_so(model: Any, got: str) -> None:
    with pytest.raises(APIError) as exc:
        check_body({"model": model, "messages": MESSAGES}, "chat")
    assert exc.value.status == 400 and exc.value.param == "model"
    assert "`model` must be a string" in exc.value.message and f"got a JSON {got}" in exc.value.message


@pytest.mark.parametrize("body", [{"messages": MESSAGES}, {"model": "", "messages": MESSAGES},
                                  {"model": None, "messages": MESSAGES}], ids=["missing", "empty", "null"])
def test_a_missing_model_is_still_asked_for(body: dict[str, Any]) -> None:
    with pytest.raises(APIError, match="you must provide a model"):
        check_body(body, "chat")
