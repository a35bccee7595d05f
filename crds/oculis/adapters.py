"""LoRA adapters of a GPUUpstream: fine-tunes served on one base engine, each a tier's model.

vLLM serves many adapters on one engine (`--enable-lora --max-loras N --max-lora-rank R
--lora-modules name=path`); a request names an adapter as its `model`. The rules here are the ones
vLLM 0.32 enforces at start (checked with its own parser: `--max-lora-rank` takes only
VLLM_LORA_RANKS, default 16; `--max-loras` default 1), so a spec it would refuse is refused at
`kubectl apply` instead. The same checks are CEL rules on the CRD (ADAPTER_CEL_RULES).
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from oculis.base import Model
from oculis.vllm_flags import flag_name

# vLLM 0.32 `--max-lora-rank` choices and defaults (vllm/config/lora.py; its parser refuses others).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
assert LoraRank.__args__ == VLLM_LORA_RANKS  # type: ignore[attr-defined]
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_MAX_LORAS = 1
MAX_ADAPTERS = 32  # bounds the CEL uniqueness check's cost; more adapters than this on one base is not planned
# An adapter name is sent as a model name and may follow `<route>/` in a request: no '/', no spaces.
ADAPTER_NAME = r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$"
NO_SLASH = ("an adapter name has no '/': requests name an adapter as <route or upstream>/<adapter>, so write the "
            "part after the '/'")


def _adapter_name(value: Any) -> Any:
    # Before the pattern, whose own message only quotes the regular expression.
    if isinstance(value, str) and not re.fullmatch(ADAPTER_NAME, value):
        raise ValueError(f"{NO_SLASH + '; it is ' if '/' in value else 'not an adapter name: use '}lowercase "
                         "letters, digits, '-', '_' and '.', starting and ending with a letter or digit, at most 63 "
                         "characters (requests send it as their model)")
    return value


# Every field naming an adapter: the GPUUpstream's declaration, a tier's choice, the router's list.
AdapterName = Annotated[str, BeforeValidator(_adapter_name), Field(
    pattern=ADAPTER_NAME, max_length=63,
    json_schema_extra={"x-kubernetes-validations": [{"rule": "!self.contains('/')", "message": NO_SLASH}]})]
# Where a ConfigMap- or PVC-sourced adapter is mounted in the engine pod: <dir>/<adapter name>.
ADAPTER_MOUNT_DIR = "/adapters"


class AdapterVolume(Model):
    """A PersistentVolumeClaim or ConfigMap holding the adapter's files (adapter_config.json and
    adapter_model.safetensors), mounted read-only into the engine pod."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", max_length=253)
    """The claim's or ConfigMap's name, in the upstream's namespace"""
    sub_path: str | None = Field(None, pattern=r"^[^/]\S*$", max_length=1024)
    """Folder inside the volume holding the adapter (unset: its root)"""


class AdapterSource(Model):
    """Where the adapter's weights come from: exactly one of huggingFace, path, pvc or configMap."""

    hugging_face: str | None = Field(None, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$",
                                     max_length=200)
    """A Hugging Face repository id (org/name), fetched by the engine"""
    path: str | None = Field(None, pattern=r"^/\S*$", max_length=1024)
    """An absolute path already in the engine container (an image layer or a volume you mount)"""
    pvc: AdapterVolume | None = None
    """A PersistentVolumeClaim of the namespace, mounted at /adapters/<name>"""
    config_map: AdapterVolume | None = None
    """A ConfigMap of the namespace (small adapters: binaryData under 1 MiB), mounted at /adapters/<name>"""

    @model_validator(mode="after")
    def _exactly_one(self) -> AdapterSource:
        fields = {"hugging_face": "huggingFace", "path": "path", "pvc": "pvc", "config_map": "configMap"}
        given = [spelled for k, spelled in fields.items() if getattr(self, k) is not None]  # as the user wrote them
        if len(given) != 1:
            raise ValueError(f"source: give exactly one of huggingFace, path, pvc or configMap (got "
                             f"{', '.join(given) or 'none'})")
        return self


SOURCE_ONE_RULE: dict[str, Any] = {
    "rule": "[has(self.huggingFace), has(self.path), has(self.pvc), has(self.configMap)]"
            ".filter(x, x).size() == 1",
    "message": "source: give exactly one of huggingFace (org/name), path (/abs/path), pvc {name} or configMap {name}",
}


class Adapter(Model):
    """One LoRA adapter the engine serves beside the base model; requests name it as their model."""

    name: AdapterName
    """The model name requests use for it (tiers name it in `adapter`)"""
    source: AdapterSource = Field(json_schema_extra={"x-kubernetes-validations": [SOURCE_ONE_RULE]})
    """Where its weights come from"""
    rank: int | None = Field(None, ge=1, le=max(VLLM_LORA_RANKS))
    """Its LoRA rank r (adapter_config.json); must be at most engine.maxLoraRank"""

    def module_path(self) -> str:
        """What `--lora-modules name=<path>` gets: the HF id, the path, or the mounted volume."""
        s = self.source
        if s.hugging_face:
            return s.hugging_face
        if s.path:
            return s.path
        vol = s.pvc or s.config_map
        assert vol is not None
        base = f"{ADAPTER_MOUNT_DIR}/{self.name}"
        return f"{base}/{vol.sub_path.strip('/')}" if vol.sub_path else base

    def mount_path(self) -> str | None:
        """Where its PVC or ConfigMap is mounted in the engine pod; None for a HF id or a path (nothing to mount)."""
        return f"{ADAPTER_MOUNT_DIR}/{self.name}" if self.source.pvc or self.source.config_map else None


def adapter_problem(adapters: list[Adapter], max_lora_rank: int | None) -> str | None:
    """Why this adapter list is refused (duplicate name, rank above maxLoraRank), or None."""
    names = [a.name for a in adapters]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return (f"spec.adapters: names must be unique, {', '.join(repr(d) for d in dupes)} is repeated; "
                "rename or remove the duplicate")
    cap = max_lora_rank or DEFAULT_MAX_LORA_RANK
    for i, a in enumerate(adapters):
        if a.rank is not None and a.rank > cap:
            return (f"spec.adapters[{i}].rank: {a.rank} ({a.name!r}) is above engine.maxLoraRank {cap}; raise "
                    f"engine.maxLoraRank to one of {', '.join(str(r) for r in VLLM_LORA_RANKS if r >= a.rank)}")
    return None


def unknown_adapter(adapter: str, upstream: str, declared: list[str], where: str) -> str:
    """The one-line refusal for a tier naming an adapter its upstream does not declare."""
    known = ", ".join(declared) if declared else "none"
    return (f"{where}: adapter {adapter!r} is not declared by upstream {upstream!r} (its adapters: {known}); "
            f"add it to the upstream's adapters or name a declared one")


UNIQUE_MESSAGE = "spec.adapters: names must be unique; rename or remove the duplicate"
RANK_MESSAGE = ("spec.adapters[].rank must be at most spec.engine.maxLoraRank (default 16); raise "
                "engine.maxLoraRank or use a lower-rank adapter")
# CEL rules on `spec`, next to the upstream's own CEL_RULES.
ADAPTER_CEL_RULES: list[dict[str, str]] = [
    {"rule": "!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
     "message": UNIQUE_MESSAGE, "fieldPath": ".adapters"},
    {"rule": "!has(self.adapters) || self.adapters.all(a, !has(a.rank) || a.rank <= "
             "(has(self.engine) && has(self.engine.maxLoraRank) ? self.engine.maxLoraRank : "
             f"{DEFAULT_MAX_LORA_RANK}))",
     "message": RANK_MESSAGE, "fieldPath": ".adapters"},
    {"rule": "self.provider == 'vllm' || !has(self.adapters) || size(self.adapters) == 0",
     "message": "spec.adapters apply only to provider vllm (the engine loads them); remove them for external "
                "providers", "fieldPath": ".adapters"},
]


LORA_FLAGS = ("--enable-lora", "--max-loras", "--max-lora-rank", "--lora-modules")  # rendered from typed fields
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # lets /v1/load_lora_adapter change adapters without a restart


def lora_args(adapters: list[Adapter], max_loras: int | None, max_lora_rank: int | None,
              runtime: bool = True) -> list[str]:
    """The `vllm serve` flags of a LoRA-enabled engine (spelled as vLLM 0.32's parser takes them). With
    `runtime` (VLLM_ALLOW_RUNTIME_LORA_UPDATING) the adapters are loaded through the engine's API
    (oculis_operator.adapter_loading), so they are not in the argv and adding or removing one restarts
    nothing; otherwise `--lora-modules` names them, with its several `name=path` arguments after it."""
    args = ["--enable-lora", f"--max-loras={max_loras or DEFAULT_MAX_LORAS}",
            f"--max-lora-rank={max_lora_rank or DEFAULT_MAX_LORA_RANK}"]
    if not runtime and adapters:
        args += ["--lora-modules", *(f"{a.name}={a.module_path()}" for a in adapters)]
    return args


API_SERVER_FLAGS = {"--api-server-count": "asc", "-asc": "asc", "--data-parallel-size-local": "dpl", "-dpl": "dpl",
                    "--data-parallel-size": "dp", "-dp": "dp"}


def api_servers_problem(extra_args: list[str]) -> str | None:
    """vLLM 0.32 refuses to start with VLLM_ALLOW_RUNTIME_LORA_UPDATING and more than one API server
    (vllm/entrypoints/cli/serve.py), whose count defaults to the local data-parallel size: why these
    extraArgs ask for more than one, or None."""
    given: dict[str, str] = {}
    for i, arg in enumerate(extra_args):
        key = API_SERVER_FLAGS.get(flag_name(arg))
        if key is None:
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (extra_args[i + 1] if i + 1 < len(extra_args) else "")
        given[key] = value
    count = given.get("asc") or given.get("dpl") or given.get("dp") or "1"
    if not count.isdigit() or int(count) <= 1:
        return None
    return (f"engine.extraArgs: {count} API servers (--api-server-count, or the data-parallel size it defaults to) "
            "cannot load LoRA adapters at runtime (vLLM refuses VLLM_ALLOW_RUNTIME_LORA_UPDATING with more than one); "
            "add --api-server-count=1 or set engine.runtimeLoraUpdating: false")


def volume_name(adapter: str) -> str:
    """The pod volume of an adapter held in a PVC or ConfigMap: named after the adapter (a hash: adapter names
    may hold '.' and '_', volume names may not), so adding or removing another adapter leaves it as it is."""
    return f"lora-{hashlib.sha256(adapter.encode()).hexdigest()[:12]}"


def adapter_volumes(adapters: list[Adapter]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pod volumes and the engine container's read-only mounts for adapters held in a PVC or ConfigMap."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for a in adapters:
        s = a.source
        if s.pvc is not None:
            volumes.append({"name": volume_name(a.name),
                            "persistentVolumeClaim": {"claimName": s.pvc.name, "readOnly": True}})
        elif s.config_map is not None:
            volumes.append({"name": volume_name(a.name), "configMap": {"name": s.config_map.name}})
        else:
            continue
        mounts.append({"name": volume_name(a.name), "mountPath": a.mount_path(), "readOnly": True})
    return volumes, mounts


class AdapterStatus(Model):
    """One declared adapter on the running engines."""

    name: str
    """The adapter"""
    ready: int
    """Ready replicas holding it (it is ready when every ready replica does)"""
    reason: str | None = None
    """Why it is not on every ready replica: the engine's answer to loading it, or what it waits for"""
