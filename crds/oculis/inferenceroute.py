"""InferenceRoute: semantic tiers over GPUUpstreams in the same namespace, escalation and cache.

The spec is the router's route (`oculis.router.RouteBody`): tiers name GPUUpstreams of the route's
namespace. The operator renders the InferenceRoutes that name one ConfigMap (`spec.configMap`), with
the upstreams they use, into that ConfigMap (`oculis-config.yaml`), which the router reloads on change.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from oculis.base import Model
from oculis.condition import Condition
from oculis.router import Classifier, RouteBody, SemanticTier, TierMatch
from oculis.router_upstream import NAME_PATTERN

DEFAULT_CONFIG_MAP = "oculis-router-config"
# A GPUUpstream's name: a DNS-1035 label (its Service must be able to exist), in the route's namespace.
UPSTREAM_REF = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
SAME_NAMESPACE = ("upstreams must be in the route's namespace: name a GPUUpstream of this namespace, "
                  "without a namespace/ prefix")


class RouteTier(SemanticTier):
    """One tier of an InferenceRoute: tried in order, the first whose match holds answers."""

    upstream: str = Field(max_length=63, pattern=UPSTREAM_REF, json_schema_extra={
        "x-kubernetes-validations": [{"rule": "!self.contains('/')", "message": SAME_NAMESPACE}]})
    """GPUUpstream of this namespace that answers (its name, without a namespace)"""

    @field_validator("upstream", mode="before")
    @classmethod
    def _same_namespace(cls, value: Any) -> Any:
        # Before the pattern, which would only say "should match '^[a-z]...'".
        if isinstance(value, str) and "/" in value:
            raise ValueError(SAME_NAMESPACE)
        if isinstance(value, str) and not re.fullmatch(UPSTREAM_REF, value):
            raise ValueError("must be a GPUUpstream name: lowercase letters, digits and '-', starting with a "
                             "letter, at most 63 characters")
        return value


class ConfigMapKeyRef(Model):
    """A key of a ConfigMap in the route's namespace."""

    name: str = Field(pattern=NAME_PATTERN, max_length=253)
    """The ConfigMap's name"""
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)
    """The key holding the head (binaryData: `kubectl create configmap NAME --from-file=head.npz`)"""


class HeadFrom(Model):
    """Where the route's fitted classifier head comes from."""

    config_map_key_ref: ConfigMapKeyRef
    """A ConfigMap key holding a head written by `oculis classifier fit`"""


HEADS_DIR = "/etc/oculis-heads"  # where the router Deployment mounts head ConfigMaps: <dir>/<name>/<key>


class RouteClassifier(Classifier):
    """The complexity classifier behind the tiers; in a cluster a fitted head comes from a ConfigMap."""

    head_from: HeadFrom | None = None
    """A head fitted with `oculis classifier fit`, from a ConfigMap (mounted into the router at
    /etc/oculis-heads/<name>/<key> and reloaded when it changes); unset: the packaged head"""

    @model_validator(mode="after")
    def _no_path(self) -> RouteClassifier:
        if self.head_path is not None:
            raise ValueError("headPath is a router-config setting; in an InferenceRoute put the head in a ConfigMap "
                             "and use classifier.headFrom.configMapKeyRef {name, key}")
        return self


class ClassifierDriftAlarm(Model):
    """How the operator watches the classifier against this route's traffic (read from Prometheus: the
    router's oculis_requests_total by tier and oculis_escalations_total)."""

    short_window: str = Field("15m", pattern=r"^[1-9][0-9]*(s|m|h)$")
    """The recent window, e.g. 15m"""
    long_window: str = Field("1d", pattern=r"^[1-9][0-9]*(s|m|h|d)$")
    """The baseline window before it, e.g. 1d"""
    factor: float = Field(2.0, gt=1, le=100, allow_inf_nan=False)
    """ClassifierDrift=True when the short-window escalation rate, or a tier's share, is this many times
    its baseline (or a share falls below baseline / factor)"""
    min_requests: int = Field(20, ge=1)
    """Requests each window needs; fewer: ClassifierDrift=Unknown"""


class InferenceRouteSpec(RouteBody):
    """Semantic tiers over GPUUpstreams of this namespace, with escalation and a response cache."""

    classifier: RouteClassifier = Field(default_factory=RouteClassifier)
    """The complexity classifier"""

    tiers: list[RouteTier] = Field(min_length=1, max_length=16)  # type: ignore[assignment]
    """Tiers, cheapest first: the first whose match holds answers; the last catches all"""

    config_map: str = Field(DEFAULT_CONFIG_MAP, pattern=NAME_PATTERN,
                            description="ConfigMap this route is rendered into; it holds only the routes that name it")
    classifier_drift: ClassifierDriftAlarm | None = None
    """Watch tier shares and escalation rate for classifier drift (status.traffic, condition
    ClassifierDrift); needs the operator's Prometheus (OCULIS_PROMETHEUS_URL); unset: not watched"""

    @model_validator(mode="after")
    def _every_tier_reachable(self) -> InferenceRouteSpec:
        why = unreachable_tier(self.tiers)
        if why:
            raise ValueError(why)
        return self


def covers(earlier: TierMatch, later: TierMatch) -> bool:
    """Every prompt `later` matches, `earlier` matches too (all of a match's rules must hold)."""
    c_ok = earlier.complexity_below is None or (
        later.complexity_below is not None and later.complexity_below <= earlier.complexity_below)
    t_ok = earlier.max_prompt_tokens is None or (
        later.max_prompt_tokens is not None and later.max_prompt_tokens <= earlier.max_prompt_tokens)
    return c_ok and t_ok


def unreachable_tier(tiers: list[RouteTier]) -> str | None:
    """Why a tier can never be decided (an earlier tier takes every prompt it matches), or None. The
    same rule as TIER_RULES, so the CLI and the operator agree with `kubectl apply`."""
    for i, tier in enumerate(tiers[:-1]):
        if tier.match.complexity_below is None and tier.match.max_prompt_tokens is None:
            return (f"spec.tiers[{i}] ({tier.name!r}) has an empty match but is not the last tier: it takes every "
                    f"prompt, so no later tier is ever reached; {REACHABLE_FIX}")
    for j, later in enumerate(tiers):
        for i, earlier in enumerate(tiers[:j]):
            if covers(earlier.match, later.match):
                return (f"spec.tiers[{j}] ({later.name!r}) can never be reached: tier {i} ({earlier.name!r}) "
                        f"matches every prompt it matches; {REACHABLE_FIX}")
    return None


REACHABLE_FIX = ("tiers go cheapest first with a rising match.complexityBelow (or maxPromptTokens), "
                 "and only the last has `match: {}`")
_IDX = "[" + ", ".join(str(i) for i in range(16)) + "]"  # tiers has maxItems 16: CEL needs no range()
# The index as text: CEL's cost estimate of string(int) is unbounded, a literal lookup's is not.
_TEXT = "[" + ", ".join(f"'{i}'" for i in range(16)) + "]"


def _in_match(t: str, f: str) -> str:
    return f"(has({t}.match) && has({t}.match.{f}))"


def _has(t: str, f: str) -> str:
    """The tier gives rule f, under match or flat (SemanticTier's two spellings)."""
    return f"({_in_match(t, f)} || has({t}.{f}))"


def _val(t: str, f: str) -> str:
    return f"({_in_match(t, f)} ? {t}.match.{f} : {t}.{f})"


def _covers(a: str, b: str) -> str:
    return " && ".join(
        f"(!{_has(a, f)} || ({_has(b, f)} && {_val(b, f)} <= {_val(a, f)}))"
        for f in ("complexityBelow", "maxPromptTokens"))


_PAIR = (f"{_IDX}.exists(j, j < size(self.tiers) && {_IDX}.exists(i, i < j && "
         f"{_covers('self.tiers[i]', 'self.tiers[j]')}))")
_FIRST = (f"{_IDX}.filter(j, j < size(self.tiers) && {_IDX}.exists(i, i < j && "
          f"{_covers('self.tiers[i]', 'self.tiers[j]')}))[0]")
# CEL on the spec: refused at `kubectl apply`, naming the first unreachable tier.
_EMPTY = (f"{_IDX}.filter(i, i < size(self.tiers) - 1 && !{_has('self.tiers[i]', 'complexityBelow')} && "
          f"!{_has('self.tiers[i]', 'maxPromptTokens')})")
TIER_RULES: list[dict[str, Any]] = [{
    "rule": f"size({_EMPTY}) == 0",
    "messageExpression": (f"'spec.tiers[' + {_TEXT}[{_EMPTY}[0]] + '] (' + self.tiers[{_EMPTY}[0]].name + ') has an "
                          f"empty match but is not the last tier: it takes every prompt, so no later tier is ever "
                          f"reached; {REACHABLE_FIX}'"),
    "fieldPath": ".tiers", "reason": "FieldValueInvalid",
}, {
    "rule": f"!{_PAIR}",
    "messageExpression": (f"'spec.tiers[' + {_TEXT}[{_FIRST}] + '] (' + self.tiers[{_FIRST}].name + ') can never "
                          f"be reached: an earlier tier matches every prompt it matches; {REACHABLE_FIX}'"),
    "fieldPath": ".tiers", "reason": "FieldValueInvalid",
}]


class TierStatus(Model):
    """One tier as the operator last saw it."""

    name: str
    """The tier's name"""
    upstream: str
    """The GPUUpstream it names"""
    ready: bool
    """The upstream exists and answers (Ready, or a self-hosted one with a ready replica)"""


class TrafficWindow(Model):
    """What the router counted for the route over one window."""

    window: str
    """The window, e.g. 15m"""
    requests: float = 0
    """Requests answered"""
    tier_shares: dict[str, float] = Field(default_factory=dict)
    """Share of requests per tier (0-1)"""
    escalation_rate: float = 0
    """Escalations per request"""


class TrafficStatus(TrafficWindow):
    """The short window, with the long-window baseline it is compared with."""

    baseline: TrafficWindow | None = None
    """The long window before it"""


class InferenceRouteStatus(Model):
    """What the operator rendered."""

    observed_generation: int | None = None
    """The spec generation last rendered"""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (in the router config, upstreams answer), Degraded (left out, or an upstream missing or not
    Ready; the message says which), Progressing (an upstream is being created or rolling)"""
    strategy: str | None = Field(None, description="Printer column: the routing strategy")
    tiers: str | None = Field(None, description="Printer column: tier -> upstream, in order")
    tier_status: list[TierStatus] = Field(default_factory=list)
    """Each tier, in order, with whether its upstream answers"""
    upstreams_ready: str | None = Field(None, description="Printer column: upstreams that answer / upstreams named")
    config_map: str | None = None
    """ConfigMap the route was rendered into"""
    config_hash: str | None = None
    """Hash of the rendered router config"""
    traffic: TrafficStatus | None = None
    """spec.classifierDrift: tier shares and escalation rate over the short window and the baseline"""


class InferenceRoute(Model):
    """A route of the Oculis router: the model name clients send, classified per prompt and answered by
    the first of its tiers (GPUUpstreams of this namespace, cheapest first) whose match holds, with
    escalation on low confidence or errors and an optional response cache. The operator renders it
    into the router's ConfigMap (spec.configMap)."""

    api_version: Literal["oculis.dev/v1alpha1"] = "oculis.dev/v1alpha1"
    kind: Literal["InferenceRoute"] = "InferenceRoute"
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    spec: InferenceRouteSpec
