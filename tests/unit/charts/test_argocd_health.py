"""The Argo CD health checks (charts/oculis/argocd/oculis.dev/<Kind>/health.lua), run as Argo CD runs
them: Lua 5.1 (gopher-lua's dialect), with only the libraries argocd-cm gives a script without
`useOpenLibs` (base, table, package, os; no string, no math), on every case of each kind's
health_test.yaml, compared exactly as argo-cd's util/lua/health_test.go compares them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from skips import DEV_FIX, removable

lupa = pytest.importorskip("lupa.lua51", reason=removable("lupa not installed", DEV_FIX).render())

ROOT = Path(__file__).resolve().parents[3]
ARGOCD = ROOT / "charts" / "oculis" / "argocd" / "oculis.dev"
KINDS = ("GPUUpstream", "InferenceRoute")
STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}


def health(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    lua = lupa.LuaRuntime(register_eval=False)
    g = lua.globals()
    for lib in ("string", "math", "io", "debug"):  # not opened for argocd-cm scripts
        g[lib] = None
    g.obj = lua.table_from(json.loads(json.dumps(obj)), recursive=True)
    out = lua.execute((ARGOCD / kind / "health.lua").read_text())
    return {k: out[k] for k in ("status", "message") if out[k] is not None}


def cases() -> list[tuple[str, dict[str, Any]]]:
    return [(kind, case) for kind in KINDS
            for case in yaml.safe_load((ARGOCD / kind / "health_test.yaml").read_text())["tests"]]


@pytest.mark.parametrize(("kind", "case"), cases(), ids=lambda c: c if isinstance(c, str) else c["inputPath"])
def test_every_health_test_case_holds_in_lua_5_1(kind: str, case: dict[str, Any]) -> None:
    obj = yaml.safe_load((ARGOCD / kind / case["inputPath"]).read_text())
    assert obj["kind"] == kind
    assert health(kind, obj) == case["healthStatus"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_fixture_is_a_case_and_every_status_is_argos(kind: str) -> None:
    tests = yaml.safe_load((ARGOCD / kind / "health_test.yaml").read_text())["tests"]
    listed = {t["inputPath"] for t in tests}
    assert listed == {f"testdata/{p.name}" for p in (ARGOCD / kind / "testdata").glob("*.yaml")}
    assert {t["healthStatus"]["status"] for t in tests} <= STATUSES
    # Healthy, Progressing, Degraded and Suspended each come from a status the operator wrote.
    assert {t["healthStatus"]["status"] for t in tests} >= {"Healthy", "Progressing", "Degraded", "Suspended"}


def with_status(kind: str, generation: int, observed: int | None, conds: list[dict[str, Any]]) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conds}
    if observed is not None:
        status["observedGeneration"] = observed
    return {"apiVersion": "oculis.dev/v1alpha1", "kind": kind, "metadata": {"name": "x", "generation": generation},
            "spec": {}, "status": status}


def cond(type_: str, status: str, reason: str = "R", message: str = "", gen: int = 2) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "observedGeneration": gen}


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_status_never_reads_healthy(kind: str) -> None:
    ready = [cond("Ready", "True", message="ok", gen=1)]
    assert health(kind, with_status(kind, 2, 1, ready))["status"] == "Progressing"
    # The status says generation 2 but its Ready condition is older: still not Healthy.
    assert health(kind, with_status(kind, 2, 2, ready))["status"] == "Progressing"
    assert health(kind, with_status(kind, 2, 2, [cond("Ready", "True", message="ok")])) == {
        "status": "Healthy", "message": "ok"}
    no_status = {"apiVersion": "oculis.dev/v1alpha1", "kind": kind, "metadata": {"name": "x", "generation": 1}}
    assert health(kind, no_status)["status"] == "Progressing"


@pytest.mark.parametrize("kind", KINDS)
def test_degraded_wins_then_suspended_then_progressing(kind: str) -> None:
    both = [cond("Ready", "False", "ScaledToZero", "zero"), cond("Degraded", "True", "X", "broken"),
            cond("Progressing", "True", "Y", "moving")]
    assert health(kind, with_status(kind, 2, 2, both)) == {"status": "Degraded", "message": "broken"}
    assert health(kind, with_status(kind, 2, 2, both[:1] + both[2:])) == {"status": "Suspended", "message": "zero"}
    moving = [cond("Ready", "True", message="ok"), cond("Progressing", "True", "Y", "moving")]
    assert health(kind, with_status(kind, 2, 2, moving)) == {"status": "Progressing", "message": "moving"}


def test_the_readme_argocd_cm_snippet_carries_the_scripts_verbatim() -> None:
    readme = (ROOT / "charts" / "oculis" / "README.md").read_text()
    block = re.search(r"```yaml\n(apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm.*?)```", readme, re.S)
    assert block, "charts/oculis/README.md has no argocd-cm ConfigMap block"
    data = yaml.safe_load(block.group(1))["data"]
    for kind in KINDS:
        assert data[f"resource.customizations.health.oculis.dev_{kind}"] == (ARGOCD / kind / "health.lua").read_text()
    assert not any(k.startswith("resource.customizations.useOpenLibs") for k in data)  # none needed
