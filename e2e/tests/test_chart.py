"""The Helm chart lints and installs on the real API server (helm reads the stamped /version)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from kubernetes import client

CHART = Path(__file__).resolve().parents[2] / "charts" / "oculis"


def helm(bin_dir: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": "/tmp/oculis-helm/cache",
           "HELM_CONFIG_HOME": "/tmp/oculis-helm/config", "HELM_DATA_HOME": "/tmp/oculis-helm/data"}
    return subprocess.run([str(bin_dir / "helm"), *args], capture_output=True, text=True, env=env, check=False)


def test_client_keys_come_from_a_secret(bin_dir: Path, kubeconfig: Path) -> None:
    out = helm(bin_dir, kubeconfig, "template", "x", str(CHART), "--set", "router.clientKeys.secret=clients")
    assert out.returncode == 0, out.stderr
    assert "--client-keys-env, OCULIS_CLIENT_KEYS]" in out.stdout
    assert "valueFrom: {secretKeyRef: {name: clients, key: keys}}" in out.stdout


def test_chart_lints_and_installs(bin_dir: Path, kubeconfig: Path, api: client.ApiClient, namespace: str) -> None:
    lint = helm(bin_dir, kubeconfig, "lint", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    release = f"oc-{namespace[-6:]}"
    inst = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", namespace)
    try:
        assert inst.returncode == 0, inst.stderr
        dep = client.AppsV1Api(api).read_namespaced_deployment(f"{release}-operator", namespace)
        pod = dep.spec.template.spec
        assert pod.security_context.run_as_non_root is True
        assert pod.containers[0].security_context.read_only_root_filesystem is True
        op = pod.containers[0]  # the leader-election health endpoints are probed; metrics served and annotated
        assert op.args == ["--all-namespaces"] and op.command == ["python", "-m", "oculis_operator.leader"]
        assert op.liveness_probe.http_get.port == "health" and op.readiness_probe.http_get.path == "/readyz"
        assert dep.spec.strategy.type == "RollingUpdate"
        assert {e.name: e.value for e in op.env}["OCULIS_METRICS_PORT"] == "9091"
        assert dep.spec.template.metadata.annotations["prometheus.io/port"] == "9091"
        router = client.AppsV1Api(api).read_namespaced_deployment(f"{release}-router", namespace).spec.template.spec
        # its token is for EndpointSlices only (replica discovery): list and watch, in its namespace
        assert router.automount_service_account_token is True and router.service_account_name == f"{release}-router"
        rrole = client.RbacAuthorizationV1Api(api).read_namespaced_role(f"{release}-router", namespace)
        assert [(r.api_groups, r.resources, r.verbs) for r in rrole.rules] == [
            (["discovery.k8s.io"], ["endpointslices"], ["list", "watch"])]
        assert router.containers[0].security_context.read_only_root_filesystem is True
        assert router.volumes[0].config_map.name == "oculis-router-config"
        # Rolling restarts drain: the API server accepted the preStop sleep and the grace period.
        assert router.termination_grace_period_seconds == 135
        assert router.containers[0].lifecycle.pre_stop.sleep.seconds == 5
        assert router.containers[0].args[-3:] == ["--wait-for-config", "--shutdown-grace", "120"]
        role = client.RbacAuthorizationV1Api(api).read_cluster_role(f"{namespace}:{release}-operator")
        secrets = [r for r in role.rules if "secrets" in r.resources]
        # never list or watch Secrets; patch only the engines' key Secret
        assert [(r.verbs, r.resource_names) for r in secrets] == [(["get", "create"], None),
                                                                  (["patch"], ["oculis-engine-keys"])]
        # `helm upgrade` with a new value rolls the router's pod template (a rolling restart).
        up = helm(bin_dir, kubeconfig, "upgrade", release, str(CHART), "-n", namespace,
                  "--set", "router.shutdownGraceSeconds=60")
        assert up.returncode == 0, up.stderr
        router = client.AppsV1Api(api).read_namespaced_deployment(f"{release}-router", namespace)
        assert router.metadata.generation == 2 and router.spec.template.spec.termination_grace_period_seconds == 75
    finally:
        helm(bin_dir, kubeconfig, "uninstall", release, "-n", namespace)


def test_a_second_release_in_another_namespace_installs_and_a_second_operator_is_refused(
        bin_dir: Path, kubeconfig: Path, api: client.ApiClient, namespace: str) -> None:
    """Cluster-scoped names carry the namespace, so one release name installs in two namespaces; two
    operators over the same namespace (each release elects its leader among its own replicas) are refused."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    other = f"{namespace}-b"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=other)))
    release = "oculis"  # the same release name in both namespaces
    installed: list[str] = []
    try:
        first = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", namespace,
                     "--set", f"operator.watchNamespaces={{{namespace}}}", "--set", "operator.webhook.enabled=true")
        assert first.returncode == 0, first.stderr
        installed.append(namespace)
        # An operator over all namespaces would also watch the first one: refused, saying why and what to do.
        clash = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", other)
        assert clash.returncode != 0
        assert (f"the operator of release {release} in namespace {namespace} already watches {namespace}"
                in clash.stderr), clash.stderr
        assert "operator.enabled=false" in clash.stderr and "leader election" in clash.stderr
        # The webhook's configuration has one cluster-wide name: a second one is refused too.
        hook = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", other,
                    "--set", f"operator.watchNamespaces={{{other}}}", "--set", "operator.webhook.enabled=true")
        assert hook.returncode != 0 and "already serves the validating webhook" in hook.stderr, hook.stderr
        # Its own namespace only: no overlap, and no name clash with the first release's ClusterRole.
        second = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", other,
                      "--set", f"operator.watchNamespaces={{{other}}}")
        assert second.returncode == 0, second.stderr
        installed.append(other)
        for ns in (namespace, other):
            role = rbac.read_cluster_role(f"{ns}:{release}-operator")
            assert role.metadata.annotations["oculis.dev/watch-namespaces"] == ns
            binding = rbac.read_cluster_role_binding(f"{ns}:{release}-operator")
            assert binding.subjects[0].namespace == ns
            args = client.AppsV1Api(api).read_namespaced_deployment(f"{release}-operator", ns).spec.template.spec
            assert args.containers[0].args == [f"--namespace={ns}"]
        # A router-only release (operator.enabled=false) next to them installs no operator at all.
        helm(bin_dir, kubeconfig, "uninstall", release, "-n", other)
        installed.remove(other)
        router_only = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", other,
                           "--set", "operator.enabled=false")
        assert router_only.returncode == 0, router_only.stderr
        installed.append(other)
        names = {d.metadata.name for d in client.AppsV1Api(api).list_namespaced_deployment(other).items}
        assert names == {f"{release}-router"}
        # Upgrading the first release does not refuse itself.
        up = helm(bin_dir, kubeconfig, "upgrade", release, str(CHART), "-n", namespace,
                  "--set", f"operator.watchNamespaces={{{namespace}}}", "--set", "operator.webhook.enabled=true")
        assert up.returncode == 0, up.stderr
    finally:
        for ns in installed:
            helm(bin_dir, kubeconfig, "uninstall", release, "-n", ns)
        core.delete_namespace(other)


def test_the_router_with_a_tokenizer_volume_is_accepted_by_the_api_server(
        bin_dir: Path, kubeconfig: Path, api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    """router.extraVolumes/extraVolumeMounts (a GPUUpstream's spec.routing.tokenizer files): the Deployment
    they render passes the API server's own validation (server-side dry run), mounts read-only."""
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"router": {
        "extraVolumes": [{"name": "llama-tok", "configMap": {"name": "llama-8b-tokenizer"}},
                         {"name": "qwen-tok", "persistentVolumeClaim": {"claimName": "tokenizers"}}],
        "extraVolumeMounts": [{"name": "llama-tok", "mountPath": "/tokenizers/llama-8b"},
                              {"name": "qwen-tok", "mountPath": "/tokenizers/qwen", "subPath": "qwen2"}]}}))
    out = helm(bin_dir, kubeconfig, "template", "tok", str(CHART), "-n", namespace, "-f", str(values))
    assert out.returncode == 0, out.stderr
    dep = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"
               and d["metadata"]["name"] == "tok-router")
    made = client.AppsV1Api(api).create_namespaced_deployment(namespace, dep, dry_run="All")
    mounts = {m.mount_path: m.read_only for m in made.spec.template.spec.containers[0].volume_mounts}
    assert mounts == {"/etc/oculis": True, "/etc/oculis-engine-keys": True, "/tokenizers/llama-8b": True,
                      "/tokenizers/qwen": True}
    assert [v.name for v in made.spec.template.spec.volumes] == ["config", "engine-keys", "llama-tok", "qwen-tok"]
    keys = made.spec.template.spec.volumes[1].secret  # the engines' API keys, if the operator wrote any yet
    assert (keys.secret_name, keys.optional) == ("oculis-engine-keys", True)
