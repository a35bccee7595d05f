"""`oculis status --check-deps` against the sandbox cluster: every prerequisite as a line, the real
CRDs, operator, webhook, SelfSubjectAccessReviews and a speculative upstream's capacity plan; exit 1
only when a required check fails (here: a ServiceAccount that may not patch what a restart patches)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from e2e_support import eventually
from kubernetes import client

from oculis.crdgen import gpuupstream_crd, inferenceroute_crd

G, V = "oculis.dev", "v1alpha1"
CRDS = Path(__file__).resolve().parents[2] / "crds"


def check_deps(kubeconfig: Path, ns: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "status", "--check-deps", "--kubeconfig",
                           str(kubeconfig), "-n", ns, "--prometheus-url", "http://127.0.0.1:9", "-o", "json", *extra],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def statuses(rep: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in rep["checks"]}


def test_check_deps_reports_every_prerequisite_of_a_namespace(kubeconfig: Path, api: client.ApiClient, namespace: str,
                                                              operator: Any, tmp_path: Path) -> None:
    co = client.CustomObjectsApi(api)
    co.create_namespaced_custom_object(G, V, namespace, "gpuupstreams", {
        "apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "llama"},
        "spec": {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 1,
                 "gpu": {"product": "H100-80GB", "count": 1},
                 "engine": {"maxModelLen": 8192, "maxNumSeqs": 32,
                            "speculative": {"draftModel": "meta-llama/Llama-3.2-1B-Instruct"}},
                 "pricing": {"inputPerMtok": 0.05, "outputPerMtok": 0.08, "gpuHourDollars": 2.5}}})
    co.create_namespaced_custom_object(G, V, namespace, "gpuupstreams", {
        "apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "gpt"},
        "spec": {"provider": "openai", "model": "gpt-4o", "apiKeySecretRef": {"name": "openai"}}})
    co.create_namespaced_custom_object(G, V, namespace, "inferenceroutes", {
        "apiVersion": f"{G}/{V}", "kind": "InferenceRoute", "metadata": {"name": "adaptive"},
        "spec": {"tiers": [{"name": "simple", "match": {"complexityBelow": 0.5}, "upstream": "llama"},
                           {"name": "complex", "upstream": "gpt"}]}})

    def reconciled() -> bool:
        objs = [co.get_namespaced_custom_object(G, V, namespace, p, n)
                for p, n in (("gpuupstreams", "llama"), ("gpuupstreams", "gpt"), ("inferenceroutes", "adaptive"))]
        return all((o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"] for o in objs)

    eventually(reconciled, timeout=60, what="the operator reconciles the upstreams and the route")
    code, rep, err = check_deps(kubeconfig, namespace)
    st = statuses(rep)
    assert st["cluster reachable"] == "PASS"
    for crd in (gpuupstream_crd(), inferenceroute_crd()):  # the `crds` fixture applied crds/*.yaml
        name = crd["metadata"]["name"]
        applied = yaml.safe_load((CRDS / f"{name}.yaml").read_text())
        same = applied["spec"]["versions"][0]["schema"] == crd["spec"]["versions"][0]["schema"]
        assert st[f"CRD {name}"] == ("PASS" if same else "WARN"), name  # WARN: the YAML lags the models
    assert st["operator running"] == "PASS"  # an operator outside the cluster, every object reconciled
    assert st["admission webhook"] == "PASS"
    assert st["speculative decoding llama"] == "PASS"
    assert st[f"may patch apps/deployments in {namespace}"] == "PASS"
    assert st[f"may patch oculis.dev/gpuupstreams in {namespace}"] == "PASS"
    pricing = next(c for c in rep["checks"] if c["name"] == "pricing on every routed upstream")
    assert pricing["status"] == "WARN" and "gpt (route adaptive)" in pricing["detail"]
    assert st["Prometheus reachable"] == "FAIL" and st["benchmark baseline"] == "WARN"
    assert code == 1 and not rep["ok"], err  # the explicit --prometheus-url is down: a required check

    # The measurement commands read the same routes from the cluster (rendered as the operator does).
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": p, "outcomes": {"llama": ok, "gpt": True}}) + "\n"
                             for p, ok in (("hi", True), ("hello", False), ("thanks", True))))
    ev = subprocess.run([sys.executable, "-m", "oculis_cli.main", "eval", "run", "--route", "adaptive", "--suite",
                         str(suite), "--kubeconfig", str(kubeconfig), "-n", namespace, "-o", "json"],
                        capture_output=True, text=True, timeout=60)
    assert ev.returncode in (0, 3, 4), ev.stderr
    assert json.loads(ev.stdout)["baseline"] == {"tier": "complex", "upstream": "gpt"}

    # A user that may not patch: the permission lines fail, each with the grant that fixes it.
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="viewer")))
    token = core.create_namespaced_service_account_token("viewer", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    admin = yaml.safe_load(kubeconfig.read_text())
    limited = tmp_path / "viewer.kubeconfig"
    limited.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "viewer",
        "clusters": [{"name": "c", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "viewer", "user": {"token": token}}],
        "contexts": [{"name": "viewer", "context": {"cluster": "c", "user": "viewer", "namespace": namespace}}]}))
    code, rep, err = check_deps(limited, namespace)
    assert rep, err
    st = statuses(rep)
    assert st["cluster reachable"] == "PASS", rep
    denied = next(c for c in rep["checks"] if c["name"] == f"may patch apps/deployments in {namespace}")
    assert denied["status"] == "FAIL" and "grant patch on apps/deployments" in denied["fix"]
    assert code == 1 and "Traceback" not in err
