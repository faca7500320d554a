"""Readable PyTorch references of the fused kernels: the oracle of their tests, in any dtype.

Gate (as in `hf_gate_attention.core.gate`): `g = gate_scale * sigmoid(z) * keep`, the sigmoid in at least
float32, `keep` the 0/1 top-k mask. Attention rows with no visible key (all keys padded or masked) are 0, the
flash-attention convention, instead of the NaN of a softmax over nothing.
"""

from __future__ import annotations

import torch

from ..core.streaming import streaming_keys


def sigmoid_gate(
    gate_logits: torch.Tensor | None, gate_scale: float, keep: torch.Tensor | None
) -> torch.Tensor | None:
    """Gate values `(..., G, w)` from logits `(..., G, w)` and keep `(..., G)`; `None` when both are `None`.

    Computed in the promotion of the logits' dtype and float32 (float64 stays float64)."""
    if gate_logits is None and keep is None:
        return None
    gate = 1.0
    if gate_logits is not None:
        gate = gate_scale * torch.sigmoid(
            gate_logits.to(torch.promote_types(gate_logits.dtype, torch.float32))
        )
    if keep is not None:
        gate = gate * keep.unsqueeze(-1)
    return gate


def visible_keys(batch: int, length: int, keys: int, causal: bool, key_padding_mask, kv_length, device):
    """The keys each query sees, bool `(B, 1, L, S)`: those that exist (`j < kv_length`), are not padding,
    and, with `causal`, lie at or before the query (query `i` is position `i + kv_length - L`)."""
    filled = torch.full((batch,), keys, device=device) if kv_length is None else kv_length.expand(batch)
    key_at = torch.arange(keys, device=device)  # (S,)
    visible = key_at < filled[:, None, None]  # (B, 1, S)
    if causal:
        query_at = torch.arange(length, device=device)[:, None]  # (L, 1)
        visible = visible & (key_at <= query_at + (filled - length)[:, None, None])  # (B, L, S)
    visible = visible.unsqueeze(1).expand(batch, 1, length, keys)  # (B, 1, L, S)
    if key_padding_mask is not None:
        visible = visible & key_padding_mask.bool()[:, None, None, :]
    return visible


def gated_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None = None,
    gate_scale: float = 1.0,
    keep: torch.Tensor | None = None,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    kv_length: torch.Tensor | None = None,
    top_k_sink: int = 0,
    top_k_window: int = 0,
) -> torch.Tensor:
    """Gated attention `softmax(q k^T * sm_scale) v * g`, materialising the L x S weights.

    Args:
        q (`torch.Tensor` of shape `(B, H, L, D)`): queries.
        k, v (`torch.Tensor` of shape `(B, KV, S, D)`): keys and values; query head `h` reads key/value head
            `h // (H / KV)` (grouped-query attention).
        gate_logits (`torch.Tensor` of shape `(B, L, H, w)`, *optional*): gate logits, `w` = 1 (headwise) or D
            (elementwise); `None` for no sigmoid gate.
        gate_scale (`float`, *optional*, defaults to 1.0): `s` in `g = s * sigmoid(z)`.
        keep (`torch.Tensor` of shape `(B, L, H)`, *optional*): 0/1 top-k mask multiplying the gate.
        causal (`bool`, *optional*, defaults to `False`): query `i` sees key `j <= i + kv_length - L` (the
            queries are the last L positions of the filled keys, as when decoding with a KV cache).
        key_padding_mask (`torch.Tensor` of shape `(B, S)`, *optional*): bool, True for keys to attend.
        sm_scale (`float`, *optional*): score scale; defaults to `1 / sqrt(D)`.
        kv_length (`torch.Tensor` of shape `(B,)` or `(1,)`, *optional*): integer; only keys `j < kv_length`
            exist (a static cache's filled length); defaults to S.
        top_k_sink, top_k_window (`int`, *optional*, default to 0): when either is set, a head that `keep`
            drops for a query attends to the first `top_k_sink` and the last `top_k_window` keys that query
            sees and keeps its gate (`GateConfig.top_k_sink`, `core/streaming.py`); else its output is 0.

    Returns:
        `torch.Tensor` of shape `(B, L, H, D)` in the dtype of `q`.
    """
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    sm_scale = dim**-0.5 if sm_scale is None else sm_scale
    k = k.repeat_interleave(heads // kv_heads, dim=1)  # (B, H, S, D)
    v = v.repeat_interleave(heads // kv_heads, dim=1)  # (B, H, S, D)
    scores = (q @ k.transpose(-2, -1)) * sm_scale  # (B, H, L, S)
    visible = visible_keys(batch, length, keys, causal, key_padding_mask, kv_length, q.device)
    streaming = keep is not None and (top_k_sink > 0 or top_k_window > 0)
    if streaming:  # a dropped head reads its sink and window keys only; its gate stays
        reads = streaming_keys(visible, top_k_sink, top_k_window)  # (B, 1, L, S)
        visible = torch.where(keep.transpose(1, 2)[..., None] > 0, visible, reads)  # (B, H, L, S)
        keep = None
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    weights = torch.where(visible.any(-1, keepdim=True), weights, 0.0)  # rows with no visible key -> 0
    out = (weights @ v).transpose(1, 2)  # (B, L, H, D)
    gate = sigmoid_gate(gate_logits, gate_scale, keep)  # (B, L, H, w)
    return out if gate is None else out * gate.to(out.dtype)


def sigmoid_gate_multiply_reference(
    values: torch.Tensor,
    gate_logits: torch.Tensor,
    gate_scale: float = 1.0,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """`values * gate_scale * sigmoid(gate_logits) * keep`, in the dtype of `values`.

    Args:
        values (`torch.Tensor` of shape `(*, G, D)`): per-head values (attention output or value projection).
        gate_logits (`torch.Tensor` of shape `(*, G, w)`): `w` = 1 (headwise) or D (elementwise).
        gate_scale (`float`, *optional*, defaults to 1.0): `s` in `g = s * sigmoid(z)`.
        keep (`torch.Tensor` of shape `(*, G)`, *optional*): 0/1 top-k mask.
    """
    return values * sigmoid_gate(gate_logits, gate_scale, keep).to(values.dtype)
