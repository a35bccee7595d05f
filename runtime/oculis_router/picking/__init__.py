"""Endpoint picking: which replica of an upstream serves a request. Pure and stdlib-only (it ships in the
router image and the fleet simulator runs the same code).

Interface (for the router, the fleet simulator and an ext_proc front end alike):

    from oculis_router.picking import Picker, PickRequest, ReplicaState, block_hashes, chat_token_ids

    picker = Picker("prefix", seed=0, block_size=16)       # one per upstream; strategy in STRATEGIES
    ids = chat_token_ids(body["messages"])                 # or real token ids from a tokenizer
    req = PickRequest(block_hashes(ids, 16), prompt_tokens=len(ids), expected_output_tokens=256)
    pick = picker.pick(req, [ReplicaState("pod-a", in_flight=3, waiting=0, running=3, kv_usage=0.4,
                                          kv_blocks=29751), ...])     # the states of one revision
    pick.replica, pick.reason, pick.cached_blocks          # None when no replica is ready and not draining
    picker.apply_events("pod-a", events.from_wire(decoded_msgpack))   # kv-events: each pod's ZMQ batches
    picker.forget("pod-a")                                 # the pod is gone

`ReplicaState` is what the router knows: its own in-flight count (and the tokens it estimates those
requests hold, still have to prefill, and read per decode step: `in_flight_tokens`, `queued_tokens`,
`context_tokens` = their prompt + expected output), the replica's step-time costs when known
(`prefill_token_s`, `context_token_s`; otherwise an H100 8B default ratio), the scraped gauges
(`vllm:num_requests_waiting`, `num_requests_running`, `kv_cache_usage_perc`), the KV capacity
(`cache_config_info` or the capacity plan), ready/draining. `pick` records the dispatch in the
approximate memory itself. Reasons: `prefix` (the longest cached prefix won), `load` (load decided: no
prefix, or the prefix holder was saturated),
`fallback` (kv-events scored a silent replica from the approximate memory), `random`, `round-robin`. A request
for a LoRA adapter (`PickRequest.adapter`) goes only to replicas whose engine lists it (`ReplicaState.adapters`),
and the load-aware strategies weigh its `maxLoras` slots there (`lora.py`; `pick.slot` says which class).
Load is work, not requests (`load.py`): every load-aware strategy scores a replica by this request's own
wait there (prefill queued ahead plus its own uncached prefill, in token-budget steps each reading the
replica's context), from the router's counts at dispatch plus the gauges' excess over its count at the
scrape (`scraped_in_flight`); waits within two decode steps of the best are ties, taken in rotation.
Optional facts sharpen it: `step_s`, `max_num_batched_tokens` (ReplicaState) and a
`session` key (PickRequest: the OpenAI `user` field or a header) for affinity before a prefix is known.
Determinism: the same seed, states and calls give the same picks. `picker.py` documents the strategies
and the saturation and TTFT guards; `hashing.py` what is hashed when the router has only text; `events.py` vLLM's
KV-event schema; `kvwire.py` its msgpack/ZMQ framing (needs msgpack, the router/sim extras).
"""

from oculis_router.picking.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventFormatError,
    KVEvent,
    from_wire,
    to_wire,
)
from oculis_router.picking.hashing import (
    DEFAULT_BLOCK_SIZE,
    adapter_root,
    approx_token_ids,
    block_hashes,
    chat_parts,
    chat_token_ids,
)
from oculis_router.picking.index import KVIndex, PrefixMemory
from oculis_router.picking.lora import LoraSlots, Slot, holders, slot, slots_from_labels
from oculis_router.picking.picker import (
    PREFIX_STRATEGIES,
    STRATEGIES,
    Pick,
    Picker,
    PickRequest,
    Reason,
    ReplicaState,
    Strategy,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE", "PREFIX_STRATEGIES", "STRATEGIES", "AllBlocksCleared", "BlockRemoved", "BlockStored",
    "EventBatch", "EventFormatError", "KVEvent", "KVIndex", "LoraSlots", "Pick", "PickRequest", "Picker",
    "PrefixMemory", "Reason", "ReplicaState", "Slot", "Strategy", "adapter_root", "approx_token_ids", "block_hashes",
    "chat_parts", "chat_token_ids", "from_wire", "holders", "slot", "slots_from_labels", "to_wire",
]
