"""Dropped units that still read a few keys: the masked reference of `GateConfig.top_k_sink/top_k_window`.

With either set, a head (or key/value group) that top-k drops for a query does not give 0: it attends to the
first `top_k_sink` and the last `top_k_window` of the keys that query may see (its row of the causal, padding
or sliding-window mask), like DuoAttention's streaming heads, and its output is gated like a kept head's.
"The keys it may see" follows the mask, so left padding (the sink is the first real tokens) and a partly
filled static cache (the window ends at the query's own position) need nothing special.

This module is the readable reference (backend `torch` with `sparse=False`, and on CUDA): every head attends
twice, once to all its keys and once to the streaming ones, and each query row takes the first where it keeps
the head. `sparse.py` computes the same while reading only what is kept (at decode, a dropped group reads its
sink and window keys only). Needs only torch and transformers: it ships as remote code with `hooks.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from .gate import apply_gate
from .hooks import BLOCK_PATCHES

ATTN_IMPLEMENTATION = "hf_gate_attention_streaming"


def register_attention_implementation() -> None:
    """Make `hf_gate_attention_streaming` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, streaming_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def is_causal(module: nn.Module, kwargs: dict, query_length: int) -> bool:
    """Whether transformers' SDPA attention would run this call causally (pops `is_causal` from kwargs)."""
    causal = kwargs.pop("is_causal", None)
    causal = getattr(module, "is_causal", True) if causal is None else causal
    return bool(causal) and query_length > 1


def allowed_keys(attention_mask, query_length: int, key_length: int, causal: bool, device) -> torch.Tensor:
    """The keys each query may see, bool `(B or 1, 1, L, S)`, from transformers' SDPA mask (bool, or additive
    float), or without one from `causal` (query `i` is position `S - L + i`)."""
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            return attention_mask
        return attention_mask > torch.finfo(attention_mask.dtype).min / 2
    if not causal:
        return torch.ones(1, 1, query_length, key_length, dtype=torch.bool, device=device)
    positions = torch.arange(key_length - query_length, key_length, device=device)
    return (torch.arange(key_length, device=device) <= positions[:, None])[None, None]


def streaming_keys(allowed: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Of the keys `allowed: (..., S)` bool, the first `sink` and the last `window` of each row (a row that
    allows nothing, a padding query's, stays empty)."""
    seen = allowed.cumsum(-1)  # (..., S) rank of each allowed key in its row
    return allowed & ((seen <= sink) | (seen > seen[..., -1:] - window))


def streaming_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """Attention function: query (B, H, L, D), key/value (B, KV, S, D) -> (B, L, H, D), gated; the heads top-k
    drops for a query attend only to its sink and window keys."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    block_patch = BLOCK_PATCHES.get(module)
    if block_patch is None:  # an attention module without gate (a layer not in GateConfig.layers)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    gate, keep = block_patch.take_gate()  # (B, L, H, w), (B, L, H)
    query_length, key_length = query.shape[2], key.shape[2]
    causal = is_causal(module, kwargs, query_length)
    attend = {"scaling": scaling, "dropout": dropout, **kwargs}
    full, _ = sdpa_attention_forward(module, query, key, value, attention_mask, is_causal=causal, **attend)
    allowed = allowed_keys(attention_mask, query_length, key_length, causal, query.device)
    gate_module = block_patch._gate()
    streaming = streaming_keys(allowed, gate_module.top_k_sink, gate_module.top_k_window)
    dropped, _ = sdpa_attention_forward(module, query, key, value, streaming, is_causal=False, **attend)
    attended = torch.where(keep.unsqueeze(-1) > 0, full, dropped)  # (B, L, H, D)
    return apply_gate(attended.flatten(-2), gate).unflatten(-1, (query.shape[1], -1)), None
