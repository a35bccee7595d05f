"""The speculative-decoding guard on the sandbox for real: simulator pods draft with ngram speculation
at a given per-position acceptance (the simulator's --acceptance-rate, passed as an extra arg), a real
Prometheus scrapes vllm:spec_decode_*, the operator (window OCULIS_SPECULATIVE_WINDOW_SECONDS=15 in
the e2e operator) measures acceptance = accepted / draft tokens. Per-position 0.3 over 4 proposed
tokens accepts about 0.11 of them: turned off through a rolling restart; 0.8 accepts about 0.59: kept."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import engine_auth, eventually
from kubernetes import client
from skips import needs_command
from test_gpuupstream import World, upstream

pytestmark = needs_command("prometheus", "prometheus")


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def engine(acceptance: float) -> dict[str, Any]:
    return {"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 8192,
            "speculative": {"method": "ngram", "numSpeculativeTokens": 4, "acceptanceThreshold": 0.5,
                            "autoDisable": True},
            "extraArgs": [f"--acceptance-rate={acceptance}"]}


def load(endpoints: Path, hosts: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            doc = json.loads(endpoints.read_text())
        except (OSError, ValueError):
            doc = {}
        ports = [(p["port"], h) for h in hosts for p in doc.get(h, {}).get("pods", [])]
        for port, host in ports:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30, headers=engine_auth(endpoints, host),
                           json={
                    "model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": f"{uuid.uuid4()} tell me more",
                    "max_tokens": 64})
        if not ports:
            stop.wait(0.5)


def test_low_acceptance_is_turned_off_and_high_acceptance_kept(world: World, served: dict[str, Any]) -> None:
    ns, endpoints = world.ns, Path(served["endpoints"])
    world.create(upstream("spec-low", replicas=1, engine=engine(0.3)))
    world.create(upstream("spec-high", replicas=1, engine=engine(0.8)))
    eventually(lambda: world.ready("spec-low") and world.ready("spec-high"), what="both upstreams Ready")
    low_before = world.get("spec-low")["status"]
    high_hash = world.get("spec-high")["status"]["engineHash"]
    stop = threading.Event()
    worker = threading.Thread(target=load, args=(endpoints, [f"spec-low-vllm.{ns}.svc", f"spec-high-vllm.{ns}.svc"],
                                                 stop), daemon=True)
    worker.start()
    try:
        off = eventually(lambda: (c := world.cond("spec-low", "SpeculationDisabled")).get("status") == "True" and c,
                         timeout=150, what="low acceptance turned speculation off")
        assert off["reason"] == "LowAcceptance" and "acceptance 0." in off["message"], off
        measured = world.get("spec-low")["status"]["speculative"]
        assert measured["acceptanceRate"] < 0.5 and measured["decision"] in ("Disable", "Disabled"), measured
        # rolled through the normal restart, without the speculative config; the KV plan re-planned
        eventually(lambda: world.ready("spec-low"), timeout=150, what="the restart without speculation completed")
        args = world.apps.read_namespaced_deployment("spec-low-vllm", ns).spec.template.spec.containers[0].args
        assert not any(a.startswith("--speculative-config") for a in args)
        after = world.get("spec-low")["status"]
        assert after["capacity"]["kvCacheTokens"] >= low_before["capacity"]["kvCacheTokens"]
        assert after["engineHash"] != low_before["engineHash"]
        # high acceptance: measured and kept
        high = eventually(lambda: (s := (world.get("spec-high")["status"].get("speculative") or {})).get(
            "decision") == "Keep" and s, timeout=60, what="high acceptance measured")
        assert high["acceptanceRate"] > 0.5 and high["meanAcceptedLength"] > 1, high
        assert world.cond("spec-high", "SpeculationDisabled").get("status") == "False"
        assert world.get("spec-high")["status"]["engineHash"] == high_hash
    finally:
        stop.set()
        worker.join(60)
