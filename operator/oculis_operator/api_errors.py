"""How the operator reads the API server's refusals: one log line each, and which ones mean the
object is going away (nothing to retry or report) rather than a problem to retry."""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException


def going_away(err: Exception) -> bool:
    """The namespace is terminating or gone, or the object was deleted under us."""
    return isinstance(err, ApiException) and (
        err.status == 404 or (err.status == 403 and "NamespaceTerminating" in (err.body or "")))


def api_error_line(err: Exception) -> str:
    if isinstance(err, ApiException):
        try:
            status = json.loads(err.body or "{}")
        except ValueError:
            status = None
        message = status.get("message", "") if isinstance(status, dict) else ""
        line = f"{err.status} {err.reason}: {message or err.body or ''}"
    else:
        line = f"{type(err).__name__}: {err}"
    return " ".join(line.split())[:500]  # one log line whatever the body holds
