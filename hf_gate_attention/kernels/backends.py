"""The Triton backends, registered into `core.backends` when the package is imported.

- `"fused_gate"` (default on CUDA for dense gates): attention stays the model's own implementation (SDPA's
  flash/cuDNN kernels, `flash_attention_2/3`); the `output` gate's logits come out of the query projection's
  GEMM (`query_gate.py`), and the gate is applied in one fused sigmoid-multiply pass (`gate_multiply.py`)
  before the output projection, forward and backward. `value` and `qk` gates get the fused pass too.
  With `top_k` it masks (computes every head).
- `"triton"`: our flash attention with the gate in its epilogue (`gated_attention.py`), through the attention
  implementation `hf_gate_attention_triton` registered on that instance: the least memory (no ungated copy of
  the attention output is kept). Slower than the vendor kernels at dense attention
  (benchmarks/results/gpu/). Queries of at most 16 positions without gradients (decode) run the split-KV
  decode kernel (`decode_attention.py`), which never reads dropped groups' cache. With `top_k`, prefill and
  training run SDPA and mask (`masked_top_k_attention`), or with `sparse=True` the flash kernel, which skips
  the tiles of dropped heads. With a static cache, the filled length reaches both kernels through the mask
  (`key_mask`), on the device.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn
from torch.nn import functional as F

from ..core.backends import GateBackend, register_backend
from ..core.config import GateConfig
from ..core.hooks import GATE_MODULE_NAME, block_patch_of
from ..core.sparse import sparse_unavailable_reason
from ..core.streaming import blocked_streaming_attention, streaming_keys
from .ops import MAX_DECODE_QUERIES, capturing, gate_multiply_unchecked
from .query_gate import merge_query_gate, restore_query_projection
from .reference import sigmoid_gate, visible_keys

ATTN_IMPLEMENTATION = "hf_gate_attention_triton"
UNSUPPORTED_ATTENTION_OPTIONS = ("sliding_window", "attn_logit_softcapping")


def _triton_unavailable(dtype: torch.dtype) -> str | None:
    """Why the Triton kernels cannot run here on this dtype, or `None`."""
    from . import triton_available  # the package's name: tests replace it
    from .ops import _check_dtype

    available, reason = triton_available()
    if not available:
        return reason
    try:
        _check_dtype(dtype)
    except ValueError as error:
        return str(error)
    return None


def _fused_gate_unavailable(config: GateConfig, model_config, head_dim: int, weight) -> str | None:
    if config.dropped_reads_keys:
        reads = "dropped units reading sink and window keys (top_k_sink/top_k_window)"
        return f"{reads} run on backends 'torch' and 'triton'"
    return _triton_unavailable(weight.dtype)


def _attention_unavailable(config: GateConfig, model_config, head_dim: int, weight) -> str | None:
    """Why the fused attention kernel cannot serve this model, or `None` if it can."""
    from . import check_supported

    reason = _triton_unavailable(weight.dtype)
    if reason is not None:
        return reason
    try:
        check_supported(head_dim, weight.dtype)
    except ValueError as error:
        return str(error)
    if config.gate_variant.gates_attention_output:
        for option in UNSUPPORTED_ATTENTION_OPTIONS:
            if getattr(model_config, option, None):
                return f"the fused attention kernel does not support {option} (set in this model's config)"
    return None


def register_attention_implementation() -> None:
    """Make `hf_gate_attention_triton` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, fused_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, key_mask)


def key_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor | None:
    """The mask transformers builds for `fused_attention_forward` (an `AttentionMaskInterface` function).

    As `flash_attention_mask`: `None`, or the `(B, S)` bool key padding mask. A mask that masks nothing goes
    for more than `MAX_DECODE_QUERIES` queries (prefill, training), so that SDPA can run its flash kernel:
    deciding that reads it on the host, one sync per forward, as transformers' own SDPA mask does; decode
    steps, `torch.compile` and CUDA-graph capture keep it (no sync, no graph break; the kernels take an
    all-True mask at a small cost). A static cache hands the
    attention all its `S = max_cache_len` slots, filled only up to `q_offset + q_length` (`q_offset`: the
    cache's own position tensor): then an int64 `(B, S)` tensor, that filled length at each key to attend
    and 0 elsewhere, so that the kernels get the filled length on the device (`_key_mask_and_length`)."""
    from transformers.masking_utils import bidirectional_mask_function

    filled = q_offset + q_length
    # every key exists: no cache or a dynamic one; encoders (prefix tuning has more keys than queries there)
    every_key = not isinstance(filled, torch.Tensor) and filled >= kv_length
    if every_key or kwargs.get("mask_function") is bidirectional_mask_function:
        if attention_mask is None:
            return None
        padding = attention_mask[:, -kv_length:].bool()  # from the right, as flash_attention_mask slices
        if q_length > MAX_DECODE_QUERIES and not _tracing(padding) and bool(padding.all()):
            return None
        return padding
    attend = torch.arange(kv_length, device=kwargs.get("device", "cpu")) < filled  # (S,)
    attend = attend.expand(batch_size, kv_length)  # (B, S)
    if attention_mask is not None:  # (B, slots up to now) from generate: padding slots are False
        padding = attention_mask[:, -kv_length:].bool()
        attend = attend & F.pad(padding, (0, kv_length - padding.shape[-1]))
    return torch.where(attend, filled, 0)


def _tracing(tensor: torch.Tensor) -> bool:
    """Whether reading `tensor` on the host would break a `torch.compile` graph or a CUDA-graph capture."""
    return torch.compiler.is_compiling() or capturing(tensor)


def _key_mask_and_length(attention_mask: torch.Tensor | None):
    """`(key padding mask (B, S) bool or None, kv_length (B,) or None)` from what `key_mask` built."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return attention_mask, None
    return attention_mask > 0, attention_mask.amax(-1)  # a static cache's filled length, on the device


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
    """Attention function of patched models: query (B, H, L, D), key/value (B, KV, S, D) -> (B, L, H, D).

    Short queries that need no gradient (decode) run the split-KV decode kernel, the others the flash
    kernel; `attention_mask` is what `key_mask` built."""
    from . import gated_decode_attention, gated_flash_attention

    if dropout > 0:
        raise ValueError(
            f"the fused Triton attention has no attention dropout (got p={dropout}); set the model's "
            "attention dropout to 0 or patch with backend='torch'"
        )
    device_type = query.device.type
    if torch.is_autocast_enabled(device_type):  # e.g. Llama's rotary step leaves q, k in float32, v in bf16
        dtype = torch.get_autocast_dtype(device_type)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    block_patch = block_patch_of(module)
    logits, keep, scale = (None, None, 1.0) if block_patch is None else block_patch.take_gate_logits()
    key_padding_mask, kv_length = _key_mask_and_length(attention_mask)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, logits)
    )
    short = query.shape[2] <= MAX_DECODE_QUERIES and not needs_grad
    gate = None if block_patch is None else block_patch.gate()
    options = {} if gate is None or not gate.dropped_reads_keys else _streaming_options(gate)
    if options and not short:  # prefill and training: the vendor attention twice (docs/sparse.md)
        attention = streaming_attention
    elif short:
        attention = gated_decode_attention
        if keep is not None:  # a query keeps top_k heads or groups: at most top_k groups
            options["kept_groups"] = gate.top_k * query.shape[2]
    elif keep is not None and not block_patch.sparse:  # top-k prefill and training, unless sparse=True
        attention = masked_top_k_attention
    else:
        attention = gated_flash_attention
    out = attention(
        query,
        key,
        value,
        gate_logits=logits,
        gate_scale=scale,
        keep=keep,
        causal=bool(getattr(module, "is_causal", False)),
        key_padding_mask=key_padding_mask,
        sm_scale=scaling,
        kv_length=kv_length,
        **options,
    )
    return out, None


def _streaming_options(gate: nn.Module) -> dict:
    return {"top_k_sink": gate.top_k_sink, "top_k_window": gate.top_k_window}


def streaming_attention(
    query, key, value, gate_logits, gate_scale, keep, causal, key_padding_mask, sm_scale, kv_length, **reads
):
    """Gated attention whose dropped heads read their sink and window keys (`gated_attention_reference` with
    `top_k_sink`/`top_k_window`) on SDPA: every head attends to the keys it sees and, blocked
    (`blocked_streaming_attention`), to its streaming ones, and each query row takes the first where it keeps
    the head. For prefill and training (the split-KV kernel serves decode); rows without a visible key give
    0. Returns `(B, L, H, D)`."""
    sink, window = reads["top_k_sink"], reads["top_k_window"]
    visible = _visible_unless_plain(query, key, causal, key_padding_mask, kv_length)  # (B, 1, L, S) or None
    full = sdpa_attention(query, key, value, visible, causal, sm_scale)  # (B, H, L, D)
    dropped = blocked_streaming_attention(query, key, value, visible, causal, sink, window, sm_scale)
    if dropped is None:
        if visible is None:
            batch, length, keys = query.shape[0], query.shape[2], key.shape[2]
            visible = visible_keys(batch, length, keys, causal, None, None, query.device)
        dropped = sdpa_attention(query, key, value, streaming_keys(visible, sink, window), causal, sm_scale)
    kept = keep.transpose(1, 2).unsqueeze(-1) > 0  # (B, H, L, 1)
    out = torch.where(kept, full, dropped)  # (B, H, L, D)
    return out.transpose(1, 2) * sigmoid_gate(gate_logits, gate_scale, None).to(out.dtype)


def masked_top_k_attention(
    query, key, value, gate_logits, gate_scale, keep, causal, key_padding_mask, sm_scale, kv_length
):
    """Top-k prefill and training (`sparse=None`): every head on SDPA's kernels, then the fused gate pass
    zeroes the heads each query dropped (`keep`), as the `fused_gate` backend does. Our flash kernel skips a
    (query block, head) tile only when every query of the block dropped the head, and runs at 0.62-0.70x
    SDPA's speed on an H200 (benchmarks/results/gpu/run1-270be43, kernels at 4k tokens): rarely enough
    skipped tiles to pay (`sparse=True` still runs it). Returns `(B, L, H, D)`."""
    visible = _visible_unless_plain(query, key, causal, key_padding_mask, kv_length)  # (B, 1, L, S) or None
    out = sdpa_attention(query, key, value, visible, causal, sm_scale).transpose(1, 2)  # (B, L, H, D)
    return gate_multiply_unchecked(out, gate_logits, gate_scale, keep)


def _visible_unless_plain(query, key, causal, key_padding_mask, kv_length) -> torch.Tensor | None:
    """The keys each query sees, `visible_keys` `(B, 1, L, S)`, or `None` where SDPA without a mask sees
    exactly those: no padding, no static cache's filled length, and causal only with as many queries as keys
    (SDPA's causal mask starts at the first key)."""
    batch, length, keys = query.shape[0], query.shape[2], key.shape[2]
    if key_padding_mask is None and kv_length is None and (not causal or length == keys):
        return None
    return visible_keys(batch, length, keys, causal, key_padding_mask, kv_length, query.device)


def sdpa_attention(query, key, value, visible, causal: bool, sm_scale) -> torch.Tensor:
    """`F.scaled_dot_product_attention` on query (B, H, L, D), key/value (B, KV, S, D), with `visible`
    (B, 1, L, S) bool as its mask, or without one (`None`: its causal or full kernel) -> (B, H, L, D); a row
    that sees no key gives 0. With a mask the key/value heads are repeated for their query heads, as in
    transformers' sdpa attention: CUDA's kernels take grouped heads (`enable_gqa`) only without a mask and
    fall back to the math kernel otherwise."""
    if visible is None:
        return F.scaled_dot_product_attention(
            query, key, value, is_causal=causal, scale=sm_scale, enable_gqa=True
        )
    heads_per_group = query.shape[1] // key.shape[1]
    key, value = (t.repeat_interleave(heads_per_group, dim=1) for t in (key, value))  # (B, H, S, D)
    seen = visible.any(-1, keepdim=True)  # (B, 1, L, 1)
    out = F.scaled_dot_product_attention(query, key, value, visible | ~seen, scale=sm_scale)
    return out * seen


def fused_gate_multiply(values: torch.Tensor, logits: torch.Tensor, scale: float, keep) -> torch.Tensor:
    """`values: (..., G*D)` times `scale * sigmoid(logits: (..., G, w)) * keep` in one fused kernel. Runs per
    layer and token: without the public API's input checks (the hooks' shapes are right by construction)."""
    heads = values.unflatten(-1, (logits.shape[-2], -1))  # (..., G, D)
    return gate_multiply_unchecked(heads, logits, scale, keep).flatten(-2)


def _no_sparse_skipping(config: GateConfig, model_config, sparse: bool | None, weight: torch.Tensor):
    if sparse and config.top_k is not None:
        raise ValueError(
            "sparse=True: backend 'fused_gate' computes every head and masks the dropped ones; top-k work "
            "skipping runs on backend='torch' (sparse attention) or backend='triton' (skipped tiles)"
        )
    return None


def _fused_attention(config: GateConfig, model_config, sparse: bool | None, weight: torch.Tensor):
    """This module for gates on the attention output; `sparse` reaches `fused_attention_forward` through the
    block patches (`sparse=True`: the flash kernel skips tiles in prefill and training too)."""
    if sparse is False and config.top_k is not None:
        raise ValueError("sparse=False (masked top-k) needs backend='torch': Triton's decode kernel skips")
    reason = sparse_unavailable_reason(config.variant, config.top_k, model_config) if sparse else None
    if reason is not None:
        raise ValueError(f"sparse=True cannot run: {reason}. Use sparse=None")
    # this module's attention function applies a gate on the attention output; the hooks apply the others
    return sys.modules[__name__] if config.gate_variant.gates_attention_output else None


def _merge(block_patch, family) -> None:
    """The output gate's logits from the query GEMM, where the layout allows it (`query_gate.py`): a query
    projection of its own, not quantized (bitsandbytes: the gate runs its own GEMM, as on `torch`)."""
    if not block_patch.gate_variant.reads_query_input or len(family.roles_of(family.query)) > 1:
        return
    query = block_patch.block.get_submodule(family.query)
    base = query.get_base_layer() if hasattr(query, "get_base_layer") else query
    if base.weight.device.type == "meta":  # offloaded by accelerate: its weights arrive per forward
        return
    if not base.weight.dtype.is_floating_point:
        warnings.warn(
            f"fused_gate: the query projection of {type(block_patch.block).__name__} is quantized "
            f"({type(base).__name__}); its gate logits come from a GEMM of their own, not merged into it",
            stacklevel=4,
        )
        return
    merge_query_gate(base, getattr(block_patch.block, GATE_MODULE_NAME), block_patch)


def _unmerge(block: nn.Module) -> None:
    for module in block.modules():
        restore_query_projection(module)


register_backend(
    GateBackend(
        name="fused_gate",
        summary="the model's own attention (SDPA, flash), gate logits from the query GEMM, a fused gate pass",
        unavailable_reason=_fused_gate_unavailable,
        gate_multiply=fused_gate_multiply,
        attention=_no_sparse_skipping,
        prepare_block=_merge,
        release_block=_unmerge,
    )
)
register_backend(
    GateBackend(
        name="triton",
        summary="our flash attention with the gate in its epilogue (least memory; top_k decode skips dropped "
        "key/value groups)",
        unavailable_reason=_attention_unavailable,
        gate_multiply=fused_gate_multiply,
        attention=_fused_attention,
    )
)
