"""LoRA adapters in the pick: which replicas can serve a request for an adapter, and what its `maxLoras`
slots mean for it there. Pure: replica states in, states or a slot class out.

Two facts per replica, from two sources:
- `adapters`: the adapters its engine has registered (its `/v1/models` entries with a `parent`; None
  until the router has read them). vLLM answers a request for an adapter it has not registered with a
  404, so a replica without it is never a candidate while another replica lists it (`holders`).
- the LoRA slots: `vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}`
  (scraped) plus the adapters of the router's own in-flight calls there (fresh between scrapes). One
  engine step runs at most `max_lora` distinct adapters; a request for another waits in the engine's
  queue until a slot frees, that is until every running request of some other adapter has finished
  (`slot`).

Slot classes, best first (`Slot`):
- `active`: the adapter runs there now: the request joins the batch, nothing to load;
- `free`: a slot is free there (running, waiting and the router's in-flight adapters, with this one,
  fit in max_lora): the adapter is swapped in (a host-to-device copy) and the request runs;
- `wait`: the slots are taken by other adapters (or claimed by requests already waiting for them): the
  request waits there for a whole answer of another adapter to finish; or the adapter runs there but
  other adapters wait for a slot: vLLM's scheduler admits the running adapter's requests past them, so
  more of its traffic there keeps them waiting for as long as it lasts (bench/lora_picking.py, 12
  adapters on 8 slots: TTFT p90 43 s without this rule, 19 s with it, as blind picking).

The load-aware strategies are sticky to the adapter until saturated: `wait` counts as saturated, and among
the rest `active` comes before `free` whatever the loads (picker.py says why, with the measurements);
random and round-robin only keep to the holders (they are the blind baselines). llm-d scores the same
classes (active 1.0, free slot 0.8, waiting 0.6, else 0, its lora-affinity-scorer, weighted with queue and
KV scorers) and filters on `/v1/models` separately (served-model-filter, 503 when no endpoint lists the
model); AIBrix places each adapter on chosen pods and routes its requests among those pods only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from oculis_router.picking.picker import ReplicaState

Slot = Literal["active", "free", "wait"]
SLOT_RANK: dict[Slot, int] = {"active": 0, "free": 1, "wait": 2}


def holders(adapter: str, states: Sequence[ReplicaState]) -> list[ReplicaState]:
    """The replicas that can serve `adapter`: those whose engine lists it; when none does, those whose
    list is not known yet (a replica the router has not read: it may have it); else none."""
    listed = [r for r in states if r.adapters is not None and adapter in r.adapters]
    if listed:
        return listed
    return [r for r in states if r.adapters is None]


def claimed(r: ReplicaState) -> frozenset[str]:
    """The adapters holding or claiming r's slots: running, waiting, and the router's own in flight there."""
    return r.lora_running | r.lora_waiting | r.in_flight_adapters


def slot(r: ReplicaState, adapter: str) -> Slot:
    """What r's LoRA slots mean for a request for `adapter` (module docstring)."""
    if adapter in r.lora_running:
        # joins the batch at once, unless other adapters already wait there for a slot: vLLM's scheduler
        # admits a running adapter's requests past them, so feeding it would keep them waiting (starved)
        return "wait" if r.lora_waiting - r.lora_running - {adapter} else "active"
    taken = claimed(r)
    if r.max_loras is None:  # the engine's limit is not known (no scrape yet): no reason to expect a wait
        return "active" if adapter in taken else "free"
    if len(taken | {adapter}) <= r.max_loras:
        return "active" if adapter in taken else "free"
    return "wait"


@dataclass(frozen=True, slots=True)
class LoraSlots:
    """An engine's `vllm:lora_requests_info` now: its max_lora and the adapters its running and waiting
    requests use."""

    max_loras: int | None = None
    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()


def slots_from_labels(labels: dict[str, str]) -> LoraSlots:
    """One `vllm:lora_requests_info` label set (comma-separated adapter names; an unreadable max_lora: None)."""

    def names(key: str) -> frozenset[str]:
        return frozenset(n for n in labels.get(key, "").split(",") if n)

    raw = labels.get("max_lora", "")
    return LoraSlots(int(raw) if raw.isdigit() else None, names("running_lora_adapters"),
                     names("waiting_lora_adapters"))
