"""The classifier names the schema accepts are exactly the ones the router package ships."""

from __future__ import annotations

from typing import get_args

import pytest

from oculis import ConfigError, parse_config
from oculis.router import ClassifierModel
from oculis_router import classify


def test_schema_names_match_the_packaged_heads() -> None:
    shipped = {p.stem for p in classify.data_path("x").parent.glob("*.npz")}
    assert set(get_args(ClassifierModel)) == shipped and classify.DEFAULT_MODEL in shipped


def test_an_unknown_classifier_is_refused_at_config_load_naming_the_field() -> None:
    text = ("oculis:\n  upstreams: [{name: a, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}]\n"
            "  routes: [{name: r, classifier: {model: nope}, tiers: [{name: only, upstream: a}]}]\n")
    with pytest.raises(ConfigError, match=r"oculis\.routes\.0\.classifier\.model: Input should be "
                                          r"'oculis-minilm-static-v1'"):
        parse_config(text)
