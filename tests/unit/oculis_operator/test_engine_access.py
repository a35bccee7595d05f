"""The pure parts of engine access: the NetworkPolicy of a GPUUpstream's pods, the key Secret's create and
patch bodies (a key generated once, never replaced), the engine's env and startup probe, the router entry's
key reference, and the chart's setting parsed with one-line errors."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import engine_access, engine_args, render
from oculis_operator.upstream_entry import upstream_entry

VLLM = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": {"product": "H100-80GB"}}
PEERS = engine_access.Peers.model_validate({
    "router": {"namespace": "oculis", "labels": {"app.kubernetes.io/component": "router"}},
    "operator": {"namespace": "oculis", "labels": {"app.kubernetes.io/component": "operator"}},
    "monitoringNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
    "extraFrom": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]})


def spec(**extra: Any) -> GPUUpstreamSpec:
    return GPUUpstreamSpec.model_validate({**VLLM, **extra})


def test_the_policy_selects_the_upstreams_pods_and_lets_in_only_the_peers_on_the_engine_port() -> None:
    np = engine_access.network_policy("llama", "demo", "uid-1", spec(), PEERS)
    assert np["metadata"]["name"] == "llama-vllm" and np["metadata"]["namespace"] == "demo"
    assert np["metadata"]["ownerReferences"] == [render.owner_ref("llama", "uid-1")]
    selector = np["spec"]["podSelector"]["matchLabels"]
    stable = render.pod_template("llama", spec(), engine_args.build(spec(), {}), 0)["metadata"]["labels"]
    canary = {**stable, **render.canary_selector("llama")}
    assert all(stable[k] == v and canary[k] == v for k, v in selector.items())  # both tracks
    assert np["spec"]["policyTypes"] == ["Ingress"]
    engine, scrape = np["spec"]["ingress"]
    assert engine["ports"] == scrape["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert engine["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "oculis"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/component": "router"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "oculis"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}},
        {"ipBlock": {"cidr": "192.0.2.0/24"}}]
    assert scrape["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_kv_events_open_their_port_to_the_router_only_and_no_monitoring_means_no_scrape_rule() -> None:
    peers = PEERS.model_copy(update={"monitoring_namespace_labels": None})
    np = engine_access.network_policy("llama", "demo", "u", spec(routing={"picker": "kv-events"}), peers)
    engine, kv = np["spec"]["ingress"]
    assert kv["ports"] == [{"protocol": "TCP", "port": 5557}] and kv["from"] == engine["from"][:1]


def test_the_policy_is_written_when_missing_or_changed_only() -> None:
    np = engine_access.network_policy("llama", "demo", "u", spec(), PEERS)
    assert engine_access.policy_write(np, None) == "create"
    assert engine_access.policy_write(np, json.loads(json.dumps(np))) is None
    edited = {**np, "spec": {**np["spec"], "ingress": [{}]}}
    assert engine_access.policy_write(np, edited) == "patch"


def test_a_key_is_generated_once_and_each_keyed_upstream_owns_the_secret() -> None:
    secret = engine_access.keys_secret("demo", "llama", "uid-1", "k1")
    assert secret["metadata"]["name"] == "oculis-engine-keys" and secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["llama"]).decode() == "k1"
    owner = secret["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-1" and owner["controller"] is False  # shared: no single controller
    assert engine_access.key_patch(secret, "llama", "uid-1", "k2") is None  # kept, never regenerated
    other = engine_access.key_patch(secret, "qwen", "uid-2", "k3")
    assert other is not None and base64.b64decode(other["data"]["qwen"]).decode() == "k3"
    assert [o["uid"] for o in other["metadata"]["ownerReferences"]] == ["uid-2"]  # merged by uid
    # Recreated upstream of the same name (a new uid): owner added, its key kept (engines still hold it).
    again = engine_access.key_patch(secret, "llama", "uid-9", "k4")
    assert again == {"metadata": {"ownerReferences": [{**owner, "uid": "uid-9"}]}}
    assert engine_access.key_from(secret, "llama") == "k1" and engine_access.key_from(secret, "qwen") is None
    assert engine_access.key_from(None, "llama") is None


def test_the_engine_reads_its_key_from_the_secret_and_the_probe_sends_it() -> None:
    keyed = render.pod_template("llama", spec(), engine_args.build(spec(), {}), 0)["spec"]["containers"][0]
    assert keyed["env"] == [{"name": "VLLM_API_KEY",
                             "valueFrom": {"secretKeyRef": {"name": "oculis-engine-keys", "key": "llama"}}}]
    script = keyed["startupProbe"]["exec"]["command"][2]
    assert "os.environ['VLLM_API_KEY']" in script and "Authorization" in script
    compile(script.replace(";", "\n"), "probe", "exec")  # valid Python
    off = spec(access={"apiKey": False})
    open_ = render.pod_template("llama", off, engine_args.build(off, {}), 0)["spec"]["containers"][0]
    assert "env" not in open_ and "Authorization" not in open_["startupProbe"]["exec"]["command"][2]
    assert all("api-key" not in a for a in engine_args.build(spec(), {}))  # never in the argv


def test_the_router_entry_names_the_key_file_and_external_providers_keep_their_env() -> None:
    def entry(s: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return upstream_entry({"metadata": {"name": "llama", "namespace": "demo", "generation": 1}, "spec": s,
                               "status": {"servedModel": "llama"}})

    keyed, secret = entry(VLLM)
    assert keyed["api_key_file"] == "llama" and "api_key_env" not in keyed and secret is None
    assert "api_key_file" not in entry({**VLLM, "access": {"apiKey": False}})[0]
    ext, ref = entry({"provider": "openai", "model": "gpt-4o", "apiKeySecretRef": {"name": "openai"}})
    assert "api_key_file" not in ext and ext["api_key_env"] == ref["env"]


def test_access_is_for_self_hosted_upstreams_only() -> None:
    with pytest.raises(ValueError, match=r"spec\.access applies only to provider vllm"):
        GPUUpstreamSpec.model_validate({"provider": "openai", "model": "gpt-4o", "access": {"apiKey": False}})
    assert spec().engine_api_key and not spec(access={"apiKey": False}).engine_api_key


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "OCULIS_NETWORK_POLICY: "),
    ('{"router": {"namespace": "x", "labels": {}}, "operator": {"namespace": "x", "labels": {"a": "b"}}}',
     "router.labels"),
    ('{"operator": {"namespace": "x", "labels": {"a": "b"}}}', "router"),
])
def test_a_bad_chart_setting_is_one_line_naming_it(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        engine_access.parse_peers(text)
    assert fragment in str(err.value) and "\n" not in str(err.value) and "networkPolicy" in str(err.value)
    assert engine_access.parse_peers("") is None and engine_access.parse_peers(None) is None
