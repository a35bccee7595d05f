"""Runtime LoRA loading, the pure core (adapter_loading): desired adapters x what each ready pod's engine
lists -> load/unload actions, what the pods hold after them, per-adapter readiness and the status the
reconcile writes (status.adapters, the ADAPTERS column, AdaptersReady and its Warning)."""

from __future__ import annotations

from typing import Any

from oculis_operator import adapter_loading as al
from oculis_operator import reconcile, reconcile_io

SQL = al.Want("sql", "org/sql-lora")
STYLE = al.Want("style", "/adapters/style/s", mount="/adapters/style")
NOT_FOUND = "Loading lora bad failed: No adapter found for /nope (HTTP 404)"


def pod(name: str, loaded: dict[str, str] | None, mounts: tuple[str, ...] = (), problem: str | None = None) -> al.Pod:
    return al.Pod(name, loaded, problem, frozenset(mounts))


def test_each_pod_gets_what_it_lacks_and_loses_what_is_not_declared() -> None:
    pods = [pod("a", {}), pod("b", {"sql": "org/sql-lora", "old": "/old"})]
    actions = al.plan([SQL], pods, {}, now=0)
    assert actions == [al.Action("a", "load", "sql", "org/sql-lora"), al.Action("b", "unload", "old")]
    assert actions[0].body() == {"lora_name": "sql", "lora_path": "org/sql-lora"}
    assert actions[1].body() == {"lora_name": "old"}
    held = al.after(pods, [(a, None) for a in actions])
    assert [p.loaded for p in held] == [{"sql": "org/sql-lora"}, {"sql": "org/sql-lora"}]
    assert al.plan([SQL], held, {}, now=1) == []  # settled: nothing more to ask


def test_a_source_that_moved_is_reloaded_in_place_under_the_same_name() -> None:
    actions = al.plan([SQL], [pod("a", {"sql": "org/sql-lora-v1"})], {}, now=0)
    assert actions == [al.Action("a", "load", "sql", "org/sql-lora", inplace=True)]
    assert actions[0].body()["load_inplace"] is True


def test_without_runtime_updating_nothing_is_asked() -> None:
    assert al.plan([SQL], [pod("a", {"old": "/x"})], {}, now=0, runtime=False) == []


def test_an_unreadable_pod_is_left_alone_and_counts_as_not_holding() -> None:
    pods = [pod("a", None, problem="engine not reachable: refused"), pod("b", {})]
    assert al.plan([SQL], pods, {}, now=0) == [al.Action("b", "load", "sql", "org/sql-lora")]
    rep = al.report([SQL], al.after(pods, [(al.Action("b", "load", "sql", "org/sql-lora"), None)]), {})
    assert rep.adapters[0].ready == 1 and rep.adapters[0].pods == 2 and not rep.adapters[0].ok
    assert "pod a: engine not reachable: refused" in (rep.adapters[0].reason or "")


def test_a_volume_adapter_waits_for_pods_that_mount_it() -> None:
    pods = [pod("old", {}), pod("new", {}, mounts=("/adapters/style",))]
    assert al.plan([STYLE], pods, {}, now=0) == [al.Action("new", "load", "style", "/adapters/style/s")]
    held = al.after(pods, [(al.Action("new", "load", "style", "/adapters/style/s"), None)])
    r = al.report([STYLE], held, {}).adapters[0]
    assert (r.ready, r.pods, r.ok) == (1, 2, False)
    assert "needs a pod restart to mount it; not mounted on old" in (r.reason or "")


def test_a_refused_load_is_remembered_retried_after_a_while_and_forgotten_once_loaded() -> None:
    bad = al.Want("bad", "/nope")
    pods = [pod("a", {}), pod("b", {})]
    first = al.plan([SQL, bad], pods, {}, now=100)
    done = [(a, NOT_FOUND if a.adapter == "bad" else None) for a in first]
    held = al.after(pods, done)
    failures = al.record({}, done, held, now=100, wants=[SQL, bad])
    assert set(failures) == {("a", "bad"), ("b", "bad")}
    # The other adapter is loaded everywhere; the refused one is not asked again before RETRY_S ...
    assert al.plan([SQL, bad], held, failures, now=100 + al.RETRY_S - 1) == []
    again = al.plan([SQL, bad], held, failures, now=100 + al.RETRY_S)
    assert [a.adapter for a in again] == ["bad", "bad"]
    # ... but at once when its source changes.
    fixed = al.Want("bad", "/fixed")
    assert len(al.plan([SQL, fixed], held, failures, now=101)) == 2
    rep = al.report([SQL, bad], held, failures)
    sql, refused = rep.adapters
    assert sql.ok and not refused.ok and refused.failed
    assert refused.reason == f"the engine refused to load it from /nope on pod a (and 1 other pod(s)): {NOT_FOUND}"
    loaded = al.after(held, [(al.Action("a", "load", "bad", "/nope"), None)])
    assert set(al.record(failures, [(al.Action("a", "load", "bad", "/nope"), None)], loaded, now=200,
                         wants=[SQL, bad])) == {("b", "bad")}
    assert set(al.record(failures, [], [pod("a", {})], 200, [SQL, bad])) == {("a", "bad")}  # pod b gone: its too
    assert al.record(failures, [], held, 200, [SQL]) == {}  # no longer declared
    assert al.record(failures, [], held, 200, [SQL, fixed]) == {}  # declared from another source


def test_status_counts_an_adapter_ready_only_on_every_ready_pod() -> None:
    rep = al.report([SQL, STYLE], [pod("a", {"sql": "org/sql-lora"}), pod("b", {"sql": "org/sql-lora"})], {})
    entries, summary, cond, warning = al.status_of(["sql", "style"], rep)
    assert summary == "1/2" and warning is None
    assert entries[0] == {"name": "sql", "ready": 2}
    assert entries[1]["ready"] == 0 and "mount" in entries[1]["reason"]
    assert cond[:2] == ("False", "Loading")
    # An adapter added to the spec after the last look: not ready yet, no error.
    entries, summary, cond, _ = al.status_of(["sql", "new"], al.report([SQL], [pod("a", {"sql": "org/sql-lora"})], {}))
    assert summary == "1/2" and entries[1] == {"name": "new", "ready": 0, "reason": "loading"} and cond[1] == "Loading"
    all_ready = al.report([SQL], [pod("a", {"sql": "org/sql-lora"})], {})
    assert al.status_of(["sql"], all_ready)[1:] == ("1/1", ("True", "AllLoaded", "1 adapter(s) on all 1 ready "
                                                            "replica(s)"), None)
    assert al.status_of([], all_ready)[1:3] == ("0/0", ("True", "NoAdapters", "no adapter declared; the engine "
                                                        "serves LoRA when one is"))
    none_ready = al.status_of(["sql"], al.report([SQL], [], {}))
    assert none_ready[1] == "0/1" and none_ready[2][1] == "NoReadyReplicas"


def test_a_refused_adapter_is_a_condition_and_a_warning_naming_it_and_the_engines_words() -> None:
    bad = al.Want("bad", "/nope")
    failures = {("a", "bad"): al.Failure("/nope", NOT_FOUND, 0)}
    rep = al.report([SQL, bad], [pod("a", {"sql": "org/sql-lora"})], failures)
    _, summary, cond, warning = al.status_of(["sql", "bad"], rep)
    assert summary == "1/2" and cond[:2] == ("False", "AdapterLoadFailed")
    assert "adapter 'bad'" in cond[2] and NOT_FOUND in cond[2] and "the other 1 adapter(s) serve" in cond[2]
    assert warning == ("AdapterLoadFailed", cond[2])


VLLM: dict[str, Any] = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 1,
                        "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxLoras": 2}}


def _reconcile(spec: dict[str, Any], adapters: al.Report | None, status: dict[str, Any] | None = None,
               ) -> reconcile_io.Outcome:
    first = reconcile.reconcile(reconcile_io.Observed("llama", "demo", "uid", 1, spec, status or {}),
                                lambda _: 8, "2026-01-01T00:00:00Z")
    dep = first.create[0]
    dep["status"] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
                     "observedGeneration": 1}
    dep["metadata"]["generation"] = 1
    obs = reconcile_io.Observed("llama", "demo", "uid", 1, spec, {**first.status, **(status or {})}, deployment=dep,
                             adapters=adapters)
    return reconcile.reconcile(obs, lambda _: 8, "2026-01-01T00:00:10Z")


def test_the_reconcile_writes_status_adapters_and_keeps_ready_when_an_adapter_is_refused() -> None:
    spec = {**VLLM, "adapters": [{"name": "sql", "source": {"huggingFace": "org/sql-lora"}},
                                 {"name": "bad", "source": {"path": "/nope"}}]}
    rep = al.report([SQL, al.Want("bad", "/nope")], [pod("p", {"sql": "org/sql-lora"})],
                    {("p", "bad"): al.Failure("/nope", NOT_FOUND, 0)})
    out = _reconcile(spec, rep)
    assert out.deployment_patch is None and not out.create  # nothing rolls for an adapter error
    assert out.status["adaptersReady"] == "1/2"
    assert out.status["adapters"][0] == {"name": "sql", "ready": 1}
    conds = {c["type"]: c for c in out.status["conditions"]}
    assert conds["Ready"]["status"] == "True"  # the base model and the other adapter serve
    assert conds["AdaptersReady"]["status"] == "False" and conds["AdaptersReady"]["reason"] == "AdapterLoadFailed"
    assert [r for r, _ in out.warnings] == ["AdapterLoadFailed"]


def test_turning_lora_off_clears_the_adapter_status() -> None:
    before = {"adapters": [{"name": "sql", "ready": 1}], "adaptersReady": "1/1",
              "conditions": [{"type": "AdaptersReady", "status": "True", "reason": "AllLoaded", "message": ""}]}
    out = _reconcile({k: v for k, v in VLLM.items() if k != "engine"}, None, before)
    assert out.status["adapters"] is None and out.status["adaptersReady"] is None
    assert {c["type"]: c for c in out.status["conditions"]}["AdaptersReady"]["reason"] == "NoAdapters"


def test_a_roll_for_a_volume_adapter_says_why() -> None:
    hub = {"name": "sql", "source": {"huggingFace": "org/sql-lora"}}
    pvc = {"name": "style", "source": {"pvc": {"name": "loras"}}}
    first = _reconcile({**VLLM, "adapters": [hub]}, None)
    assert first.deployment_patch is None
    dep = reconcile.reconcile(reconcile_io.Observed("llama", "demo", "uid", 1, {**VLLM, "adapters": [hub]}, {}),
                              lambda _: 8, "2026-01-01T00:00:00Z").create[0]
    dep["status"] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    out = reconcile.reconcile(reconcile_io.Observed("llama", "demo", "uid", 2, {**VLLM, "adapters": [hub, pvc]},
                                                 first.status, deployment=dep), lambda _: 8, "2026-01-01T00:00:20Z")
    assert out.deployment_patch is not None  # a new volume: the pods roll
    assert "only new pods can mount or drop its volume" in out.log[0] and "only new pods" in out.status["rollout"]
