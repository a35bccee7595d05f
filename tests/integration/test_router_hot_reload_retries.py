"""Hot reload retries a rejected config (QA pass 2, finding 1): a config refused because of a file it
reads (a classifier head that lands after the config, as a second ConfigMap does) applies as soon as
that file is good, without a new write of the config; `/readyz` names the rejected file beside the
config in force and never claims it. The real router over real HTTP, against the fake upstreams."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import Server
from router_support import Fakes

from oculis_router import classify
from oculis_router import head_fit as hf
from oculis_router.app import build_app


def head_route(name: str, head: str) -> dict[str, Any]:
    return {"name": name, "classifier": {"head_path": head, "cache_ttl_seconds": 0},
            "tiers": [{"name": "a", "match": {"complexity_below": 0.5}, "upstream": "llama-8b"},
                      {"name": "b", "upstream": "llama-70b"}]}


def save_a_head(path: Path) -> None:
    head = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head
    hf.save_head(replace(head, biases=head.biases + 0.5), path)


@pytest.fixture
def served(fakes: Fakes, tmp_path: Path) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    cfg = fakes.config()
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    app = build_app(config_path=path, reload_interval=0.05, backoff=0.001)
    with Server(app) as server:
        yield path, server.url, cfg


def status_of(url: str, model: str) -> int:
    return httpx.post(url + "/v1/chat/completions",
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]}).status_code


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def test_a_config_rejected_for_a_missing_head_applies_when_the_head_lands(
        served: tuple[Path, str, dict[str, Any]], tmp_path: Path) -> None:
    path, url, cfg = served
    old = httpx.get(url + "/readyz").json()["config"]
    cfg["oculis"]["routes"].append(head_route("r2", "head2.npz"))
    path.write_text(yaml.safe_dump(cfg))
    ready = eventually(lambda: (r := httpx.get(url + "/readyz").json()).get("rejected") and r, timeout=10,
                       interval=0.05, what="/readyz to name the rejected config")
    assert ready["status"] == "ready" and ready["config"] == old  # the config in force, not the file on disk
    assert ready["rejected"]["config"] == digest(path)
    assert "routes[r2].classifier.head_path" in ready["rejected"]["reason"]
    assert status_of(url, "r2") == 404
    save_a_head(tmp_path / "head2.npz")  # the heads ConfigMap lands; the config file is not written again
    eventually(lambda: status_of(url, "r2") == 200, timeout=10, interval=0.05,
               what="the rejected config to apply once its head exists")
    ready = httpx.get(url + "/readyz").json()
    assert ready == {"status": "ready", "config": digest(path)}


def test_a_config_blocked_by_a_bad_head_applies_when_the_head_is_fixed(
        served: tuple[Path, str, dict[str, Any]], tmp_path: Path) -> None:
    path, url, cfg = served
    head = tmp_path / "head3.npz"
    head.write_bytes(b"garbage")
    cfg["oculis"]["routes"].append(head_route("r3", str(head)))
    path.write_text(yaml.safe_dump(cfg))
    eventually(lambda: "rejected" in httpx.get(url + "/readyz").json(), timeout=10, interval=0.05,
               what="the config with a garbage head to be rejected")
    save_a_head(head)
    eventually(lambda: status_of(url, "r3") == 200, timeout=10, interval=0.05,
               what="the pending config to apply once its head is fixed")
    assert "rejected" not in httpx.get(url + "/readyz").json()


def test_writing_the_config_in_force_back_clears_the_rejection(served: tuple[Path, str, dict[str, Any]]) -> None:
    path, url, cfg = served
    good = path.read_text()
    cfg["oculis"]["routes"].append(head_route("r4", "nowhere.npz"))
    path.write_text(yaml.safe_dump(cfg))
    eventually(lambda: "rejected" in httpx.get(url + "/readyz").json(), timeout=10, interval=0.05,
               what="the config to be rejected")
    path.write_text(good)
    eventually(lambda: "rejected" not in httpx.get(url + "/readyz").json(), timeout=10, interval=0.05,
               what="the rejection to clear when the file is the config in force again")


def test_wait_for_config_waits_for_a_head_instead_of_failing(fakes: Fakes, tmp_path: Path) -> None:
    """In a cluster (the chart passes --wait-for-config) the router's ConfigMap can mount before the
    heads ConfigMap: not ready until the head lands, then serving, with no restart."""
    cfg = fakes.config()
    cfg["oculis"]["routes"].append(head_route("r5", "head5.npz"))
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    app = build_app(config_path=path, reload_interval=0.05, backoff=0.001, wait_for_config=True)
    with Server(app) as server:
        r = httpx.get(server.url + "/readyz")
        assert r.status_code == 503 and "head_path" in r.json()["rejected"]["reason"]
        save_a_head(tmp_path / "head5.npz")
        eventually(lambda: httpx.get(server.url + "/readyz").status_code == 200, timeout=10, interval=0.05,
                   what="the router to be ready once the head exists")
        assert status_of(server.url, "r5") == 200
