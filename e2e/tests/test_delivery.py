"""Kubernetes delivery on the real control plane: Argo CD health of what the operator really writes,
InferenceRoutes refused at apply naming the field, `kubectl get oculis` with real values.

`OCULIS_CAPTURE_ARGOCD=1` also writes each object the health checks were run on into
charts/oculis/argocd/oculis.dev/<Kind>/testdata/ (how those fixtures were made)."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from kubernetes import client
from skips import DEV_FIX, removable, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
ARGOCD = ROOT / "charts" / "oculis" / "argocd" / "oculis.dev"
G, V = "oculis.dev", "v1alpha1"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
PLURAL = {"GPUUpstream": "gpuupstreams", "InferenceRoute": "inferenceroutes"}


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """The kind's health.lua on `obj`, in Lua 5.1 with only what argocd-cm gives a script without
    useOpenLibs (base, table, package, os): as gopher-lua runs it in Argo CD."""
    lupa = pytest.importorskip("lupa.lua51", reason=removable("lupa not installed", DEV_FIX).render())
    lua = lupa.LuaRuntime(register_eval=False)
    g = lua.globals()
    for lib in ("string", "math", "io", "debug"):
        g[lib] = None
    g.obj = lua.table_from(json.loads(json.dumps(obj)), recursive=True)
    out = lua.execute((ARGOCD / obj["kind"] / "health.lua").read_text())
    return {"status": out["status"], "message": out["message"]}


def capture(obj: dict[str, Any], fixture: str) -> None:
    if os.environ.get("OCULIS_CAPTURE_ARGOCD") != "1":
        return
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("managedFields", None)
    path = ARGOCD / obj["kind"] / "testdata" / f"{fixture}.yaml"
    path.write_text(yaml.safe_dump(obj, sort_keys=False, width=120))


class Objects:
    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.ns = ns
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def create(self, kind: str, name: str, spec: dict[str, Any], **meta: Any) -> None:
        body = {"apiVersion": f"{G}/{V}", "kind": kind, "metadata": {"name": name, **meta}, "spec": spec}
        self.custom.create_namespaced_custom_object(G, V, self.ns, PLURAL[kind], body)

    def patch(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(G, V, self.ns, PLURAL[kind], name, {"spec": spec})

    def get(self, kind: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(G, V, self.ns, PLURAL[kind], name)
        return obj

    def health(self, kind: str, name: str, status: str, fixture: str | None = None,
               timeout: float = 60, reason: str | None = None) -> dict[str, Any]:
        """Wait until the live object's Argo CD health is `status` (and, when given, its Ready reason
        is `reason`; else it has a status at all); capture it as `fixture`."""
        def probe() -> dict[str, Any] | None:
            obj = self.get(kind, name)
            ready = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})
            if (reason and ready.get("reason") != reason) or not ready:
                return None
            if obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
                return None  # the operator has not seen this spec yet (a stale status is its own fixture)
            return obj if argocd_health(obj)["status"] == status else None

        obj = eventually(probe, timeout=timeout, what=f"{kind} {name} {status}")
        if fixture:
            capture(obj, fixture)
        return obj


def vllm(**spec: Any) -> dict[str, Any]:
    return {"provider": "vllm", "model": LLAMA_8B, "replicas": 2, "gpu": {"product": "H100-80GB", "count": 1},
            "engine": {"maxModelLen": 16384, "maxNumSeqs": 64, "maxNumBatchedTokens": 8192}, **spec}


def route(*upstreams: str) -> dict[str, Any]:
    tiers: list[dict[str, Any]] = [{"name": f"t{i}", "match": {"complexityBelow": round(0.3 * (i + 1), 2)},
                                    "upstream": u} for i, u in enumerate(upstreams)]
    tiers[-1]["match"] = {}
    return {"tiers": tiers}


@pytest.fixture
def objs(api: client.ApiClient, namespace: str, operator: Any) -> Objects:
    return Objects(api, namespace)


def kubectl(bin_dir: Path, kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, check=check)


def test_argocd_health_of_what_the_operator_writes(objs: Objects, bin_dir: Path, kubeconfig: Path) -> None:
    gu, ir = "GPUUpstream", "InferenceRoute"
    slow = {"oculis.dev/e2e-ready-delay": "4s"}
    # An external upstream waiting for its Secret: Degraded with the operator's message.
    objs.create(gu, "gpt", {"provider": "openai", "model": "gpt-4o", "apiKeySecretRef": {"name": "openai"}})
    obj = objs.health(gu, "gpt", "Degraded", "degraded_secret_missing")
    assert "openai" in argocd_health(obj)["message"]
    # A self-hosted one: Progressing while its replicas load, then Healthy.
    objs.create(gu, "llama", vllm(podAnnotations=slow))
    objs.health(gu, "llama", "Progressing", "progressing_creating")
    # A route over an upstream still coming up is Progressing, not Degraded (a first sync must not fail).
    objs.create(ir, "adaptive", route("llama"))
    obj = objs.health(ir, "adaptive", "Progressing", "progressing_waiting_for_upstream",
                      reason="UpstreamProgressing")
    assert {c["type"] for c in obj["status"]["conditions"]} >= {"Ready", "Degraded", "Progressing"}
    assert all(c["observedGeneration"] == obj["metadata"]["generation"] for c in obj["status"]["conditions"])
    objs.health(gu, "llama", "Healthy", "healthy", timeout=90)
    obj = objs.health(ir, "adaptive", "Healthy", "healthy")
    assert obj["status"]["tierStatus"] == [{"name": "t0", "upstream": "llama", "ready": True}]
    assert obj["status"]["upstreamsReady"] == "1/1" and obj["status"]["strategy"] == "semantic"
    # A route over an upstream that is not Ready (its Secret is missing) is Degraded, naming it.
    objs.create(ir, "mixed", route("llama", "gpt"))
    obj = objs.health(ir, "mixed", "Degraded", "degraded_upstream_not_ready")
    assert "gpt (SecretNotFound)" in argocd_health(obj)["message"]
    assert obj["status"]["tierStatus"][1] == {"name": "t1", "upstream": "gpt", "ready": False}
    # A tier naming a GPUUpstream that does not exist.
    objs.create(ir, "ghostly", route("llama", "ghost"))
    obj = objs.health(ir, "ghostly", "Degraded", "degraded_upstream_missing")
    assert "no GPUUpstream named ghost" in argocd_health(obj)["message"]
    # An engine change rolls: the upstream is Progressing, the route stays Ready and Healthy.
    objs.patch(gu, "llama", {"engine": {"maxNumSeqs": 96}})
    objs.health(gu, "llama", "Progressing", "progressing_rolling")
    assert argocd_health(objs.get(ir, "adaptive"))["status"] == "Healthy"
    objs.health(gu, "llama", "Healthy", timeout=90)
    # A change that cannot fit is refused: Degraded with the capacity message; the old engine still answers.
    objs.patch(gu, "llama", {"engine": {"maxNumSeqs": 5000, "maxNumBatchedTokens": 8192},
                             "traffic": {"avgPromptTokens": 4000, "avgOutputTokens": 1000}})
    obj = objs.health(gu, "llama", "Degraded", "degraded_capacity_refused")
    assert "ERR_OCULIS_KV_CACHE_EXHAUSTED" in argocd_health(obj)["message"]
    assert argocd_health(objs.get(ir, "adaptive"))["status"] == "Healthy"
    # Scaled to zero: Suspended, and so is the route that only it serves.
    objs.patch(gu, "llama", {"replicas": 0, "engine": {"maxNumSeqs": 96}, "traffic": None})
    objs.health(gu, "llama", "Suspended", "suspended_scaled_to_zero")
    objs.health(ir, "adaptive", "Suspended", "suspended_upstream_scaled_to_zero")
    # The columns, with real values, for both kinds under one category.
    table = kubectl(bin_dir, kubeconfig, "get", "oculis", "-n", objs.ns).stdout
    assert "gpuupstream.oculis.dev/llama" in table and "inferenceroute.oculis.dev/adaptive" in table
    lines = kubectl(bin_dir, kubeconfig, "get", "ir", "-n", objs.ns).stdout.splitlines()
    assert lines[0].split() == ["NAME", "STRATEGY", "TIERS", "UPSTREAMS-READY", "READY", "AGE"]
    mixed = next(line for line in lines if line.startswith("mixed "))
    assert "semantic" in mixed and "t0->llama, t1->gpt" in mixed and " 0/2 " in mixed and "False" in mixed


BAD_ROUTES = [
    ({"tiers": [{"name": "a", "match": {"complexityBelow": 0.5}, "upstream": "x"},
                {"name": "b", "match": {"complexityBelow": 0.4}, "upstream": "x"}, {"name": "c", "upstream": "x"}]},
     "spec.tiers[1] (b) can never be reached"),
    ({"tiers": [{"name": "a", "match": {}, "upstream": "x"}, {"name": "b", "upstream": "x"}]},
     "spec.tiers[0] (a) has an empty match but is not the last tier"),
    ({"tiers": [{"name": "a", "match": {"complexityBelow": 1.5}, "upstream": "x"}, {"name": "b", "upstream": "x"}]},
     "spec.tiers[0].match.complexityBelow: Invalid value: 1.5"),
    ({"tiers": [{"name": "a", "match": {"complexityBelow": 0.5}, "upstream": "x"}, {"name": "a", "upstream": "x"}]},
     "tier names must be unique"),
    # The flat spelling of a tier's rules (complexityBelow beside the name) is held to the same rules.
    ({"tiers": [{"name": "a", "complexityBelow": 0.5, "upstream": "x"},
                {"name": "b", "match": {"complexityBelow": 0.4}, "upstream": "x"}, {"name": "c", "upstream": "x"}]},
     "spec.tiers[1] (b) can never be reached"),
    ({"tiers": [{"name": "a", "complexityBelow": 0.5, "match": {}, "upstream": "x"}, {"name": "b", "upstream": "x"}]},
     "either flat on the tier or under match, not both"),
    ({"tiers": [{"name": "a", "complexityBelow": 0.5, "upstream": "x"},
                {"name": "b", "maxPromptTokens": 10, "upstream": "x"}]},
     "the last tier must catch all"),
    ({"tiers": [{"name": "a", "upstream": "Bad_Name"}]}, "spec.tiers[0].upstream"),
    ({"tiers": [{"name": "a", "upstream": "x"}], "escalation": {"confidenceThreshold": -0.1}},
     "spec.escalation.confidenceThreshold"),
    ({"tiers": [{"name": "a", "upstream": "x"}], "escalation": {"onAnswer": {"bufferStreams": True}}},
     "onAnswer checks nothing"),
]


@pytest.mark.parametrize(("spec", "says"), BAD_ROUTES)
def test_bad_routes_are_refused_at_apply_naming_the_field(objs: Objects, spec: dict[str, Any], says: str) -> None:
    with pytest.raises(client.ApiException) as err:
        objs.create("InferenceRoute", "bad", spec)
    assert err.value.status == 422
    assert says in json.loads(err.value.body)["message"]


CHART = ROOT / "charts" / "oculis"


def helm(bin_dir: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": "/tmp/oculis-helm/cache",
           "HELM_CONFIG_HOME": "/tmp/oculis-helm/config", "HELM_DATA_HOME": "/tmp/oculis-helm/data"}
    return subprocess.run([str(bin_dir / "helm"), *args], capture_output=True, text=True, env=env, check=False)


def ready_reason(obj: dict[str, Any]) -> tuple[str, str]:
    c = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})
    return c.get("status", ""), c.get("reason", "")


def test_the_chart_delivers_upstreams_and_routes_rolls_them_and_uninstalls_clean(
        objs: Objects, api: client.ApiClient, bin_dir: Path, kubeconfig: Path, tmp_path: Path) -> None:
    ns, release = objs.ns, "oc"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "operator": {"watchNamespaces": [ns]},  # the test's own operator reconciles; no clash with others
        "upstreams": {
            "llama-8b": vllm(podAnnotations={"oculis.dev/e2e-ready-delay": "2s"}),
            "gpt4o": {"provider": "openai", "model": "gpt-4o"},
        },
        "routes": {"adaptive": {"tiers": [{"name": "small", "match": {"complexityBelow": 0.35}, "upstream": "llama-8b"},
                                          {"name": "large", "match": {}, "upstream": "gpt4o"}]}},
    }))
    apps = client.AppsV1Api(api)
    inst = helm(bin_dir, kubeconfig, "install", release, str(CHART), "-n", ns, "-f", str(values))
    assert inst.returncode == 0, inst.stderr
    assert "helm uninstall" in inst.stdout and "CRDs" in inst.stdout  # NOTES say what uninstall leaves
    try:
        try:
            eventually(lambda: ready_reason(objs.get("InferenceRoute", "adaptive")) == ("True", "Rendered"),
                       timeout=90, what="route Ready")
        except BaseException:
            print("STATE", [(o["metadata"]["name"], o.get("status")) for plural in PLURAL.values()
                            for o in objs.custom.list_namespaced_custom_object(G, V, ns, plural)["items"]])
            raise
        table = kubectl(bin_dir, kubeconfig, "get", "oculis", "-n", ns).stdout
        assert "gpuupstream.oculis.dev/llama-8b" in table and "inferenceroute.oculis.dev/adaptive" in table
        row = next(line for line in kubectl(bin_dir, kubeconfig, "get", "ir", "-n", ns).stdout.splitlines()
                   if line.startswith("adaptive "))
        assert row.split()[1:2] == ["semantic"] and "small->llama-8b, large->gpt4o" in row and " 2/2 " in row
        # helm upgrade --set ...maxNumSeqs rolls the engine pods through the operator; the route stays Ready.
        old_hash = objs.get("GPUUpstream", "llama-8b")["status"]["engineHash"]
        up = helm(bin_dir, kubeconfig, "upgrade", release, str(CHART), "-n", ns, "--reuse-values",
                  "--set", "upstreams.llama-8b.engine.maxNumSeqs=96")
        assert up.returncode == 0, up.stderr
        seen: set[tuple[str, str]] = set()

        def rolled() -> bool:
            seen.add(ready_reason(objs.get("InferenceRoute", "adaptive")))
            st = objs.get("GPUUpstream", "llama-8b")["status"]
            return ready_reason(objs.get("GPUUpstream", "llama-8b"))[0] == "True" and st["engineHash"] != old_hash

        eventually(rolled, timeout=120, interval=0.2, what="llama-8b rolled to maxNumSeqs 96")
        assert seen == {("True", "Rendered")}
        args = apps.read_namespaced_deployment("llama-8b-vllm", ns).spec.template.spec.containers[0].args
        assert "--max-num-seqs=96" in args
        # An upstream removed from the values file: helm deletes it, and its route is Degraded, naming it,
        # while the router keeps serving the route's last good config (the llama-8b tier still answers).
        spec = yaml.safe_load(values.read_text())
        del spec["upstreams"]["gpt4o"]
        spec["upstreams"]["llama-8b"]["engine"]["maxNumSeqs"] = 96
        values.write_text(yaml.safe_dump(spec))
        gone = helm(bin_dir, kubeconfig, "upgrade", release, str(CHART), "-n", ns, "-f", str(values))
        assert gone.returncode == 0, gone.stderr
        names = lambda: [o["metadata"]["name"] for o in  # noqa: E731
                         objs.custom.list_namespaced_custom_object(G, V, ns, "gpuupstreams")["items"]]
        eventually(lambda: names() == ["llama-8b"], what="gpt4o deleted by the upgrade")
        obj = objs.health("InferenceRoute", "adaptive", "Degraded", reason="UpstreamNotFound")
        assert argocd_health(obj)["message"] == (
            "no GPUUpstream named gpt4o in this namespace; the router keeps serving this route's last good config")
        cfg = yaml.safe_load(objs.core.read_namespaced_config_map(obj["status"]["configMap"], ns).data[
            "oculis-config.yaml"])["oculis"]
        assert [r["name"] for r in cfg["routes"]] == ["adaptive"]
        assert sorted(u["name"] for u in cfg["upstreams"]) == ["gpt4o", "llama-8b"]
    finally:
        out = helm(bin_dir, kubeconfig, "uninstall", release, "-n", ns, "--wait")
    assert out.returncode == 0, out.stderr
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)

    def left() -> list[str]:
        found = [f"deployment/{d.metadata.name}" for d in apps.list_namespaced_deployment(ns).items]
        found += [f"service/{s.metadata.name}" for s in core.list_namespaced_service(ns).items]
        found += [f"configmap/{c.metadata.name}" for c in core.list_namespaced_config_map(ns).items
                  if c.metadata.name != "kube-root-ca.crt"]
        found += [f"serviceaccount/{s.metadata.name}" for s in core.list_namespaced_service_account(ns).items
                  if s.metadata.name != "default"]
        found += [f"role/{r.metadata.name}" for r in rbac.list_namespaced_role(ns).items]
        found += [f"rolebinding/{r.metadata.name}" for r in rbac.list_namespaced_role_binding(ns).items]
        found += [f"clusterrole/{r.metadata.name}" for r in rbac.list_cluster_role().items
                  if r.metadata.name.startswith(f"{ns}:")]
        found += [f"clusterrolebinding/{r.metadata.name}" for r in rbac.list_cluster_role_binding().items
                  if r.metadata.name.startswith(f"{ns}:")]
        for plural in PLURAL.values():
            found += [f"{plural}/{o['metadata']['name']}" for o in
                      objs.custom.list_namespaced_custom_object(G, V, ns, plural)["items"]]
        return found

    eventually(lambda: left() == [], timeout=60, what=f"nothing left after helm uninstall (left: {left()})")
    crds = client.ApiextensionsV1Api(api).list_custom_resource_definition().items
    assert {"gpuupstreams.oculis.dev", "inferenceroutes.oculis.dev"} <= {c.metadata.name for c in crds}


def test_a_crd_upgrade_that_adds_a_field_applies_server_side(objs: Objects, bin_dir: Path, kubeconfig: Path,
                                                               tmp_path: Path) -> None:
    """The documented path: `kubectl apply --server-side --force-conflicts -f charts/oculis/crds/`
    over an older CRD; a field the new one adds is then stored."""
    new = yaml.safe_load((CHART / "crds" / "inferenceroutes.oculis.dev.yaml").read_text())
    old = json.loads(json.dumps(new))
    status = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    del status["upstreamsReady"]  # the older CRD: before this field existed
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    try:
        kubectl(bin_dir, kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(tmp_path / "old.yaml"))
        objs.create("GPUUpstream", "gpt", {"provider": "openai", "model": "gpt-4o"})
        objs.create("InferenceRoute", "r", route("gpt"))
        eventually(lambda: ready_reason(objs.get("InferenceRoute", "r"))[0] == "True", what="route Ready")
        assert "upstreamsReady" not in objs.get("InferenceRoute", "r")["status"]  # pruned by the older schema
        up = kubectl(bin_dir, kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        assert "serverside-applied" in up.stdout
        objs.patch("InferenceRoute", "r", {"escalation": {"maxRetries": 1}})  # a new spec: the status is rewritten
        eventually(lambda: objs.get("InferenceRoute", "r")["status"].get("upstreamsReady") == "1/1",
                   what="the added field stored")
    finally:
        kubectl(bin_dir, kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))


def leader_exit_code() -> int:
    from oculis_operator.leader import EXIT_LOST

    return EXIT_LOST


class Candidate:
    """One operator replica: `python -m oculis_operator.leader` over the test's namespace."""

    def __init__(self, kubeconfig: Path, ns: str, workdir: Path, name: str) -> None:
        from operator_fixture import free_port

        self.port = free_port()
        self.log_path = workdir / f"{name}.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "OCULIS_LEASE_NAMESPACE": ns,
               "OCULIS_HEALTH_PORT": str(self.port), "OCULIS_RECHECK_SECONDS": "1", "POD_NAME": "",
               "OCULIS_WEBHOOK_PORT": "", "OCULIS_METRICS_PORT": ""}
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        self.proc = subprocess.Popen([sys.executable, "-m", "oculis_operator.leader", "--namespace", ns],
                                     env=env, stdout=log, stderr=log, start_new_session=True)

    def leads(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/leader", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def test_a_leader_killed_mid_rollout_is_replaced_and_the_rollout_completes(
        objs: Objects, operator: Any, api: client.ApiClient, kubeconfig: Path, tmp_path: Path) -> None:
    operator.stop()  # the session's single operator would be a third writer
    candidates = [Candidate(kubeconfig, objs.ns, tmp_path, n) for n in ("a", "b")]
    apps = client.AppsV1Api(api)
    try:
        first = eventually(lambda: next((c for c in candidates if c.leads()), None), timeout=60, what="a leader")
        other = next(c for c in candidates if c is not first)
        assert not other.leads()  # one leader only
        objs.create("GPUUpstream", "roll", vllm(replicas=3, podAnnotations={"oculis.dev/e2e-ready-delay": "3s"}))
        eventually(lambda: ready_reason(objs.get("GPUUpstream", "roll"))[0] == "True", timeout=90, what="Ready")
        old_hash = objs.get("GPUUpstream", "roll")["status"]["engineHash"]
        objs.patch("GPUUpstream", "roll", {"engine": {"maxNumSeqs": 48}})
        eventually(lambda: objs.get("GPUUpstream", "roll")["status"].get("desiredEngineHash") != old_hash,
                   what="rollout started")
        first.kill()
        killed = time.monotonic()
        # Within leaseDuration + retryPeriod + kopf's start (14-15 s measured; the issue asks 20 s): the
        # bound here is generous, the figure is printed (-s), as tests assert behaviour, not timings.
        eventually(other.leads, timeout=40, interval=0.2, what="the standby takes over")
        takeover = time.monotonic() - killed

        def done() -> bool:
            st = objs.get("GPUUpstream", "roll")["status"]
            return (ready_reason(objs.get("GPUUpstream", "roll"))[0] == "True" and st["engineHash"] != old_hash
                    and st["engineHash"] == st.get("desiredEngineHash"))

        eventually(done, timeout=120, what="the rollout completes under the new leader")
        # Nothing written twice or orphaned: one new ReplicaSet (revision 2), the old one at 0, 3 pods.
        sets = apps.list_namespaced_replica_set(objs.ns, label_selector="oculis.dev/upstream=roll").items
        assert sorted((rs.spec.replicas or 0) for rs in sets) == [0, 3]
        dep = apps.read_namespaced_deployment("roll-vllm", objs.ns)
        assert dep.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
        pods = eventually(lambda: (p := client.CoreV1Api(api).list_namespaced_pod(
            objs.ns, label_selector="oculis.dev/upstream=roll").items) and len(p) == 3 and p, what="3 pods")
        assert all(p.metadata.owner_references[0].name in {rs.metadata.name for rs in sets} for p in pods)
        print(f"leader takeover after a kill: {takeover:.1f} s")
        # A leader whose Lease is taken from it (another holder, fresh renewTime) stops and exits.
        leases = client.CoordinationV1Api(api)

        def steal() -> bool:
            lease = leases.read_namespaced_lease("oculis-operator", objs.ns)
            lease.spec.holder_identity, lease.spec.lease_duration_seconds = "intruder", 600
            lease.spec.renew_time = datetime.datetime.now(datetime.UTC)
            leases.replace_namespaced_lease("oculis-operator", objs.ns, lease)  # 409 if it renewed meanwhile
            return True

        eventually(steal, what="the Lease taken over by another holder")
        eventually(lambda: other.proc.poll() is not None, timeout=40, what="the leader that lost its Lease exits")
        assert other.proc.returncode == leader_exit_code()
        assert "stopping at once" in other.log_path.read_text()  # the watchdog or the election, whichever first
    finally:
        for c in candidates:
            c.kill()
        operator.start()
        operator.wait_ready(operator.webhook_registered)


def rendered_chart(bin_dir: Path, *sets: str) -> list[dict[str, Any]]:
    out = helm(bin_dir, Path("/nonexistent"), "template", "oculis", str(CHART), "-n", "oculis-system",
               *[a for s in sets for a in ("--set", s)])
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def helm_only() -> Path:
    """The helm binary's directory without a running cluster (template and lint need none)."""
    from e2e_support import CLUSTER

    out = subprocess.run([str(CLUSTER), "bin-dir"], capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


def test_the_prometheus_rules_pass_promtool_and_watch_exported_metrics(helm_only: Path, tmp_path: Path) -> None:
    promtool = subprocess.run(["which", "promtool"], capture_output=True, text=True, check=False).stdout.strip()
    if not promtool:
        skip_or_fail(removable("promtool not installed", "apt-get install prometheus"))
    docs = rendered_chart(helm_only, "monitoring.prometheusRule.enabled=true", "monitoring.serviceMonitor.enabled=true",
                          "monitoring.podMonitor.enabled=true", "monitoring.enginePodMonitor.enabled=true")
    kinds = {d["kind"]: d for d in docs if d["metadata"]["name"] != "oculis-engines"}
    engines = next(d for d in docs if d["metadata"]["name"] == "oculis-engines")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(kinds["PrometheusRule"]["spec"]))
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    exprs = " ".join(r["expr"] for g in kinds["PrometheusRule"]["spec"]["groups"] for r in g["rules"])
    from oculis_operator.metrics import OperatorMetrics
    from oculis_router.metrics import Metrics

    exported = {m.name for reg in (OperatorMetrics().registry, Metrics().registry) for m in reg.collect()}
    exported |= {f"{n}_total" for n in exported}
    used = {w for w in re.findall(r"\b(oculis_[a-z_]+)", exprs)}
    assert used and used <= exported, used - exported
    assert {"oculis_operator_refusals_total", "oculis_operator_upstreams", "oculis_escalations_total",
            "oculis_cache_errors_total"} <= used
    monitor = kinds["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert monitor["endpoints"][0]["port"] == "metrics"
    assert kinds["PodMonitor"]["spec"]["selector"]["matchLabels"]["oculis.dev/leader"] == "true"
    # the engine pods, stable and canary, as the operator renders them (render.labels / canary_selector)
    from oculis_operator import render

    sel = engines["spec"]["selector"]
    for pod_labels in (render.labels("x"), {**render.labels("x"), **render.canary_selector("x")}):
        assert all(pod_labels.get(k) == v for k, v in sel["matchLabels"].items())
        assert all(pod_labels.get(e["key"]) in e["values"] for e in sel["matchExpressions"])
    assert engines["spec"]["podMetricsEndpoints"][0]["port"] == "http" and engines["spec"]["namespaceSelector"]["any"]
    # Off by default: no Prometheus Operator CRDs needed.
    assert not {"PrometheusRule", "ServiceMonitor", "PodMonitor"} & {d["kind"] for d in rendered_chart(helm_only)}


def test_the_chart_runs_two_operator_replicas_under_a_lease(helm_only: Path) -> None:
    docs = rendered_chart(helm_only)
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "oculis-operator")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OCULIS_LEASE_NAME"]["value"] == "oculis-operator"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "oculis-operator-leader")
    leases = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert {v for r in leases for v in r["verbs"]} == {"create", "get", "update"}
    assert all(r.get("resourceNames") == ["oculis-operator"] for r in leases if "create" not in r["verbs"])
    assert rendered_chart(helm_only, "operator.replicas=3")  # no longer pinned to 1
    lint = helm(helm_only, Path("/nonexistent"), "lint", "--strict", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_resync_from_git_causes_no_rollout(objs: Objects, api: client.ApiClient, bin_dir: Path,
                                             kubeconfig: Path, tmp_path: Path) -> None:
    """Argo CD / Flux re-apply the user's manifest (`kubectl replace`): same spec, no rollout, no write."""
    manifest = {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "synced", "namespace": objs.ns},
                "spec": vllm()}
    path = tmp_path / "gu.yaml"
    path.write_text(yaml.safe_dump(manifest))
    kubectl(bin_dir, kubeconfig, "apply", "-f", str(path))
    eventually(lambda: ready_reason(objs.get("GPUUpstream", "synced"))[0] == "True", timeout=90, what="Ready")
    apps = client.AppsV1Api(api)
    before = apps.read_namespaced_deployment("synced-vllm", objs.ns).metadata
    for _ in range(3):
        kubectl(bin_dir, kubeconfig, "replace", "-f", str(path))
    time.sleep(3)  # give a wrongful rollout the chance to start
    after = apps.read_namespaced_deployment("synced-vllm", objs.ns).metadata
    assert (after.generation, after.resource_version) == (before.generation, before.resource_version)
    assert ready_reason(objs.get("GPUUpstream", "synced"))[0] == "True"
