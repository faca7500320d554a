"""`patch` / `unpatch`: add gates to the self-attention blocks of one model instance, reversibly.

The hooks themselves live in `hooks.py`; this module picks the family and the backend, and restores the
model on `unpatch`.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MethodType

from torch import nn

from . import fused, hub, remote_code
from .config import GateConfig
from .families import family_for
from .gate import AttentionGate
from .hooks import (
    CONFIG_ATTRIBUTE,
    GATE_MODULE_NAME,
    PATCHES_ATTRIBUTE,
    add_gates,
    attention_layout,
    find_attention_blocks,
    unwrap_model,
)

__all__ = ["CONFIG_ATTRIBUTE", "GATE_MODULE_NAME", "find_attention_blocks", "unwrap_model"]
_PREVIOUS_ATTN_ATTRIBUTE = "_gate_attention_previous_attn_implementation"
# instance methods replaced on a patched model (removed by unpatch): saving writes the gate code too, pushing
# also writes the model card
_INSTANCE_METHODS = {"save_pretrained": remote_code.save_pretrained, "push_to_hub": hub.push_to_hub}


def patch(
    model: nn.Module, config: GateConfig | None = None, *, train_gates_only: bool = False, **overrides
) -> nn.Module:
    """Add a gate to the self-attention blocks of `model`, in place; returns `model`.

    Args:
        model: a transformers model (bare, with a task head, or wrapped by PEFT) whose `config.model_type` is
            registered (see `supported_model_types`).
        config: the gate to add; defaults to `GateConfig()`. `overrides` (e.g. `variant="qk"`) replace fields.
        train_gates_only: freeze every parameter except the new gates.
    """
    config = (config or GateConfig()).replace(**overrides) if overrides else (config or GateConfig())
    base = unwrap_model(model)
    if is_patched(base):
        raise ValueError("this model is already patched with gated attention; call unpatch(model) first")
    family = family_for(base.config.model_type)
    layout = attention_layout(base, config, family)
    first_block, first_geometry = next(iter(layout.values()))
    query_weight = first_block.get_submodule(family.query).weight
    backend = fused.resolve_backend(config, base.config, first_geometry["head_dim"], query_weight)
    add_gates(base, config, family, layout, fused if backend == "triton" else None)
    for name, method in _INSTANCE_METHODS.items():
        setattr(base, name, MethodType(method, base))
    if backend == "triton" and config.variant != "value":
        fused.register_attention_implementation()
        setattr(base, _PREVIOUS_ATTN_ATTRIBUTE, base.config._attn_implementation)
        base.set_attn_implementation(fused.ATTN_IMPLEMENTATION)
    if train_gates_only:
        for param in model.parameters():
            param.requires_grad_(False)
        for param in gate_parameters(model):
            param.requires_grad_(True)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Remove every gate and hook added by `patch`: module structure, state_dict and outputs are restored."""
    base = unwrap_model(model)
    if not is_patched(base):
        raise ValueError("this model is not patched with gated attention")
    for block_patch in getattr(base, PATCHES_ATTRIBUTE):
        block_patch.remove()
        delattr(block_patch.block, GATE_MODULE_NAME)
    delattr(base, PATCHES_ATTRIBUTE)
    for name in _INSTANCE_METHODS:
        base.__dict__.pop(name, None)
    if hasattr(base, _PREVIOUS_ATTN_ATTRIBUTE):
        base.set_attn_implementation(getattr(base, _PREVIOUS_ATTN_ATTRIBUTE))
        delattr(base, _PREVIOUS_ATTN_ATTRIBUTE)
    if hasattr(base.config, CONFIG_ATTRIBUTE):
        delattr(base.config, CONFIG_ATTRIBUTE)
    return model


def is_patched(model: nn.Module) -> bool:
    return hasattr(unwrap_model(model), PATCHES_ATTRIBUTE)


def gate_config_of(model: nn.Module) -> GateConfig:
    """The `GateConfig` a patched model was patched with."""
    if not is_patched(model):
        raise ValueError("this model is not patched with gated attention")
    return GateConfig.from_dict(getattr(unwrap_model(model).config, CONFIG_ATTRIBUTE))


def gate_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The parameters added by `patch` (also the trainable copies PEFT makes with `modules_to_save`)."""
    seen = set()
    for module in model.modules():
        if isinstance(module, AttentionGate):
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param
