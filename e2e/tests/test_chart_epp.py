"""The chart's endpoint pickers (templates/epp.yaml, examples/gateway/values-epp.yaml) render objects the API
server accepts: the InferencePool with its endpointPickerRef checked against the GIE InferencePool v1 CRD
(e2e/crds-extra), the picker's Deployment, Service and RBAC, all by server-side dry run; and the pool's pods
are the ones the operator's own InferencePool selects (one source of the labels: render.inference_pool)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from test_chart import CHART, helm

from oculis_operator import render

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gateway"


def rendered(bin_dir: Path, kubeconfig: Path, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = helm(bin_dir, kubeconfig, "template", "gw", str(CHART), "-n", namespace, "--set", "router.enabled=false",
               "--set", "operator.enabled=false", *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dry_run(bin_dir: Path, kubeconfig: Path, namespace: str,
            objs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "-n", namespace, "create",
                           "--dry-run=server", "-o", "json", "-f", "-"],
                          input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
                          capture_output=True, text=True, check=False, timeout=60)


def documents(text: str) -> list[dict[str, Any]]:
    """kubectl's JSON output: one document per object, one after another."""
    dec, out, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        obj, end = dec.raw_decode(text, at)
        out.append(obj)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return out


def test_the_chart_renders_inference_pools_with_their_pickers_that_the_api_server_accepts(
        bin_dir: Path, kubeconfig: Path, api: client.ApiClient, crds: None, namespace: str) -> None:
    objs = [o for o in rendered(bin_dir, kubeconfig, namespace, "-f", str(EXAMPLES / "values-epp.yaml"))
            if "epp" in o["metadata"]["name"] or o["kind"] == "InferencePool"]
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == ["Deployment", "Deployment", "InferencePool", "InferencePool", "Role", "RoleBinding", "Service",
                     "Service", "ServiceAccount"]
    made = dry_run(bin_dir, kubeconfig, namespace, objs)
    assert made.returncode == 0, made.stderr
    accepted = {(o["kind"], o["metadata"]["name"]): o for o in documents(made.stdout)}
    pool = accepted[("InferencePool", "llama-8b-pool")]["spec"]
    assert pool["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "llama-8b-pool-epp",
                                         "port": {"number": 9002}, "failureMode": "FailClose"}  # CRD defaults
    # the GPUUpstream's pods, as the operator's own InferencePool selects them
    ours = render.inference_pool("llama-8b", namespace, "uid")["spec"]
    assert pool["selector"] == ours["selector"] and pool["targetPorts"] == ours["targetPorts"]
    dep = accepted[("Deployment", "llama-8b-pool-epp")]["spec"]["template"]["spec"]
    c = dep["containers"][0]
    assert c["command"] == ["oculis", "epp"] and c["args"][c["args"].index("--upstream") + 1] == "llama-8b"
    assert c["readinessProbe"]["grpc"] == {"port": 9002, "service": "readiness"}
    assert c["securityContext"]["readOnlyRootFilesystem"] and dep["securityContext"]["runAsNonRoot"]
    route = accepted[("Deployment", "adaptive-pool-epp")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert route[route.index("--route") + 1] == "adaptive"
    svc = accepted[("Service", "llama-8b-pool-epp")]["spec"]
    assert {p["name"]: p["port"] for p in svc["ports"]} == {"grpc": 9002, "metrics": 9090}


def test_the_gie_crd_refuses_a_picker_ref_without_a_port_or_with_a_bad_failure_mode(
        bin_dir: Path, kubeconfig: Path, crds: None, namespace: str) -> None:
    pool = next(o for o in rendered(bin_dir, kubeconfig, namespace, "--set", "epp.pools[0].name=p",
                                    "--set", "epp.pools[0].upstream=u") if o["kind"] == "InferencePool")
    no_port = json.loads(json.dumps(pool))
    del no_port["spec"]["endpointPickerRef"]["port"]
    made = dry_run(bin_dir, kubeconfig, namespace, [no_port])
    assert made.returncode != 0 and "port is required" in made.stderr
    bad = json.loads(json.dumps(pool))
    bad["spec"]["endpointPickerRef"]["failureMode"] = "Sometimes"
    made = dry_run(bin_dir, kubeconfig, namespace, [bad])
    assert made.returncode != 0 and "failureMode" in made.stderr


@pytest.mark.parametrize("values", [["--set", "epp.pools[0].name=p"],
                                    ["--set", "epp.pools[0].name=p", "--set", "epp.pools[0].route=r"],
                                    ["--set", "epp.pools[0].name=p", "--set", "epp.pools[0].upstream=u",
                                     "--set", "epp.pools[0].failureMode=Maybe"]])
def test_bad_picker_values_are_refused_at_template_time(bin_dir: Path, kubeconfig: Path, values: list[str]) -> None:
    out = helm(bin_dir, kubeconfig, "template", "gw", str(CHART), *values)
    assert out.returncode != 0 and ("epp.pools" in out.stderr or "/epp/pools/0" in out.stderr), out.stderr


def test_the_gateway_example_names_the_chart_pool() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "httproute.yaml").read_text()))
    route = next(d for d in docs if d["kind"] == "HTTPRoute")
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    pools = yaml.safe_load((EXAMPLES / "values-epp.yaml").read_text())["epp"]["pools"]
    assert backend["kind"] == "InferencePool" and backend["name"] in {p["name"] for p in pools}
