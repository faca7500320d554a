"""Dispatch of patched models to the fused Triton kernels (`patch(..., backend="triton")`).

For the `output` and `qk` gates the model's attention implementation is switched, on that instance only, to
`hf_gate_attention_triton`: a transformers attention function (registered under our own name, next to `sdpa`
and `flash_attention_2`) that runs flash attention with the block's gate in the epilogue. The `value` gate,
and attention coming from another backend, use the fused sigmoid-gate-multiply kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.config import GateConfig
from ..core.hooks import BLOCK_PATCHES

ATTN_IMPLEMENTATION = "hf_gate_attention_triton"
UNSUPPORTED_ATTENTION_OPTIONS = ("sliding_window", "attn_logit_softcapping")


def _unavailable_reason(config: GateConfig, model_config, head_dim: int, dtype: torch.dtype) -> str | None:
    """Why the fused kernels cannot serve this model, or `None` if they can."""
    try:
        from . import check_supported, triton_available
    except ImportError as error:
        return f"Triton cannot be imported ({error})"
    available, reason = triton_available()
    if not available:
        return reason
    try:
        check_supported(head_dim, dtype)
    except ValueError as error:
        return str(error)
    if config.variant != "value":
        for option in UNSUPPORTED_ATTENTION_OPTIONS:
            if getattr(model_config, option, None):
                return f"the fused attention kernel does not support {option} (set in this model's config)"
    return None


def resolve_backend(
    backend: str, config: GateConfig, model_config, head_dim: int, weight: torch.Tensor
) -> str:
    """`"torch"` or `"triton"` for `backend` in `("auto", "torch", "triton")` on this model; `"triton"` that
    cannot run raises `ValueError`."""
    if backend == "torch":
        return "torch"
    reason = _unavailable_reason(config, model_config, head_dim, weight.dtype)
    if backend == "triton" and reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}. Fallback: backend='torch'")
    return "triton" if reason is None and (backend == "triton" or weight.is_cuda) else "torch"


def register_attention_implementation() -> None:
    """Make `hf_gate_attention_triton` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, fused_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, flash_attention_mask)  # (B, S) key padding or None


def fused_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """Attention function of patched models: query (B, H, L, D), key/value (B, KV, S, D) -> (B, L, H, D)."""
    from . import gated_flash_attention

    if dropout > 0:
        raise ValueError(
            f"the fused Triton attention has no attention dropout (got p={dropout}); set the model's "
            "attention dropout to 0 or patch with backend='torch'"
        )
    block_patch = BLOCK_PATCHES.get(module)
    logits, keep, scale = (None, None, 1.0) if block_patch is None else block_patch.take_gate_logits()
    out = gated_flash_attention(
        query,
        key,
        value,
        gate_logits=logits,
        gate_scale=scale,
        keep=keep,
        causal=bool(getattr(module, "is_causal", False)),
        key_padding_mask=None if attention_mask is None else attention_mask.bool(),
        sm_scale=scaling,
    )
    return out, None


def fused_gate_multiply(values: torch.Tensor, logits: torch.Tensor, scale: float, keep) -> torch.Tensor:
    """`values: (..., G*D)` times `scale * sigmoid(logits: (..., G, w)) * keep` in one fused kernel."""
    from . import sigmoid_gate_multiply

    heads = values.unflatten(-1, (logits.shape[-2], -1))  # (..., G, D)
    return sigmoid_gate_multiply(heads, logits, scale, keep).flatten(-2)
