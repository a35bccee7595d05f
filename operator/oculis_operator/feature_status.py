"""The parts of a GPUUpstream's reconcile that report on one feature each: the speculative-decoding
guard (which may turn speculation off in the spec to plan), whether the router hears the engines'
KV events, and the LoRA adapters on the ready engines. Pure: no API calls.
"""

from __future__ import annotations

from typing import Any

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import adapter_loading, speculative
from oculis_operator.conditions import Conditions
from oculis_operator.reconcile_io import Observed, Outcome


def speculation_guard(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any], now: str,
                       warnings: list[tuple[str, str]]) -> GPUUpstreamSpec:
    """status.speculative from the measured acceptance, and the spec to plan and render: with speculation
    turned off by the guard for this generation, the same spec without it (its draft's memory goes back
    to the KV cache in the plan, and the change rolls like any other)."""
    sp = spec.engine.speculative if spec.engine else None
    prev = obs.status.get("speculative") or {}
    if sp is None or not sp.enabled:
        if condition_of(obs.status, "SpeculationDisabled"):
            conds.set("SpeculationDisabled", "False", "NotConfigured", "the spec runs no speculative decoding")
        return spec
    already = prev.get("disabledGeneration") == obs.generation
    window = obs.speculative_window_s
    v = speculative.decide(sp.acceptance_threshold, sp.auto_disable, obs.speculation, window, prev.get("lowSince"),
                           now, already)
    if v.decision == "Disabled":
        status["speculative"] = {**prev, "decision": "Disabled"}  # the figures that turned it off stay shown
        conds.set("SpeculationDisabled", "True", "LowAcceptance", str(prev.get("message") or v.message))
    else:
        status["speculative"] = {
            "acceptanceRate": None if v.acceptance_rate is None else round(v.acceptance_rate, 4),
            "meanAcceptedLength": None if v.mean_accepted_length is None else round(v.mean_accepted_length, 3),
            "draftTokens": v.draft_tokens, "window": f"{window}s", "decision": v.decision, "lowSince": v.low_since,
            "disabledGeneration": obs.generation if v.decision == "Disable" else None, "message": v.message}
        if v.decision == "Disable":
            conds.set("SpeculationDisabled", "True", "LowAcceptance", v.message)
            warnings.append(("SpeculationDisabled", v.message))
        else:
            conds.set("SpeculationDisabled", "False", v.decision, v.message)
            return spec
    assert spec.engine is not None
    off = sp.model_copy(update={"enabled": False})
    return spec.model_copy(update={"engine": spec.engine.model_copy(update={"speculative": off})})


def condition_of(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status.get("conditions", []) or [] if c.get("type") == type_), {})
    return found


def adapters(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any], out: Outcome) -> None:
    """status.adapters, the ADAPTERS column and AdaptersReady from the adapter sync's last look. An adapter
    the engine will not load is a Warning and AdaptersReady=False naming it; Ready is the base model's and
    stays as it is (the other adapters serve), and nothing is rolled or deleted for it."""
    if not spec.lora_enabled:
        if obs.status.get("adapters") is not None or obs.status.get("adaptersReady") is not None:
            status.update(adapters=None, adaptersReady=None)  # null: the merge patch removes them
        if condition_of(obs.status, "AdaptersReady"):
            conds.set("AdaptersReady", "True", "NoAdapters", "the engine serves no LoRA adapters")
        return
    entries, summary, cond, warning = adapter_loading.status_of([a.name for a in spec.adapters or []], obs.adapters)
    status.update(adapters=entries, adaptersReady=summary)
    conds.set("AdaptersReady", *cond)
    if warning is not None:
        out.warnings.append(warning)


def kv_events(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, out: Outcome) -> None:
    """spec.routing.picker kv-events: `KVEvents` says whether the router hears every engine's KV events
    (its oculis_kv_events_silent_replicas, read from Prometheus); a silent engine is scored from the
    router's prefix memory, so requests still flow: a warning, never a change to Ready."""
    if spec.routing is None or spec.routing.picker != "kv-events" or obs.kv_events_silent is None:
        return
    silent = int(obs.kv_events_silent)
    if silent:
        msg = (f"{silent} replica(s) publish no KV events the router hears; it scores them from its own prefix "
               "memory (picker prefix) meanwhile: check that the engine image supports --kv-events-config "
               "and that port 5557 is reachable from the router")
        conds.set("KVEvents", "False", "NoEvents", msg)
        out.warnings.append(("KVEventsFallback", msg))
    else:
        conds.set("KVEvents", "True", "Publishing", "the router hears every replica's KV events")
