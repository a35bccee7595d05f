"""How the operator words and sorts the API's refusals (one line, no traceback; gone vs. retry)."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from oculis_operator.api_errors import api_error_line, going_away


def refusal(status: int, reason: str, message: str, cause: str = "") -> ApiException:
    err = ApiException(status=status, reason=reason)
    body = {"kind": "Status", "message": message, "details": {"causes": [{"reason": cause}] if cause else []}}
    err.body = json.dumps(body)
    return err


def test_quota_refusal_is_one_line_with_the_api_message() -> None:
    err = refusal(403, "Forbidden", 'deployments.apps "x-vllm" is forbidden: exceeded quota: q')
    assert api_error_line(err) == '403 Forbidden: deployments.apps "x-vllm" is forbidden: exceeded quota: q'
    assert not going_away(err)


def test_terminating_or_missing_namespace_is_going_away() -> None:
    assert going_away(refusal(403, "Forbidden", "being terminated", cause="NamespaceTerminating"))
    assert going_away(refusal(404, "Not Found", 'namespaces "t" not found'))
    assert not going_away(refusal(500, "Internal Server Error", "etcdserver: request timed out"))


def test_connection_errors_and_odd_bodies_still_give_one_line() -> None:
    assert api_error_line(ProtocolError("Connection aborted.")) == "ProtocolError: Connection aborted."
    err = ApiException(status=502, reason="Bad Gateway")
    err.body = "<html>\nproxy error</html>"
    line = api_error_line(err)
    assert line.startswith("502 Bad Gateway") and "\n" not in line
