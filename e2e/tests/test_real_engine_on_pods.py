"""A rollout of a real engine's settings, seen by the real Prometheus: an engine pod annotated for the pod
stand-in runs real vLLM on CPU (tests/realengine) with the operator's rendered flags; turning prefix caching
off rolls the pod, and what Prometheus scrapes from the engine changes with it (cache_config_info of the
new pod says enable_prefix_caching False, the old pod's series go stale)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import eventually
from kubernetes import client
from test_gpuupstream import World, upstream

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "realengine"))
import realvllm
from skip_causes import parse
from skips import needs_command, skip_or_fail

from oculis_operator.promquery import prometheus_result

pytestmark = [pytest.mark.realengine, needs_command("prometheus", "prometheus")]
REAL = {"oculis.dev/e2e-real-vllm": "true"}
ENGINE_START_S = 600  # a real engine start on a busy 2-core machine, plus the stand-in's poll


@pytest.fixture
def engine_lock() -> Iterator[None]:
    if problem := realvllm.venv_problem(realvllm.venv_dir()):
        skip_or_fail(parse(problem))
    realvllm.tiny_model(realvllm.venv_dir())  # built before the stand-in needs it
    with realvllm.engine_lock():
        yield


def test_rolling_a_real_engines_settings_changes_what_prometheus_scrapes(
        engine_lock: None, api: client.ApiClient, namespace: str, operator: Any, served: dict[str, Any]) -> None:
    world, url = World(api, namespace), served["prometheus"]
    world.create(upstream("real", replicas=1, podAnnotations=REAL,
                          rollout={"strategy": "Manual", "maxSurge": 0, "maxUnavailable": 1},
                          engine={"maxModelLen": 8192, "maxNumSeqs": 8, "maxNumBatchedTokens": 4096}))

    def scraped(caching: str) -> dict[str, str] | None:
        rows = prometheus_result(url, f'vllm:cache_config_info{{namespace="{namespace}",pod=~"real-vllm-.+",'
                                      f'enable_prefix_caching="{caching}"}}') or []
        return rows[0]["metric"] if rows else None

    first = eventually(lambda: scraped("True"), timeout=ENGINE_START_S, interval=2,
                       what=f"the real engine's cache_config_info in Prometheus (logs: {served['logs']})")
    assert first["block_size"] == "128" and first["engine"] == "0"  # vLLM 0.32 on CPU, not the simulator
    world.custom.patch_namespaced_custom_object("oculis.dev", "v1alpha1", namespace, "gpuupstreams", "real",
                                                {"spec": {"engine": {"prefixCaching": False}}})
    second = eventually(lambda: scraped("False"), timeout=ENGINE_START_S, interval=2,
                        what="the rolled engine's cache_config_info (prefix caching off)")
    assert second["pod"] != first["pod"]
    # The old pod's engine is gone: its series go stale, only the new one answers `up`.
    eventually(lambda: not scraped("True"), timeout=120, interval=2, what="the old engine's series to go stale")
