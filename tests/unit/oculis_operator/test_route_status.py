"""An InferenceRoute's status tells GitOps health what it needs: Degraded only when the route is broken
or an upstream cannot answer, Progressing while an upstream comes up, ScaledToZero for a route whose
upstream is at zero, per-tier readiness; a rolling upstream whose old replicas answer keeps the route
Ready. Tiers no prompt can reach are refused; the rendered route carries no nulls."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from oculis.inferenceroute import InferenceRouteSpec
from oculis_operator import routeconfig, router_configmap


def cond(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason}


def gu(name: str, *conds: dict[str, Any], provider: str = "vllm", **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"provider": provider, "model": f"model-{name}"}
    if provider == "vllm":
        spec["gpu"] = {"product": "H100-80GB", "count": 1}
    st = {"engineHash": f"h-{name}", "conditions": list(conds), **status} if conds or status else None
    return {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": spec,
            **({"status": st} if st else {})}


def ir(*upstreams: str) -> dict[str, Any]:
    tiers: list[dict[str, Any]] = [{"name": f"t{i}", "match": {"complexityBelow": round(0.3 * (i + 1), 2)},
                                    "upstream": u} for i, u in enumerate(upstreams)]
    tiers[-1]["match"] = {}
    return {"metadata": {"name": "r", "namespace": "ns", "generation": 1, "uid": "u"}, "spec": {"tiers": tiers}}


READY = cond("Ready", "True", "AllReplicasReady")


def verdict(*upstreams: dict[str, Any]) -> routeconfig.RouteVerdict:
    return routeconfig.render_namespace([ir(*(u["metadata"]["name"] for u in upstreams))], list(upstreams)).routes["r"]


def test_a_route_over_a_rolling_upstream_with_ready_replicas_stays_ready() -> None:
    rolling = gu("a", cond("Ready", "False", "RollingUpdate"), cond("Progressing", "True", "RollingUpdate"),
                 readyReplicas=1)
    v = verdict(rolling)
    assert (v.ready, v.degraded, v.progressing) == (True, False, "")
    assert v.tier_status == [{"name": "t0", "upstream": "a", "ready": True}]


def test_a_route_waiting_for_an_upstream_that_comes_up_is_progressing_not_degraded() -> None:
    for coming in (gu("a"), gu("a", cond("Ready", "False", "Creating"), cond("Progressing", "True", "Creating"))):
        v = verdict(coming)
        assert (v.ready, v.reason, v.degraded) == (False, "UpstreamProgressing", False)
        assert v.progressing.startswith("waiting for a")


def test_a_route_over_an_upstream_that_cannot_answer_is_degraded_naming_it() -> None:
    secret = gu("gpt", cond("Ready", "False", "SecretNotFound"), cond("Degraded", "True", "SecretUnresolved"),
                provider="openai")
    v = verdict(gu("a", READY), secret)
    assert (v.ready, v.reason, v.degraded) == (False, "UpstreamNotReady", True)
    assert "gpt (SecretNotFound)" in v.message
    assert [t["ready"] for t in v.tier_status] == [True, False]
    missing = routeconfig.render_namespace([ir("a", "ghost")], [gu("a", READY)]).routes["r"]
    assert missing.degraded and missing.reason == "UpstreamNotFound"
    assert missing.tier_status[1] == {"name": "t1", "upstream": "ghost", "ready": False}


def test_a_route_whose_upstream_is_scaled_to_zero_is_not_degraded() -> None:
    v = verdict(gu("a", cond("Ready", "False", "ScaledToZero"), readyReplicas=0))
    assert (v.ready, v.reason, v.degraded) == (False, "ScaledToZero", False)


def test_a_route_that_answers_by_escalation_while_a_tier_is_at_zero_is_ready() -> None:
    """coldStart escalate (the default) with a later tier that serves: every request is answered, so the
    route is Ready (reason ScaledToZero says why its first tier does not answer); with nothing above the
    tier at zero, or coldStart wait/fail, it is not."""
    zero = gu("a", cond("Ready", "False", "ScaledToZero"), readyReplicas=0)
    up = gu("b", READY)
    v = verdict(zero, up)
    assert (v.ready, v.reason, v.degraded) == (True, "ScaledToZero", False)
    assert "next tier that serves" in v.message
    top_at_zero = routeconfig.render_namespace([ir("b", "a")], [zero, up]).routes["r"]
    assert (top_at_zero.ready, top_at_zero.reason) == (False, "ScaledToZero")
    for mode in ("wait", "fail"):
        route = ir("a", "b")
        route["spec"]["coldStart"] = mode
        held = routeconfig.render_namespace([route], [zero, up]).routes["r"]
        assert (held.ready, held.reason) == (False, "ScaledToZero") and f"coldStart {mode}" in held.message


def test_the_rendered_route_carries_only_set_fields() -> None:
    out = routeconfig.render_namespace([ir("a")], [gu("a", READY)])
    doc = yaml.safe_load(out.data[router_configmap.CONFIG_KEY])

    def nulls(node: Any, path: str = "") -> list[str]:
        if isinstance(node, dict):
            return [p for k, v in node.items() for p in nulls(v, f"{path}.{k}")]
        if isinstance(node, list):
            return [p for i, v in enumerate(node) for p in nulls(v, f"{path}[{i}]")]
        return [path] if node is None else []

    assert nulls(doc) == []


@pytest.mark.parametrize(("tiers", "says"), [
    ([{"name": "a", "match": {"complexityBelow": 0.5}}, {"name": "b", "match": {"complexityBelow": 0.5}},
      {"name": "c"}],
     "spec.tiers[1] ('b') can never be reached: tier 0 ('a') matches every prompt it matches"),
    ([{"name": "a", "match": {}}, {"name": "b"}], "spec.tiers[0] ('a') has an empty match but is not the last tier"),
    ([{"name": "a", "match": {"maxPromptTokens": 100}}, {"name": "b", "match": {"maxPromptTokens": 50}},
      {"name": "c"}], "spec.tiers[1] ('b') can never be reached"),
])
def test_a_tier_no_prompt_can_reach_is_refused_naming_it(tiers: list[dict[str, Any]], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        InferenceRouteSpec.model_validate({"tiers": [{**t, "upstream": "x"} for t in tiers]})
    assert says in str(err.value)


def test_a_later_tier_with_a_narrower_other_rule_is_reachable() -> None:
    # Same complexity bound, but the earlier tier also limits prompt length: long prompts reach the second.
    InferenceRouteSpec.model_validate({"tiers": [
        {"name": "a", "match": {"complexityBelow": 0.5, "maxPromptTokens": 100}, "upstream": "x"},
        {"name": "b", "match": {"complexityBelow": 0.5}, "upstream": "x"}, {"name": "c", "upstream": "x"}]})
