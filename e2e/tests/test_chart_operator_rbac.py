"""The chart's operator ClusterRole allows every call the operator's Kube makes: a canary's Deployment
and Service are deleted when it is promoted, rolled back or superseded (kube.delete_canary), which a
role without `delete` refuses with 403, leaving a canary taking traffic. Rendered with `helm template`
(no cluster needed). With operator.watchNamespaces set, the namespaced rights (Secrets among them) are
Roles in those namespaces only: checked by the real API server (server-side dry run, then a
SubjectAccessReview of the operator's ServiceAccount)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from e2e_support import CLUSTER
from kubernetes import client

CHART = Path(__file__).resolve().parents[2] / "charts" / "oculis"


def rendered(*args: str) -> list[dict[str, Any]]:
    bin_dir = Path(subprocess.run([str(CLUSTER), "bin-dir"], capture_output=True, text=True,
                                  check=True).stdout.strip().splitlines()[-1])
    out = subprocess.run([str(bin_dir / "helm"), "template", "oculis", str(CHART), "-n", "oculis-system", *args],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def operator_rules(*args: str) -> list[dict[str, Any]]:
    role = next(d for d in rendered(*args)
                if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-operator"))
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def allowed(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


def test_the_operator_role_can_delete_the_canary_deployment_and_service() -> None:
    rules = operator_rules()
    assert "delete" in allowed(rules, "apps", "deployments")
    assert "delete" in allowed(rules, "", "services")
    # Secrets: get (an external upstream's key exists; the engines' keys), create the engines' key Secret,
    # patch only that one; never list or watch.
    assert allowed(rules, "", "secrets") == {"get", "create", "patch"}
    patch = [r for r in rules if "secrets" in r["resources"] and "patch" in r["verbs"]]
    assert [r.get("resourceNames") for r in patch] == [["oculis-engine-keys"]]
    assert allowed(rules, "networking.k8s.io", "networkpolicies") == {"get", "create", "patch"}


def test_with_namespaces_to_watch_the_namespaced_rights_are_roles_there_only(
        api: client.ApiClient, namespace: str) -> None:
    docs = rendered("--set", f"operator.watchNamespaces={{{namespace}}}")
    cluster_rules = operator_rules("--set", f"operator.watchNamespaces={{{namespace}}}")
    assert allowed(cluster_rules, "", "secrets") == set()  # no Secret anywhere through the ClusterRole
    assert allowed(cluster_rules, "apps", "deployments") == set()
    assert allowed(cluster_rules, "", "nodes") == {"get", "list", "watch"}  # the GPU pool is cluster-wide
    roles = [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"].get("namespace") == namespace]
    assert sorted(d["kind"] for d in roles) == ["Role", "RoleBinding"]
    role = next(d for d in roles if d["kind"] == "Role")
    assert allowed(role["rules"], "", "secrets") == {"get", "create", "patch"}
    assert allowed(role["rules"], "networking.k8s.io", "networkpolicies") == {"get", "create", "patch"}

    # The API server takes them as rendered (server-side dry run of every RBAC object), then, created for
    # real, it lets the operator's ServiceAccount read a Secret in the watched namespace and nowhere else.
    rbac = client.RbacAuthorizationV1Api(api)
    core = client.CoreV1Api(api)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "oculis-operator")
    made: list[tuple[str, str]] = []
    try:
        core.create_namespaced_service_account(namespace, {**sa, "metadata": {**sa["metadata"],
                                                                               "namespace": namespace}})
        for d in docs:
            if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-operator"):
                rbac.create_cluster_role(d, dry_run="All")
        for d in roles:
            binding = d["kind"] == "RoleBinding"
            if binding:  # the subject: the ServiceAccount as created here (the release namespace is this one)
                d["subjects"][0]["namespace"] = namespace
            create = rbac.create_namespaced_role_binding if binding else rbac.create_namespaced_role
            create(namespace, d, dry_run="All")
            create(namespace, d)
            made.append((d["kind"], d["metadata"]["name"]))

        def can(verb: str, ns: str) -> bool:
            review = client.AuthorizationV1Api(api).create_subject_access_review({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": f"system:serviceaccount:{namespace}:oculis-operator",
                         "resourceAttributes": {"namespace": ns, "verb": verb, "resource": "secrets",
                                                "name": "oculis-engine-keys"}}})
            return bool(review.status.allowed)

        assert can("get", namespace) and can("patch", namespace) and can("create", namespace)
        assert not can("get", "default") and not can("list", namespace) and not can("watch", namespace)
    finally:
        for kind, name in made:
            (rbac.delete_namespaced_role if kind == "Role" else rbac.delete_namespaced_role_binding)(name, namespace)


def test_the_network_policy_setting_the_chart_renders_is_what_the_operator_parses(tmp_path: Path) -> None:
    from oculis_operator import engine_access

    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"networkPolicy": {"extraFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}]}}))

    def setting(*args: str) -> str | None:
        dep = next(d for d in rendered(*args)
                   if d["kind"] == "Deployment" and d["metadata"]["name"] == "oculis-operator")
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        return env.get("OCULIS_NETWORK_POLICY")

    peers = engine_access.parse_peers(setting("-f", str(values)))
    assert peers is not None
    assert peers.router.namespace == peers.operator.namespace == "oculis-system"
    assert peers.router.labels == {"app.kubernetes.io/name": "oculis", "app.kubernetes.io/instance": "oculis",
                                   "app.kubernetes.io/component": "router"}  # the router Deployment's pod labels
    assert peers.operator.labels["app.kubernetes.io/component"] == "operator"
    assert peers.monitoring_namespace_labels == {"kubernetes.io/metadata.name": "monitoring"}
    assert peers.extra_from[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "gateway"}
    router = next(d for d in rendered() if d["kind"] == "Deployment" and d["metadata"]["name"] == "oculis-router")
    assert router["spec"]["template"]["metadata"]["labels"] == peers.router.labels
    assert setting("--set", "networkPolicy.enabled=false") is None  # off: the operator renders none
