"""The classifier names the schema accepts are exactly the ones the router package ships, under the
one name the docs use (`oculis/router-small-v2`); the older id is an alias normalised to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis import Classifier, ConfigError, parse_config
from oculis.inferenceroute import InferenceRouteSpec
from oculis.router import CLASSIFIER_ALIASES, CLASSIFIER_MODEL, CLASSIFIER_MODELS
from oculis_router import classify

CONFIG = ("oculis:\n  upstreams: [{name: a, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}]\n"
          "  routes: [{name: r, classifier: {model: MODEL}, tiers: [{name: only, upstream: a}]}]\n")


def test_schema_names_match_the_packaged_heads() -> None:
    shipped = {p.name for p in classify.data_path("x").parent.glob("*.npz")}
    assert {classify.model_file(m).name for m in CLASSIFIER_MODELS} == shipped
    assert classify.DEFAULT_MODEL == CLASSIFIER_MODEL == "oculis/router-small-v2"
    assert set(CLASSIFIER_ALIASES.values()) <= set(CLASSIFIER_MODELS)


@pytest.mark.parametrize("name", ["oculis/router-small-v2", "oculis-minilm-static-v1"])
def test_the_name_and_its_alias_load_as_the_one_name(name: str) -> None:
    cfg = parse_config(CONFIG.replace("MODEL", name))
    assert cfg.route("r").classifier.model == "oculis/router-small-v2"
    assert "oculis-minilm-static-v1" not in cfg.to_yaml()  # written, shown and counted under one name
    assert Classifier(model=name).model == "oculis/router-small-v2"
    spec = InferenceRouteSpec.model_validate({"classifier": {"model": name}, "tiers": [{"name": "t", "upstream": "a"}]})
    assert spec.classifier.model == "oculis/router-small-v2"
    scorer = classify.ComplexityClassifier.packaged(name)
    assert scorer.head is classify.ComplexityClassifier.packaged(None).head


def test_an_unknown_classifier_is_refused_at_config_load_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"oculis\.routes\.0\.classifier\.model: unknown classifier 'nope'; "
                                          r"known: oculis/router-small-v2, oculis-minilm-static-v1 \(alias of "
                                          r"oculis/router-small-v2\)"):
        parse_config(CONFIG.replace("MODEL", "nope"))
    with pytest.raises(ValueError, match="unknown classifier 'nope'"):
        classify.ComplexityClassifier.packaged("nope")


def test_the_router_shows_the_one_name_in_metrics_and_models(tmp_path: Path) -> None:
    from oculis_router.metrics import Metrics
    from oculis_router.state import ConfigHolder, describe

    path = tmp_path / "oculis-config.yaml"
    path.write_text(CONFIG.replace("MODEL", "oculis-minilm-static-v1"))
    metrics = Metrics()
    holder = ConfigHolder(path, metrics)
    assert metrics.registry.get_sample_value(
        "oculis_route_classifier_info", {"route": "r", "classifier": "oculis/router-small-v2"}) == 1
    assert describe(holder.current)[0] == {"id": "r", "object": "model", "owned_by": "oculis", "kind": "route",
                                           "classifier": "oculis/router-small-v2"}
