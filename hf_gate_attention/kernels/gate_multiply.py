"""Triton kernels of the fused sigmoid-gate-multiply `out = x * s * sigmoid(z) * keep`, and their launchers.

One pass over `x` instead of the separate sigmoid, multiply and their backward; the sigmoid is computed in
float32 and recomputed in the backward instead of stored (Liger style). For attention computed by another
backend (torch SDPA, flash_attention_2) and for the value gate.

Layouts: `x` is seen as `(N, G, D)` (N = product of the leading dims; any strides, unit stride on D), rows
`r = n * G + g`; `z` is `(N, G, w)` with `w` = 1 (headwise) or D (elementwise), any stride over N and
contiguous `(G, w)` rows (so the gate columns of a merged `[q | gate]` projection are read in place), `keep`
`(N * G,)` contiguous; `out`, `dx` are `(N, G, D)` contiguous, `dz` is `(N, G, w)` contiguous.

`gate_logits_tile` and `gate_tile` are shared with the fused attention, whose gate rows `(b, i, h)` of a
`(B, L, H, w)` tensor are indexed the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements per program: BLOCK_R rows x BLOCK_D (the head dim rounded up to a power of 2) columns.
_BLOCK_ELEMENTS = 4096


@triton.jit
def _logits_at(Z, z_offset, offs_d, row_ok, dim_ok, ELEMENTWISE: tl.constexpr):
    """Gate logits in float32 of the rows starting at `z_offset (BLOCK,)` of `Z`: `(BLOCK, BLOCK_D)`
    elementwise, `(BLOCK,)` headwise."""
    if ELEMENTWISE:
        z = tl.load(
            Z + z_offset[:, None] + offs_d[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0
        )
    else:
        z = tl.load(Z + z_offset, mask=row_ok, other=0.0)
    return z.to(tl.float32)


@triton.jit
def gate_logits_tile(Z, row, offs_d, row_ok, dim_ok, D, ELEMENTWISE: tl.constexpr):
    """Gate logits of a tile in float32: `(BLOCK, BLOCK_D)` elementwise, `(BLOCK,)` headwise.

    `row`: `(BLOCK,)` row indices of `Z` (`(rows, w)` contiguous)."""
    z_offset = row * D if ELEMENTWISE else row
    return _logits_at(Z, z_offset, offs_d, row_ok, dim_ok, ELEMENTWISE)


@triton.jit
def gate_tile(
    Z,
    KEEP,
    row,
    offs_d,
    row_ok,
    dim_ok,
    D,
    gate_scale,
    HAS_GATE: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
):
    """The gate `gate_scale * sigmoid(z) * keep` of a tile in float32, `(BLOCK, BLOCK_D)` or `(BLOCK, 1)`.

    Only called with `HAS_GATE or HAS_KEEP`; without `HAS_GATE` the gate is `keep`."""
    if HAS_GATE:
        gate = gate_scale * tl.sigmoid(gate_logits_tile(Z, row, offs_d, row_ok, dim_ok, D, ELEMENTWISE))
        if not ELEMENTWISE:
            gate = gate[:, None]
        if HAS_KEEP:
            gate = gate * tl.load(KEEP + row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    else:
        gate = tl.load(KEEP + row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    return gate


@triton.jit
def _values_tile(
    X,
    stride_xn,
    stride_xg,
    stride_zn,
    rows_total,
    G,
    D,
    ELEMENTWISE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """This program's rows `r = n * G + g (BLOCK_R,)`, their masks, the values tile `x (BLOCK_R, BLOCK_D)`
    (in the values' dtype) of `X` seen as `(N, G, D)` and the offsets of the rows' gate logits in `Z`."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) index of (n, g)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = row < rows_total
    dim_ok = offs_d < D
    tile_ok = row_ok[:, None] & dim_ok[None, :]
    n, g = row // G, row % G
    x = tl.load(X + (n * stride_xn + g * stride_xg)[:, None] + offs_d[None, :], mask=tile_ok, other=0.0)
    z_offset = n * stride_zn + (g * D if ELEMENTWISE else g)
    return row, offs_d, row_ok, dim_ok, tile_ok, x, z_offset


@triton.jit
def _gate_multiply_fwd_kernel(
    X,
    Z,
    KEEP,
    OUT,
    stride_xn,
    stride_xg,
    stride_zn,
    rows_total,
    G,
    D,
    gate_scale,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row, offs_d, row_ok, dim_ok, tile_ok, x, z_offset = _values_tile(
        X, stride_xn, stride_xg, stride_zn, rows_total, G, D, ELEMENTWISE, BLOCK_R, BLOCK_D
    )
    z = _logits_at(Z, z_offset, offs_d, row_ok, dim_ok, ELEMENTWISE)
    gate = gate_scale * tl.sigmoid(z if ELEMENTWISE else z[:, None])  # (BLOCK_R, BLOCK_D) or (BLOCK_R, 1)
    if HAS_KEEP:
        gate = gate * tl.load(KEEP + row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    out = x.to(tl.float32) * gate
    tl.store(OUT + row[:, None] * D + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=tile_ok)


@triton.jit
def _gate_multiply_bwd_kernel(
    DOUT,
    X,
    Z,
    KEEP,
    DX,
    DZ,
    stride_xn,
    stride_xg,
    stride_zn,
    rows_total,
    G,
    D,
    gate_scale,
    HAS_KEEP: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row, offs_d, row_ok, dim_ok, tile_ok, x, z_offset = _values_tile(
        X, stride_xn, stride_xg, stride_zn, rows_total, G, D, ELEMENTWISE, BLOCK_R, BLOCK_D
    )
    x = x.to(tl.float32)
    dout = tl.load(DOUT + row[:, None] * D + offs_d[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    z = _logits_at(Z, z_offset, offs_d, row_ok, dim_ok, ELEMENTWISE)
    if not ELEMENTWISE:
        z = z[:, None]
    gate = gate_scale * tl.sigmoid(z)  # (BLOCK_R, BLOCK_D) or (BLOCK_R, 1)
    if HAS_KEEP:
        gate = gate * tl.load(KEEP + row, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(DX + row[:, None] * D + offs_d[None, :], (dout * gate).to(DX.dtype.element_ty), mask=tile_ok)
    # d out / d z = x * gate * (1 - sigmoid(z)), and 1 - sigmoid(z) = sigmoid(-z)
    dz_terms = dout * x * gate * tl.sigmoid(-z)
    if ELEMENTWISE:
        tl.store(DZ + row[:, None] * D + offs_d[None, :], dz_terms.to(DZ.dtype.element_ty), mask=tile_ok)
    else:
        tl.store(DZ + row, tl.sum(dz_terms, 1).to(DZ.dtype.element_ty), mask=row_ok)


def _rows_view(tensor: torch.Tensor, row_contiguous: bool = False) -> torch.Tensor:
    """`tensor (*, G, w)` as `(N, G, w)` with unit stride on w (and contiguous `(G, w)` rows if
    `row_contiguous`): a view when the strides allow it, else a copy."""
    unit = tensor.stride(-1) == 1 and (not row_contiguous or tensor.stride(-2) == tensor.shape[-1])
    tensor = tensor if unit else tensor.contiguous()
    return tensor.reshape(-1, *tensor.shape[-2:])


def _launch(values: torch.Tensor, gate_logits: torch.Tensor, keep: torch.Tensor | None):
    """Operands in kernel layout, the grid and the arguments shared by both kernels' launches."""
    x = _rows_view(values)  # (N, G, D)
    z = _rows_view(gate_logits, row_contiguous=True)  # (N, G, w)
    rows_total, head_dim = x.shape[0] * x.shape[1], x.shape[2]
    keep_ = keep.contiguous() if keep is not None else z  # z: an unread placeholder
    block_d = triton.next_power_of_2(head_dim)
    block_r = max(16, _BLOCK_ELEMENTS // block_d)
    sizes = (x.stride(0), x.stride(1), z.stride(0), rows_total, x.shape[1], head_dim)
    flags = {
        "HAS_KEEP": keep is not None,
        "ELEMENTWISE": z.shape[-1] != 1,
        "BLOCK_R": block_r,
        "BLOCK_D": block_d,
    }
    return x, z, keep_, (triton.cdiv(rows_total, block_r),), sizes, flags


def gate_multiply_forward(
    values: torch.Tensor, gate_logits: torch.Tensor, keep: torch.Tensor | None, gate_scale: float
) -> torch.Tensor:
    """`values (*, G, D) * gate_scale * sigmoid(gate_logits (*, G, w)) * keep (*, G)` in the values' dtype."""
    x, z, keep, grid, sizes, flags = _launch(values, gate_logits, keep)
    out = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    _gate_multiply_fwd_kernel[grid](x, z, keep, out, *sizes, gate_scale, **flags)
    return out


def gate_multiply_backward(
    grad_out: torch.Tensor,
    values: torch.Tensor,
    gate_logits: torch.Tensor,
    keep: torch.Tensor | None,
    gate_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients `(d values, d gate_logits)` of `gate_multiply_forward` given `grad_out (*, G, D)`."""
    x, z, keep, grid, sizes, flags = _launch(values, gate_logits, keep)
    grad_values = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    grad_logits = torch.empty(gate_logits.shape, dtype=z.dtype, device=z.device)
    _gate_multiply_bwd_kernel[grid](
        grad_out.contiguous(), x, z, keep, grad_values, grad_logits, *sizes, gate_scale, **flags
    )
    return grad_values, grad_logits
