"""spec.modelConfigFrom: a Hugging Face config.json in a ConfigMap, read as it is, plans the upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oculis_operator import hfconfig
from oculis_operator.admission import admission_verdict
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

FIXTURES = Path(__file__).parents[2] / "fixtures" / "hf-configs"
SPEC: dict[str, Any] = {"provider": "vllm", "model": "acme/llama-70b-fp8-finetune",
                        "gpu": {"product": "H100-80GB", "count": 2}, "engine": {"maxModelLen": 16384},
                        "modelConfigFrom": {"configMapKeyRef": {"name": "llama-config"}}}


def conditions(obs: Observed) -> dict[str, dict[str, Any]]:
    out = reconcile(obs, lambda p: 8, "t")
    return {c["type"]: c for c in out.status["conditions"]} | {"_status": out.status}


def test_a_config_json_in_a_config_map_plans_a_model_outside_the_catalog() -> None:
    text = (FIXTURES / "Llama-3.3-70B-Instruct-FP8-dynamic.json").read_text()
    conds = conditions(Observed("x", "ns", "uid", 1, SPEC, {}, model_config_text=text))
    assert conds["CapacityOK"]["status"] == "True", conds["CapacityOK"]
    capacity = conds["_status"]["capacity"]
    assert capacity["kvBytesPerToken"] == 2 * 80 * 4 * 128 * 2  # 8 kv heads split over TP 2
    assert 33.7 * 2**30 < capacity["weightsBytesPerGpu"] < 34.1 * 2**30  # its quantization_config: fp8 layers


def test_a_missing_or_broken_config_map_is_refused_naming_it() -> None:
    missing = conditions(Observed("x", "ns", "uid", 1, SPEC, {}, model_config_problem="spec.modelConfigFrom: "
                                  "ConfigMap 'llama-config' not found in namespace ns"))
    assert missing["CapacityOK"]["reason"] == "ModelConfigUnavailable" and "llama-config" in missing["CapacityOK"][
        "message"]
    broken = conditions(Observed("x", "ns", "uid", 1, SPEC, {}, model_config_text="{\"hidden_size\": 8}"))
    assert broken["CapacityOK"]["reason"] == "InvalidModelConfig"
    assert "num_hidden_layers is missing" in broken["CapacityOK"]["message"] and broken["Ready"]["status"] == "False"


def test_config_map_text_reads_the_key_and_names_what_is_wrong() -> None:
    cms = {"llama-config": {"data": {"config.json": "{}"}}, "other": {"data": {"x": "1"}}}
    assert hfconfig.config_map_text(SPEC, cms.get, "ns") == ("{}", None)
    gone = {**SPEC, "modelConfigFrom": {"configMapKeyRef": {"name": "nope"}}}
    assert "not found in namespace ns" in (hfconfig.config_map_text(gone, cms.get, "ns")[1] or "")
    nokey = {**SPEC, "modelConfigFrom": {"configMapKeyRef": {"name": "other"}}}
    assert "has no key 'config.json' (it has: x)" in (hfconfig.config_map_text(nokey, cms.get, "ns")[1] or "")
    assert hfconfig.config_map_text({"model": "m"}, cms.get, "ns") == (None, None)


def test_admission_leaves_the_config_map_to_the_reconcile_but_refuses_both_sources() -> None:
    assert admission_verdict(SPEC) is None  # the webhook cannot read the ConfigMap: the status will judge it
    inline = {"paramsBillions": 8.03, "numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 8,
              "headDim": 128, "vocabSize": 128256, "maxPositionEmbeddings": 131072}
    refusal = admission_verdict({**SPEC, "modelConfig": inline})
    assert refusal is not None and "exclusive" in refusal
