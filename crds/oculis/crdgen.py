"""Generates the CRD manifests in `crds/` (and the chart's copy) from the pydantic models.

`python -m oculis.crdgen` writes them; `python -m oculis.crdgen --check` exits 1 when they are
stale (a unit test runs the same check). Pydantic's JSON Schema is turned into the structural
OpenAPI v3 schema Kubernetes wants: references inlined, optional unions flattened, exclusive
bounds rewritten, defaults left to the operator (so stored objects stay exactly as users wrote them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from oculis import inferenceroute, upstream, upstream_status

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = (ROOT / "crds", ROOT / "charts" / "oculis" / "crds")
GROUP, VERSION = "oculis.dev", "v1alpha1"
DROP = {"title", "default"}


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """Rewrite one JSON Schema node into Kubernetes' structural OpenAPI v3 dialect."""
    if isinstance(node, list):
        return [structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            return structural({**options[0], **rest}, defs)
        raise ValueError(f"unions are not structural: {node}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROP or key == "$defs" or (key == "additionalProperties" and value is False):
            continue  # closed objects: the API server prunes unknown fields and kubectl rejects them
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {k: structural(v, defs) for k, v in value.items()}
        else:
            out[key] = structural(value, defs)
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    result: dict[str, Any] = structural(raw, raw.get("$defs", {}))
    return result


# Standard top-level fields. `metadata` may carry nothing but its type: the API server refuses more.
TYPE_META = {
    "apiVersion": {"type": "string", "description": "Versioned schema of this object: oculis.dev/v1alpha1"},
    "kind": {"type": "string", "description": "Kind of this object"},
    "metadata": {"type": "object"},
}


def kind_description(model: type[BaseModel]) -> str:
    """The kind's class docstring, on one line: the top-level DESCRIPTION of `kubectl explain`."""
    return " ".join((model.__doc__ or "").split())


def gpuupstream_crd() -> dict[str, Any]:
    spec = schema_of(upstream.GPUUpstreamSpec)
    spec["x-kubernetes-validations"] = upstream.CEL_RULES
    status = schema_of(upstream_status.GPUUpstreamStatus)
    root = {
        "type": "object",
        "description": kind_description(upstream.GPUUpstream),
        "required": ["spec"],
        "properties": {
            **TYPE_META,
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [upstream.NAME_RULE, upstream.DNS_NAME_RULE],
    }
    # READY and REASON are the Ready condition's, so refused, failing and external upstreams show why.
    ready = '.status.conditions[?(@.type=="Ready")]'
    cols = [
        ("PROVIDER", "string", ".spec.provider"), ("MODEL", "string", ".spec.model"),
        ("GPU", "string", ".status.gpu"), ("REPLICAS", "integer", ".spec.replicas"),
        ("DESIRED", "integer", ".status.autoscaling.desiredReplicas"),
        ("READY-REPLICAS", "integer", ".status.readyReplicas"), ("READY", "string", f"{ready}.status"),
        ("REASON", "string", f"{ready}.reason"), ("KV-TOKENS", "integer", ".status.capacity.kvCacheTokens"),
        ("OBSERVED-KV", "integer", ".status.capacity.observedTokens"),
        ("MAX-CONC", "integer", ".status.capacity.maxConcurrency"), ("CANARY", "string", ".status.canary.summary"),
        ("ADAPTERS", "string", ".status.adaptersReady"), ("AGE", "date", ".metadata.creationTimestamp"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gpuupstreams.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": "GPUUpstream", "listKind": "GPUUpstreamList", "plural": "gpuupstreams",
                      "singular": "gpuupstream", "shortNames": ["gu"], "categories": ["oculis"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p} for n, t, p in cols],
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def inferenceroute_crd() -> dict[str, Any]:
    spec = schema_of(inferenceroute.InferenceRouteSpec)
    root: dict[str, Any] = {
        "type": "object", "description": kind_description(inferenceroute.InferenceRoute), "required": ["spec"],
        "properties": {**TYPE_META, "spec": spec, "status": schema_of(inferenceroute.InferenceRouteStatus)},
        "x-kubernetes-validations": [{"rule": "size(self.metadata.name) <= 63",
                                      "message": "metadata.name must be at most 63 characters"}],
    }
    spec["x-kubernetes-validations"] = [
        {"rule": "(!has(self.tiers[size(self.tiers) - 1].match) || (!has(self.tiers[size(self.tiers) - 1].match"
                 ".complexityBelow) && !has(self.tiers[size(self.tiers) - 1].match.maxPromptTokens))) && "
                 "!has(self.tiers[size(self.tiers) - 1].complexityBelow) && "
                 "!has(self.tiers[size(self.tiers) - 1].maxPromptTokens)",
         "message": "the last tier must catch all: give it `match: {}`", "fieldPath": ".tiers"},
        {"rule": "self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
         "message": "tier names must be unique", "fieldPath": ".tiers"},
        *inferenceroute.TIER_RULES,
    ]
    on_answer = spec["properties"]["escalation"]["properties"]["onAnswer"]
    on_answer["x-kubernetes-validations"] = [{
        "rule": "has(self.minMeanLogprob) || has(self.verifier)",
        "message": "onAnswer checks nothing: set minMeanLogprob (e.g. -1.0), verifier {upstream, minScore}, or both"}]
    ready = '.status.conditions[?(@.type=="Ready")].status'
    cols = [("STRATEGY", "string", ".status.strategy", 0), ("TIERS", "string", ".status.tiers", 0),
            ("UPSTREAMS-READY", "string", ".status.upstreamsReady", 0), ("READY", "string", ready, 0),
            ("AGE", "date", ".metadata.creationTimestamp", 0), ("CONFIG", "string", ".status.configMap", 1)]
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"inferenceroutes.{GROUP}"},
        "spec": {
            "group": GROUP, "scope": "Namespaced",
            "names": {"kind": "InferenceRoute", "listKind": "InferenceRouteList", "plural": "inferenceroutes",
                      "singular": "inferenceroute", "shortNames": ["ir"], "categories": ["oculis"]},
            "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                          "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p, **({"priority": w} if w
                                                                                               else {})}
                                                       for n, t, p, w in cols],
                          "schema": {"openAPIV3Schema": root}}],
        },
    }


def render_all() -> dict[str, str]:
    header = "# Generated by `python -m oculis.crdgen` from crds/oculis/*.py: do not edit.\n"
    out = {}
    for crd in (gpuupstream_crd(), inferenceroute_crd()):
        out[f"{crd['metadata']['name']}.yaml"] = header + yaml.safe_dump(crd, sort_keys=False, width=120)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="generate CRD YAML from the pydantic schema")
    ap.add_argument("--check", action="store_true", help="exit 1 if any generated file is stale")
    args = ap.parse_args(argv)
    stale = []
    for name, text in render_all().items():
        for out in OUTPUTS:
            path = out / name
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path))
            else:
                out.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print("stale generated CRDs (run `python -m oculis.crdgen`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
