"""LoRA adapters on real vLLM 0.32 on CPU (issue 26), and `oculis sim serve` held to it.

One engine for the module (the tier's "lora" configuration: --enable-lora --max-loras 1 --max-lora-rank 8,
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, one static adapter from --lora-modules) serving adapters built at
test time (tinyadapter.py). One ordered sequence of requests: serve the static adapter (greedy, its answer
differs from the base model's), load a second at run time and serve it, the engine's refusals (loaded
twice, the base model's name, missing fields, a folder with no adapter, a rank above the maximum), list,
unload, unload again, and a request for the unloaded adapter. The simulator, started with the engine's own
argv and the engine's LoRA environment, gets the same sequence and must answer with the same status codes,
JSON shapes, error type/param/code and wording, text bodies and metric families; LORA_DELIBERATE lists the
only differences allowed. Then the router in front of the engine with an adapter tier, called at its base
URL and as a replica (`endpoints:`, whose /v1/models the router reads).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import realvllm
import sim_conformance as conf
import yaml
from e2e_support import eventually
from fake_upstreams import Server
from sim_conformance import Probe
from sim_support import start_sim, stop

from oculis_router.app import build_app

BASE = realvllm.SERVED_NAME
PROMPT = "def main():"
FAR = "/nonexistent/oculis-adapters/far"  # an absolute path no machine here has

# Where the simulator answers differently from vLLM on purpose (probe -> why); nothing else may differ.
# None today. (Not probed: an adapter_config.json missing r/lora_alpha/target_modules, vLLM's 500, which the
# simulator accepts, and the success text's Content-Type, none from vLLM, text/plain from the simulator.)
LORA_DELIBERATE: dict[str, str] = {}
# The engine's environment the simulator gets too: runtime loading on, and no hub (a hub id is not found).
LORA_ENV = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "HF_HUB_OFFLINE")


def _comp(model: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw}


def _chat(model: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "SELECT what?"}], "max_tokens": 4,
            "ignore_eos": True, **kw}


def lora_probes(adapters: dict[str, Path]) -> tuple[Probe, ...]:
    """The sequence, in order (each step sees the state the previous ones left)."""
    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    style = str(adapters["style"])
    return (
        Probe("models at start", "/v1/models", method="GET"),
        Probe("base greedy", "/v1/completions", _comp(BASE)),
        Probe("sql greedy", "/v1/completions", _comp("sql")),
        Probe("sql chat", "/v1/chat/completions", _chat("sql")),
        Probe("load style", load, {"lora_name": "style", "lora_path": style}),
        Probe("load style again", load, {"lora_name": "style", "lora_path": style}),
        Probe("load style in place", load, {"lora_name": "style", "lora_path": style, "load_inplace": True}),
        Probe("load the base model's name", load, {"lora_name": BASE, "lora_path": style}),
        Probe("load without a path", load, {"lora_name": "x"}),
        Probe("load without anything", load, {}),
        Probe("load an empty name", load, {"lora_name": "", "lora_path": style}),
        Probe("load a number as the name", load, {"lora_name": 7, "lora_path": style}),
        Probe("load not JSON", load, "{nope"),
        Probe("load a list", load, [1, 2]),
        Probe("load as text/plain", load, {"lora_name": "x", "lora_path": style},
              headers={"content-type": "text/plain"}),
        Probe("load a folder without an adapter", load, {"lora_name": "ghost", "lora_path": str(adapters["empty"])}),
        Probe("load a rank above the maximum", load, {"lora_name": "wide", "lora_path": str(adapters["wide"])}),
        Probe("style greedy", "/v1/completions", _comp("style")),
        Probe("style chat stream", "/v1/chat/completions", _chat("style", stream=True,
                                                                 stream_options={"include_usage": True})),
        Probe("models with style", "/v1/models", method="GET"),
        Probe("unload style", unload, {"lora_name": "style"}),
        Probe("unload style again", unload, {"lora_name": "style"}),
        Probe("unload without a name", unload, {}),
        Probe("unload an empty name", unload, {"lora_name": ""}),
        Probe("style after unload", "/v1/completions", _comp("style")),
        Probe("style chat after unload", "/v1/chat/completions", _chat("style")),
        Probe("models after unload", "/v1/models", method="GET"),
        Probe("sql after the refusals", "/v1/completions", _comp("sql")),
        Probe("load a path not on this machine", load, {"lora_name": "far", "lora_path": FAR}),
        Probe("load a hub id", load, {"lora_name": "hub", "lora_path": "oculis-tests/no-such-lora"}),
    )


@pytest.fixture(scope="module")
def lora(engines: Any, tiny_adapters: dict[str, Path]) -> realvllm.Engine:
    engine: realvllm.Engine = engines.get("lora", "--lora-modules", f"sql={tiny_adapters['sql']}")
    return engine


@pytest.fixture(scope="module")
def real(lora: realvllm.Engine, engines: Any, tiny_adapters: dict[str, Path],
         tier_stats: dict[str, str]) -> tuple[dict[str, conf.Observed], str]:
    """The sequence sent once to the real engine, then its /metrics (and a figure: a runtime load's time)."""
    observed = conf.capture(lora.url, lora_probes(tiny_adapters))
    metrics = lora.metrics()
    t0 = time.monotonic()
    reload = httpx.post(f"{lora.url}/v1/load_lora_adapter", timeout=120,
                        json={"lora_name": "style", "lora_path": str(tiny_adapters["style"])})
    took = time.monotonic() - t0
    assert reload.status_code == 200, reload.text
    assert httpx.post(f"{lora.url}/v1/unload_lora_adapter", json={"lora_name": "style"}).status_code == 200
    tier_stats["lora-load"] = f"engine 'lora': /v1/load_lora_adapter (rank 8) answered in {took * 1000:.0f} ms"
    engines.note_rss()
    return observed, metrics


@pytest.fixture(scope="module")
def sim(lora: realvllm.Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The simulator with the engine's own argv (model folder, --enable-lora, --max-loras, --max-lora-rank,
    --lora-modules) plus --gpu, and the engine's LoRA environment."""
    with pytest.MonkeyPatch.context() as env:
        for name in LORA_ENV:
            env.setenv(name, lora.env[name])
        proc, base = start_sim(*lora.argv[2:], "--gpu", "H100-80GB",
                               log=tmp_path_factory.mktemp("sim") / "sim.log", timeout=60)
    yield base
    stop(proc)


def test_the_engine_loads_serves_and_unloads_adapters(real: tuple[dict[str, conf.Observed], str],
                                                      tiny_adapters: dict[str, Path]) -> None:
    o = real[0]

    def ids(probe: str) -> dict[str, Any]:
        return {m["id"]: m for m in o[probe].data["data"]}

    assert list(ids("models at start")) == [BASE, "sql"]
    assert ids("models at start")["sql"]["parent"] == BASE
    assert ids("models at start")["sql"]["root"] == str(tiny_adapters["sql"])
    # The static adapter is applied: greedy answers differ from the base model's, answered as "sql".
    base, sql = o["base greedy"], o["sql greedy"]
    assert base.status == sql.status == 200 and sql.data["model"] == "sql"
    assert sql.data["choices"][0]["text"] != base.data["choices"][0]["text"], (base.data, sql.data)
    assert o["sql chat"].status == 200 and o["sql chat"].data["model"] == "sql"
    # Loaded at run time, served, listed with its parent; refusals in vLLM's words.
    assert (o["load style"].status, o["load style"].data) == (200, "Success: LoRA adapter 'style' added successfully.")
    assert o["load style again"].status == 400 and o["load style again"].data["error"]["type"] == "InvalidUserInput"
    assert o["load style in place"].status == 200
    assert o["load the base model's name"].status == 400
    for probe in ("load without a path", "load without anything", "load not JSON", "load a list",
                  "load as text/plain"):
        assert o[probe].status == 400 and o[probe].data["error"]["type"] == "Bad Request", (probe, o[probe].data)
    ghost = o["load a folder without an adapter"]
    assert (ghost.status, ghost.data["error"]["type"]) == (404, "NotFoundError"), ghost.data
    assert ghost.data["error"]["message"].startswith("Loading lora ghost failed: No adapter found for ")
    wide = o["load a rank above the maximum"]
    assert wide.status >= 400 and "greater than max_lora_rank 8" in wide.data["error"]["message"], wide.data
    assert o["style greedy"].status == 200 and o["style greedy"].data["model"] == "style"
    assert o["style greedy"].data["choices"][0]["text"] != sql.data["choices"][0]["text"]
    assert {e["model"] for e in o["style chat stream"].data if isinstance(e, dict)} == {"style"}
    assert ids("models with style")["style"]["parent"] == BASE and "wide" not in ids("models with style")
    # Unloaded: gone from the list; a request for it is vLLM's unknown-model 404.
    assert (o["unload style"].status, o["unload style"].data) == (200, "Success: LoRA adapter 'style' removed "
                                                                       "successfully.")
    again = o["unload style again"]
    assert (again.status, again.data["error"]["type"]) == (404, "NotFoundError")
    for probe in ("style after unload", "style chat after unload"):
        gone = o[probe]
        assert gone.status == 404, gone.data
        assert gone.data["error"] == {"message": f"The model `style` does not exist. Valid aliases: {BASE}.",
                                      "type": "NotFoundError", "param": "model", "code": 404}
    assert list(ids("models after unload")) == [BASE, "sql"]
    # The refusals left the engine serving its adapter.
    assert o["sql after the refusals"].status == 200
    assert o["sql after the refusals"].data["choices"][0]["text"] == sql.data["choices"][0]["text"]
    for probe in ("load a path not on this machine", "load a hub id"):
        far = o[probe]
        assert (far.status, far.data["error"]["type"]) == (404, "NotFoundError"), (probe, far.data)
        assert far.data["error"]["message"].startswith("Loading lora "), far.data


def test_lora_requests_info_has_vllms_labels(real: tuple[dict[str, conf.Observed], str]) -> None:
    fam = conf.families(real[1])["vllm:lora_requests_info"]
    assert fam.type == "gauge"
    assert fam.labels == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
    assert 'max_lora="1"' in real[1] and 'running_lora_adapters="style"' in real[1]


def test_the_simulator_answers_the_sequence_as_vllm(real: tuple[dict[str, conf.Observed], str], sim: str,
                                                    tiny_adapters: dict[str, Path]) -> None:
    got = conf.capture(sim, lora_probes(tiny_adapters))
    compared = {k: v for k, v in real[0].items() if k not in LORA_DELIBERATE}
    problems = conf.differences(compared, got)
    for probe in [p for p in ("models at start", "models with style", "models after unload")]:
        keep = ("id", "object", "root", "parent", "max_model_len")
        r = [{k: m[k] for k in keep} for m in real[0][probe].data["data"]]
        s = [{k: m[k] for k in keep} for m in got[probe].data["data"]]
        if r != s:
            problems.append(f"{probe}: vLLM {r} vs simulator {s}")
    assert not problems, "\n".join(problems)


def test_the_simulators_metric_families_match(real: tuple[dict[str, conf.Observed], str], sim: str,
                                              tiny_adapters: dict[str, Path]) -> None:
    problems = conf.metric_differences(real[1], httpx.get(f"{sim}/metrics").text)
    assert not problems, "\n".join(problems)


def test_the_router_sends_an_adapter_tier_to_the_engine(lora: realvllm.Engine, tiny_adapters: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """A tier {upstream, adapter} reaches vLLM with the adapter as the model; `<upstream>/<adapter>` too; an
    adapter the upstream does not declare is the router's 404 naming the declared ones. A declared adapter
    the engine does not hold (style: loaded and unloaded above, or never): called at the base URL, the
    engine's 404 relayed; as a replica, the router reads the engine's /v1/models and says 503
    adapter_not_loaded (retry after 5 s) instead."""
    plain = {"escalation": {"enabled": False}, "cache": {"enabled": False}}
    cfg = tmp_path / "oculis-config.yaml"
    tiny = {"name": "tiny", "provider": "vllm", "base_url": f"{lora.url}/v1", "model": BASE,
            "adapters": ["sql", "style"]}
    replicas = {**{k: v for k, v in tiny.items() if k != "base_url"}, "name": "replicas",
                "endpoints": [f"{lora.url}/v1"]}
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [tiny, replicas],
        "routes": [{"name": "sql-tier", "tiers": [{"name": "sql", "upstream": "tiny", "adapter": "sql"}], **plain},
                   {"name": "base", "tiers": [{"name": "only", "upstream": "tiny"}], **plain}]}}))
    with Server(build_app(config_path=cfg, reload_interval=0.5, backoff=0.001)) as router:
        def ask(model: str) -> httpx.Response:
            return httpx.post(f"{router.url}/v1/completions", json=_comp(model), timeout=120)

        tier, direct, base, engine = ask("sql-tier"), ask("tiny/sql"), ask("base"), \
            httpx.post(f"{lora.url}/v1/completions", json=_comp("sql"), timeout=120)
        assert tier.status_code == 200, tier.text
        assert tier.json()["model"] == "sql" and tier.headers["x-oculis-adapter"] == "sql"
        assert tier.headers["x-oculis-tier"] == "sql"
        assert direct.status_code == 200 and direct.json()["model"] == "sql"
        # Greedy: the router's adapter answers are the engine's own for the adapter, not the base model's.
        text = engine.json()["choices"][0]["text"]
        assert tier.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"] == text
        assert base.json()["model"] == BASE and base.json()["choices"][0]["text"] != text
        assert "x-oculis-adapter" not in base.headers
        unknown = ask("tiny/billing")
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"]["param"] == "model"
        assert "its adapters: sql, style" in unknown.json()["error"]["message"]
        not_held = ask("tiny/style")
        assert not_held.status_code == 404, not_held.text
        assert not_held.json()["error"] == {"message": f"The model `style` does not exist. Valid aliases: {BASE}.",
                                            "type": "NotFoundError", "param": "model", "code": 404}
        # As a replica: the router lists the engine's adapters from its /v1/models (entries with a parent).
        on_replica = ask("replicas/sql")
        assert on_replica.status_code == 200 and on_replica.json()["choices"][0]["text"] == text
        assert on_replica.headers["x-oculis-replica"] == f"{lora.url}/v1"
        missing = eventually(lambda: (r := ask("replicas/style")).status_code == 503 and r, timeout=30,
                             what="the router has read the engine's /v1/models")
        assert missing.json()["error"]["code"] == "adapter_not_loaded" and missing.headers["retry-after"] == "5"
