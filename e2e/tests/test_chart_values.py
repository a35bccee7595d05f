"""The chart's values.schema.json refuses, at `helm lint/template/install`, values that would render a
workload the API server or the container refuses later; cluster-scoped names carry the namespace.

Needs only the helm binary (`e2e/cluster bin-dir`), not a running cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from e2e_support import CLUSTER

CHART = Path(__file__).resolve().parents[2] / "charts" / "oculis"


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    out = subprocess.run([str(CLUSTER), "bin-dir"], capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1]) / "helm"


def helm(helm_bin: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/oculis-helm/cache", "HELM_CONFIG_HOME": "/tmp/oculis-helm/config",
           "HELM_DATA_HOME": "/tmp/oculis-helm/data"}
    return subprocess.run([str(helm_bin), *args], capture_output=True, text=True, env=env, check=False, timeout=60)


def rendered(helm_bin: Path, *sets: str, namespace: str = "oculis-system") -> list[dict]:  # type: ignore[type-arg]
    args = [a for s in sets for a in ("--set", s)]
    out = helm(helm_bin, "template", "oculis", str(CHART), "-n", namespace, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_chart_lints_strict(helm_bin: Path) -> None:
    out = helm(helm_bin, "lint", "--strict", str(CHART))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(("value", "says"), [
    ("router.shutdownGraceSeconds=abc", "/router/shutdownGraceSeconds': got string, want integer"),
    ("router.shutdownGraceSeconds=-30", "/router/shutdownGraceSeconds': minimum: got -30, want 0"),
    ("router.secretEnv[0].env=OCULIS_KEY,router.secretEnv[0].secret=openai",
     "/router/secretEnv/0': missing property 'key'"),
    ("router.secretEnv[0].env=OCULIS_KEY,router.secretEnv[0].secret=openai,router.secretEnv[0].key=",
     "/router/secretEnv/0/key'"),
    ("router.secretEnv[0].env=not-a-var,router.secretEnv[0].secret=openai,router.secretEnv[0].key=k",
     "/router/secretEnv/0/env'"),
    ("operator.metricsPort=8080", "/operator/metricsPort'"),  # kopf's liveness port in the same container
    ("operator.webhook.port=8080", "/operator/webhook/port'"),
    ("operator.metricsPort=70000", "/operator/metricsPort'"),
    ("operator.replicas=-1", "/operator/replicas': minimum: got -1, want 0"),
    ("operator.leaderElection.leaseDuration=0", "/operator/leaderElection/leaseDuration'"),
    ("operator.watchNamespaces={Not_A_Namespace}", "/operator/watchNamespaces/0'"),
    ("router.replicas=-1", "/router/replicas'"),
    ("router.image.pullPolicy=Sometimes", "/router/image/pullPolicy'"),
    ("rotuer.replicas=2", "additional properties 'rotuer' not allowed"),  # a misspelt top-level key
    ("operator.replica=2", "additional properties 'replica' not allowed"),
    ("operator.webhook.enabled=true,operator.webhook.port=9091",
     "operator.webhook.port 9091 is also operator.metricsPort"),
])
def test_wrong_values_are_refused_naming_the_field(helm_bin: Path, value: str, says: str) -> None:
    out = helm(helm_bin, "template", "r", str(CHART), "--set", value)
    assert out.returncode != 0 and says in out.stderr, out.stderr


def test_a_values_file_with_a_fractional_grace_is_refused(helm_bin: Path, tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("router:\n  shutdownGraceSeconds: 1.5\n")  # the pod's grace period is whole seconds
    out = helm(helm_bin, "template", "r", str(CHART), "-f", str(values))
    assert out.returncode != 0 and "/router/shutdownGraceSeconds'" in out.stderr


def test_cluster_scoped_names_carry_the_release_namespace(helm_bin: Path) -> None:
    docs = {ns: rendered(helm_bin, namespace=ns) for ns in ("team-a", "team-b")}
    for ns, objs in docs.items():
        cluster_scoped = [d for d in objs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
        assert {d["metadata"]["name"] for d in cluster_scoped} == {f"{ns}:oculis-operator"}
        binding = next(d for d in cluster_scoped if d["kind"] == "ClusterRoleBinding")
        assert binding["roleRef"]["name"] == f"{ns}:oculis-operator"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "oculis-operator", "namespace": ns}]


def test_the_operator_watches_what_the_values_say_and_runs_alone(helm_bin: Path) -> None:
    def operator(*sets: str) -> dict:  # type: ignore[type-arg]
        return next(d for d in rendered(helm_bin, *sets) if d["kind"] == "Deployment"
                    and d["metadata"]["name"] == "oculis-operator")

    default = operator()
    container = default["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "oculis_operator.leader"]  # Lease election around kopf
    assert container["args"] == ["--all-namespaces"]
    assert default["spec"]["replicas"] == 2 and default["spec"]["strategy"]["type"] == "RollingUpdate"
    some = operator("operator.watchNamespaces={demo,prod}")["spec"]["template"]["spec"]["containers"][0]
    assert some["args"] == ["--namespace=demo", "--namespace=prod"]
    role = next(d for d in rendered(helm_bin, "operator.watchNamespaces={demo,prod}") if d["kind"] == "ClusterRole")
    assert role["metadata"]["annotations"]["oculis.dev/watch-namespaces"] == "demo,prod"
    router_only = rendered(helm_bin, "operator.enabled=false")
    # The router's own ServiceAccount and namespaced Role (list/watch EndpointSlices) pick its replicas.
    assert {d["kind"] for d in router_only} == {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"}
    assert all("operator" not in d["metadata"]["name"] for d in router_only)
    bare = rendered(helm_bin, "operator.enabled=false", "router.replicaDiscovery=false")
    assert {d["kind"] for d in bare} == {"Deployment", "Service"}


def test_router_replicas_share_redis_from_a_secret_or_a_url(helm_bin: Path) -> None:
    # Without a shared Redis each router replica caches and counts limits on its own (N replicas, N x the
    # limit); the URL reaches `oculis serve` as OCULIS_REDIS_URL, from a Secret key when it holds a password.
    def router_env(*sets: str) -> list[dict]:  # type: ignore[type-arg]
        deploy = next(d for d in rendered(helm_bin, *sets) if d["kind"] == "Deployment"
                      and d["metadata"]["name"] == "oculis-router")
        return [e for e in deploy["spec"]["template"]["spec"]["containers"][0].get("env", [])
                if e["name"] == "OCULIS_REDIS_URL"]

    assert router_env() == []
    assert router_env("router.redis.urlFrom.secret=redis-auth") == [
        {"name": "OCULIS_REDIS_URL", "valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "url"}}}]
    assert router_env("router.redis.url=redis://oculis-redis:6379/0") == [
        {"name": "OCULIS_REDIS_URL", "value": "redis://oculis-redis:6379/0"}]
    both = helm(helm_bin, "template", "r", str(CHART), "--set", "router.redis.url=redis://r:6379/0",
                "--set", "router.redis.urlFrom.secret=redis-auth")
    assert both.returncode != 0 and "router.redis: set url or urlFrom.secret, not both" in both.stderr
    scheme = helm(helm_bin, "template", "r", str(CHART), "--set", "router.redis.url=http://r:6379")
    assert scheme.returncode != 0 and "/router/redis/url'" in scheme.stderr


def test_extra_volumes_reach_the_router_read_only_and_mismatches_are_refused(helm_bin: Path, tmp_path: Path) -> None:
    """A GPUUpstream's spec.routing.tokenizer is a path inside the router pod: router.extraVolumes and
    router.extraVolumeMounts put the model's tokenizer files there (a ConfigMap, a PVC), read-only, while
    the router stays non-root on a read-only root filesystem."""
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"router": {
        "extraVolumes": [{"name": "llama-tok", "configMap": {"name": "llama-8b-tokenizer"}},
                         {"name": "qwen-tok", "persistentVolumeClaim": {"claimName": "tokenizers"}}],
        "extraVolumeMounts": [{"name": "llama-tok", "mountPath": "/tokenizers/llama-8b"},
                              {"name": "qwen-tok", "mountPath": "/tokenizers/qwen", "subPath": "qwen2",
                               "readOnly": True}]}}))
    out = helm(helm_bin, "template", "oculis", str(CHART), "-f", str(values))
    assert out.returncode == 0, out.stderr
    router = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "oculis-router")
    pod = router["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["volumeMounts"] == [
        {"name": "config", "mountPath": "/etc/oculis", "readOnly": True},
        {"name": "engine-keys", "mountPath": "/etc/oculis-engine-keys", "readOnly": True},  # the engines' API keys
        {"name": "llama-tok", "mountPath": "/tokenizers/llama-8b", "readOnly": True},
        {"name": "qwen-tok", "mountPath": "/tokenizers/qwen", "subPath": "qwen2", "readOnly": True}]
    assert pod["volumes"][2:] == [{"name": "llama-tok", "configMap": {"name": "llama-8b-tokenizer"}},
                                  {"name": "qwen-tok", "persistentVolumeClaim": {"claimName": "tokenizers"}}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"]
    lint = helm(helm_bin, "lint", "--strict", str(CHART), "-f", str(values))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    default = next(d for d in rendered(helm_bin)
                   if d["kind"] == "Deployment" and d["metadata"]["name"] == "oculis-router")
    assert [v["name"] for v in default["spec"]["template"]["spec"]["volumes"]] == ["config", "engine-keys"]

    def refused(*sets: str) -> str:
        out = helm(helm_bin, "template", "r", str(CHART), *(a for s in sets for a in ("--set", s)))
        assert out.returncode != 0, out.stdout
        return out.stderr

    mount = "router.extraVolumeMounts[0].name=tok"
    assert ('router.extraVolumeMounts[0]: volume "tok" is not in router.extraVolumes; add it there'
            in refused(mount, "router.extraVolumeMounts[0].mountPath=/tokenizers/x"))
    vol = "router.extraVolumes[0].name=tok"
    assert "/router/extraVolumeMounts/0/readOnly': value must be true" in refused(
        vol, mount, "router.extraVolumeMounts[0].mountPath=/t", "router.extraVolumeMounts[0].readOnly=false")
    assert "/router/extraVolumeMounts/0/mountPath': 'tokenizers' does not match pattern" in refused(
        vol, mount, "router.extraVolumeMounts[0].mountPath=tokenizers")
    assert "/router/extraVolumeMounts/0/mountPath'" in refused(  # the chart's own mount
        vol, mount, "router.extraVolumeMounts[0].mountPath=/etc/oculis")
    assert "/router/extraVolumes/0/name'" in refused("router.extraVolumes[0].name=config")  # the chart's own volume
