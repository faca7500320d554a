"""The gate variants, each declared once: what it gates, what its gate reads, its parameters, what serves it.

Every backend runs every variant; how is read from here: a gate on the attention output can be applied by an
attention function (`triton`, sparse top-k, `top_k_sink`), one reading only the query projection's input can
come out of the query GEMM (`fused_gate`), the others run in the projections' hooks.

Formulas (per token; `G` gated heads, `D` head_dim, `w` = 1 (headwise) or `D` (elementwise), `s` = 2 for
`init="identity"`, 1 for `init="paper"`):

- `output` (paper G1): `g = s * sigmoid(X W + b)`, `W: (hidden, G*w)`, `O'[h] = O[h] * g[h]`, applied to the
  attention output `O` before the output projection. `G` = query heads.
- `value` (paper G2): the same formula on the value projection's output; `G` = key/value heads (GQA).
- `qk` (source article): `g[h] = s * sigmoid(W[h] [q_h; k_h] + b[h])` from the query and key of the same
  position (head `h` reads key head `h // (H / KV)`), `W: (H, w, 2D)`. Multiplying row `i` of
  `softmax(Q K^T / sqrt(D))` by `g_i` equals multiplying output row `i` by `g_i`, so the gate is applied to
  the attention output like `output`, never materialising the L x L matrix. `q`/`k` are the projections'
  outputs, before rotary embeddings or q/k norms (the article has neither).

The rest of the package reads these entries instead of comparing names. Needs only torch: it ships as remote
code with `config.py` and `gate.py` (see `sharing/saving.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def linear_shapes(gate, hidden_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`W: (G*w, hidden)`, `b: (G*w,)`: a linear map of the hidden state."""
    rows = gate.num_gated_heads * gate.width
    return (rows, hidden_size), (rows,)


def linear_logits(gate, weight, bias, x, q, k) -> torch.Tensor:
    """`X W^T + b` for `x: (..., hidden)` -> `(..., G, w)`."""
    return nn.functional.linear(x, weight, bias).unflatten(-1, (gate.num_gated_heads, gate.width))


def query_key_shapes(gate, hidden_size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`W: (H, w, 2D)`, `b: (H, w)`: per query head, a map of its query and key."""
    return (gate.num_heads, gate.width, 2 * gate.head_dim), (gate.num_heads, gate.width)


def query_key_logits(gate, weight, bias, x, q, k) -> torch.Tensor:
    """`W[h] [q_h; k_h] + b[h]` for `q: (..., H*D)`, `k: (..., KV*D)` -> `(..., H, w)`. Headwise (`w = 1`),
    one GEMM of `[q | k]` with the same map laid out as a matrix (`query_key_matrix`): 3 ops instead of 7."""
    if gate.width == 1:
        matrix, flat_bias = query_key_matrix(gate, weight, bias)
        qk = torch.cat([q, k], dim=-1)  # (..., (H + KV) * D)
        z = nn.functional.linear(qk if qk.dtype == weight.dtype else qk.to(weight.dtype), matrix, flat_bias)
        return z.view(*z.shape[:-1], gate.num_heads, 1)  # (..., H, 1)
    q = q.unflatten(-1, (gate.num_heads, gate.head_dim))  # (..., H, D)
    k = k.unflatten(-1, (gate.num_kv_heads, gate.head_dim))  # (..., KV, D)
    k = k.repeat_interleave(gate.num_heads // gate.num_kv_heads, dim=-2)  # (..., H, D)
    qk = torch.cat([q, k], dim=-1).to(weight.dtype)  # (..., H, 2D)
    return torch.einsum("...hc,hwc->...hw", qk, weight) + bias


def query_key_matrix(gate, weight, bias) -> tuple[torch.Tensor, torch.Tensor]:
    """The headwise `qk` gate as a linear map of `[q | k]`: `(M (H, (H + KV) * D), b (H,))`, row `h` holding
    `W[h]`'s query half at the columns of query head `h`, its key half at those of key head `h // (H / KV)`,
    zeros elsewhere. Without gradients and outside `torch.compile` it is kept on the gate until `weight` or
    `bias` change (their version counters and storage); not under tensor parallelism, where they are the
    local shards of DTensors, whose version counters stay put when the DTensor is written in place (an
    optimizer step)."""
    keep = not torch.is_grad_enabled() and not torch.compiler.is_compiling() and gate.tp_group is None
    if keep:
        key = (weight._version, bias._version, weight.data_ptr(), bias.data_ptr())
        cached = gate.query_key_matrix_cache
        if cached is not None and cached[0] == key:
            return cached[1]
    heads, kv_heads = gate.num_heads, gate.num_kv_heads
    query_half, key_half = weight[:, 0].split(gate.head_dim, dim=-1)  # (H, D) each
    own_head = torch.eye(heads, dtype=weight.dtype, device=weight.device)  # (H, H)
    key_head = own_head.unflatten(-1, (kv_heads, -1)).sum(-1)  # (H, KV): 1 at h // (H / KV)
    matrix = torch.cat(
        [
            (own_head[:, :, None] * query_half[:, None, :]).flatten(1),  # (H, H*D)
            (key_head[:, :, None] * key_half[:, None, :]).flatten(1),  # (H, KV*D)
        ],
        dim=-1,
    )
    result = (matrix, bias[:, 0])
    if keep:
        gate.query_key_matrix_cache = (key, result)
    return result


@dataclass(frozen=True)
class GateVariant:
    """One gate variant (`GateConfig.variant`).

    Args:
        name (`str`): the value of `GateConfig.variant`.
        origin (`str`): where it comes from, for `--help` ("paper G1").
        description (`str`): one line for model cards and adapter cards.
        gates (`str`): what the gate multiplies: `"output"`, the attention output (the output projection's
            input; query heads), applied by the output projection's pre-hook or by an attention function; or a
            projection role (`"value"`, `"key"`, `"query"`), that projection's output (key/value heads for
            `"key"` and `"value"`), applied by its forward hook.
        inputs (`tuple`): the gate's inputs as `(name, projection role)` pairs: `x` is that projection's
            input, `q`/`k` its query/key output.
        top_k_skips (`bool`): with `top_k`, the attention of dropped units can be skipped (`sparse.py`, the
            `triton` backend's tiles); otherwise top-k is a mask. Needs `gates="output"`.
        dropped_read_keys (`bool`): units top-k drops may read sink and window keys
            (`GateConfig.top_k_sink/top_k_window`). Needs `gates="output"`.
        parameter_shapes (`Callable`, *optional*): `(gate, hidden_size) -> (weight shape, bias shape)`;
            defaults to a linear map of `x` (`linear_shapes`).
        logits (`Callable`, *optional*): `(gate, weight, bias, x, q, k) -> (..., G, w)`, from the gate's
            parameters and the inputs it reads (the others `None`); defaults to `linear_logits`.
        layouts (`tuple[str]`): the other checkpoint layouts that can hold it (`sharing/layouts`).
    """

    name: str
    origin: str
    description: str
    gates: str
    inputs: tuple[tuple[str, str], ...]
    top_k_skips: bool
    dropped_read_keys: bool
    parameter_shapes: Callable = linear_shapes
    logits: Callable = linear_logits
    layouts: tuple[str, ...] = ()

    @property
    def gates_attention_output(self) -> bool:
        """Whether the gate multiplies the attention output, so that an attention function can apply it."""
        return self.gates == "output"

    @property
    def gates_kv_heads(self) -> bool:
        """Whether the gated heads are the key/value heads (else the query heads)."""
        return self.gates in ("key", "value")

    @property
    def reads_only_hidden_state(self) -> bool:
        """Whether the gate reads only projection inputs (`x`), never a query or key: then it can gate
        cross-attention, whose keys belong to other positions than its queries."""
        return all(name == "x" for name, _ in self.inputs)

    @property
    def reads_query_input(self) -> bool:
        """Whether the gate reads only the query projection's input (then the query GEMM can compute it)."""
        return self.inputs == (("x", "query"),)


GATE_VARIANTS = {
    variant.name: variant
    for variant in (
        GateVariant(
            name="output",
            origin="paper G1",
            description="a sigmoid gate on each attention head's output, before the output projection "
            "(the paper's G1)",
            gates="output",
            inputs=(("x", "query"),),
            top_k_skips=True,
            dropped_read_keys=True,
            layouts=("paper", "qwen3_next"),
        ),
        GateVariant(
            name="value",
            origin="G2",
            description="a sigmoid gate on the value projection's output, per key/value head "
            "(the paper's G2)",
            gates="value",
            inputs=(("x", "value"),),
            top_k_skips=False,
            dropped_read_keys=False,
        ),
        GateVariant(
            name="qk",
            origin="the article",
            description="a sigmoid gate computed from each head's query and key, scaling that head's "
            "attention weights row by row (the query/key gate of a popular write-up of the paper)",
            gates="output",
            inputs=(("q", "query"), ("k", "key")),
            parameter_shapes=query_key_shapes,
            logits=query_key_logits,
            top_k_skips=True,
            dropped_read_keys=True,
        ),
    )
}


def names_where(predicate: Callable[[GateVariant], bool]) -> tuple[str, ...]:
    """The names of the variants for which `predicate` holds, for messages ("output, qk")."""
    return tuple(name for name, variant in GATE_VARIANTS.items() if predicate(variant))
