"""Fused Triton kernels of gated attention (`patch(model, backend="triton")`), beside readable references.

- `gated_flash_attention`: flash attention with the sigmoid gate (output gate or the `qk` gate's per-query,
  per-head scale) in the epilogue, forward and backward, causal or not, key padding, GQA, top-k tile skipping.
- `gated_decode_attention`: the same attention for short queries (decode), split over the keys
  (flash-decoding), forward only; never reads the keys and values of dropped groups or past `kv_length`.
- `sigmoid_gate_multiply`: `values * s * sigmoid(z) * keep` in one pass, for attention from another backend
  and for the value gate.

All are `torch.library` custom ops (`hf_gate_attention::*`) with fake implementations, so `torch.compile`
traces them without graph breaks. `reference.py` holds the PyTorch references they are tested against.
Check `triton_available()` and `check_supported(head_dim, dtype)` before choosing this backend.
"""

from .ops import (
    SUPPORTED_DTYPES,
    check_supported,
    gated_decode_attention,
    gated_flash_attention,
    sigmoid_gate_multiply,
    triton_available,
)
from .reference import gated_attention_reference, sigmoid_gate_multiply_reference

__all__ = [
    "SUPPORTED_DTYPES",
    "check_supported",
    "gated_attention_reference",
    "gated_decode_attention",
    "gated_flash_attention",
    "sigmoid_gate_multiply",
    "sigmoid_gate_multiply_reference",
    "triton_available",
]
