"""The gate packed into a wider `q_proj`, in either published layout: split it into our query and gate rows,
pack ours back (`H` query heads, `KV` key/value heads, `D` head_dim, `w` = 1 headwise or `D` elementwise).

- `"paper"`: `[G*D query rows | G*w gate rows]` for each of the `KV` key/value groups (`G = H // KV`).
- `"qwen3_next"`: `[D query rows | D gate rows]` for each of the `H` heads; always elementwise.
"""

from __future__ import annotations

import torch

LAYOUTS = ("paper", "qwen3_next")
GRANULARITIES = ("headwise", "elementwise")


def _check_heads(num_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(
            f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}; "
            "grouped-query attention needs whole groups"
        )


def q_proj_widths(num_heads: int, num_kv_heads: int, head_dim: int) -> dict[str, int]:
    """Output width of `q_proj` in each layout for this geometry (`plain`: ungated)."""
    return {
        "plain": num_heads * head_dim,
        "paper headwise": num_heads * head_dim + num_heads,
        "paper elementwise": 2 * num_heads * head_dim,
        "qwen3_next": 2 * num_heads * head_dim,
    }


def _gate_width(layout: str, granularity: str, head_dim: int) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not valid; accepted values: {', '.join(LAYOUTS)}")
    if layout == "qwen3_next" and granularity != "elementwise":
        raise ValueError(f"the qwen3_next layout is elementwise only; got granularity={granularity!r}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not valid; accepted values: headwise, elementwise")
    return 1 if granularity == "headwise" else head_dim


def _packed_rows(layout: str, num_heads: int, num_kv_heads: int, head_dim: int, gate_width: int):
    """`(units, query rows per unit, gate rows per unit)`: `KV` groups (paper) or `H` heads (qwen3_next)."""
    if layout == "paper":
        group = num_heads // num_kv_heads
        return num_kv_heads, group * head_dim, group * gate_width
    return num_heads, head_dim, head_dim


def split_q_proj(
    tensor: torch.Tensor,
    layout: str,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    granularity: str = "elementwise",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a packed `q_proj` weight `(rows, hidden)` or bias `(rows,)` into `(query, gate)`.

    Returns the query part `(H*D, ...)` (heads head-major, as an ungated `q_proj`) and the gate part
    `(H*w, ...)` (our `attn_gate` rows). `ValueError` when `rows` is the width of no layout.
    """
    _check_heads(num_heads, num_kv_heads)
    gate_width = _gate_width(layout, granularity, head_dim)
    units, query_rows, gate_rows = _packed_rows(layout, num_heads, num_kv_heads, head_dim, gate_width)
    if tensor.shape[0] != units * (query_rows + gate_rows):
        widths = ", ".join(
            f"{name} {width}" for name, width in q_proj_widths(num_heads, num_kv_heads, head_dim).items()
        )
        raise ValueError(
            f"q_proj has {tensor.shape[0]} output rows, which is not the {layout} {granularity} layout: for "
            f"{num_heads} heads, {num_kv_heads} key/value heads and head_dim {head_dim} the layouts expect "
            f"{widths}"
        )
    per_unit = tensor.unflatten(0, (units, query_rows + gate_rows))  # (units, query_rows + gate_rows, ...)
    query, gate = per_unit.split([query_rows, gate_rows], dim=1)
    return query.flatten(0, 1), gate.flatten(0, 1)  # (H*D, ...), (H*w, ...)


def pack_q_proj(
    query: torch.Tensor, gate: torch.Tensor, layout: str, num_heads: int, num_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """The inverse of `split_q_proj`: `query (H*D, ...)` and `gate (H*w, ...)` -> the packed `q_proj` tensor;
    the granularity is read off the gate's rows (`H`: headwise, `H*D`: elementwise)."""
    _check_heads(num_heads, num_kv_heads)
    granularities = {num_heads: "headwise", num_heads * head_dim: "elementwise"}
    if query.shape[0] != num_heads * head_dim or gate.shape[0] not in granularities:
        raise ValueError(
            f"cannot pack q_proj rows: query has {query.shape[0]} rows (expected {num_heads * head_dim}), "
            f"gate {gate.shape[0]} (expected {num_heads} headwise or {num_heads * head_dim} elementwise)"
        )
    gate_width = _gate_width(layout, granularities[gate.shape[0]], head_dim)
    units, query_rows, gate_rows = _packed_rows(layout, num_heads, num_kv_heads, head_dim, gate_width)
    per_unit = torch.cat(
        [query.unflatten(0, (units, query_rows)), gate.unflatten(0, (units, gate_rows))], dim=1
    )  # (units, query_rows + gate_rows, ...)
    return per_unit.flatten(0, 1)


def head_geometry(config) -> dict:
    """`num_heads`, `num_kv_heads`, `head_dim` of a transformers config (or a config dict)."""
    get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
    num_heads = get("num_attention_heads")
    num_kv_heads = get("num_key_value_heads") or num_heads
    head_dim = get("head_dim") or get("hidden_size") // num_heads
    _check_heads(num_heads, num_kv_heads)
    return {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
