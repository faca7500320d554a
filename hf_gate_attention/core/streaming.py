"""Dropped units that still read a few keys: the masked reference of `GateConfig.top_k_sink/top_k_window`.

With either set, a head (or key/value group) that top-k drops for a query does not give 0: it attends to the
first `top_k_sink` and the last `top_k_window` of the keys that query may see (its row of the causal, padding
or sliding-window mask), like DuoAttention's streaming heads, and its output is gated like a kept head's.
"The keys it may see" follows the mask, so left padding (the sink is the first real tokens) and a partly
filled static cache (the window ends at the query's own position) need nothing special.

This module is the readable reference (backend `torch` with `sparse=False`, and on CUDA): every head attends
twice, once to all its keys and once to the streaming ones through their `(L, S)` mask, and each query row
takes the first where it keeps the head. `blocked_streaming_attention` computes the second attention without
that mask, in blocks of rows (for prefill and training of `sparse.py` and the Triton backend); `sparse.py`
computes the rest while reading only what is kept (at decode, a dropped group reads its sink and window keys
only). Needs only torch and transformers: it ships as remote code with `hooks.py`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .gate import gate_heads
from .hooks import block_patch_of

ATTN_IMPLEMENTATION = "hf_gate_attention_streaming"
# CPU SDPA that also returns each row's log-sum-exp, by which partial attentions merge: a private op of torch
# (tested on 2.13); where a torch lacks it, callers that need the log-sum-exp take another path
CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


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


def _row_bounds(allowed: torch.Tensor | None, length: int, key_length: int, causal: bool, device):
    """First key and key count of each query row, each `(B', L)` int32, and whether every row is that
    interval (no holes) starting at its sequence's first key: `True`, or a 0-dim bool tensor where the mask
    decides. `allowed: (B', L, S)` bool, or `None`: every key, or with `causal` the keys up to the query's own
    (at `S - L + i`)."""
    if allowed is None:
        first = torch.zeros(1, length, dtype=torch.int32, device=device)
        count = torch.arange(key_length - length + 1, key_length + 1, dtype=torch.int32, device=device)
        count = count[None] if causal else torch.full_like(first, key_length)
        return first, count, True
    as_bytes = allowed.view(torch.uint8)
    count = as_bytes.sum(-1, dtype=torch.int32)  # (B', L)
    first = as_bytes.argmax(-1).to(torch.int32)  # (B', L) 0 for a row that sees nothing
    last = key_length - 1 - as_bytes.flip(-1).argmax(-1).to(torch.int32)  # (B', L)
    seen = count > 0
    sequence_first = torch.where(seen, first, key_length).amin(-1, keepdim=True)  # (B', 1)
    fits = ~seen | ((last - first + 1 == count) & (first == sequence_first))
    return first, count, fits.all()


def _gather_keys(tensor: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`tensor: (B, KV, S, D)` at `positions: (B or 1, *P)` (clamped to the cache) -> `(B, KV, *P, D)`."""
    batch, num_groups, length, head_dim = tensor.shape
    index = positions.clamp(0, length - 1).flatten(1)  # (B', P)
    if index.shape[0] == 1:  # the same positions in every sequence: whole rows, not an index per element
        gathered = tensor.index_select(2, index[0])
    else:
        gathered = tensor.gather(2, index[:, None, :, None].expand(batch, num_groups, -1, head_dim))
    return gathered.view(batch, num_groups, *positions.shape[1:], head_dim)


def blocked_streaming_attention(
    query, key, value, allowed, causal: bool, sink: int, window: int, scaling=None, dropout=0.0, lse=False
):
    """Attention of every query row to its streaming keys only (the first `sink` and the last `window` keys
    of its row of `allowed`) without an `(L, S)` pass per head: equal to SDPA with `streaming_keys(allowed,
    sink, window)` as its mask, except that rows that see nothing give 0. With `lse` (CPU, `CPU_FLASH`, no
    dropout or gradient), `(out, log-sum-exp (B, H, L))` (that of a row that sees nothing is not -inf).

    Query (B, H, L, D), key/value (B, KV, S, D), allowed bool (B or 1, 1, L, S) or `None` (`causal` says
    which keys; see `_row_bounds`) -> (B, H, L, D); `None` where this does not apply (then use the mask):
    the reads cover most keys, fewer query rows than a block (decode steps, which then read nothing but
    their sink and window keys), or a row is not an interval of keys starting at its sequence's first key.
    Rows go in blocks of `block`: a block's rows read the sequence's `sink` first keys and one slice of
    `block + window` keys ending at the block's last key, so the work is `L * (sink + block + window)`
    instead of `L * S`. Causal, padding, static-cache and bidirectional masks qualify; sliding-window rows
    past the window do not."""
    recording = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if lse and (CPU_FLASH is None or dropout or query.device.type != "cpu" or recording):
        raise ValueError(
            "blocked_streaming_attention(lse=True) needs torch's private CPU flash op, a CPU tensor, no "
            "dropout and no gradient; pass lse=False"
        )
    batch, num_heads, length, head_dim = query.shape
    num_groups, key_length = key.shape[1], key.shape[2]
    block = max(window, 8)
    if sink + block + window >= key_length or length < block:
        return None
    rows_allowed = None if allowed is None else allowed[:, 0]
    first, count, fits = _row_bounds(rows_allowed, length, key_length, causal, query.device)  # (B', L) x2, ()
    mask_batch, blocks = first.shape[0], -(-length // block)
    pad = blocks * block - length

    def by_block(rows: torch.Tensor) -> torch.Tensor:  # (B', L) -> (B', nb, c)
        return F.pad(rows, (0, pad)).view(mask_batch, blocks, block)

    seen, last = by_block(count > 0), by_block(first + count - 1)  # last < first for a row that sees nothing
    block_end = torch.where(seen, last, -1).amax(-1, keepdim=True)  # (B', nb, 1) the block's last key
    if allowed is None:  # every row sees its keys (rows padded to a whole block may see none); no host sync
        sees_all = pad == 0
    else:  # one host sync: whether the blocks apply to this mask
        block_start = torch.where(seen, last, key_length).amin(-1, keepdim=True)  # (B', nb, 1)
        fits, sees_all = torch.stack([fits & (block_end - block_start < block).all(), seen.all()]).tolist()
        if not fits:
            return None
    # each block reads [sink keys | its window slice]: (B', nb, s + T) positions, valid per row (B', nb, c, .)
    slice_keys = block_end - (block + window) + 1 + torch.arange(block + window, device=query.device)
    sink_keys = first.amax(-1)[:, None, None] + torch.arange(sink, device=query.device)  # (B', 1, s)
    positions = torch.cat([sink_keys.expand(-1, blocks, -1), slice_keys], -1)  # (B', nb, s + T)
    in_sink = torch.arange(sink + block + window, device=query.device) < sink  # (s + T,)
    first, last = by_block(first)[..., None], last[..., None]  # (B', nb, c, 1) each
    positions_ = positions[:, :, None]  # (B', nb, 1, s + T)
    valid = (positions_ <= last) & torch.where(
        in_sink, positions_ >= first, (positions_ > last - window) & (positions_ >= first + sink)
    )  # (B', nb, c, s + T): the sink in the row's keys, the window's keys after the sink
    heads_per_group = num_heads // num_groups
    rows = query.unflatten(1, (num_groups, heads_per_group)).transpose(2, 3)  # (B, KV, L, n, D)
    rows = F.pad(rows, (0, 0, 0, 0, 0, pad)) if pad else rows  # (B, KV, Lp, n, D)
    rows = rows.reshape(batch * num_groups, blocks, block * heads_per_group, head_dim)  # per block: (c, n)
    block_keys, block_values = (_gather_keys(t, positions).flatten(0, 1) for t in (key, value))
    valid = valid.unsqueeze(3).expand(-1, -1, -1, heads_per_group, -1).flatten(2, 3)  # (B', nb, c*n, s + T)
    if mask_batch > 1:
        valid = valid.repeat_interleave(num_groups, 0)  # (B*KV, nb, c*n, s + T)
    # additive, and shared by the key/value groups: CPU SDPA reads it broadcast, in about two thirds the time
    # of a bool mask expanded to every group (which it converts at full size;
    # benchmarks/results/sparse_prefill.md)
    bias = torch.zeros(valid.shape, dtype=query.dtype, device=query.device).masked_fill_(~valid, -torch.inf)
    # (B*KV, nb, c*n, D) against (B*KV, nb, s + T, D): SDPA's fused kernels, no (c*n, s + T) kept for backward
    if lse:
        out, row_lse = CPU_FLASH(rows, block_keys, block_values, attn_mask=bias, scale=scaling)
        row_lse = row_lse.reshape(batch, num_groups, -1, heads_per_group)[:, :, :length]  # (B, KV, L, n)
        row_lse = row_lse.transpose(2, 3).reshape(batch, num_heads, length)
    else:
        out = F.scaled_dot_product_attention(
            rows, block_keys, block_values, attn_mask=bias, dropout_p=dropout, scale=scaling
        )
    if not sees_all:  # a row that sees nothing gives 0 (not every SDPA kernel makes it 0 itself)
        out = torch.where(valid.any(-1, keepdim=True), out, 0)
    out = out.view(batch, num_groups, -1, heads_per_group, head_dim)[:, :, :length]  # (B, KV, L, n, D)
    out = out.transpose(2, 3).reshape(batch, num_heads, length, head_dim)
    return (out, row_lse) if lse else out


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

    block_patch = block_patch_of(module)
    if block_patch is None:  # an attention module without gate (a layer not in GateConfig.layers)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    gate, keep = block_patch.take_gate()  # (B, L, H, w), (B, L, H)
    causal = is_causal(module, kwargs, query.shape[2])
    selection = (gate, keep, block_patch.gate())
    return every_head_on_every_row(
        module,
        query,
        key,
        value,
        attention_mask,
        selection,
        causal,
        scaling=scaling,
        dropout=dropout,
        **kwargs,
    )


def every_head_on_every_row(module, query, key, value, attention_mask, selection, causal: bool, **attend):
    """The masked reference, without host synchronisation: every head attends on every row, query
    (B, H, L, D), key/value (B, KV, S, D); `selection = (gate (B, L, H, w), keep (B, L, H), gate module)`: a
    head top-k drops for a row gives its attention to its sink and window keys where the gate module has them,
    else 0 (through `gate`, multiplied by `keep`) -> ((B, L, H, D), None), gated."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gate, keep, gate_module = selection
    attended, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, is_causal=causal, **attend
    )
    if gate_module.dropped_reads_keys:
        allowed = allowed_keys(attention_mask, query.shape[2], key.shape[2], causal, query.device)
        streaming = streaming_keys(allowed, gate_module.top_k_sink, gate_module.top_k_window)
        dropped, _ = sdpa_attention_forward(module, query, key, value, streaming, is_causal=False, **attend)
        attended = torch.where(keep.unsqueeze(-1) > 0, attended, dropped)  # (B, L, H, D)
    return gate_heads(attended, gate), None
