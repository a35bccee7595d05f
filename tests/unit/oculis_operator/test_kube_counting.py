"""Every API request the operator makes is counted once, in its total and in its metrics counter."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from oculis_operator.kube import Kube


def test_reads_and_writes_reach_the_metrics_counter() -> None:
    counted: list[int] = []
    kube = Kube(client.ApiClient(), on_request=lambda: counted.append(1))

    def nothing(*_: Any, **__: Any) -> None:
        return None

    kube.apps.patch_namespaced_deployment = nothing  # type: ignore[method-assign]
    kube.custom.patch_namespaced_custom_object_status = nothing  # type: ignore[method-assign]
    kube.core.create_namespaced_service = nothing  # type: ignore[method-assign]
    kube.patch_deployment("ns", "x", {})
    kube.patch_status("ns", "x", {})
    kube.create({"kind": "Service", "metadata": {"namespace": "ns"}})
    assert kube.requests == len(counted) == 3
