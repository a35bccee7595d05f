"""An upstream's API key as the router sends it: from the environment variable its config names
(`api_key_env`, an external provider's key from router.secretEnv) or from a file (`api_key_file`, a
self-hosted engine's key from the Secret oculis-engine-keys the chart mounts). The file is re-read on
every call: kubelet rewrites a mounted Secret in place, and an upstream created after the router started
gets its key there without a restart. Keys are never logged."""

from __future__ import annotations

import os
from pathlib import Path

from oculis import Upstream
from oculis.engine_access import ENGINE_KEYS_DIR

KEYS_DIR_ENV = "OCULIS_ENGINE_KEYS_DIR"  # where a relative api_key_file is looked up (default ENGINE_KEYS_DIR)


def key_path(key_file: str) -> Path:
    path = Path(key_file)
    return path if path.is_absolute() else Path(os.environ.get(KEYS_DIR_ENV) or ENGINE_KEYS_DIR) / path


def read_key(key_env: str | None, key_file: str | None) -> str | None:
    """The key, or None when none is configured or its variable/file is unset, missing or empty."""
    if key_env:
        return os.environ.get(key_env) or None
    if key_file:
        try:
            return key_path(key_file).read_text().strip() or None
        except (OSError, UnicodeDecodeError):
            return None
    return None


def key_of(up: Upstream) -> str | None:
    return read_key(up.api_key_env, up.api_key_file)


def missing_key(up: Upstream) -> str | None:
    """Why `up` cannot be called: its API key is named but not there for the router. Said as the router's
    fault (not relayed as the provider's 401), so the next tier can answer."""
    if up.api_key_env and not os.environ.get(up.api_key_env):
        return (f"{up.name}: its API key variable {up.api_key_env} is not set in the router's environment "
                "(in a cluster: router.secretEnv in the chart)")
    if up.api_key_file and key_of(up) is None:
        return (f"{up.name}: its API key file {key_path(up.api_key_file)} is missing or empty (in a cluster: the "
                "Secret oculis-engine-keys mounted by the chart; the operator writes the key before the engine "
                "starts, and kubelet refreshes the mount within about a minute)")
    return None
