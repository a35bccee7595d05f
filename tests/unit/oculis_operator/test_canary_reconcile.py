"""The canary and the speculation guard inside the reconcile: what is written, what is left alone."""

from __future__ import annotations

import copy
from typing import Any

from oculis_operator import canary, render, speculative
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

CANARY = {"strategy": "Canary", "canary": {"replicas": 1, "duration": "20s", "interval": "10s", "failureLimit": 0,
                                          "minRequests": 5, "checks": {"maxRegressionPercent": 20}}}
SPEC = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
        "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxModelLen": 8192, "maxNumBatchedTokens": 8192},
        "rollout": CANARY}
CHANGED = {**SPEC, "engine": {"maxModelLen": 8192, "maxNumBatchedTokens": 512}}
GOOD = canary.Sample(requests=40, ttft_p95_ms=100, itl_p95_ms=20, e2e_p95_ms=900)
SLOW = canary.Sample(requests=40, ttft_p95_ms=900, itl_p95_ms=20, e2e_p95_ms=3000)


def complete(dep: dict[str, Any], gen: int = 1) -> dict[str, Any]:
    dep = copy.deepcopy(dep)
    n = dep["spec"]["replicas"]
    dep["metadata"]["generation"] = gen
    dep["status"] = {"observedGeneration": gen, "replicas": n, "updatedReplicas": n, "readyReplicas": n,
                     "availableReplicas": n}
    return dep


def stable_world() -> tuple[dict[str, Any], dict[str, Any]]:
    dep = complete(reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, None), lambda p: 8, "t").create[0])
    status = reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, dep), lambda p: 8, "t").status
    return dep, status


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def step(status: dict[str, Any], dep: dict[str, Any], now: str, cdep: dict[str, Any] | None = None,
         samples: Any = None, spare: int = 8, spec: dict[str, Any] = CHANGED) -> Any:
    return reconcile(Observed("x", "ns", "uid", 2, spec, status, dep, canary_deployment=cdep,
                              has_canary_service=cdep is not None, canary_samples=samples), lambda p: spare, now)


def test_an_engine_change_without_a_spare_gpu_waits_and_touches_nothing() -> None:
    dep, status = stable_world()
    out = step(status, dep, "2026-01-01T00:00:00Z", spare=0)
    assert out.create == [] and out.deployment_patch is None
    prog = cond(out.status, "Progressing")
    assert (prog["status"], prog["reason"]) == ("True", "WaitingForGPUs")
    assert "pool nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in prog["message"]
    assert out.status["canary"]["phase"] == "WaitingForGPUs" and cond(out.status, "Ready")["status"] == "True"


def test_a_bad_change_is_canaried_and_rolled_back_leaving_stable_untouched_and_not_retried() -> None:
    dep, status = stable_world()
    out = step(status, dep, "2026-01-01T00:00:00Z")
    assert out.deployment_patch is None and [(b["kind"], b["metadata"]["name"]) for b in out.create] == [
        ("Deployment", "x-vllm-canary"), ("Service", "x-vllm-canary")]  # the canary and its own Service
    cdep = complete(out.create[0])
    assert cdep["spec"]["replicas"] == 1 and cdep["spec"]["selector"]["matchLabels"][render.TRACK_LABEL] == "canary"
    hash_new = cdep["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH]
    assert hash_new != dep["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH]
    started = step(out.status, dep, "2026-01-01T00:00:05Z", cdep)  # canary ready: the analysis starts
    assert started.status["canary"]["startedAt"] == "2026-01-01T00:00:05Z"
    assert cond(started.status, "Progressing")["reason"] == "CanaryAnalysis"
    back = step(started.status, dep, "2026-01-01T00:00:15Z", cdep, (SLOW, GOOD))
    assert back.deployment_patch is None and back.delete_canary
    c = back.status["canary"]
    assert c["phase"] == "RolledBack" and c["decision"] == "Rollback" and c["intervals"] == 1
    ttft = next(x for x in c["checks"] if x["name"] == "ttftP95Ms")
    assert (ttft["canary"], ttft["stable"], ttft["ok"]) == (900, 100, False)
    assert "rolled back" in c["summary"] and "ttft FAIL" in c["summary"]
    assert [r for r, _ in back.warnings] == ["CanaryRolledBack"] and "canary 900" in back.warnings[0][1]
    assert cond(back.status, "Degraded")["reason"] == "CanaryRolledBack"
    assert cond(back.status, "Ready")["status"] == "True"  # the stable replicas still serve
    # the same generation again: nothing is retried, nothing written
    again = step(back.status, dep, "2026-01-01T00:01:00Z")
    assert again.create == [] and again.deployment_patch is None and again.status["canary"]["phase"] == "RolledBack"


def test_a_good_change_is_promoted_and_the_stable_deployment_rolls() -> None:
    dep, status = stable_world()
    cdep = complete(step(status, dep, "2026-01-01T00:00:00Z").create[0])
    s1 = step(step(status, dep, "2026-01-01T00:00:00Z").status, dep, "2026-01-01T00:00:00Z", cdep).status
    mid = step(s1, dep, "2026-01-01T00:00:10Z", cdep, (GOOD, GOOD))
    assert mid.status["canary"]["decision"] == "Continue" and mid.deployment_patch is None
    end = step(mid.status, dep, "2026-01-01T00:00:20Z", cdep, (GOOD, GOOD))
    assert end.status["canary"]["phase"] == "Promoted" and end.delete_canary
    assert end.deployment_patch is not None  # the rest rolls as today
    assert end.deployment_patch["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH] == \
        cdep["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH]


def test_missing_metrics_never_promote() -> None:
    dep, status = stable_world()
    cdep = complete(step(status, dep, "2026-01-01T00:00:00Z").create[0])
    s = step(step(status, dep, "2026-01-01T00:00:00Z").status, dep, "2026-01-01T00:00:00Z", cdep).status
    for now in ("2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"):
        out = step(s, dep, now, cdep, (None, None))
        s = out.status
        assert out.deployment_patch is None
    assert s["canary"]["phase"] == "RolledBack" and s["canary"]["decision"] == "Inconclusive"


def test_low_acceptance_turns_speculation_off_and_replans_capacity() -> None:
    spec = {**SPEC, "rollout": None, "engine": {"maxModelLen": 8192, "speculative": {
        "method": "ngram", "numSpeculativeTokens": 4, "acceptanceThreshold": 0.5, "autoDisable": True}}}
    dep = complete(reconcile(Observed("x", "ns", "uid", 1, spec, {}, None), lambda p: 8, "t").create[0])
    low = speculative.Sample(draft_tokens=2000, accepted_tokens=600, drafts=500)

    def at(status: dict[str, Any], now: str) -> Any:
        return reconcile(Observed("x", "ns", "uid", 1, spec, status, dep, speculation=low, speculative_window_s=60),
                         lambda p: 8, now)
    first = at({}, "2026-01-01T00:00:00Z")
    assert first.status["speculative"]["decision"] == "Watching" and first.deployment_patch is None
    off = at(first.status, "2026-01-01T00:01:00Z")
    assert off.status["speculative"]["decision"] == "Disable" and off.status["speculative"]["acceptanceRate"] == 0.3
    flag = cond(off.status, "SpeculationDisabled")
    assert (flag["status"], flag["reason"]) == ("True", "LowAcceptance") and "0.300" in flag["message"]
    args = off.deployment_patch["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--speculative-config" not in args  # rolled without speculation, through the normal roll
    assert off.status["capacity"]["kvCacheTokens"] >= first.status["capacity"]["kvCacheTokens"]
    kept = at(off.status, "2026-01-01T00:02:00Z")
    assert kept.status["speculative"]["decision"] == "Disabled" and cond(kept.status, "SpeculationDisabled")[
        "status"] == "True"


def test_good_acceptance_keeps_speculation() -> None:
    spec = {**SPEC, "rollout": None, "engine": {"maxModelLen": 8192, "speculative": {
        "method": "ngram", "acceptanceThreshold": 0.5, "autoDisable": True}}}
    dep = complete(reconcile(Observed("x", "ns", "uid", 1, spec, {}, None), lambda p: 8, "t").create[0])
    high = speculative.Sample(draft_tokens=2000, accepted_tokens=1600, drafts=500)
    out = reconcile(Observed("x", "ns", "uid", 1, spec, {}, dep, speculation=high), lambda p: 8, "t")
    assert out.status["speculative"]["decision"] == "Keep" and out.deployment_patch is None
    assert cond(out.status, "SpeculationDisabled")["status"] == "False"


def test_startup_probe_generates_one_token_sized_from_the_weights() -> None:
    dep = reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, None), lambda p: 8, "t").create[0]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    probe = c["startupProbe"]
    cmd = probe["exec"]["command"]
    assert cmd[:2] == ["python3", "-c"] and "/v1/completions" in cmd[2]
    assert '"max_tokens": 1' in cmd[3] and '"model": "x"' in cmd[3]
    assert probe["failureThreshold"] >= 30 and c["readinessProbe"]["httpGet"]["path"] == "/health"


def test_a_new_canary_writes_every_status_key_so_a_merge_patch_clears_the_last_ones_figures() -> None:
    dep, status = stable_world()
    out = step(status, dep, "2026-01-01T00:00:00Z")
    cdep = complete(out.create[0])
    s = step(out.status, dep, "2026-01-01T00:00:05Z", cdep).status
    back = step(s, dep, "2026-01-01T00:00:15Z", cdep, (SLOW, GOOD)).status
    assert back["canary"]["failedIntervals"] == 1
    newer = {**CHANGED, "engine": {"maxModelLen": 8192, "maxNumBatchedTokens": 8192, "gpuMemoryUtilization": 0.88}}
    fresh = reconcile(Observed("x", "ns", "uid", 3, newer, back, dep), lambda p: 8, "2026-01-01T00:01:00Z").status
    c = fresh["canary"]
    assert c["generation"] == 3 and c["failedIntervals"] == 0 and c["intervals"] == 0 and c["checks"] == []
    assert {"decision", "startedAt", "lastCheckAt", "canaryRequests"} <= c.keys() and c["decision"] is None
