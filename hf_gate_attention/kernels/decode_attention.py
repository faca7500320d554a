"""Triton split-KV ("flash-decoding") attention for short query lengths, with the gate in the merge.

Decode (one query per sequence) and short chunks (speculative decoding, chunked prefill; at most
`ops.MAX_DECODE_QUERIES` positions) have too few query rows for the flash kernel's (query block, head) grid
to fill a GPU, so the work is split over the keys instead (Flash-Decoding, Dao et al. 2023), in two kernels:

1. `_decode_split_kernel`, one program per (key chunk c, sequence b x group slot, row block): for each
   key/value group g its slot serves, the query rows of the `n = H / KV` heads that read g, all Lq of them
   (an `(n * Lq, D)` tile, padded to at least 16 rows for tl.dot; split into row blocks of `MAX_BLOCK_M`
   when larger), attend to the keys of chunk c with an online softmax and write the chunk's normalised output
   and log-sum-exp per row. A chunk past the filled length `kv_length` loads no key and value and writes the
   neutral partial `lse = -inf`; so does a tile whose heads top-k dropped at every query row.
2. `_decode_merge_kernel`, one program per block of (b, i, h) rows: combines the chunks by their log-sum-exp,
   applies `gate_scale * sigmoid(z) * keep` (float32) and writes `(B, Lq, H, D)` in the dtype of q.

Group slots: by default one per group. Top-k keeps at most `k * Lq` of the KV groups of a sequence; given
that bound (`kept_groups`), the grid has `min(kept_groups, KV)` slots per sequence, the kept groups go first
(ordered on the device, `_kept_groups_first`) and a slot serves the groups at positions `slot`,
`slot + slots`, ...: with the bound right, exactly the kept ones (a dropped group is never visited: the merge
skips its rows, whose keep is 0); with more kept groups than slots, the extra ones serially, so a wrong bound
costs time, never correctness. With sink/window reads the dropped groups come after the kept ones. Keeping 1
of 8 groups at batch 16 then launches 16 busy slots times enough chunks to fill the GPU, instead of 128
slots of which 112 have nothing to read and too few chunks for the 16 others (`gpu.py`'s 32k rows).

The number of chunks depends on shapes only (S, B * slots, the GPU's multiprocessor count), never on values,
and `kv_length` and `keep` are read on the device: a decode step launches the same grids every step, with no
host synchronisation (capturable in a CUDA graph). Forward only.

Layouts: q `(B, H, Lq, D)`, k/v `(B, KV, S, D)` with any strides and unit stride on D; z `(B, Lq, H, w)`,
keep `(B, Lq, H)`, key padding mask `(B, S)` int8, kv_length `(B,)` or `(1,)` int64, all contiguous; the
partials `(B * Lq * H, C, D)` and `(B * Lq * H, C)` float32, row `(b * Lq + i) * H + h` as in out. Causal:
query `i` sees key `j <= i + kv_length - Lq`. Rows without a visible key give 0.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .gate_multiply import gate_tile
from .gated_attention import (
    INTERPRET,
    INTERPRET_BLOCK,
    LOG2E,
    dot_flags,
    filled_length,
    fwd_key_blocks,
    optional_operands,
)

# Rows per split program (n * Lq rows of a group are split into blocks of at most this many) and keys per
# loop step. GPU values unmeasured; the interpreter's are small so that small tests span several blocks.
MAX_BLOCK_M = INTERPRET_BLOCK if INTERPRET else 64
BLOCK_N = INTERPRET_BLOCK if INTERPRET else 64
MERGE_BLOCK_R = 16  # rows per merge program
MAX_CHUNKS = 64
MIN_BLOCKS_PER_CHUNK = 1 if INTERPRET else 4  # at least 256 keys per program on a GPU


@triton.jit
def _kept_groups_first(KEEP, b, H, LQ, GROUP, BLOCK_KV: tl.constexpr, BLOCK_GL: tl.constexpr):
    """`(position (BLOCK_KV,), kept)`: the place of each key/value group of sequence `b` in an order where
    the `kept` groups that keep some row `(b, i, h)` come first, then the others, each in group order."""
    g = tl.arange(0, BLOCK_KV)
    j = tl.arange(0, BLOCK_GL)  # row hh * LQ + i of a group
    exists = g < H // GROUP  # (BLOCK_KV,)
    rows = (b * LQ + j[None, :] % LQ) * H + g[:, None] * GROUP + j[None, :] // LQ  # (BLOCK_KV, BLOCK_GL)
    keep = tl.load(KEEP + rows, mask=exists[:, None] & (j[None, :] < GROUP * LQ), other=0.0)
    is_kept = (tl.max(keep, 1) > 0).to(tl.int32)  # (BLOCK_KV,)
    is_dropped = exists.to(tl.int32) - is_kept
    kept = tl.sum(is_kept, 0)
    position = tl.where(
        is_kept > 0, tl.cumsum(is_kept, 0) - is_kept, kept + tl.cumsum(is_dropped, 0) - is_dropped
    )
    return tl.where(exists, position, BLOCK_KV + g), kept  # a padding lane matches no position


@triton.jit
def _decode_split_kernel(
    Q,
    K,
    V,
    KEEP,
    KPM,
    KV_LEN,
    SINK_STOP,
    WINDOW_START,
    PART_OUT,
    PART_LSE,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_kvl,
    H,
    LQ,
    S,
    D,
    GROUP,
    CHUNK,
    NUM_CHUNKS,
    SLOTS,
    sm_scale,
    CAUSAL: tl.constexpr,
    HAS_KPM: tl.constexpr,
    HAS_KV_LEN: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    STREAMING: tl.constexpr,
    KEPT_FIRST: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_GL: tl.constexpr,
):
    c = tl.program_id(0)
    b_slot = tl.program_id(1).to(tl.int64)
    b = b_slot // SLOTS
    slot = b_slot % SLOTS
    tile_row = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) row hh * LQ + i of a group
    row_ok = tile_row < GROUP * LQ
    i = tile_row % LQ  # (BLOCK_M,) query position
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    dim_ok = offs_d < D
    # this chunk's keys [start, chunk_end): none past the filled length
    filled = filled_length(KV_LEN, b, stride_kvl, S, HAS_KV_LEN)
    start = c * CHUNK
    chunk_end = tl.minimum(start + CHUNK, filled)
    KPM += b * S
    # with STREAMING, the dropped rows read keys < sink_stop and >= their window_start only
    sink_stop = 0
    window_start = tl.zeros([BLOCK_M], dtype=tl.int32)
    first_window = 0
    if STREAMING:
        sink_stop = tl.load(SINK_STOP + b).to(tl.int32)
        window_start = tl.load(WINDOW_START + b * LQ + i, mask=row_ok, other=S).to(tl.int32)  # (BLOCK_M,)
        first_window = tl.min(tl.where(row_ok, window_start, S), 0)

    # the groups of sequence b, `SLOTS` at a time: with KEPT_FIRST, the kept ones first (without STREAMING
    # only those: a dropped group reads nothing), so that the grid needs slots for the kept ones only
    positions = H // GROUP
    if KEPT_FIRST:
        group_position, kept_groups = _kept_groups_first(KEEP, b, H, LQ, GROUP, BLOCK_KV, BLOCK_GL)
        if not STREAMING:
            positions = kept_groups
    for position in range(slot, positions, SLOTS):
        g = position
        if KEPT_FIRST:
            g = tl.sum(tl.where(group_position == position, tl.arange(0, BLOCK_KV), 0), 0).to(tl.int64)
        h = g * GROUP + tile_row // LQ  # (BLOCK_M,) query head
        row = (b * LQ + i) * H + h  # (BLOCK_M,) row (b, i, h) of z, keep and the partials
        end = chunk_end
        if HAS_KEEP:  # none of the chunk's keys if top-k dropped every row's head
            row_kept = tl.load(KEEP + row, mask=row_ok, other=0.0) > 0  # (BLOCK_M,)
            kept = tl.max(row_kept.to(tl.int32), 0) > 0
        if HAS_KEEP and not STREAMING:
            end = tl.where(kept, end, start)
        # with STREAMING, a tile without a kept row runs [start, sink_end) and [window_from, end), whole key
        # blocks of the chunk, disjoint
        sink_end = end
        window_from = end
        if STREAMING:
            sink_end = tl.where(kept, end, tl.maximum(tl.minimum(end, sink_stop), start))
            sink_blocks_end = start + tl.cdiv(sink_end - start, BLOCK_N) * BLOCK_N
            window_from = start + tl.maximum(first_window - start, 0) // BLOCK_N * BLOCK_N
            window_from = tl.where(kept, end, tl.minimum(tl.maximum(window_from, sink_blocks_end), end))

        q_ptrs = Q + b * stride_qb + h[:, None] * stride_qh + i[:, None] * stride_ql + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT_DTYPE)  # (BLOCK_M, D)
        keys = K + b * stride_kb + g * stride_kh
        values = V + b * stride_vb + g * stride_vh
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        # CHUNK is a multiple of BLOCK_N: every key block lies in this chunk; the last is masked at `filled`
        if STREAMING:
            acc, l_i, m_i = fwd_key_blocks(
                acc, l_i, m_i, q, keys, values, KPM, i, offs_n, offs_d, dim_ok, stride_ks, stride_vs, start,
                sink_end, LQ, filled, sm_scale * LOG2E, True, CAUSAL, HAS_KPM, DOT_DTYPE, DOT_PRECISION,
                row_kept, sink_stop, window_start, True,
            )  # fmt: skip
            acc, l_i, m_i = fwd_key_blocks(
                acc, l_i, m_i, q, keys, values, KPM, i, offs_n, offs_d, dim_ok, stride_ks, stride_vs,
                window_from, end, LQ, filled, sm_scale * LOG2E, True, CAUSAL, HAS_KPM, DOT_DTYPE,
                DOT_PRECISION, row_kept, sink_stop, window_start, True,
            )  # fmt: skip
        else:
            acc, l_i, m_i = fwd_key_blocks(
                acc, l_i, m_i, q, keys, values, KPM, i, offs_n, offs_d, dim_ok, stride_ks, stride_vs, start,
                end, LQ, filled, sm_scale * LOG2E, True, CAUSAL, HAS_KPM, DOT_DTYPE, DOT_PRECISION,
            )  # fmt: skip

        has_key = l_i > 0
        l_safe = tl.where(has_key, l_i, 1.0)
        lse = tl.where(has_key, m_i + tl.math.log2(l_safe), float("-inf"))  # base 2; -inf: a neutral partial
        tl.store(PART_LSE + row * NUM_CHUNKS + c, lse, mask=row_ok)
        out_ptrs = PART_OUT + (row * NUM_CHUNKS + c)[:, None] * D + offs_d[None, :]
        tl.store(out_ptrs, acc / l_safe[:, None], mask=(row_ok & has_key)[:, None] & dim_ok[None, :])


@triton.jit
def _decode_merge_kernel(
    PART_OUT,
    PART_LSE,
    Z,
    KEEP,
    OUT,
    ROWS,
    D,
    NUM_CHUNKS,
    gate_scale,
    HAS_GATE: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) rows (b, i, h)
    row_ok = row < ROWS
    offs_d = tl.arange(0, BLOCK_D)
    dim_ok = offs_d < D
    tile_ok = row_ok[:, None] & dim_ok[None, :]
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    weight_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    written = row_ok  # (BLOCK_R,) rows whose partials the split wrote: not those of groups it skipped
    if HAS_KEEP:
        written = written & (tl.load(KEEP + row, mask=row_ok, other=0.0) > 0)
    for c in range(NUM_CHUNKS):  # online log-sum-exp merge of the chunks
        lse = tl.load(PART_LSE + row * NUM_CHUNKS + c, mask=written, other=float("-inf"))
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_safe)
        weight = tl.math.exp2(lse - m_safe)
        part_ptrs = PART_OUT + (row * NUM_CHUNKS + c)[:, None] * D + offs_d[None, :]
        part = tl.load(part_ptrs, mask=tile_ok & (lse > float("-inf"))[:, None], other=0.0)  # written ones
        acc = acc * alpha[:, None] + weight[:, None] * part
        weight_sum = weight_sum * alpha + weight
        m = m_new
    out = acc / tl.where(weight_sum > 0, weight_sum, 1.0)[:, None]  # rows with no visible key -> 0
    if HAS_GATE or HAS_KEEP:
        out = out * gate_tile(
            Z, KEEP, row, offs_d, row_ok, dim_ok, D, gate_scale, HAS_GATE, HAS_KEEP, ELEMENTWISE
        )
    tl.store(OUT + row[:, None] * D + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=tile_ok)


def streaming_bounds(key_padding_mask, kv_length, batch, length, keys, causal, sink, window, device):
    """`(sink_stop (B,), window_start (B, Lq))` int32: a dropped head of query `i` of sequence `b` reads the
    visible keys `j < sink_stop[b]` (the first `sink` keys that exist and are not padding) and
    `j >= window_start[b, i]` (the last `window` that query sees). Device ops only: no host sync."""
    filled = torch.full((batch,), keys, device=device) if kv_length is None else kv_length.expand(batch)
    valid = torch.arange(keys, device=device) < filled[:, None]  # (B, S) keys that exist
    if key_padding_mask is not None:
        valid = valid & key_padding_mask.bool()
    rank = valid.cumsum(-1)  # (B, S) how many valid keys up to each position
    if causal:  # query i is position i + filled - Lq: it sees the valid keys up to there
        position = torch.arange(length, device=device) + (filled - length)[:, None]  # (B, Lq)
        seen = rank.gather(1, position.clamp(0, keys - 1)) * (position >= 0)  # (B, Lq)
    else:
        seen = rank[:, -1:].expand(batch, length)
    never = torch.full((batch, 1), keys, device=device)
    sink_stop = torch.searchsorted(rank, torch.full_like(never, sink)) + 1 if sink > 0 else never * 0
    first = (seen - window + 1).clamp(min=1).contiguous()  # rank of the first window key
    window_start = torch.searchsorted(rank, first) if window > 0 else never.expand(batch, length)
    return sink_stop.flatten().to(torch.int32), window_start.to(torch.int32).contiguous()


@functools.cache
def _target_programs(device: torch.device) -> int:
    """Split programs that fill the device: two per multiprocessor (a few in the interpreter)."""
    if device.type != "cuda":
        return 8
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def num_key_chunks(keys: int, programs: int, device: torch.device) -> int:
    """Default number of key chunks, from shapes only: enough for `programs` (B * slots * row blocks) times
    the chunks to fill the device, at least `MIN_BLOCKS_PER_CHUNK` key blocks per chunk, at most
    `MAX_CHUNKS`."""
    chunks = triton.cdiv(_target_programs(device), programs)
    return max(1, min(chunks, triton.cdiv(keys, BLOCK_N * MIN_BLOCKS_PER_CHUNK), MAX_CHUNKS))


def decode_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None,
    keep: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    kv_length: torch.Tensor | None,
    gate_scale: float,
    causal: bool,
    sm_scale: float,
    num_chunks: int | None = None,
    top_k_sink: int = 0,
    top_k_window: int = 0,
    kept_groups: int | None = None,
) -> torch.Tensor:
    """Gated attention of a short query (arguments as in `gated_attention_reference`), split over `num_chunks`
    key chunks (default: `num_key_chunks`; fewer when S needs fewer) and, per sequence, over
    `min(kept_groups, KV)` group slots (default KV). Returns `(B, Lq, H, D)`, dtype of q."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1:3]
    group = heads // kv_heads
    (z, keep_, kpm, kv_len), stride_kvl, flags = optional_operands(
        q, gate_logits, keep, key_padding_mask, kv_length
    )
    block_m = min(MAX_BLOCK_M, max(16, triton.next_power_of_2(group * length)))
    row_blocks = triton.cdiv(group * length, block_m)
    # a slot serves the groups of a sequence one after another, kept ones first: with fewer slots than
    # groups, the grid and the chunk count are sized for the groups top-k keeps
    slots = kv_heads if keep is None or kept_groups is None else min(kept_groups, kv_heads)
    if num_chunks is None:
        num_chunks = num_key_chunks(keys, batch * slots * row_blocks, q.device)
    chunk = triton.cdiv(triton.cdiv(keys, num_chunks), BLOCK_N) * BLOCK_N  # keys per chunk, whole blocks
    num_chunks = triton.cdiv(keys, chunk)
    streaming = keep is not None and (top_k_sink > 0 or top_k_window > 0)
    sink_stop, window_start = q, q  # never read without streaming
    if streaming:
        sink_stop, window_start = streaming_bounds(
            key_padding_mask, kv_length, batch, length, keys, causal, top_k_sink, top_k_window, q.device
        )
    rows = batch * length * heads
    part_out = torch.empty(rows, num_chunks, dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(rows, num_chunks, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(dim))
    _decode_split_kernel[(num_chunks, batch * slots, row_blocks)](
        q, k, v, keep_, kpm, kv_len, sink_stop, window_start, part_out, part_lse, *q.stride()[:3],
        *k.stride()[:3], *v.stride()[:3], stride_kvl, heads, length, keys, dim, group, chunk, num_chunks,
        slots, sm_scale, CAUSAL=causal, HAS_KPM=flags["HAS_KPM"], HAS_KV_LEN=flags["HAS_KV_LEN"],
        HAS_KEEP=flags["HAS_KEEP"], STREAMING=streaming, KEPT_FIRST=slots < kv_heads, **dot_flags(q.dtype),
        BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_KV=triton.next_power_of_2(kv_heads),
        BLOCK_GL=triton.next_power_of_2(group * length),
    )  # fmt: skip
    out = torch.empty(batch, length, heads, dim, dtype=q.dtype, device=q.device)
    _decode_merge_kernel[(triton.cdiv(rows, MERGE_BLOCK_R),)](
        part_out, part_lse, z, keep_, out, rows, dim, num_chunks, gate_scale, HAS_GATE=flags["HAS_GATE"],
        HAS_KEEP=flags["HAS_KEEP"] and not streaming, ELEMENTWISE=flags["ELEMENTWISE"], BLOCK_D=block_d,
        BLOCK_R=MERGE_BLOCK_R,
    )  # fmt: skip
    return out
