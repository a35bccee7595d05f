"""Which fields of a live object differ from what the operator rendered, and the patch that puts
them back. Pure: no API calls.

Only what we set is compared: the API server adds defaults (imagePullPolicy, protocol: TCP,
probe thresholds, revision annotations...), so a live map may hold keys we never wrote. Three
refinements keep hand edits from hiding behind that rule:
- maps we own outright (`EXACT`: a Service selector, the pod template's annotations and node
  selector, resource lists) must hold no other key;
- keys we never set but that change what runs (`OWNED_ABSENT`: a container's command and env, an
  init container, host networking, a PDB's minAvailable) must stay unset;
- lists (containers, args, ports, tolerations) must have our length, element by element.
Resource quantities compare by value: the API server stores `0.5` as `500m`.

The revert is a JSON merge patch (RFC 7386): maps merge, lists are replaced whole, and `null`
removes a key, so one patch restores every owned field and leaves foreign keys (defaults,
`kubectl rollout restart`'s annotation) alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

Path = tuple[str | int, ...]
ANY = "*"  # a list index in a rule's path


@dataclass(frozen=True)
class Rules:
    exact: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)  # map path -> foreign key prefixes
    owned_absent: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)  # map path -> keys


_TEMPLATE = ("spec", "template")
_POD = (*_TEMPLATE, "spec")
_CONTAINER = (*_POD, "containers", ANY)
DEPLOYMENT = Rules(
    exact={
        # `kubectl rollout restart` writes kubectl.kubernetes.io/restartedAt: a restart, not a change of engine.
        (*_TEMPLATE, "metadata", "annotations"): ("kubectl.kubernetes.io/",),
        (*_POD, "nodeSelector"): (),
        (*_CONTAINER, "resources", "limits"): (),
        (*_CONTAINER, "resources", "requests"): (),
        (*_CONTAINER, "securityContext"): (),  # privileged: true next to our allowPrivilegeEscalation: false
    },
    owned_absent={
        ("spec",): ("paused",),  # `kubectl rollout pause` would hold every engine change forever
        _POD: ("nodeSelector", "initContainers", "hostNetwork", "hostPID", "hostIPC", "serviceAccountName",
               "securityContext"),
        _CONTAINER: ("command", "env", "envFrom"),
    },
)
# type is rendered (ClusterIP): an engine API has no authentication, so a NodePort is an edit to undo.
SERVICE = Rules(exact={("spec", "selector"): ()}, owned_absent={("spec",): ("externalIPs",)})
PDB = Rules(
    exact={("spec", "selector", "matchLabels"): ()},
    owned_absent={("spec",): ("minAvailable",), ("spec", "selector"): ("matchExpressions",)},
)

# Kubernetes resource.Quantity suffixes. (kubernetes.utils.parse_quantity does this, but importing
# it loads the whole API client, which the pure core must not.)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity(text: object) -> Decimal | None:
    """The value of a Kubernetes quantity ("500m", "64Gi", "1e3"), or None when it is not one."""
    s = str(text)
    try:
        if s[-2:] in _BINARY:
            return Decimal(s[:-2]) * Decimal(1024) ** _BINARY[s[-2:]]
        if s[-1:] in _DECIMAL:
            return Decimal(s[:-1]) * Decimal(10) ** _DECIMAL[s[-1:]]
        return Decimal(s)
    except (InvalidOperation, ValueError):
        return None


def _pattern(path: Path) -> tuple[str, ...]:
    return tuple(ANY if isinstance(p, int) else p for p in path)


def _show(path: Path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value is False


def _is_quantity_path(path: Path) -> bool:
    return len(path) >= 2 and (path[-2] in ("limits", "requests") or path[-1] == "sizeLimit")


def differences(desired: Any, live: Any, rules: Rules, path: Path = ()) -> list[str]:
    """Paths (e.g. `spec.template.spec.containers[0].image`) where `live` departs from `desired`."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [] if _empty(desired) and _empty(live) else [_show(path)]
        out: list[str] = []
        for key, want in desired.items():
            out += differences(want, live.get(key), rules, (*path, key))
        pat = _pattern(path)
        if pat in rules.exact:
            foreign = rules.exact[pat]
            out += [_show((*path, k)) for k in live if k not in desired and not str(k).startswith(foreign)]
        out += [_show((*path, k)) for k in rules.owned_absent.get(pat, ())
                if k not in desired and not _empty(live.get(k))]
        return out
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [] if _empty(desired) and _empty(live) else [_show(path)]
        return [d for i, (want, got) in enumerate(zip(desired, live, strict=True))
                for d in differences(want, got, rules, (*path, i))]
    if desired == live:
        return []
    if _is_quantity_path(path) and quantity(desired) is not None and quantity(desired) == quantity(live):
        return []
    return [_show(path)]


def revert_patch(desired: dict[str, Any], live: dict[str, Any] | None, rules: Rules,
                 path: Path = ()) -> dict[str, Any]:
    """A JSON merge patch that turns `live` back into `desired` in every field we own."""
    live = live if isinstance(live, dict) else {}
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        got = live.get(key)
        patch[key] = revert_patch(want, got, rules, (*path, key)) if isinstance(want, dict) else want
    pat = _pattern(path)
    if pat in rules.exact:
        foreign = rules.exact[pat]
        patch.update({k: None for k in live if k not in desired and not str(k).startswith(foreign)})
    patch.update({k: None for k in rules.owned_absent.get(pat, ()) if k not in desired and k in live})
    return patch
