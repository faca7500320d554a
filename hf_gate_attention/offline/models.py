"""The offline models by name: `OFFLINE_MODELS` (short name -> converter) and `resolve_model`, which stands
a local copy in for a Hub id when the Hub cannot serve it."""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from ..files import require_hub_id_or_existing_path
from ..known_models import HUB_ALIASES, OFFLINE_MODEL_NAMES
from .dinov2 import dinov2_small_path
from .minilm import minilm_path
from .smollm2 import smollm2_path

OFFLINE_MODELS: dict[str, Callable[[], Path]] = dict(
    zip(OFFLINE_MODEL_NAMES, (minilm_path, smollm2_path, dinov2_small_path), strict=True)
)


def _hub_offline() -> bool:
    """The Hub's own offline flag (`HF_HUB_OFFLINE`/`TRANSFORMERS_OFFLINE`), or huggingface.co unreachable."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode() or not _hub_reachable()


@functools.lru_cache(maxsize=1)
def _hub_reachable(timeout_s: float = 3.0) -> bool:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _in_hf_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def resolve_model(name_or_path: str) -> str:
    """Local folder for an offline model's short name (or Hub id when offline); else the argument unchanged.

    Existing local paths are returned unchanged. See ``OFFLINE_MODELS`` and ``HUB_ALIASES``.
    """
    if os.path.exists(name_or_path):
        return name_or_path
    require_hub_id_or_existing_path(name_or_path, "model")
    if name_or_path in OFFLINE_MODELS:
        return str(OFFLINE_MODELS[name_or_path]())
    if name_or_path in HUB_ALIASES and not _in_hf_cache(name_or_path) and _hub_offline():
        return str(OFFLINE_MODELS[HUB_ALIASES[name_or_path]]())
    return name_or_path
