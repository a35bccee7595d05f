from typing import Any

from oculis import crdgen


def test_generated_crds_are_up_to_date() -> None:
    assert crdgen.main(["--check"]) == 0, "run `python -m oculis.crdgen` and commit the result"


def test_crd_is_structural_and_carries_cel_and_columns() -> None:
    crd = crdgen.gpuupstream_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert "$ref" not in str(schema) and "anyOf" not in str(schema)
    assert spec["properties"]["engine"]["properties"]["gpuMemoryUtilization"] == {
        "type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1,
        "description": "Share of each GPU's memory for vLLM"}
    assert any("maxNumBatchedTokens >= self.engine.maxNumSeqs" in r["rule"] for r in spec["x-kubernetes-validations"])
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "PROVIDER", "MODEL", "GPU", "REPLICAS", "DESIRED", "READY-REPLICAS", "READY", "REASON", "KV-TOKENS",
        "OBSERVED-KV", "MAX-CONC", "CANARY", "ADAPTERS", "AGE"]
    assert crd["spec"]["names"]["shortNames"] == ["gu"] and crd["spec"]["names"]["categories"] == ["oculis"]


def test_every_field_is_described_for_kubectl_explain() -> None:
    undescribed = []

    def walk(node: dict[str, Any], path: str) -> None:
        for name, prop in (node.get("properties") or {}).items():
            if not prop.get("description") and path + name not in ("GPUUpstream.metadata", "InferenceRoute.metadata"):
                undescribed.append(path + name)
            walk(prop, f"{path}{name}.")
            if "items" in prop:
                walk(prop["items"], f"{path}{name}[].")

    for crd in (crdgen.gpuupstream_crd(), crdgen.inferenceroute_crd()):
        walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], crd["spec"]["names"]["kind"] + ".")
    assert undescribed == []  # a new field needs a docstring or Field(description=...)
