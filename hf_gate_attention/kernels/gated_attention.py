"""Triton kernels of the fused gated flash attention, and their launchers.

Forward, one program per (query block, batch x head): online-softmax attention over the key blocks in base 2,
never materialising the L x S scores (FlashAttention-2; the Triton fused-attention tutorial), then the gate in
the epilogue: `out = A * g`, `A` the attention output, `g = gate_scale * sigmoid(z) * keep` in float32 (the
output gate, or the `qk` gate's per-query, per-head scale). It saves the log-sum-exp `lse` of each row. The
key blocks run in two loops: those that every query of the block sees (no mask), then the causal diagonal and
the sequence tail (masked). A (query block, head) tile whose `keep` values are all 0 runs no key block and
writes 0.

Backward: with `out = A * g` and `dA = dout * g`,

    delta = rowsum(dA * A) = rowsum(dout * out),   dz = dout * out * sigmoid(-z)  (summed over D if headwise),

so only the gated output is saved (no ungated copy, no division by a gate that may be 0). A preprocessing
kernel computes `delta` and `dz`; one kernel per (key block, batch x key head) accumulates dK and dV over the
query heads that share the key head (GQA without atomics); one kernel per (query block, batch x head)
accumulates dQ. Both recompute `dA = dout * g` from the gate logits and skip the (query block, head) tiles
whose `keep` values are all 0.

Layouts: q `(B, H, L, D)`, k/v `(B, KV, S, D)` with any strides and unit stride on D; out/dout `(B, L, H, D)`,
z `(B, L, H, w)`, keep `(B, L, H)`, key padding mask `(B, S)` int8, kv_length `(B,)` or `(1,)` int64,
lse/delta `(B, H, L)` float32, dq/dk/dv like q/k/v, all contiguous. `kv_length` (a static cache's filled
length, read on the device): only keys `j < kv_length` exist, the others are never loaded (their dk, dv are
0); without it every key exists (`kv_length = S`). Causal: query `i` sees key `j <= i + kv_length - L`. Rows
without a visible key give 0 and `lse = +inf`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gate_multiply import gate_logits_tile, gate_tile

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _probe():
    pass


# Under TRITON_INTERPRET=1 (read by triton.jit when this module is imported) the kernels run on CPU tensors.
INTERPRET = not isinstance(_probe, triton.runtime.JITFunction)
# Block size in the interpreter: small, so that small test shapes span several blocks.
INTERPRET_BLOCK = 16
_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def _configs(gpu_blocks: tuple[tuple[int, int, int, int], ...]) -> list[triton.Config]:
    """Autotuning candidates from `(BLOCK_M, BLOCK_N, num_warps, num_stages)`; one in the interpreter."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": INTERPRET_BLOCK, "BLOCK_N": INTERPRET_BLOCK})]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)
        for m, n, warps, stages in gpu_blocks
    ]


# Tuned again per head dim and causality (the autotuner adds the tensors' dtypes to the key). Two candidates
# per kernel: every candidate is one more compilation on a model's first call (4 each took 125 s for the
# first forward + backward + generate of a small model on an H200). Each head dim 64 and 128 has a candidate
# that ptxas compiles for sm_90 without register spills (tests/kernels/hopper_compile.py).
_TUNING_KEY = ["BLOCK_D", "CAUSAL"]
_PREPROCESS_BLOCK_M = INTERPRET_BLOCK if INTERPRET else 32


@triton.jit
def filled_length(KV_LEN, b, stride_kvl, S, HAS_KV_LEN: tl.constexpr):
    """The number of keys of sequence `b` that exist: `kv_length[b]` clamped to `[0, S]`, or `S`."""
    filled = S
    if HAS_KV_LEN:
        filled = tl.minimum(tl.maximum(tl.load(KV_LEN + b * stride_kvl), 0), S).to(tl.int32)
    return filled


@triton.jit
def _key_range(start_m, L, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks of the query rows `[start_m, start_m + BLOCK_M)`: every row sees all keys of `[0, full_end)`
    (no mask); `[full_end, end)` needs the causal and sequence-end mask."""
    if CAUSAL:
        end = tl.minimum(tl.maximum(tl.minimum(start_m + BLOCK_M, L) + S - L, 0), S)
        full_end = tl.minimum(tl.maximum(start_m + 1 + S - L, 0), S) // BLOCK_N * BLOCK_N
    else:
        end = S
        full_end = S // BLOCK_N * BLOCK_N
    return full_end, end


@triton.jit
def _query_tile(H, L, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The (query block, batch x head) tile of this program: `start_m`, `bh`, `b`, `h`, the query positions
    `rows (BLOCK_M,)` and their masks, and `column`/`gate_row`, which locate row i of head h in the
    `(B, L, H, ...)` tensors (out, dout, z, keep): element `column + gate_row[i]`."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < L
    dim_ok = offs_d < D
    tile_ok = row_ok[:, None] & dim_ok[None, :]
    column = b * L * H + h  # element (b, 0, h) of the (B, L, H, ...) tensors; query i is i * H rows further
    gate_row = rows * H  # (BLOCK_M,)
    return start_m, bh, b, h, rows, offs_d, row_ok, dim_ok, tile_ok, column, gate_row


@triton.jit
def _kept_key_range(
    KEEP, gate_row, row_ok, start_m, L, S, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KEEP: tl.constexpr,
):  # fmt: skip
    """`_key_range` of a query tile, empty when top-k dropped its head at every row (`KEEP` at (b, 0, h))."""
    full_end, end = _key_range(start_m, L, S, BLOCK_M, BLOCK_N, CAUSAL)
    if HAS_KEEP:
        tile_kept = tl.max(tl.load(KEEP + gate_row, mask=row_ok, other=0.0), 0) > 0
        full_end = tl.where(tile_kept, full_end, 0)
        end = tl.where(tile_kept, end, 0)
    return full_end, end


@triton.jit
def fwd_key_blocks(
    acc,
    l_i,
    m_i,
    q,
    K,
    V,
    KPM,
    rows,
    offs_n,
    offs_d,
    dim_ok,
    stride_ks,
    stride_vs,
    start,
    end,
    L,
    S,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KPM: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    reads_all=None,
    sink_stop=None,
    window_start=None,
    STREAMING: tl.constexpr = False,
):
    """Online softmax of one query tile over the key blocks `[start, end)` of the `S` keys that exist (`S`:
    the filled length): `acc (BLOCK_M, BLOCK_D)`, the running sums `l_i` and maxima `m_i (BLOCK_M,)` of the
    base-2 scores, all float32. `KPM` points at the sequence's row (padding keys are neither loaded nor
    seen). With `STREAMING`, a row that does not
    `reads_all (BLOCK_M,)` sees only keys `< sink_stop` or `>= window_start (BLOCK_M,)`, and a key no row
    sees is not loaded."""
    for start_n in range(start, end, offs_n.shape[0]):
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        col_ok = cols < S
        if HAS_KPM:  # padding keys are not loaded
            col_ok = col_ok & (tl.load(KPM + cols, mask=col_ok, other=0) != 0)  # (BLOCK_N,)
        if STREAMING:
            reads = (
                reads_all[:, None] | (cols[None, :] < sink_stop) | (cols[None, :] >= window_start[:, None])
            )
            col_ok = col_ok & (tl.max(reads.to(tl.int32), 0) > 0)  # (BLOCK_N,) keys some row reads
        tile_ok = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + cols[:, None] * stride_ks + offs_d[None, :], mask=tile_ok, other=0.0).to(DOT_DTYPE)
        v = tl.load(V + cols[:, None] * stride_vs + offs_d[None, :], mask=tile_ok, other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        if MASKED:
            visible = col_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + S - L)
            scores = tl.where(visible, scores, float("-inf"))
        if HAS_KPM:
            scores = tl.where(col_ok[None, :], scores, float("-inf"))
        if STREAMING:
            scores = tl.where(reads & col_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
        p = tl.math.exp2(scores - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(V.dtype.element_ty).to(DOT_DTYPE)  # rounded to the input dtype, as the tensor cores take it
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(_configs(((128, 64, 4, 3), (64, 64, 4, 3))), key=_TUNING_KEY)
@triton.jit
def _gated_attention_fwd_kernel(
    Q,
    K,
    V,
    Z,
    KEEP,
    KPM,
    KV_LEN,
    OUT,
    LSE,
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
    L,
    S,
    D,
    GROUP,
    sm_scale,
    gate_scale,
    CAUSAL: tl.constexpr,
    HAS_KPM: tl.constexpr,
    HAS_KV_LEN: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m, bh, b, h, rows, offs_d, row_ok, dim_ok, tile_ok, column, gate_row = _query_tile(
        H, L, D, BLOCK_M, BLOCK_D
    )
    offs_n = tl.arange(0, BLOCK_N)
    OUT += column * D
    Z += column * (D if ELEMENTWISE else 1)
    KEEP += column
    filled = filled_length(KV_LEN, b, stride_kvl, S, HAS_KV_LEN)
    # top-k: a tile of dropped heads only computes nothing
    full_end, end = _kept_key_range(
        KEEP, gate_row, row_ok, start_m, L, filled, BLOCK_M, BLOCK_N, CAUSAL, HAS_KEEP
    )

    q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_ql + offs_d[None, :]
    q = tl.load(q_ptrs, mask=tile_ok, other=0.0).to(DOT_DTYPE)  # (BLOCK_M, BLOCK_D)
    K += b * stride_kb + (h // GROUP) * stride_kh
    V += b * stride_vb + (h // GROUP) * stride_vh
    KPM += b * S
    qk_scale = sm_scale * LOG2E
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    acc, l_i, m_i = fwd_key_blocks(
        acc, l_i, m_i, q, K, V, KPM, rows, offs_n, offs_d, dim_ok, stride_ks, stride_vs, 0, full_end, L,
        filled, qk_scale, False, CAUSAL, HAS_KPM, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = fwd_key_blocks(
        acc, l_i, m_i, q, K, V, KPM, rows, offs_n, offs_d, dim_ok, stride_ks, stride_vs, full_end, end, L,
        filled, qk_scale, True, CAUSAL, HAS_KPM, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip

    has_key = l_i > 0
    l_safe = tl.where(has_key, l_i, 1.0)
    attn = acc / l_safe[:, None]  # (BLOCK_M, BLOCK_D); rows with no visible key -> 0
    lse = tl.where(has_key, (m_i + tl.math.log2(l_safe)) / LOG2E, float("inf"))
    tl.store(LSE + bh * L + rows, lse, mask=row_ok)
    if HAS_GATE or HAS_KEEP:
        gate = gate_tile(
            Z, KEEP, gate_row, offs_d, row_ok, dim_ok, D, gate_scale, HAS_GATE, HAS_KEEP, ELEMENTWISE
        )
        attn = attn * gate
    tl.store(OUT + gate_row[:, None] * D + offs_d[None, :], attn.to(OUT.dtype.element_ty), mask=tile_ok)


@triton.jit
def _gated_attention_bwd_preprocess_kernel(
    OUT,
    DOUT,
    Z,
    DZ,
    DELTA,
    H,
    L,
    D,
    HAS_GATE: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """`delta = rowsum(dout * out)` and the gate logits' gradient `dz = dout * out * sigmoid(-z)`."""
    _, bh, _, _, rows, offs_d, row_ok, dim_ok, tile_ok, column, gate_row = _query_tile(
        H, L, D, BLOCK_M, BLOCK_D
    )
    OUT += column * D
    DOUT += column * D
    Z += column * (D if ELEMENTWISE else 1)
    DZ += column * (D if ELEMENTWISE else 1)
    offsets = gate_row[:, None] * D + offs_d[None, :]
    dout = tl.load(DOUT + offsets, mask=tile_ok, other=0.0).to(tl.float32)
    dout_out = dout * tl.load(OUT + offsets, mask=tile_ok, other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_D)
    delta = tl.sum(dout_out, 1)
    tl.store(DELTA + bh * L + rows, delta, mask=row_ok)
    if HAS_GATE:
        complement = tl.sigmoid(-gate_logits_tile(Z, gate_row, offs_d, row_ok, dim_ok, D, ELEMENTWISE))
        if ELEMENTWISE:
            tl.store(DZ + offsets, (dout_out * complement).to(DZ.dtype.element_ty), mask=tile_ok)
        else:
            tl.store(DZ + gate_row, (delta * complement).to(DZ.dtype.element_ty), mask=row_ok)


@triton.jit
def _dkdv_query_blocks(
    dk,
    dv,
    k,
    v,
    Q,
    DOUT,
    Z,
    KEEP,
    LSE,
    DELTA,
    cols,
    offs_m,
    offs_d,
    dim_ok,
    stride_ql,
    H,
    L,
    S,
    D,
    start,
    end,
    qk_scale,
    gate_scale,
    MASKED: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Accumulate `dk, dv (BLOCK_N, BLOCK_D)` of one key tile over the query blocks `[start, end)` of one
    head: `Q`, `LSE`, `DELTA` point at its (b, h) rows, `DOUT`, `Z`, `KEEP` at its element (b, 0, h).

    Key columns past the filled length `S` or padded are not masked: each column only feeds its own dk/dv
    rows, which the caller drops or zeroes."""
    for start_m in range(start, end, offs_m.shape[0]):
        rows = start_m + offs_m  # (BLOCK_M,) query positions
        row_ok = rows < L
        gate_row = rows * H
        tile_kept = True
        if HAS_KEEP:  # top-k: a tile of dropped heads only has dA = 0
            tile_kept = tl.max(tl.load(KEEP + gate_row, mask=row_ok, other=0.0), 0) > 0
        if tile_kept:
            tile_ok = row_ok[:, None] & dim_ok[None, :]
            q = tl.load(Q + rows[:, None] * stride_ql + offs_d[None, :], mask=tile_ok, other=0.0)
            do = tl.load(DOUT + gate_row[:, None] * D + offs_d[None, :], mask=tile_ok, other=0.0)
            if HAS_GATE or HAS_KEEP:  # dA = dout * g
                gate = gate_tile(
                    Z, KEEP, gate_row, offs_d, row_ok, dim_ok, D, gate_scale, HAS_GATE, HAS_KEEP, ELEMENTWISE
                )
                do = (do.to(tl.float32) * gate).to(DOUT.dtype.element_ty)
            q = q.to(DOT_DTYPE)
            do = do.to(DOT_DTYPE)
            lse = tl.load(LSE + rows, mask=row_ok, other=float("inf")) * LOG2E
            delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
            s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
            p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
            if MASKED:
                p_t = tl.where(cols[:, None] <= rows[None, :] + S - L, p_t, 0.0)
            dv += tl.dot(p_t.to(DOUT.dtype.element_ty).to(DOT_DTYPE), do, input_precision=DOT_PRECISION)
            dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
            ds_t = (p_t * (dp_t - delta[None, :])).to(Q.dtype.element_ty).to(DOT_DTYPE)
            dk += tl.dot(ds_t, q, input_precision=DOT_PRECISION)
    return dk, dv


# (32, 128, 4, 3) before: it spilled 240 bytes a thread at head dim 64 and 2516 at 128 (Triton 3.9 for sm_90)
@triton.autotune(_configs(((64, 128, 8, 2), (16, 128, 8, 2))), key=_TUNING_KEY)
@triton.jit
def _gated_attention_bwd_dkdv_kernel(
    Q,
    K,
    V,
    Z,
    KEEP,
    KPM,
    KV_LEN,
    DOUT,
    LSE,
    DELTA,
    DK,
    DV,
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
    L,
    S,
    D,
    GROUP,
    sm_scale,
    gate_scale,
    CAUSAL: tl.constexpr,
    HAS_KPM: tl.constexpr,
    HAS_KV_LEN: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    bkv = tl.program_id(1).to(tl.int64)
    kv_heads = H // GROUP
    b = bkv // kv_heads
    kvh = bkv % kv_heads
    cols = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    filled = filled_length(KV_LEN, b, stride_kvl, S, HAS_KV_LEN)
    col_ok = cols < S
    dim_ok = offs_d < D
    tile_ok = col_ok[:, None] & dim_ok[None, :]
    load_ok = (cols < filled)[:, None] & dim_ok[None, :]  # keys past the filled length are never read
    k_ptrs = K + b * stride_kb + kvh * stride_kh + cols[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = V + b * stride_vb + kvh * stride_vh + cols[:, None] * stride_vs + offs_d[None, :]
    k = tl.load(k_ptrs, mask=load_ok, other=0.0).to(DOT_DTYPE)  # (BLOCK_N, BLOCK_D)
    v = tl.load(v_ptrs, mask=load_ok, other=0.0).to(DOT_DTYPE)

    # Query blocks that see a key of this block: [start, L); those before full_start need the causal mask.
    start = 0
    full_start = 0
    if CAUSAL:
        start = tl.maximum(start_n - (filled - L), 0) // BLOCK_M * BLOCK_M
        full_start = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - (filled - L), 0), BLOCK_M) * BLOCK_M
        full_start = tl.maximum(tl.minimum(full_start, L), start)
    if HAS_KV_LEN:  # a block past the filled length only has no gradient
        start = tl.where(start_n < filled, start, L)
        full_start = tl.where(start_n < filled, full_start, L)
    if HAS_KPM:  # a block of padded keys only has no gradient
        attend = tl.load(KPM + b * S + cols, mask=col_ok, other=0) != 0  # (BLOCK_N,)
        any_attended = tl.max(attend.to(tl.int32), 0) > 0
        start = tl.where(any_attended, start, L)
        full_start = tl.where(any_attended, full_start, L)

    qk_scale = sm_scale * LOG2E
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for h in range(kvh * GROUP, kvh * GROUP + GROUP):  # the query heads reading this key head
        q_head = Q + b * stride_qb + h * stride_qh
        lse_head = LSE + (b * H + h) * L
        delta_head = DELTA + (b * H + h) * L
        column = b * L * H + h  # element (b, 0, h) of the (B, L, H, ...) tensors
        dout_head = DOUT + column * D
        z_head = Z + column * (D if ELEMENTWISE else 1)
        keep_head = KEEP + column
        dk, dv = _dkdv_query_blocks(
            dk, dv, k, v, q_head, dout_head, z_head, keep_head, lse_head, delta_head, cols, offs_m, offs_d,
            dim_ok, stride_ql, H, L, filled, D, start, full_start, qk_scale, gate_scale, True, HAS_GATE,
            HAS_KEEP, ELEMENTWISE, DOT_DTYPE, DOT_PRECISION,
        )  # fmt: skip
        dk, dv = _dkdv_query_blocks(
            dk, dv, k, v, q_head, dout_head, z_head, keep_head, lse_head, delta_head, cols, offs_m, offs_d,
            dim_ok, stride_ql, H, L, filled, D, full_start, L, qk_scale, gate_scale, False, HAS_GATE,
            HAS_KEEP, ELEMENTWISE, DOT_DTYPE, DOT_PRECISION,
        )  # fmt: skip
    if HAS_KPM:  # padded keys get no gradient
        dk = tl.where(attend[:, None], dk, 0.0)
        dv = tl.where(attend[:, None], dv, 0.0)
    if HAS_KV_LEN:  # nor do keys past the filled length
        dk = tl.where(cols[:, None] < filled, dk, 0.0)
        dv = tl.where(cols[:, None] < filled, dv, 0.0)
    offsets = cols[:, None] * D + offs_d[None, :]
    DK += bkv * S * D
    DV += bkv * S * D
    tl.store(DK + offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=tile_ok)
    tl.store(DV + offsets, dv.to(DV.dtype.element_ty), mask=tile_ok)


@triton.jit
def _dq_key_blocks(
    dq,
    q,
    do,
    lse,
    delta,
    K,
    V,
    KPM,
    rows,
    offs_n,
    offs_d,
    dim_ok,
    stride_ks,
    stride_vs,
    start,
    end,
    L,
    S,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KPM: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Accumulate `dq (BLOCK_M, BLOCK_D)` of one query tile over the key blocks `[start, end)`."""
    for start_n in range(start, end, offs_n.shape[0]):
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        col_ok = cols < S
        tile_ok = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(K + cols[:, None] * stride_ks + offs_d[None, :], mask=tile_ok, other=0.0).to(DOT_DTYPE)
        v = tl.load(V + cols[:, None] * stride_vs + offs_d[None, :], mask=tile_ok, other=0.0).to(DOT_DTYPE)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        p = tl.math.exp2(scores * qk_scale - lse[:, None])
        if MASKED:
            visible = col_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + S - L)
            p = tl.where(visible, p, 0.0)
        if HAS_KPM:
            attend = tl.load(KPM + cols, mask=col_ok, other=0)  # (BLOCK_N,)
            p = tl.where(attend[None, :] != 0, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = (p * (dp - delta[:, None])).to(K.dtype.element_ty).to(DOT_DTYPE)
        dq += tl.dot(ds, k, input_precision=DOT_PRECISION)
    return dq


@triton.autotune(_configs(((128, 64, 8, 3), (64, 32, 4, 3))), key=_TUNING_KEY)
@triton.jit
def _gated_attention_bwd_dq_kernel(
    Q,
    K,
    V,
    Z,
    KEEP,
    KPM,
    KV_LEN,
    DOUT,
    LSE,
    DELTA,
    DQ,
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
    L,
    S,
    D,
    GROUP,
    sm_scale,
    gate_scale,
    CAUSAL: tl.constexpr,
    HAS_KPM: tl.constexpr,
    HAS_KV_LEN: tl.constexpr,
    HAS_GATE: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    start_m, bh, b, h, rows, offs_d, row_ok, dim_ok, tile_ok, column, gate_row = _query_tile(
        H, L, D, BLOCK_M, BLOCK_D
    )
    offs_n = tl.arange(0, BLOCK_N)
    DOUT += column * D
    Z += column * (D if ELEMENTWISE else 1)
    KEEP += column
    filled = filled_length(KV_LEN, b, stride_kvl, S, HAS_KV_LEN)
    # top-k: a tile of dropped heads only has dA = 0, so dq = 0
    full_end, end = _kept_key_range(
        KEEP, gate_row, row_ok, start_m, L, filled, BLOCK_M, BLOCK_N, CAUSAL, HAS_KEEP
    )

    q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_ql + offs_d[None, :]
    q = tl.load(q_ptrs, mask=tile_ok, other=0.0).to(DOT_DTYPE)  # (BLOCK_M, BLOCK_D)
    do = tl.load(DOUT + gate_row[:, None] * D + offs_d[None, :], mask=tile_ok, other=0.0)
    if HAS_GATE or HAS_KEEP:  # dA = dout * g
        gate = gate_tile(
            Z, KEEP, gate_row, offs_d, row_ok, dim_ok, D, gate_scale, HAS_GATE, HAS_KEEP, ELEMENTWISE
        )
        do = (do.to(tl.float32) * gate).to(DOUT.dtype.element_ty)
    do = do.to(DOT_DTYPE)
    lse = tl.load(LSE + bh * L + rows, mask=row_ok, other=float("inf")) * LOG2E
    delta = tl.load(DELTA + bh * L + rows, mask=row_ok, other=0.0)
    K += b * stride_kb + (h // GROUP) * stride_kh
    V += b * stride_vb + (h // GROUP) * stride_vh
    KPM += b * S
    qk_scale = sm_scale * LOG2E
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = _dq_key_blocks(
        dq, q, do, lse, delta, K, V, KPM, rows, offs_n, offs_d, dim_ok, stride_ks, stride_vs, 0, full_end, L,
        filled, qk_scale, False, CAUSAL, HAS_KPM, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip
    dq = _dq_key_blocks(
        dq, q, do, lse, delta, K, V, KPM, rows, offs_n, offs_d, dim_ok, stride_ks, stride_vs, full_end, end,
        L, filled, qk_scale, True, CAUSAL, HAS_KPM, DOT_DTYPE, DOT_PRECISION,
    )  # fmt: skip
    dq_ptrs = DQ + bh * L * D + rows[:, None] * D + offs_d[None, :]
    tl.store(dq_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=tile_ok)


def dot_flags(dtype: torch.dtype) -> dict:
    """The tl.dot operand dtype and precision for inputs of `dtype`: the interpreter multiplies bfloat16
    wrongly, so it gets float32 (16-bit products are exact in float32: the GPU's float32-accumulating dot
    gives the same); float32 in full precision."""
    return {
        "DOT_DTYPE": tl.float32 if INTERPRET else _TL_DTYPES[dtype],
        "DOT_PRECISION": "ieee" if INTERPRET or dtype == torch.float32 else "tf32",
    }


def optional_operands(q, gate_logits, keep, key_padding_mask, kv_length):
    """The optional inputs in kernel layout (an absent one is passed as q, never read), the stride of
    kv_length (0 when one length serves the batch) and their compile-time flags."""
    z = gate_logits.contiguous() if gate_logits is not None else q
    keep_ = keep.contiguous() if keep is not None else q
    kpm = key_padding_mask.contiguous().view(torch.int8) if key_padding_mask is not None else q
    kv_len = kv_length.contiguous() if kv_length is not None else q
    stride_kvl = 1 if kv_length is not None and kv_length.shape[0] > 1 else 0
    flags = {
        "HAS_KPM": key_padding_mask is not None,
        "HAS_KV_LEN": kv_length is not None,
        "HAS_GATE": gate_logits is not None,
        "HAS_KEEP": keep is not None,
        "ELEMENTWISE": gate_logits is not None and gate_logits.shape[-1] != 1,
    }
    return (z, keep_, kpm, kv_len), stride_kvl, flags


def _kernel_operands(q, k, v, gate_logits, keep, key_padding_mask, kv_length, causal):
    """Inputs in kernel layout; their strides and the sizes; the compile-time flags of all kernels."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    heads, length, dim = q.shape[1:]
    kv_heads, keys = k.shape[1:3]
    optional, stride_kvl, flags = optional_operands(q, gate_logits, keep, key_padding_mask, kv_length)
    tensors = (q, k, v, *optional)
    sizes = (
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], stride_kvl, heads, length, keys, dim,
        heads // kv_heads,
    )  # fmt: skip
    flags = {
        "CAUSAL": causal,
        **flags,
        **dot_flags(q.dtype),
        "BLOCK_D": max(16, triton.next_power_of_2(dim)),
    }
    return tensors, sizes, flags


def gated_attention_forward(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated attention and the log-sum-exp of each row (arguments as in `gated_attention_reference`).

    Returns:
        out (`torch.Tensor` of shape `(B, L, H, D)`, dtype of q) and lse (`torch.Tensor` of shape `(B, H, L)`,
        float32, `+inf` for rows without a visible key).
    """
    batch, heads, length, dim = q.shape
    tensors, sizes, flags = _kernel_operands(q, k, v, gate_logits, keep, key_padding_mask, kv_length, causal)
    out = torch.empty(batch, length, heads, dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, length, dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(length, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    _gated_attention_fwd_kernel[grid](*tensors, out, lse, *sizes, sm_scale, gate_scale, **flags)
    return out, lse


def gated_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None,
    keep: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    kv_length: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    gate_scale: float,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of `gated_attention_forward` given `grad_out (B, L, H, D)` and its saved `out` and `lse`.

    Returns:
        dq `(B, H, L, D)`, dk and dv `(B, KV, S, D)` in the dtype of q, and the gradient of the gate logits
        `(B, L, H, w)` in their dtype (`None` without gate logits).
    """
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1:3]
    tensors, sizes, flags = _kernel_operands(q, k, v, gate_logits, keep, key_padding_mask, kv_length, causal)
    z = tensors[3]
    grad_out = grad_out.contiguous()
    grad_logits = torch.empty_like(z) if gate_logits is not None else None
    delta = torch.empty_like(lse)
    _gated_attention_bwd_preprocess_kernel[(triton.cdiv(length, _PREPROCESS_BLOCK_M), batch * heads)](
        out.contiguous(), grad_out, z, z if grad_logits is None else grad_logits, delta, heads, length, dim,
        HAS_GATE=flags["HAS_GATE"], ELEMENTWISE=flags["ELEMENTWISE"], BLOCK_D=flags["BLOCK_D"],
        BLOCK_M=_PREPROCESS_BLOCK_M,
    )  # fmt: skip
    grad_k = torch.empty(batch, kv_heads, keys, dim, dtype=k.dtype, device=k.device)
    grad_v = torch.empty(batch, kv_heads, keys, dim, dtype=v.dtype, device=v.device)
    grid = lambda meta: (triton.cdiv(keys, meta["BLOCK_N"]), batch * kv_heads)  # noqa: E731
    _gated_attention_bwd_dkdv_kernel[grid](
        *tensors, grad_out, lse, delta, grad_k, grad_v, *sizes, sm_scale, gate_scale, **flags
    )
    grad_q = torch.empty(batch, heads, length, dim, dtype=q.dtype, device=q.device)
    grid = lambda meta: (triton.cdiv(length, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    _gated_attention_bwd_dq_kernel[grid](
        *tensors, grad_out, lse, delta, grad_q, *sizes, sm_scale, gate_scale, **flags
    )
    return grad_q, grad_k, grad_v, grad_logits
