"""hf-gate-attention: gated attention for pretrained Hugging Face models in one call.

    from hf_gate_attention import GateConfig, patch
    model = patch(model, GateConfig(variant="output", granularity="headwise", init="identity"))

The package, by room (imports flow down this list only):

- `cli`, `demo`: the command line on top of everything below.
- `recipes`: the recipes' library code (summarization fine-tuning and evaluation, the from-scratch
  pretraining study); needs the `[recipes]` extra.
- `diagnostics`: attention sinks, massive activations and gate statistics (`diagnose`), their plots, and
  a Trainer callback.
- `sharing`: save/load, the code shipped for `trust_remote_code`, the Hub, model cards.
- `kernels`: fused Triton kernels beside their PyTorch references, custom ops, the Triton backends.
- `core`: `GateConfig`, model families, the gate module, hooks, `patch`/`unpatch` (torch + transformers only).
- `files`, `formatting`, `claims`, `memory`, `offline`, `known_models`, `plotting`, `version`: shared helpers
  (atomic files and JSON, tables, the article's claims, peak memory, offline model copies and their names,
  PNGs, the version).

`import hf_gate_attention` loads only `core` and the kernels' backend registrations (Triton itself is
imported on first use); the sharing names below are imported on first use.
"""

from __future__ import annotations

import contextlib
import importlib

from .core.config import GateConfig
from .core.families import AttentionFamily, find_attention, register_family, supported_model_types
from .core.gate import AttentionGate
from .core.patching import (
    freeze_all_but_gates,
    gate_backend_of,
    gate_config_of,
    gate_parameters,
    is_patched,
    patch,
    unpatch,
)
from .core.patching import register_instance_method as _register_instance_method
from .kernels import backends as _kernel_backends  # noqa: F401 (registers "fused_gate" and "triton")
from .version import __version__ as __version__


def _save_pretrained(model, *args, **kwargs):
    """transformers' `save_pretrained` plus the gate code for `trust_remote_code` (`sharing.saving`)."""
    from .sharing.saving import save_pretrained

    return save_pretrained(model, *args, **kwargs)


def _register_recipe_cards() -> None:
    """Let model cards describe recipe results: importing the recipes registers their describers (skipped
    without the [recipes] extra; a card then takes no results)."""
    with contextlib.suppress(ImportError):
        from . import recipes  # noqa: F401


def _push_to_hub(model, *args, **kwargs):
    """Push with a model card (`sharing.hub.push_to_hub`)."""
    from .sharing.hub import push_to_hub

    _register_recipe_cards()
    return push_to_hub(model, *args, **kwargs)


# bound on every patched instance by `patch`; the sharing code is imported on first call
_register_instance_method("save_pretrained", _save_pretrained)
_register_instance_method("push_to_hub", _push_to_hub)

# public name -> module that defines it, imported on first access (PEP 562): the Hub client and the card
# renderer stay unloaded for users who only patch
_LAZY = {
    "push_to_hub": "hub",
    "render_model_card": "card",
    "write_model_card": "card",
    "from_pretrained": "loading",
    **{
        name: "layouts"
        for name in (
            "load_paper_checkpoint",
            "save_in_paper_layout",
            "qwen3_next_attention_to_ours",
            "ours_to_qwen3_next_attention",
            "save_as_qwen3_5",
            "load_qwen3_5_checkpoint",
        )
    },
    **{
        name: "adapters"
        for name in ("adapter_info", "load_gate_adapter", "push_gate_adapter_to_hub", "save_gate_adapter")
    },
    **{
        name: "loading"
        for name in (
            "AutoGatedModel",
            "AutoGatedModelForCausalLM",
            "AutoGatedModelForImageClassification",
            "AutoGatedModelForMaskedLM",
            "AutoGatedModelForQuestionAnswering",
            "AutoGatedModelForSequenceClassification",
            "AutoGatedModelForTokenClassification",
        )
    },
}

__all__ = [
    "AttentionFamily",
    "AttentionGate",
    "GateConfig",
    "freeze_all_but_gates",
    "gate_backend_of",
    "gate_config_of",
    "gate_parameters",
    "is_patched",
    "patch",
    "find_attention",
    "register_family",
    "supported_model_types",
    "unpatch",
    *sorted(_LAZY),
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _LAZY[name] in ("card", "hub"):
        _register_recipe_cards()
    value = getattr(importlib.import_module(f".sharing.{_LAZY[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
