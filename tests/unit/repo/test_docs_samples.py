"""The documentation's code samples work as written: every sample of the "Throughput & Cost" page
(tests/fixtures/docs_page/, kept verbatim; only the upstreams its routes name are added) and every
code block of README.md (Python run, YAML loaded, `oculis` command lines parsed by the real parser).
Documentation that drifts from the code is worse than none."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from oculis import Route, RouterConfig, parse_config
from oculis.router import CLASSIFIER_MODEL
from oculis.upstream import GPUUpstreamSpec
from oculis_cli.main import build_parser
from oculis_cli.main import main as oculis_main

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "tests" / "fixtures" / "docs_page"
README = ROOT / "README.md"
COMPLETION = yaml.safe_load((PAGE / "_completion.yaml").read_text())


def completed(sample: str) -> RouterConfig:
    """A page config sample through the router's own loader, with the upstreams its routes name
    (when the sample declares none)."""
    doc = yaml.safe_load((PAGE / sample).read_text())
    doc["oculis"].setdefault("upstreams", COMPLETION["upstreams"])
    return parse_config(yaml.safe_dump(doc), sample)


def page_python_routes() -> list[Route]:
    namespace: dict[str, Any] = {"__name__": "routing"}
    exec(compile((PAGE / "routing.py").read_text(), str(PAGE / "routing.py"), "exec"), namespace)
    return [v for v in namespace.values() if isinstance(v, Route)]


def test_the_page_python_routing_sample_runs_and_serves() -> None:
    routes = page_python_routes()
    assert [r.name for r in routes] == ["adaptive"]
    config = RouterConfig(upstreams=COMPLETION["upstreams"], routes=routes)
    assert parse_config(config.to_yaml()) == config
    route = config.route("adaptive")
    assert route.classifier.model == CLASSIFIER_MODEL == "oculis/router-small-v2"
    simple, complex_ = route.tiers
    assert (simple.match.complexity_below, simple.match.max_prompt_tokens) == (0.35, 2000)
    assert complex_.match.complexity_below is None and complex_.match.max_prompt_tokens is None

    from oculis_router.app import build_app
    from oculis_router.decide import RouteScorer

    build_app(config=config)  # the router takes it as it is
    _, decision = RouteScorer(route).score({"prompt": "What is 2 + 2?"})
    assert decision.tier.name in ("simple", "complex")


def test_the_page_python_and_yaml_samples_are_the_same_route() -> None:
    """The page shows one route twice: in Python (flat tier keywords) and in oculis-config.yaml
    (`match:`). Both spellings build the same object and write the same YAML."""
    (from_python,) = page_python_routes()
    from_yaml = completed("oculis-config.yaml").route("adaptive")
    assert from_python == from_yaml
    py = RouterConfig(upstreams=COMPLETION["upstreams"], routes=[from_python]).to_yaml()
    assert py == RouterConfig(upstreams=COMPLETION["upstreams"], routes=[from_yaml]).to_yaml()


def test_the_page_prompt_caching_sample_loads() -> None:
    config = completed("prompt-caching.yaml")
    openai, anthropic = config.upstreams
    assert openai.prompt_cache is not None and openai.prompt_cache.min_prefix_tokens == 1024
    assert anthropic.provider == "anthropic" and anthropic.prompt_cache is not None
    assert anthropic.prompt_cache.ttl == "5m"


@pytest.mark.parametrize("sample", ["batching.yaml", "speculative.yaml"])
def test_the_page_engine_blocks_load_as_a_gpuupstream_engine(sample: str) -> None:
    """`preemption_mode: recompute` keeps loading whatever flags the engine's vLLM version drops
    (the operator renders the flag only where the version has it)."""
    block = yaml.safe_load((PAGE / sample).read_text())
    spec = GPUUpstreamSpec.model_validate({**COMPLETION["gpuupstream_spec"], **block})
    assert spec.engine is not None
    if sample == "batching.yaml":
        assert spec.engine.preemption_mode == "recompute" and spec.engine.max_num_seqs == 256
    else:
        assert spec.engine.speculative is not None and spec.engine.speculative.auto_disable


def test_the_page_response_cache_route_loads() -> None:
    route = completed("response-cache.yaml").route("faq")
    assert route.cache.enabled and route.cache.key == ["model", "messages", "temperature"]


def cli_lines(text: str) -> list[str]:
    """`oculis ...` command lines of a shell text: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [line.split(" #", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line.startswith("oculis ")]


def parses(line: str) -> None:
    """Parsed by the `oculis` parser; usage brackets (`[-o json]`) count as given."""
    argv = shlex.split(re.sub(r"\s\[(-[^\]]*)\]", r" \1", line))[1:]
    args = build_parser().parse_args(argv)
    if args.command == "sim":  # the simulator's own parser reads the rest
        from oculis_sim.cli import build_parser as sim_parser

        sim_parser().parse_args(args.sim_args)


def test_the_page_cli_lines_parse_and_capacity_plan_runs() -> None:
    lines = cli_lines((PAGE / "commands.sh").read_text())
    assert len(lines) == 5
    for line in lines:
        parses(line)
    plan = next(line for line in lines if line.startswith("oculis capacity plan"))
    assert oculis_main(shlex.split(plan)[1:]) in (0, 3)  # fits, or does not: a verdict, not bad input


def blocks(kind: str) -> list[str]:
    """README.md's fenced blocks of one kind ('' for an unlabelled fence), fences paired in order."""
    found, open_kind, body = [], None, []
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            if open_kind is None:
                open_kind, body = line[3:].strip(), []
                continue
            if open_kind == kind:
                found.append("\n".join(body) + "\n")
            open_kind = None
        elif open_kind is not None:
            body.append(line)
    return found


def test_python_blocks_in_the_readme_run() -> None:
    found = blocks("python")
    assert found, "the README should show the Python API"
    for block in found:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_yaml_blocks_in_the_readme_load() -> None:
    for block in blocks("yaml"):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and "oculis" in doc:
            parse_config(block, "README.md")
        elif isinstance(doc, dict) and doc.get("kind") == "GPUUpstream":
            GPUUpstreamSpec.model_validate(doc["spec"])


# README command lines that abbreviate with "..." (the rest as the line before): not runnable as written.
ABBREVIATED = re.compile(r"\s\.\.\.(\s|$)")


def test_the_readme_cli_lines_parse() -> None:
    text = "\n".join(blocks("bash") + blocks("") + blocks("sh") + blocks("console"))
    lines = cli_lines(text)
    runnable = [line for line in lines if not ABBREVIATED.search(line)]
    assert len(runnable) >= 4 and len(lines) - len(runnable) <= 1, lines
    for line in runnable:
        parses(line)
