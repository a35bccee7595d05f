"""`oculis serve --server-settings` ($OCULIS_SERVER_SETTINGS, the chart's router.batch and router.flowControl):
the sections it names replace the config's (which the operator renders without), on every load; bad JSON or a
bad field is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from oculis import parse_config
from oculis_router.metrics import Metrics
from oculis_router.state import ConfigHolder, server_settings, with_server_settings

CONFIG = {"upstreams": [{"name": "ok", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
          "routes": [{"name": "r", "tiers": [{"name": "a", "upstream": "ok"}]}]}


def test_named_sections_replace_the_configs_and_camel_or_snake_case_both_read() -> None:
    config = parse_config(yaml.safe_dump({"oculis": {**CONFIG, "server": {"max_messages": 7}}}), "t")
    sections = server_settings(json.dumps({"batch": {"enabled": True, "maxRequestsPerBatch": 10},
                                           "flow_control": {"enabled": True, "seatsPerReplica": 3}}))
    s = with_server_settings(config, sections).server
    assert s.batch.enabled and s.batch.max_requests_per_batch == 10
    assert s.flow_control.enabled and s.flow_control.seats_per_replica == 3
    assert s.max_messages == 7  # a section not named stays
    assert with_server_settings(config, None) is config


@pytest.mark.parametrize(("raw", "said"), [
    ("{batch: yes}", "not JSON"),
    ("[1]", "list given"),
    ('{"batch": {"concurrency": 0}}', "server.batch.concurrency"),
    ('{"flowControl": {"queueTtlSeconds": -1}}', "server.flowControl.queueTtlSeconds"),
    ('{"nope": 1}', "server.nope"),
])
def test_bad_settings_are_one_line_naming_the_field(raw: str, said: str) -> None:
    with pytest.raises(ValueError) as e:
        server_settings(raw)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_every_load_gets_them(tmp_path: Path) -> None:
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump({"oculis": CONFIG}))
    holder = ConfigHolder(path, Metrics(), server={"batch": {"enabled": True}})
    assert holder.current.config.server.batch.enabled
