"""`sim serve --kv-events-config`: vLLM-format KV events on a real ZMQ socket, keyed so the router's
kv-events picker matches them to requests by the prompt text alone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from oculis_router.picking import (
    BlockRemoved,
    BlockStored,
    Picker,
    PickRequest,
    ReplicaState,
    block_hashes,
    chat_token_ids,
    kvwire,
)
from oculis_sim import config, kvevents
from oculis_sim.api_request import _chat_prompt
from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import Request
from oculis_sim.tokens import block_hashes as engine_hashes

MESSAGES = [{"role": "system", "content": " ".join(f"rule{i} ." for i in range(40))},
            {"role": "user", "content": "What is the rule?"}]


def recv(sub: zmq.Socket) -> list[bytes]:  # type: ignore[type-arg]
    assert sub.poll(5000), "no KV event within 5 s"
    return sub.recv_multipart()  # type: ignore[no-any-return]


def test_config_is_vllms_json_and_bad_input_is_one_line() -> None:
    cfg = kvevents.parse_config('{"enable_kv_cache_events": true, "endpoint": "tcp://*:35557", "hwm": 10}')
    assert cfg == kvevents.KVEventsConfig("tcp://*:35557", "")
    assert kvevents.parse_config('{"enable_kv_cache_events": false}') is None
    assert kvevents.parse_config('{"enable_kv_cache_events": true, "publisher": "null"}') is None
    for raw, fix in (("{", "not JSON"), ('{"enable_kv_cache_events": true, "endpont": "x"}', "unknown field 'endpont'"),
                     ('{"enable_kv_cache_events": true, "endpoint": "5557"}', "must be a ZMQ address")):
        with pytest.raises(kvevents.KVEventsError, match=fix):
            kvevents.parse_config(raw)


def test_engine_events_reach_the_routers_picker_by_the_prompt_text(tmp_path: Path) -> None:
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", num_gpu_blocks_override=12,
                       max_model_len="160")
    cfg = kvevents.KVEventsConfig(f"ipc://{tmp_path}/kv", "kv")
    pub = kvevents.Publisher.bind(cfg, s.block_size)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(cfg.endpoint)
    time.sleep(0.2)  # a PUB socket drops what it sends before the subscriber has joined
    try:
        core = EngineCore(s)
        pub.attach(core)
        toks, n_prompt, _ = _chat_prompt({"messages": MESSAGES})
        hashes = engine_hashes(toks, s.block_size)
        pub.note(hashes, toks)
        core.add(Request(0, n_prompt, 1, 0.0, hashes))
        core.step(0.0)
        pub.publish(core)
        topic, seq, _ = frames = recv(sub)
        assert topic == b"kv" and seq == (0).to_bytes(8, "big")
        _, batch = kvwire.decode(frames)
        stored = batch.events[0]
        assert isinstance(stored, BlockStored) and stored.parent_block_hash is None
        assert len(stored.block_hashes) == len(hashes) and len(stored.token_ids) == 16 * len(hashes)

        picker = Picker("kv-events", block_size=s.block_size)
        picker.apply_events("pod-a", batch)
        picker.apply_events("pod-b", kvwire.decode(kvwire.encode("kv", 0, type(batch)(0.0, ())))[1])
        ids = chat_token_ids(MESSAGES)  # what a router computes from the request body
        req = PickRequest(block_hashes(ids, s.block_size), len(ids))
        pick = picker.pick(req, [ReplicaState("pod-a"), ReplicaState("pod-b")])
        assert pick is not None and (pick.replica, pick.reason, pick.cached_blocks) == ("pod-a", "prefix", len(hashes))

        # a long prompt of other words evicts those blocks: BlockRemoved, and the affinity is gone
        other = [f"w{i}" for i in range(150)]
        oh = engine_hashes(other, s.block_size)
        pub.note(oh, other)
        core.add(Request(1, 150, 1, 1.0, oh))
        core.step(1.0)
        pub.publish(core)
        _, batch = kvwire.decode(recv(sub))
        assert any(isinstance(e, BlockRemoved) for e in batch.events)
        picker.apply_events("pod-a", batch)
        assert picker.matches(req, [ReplicaState("pod-a"), ReplicaState("pod-b")])[0]["pod-a"] < len(hashes)
    finally:
        sub.close(0)
        pub.close()


def test_sim_serve_refuses_a_bad_kv_events_config(capsys: pytest.CaptureFixture[str]) -> None:
    from oculis_sim.cli import main

    code = main(["serve", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--port", "35999",
                 "--kv-events-config", '{"enable_kv_cache_events": "yes"}'])
    assert code == 2
    assert "enable_kv_cache_events 'yes' must be true or false" in capsys.readouterr().err
