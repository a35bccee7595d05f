"""The router's replica discovery in a cluster (runtime/oculis_router/slices.py) against the real API
server: a ServiceAccount with only the chart's router Role (list/watch endpointslices) lets it follow
a GPUUpstream's Ready pods through the EndpointSlices of its Service: a scaled-up pod becomes a
candidate once Ready, a deleted one leaves. Nothing is dialled but the API server on 127.0.0.1 (the
replicas' addresses are kwok's fake pod IPs, only listed)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from e2e_support import eventually
from kubernetes import client
from test_gpuupstream import World, upstream

from oculis_router.slices import SliceWatch


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def router_token(api: client.ApiClient, ns: str) -> str:
    """A token of a ServiceAccount bound to exactly the chart's router Role."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "router"}})
    rbac.create_namespaced_role(ns, {"metadata": {"name": "router"}, "rules": [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]})
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "router"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "router"},
        "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": ns}]})
    req = core.create_namespaced_service_account_token("router", ns, {"spec": {"audiences": []}})
    return str(req.status.token)


def test_ready_pods_are_found_from_endpointslices_with_list_and_watch_only(
        world: World, api: client.ApiClient, kubeconfig: Path, tmp_path: Path) -> None:
    ns = world.ns
    kc = yaml.safe_load(kubeconfig.read_text())
    cluster = kc["clusters"][0]["cluster"]
    ca = tmp_path / "ca.crt"
    if "certificate-authority-data" in cluster:
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    else:
        ca.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
    token = tmp_path / "token"
    token.write_text(router_token(api, ns))
    world.create(upstream("llm", replicas=2))
    eventually(lambda: world.ready("llm"), timeout=120, what="upstream Ready")
    base_url = f"http://llm-vllm.{ns}.svc:8000/v1"

    def ready_pods() -> set[str]:
        return {p.metadata.name for p in world.pods("llm") if not p.metadata.deletion_timestamp and any(
            c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))}

    async def scenario() -> dict[str, float]:
        async with aiohttp.ClientSession() as http:
            watch = SliceWatch(http, cluster["server"], token, ca)
            task = asyncio.create_task(watch.run())

            async def found(want: set[str], what: str, without: str = "") -> float:
                t0 = time.monotonic()
                while True:
                    listed = watch.replicas(base_url, "stable")
                    ids = {r.id for r in listed} if listed is not None else None
                    if ids is not None and (without not in ids if without else ids == want):
                        assert all(r.url.endswith(":8000/v1") and r.kv_events for r in listed)
                        return time.monotonic() - t0
                    assert time.monotonic() - t0 < 60, f"{what}: listed {listed}, want {want}"
                    await asyncio.sleep(0.05)

            try:
                two = await asyncio.to_thread(lambda: eventually(
                    lambda: (s := ready_pods()) and len(s) == 2 and s, what="two Ready pods"))
                await found(two, "the two Ready pods")
                world.patch("llm", {"replicas": 3})
                three = await asyncio.to_thread(lambda: eventually(
                    lambda: (s := ready_pods()) and len(s) == 3 and s, what="three Ready pods"))
                joined = await found(three, "the scaled-up pod")
                gone = sorted(three)[0]
                world.core.delete_namespaced_pod(gone, ns)
                left = await found(set(), "the deleted pod removed", without=gone)
                return {"joined_after_ready_s": joined, "left_after_delete_s": left}
            finally:
                task.cancel()

    figures = asyncio.run(scenario())
    print(f"\nEndpointSlice watch: a pod listed {figures['joined_after_ready_s']:.2f} s after the test saw it Ready, "
          f"a deleted one gone {figures['left_after_delete_s']:.2f} s after its delete")
