"""A canary's decision is taken by the recheck loop (metrics move without Kubernetes events), and its
Event must post from there: kopf keeps its event queue in a context variable set only for an object's
handler, so the loop runs each reconcile in a copy of a handler's context."""

from __future__ import annotations

import asyncio
import contextvars
from types import SimpleNamespace
from typing import Any

import pytest
from kopf._core.engines import posting

from oculis_operator import rechecks


def test_recheck_reconciles_can_post_events(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = SimpleNamespace(recheck={("ns", "x")}, external=set(), recheck_routes=set(), event_context=None)
    seen: list[Any] = []
    done = asyncio.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def handler() -> None:  # what kopf does around every object handler, then ours
            posting.event_queue_loop_var.set(loop)
            posting.event_queue_var.set("the operator's event queue")  # type: ignore[arg-type]
            rechecks.remember_event_context(kube)  # type: ignore[arg-type]

        contextvars.copy_context().run(handler)

        def reconcile_named(memo: Any, namespace: str, name: str, logger: Any) -> None:
            seen.append(posting.event_queue_var.get(None))  # kopf.info/warn read exactly this
            loop.call_soon_threadsafe(done.set)

        monkeypatch.setattr(rechecks, "reconcile_named", reconcile_named)
        monkeypatch.setattr(rechecks, "RECHECK_SECONDS", 0)
        task = asyncio.create_task(rechecks.recheck(SimpleNamespace(kube=kube)))  # type: ignore[arg-type]
        await asyncio.wait_for(done.wait(), 10)
        task.cancel()

    asyncio.run(main())
    assert seen and seen[0] == "the operator's event queue"
