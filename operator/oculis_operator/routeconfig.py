"""InferenceRoutes + GPUUpstreams of one namespace -> the router's `oculis-config.yaml`, one per
ConfigMap. Pure.

Each ConfigMap (a route's `spec.configMap`) holds only the routes that name it. A route is left out,
with the reason in its status, when its spec is invalid, its name is also a GPUUpstream's (a request
for that model would reach the upstream, never the route), a tier or its verifier
(escalation.onAnswer.verifier.upstream) names a missing GPUUpstream or one the router could not call;
the other routes still render. Each route is checked with the router's own schema, and so is the
whole result, so the router never receives a config it would reject.
When no route of a ConfigMap can be served it holds the empty config, which the router accepts and
answers 404 for every model: the router never keeps serving a route its status says is left out.
One exception keeps traffic flowing: a route refused only because a GPUUpstream it names is gone keeps
its last good block (and the upstream entries and Secret env it named) from the ConfigMap the
operator last wrote, so its other tiers still answer and the vanished one fails over by escalation
(a vanished verifier's gradings fail, and the answers are kept); its status says so (Degraded,
UpstreamNotFound, "the router keeps serving this route's last good config"). Without such a
rendering, or once the route is deleted, it leaves as above.
The verifier's GPUUpstream is one of the route's upstreams everywhere (`route_upstreams`: rendered
with the tiers' ones, once if it is also a tier, with its Secret env; missing, broken, readiness, the
last good block). One that exists but does not answer leaves the route rendered (the router keeps an
answer whose grading fails), and the status reads as for a tier's upstream in that state, adding that
answers go ungraded meanwhile: not Ready and Degraded (UpstreamNotReady), Progressing
(UpstreamProgressing), or at zero not Ready and not Degraded (ScaledToZero, Argo's Suspended: answers
are served but unchecked until it wakes; the router counts each grading it skips as wake-up demand).
tierStatus lists the tiers; upstreamsReady counts the verifier too.
An upstream's `revision` is its engine hash, so the router's response cache never serves an answer
from a replaced model. While its canary is analysed it also has `canary: {base_url, percent}`: the
canary Service and spec.rollout.canary.trafficPercent, the share the router sends there.
External providers' keys stay in their Secrets: the config names an
environment variable per upstream, and `secret-env.json` maps each variable to its Secret reference
for the router Deployment.

The ConfigMap is owned (ownerReferences) by the routes that name it, so it is garbage-collected with
the last of them even while the operator is down; the operator also deletes one that no route names
any more (the last route moved to another ConfigMap).

Its parts: `route_upstreams` (which upstreams a route names, whether each answers), `upstream_entry`
(a GPUUpstream as the router sees it) and `router_configmap` (the ConfigMap objects, the last write).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from oculis.base import format_errors
from oculis.inferenceroute import HEADS_DIR, InferenceRouteSpec
from oculis.router import RouterConfig
from oculis.router_upstream import NAME_PATTERN, Upstream
from oculis_operator.route_upstreams import (
    NOT_READY,
    PROGRESSING,
    READY,
    SCALED_TO_ZERO,
    answered_at_zero,
    not_ready_because,
    route_upstreams,
    upstream_state,
    verifier_of,
)
from oculis_operator.router_configmap import (
    CONFIG_KEY,
    HASH_ANNOTATION,
    LABELS,
    SECRETS_KEY,
    config_map_of,
    data_digest,
    last_good,
    owner_references,
)
from oculis_operator.upstream_entry import upstream_entry

EMPTY: dict[str, Any] = {"oculis": {"upstreams": [], "routes": []}}
LEFT_OUT = "the route is left out of the router config"
KEPT = "the router keeps serving this route's last good config"


@dataclass
class RouteVerdict:
    """A route's status: Ready, and for GitOps health (Argo CD) Degraded and Progressing."""

    ready: bool
    reason: str
    message: str
    tiers: str = ""
    # A route left out or over an upstream that cannot answer is Degraded; one waiting for an upstream
    # still coming up (or scaled to zero: Suspended) is not: a fresh sync must not read as a failure.
    degraded: bool = True
    progressing: str = ""  # why it is moving (an upstream rolling or being created); "" when settled
    tier_status: list[dict[str, Any]] = field(default_factory=list)  # [{name, upstream, ready}]
    strategy: str = ""
    # Every upstream the route names (route_upstreams: its tiers' and its verifier's) -> answers:
    # status.upstreamsReady counts these, so a verifier that does not answer is not hidden behind 1/1.
    named_ready: dict[str, bool] = field(default_factory=dict)


@dataclass
class Rendered:
    data: dict[str, str]  # ConfigMap data
    digest: str
    routes: dict[str, RouteVerdict] = field(default_factory=dict)
    owners: list[dict[str, Any]] = field(default_factory=list)  # ownerReferences: the routes that name it


def one_line(exc: ValidationError, root: str = "") -> str:
    return format_errors(exc, root).replace("\n", "; ")


def render_config_maps(routes: list[dict[str, Any]], upstreams: list[dict[str, Any]],
                       previous: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, Rendered]:
    """Every ConfigMap some route names, rendered from only the routes that name it. A route being
    deleted is already gone (it must leave the router config now, not when its finalizers finish).
    `previous`: each ConfigMap's data as the operator last wrote it (`written_data`), by name."""
    groups: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for route in routes:
        if not route["metadata"].get("deletionTimestamp"):
            groups[config_map_of(route)].append(route)
    return {cm: render_namespace(group, upstreams, (previous or {}).get(cm)) for cm, group in sorted(groups.items())}


def config_map_drift(current: dict[str, Any] | None, out: Rendered) -> str | None:
    """Why the live ConfigMap must be (re)written to equal `out`; None when it already does. Compares
    everything the operator sets, so a hand edit is reverted, not only a change of the routes."""
    if current is None:
        return "missing"
    meta = current.get("metadata") or {}
    if (current.get("data") or {}) != out.data:
        written = (meta.get("annotations") or {}).get(HASH_ANNOTATION)
        return "edited by hand" if written != data_digest(current.get("data")) else "routes changed"
    owners = {(o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or []}
    if owners != {(o["kind"], o["name"], o["uid"]) for o in out.owners}:
        return "owners changed"
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if any(labels.get(k) != v for k, v in LABELS.items()) or annotations.get(HASH_ANNOTATION) != out.digest:
        return "labels or annotations edited by hand"
    return None


def render_namespace(routes: list[dict[str, Any]], upstreams: list[dict[str, Any]],
                     previous: Mapping[str, str] | None = None) -> Rendered:
    """`routes` (those naming one ConfigMap) over the namespace's `upstreams` -> that ConfigMap.
    `previous`: its data as the operator last wrote it, whence a route whose upstream vanished keeps
    its last good block."""
    by_name = {u["metadata"]["name"]: u for u in upstreams}
    verdicts: dict[str, RouteVerdict] = {}
    rendered_routes: list[dict[str, Any]] = []
    used: set[str] = set()
    # Routes served from their last good block: name -> (present upstreams, vanished ones' entries and
    # Secret env, the verdict should the whole config refuse them).
    kept: dict[str, tuple[set[str], dict[str, tuple[dict[str, Any], dict[str, Any] | None]], RouteVerdict]] = {}
    entries: dict[str, tuple[dict[str, Any], dict[str, Any] | None, str | None]] = {}

    def checked(uname: str) -> tuple[dict[str, Any], dict[str, Any] | None, str | None]:
        """The upstream's router entry, its Secret env, and why the router would refuse it."""
        if uname not in entries:
            entry, secret = upstream_entry(by_name[uname])
            try:
                Upstream.model_validate(entry)
                entries[uname] = (entry, secret, None)
            except ValidationError as exc:
                entries[uname] = (entry, secret, one_line(exc))
        return entries[uname]

    for obj in sorted(routes, key=lambda r: r["metadata"]["name"]):
        name = obj["metadata"]["name"]
        try:
            spec = InferenceRouteSpec.model_validate(obj.get("spec", {}))
        except ValidationError as exc:
            verdicts[name] = RouteVerdict(False, "InvalidSpec", one_line(exc, "spec"))
            continue
        tiers = ", ".join(f"{t.name}->{t.upstream}" for t in spec.tiers)
        tier_status = [{"name": t.name, "upstream": t.upstream,
                        "ready": upstream_state(by_name.get(t.upstream)) == READY} for t in spec.tiers]
        named_ready = {u: upstream_state(by_name.get(u)) == READY for u in route_upstreams(spec)}

        def verdict(ready_: bool, reason: str, message: str, degraded: bool = True, progressing: str = "",
                    tiers: str = tiers, tier_status: list[dict[str, Any]] = tier_status,
                    strategy: str = spec.strategy, named_ready: dict[str, bool] = named_ready) -> RouteVerdict:
            return RouteVerdict(ready_, reason, message, tiers, degraded, progressing, tier_status, strategy,
                                named_ready)
        if not re.fullmatch(NAME_PATTERN, name):  # a valid object name can still have dots
            verdicts[name] = verdict(
                False, "InvalidName",
                f"metadata.name {name!r} cannot be a route name, which clients send as `model`: use lowercase "
                f"letters, digits and '-' (no dots); {LEFT_OUT}")
            continue
        if name in by_name:
            verdicts[name] = verdict(
                False, "NameCollision",
                f"a GPUUpstream named {name} exists in this namespace, and a request for model {name} would reach "
                f"it, never this route; rename the route or the upstream; {LEFT_OUT}")
            continue
        # Only set fields: the router applies the same defaults, and a person reading the ConfigMap
        # need not read past a null for every field left out.
        # configMap and classifierDrift are the operator's settings, not the router's.
        body = spec.model_dump(exclude={"config_map", "classifier_drift"}, mode="json", exclude_none=True)
        if spec.classifier.head_from is not None:  # the router reads the ConfigMap where it is mounted
            ref = spec.classifier.head_from.config_map_key_ref
            body["classifier"].pop("head_from")
            body["classifier"]["head_path"] = f"{HEADS_DIR}/{ref.name}/{ref.key}"
        route_doc = {"name": name, **body}
        names = route_upstreams(spec)
        tier_upstreams = [t.upstream for t in spec.tiers]
        verifier = verifier_of(spec)
        # Only a verifier that is no tier is pointed out: a tier's upstream was always named bare.
        only_verifier = verifier if verifier not in tier_upstreams else None

        def named(u: str, only: str | None = only_verifier) -> str:
            return f"{u} (the verifier, escalation.onAnswer.verifier.upstream)" if u == only else u
        missing = [named(u) for u in names if u not in by_name]
        if missing:
            left_out = verdict(
                False, "UpstreamNotFound", f"no GPUUpstream named {', '.join(missing)} in this namespace; {LEFT_OUT}")
            verdicts[name] = left_out
            good = last_good(previous, name)
            # Only this very spec, as last rendered, is kept: a route edited to name a missing upstream
            # is broken by its edit and leaves, rather than serve a spec it no longer has.
            if good is None or good.route != route_doc or any(u in by_name and checked(u)[2] for u in good.upstreams):
                continue
            # A vanished upstream keeps its last entry; a present one is rendered as it is now.
            gone = {u: (e, good.secrets.get(e.get("api_key_env") or "")) for u, e in good.upstreams.items()
                    if u not in by_name}
            present = {u for u in good.upstreams if u in by_name}
            try:
                RouterConfig.model_validate({"upstreams": [checked(u)[0] if u in present else gone[u][0]
                                                           for u in good.upstreams], "routes": [good.route]})
            except ValidationError:
                continue
            rendered_routes.append(good.route)
            kept[name] = (present, gone, left_out)
            verdicts[name] = verdict(
                False, "UpstreamNotFound", f"no GPUUpstream named {', '.join(missing)} in this namespace; {KEPT}")
            continue
        broken = [f"GPUUpstream {named(u)}: {checked(u)[2]}" for u in names if checked(u)[2]]
        if broken:  # only the routes that use a broken upstream pay for it
            verdicts[name] = verdict(False, "InvalidUpstream", f"{'; '.join(broken)}; {LEFT_OUT}")
            continue
        states = {u: upstream_state(by_name[u]) for u in names}
        try:  # this route alone, with its upstreams, as the router will read it
            RouterConfig.model_validate({"upstreams": [checked(u)[0] for u in names], "routes": [route_doc]})
        except ValidationError as exc:
            verdicts[name] = verdict(False, "InvalidRouterConfig", f"{one_line(exc)}; {LEFT_OUT}")
            continue
        rendered_routes.append(route_doc)
        used.update(names)
        failing = [not_ready_because(by_name[u]) for u in names if states[u] == NOT_READY]
        coming = [not_ready_because(by_name[u]) for u in names if states[u] == PROGRESSING]
        zero = [u for u in names if states[u] == SCALED_TO_ZERO]
        # The router keeps an answer whose grading fails, so a verifier that does not answer costs the
        # route its checks, not its answers: said, and otherwise read as a tier's upstream would be.
        ungraded = (f"; until the verifier {verifier} answers, answers are kept ungraded"
                    if verifier is not None and states[verifier] != READY else "")
        if failing:
            verdicts[name] = verdict(False, "UpstreamNotReady",
                                     f"rendered, but not Ready yet: {', '.join(failing)}{ungraded}")
        elif coming:
            verdicts[name] = verdict(False, "UpstreamProgressing",
                                     f"rendered, waiting for {', '.join(coming)}{ungraded}", degraded=False,
                                     progressing=f"waiting for {', '.join(coming)}")
        elif zero:
            tiers_at_zero = [u for u in zero if u in tier_upstreams]
            via = answered_at_zero(spec.cold_start, tier_upstreams, states) if tiers_at_zero else ""
            why = [via or f"coldStart {spec.cold_start}: its tier's requests get no answer until it wakes (a request "
                   "wakes it)"] if tiers_at_zero else []
            if verifier in zero:  # the router skips the gradings (counting them as demand, which wakes it)
                why.append(f"the verifier {verifier} grades nothing until it wakes (answers are kept ungraded; "
                           "each skipped grading counts as demand that wakes it)")
            verdicts[name] = verdict(
                via is not None and verifier not in zero, "ScaledToZero",
                f"rendered; scaled to zero: {', '.join(zero)}; " + "; ".join(why), degraded=False)
        else:
            # An upstream rolling with replicas still answering leaves the route Ready and settled: the
            # upstream reports its own rollout.
            verdicts[name] = verdict(True, "Rendered", "in the router config", degraded=False)

    def assemble(with_kept: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        serving = [r for r in rendered_routes if with_kept or r["name"] not in kept]
        current = used.union(*(k[0] for n, k in kept.items() if with_kept))
        gone = {u: g for n, k in kept.items() if with_kept for u, g in k[1].items()}
        names = sorted(current | gone.keys())
        doc = {"oculis": {"upstreams": [checked(u)[0] if u in current else gone[u][0] for u in names],
                          "routes": serving}}
        return doc, [s for u in names if (s := checked(u)[1] if u in current else gone[u][1])]

    doc, secrets = assemble(True)
    if kept:
        try:
            RouterConfig.model_validate(doc["oculis"])
        except ValidationError:  # a last good block that no longer fits (say its upstream's name is now a route's)
            for n in kept:
                verdicts[n] = kept[n][2]
            rendered_routes = [r for r in rendered_routes if r["name"] not in kept]
            kept.clear()
            doc, secrets = assemble(False)
    try:
        RouterConfig.model_validate(doc["oculis"])  # exactly what the router will accept
    except ValidationError as exc:  # each route passed alone; a conflict between them is still refused
        for r in rendered_routes:
            before = verdicts[r["name"]]
            verdicts[r["name"]] = RouteVerdict(
                False, "InvalidRouterConfig", f"{one_line(exc)}; {LEFT_OUT}", before.tiers,
                tier_status=before.tier_status, strategy=before.strategy, named_ready=before.named_ready)
        doc, secrets = EMPTY, []
    data = {CONFIG_KEY: yaml.safe_dump(doc, sort_keys=False), SECRETS_KEY: json.dumps(secrets, indent=1)}
    return Rendered(data, data_digest(data), verdicts, owner_references(routes))
