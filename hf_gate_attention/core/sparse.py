"""Sparse top-k on the torch path: attention runs only for the heads and key/value groups top-k keeps.

The gate depends only on the block's input (or on its query and key projections), so it is known before
attention. The masked reference (`gate.py`) computes every head and multiplies the dropped ones by 0. A model
patched with `top_k` (variants with `top_k_skips`: `output`, `qk`; backend `torch`) instead switches, on
that instance only, to the attention implementation `hf_gate_attention_sparse`: transformers' SDPA attention,
called per sequence and key/value group, only for the query rows that keep at least one head of the group,
then the gate.

- Decode (one query per sequence): each sequence of the batch reads only the KV cache of the groups it keeps;
  with `top_k_unit="kv_group"` and `top_k=1` of 3 groups, 1/3 of the cache. With `top_k_sink/top_k_window`,
  the dropped groups read only their sink and window keys, gathered.
- Prefill without gradients of unpadded sequences (causal, no mask) from `BLOCKED_MIN_KEYS` keys: the kept
  rows of each group attend in blocks of rows, merged by log-sum-exp (`_kept_rows_in_blocks`); shorter such
  prompts, and groups the blocks do not pay for, run one causal SDPA call over every row.
- Otherwise (training, padding, non-causal attention): a group that more than half the rows keep runs on
  all rows (one SDPA call for the layer when every group does); otherwise the kept query rows of each group
  are gathered, with their rows of the causal, padding or sliding-window mask. Gradients flow through the
  gather like through the masked reference.
- With `top_k_sink`/`top_k_window`, the dropped heads' reads are computed blocked
  (`streaming.blocked_streaming_attention`), or through their mask where that does not apply. In the blocked
  prefill above, a kept row attends only to the keys beyond its reads and merges the two.
- Decode of a single sequence (batch 1, one token): the top-k selection is made on the host
  (`AttentionGate.with_kept_heads`), the query projection computes only the rows of the kept heads (variant
  `output`: its gate, computed from the projection's input, comes first) and the output projection only
  their columns (`prepare_block`; plain `nn.Linear` projections only).
- Under `torch.compile`, that decode step syncs nothing with the host (no graph break, `fullgraph=True`
  works): every head attends in one SDPA call, a dropped head masked to its sink and window keys or, when it
  reads nothing, gated to 0 (the masked reference's work, without its host dispatch). Prefill, training
  and batched decode run the masked reference there (`streaming.every_head_on_every_row`): choosing rows
  would sync with the host, a graph break per layer.

Not skipped: the key/value projections (keys and values are written for every group), the query and output
projections of batches and prompts (the kept heads change from token to token), and, with
`top_k_unit="head"`, the dropped heads of a group that some head keeps. Outputs equal the masked reference up
to the rounding of SDPA and matmuls on other shapes (< 1e-5 in float32).
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch
from torch import nn
from torch.nn import functional as F

from .gate import gate_heads
from .hooks import GATE_MODULE_NAME, InlineForward, block_patch_of
from .streaming import (
    CPU_FLASH,
    allowed_keys,
    blocked_streaming_attention,
    every_head_on_every_row,
    is_causal,
    streaming_keys,
)
from .variants import GATE_VARIANTS, names_where

ATTN_IMPLEMENTATION = "hf_gate_attention_sparse"
# attention options SDPA (and so this path) does not have
UNSUPPORTED_OPTIONS = ("attn_logit_softcapping",)


def sparse_unavailable_reason(variant: str, top_k: int | None, model_config) -> str | None:
    """Why sparse top-k cannot serve this patch, or `None` if it can."""
    if top_k is None:
        return "sparse execution needs GateConfig.top_k (there is nothing to skip without it)"
    gate_variant = GATE_VARIANTS[variant]
    if not gate_variant.top_k_skips:
        why = (
            f"gates the {gate_variant.gates}s before they enter the KV cache, so dropping a head skips no "
            "attention"
            if gate_variant.gates_kv_heads
            else "masks the heads top-k drops"
        )
        serves = ", ".join(names_where(lambda v: v.top_k_skips))
        return f"variant {variant!r} {why}; sparse execution serves {serves}"
    for option in UNSUPPORTED_OPTIONS:
        if getattr(model_config, option, None):
            return f"sparse attention runs on SDPA, which has no {option} (set in this model's config)"
    return None


def register_attention_implementation() -> None:
    """Make `hf_gate_attention_sparse` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, sparse_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def _mask_rows(attention_mask, b: int, rows, query_length: int, key_length: int, causal: bool):
    """The mask of sequence `b` restricted to the query `rows` (`None`: all rows), SDPA layout `(1, 1, r, S)`.

    Without a mask, transformers' SDPA attention is causal with the upper-left alignment of
    `is_causal=True` (query `i` sees key `j <= i`); the gathered rows get that mask explicitly."""
    if attention_mask is None:
        if rows is None or not causal:
            return None
        return (torch.arange(key_length, device=rows.device) <= rows[:, None])[None, None]
    mask = attention_mask[b : b + 1] if attention_mask.shape[0] > 1 else attention_mask
    if rows is not None and mask.shape[2] > 1:
        mask = mask[:, :, rows]
    return mask


def sparse_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """Attention function of sparse top-k patches: query (B, H, L, D), key/value (B, KV, S, D) ->
    (B, L, H, D), gated; heads top-k dropped are 0."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    block_patch = block_patch_of(module)
    if block_patch is None:  # an attention module without gate (e.g. a layer not in GateConfig.layers)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if kwargs.get("position_bias") is not None:
        raise ValueError("sparse top-k attention does not support position_bias; patch with sparse=False")
    batch, num_heads, query_length, _ = query.shape
    num_groups, key_length = key.shape[1], key.shape[2]
    heads_per_group = num_heads // num_groups
    gate_module = block_patch.gate()
    per_head_mask = attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] != 1
    one_token = batch * query_length == 1 and not per_head_mask and not kwargs.get("output_attentions")
    if one_token and _skipping_pays():
        gate, kept_heads = block_patch.take_gate(kept_on_host=True)  # (1, 1, H, w), H bools
        positions = _read_positions(gate_module, attention_mask, key_length, query.device)
        selection = (gate, kept_heads, positions)
        return _decode_one_token(block_patch, query, key, value, attention_mask, selection, scaling, dropout)
    gate, keep = block_patch.take_gate()  # (B, L, H, w), (B, L, H)
    causal = is_causal(module, kwargs, query_length)
    if per_head_mask:
        # a mask per head (Swin's relative position bias): nothing is gathered, every head attends
        if gate_module.dropped_reads_keys:
            raise ValueError(
                f"top_k_sink/top_k_window: {type(module).__name__} passes a different mask to each head, "
                "which the sink and window reads do not take; use top_k without them"
            )
        attended, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )  # (B, L, H, D)
        return _gated(attended, keep, None, gate)
    if one_token:  # under torch.compile (or without SKIP_DECODE): one SDPA call over every head
        return _one_token_in_one_call(
            query, key, value, attention_mask, (gate, keep, gate_module), scaling, dropout
        )
    if torch.compiler.is_compiling():  # choosing rows would sync with the host, a graph break per layer
        selection = (gate, keep, gate_module)
        attend = {"scaling": scaling, "dropout": dropout, **kwargs}
        return every_head_on_every_row(module, query, key, value, attention_mask, selection, causal, **attend)
    # a causal prompt without mask or gradients: the kept rows run in blocks, or every row in one causal call;
    # gathered, they would need their mask rows, which cost more than all rows causal (x1.0 to x4.9 on CPU:
    # benchmarks/results/sparse_prefill.md)
    unmasked_prompt = (
        causal
        and query_length > 1
        and attention_mask is None
        and dropout == 0.0
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))
    )
    blocks = unmasked_prompt and _blocks_apply(query, key, value)
    streaming = None  # the keys a dropped head still reads, bool (B or 1, 1, L, S); None: none
    reads = reads_lse = None  # or what every head gives reading only those keys, (B, L, H, D), and (B, L, H)
    if gate_module.dropped_reads_keys:
        sink, window = gate_module.top_k_sink, gate_module.top_k_window
        allowed = None  # (B or 1, 1, L, S) bool; None: no mask (the blocked reads need none)
        if attention_mask is not None:
            allowed = allowed_keys(attention_mask, query_length, key_length, causal, query.device)
        reads = blocked_streaming_attention(
            query, key, value, allowed, causal, sink, window, scaling, dropout, lse=blocks
        )
        if reads is None:
            if allowed is None:
                allowed = allowed_keys(attention_mask, query_length, key_length, causal, query.device)
            streaming = streaming_keys(allowed, sink, window)
        elif blocks:
            reads, reads_lse = reads[0].transpose(1, 2), reads[1].transpose(1, 2)
        else:
            reads = reads.transpose(1, 2)
    kept_by_group = keep.unflatten(-1, (num_groups, heads_per_group))  # (B, L, KV, n)
    group_rows = kept_by_group.amax(-1) > 0  # (B, L, KV): rows keeping a head of the group
    all_rows = unmasked_prompt and streaming is None
    if all_rows and blocks:
        rows_per_group = group_rows.sum(1).tolist()  # (B, KV) one host sync per layer
        # (B, KV): the groups whose kept rows the blocks serve faster than one causal call over every row
        in_blocks = [[count <= BLOCKS_PAY * query_length for count in counts] for counts in rows_per_group]
        if any(map(any, in_blocks)):
            read_keys = None if reads is None else (reads, reads_lse, sink, window)
            attended = _kept_rows_in_blocks(query, key, value, group_rows, scaling, in_blocks, read_keys)
            return _gated(attended, keep, reads, gate)
    if not all_rows:
        rows_per_group = group_rows.sum(1).tolist()  # (B, KV) one host sync per layer
        # a group kept by most rows runs on all of them: the causal kernel over every row beats gathering rows
        # with their mask rows (a dropped head's output is then replaced by its reads or gated to 0)
        most = [2 * count > query_length for counts in rows_per_group for count in counts]
        all_rows = streaming is None and all(most)
    if all_rows:
        attended, _ = sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            scaling=scaling,
            dropout=dropout,
            is_causal=causal,
            **kwargs,
        )  # (B, L, H, D)
        return _gated(attended, keep, reads, gate)
    dropped_rows = kept_by_group.amin(-1) == 0  # (B, L, KV): rows dropping a head of the group
    out = query.new_zeros(batch, query_length, num_heads, value.shape[-1])

    def attend(b: int, g: int, rows, mask, is_causal: bool, positions=None):
        """Heads of group `g` of sequence `b` on the query `rows` (`None`: all), reading the keys at
        `positions` (`None`: all) -> (r, n, D)."""
        heads = slice(g * heads_per_group, (g + 1) * heads_per_group)
        group_query = query[b : b + 1, heads]  # (1, n, L, D)
        if rows is not None:
            group_query = group_query[:, :, rows]  # (1, n, r, D)
        group_key, group_value = key[b : b + 1, g : g + 1], value[b : b + 1, g : g + 1]  # (1, 1, S, D)
        if positions is not None:
            group_key, group_value = (
                t.index_select(2, positions) for t in (group_key, group_value)
            )  # (1, 1, s, D)
        attended, _ = sdpa_attention_forward(
            module,
            group_query,
            group_key,
            group_value,
            mask,
            scaling=scaling,
            dropout=dropout,
            is_causal=is_causal,
            **kwargs,
        )  # (1, r, n, D)
        return attended[0]

    for b in range(batch):
        for g in range(num_groups):
            heads = slice(g * heads_per_group, (g + 1) * heads_per_group)
            count = rows_per_group[b][g]
            if count > 0:  # otherwise no query row of this sequence keeps a head of group g
                rows = None if 2 * count > query_length else group_rows[b, :, g].nonzero().squeeze(1)
                mask = _mask_rows(attention_mask, b, rows, query_length, key_length, causal)
                out[b, slice(None) if rows is None else rows, heads] = attend(b, g, rows, mask, causal)
            if streaming is None:
                continue
            rows = dropped_rows[b, :, g].nonzero().squeeze(1)
            if rows.numel():  # the dropped heads of these rows read their sink and window keys only
                mask = _mask_rows(streaming, b, rows, query_length, key_length, False)  # (1, 1, r, S)
                positions = mask[0, 0].any(0).nonzero().squeeze(1)  # (s,) keys some row reads
                window = attend(b, g, rows, mask[..., positions], False, positions)  # (r, n, D)
                kept = kept_by_group[b, rows, g].unsqueeze(-1) > 0  # (r, n, 1)
                out[b, rows, heads] = torch.where(kept, out[b, rows, heads], window)
    return _gated(out, keep, reads, gate)


# A prefill without gradients of a causal batch without padding (transformers then passes no mask) whose keys
# reach BLOCKED_MIN_KEYS runs the kept rows of each key/value group in blocks of BLOCK_ROWS query rows
# (`_kept_rows_in_blocks`): on CPU, SDPA over the gathered kept rows with a mask row each over every key took
# x1.0 to x4.9 the time of the causal call over every row, the blocks, keeping 1 of 3 groups, x0.580 at 1k
# and x0.435 at 8k keys, keeping 2 of 3 x0.932 and x0.784 (benchmarks/results/sparse_prefill.md): 1.2 to 1.7
# times the kept rows' share of the causal call. A group kept by more than BLOCKS_PAY of the rows runs the
# causal call over all its rows instead (a layer where no group is under it, the all-rows rule below: one
# call); at 512 keys keeping 2 of 3 the blocks took x1.020, hence BLOCKED_MIN_KEYS.
BLOCK_ROWS = 512
BLOCKED_MIN_KEYS = 1024
BLOCKS_PAY = 0.7


def _blocks_apply(query, key, value) -> bool:
    """Whether `_kept_rows_in_blocks` serves a causal prompt without mask, dropout or gradient (CPU, the
    private op, from `BLOCKED_MIN_KEYS` keys)."""
    return (
        query.device.type == "cpu"
        and CPU_FLASH is not None
        and key.shape[2] >= BLOCKED_MIN_KEYS
        and value.shape[-1] == query.shape[-1]
    )


def _kept_rows_in_blocks(query, key, value, group_rows, scaling, in_blocks, reads=None):
    """Causal attention of the query rows that keep each key/value group, skipping the rows that drop it:
    query (B, H, L, D), key/value (B, KV, S, D) (query `i` at key position `p = S - L + i`), `group_rows:
    (B, L, KV)` bool -> (B, L, H, D), exact at the rows that keep the group; elsewhere 0, their reads, or the
    attention of the row where the group ran on all rows (callers gate those to 0 or replace them by their
    reads). No mask, no gradient. Where `in_blocks` (per sequence, a bool per group) says no and there is no
    cached key, the group runs one causal call over all its rows instead.

    `reads = (reads (B, L, H, D), their log-sum-exp (B, L, H), sink, window)`: every row's attention to its
    first `sink` and last `window` keys; a kept row then attends only to its other keys, `[sink, p - window]`,
    and merges the two by their log-sum-exps (`None`: no reads, every key `[0, p]`). The kept rows of a
    block of `BLOCK_ROWS` rows take two SDPA calls that return their log-sum-exp: over the keys every row of
    the block attends to, unmasked, and over the rest, with their causal mask rows."""
    batch, num_heads, length, head_dim = query.shape
    num_groups, offset = key.shape[1], key.shape[2] - length
    heads_per_group = num_heads // num_groups
    if reads is None:
        out, sink, window = query.new_zeros(batch, length, num_heads, head_dim), 0, 0
    else:
        reads, reads_lse, sink, window = reads
        out = reads.clone()  # a kept row without keys beyond its reads keeps them
    first_row = max(0, sink + window - offset)  # rows before it attend to no key beyond their reads
    for b in range(batch):
        for g in range(num_groups):
            heads = slice(g * heads_per_group, (g + 1) * heads_per_group)
            group_key, group_value = (
                t[b : b + 1, g : g + 1].expand(-1, heads_per_group, -1, -1) for t in (key, value)
            )  # (1, n, S, D) each
            if offset == 0 and not in_blocks[b][g]:
                attended, _ = CPU_FLASH(
                    query[b : b + 1, heads], group_key, group_value, is_causal=True, scale=scaling
                )
                out[b, :, heads] = attended[0].transpose(0, 1)  # (L, n, D)
                continue
            rows = group_rows[b, first_row:, g].nonzero().squeeze(1) + first_row  # (r,) the kept rows
            if not rows.numel():
                continue
            group_query = query[b : b + 1, heads].index_select(2, rows)  # (1, n, r, D)
            counts = torch.bincount((rows - first_row) // BLOCK_ROWS).tolist()
            parts = []  # per block of rows: (1, n, c, D), (1, n, c)
            blocks = zip(rows.split(counts), group_query.split(counts, 2), strict=True)
            for block, (block_rows, block_query) in enumerate(blocks):
                if not block_rows.numel():
                    continue
                block_start = first_row + block * BLOCK_ROWS
                # every row of the block attends to the keys [sink, seen_by_all), the last to [., last_key)
                seen_by_all = offset + block_start - window
                last_key = offset + min(block_start + BLOCK_ROWS, length) - window
                key_positions = torch.arange(seen_by_all, last_key, device=query.device)
                masked = key_positions <= (block_rows[:, None] + offset - window)  # (c, t)
                bias = torch.zeros(masked.shape, dtype=query.dtype, device=query.device)
                bias = bias.masked_fill_(~masked, -torch.inf)[None, None]  # (1, 1, c, t)
                block_parts = [
                    CPU_FLASH(
                        block_query,
                        group_key[:, :, seen_by_all:last_key],
                        group_value[:, :, seen_by_all:last_key],
                        attn_mask=bias,
                        scale=scaling,
                    )
                ]
                if seen_by_all > sink:
                    block_parts.append(
                        CPU_FLASH(
                            block_query,
                            group_key[:, :, sink:seen_by_all],
                            group_value[:, :, sink:seen_by_all],
                            scale=scaling,
                        )
                    )
                parts.append(_merged(block_parts))
            attended, lse = (torch.cat(tensors, 2)[0].transpose(0, 1) for tensors in zip(*parts, strict=True))
            if reads is not None:  # (r, n, D), (r, n)
                row_reads = (reads[b, rows, heads], reads_lse[b, rows, heads])
                attended, _ = _merged([(attended, lse), row_reads])
            out[b, rows, heads] = attended.to(out.dtype)
    return out


def _merged(parts: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Attentions over disjoint sets of keys, `[(out (..., D), log-sum-exp (...))]`, merged into the attention
    over their union and its log-sum-exp."""
    (out, lse), *more = parts
    for other, other_lse in more:
        total = torch.logaddexp(lse, other_lse)
        out = out * (lse - total).exp().unsqueeze(-1) + other * (other_lse - total).exp().unsqueeze(-1)
        lse = total
    return out, lse


# A single sequence's decode step skips the keys its dropped groups do not read (`_decode_one_token`): never
# slower than one SDPA call over every group with each dropped head masked to its sink and window keys
# (benchmarks/results/decode_sink_window_skipping.md, SmolLM2-135M, 2-core CPU). False: that masked call,
# which `torch.compile` always runs (`benchmarks/decode.py` times both ways).
SKIP_DECODE = True


def _skipping_pays() -> bool:
    """Whether this decode step of one token skips the keys its dropped groups do not read (never under
    `torch.compile`: choosing would sync with the host)."""
    return SKIP_DECODE and not torch.compiler.is_compiling()


def _sink_and_window(key_length: int, sink: int, window: int, device) -> torch.Tensor:
    """`streaming_keys` of one query that sees all `key_length` keys, `(1, 1, 1, S)` bool, in 3 ops instead
    of 8 (a decode step runs it per layer)."""
    keys = torch.ones(1, 1, 1, key_length, dtype=torch.bool, device=device)
    keys[..., sink : max(sink, key_length - window)].fill_(False)
    return keys


@lru_cache(maxsize=4)
def _sink_and_window_positions(key_length: int, sink: int, window: int, device) -> torch.Tensor:
    """The positions of `_sink_and_window`'s keys, `(s,)` int64; cached, since every layer of a decode step
    asks for the same (made outside inference mode, so that a step with gradients may index with them)."""
    with torch.inference_mode(False):
        first = min(sink, key_length)
        window_start = max(first, key_length - window)
        return torch.cat(
            [torch.arange(first, device=device), torch.arange(window_start, key_length, device=device)]
        )


def _gated(attended: torch.Tensor, keep: torch.Tensor, reads: torch.Tensor | None, gate: torch.Tensor):
    """`attended: (B, L, H, D)`, where `keep: (B, L, H)` drops a head its `reads` (same shape) if any, gated
    -> `((B, L, H, D), None)`, the attention function's return."""
    if reads is not None:
        attended = torch.where(keep.unsqueeze(-1) > 0, attended, reads)
    return gate_heads(attended, gate), None


def _read_positions(gate_module, attention_mask, key_length: int, device) -> torch.Tensor | None:
    """The keys `(s,)` a dropped head of a one-token step reads (its sink and window keys); `None`: none.
    From a mask (a static cache's), computed once per step: every layer gets the same mask tensor, and this
    remembers the last one's positions while that tensor is unchanged (its version counter; masks made in
    inference mode have none and are read each time)."""
    if not gate_module.dropped_reads_keys:
        return None
    sink, window = gate_module.top_k_sink, gate_module.top_k_window
    if attention_mask is None:
        return _sink_and_window_positions(key_length, sink, window, device)
    version = None if attention_mask.is_inference() else attention_mask._version
    last_mask, *last_settings, positions = _LAST_MASK_READS
    if last_mask is attention_mask and version is not None and last_settings == [version, sink, window]:
        return positions
    allowed = allowed_keys(attention_mask, 1, key_length, False, device)  # (1, 1, 1, S)
    positions = streaming_keys(allowed, sink, window)[0, 0, 0].nonzero().squeeze(1)
    _LAST_MASK_READS[:] = attention_mask, version, sink, window, positions
    return positions


# `_read_positions` of the last mask: [mask, its version, sink, window, positions]
_LAST_MASK_READS: list = [None] * 5


def _one_token_in_one_call(query, key, value, attention_mask, selection, scaling, dropout):
    """One query of one sequence, without host sync: query (1, H, 1, D), key/value (1, KV, S, D),
    `selection = (gate, keep, gate module)` -> (1, 1, H, D), gated. One SDPA call over every head, a dropped
    head masked to its sink and window keys or, when it reads nothing, gated to 0."""
    gate, keep, gate_module = selection
    heads_keys = attention_mask  # or (1, H, 1, S) bool: a kept head's keys as the mask allows them, a dropped
    if gate_module.dropped_reads_keys:  # head's sink and window keys
        sink, window, key_length = gate_module.top_k_sink, gate_module.top_k_window, key.shape[2]
        kept_heads = keep.view(1, -1, 1, 1) > 0  # (1, H, 1, 1)
        if attention_mask is None:
            heads_keys = _sink_and_window(key_length, sink, window, query.device) | kept_heads
        else:
            allowed = allowed_keys(attention_mask, 1, key_length, False, query.device)  # (1, 1, 1, S)
            heads_keys = torch.where(kept_heads, allowed, streaming_keys(allowed, sink, window))
    attended = F.scaled_dot_product_attention(
        query, key, value, attn_mask=heads_keys, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (1, H, 1, D)
    return _gated(attended.transpose(1, 2), keep, None, gate)


def _decode_one_token(block_patch, query, key, value, attention_mask, selection, scaling, dropout):
    """Decode of one sequence: query (1, H, 1, D), key/value (1, KV, S, D) -> (1, 1, H, D), gated. One SDPA
    call per run of consecutive kept groups (`enable_gqa`: each query head its own work item, so that the CPU
    kernel spreads them over threads); the kept heads are stashed for the output projection. `selection =
    (gate (1, 1, H, w), kept_heads: H bools, positions)`; with `positions` (s,), the dropped heads attend to
    those keys only: one SDPA call of every head over them, whose kept heads are then overwritten."""
    gate, kept_heads, positions = selection
    num_heads, num_groups = query.shape[1], key.shape[1]
    heads_per_group = num_heads // num_groups
    by_group = [kept_heads[g * heads_per_group : (g + 1) * heads_per_group] for g in range(num_groups)]
    kept_groups = [any(heads) for heads in by_group]
    if positions is None:
        out = query.new_zeros(1, num_heads, 1, value.shape[-1])  # (1, H, 1, D): dropped heads give 0
    else:
        # (1, KV, s, D) each, gathered as rows of the one sequence's (KV, S, D): on CPU a faster gather than
        # `index_select(2)` of (1, KV, S, D) (timed in isolation)
        key_reads, value_reads = (t[0].index_select(1, positions)[None] for t in (key, value))
        reads = F.scaled_dot_product_attention(
            query,
            key_reads,
            value_reads,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=True,
        )  # (1, H, 1, D)
        # a group kept for some of its heads only (top_k_unit="head"): its dropped heads keep their reads
        partly_kept = any(any(heads) and not all(heads) for heads in by_group)
        # the kept heads are written in place: into a copy where `reads` is still needed (its own backward,
        # or the where below)
        out = reads.clone() if partly_kept or reads.requires_grad else reads
    for groups in _runs(kept_groups, 1):  # slices of group indices
        heads = slice(groups.start * heads_per_group, groups.stop * heads_per_group)
        out[:, heads] = F.scaled_dot_product_attention(
            query[:, heads],
            key[:, groups],
            value[:, groups],
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=True,
        )  # (1, r * n, 1, D)
    if positions is not None:
        if partly_kept:
            out = torch.where(torch.tensor(kept_heads, device=out.device).view(1, -1, 1, 1), out, reads)
        kept_heads = [True] * num_heads  # every head has an output: the output projection needs them all
    block_patch.stash["kept_heads"] = kept_heads
    return gate_heads(out.transpose(1, 2), gate), None


def _runs(kept: list[bool], width: int) -> list[slice]:
    """Slices `[start * width, end * width)` of the runs of consecutive kept entries (heads or groups)."""
    runs, start = [], None
    for index, keep in enumerate([*kept, False]):
        if keep and start is None:
            start = index
        elif not keep and start is not None:
            runs.append(slice(start * width, index * width))
            start = None
    return runs


def _partial_query(module: nn.Linear, block_patch, num_heads: int, head_dim: int, x: torch.Tensor):
    """`forward` of the query projection, `x: (..., hidden)`: for one token, the gate and top-k selection are
    computed from the input first (stashed for the attention function) and only the kept heads' rows are
    projected."""
    block_patch.stash.pop("gate", None)
    if x.shape[:-1].numel() != 1 or not _skipping_pays():  # (under torch.compile: no host sync)
        return F.linear(x, module.weight, module.bias)
    gate, kept = block_patch.gate().with_kept_heads(x=x)
    block_patch.stash["gate"] = (gate, kept)
    if all(kept):
        return F.linear(x, module.weight, module.bias)
    out = x.new_zeros(*x.shape[:-1], num_heads * head_dim)
    bias = module.bias
    for rows in _runs(kept, head_dim):
        out[..., rows] = F.linear(x, module.weight[rows], None if bias is None else bias[rows])
    return out


def _partial_output(module: nn.Linear, block_patch, head_dim: int, x: torch.Tensor):
    """`forward` of the output projection, `x: (..., H*D)`: after `_decode_one_token`, only the columns of
    the kept heads (the dropped heads' inputs are exactly 0, so the result is the same)."""
    kept = block_patch.stash.pop("kept_heads", None)
    if kept is None or x.shape[:-1].numel() != 1 or all(kept):
        return F.linear(x, module.weight, module.bias)
    out = sum(F.linear(x[..., columns], module.weight[:, columns]) for columns in _runs(kept, head_dim))
    return out if module.bias is None else out + module.bias


def prepare_block(block_patch) -> None:
    """Give the block's query (a gate reading only its input, separate projection) and output projections,
    plain `nn.Linear`s, the partial single-token `forward`s above, on these instances only (`release_block`
    removes them): as the `project` of their `InlineForward`, or as their `forward` where hooks run the gate
    and nothing else replaced it (e.g. accelerate's offloading hooks). Partials, not closures, so that
    `copy.deepcopy(model)` gives the copy's projections the copy's modules."""
    block, family = block_patch.block, block_patch.family
    gate = getattr(block, GATE_MODULE_NAME)
    num_heads, head_dim = gate.num_heads, gate.head_dim
    replacements = {family.output: (_partial_output, head_dim)}
    per_head_query = family.key is not None and not family.fused_qkv  # (not a latent's first projection)
    if block_patch.gate_variant.reads_query_input and per_head_query and not gate.dropped_reads_keys:
        replacements[family.query] = (_partial_query, num_heads, head_dim)
    for path, (forward, *sizes) in replacements.items():
        module = block.get_submodule(path)
        if type(module) is not nn.Linear:
            continue
        inline = module.__dict__.get("forward")
        if isinstance(inline, InlineForward) and inline.project is None:
            inline.project = partial(forward, module, block_patch, *sizes)
        elif inline is None:
            module.forward = partial(forward, module, block_patch, *sizes)


def release_block(block: nn.Module) -> None:
    """Remove the `forward`s `prepare_block` set in `block` (run by `unpatch`)."""
    for module in block.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, InlineForward) and _is_partial_projection(forward.project):
            forward.project = None
        elif _is_partial_projection(forward):
            del module.forward


def _is_partial_projection(forward) -> bool:
    return isinstance(forward, partial) and forward.func in (_partial_query, _partial_output)
