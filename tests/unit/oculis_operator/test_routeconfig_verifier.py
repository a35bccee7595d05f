"""A route's verifier (spec.escalation.onAnswer.verifier.upstream) names a GPUUpstream of its namespace,
as a tier does: the operator renders it into the router config with the tiers' upstreams, and a missing,
broken or silent one reads in the route's status as a tier's would."""

from __future__ import annotations

import json
from typing import Any

from oculis import parse_config
from oculis.inferenceroute import InferenceRouteSpec
from oculis_operator import route_upstreams, routeconfig, router_configmap

READY = [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}]


def gu(name: str, provider: str = "vllm", conditions: list[dict[str, Any]] | None = None,
       **spec: Any) -> dict[str, Any]:
    body = {"provider": provider, "model": f"model-{name}", **spec}
    if provider == "vllm":
        body["gpu"] = {"product": "H100-80GB", "count": 1}
    return {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": body,
            "status": {"engineHash": f"h-{name}", "conditions": READY if conditions is None else conditions}}


def ir(name: str, *upstreams: str, verifier: str | None = None, **spec: Any) -> dict[str, Any]:
    tiers = [{"name": f"t{i}", "match": {"complexityBelow": 0.5}, "upstream": u} for i, u in enumerate(upstreams)]
    tiers[-1]["match"] = {}
    if verifier is not None:
        spec["escalation"] = {"onAnswer": {"verifier": {"upstream": verifier, "minScore": 7}}}
    return {"apiVersion": "oculis.dev/v1alpha1", "kind": "InferenceRoute",
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "uid": f"uid-{name}"},
            "spec": {"tiers": tiers, **spec}}


def judge(**kw: Any) -> dict[str, Any]:
    """A hosted verifier with its key in a Secret."""
    return gu("judge", "openai", apiKeySecretRef={"name": "judge-key"}, **kw)


def upstream_names(out: routeconfig.Rendered) -> list[str]:
    return [u.name for u in parse_config(out.data[router_configmap.CONFIG_KEY]).upstreams]


def routes_in(out: routeconfig.Rendered) -> list[str]:
    return [r.name for r in parse_config(out.data[router_configmap.CONFIG_KEY]).routes]


def test_a_verifier_upstream_is_rendered_with_the_tiers_upstreams_once() -> None:
    # "graded" has a verifier that is no tier; "self-graded" one that is also its tier t1.
    out = routeconfig.render_namespace(
        [ir("graded", "small", "big", verifier="judge"), ir("self-graded", "small", "big", verifier="big")],
        [gu("small"), gu("big"), judge()])
    assert out.routes["graded"].ready and out.routes["graded"].reason == "Rendered"
    assert out.routes["self-graded"].ready
    # The router's own schema accepts the whole config: each verifier names a declared upstream.
    config = parse_config(out.data[router_configmap.CONFIG_KEY])
    assert [r.name for r in config.routes] == ["graded", "self-graded"]
    assert upstream_names(out) == ["big", "judge", "small"]  # each once, the shared one too
    check = config.route("graded").escalation.on_answer
    assert check is not None and check.verifier is not None and check.verifier.upstream == "judge"
    assert config.upstream("judge").api_key_env == "OCULIS_KEY_JUDGE"
    # The router Deployment gets the verifier's key from its Secret, like a tier's.
    assert json.loads(out.data[router_configmap.SECRETS_KEY]) == [
        {"env": "OCULIS_KEY_JUDGE", "secret": "judge-key", "key": "api-key"}]
    # Tier status lists the tiers (the verifier is not one).
    assert [t["upstream"] for t in out.routes["graded"].tier_status] == ["small", "big"]
    assert route_upstreams.route_upstreams(
        InferenceRouteSpec.model_validate(ir("g", "small", "big", verifier="big")["spec"])) == [
        "small", "big"]


def test_a_missing_verifier_upstream_leaves_the_route_out_naming_it() -> None:
    out = routeconfig.render_namespace([ir("graded", "small", verifier="judge"), ir("plain", "small")],
                                       [gu("small")])
    verdict = out.routes["graded"]
    assert (verdict.ready, verdict.degraded, verdict.reason) == (False, True, "UpstreamNotFound")
    assert verdict.message == ("no GPUUpstream named judge (the verifier, escalation.onAnswer.verifier.upstream) "
                               "in this namespace; the route is left out of the router config")
    assert routes_in(out) == ["plain"] and upstream_names(out) == ["small"]  # the other route still serves


def test_a_broken_verifier_upstream_leaves_the_route_out_naming_it() -> None:
    # An openai-compatible upstream stored without a baseURL (before the CEL rule): the router refuses it.
    out = routeconfig.render_namespace([ir("graded", "small", verifier="judge"), ir("plain", "small")],
                                       [gu("small"), gu("judge", "openai-compatible")])
    verdict = out.routes["graded"]
    assert verdict.reason == "InvalidUpstream" and "GPUUpstream judge (the verifier" in verdict.message
    assert "base_url" in verdict.message and routes_in(out) == ["plain"]


def test_a_vanished_verifier_upstream_keeps_its_entry_in_the_last_good_config() -> None:
    routes = [ir("graded", "small", verifier="judge")]
    before = routeconfig.render_namespace(routes, [gu("small"), judge()])
    assert before.routes["graded"].ready
    # The verifier's GPUUpstream is deleted: the route keeps its last good block with the verifier's last
    # entry and Secret env, so the router still accepts it (tiers answer; gradings fail and keep answers).
    out = routeconfig.render_namespace(routes, [gu("small")], previous=before.data)
    verdict = out.routes["graded"]
    assert (verdict.ready, verdict.reason) == (False, "UpstreamNotFound")
    assert verdict.message.endswith(routeconfig.KEPT) and "judge" in verdict.message
    assert out.data == before.data and upstream_names(out) == ["judge", "small"]
    assert json.loads(out.data[router_configmap.SECRETS_KEY])[0]["env"] == "OCULIS_KEY_JUDGE"
    good = router_configmap.last_good(before.data, "graded")
    assert good is not None and sorted(good.upstreams) == ["judge", "small"]
    # A tier's upstream vanishes instead: the present verifier is rendered as it is now.
    renamed = judge()
    renamed["spec"]["model"] = "model-judge-2"
    tier_gone = routeconfig.render_namespace(routes, [renamed], previous=before.data)
    assert tier_gone.routes["graded"].message.endswith(routeconfig.KEPT)
    assert parse_config(tier_gone.data[router_configmap.CONFIG_KEY]).upstream("judge").model == "model-judge-2"


def test_a_verifier_that_does_not_answer_leaves_the_route_served_and_says_so() -> None:
    not_ready = [{"type": "Ready", "status": "False", "reason": "SecretNotFound"},
                 {"type": "Degraded", "status": "True", "reason": "SecretNotFound"}]
    out = routeconfig.render_namespace([ir("graded", "small", verifier="judge")],
                                       [gu("small"), judge(conditions=not_ready)])
    verdict = out.routes["graded"]
    # Rendered (the router keeps an answer whose grading fails), not Ready and Degraded, as a tier's
    # upstream in that state makes it.
    assert routes_in(out) == ["graded"] and "judge" in upstream_names(out)
    assert (verdict.ready, verdict.degraded, verdict.reason) == (False, True, "UpstreamNotReady")
    assert verdict.message == ("rendered, but not Ready yet: judge (SecretNotFound); until the verifier judge "
                               "answers, answers are kept ungraded")
    # status.upstreamsReady counts the verifier with the tiers: 1/2, not a 1/1 beside Ready=False.
    assert verdict.named_ready == {"small": True, "judge": False}
    assert [t["ready"] for t in verdict.tier_status] == [True]
    # Still coming up: Progressing, not Degraded.
    coming = routeconfig.render_namespace([ir("graded", "small", verifier="judge")],
                                          [gu("small"), judge(conditions=[])])
    assert (coming.routes["graded"].reason, coming.routes["graded"].degraded) == ("UpstreamProgressing", False)
    assert "ungraded" in coming.routes["graded"].message and coming.routes["graded"].progressing
    # Scaled to zero: answers are served unchecked until it wakes: not Ready (Argo Suspended),
    # not Degraded, even under coldStart escalate with every tier serving.
    zero = gu("judge", conditions=[{"type": "Ready", "status": "False", "reason": "ScaledToZero"}])
    at_zero = routeconfig.render_namespace([ir("graded", "small", verifier="judge", coldStart="escalate")],
                                           [gu("small"), zero]).routes["graded"]
    assert (at_zero.ready, at_zero.degraded, at_zero.reason) == (False, False, "ScaledToZero")
    assert at_zero.message.startswith("rendered; scaled to zero: judge; the verifier judge grades nothing")
    assert "coldStart" not in at_zero.message  # no tier is at zero: the tiers' answering is not in question
