"""The recheck loop: reconciles again, by name, what no Kubernetes event will bring back (a failed
reconcile, a Secret awaited, metrics that move: canaries, guards, autoscaling), and re-renders the
router configs whose write failed or whose routes watch classifier drift. Each reconcile runs in a
copy of a handler's context, so it can post Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from typing import Any

import kopf

from oculis_operator.kube import Kube
from oculis_operator.route_sync import DRIFT_NAMESPACES, render_routes_or_recheck
from oculis_operator.settings import RECHECK_SECONDS
from oculis_operator.upstream_sync import reconcile_named

EXTERNAL_EVERY = 6  # recheck rounds between looks at every external upstream's Secret
log = logging.getLogger("oculis.operator")


async def in_event_context(kube: Kube, call: Any) -> None:
    """Run a reconcile from a startup task in a thread, in a handler's context: kopf sets its event queue
    only in an object's handler, not in a startup task; without it kopf.info/warn raised LookupError here,
    so a recheck posted no Event and stopped before its warnings (a canary's rollback among them)."""
    ctx = kube.event_context
    await asyncio.to_thread(ctx.copy().run, call) if ctx is not None else await asyncio.to_thread(call)


async def recheck(memo: kopf.Memo) -> None:
    """Reconcile again, by name, the upstreams whose last reconcile failed or waits for a Secret, and
    the namespaces whose router config could not be written."""
    kube: Kube = memo.kube
    rounds = 0
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        rounds += 1
        due = kube.recheck | (kube.external if rounds % EXTERNAL_EVERY == 0 else set())
        for namespace, name in sorted(due):
            with contextlib.suppress(Exception):  # one failing upstream must not stop the others
                named = Prefixed(log, {"obj": f"{namespace}/{name}"})
                await in_event_context(kube, functools.partial(reconcile_named, memo, namespace, name, named))
        for namespace in sorted(kube.recheck_routes | DRIFT_NAMESPACES):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(render_routes_or_recheck, kube, namespace, log, True)


class Prefixed(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Names the object in lines logged outside a kopf handler, as kopf's own logger does."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{(self.extra or {}).get('obj')}] {msg}", kwargs


def remember_event_context(kube: Kube) -> None:
    """Keep a handler's context (kopf's event queue is in it) for the recheck loop's reconciles."""
    if kube.event_context is None:
        kube.event_context = contextvars.copy_context()
