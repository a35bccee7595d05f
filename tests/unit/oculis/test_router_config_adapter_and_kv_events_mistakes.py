"""Router-config mistakes a new user made with this round's fields (QA pass 3), each refused when the
config loads, in one line naming the field, the value and the fix: before, `adapters` on an external
provider and a repeated adapter loaded (the adapter's name would reach OpenAI as a model), the GPUUpstream's
adapter objects pasted into the router config read "Input should be a valid string", and a `kv_events`
address without its ZMQ transport loaded and later read as an engine that publishes nothing."""

from __future__ import annotations

import pytest

from oculis import Upstream
from oculis.router import ConfigError, parse_config
from oculis.router_upstream import Endpoint


def config(upstream: str) -> str:
    return f"oculis:\n  upstreams:\n    - {upstream}\n  routes: []\n"


VLLM = 'name: llama, provider: vllm, model: m, base_url: "http://127.0.0.1:8000/v1"'


@pytest.mark.parametrize(("upstream", "words"), [
    ("{name: gpt, provider: openai, model: gpt-4o, adapters: [sql]}",
     ["upstream 'gpt'", "provider openai", "remove adapters"]),
    ("{name: claude, provider: anthropic, model: c, adapters: [sql]}", ["provider anthropic", "remove adapters"]),
    ("{" + VLLM + ", adapters: [sql, ext, sql]}", ["adapters lists 'sql' more than once", "list each adapter once"]),
    ("{" + VLLM + ", adapters: [{name: sql, source: {path: /a}, rank: 8}]}",
     ["adapters[0]", "is an object", "e.g. adapters: [sql]"]),
    ('{name: llama, provider: vllm, model: m, picker: kv-events, endpoints: [{url: "http://127.0.0.1:8000/v1", '
     'kv_events: "127.0.0.1:5557"}]}', ["endpoints[0].kv_events", "'127.0.0.1:5557'", "tcp://10.0.0.7:5557"]),
], ids=["adapters on openai", "adapters on anthropic", "adapter twice", "gpuupstream adapter object",
        "kv_events without transport"])
def test_router_config_mistakes_are_one_line_naming_field_value_and_fix(upstream: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(config(upstream), "c.yaml")
    msg = str(exc.value)
    assert msg.count("oculis.upstreams.0") == 1 and all(w in msg for w in words), msg


def test_what_the_rules_leave_alone_still_loads() -> None:
    ok = parse_config(config("{" + VLLM + ", adapters: [sql, ext]}"))
    assert ok.upstreams[0].adapters == ["sql", "ext"]
    compat = parse_config(config('{name: c, provider: openai-compatible, model: m, base_url: "http://h/v1", '
                                 'adapters: [sql]}'))  # a vLLM behind another gateway still names its adapters
    assert compat.upstreams[0].adapters == ["sql"]
    for address in ("tcp://127.0.0.1:5557", "ipc:///tmp/kv.sock"):
        assert Endpoint(url="http://127.0.0.1:8000/v1", kv_events=address).kv_events == address
    with pytest.raises(ValueError, match="is not a ZMQ address"):
        Endpoint(url="http://127.0.0.1:8000/v1", kv_events="localhost:5557")  # the Python API checks it too
    with pytest.raises(ValueError, match="remove adapters"):
        Upstream(name="gpt", provider="openai", model="gpt-4o", adapters=["sql"])


def test_an_adapter_source_naming_two_places_names_them_as_written() -> None:
    """`source: {path: /a, huggingFace: org/x}` said "(got hugging_face, path)": the Python field name."""
    from oculis.adapters import AdapterSource

    with pytest.raises(ValueError, match=r"give exactly one of huggingFace, path, pvc or configMap \(got "
                                         r"huggingFace, path\)"):
        AdapterSource.model_validate({"path": "/a", "huggingFace": "org/x"})
