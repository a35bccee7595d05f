"""Session fixtures for tests on the real local control plane (e2e/cluster).

The cluster is brought up once per session (a no-op when it already runs, e.g. after the demo) and
taken down at the end only if this session started it, unless OCULIS_E2E_KEEP=1. Each test gets its
own namespace. Tests talk to the API server on 127.0.0.1 only, never to pod or Service IPs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import CLUSTER, E2E, eventually, serve_pods
from kubernetes import client, config


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    already_up = subprocess.run([str(CLUSTER), "status"], capture_output=True, check=False).returncode == 0
    proc = subprocess.run([str(CLUSTER), "up"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"e2e/cluster up failed:\n{proc.stderr}", pytrace=False)
    path = Path(proc.stdout.strip().splitlines()[-1])
    yield path
    if not already_up and os.environ.get("OCULIS_E2E_KEEP") != "1":
        subprocess.run([str(CLUSTER), "down"], check=False)


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


@pytest.fixture(scope="session")
def bin_dir(kubeconfig: Path) -> Path:
    out = subprocess.run([str(CLUSTER), "bin-dir"], capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def crds(kubeconfig: Path, bin_dir: Path) -> None:
    subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "apply", "--server-side",
                    "--force-conflicts", "-f", str(E2E.parent / "crds")], check=True, capture_output=True)
    # The Gateway API Inference Extension's InferencePool: the operator renders one per GPUUpstream where it exists.
    subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "apply", "--server-side",
                    "--force-conflicts", "-f", str(E2E / "crds-extra")], check=True, capture_output=True)
    subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "wait", "--for=condition=Established",
                    "crd/gpuupstreams.oculis.dev", "crd/inferencepools.inference.networking.k8s.io", "--timeout=30s"],
                   check=True, capture_output=True)


@pytest.fixture(scope="session")
def operator(kubeconfig: Path, crds: None, api: client.ApiClient,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from operator_fixture import OperatorProcess

    proc = OperatorProcess(kubeconfig, tmp_path_factory.mktemp("operator"))
    admission = client.AdmissionregistrationV1Api(api)

    def webhook_registered() -> bool:
        try:
            cfg = admission.read_validating_webhook_configuration("oculis.dev")
        except client.ApiException:
            return False
        return bool(cfg.webhooks) and proc.env["OCULIS_WEBHOOK_PORT"] in (cfg.webhooks[0].client_config.url or "")

    proc.start()
    proc.wait_ready(webhook_registered)
    proc.webhook_registered = webhook_registered  # type: ignore[attr-defined]
    yield proc
    proc.stop()
    # A webhook whose server is gone would block every later GPUUpstream write on this cluster.
    with contextlib.suppress(client.ApiException):
        admission.delete_validating_webhook_configuration("oculis.dev")


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # The real controller-manager creates the default ServiceAccount; pods are refused until then.
    eventually(lambda: core.read_namespaced_service_account("default", name), timeout=30)
    yield name
    core.delete_namespace(name)


@pytest.fixture
def served(namespace: str, operator: Any) -> Iterator[dict[str, Any]]:
    """The test namespace's pods served by simulated engines and scraped by Prometheus (serve_pods)."""
    with serve_pods(namespace) as files:
        yield files


