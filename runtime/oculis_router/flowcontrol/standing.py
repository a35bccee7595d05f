"""A request's standing in flow control, pure: its flow (fairness key), priority and share weight, from
the route, the API key's override and the X-Oculis-Priority header, within what the key is allowed."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from oculis.router import PRIORITY_MIN, FlowControl, LimitOverride, Route, ServerSettings
from oculis_router.limits import Identity, matches

PRIORITY_HEADER = "x-oculis-priority"
# Batch lines run below every priority a request can ask for: only on seats nothing else waits for.
BATCH_PRIORITY = PRIORITY_MIN - 1
# The priority of the request being answered, set by the request path once flow control placed it; an
# upstream with `priority_scheduling` gets it as vLLM's `priority` (providers/openai_compat.py)
REQUEST_PRIORITY: ContextVar[int | None] = ContextVar("oculis_request_priority", default=None)


def engine_priority(priority: int) -> int:
    """vLLM's `priority` for a flow-control priority: vLLM serves the lower value first, Oculis the higher."""
    return -priority


class PriorityRefused(ValueError):
    """A priority the request may not have: `status` 400 (not a priority) or 403 (above its allowance)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Standing:
    flow: str
    priority: int
    weight: float = 1.0


def override_for(server: ServerSettings, route: Route | None, who: Identity) -> LimitOverride | None:
    """The first override naming this request's key or tenant: the route's, then the server's (as limits)."""
    for o in [*(route.limit_overrides if route else []), *server.limit_overrides]:
        if matches(o.match, who):
            return o
    return None


def flow_of(fc: FlowControl, who: Identity, route_label: str) -> str:
    if fc.fairness == "route":
        return route_label
    if fc.fairness == "key":
        return "key-" + who.key_sha256[:16]
    return who.tenant


def standing(server: ServerSettings, route: Route | None, who: Identity, route_label: str,
             header: str | None) -> Standing:
    """Priority: X-Oculis-Priority if sent (an integer from PRIORITY_MIN up to the key's max_priority, else
    server.flow_control.max_priority), else the key's override, else the route's."""
    fc = server.flow_control
    o = override_for(server, route, who)
    allowed = o.max_priority if o is not None and o.max_priority is not None else fc.max_priority
    if header is not None:
        try:
            asked = int(header.strip())
        except ValueError:
            raise PriorityRefused(400, f"X-Oculis-Priority {header!r} is not a whole number; send one from "
                                       f"{PRIORITY_MIN} to {allowed} (higher is served first)") from None
        if asked < PRIORITY_MIN:
            raise PriorityRefused(400, f"X-Oculis-Priority {asked} is below the lowest priority {PRIORITY_MIN}; "
                                       f"send one from {PRIORITY_MIN} to {allowed}")
        if asked > allowed:
            raise PriorityRefused(403, f"X-Oculis-Priority {asked} is above what this key may ask for: the allowed "
                                       f"range is {PRIORITY_MIN} to {allowed} (raised by a limit_overrides entry's "
                                       "max_priority for the key)")
        priority = asked
    elif o is not None and o.priority is not None:
        priority = o.priority
    else:
        priority = route.flow_control.priority if route is not None else 0
    weight = o.weight if o is not None and o.weight is not None else 1.0
    return Standing(flow_of(fc, who, route_label), priority, weight)
