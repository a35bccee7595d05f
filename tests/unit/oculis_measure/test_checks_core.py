"""`oculis status --check-deps`: facts -> PASS / WARN / FAIL lines with their fix; exit 1 only for a
failed required check."""

from __future__ import annotations

import json
from typing import Any

import pytest

from oculis.crdgen import gpuupstream_crd
from oculis_cli.main import main
from oculis_measure.checks import core as c


def test_only_a_failed_required_check_fails_the_command() -> None:
    assert not c.failed([c.Check("s", "n", c.WARN, "d"), c.Check("s", "n", c.SKIP, "d", required=False)])
    assert not c.failed([c.Check("s", "n", c.FAIL, "d", required=False)])
    assert c.failed([c.Check("s", "n", c.FAIL, "d")])


@pytest.mark.parametrize(("kubeconfig", "error", "status"), [(None, None, c.SKIP), ("k", "refused", c.FAIL),
                                                             ("k", None, c.PASS)])
def test_cluster_reachability(kubeconfig: str | None, error: str | None, status: str) -> None:
    assert c.cluster_check(kubeconfig, error, "https://127.0.0.1:6443").status == status


def test_crds_must_serve_this_version_with_this_schema() -> None:
    want = gpuupstream_crd()
    assert c.crd_check("g", None, want).status == c.FAIL
    assert c.crd_check("g", want, want).status == c.PASS
    other: dict[str, Any] = json.loads(json.dumps(want))
    other["spec"]["versions"][0]["schema"] = {"openAPIV3Schema": {"type": "object"}}
    assert c.crd_check("g", other, want).status == c.WARN
    other["spec"]["versions"][0]["name"] = "v0"
    bad = c.crd_check("g", other, want)
    assert bad.status == c.FAIL and "does not serve v1alpha1" in bad.detail and "kubectl apply" in bad.fix


@pytest.mark.parametrize(("ready", "pods", "reconciled", "stale", "status"), [
    (1, 1, 0, [], c.PASS),
    (0, 0, 3, [], c.PASS),  # an operator outside the cluster that keeps every object reconciled
    (0, 1, 0, [], c.FAIL),
    (0, 0, 2, ["GPUUpstream/x"], c.FAIL),
    (0, 0, 0, [], c.FAIL),
])
def test_operator_running(ready: int, pods: int, reconciled: int, stale: list[str], status: str) -> None:
    assert c.operator_check(ready, pods, reconciled, stale).status == status


def test_webhook_is_optional_but_must_have_hooks_when_present() -> None:
    assert c.webhook_check(None).status == c.SKIP and not c.webhook_check(None).required
    assert c.webhook_check({"webhooks": []}).status == c.FAIL
    assert c.webhook_check({"webhooks": [{"name": "x"}]}).status == c.PASS


def test_prometheus_must_scrape_routers_and_engines_of_self_hosted_upstreams() -> None:
    assert [x.status for x in c.prometheus_checks(None, None, 0, 0, 0)] == [c.WARN]
    assert [x.status for x in c.prometheus_checks("u", "unreachable", 0, 0, 0)] == [c.FAIL]
    assert [x.status for x in c.prometheus_checks("u", None, 5, 0, 0)] == [c.PASS, c.PASS]
    assert [x.status for x in c.prometheus_checks("u", None, 5, 0, 2)] == [c.PASS, c.PASS, c.FAIL]
    assert [x.status for x in c.prometheus_checks("u", None, 0, 3, 2)] == [c.PASS, c.FAIL, c.PASS]
    found = c.prometheus_checks("u", None, 0, 0, 2, required=False)  # on the default address, not asked for
    assert [x.status for x in found] == [c.PASS, c.WARN, c.WARN] and not c.failed(found)


def test_pricing_baseline_speculation_and_permissions() -> None:
    warn = c.pricing_check({"llama": ["adaptive"]})
    assert warn.status == c.WARN and "llama (route adaptive)" in warn.detail
    assert c.pricing_check({}).status == c.PASS
    assert c.baseline_check(None, None).status == c.WARN
    assert c.baseline_check("b.json", "not JSON").status == c.FAIL
    spec = c.speculative_checks([c.SpecFacts("a", True, "fits"),
                                 c.SpecFacts("b", None, "vocab 32000 vs 128256", "TokenizerMismatch")])
    assert [x.status for x in spec] == [c.PASS, c.FAIL] and "same tokenizer" in spec[1].fix
    perms = c.permission_checks("ns", [c.Access("patch", "apps/deployments", True),
                                       c.Access("patch", "oculis.dev/gpuupstreams", False, "no RBAC")])
    assert [x.status for x in perms] == [c.PASS, c.FAIL] and "grant patch" in perms[1].fix


def test_check_deps_json_lists_every_section(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Any) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no kubeconfig: the cluster checks are skipped, not failed
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("OCULIS_PROMETHEUS_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert main(["status", "--check-deps", "-o", "json"]) == 1  # an explicit Prometheus that is down fails
    rep = json.loads(capsys.readouterr().out)
    names = {x["name"]: x["status"] for x in rep["checks"]}
    assert names["cluster reachable"] == c.SKIP and names["Prometheus reachable"] == c.FAIL
    assert names["extra core"] == c.PASS and not rep["ok"]


def test_what_this_kubeconfig_may_not_read_is_a_warning_not_a_failure() -> None:
    class Forbidden(Exception):
        status, reason = 403, "Forbidden"

    line = c.unreadable("cluster", "CRD x", "customresourcedefinitions/x", Forbidden())
    assert line.status == c.WARN and not line.required and "forbidden" in line.detail
    assert not c.failed([line])


def test_a_baseline_must_be_a_saved_benchmark(tmp_path: Any) -> None:
    from oculis_cli.checks import baseline_line

    good = tmp_path / "b.json"
    good.write_text(json.dumps({"current": {}, "workload": "f"}))
    vllm = tmp_path / "v.json"
    vllm.write_text(json.dumps({"request_throughput": 3.2}))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"hello": 1}))
    assert baseline_line(str(good)).status == c.PASS and baseline_line(str(vllm)).status == c.PASS
    assert baseline_line(str(other)).status == c.FAIL and "bench run --save" in baseline_line(str(other)).detail
    assert baseline_line(str(tmp_path / "missing.json")).status == c.FAIL
