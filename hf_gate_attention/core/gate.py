"""The gate module added to each patched attention block, and how its values are applied.

The formulas of the variants are in `variants.py`; this module holds what they share.

`w` is 1 (headwise) or `D` (elementwise). The sigmoid is computed in float32 whatever the model dtype.
With `top_k`, per token only the `top_k` heads with the largest (mean) gate value are kept; the rest are 0.
With `top_k_unit="kv_group"` the units are the key/value groups (score: the mean gate of the group's query
heads), each kept or dropped whole. `keep` is the 0/1 selection per gated head. With `top_k_sink` or
`top_k_window`, a dropped head attends only to those keys (`streaming.py`) and keeps its gate.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules import module as torch_module  # holds the hooks registered on every module

from .config import GateConfig
from .tensor_parallel import all_reduce_gradient, gathered_scores


class AttentionGate(nn.Module):
    """Learned sigmoid gate of one attention block.

    Args:
        config (`GateConfig`): variant, granularity, init and top_k.
        hidden_size (`int`): width of the hidden state `X` entering the block.
        num_heads, num_kv_heads, head_dim (`int`): the block's geometry.
        init_std (`float`): std of the normal init for `init="paper"`.
    """

    def __init__(
        self,
        config: GateConfig,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        init_std: float = 0.02,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ):
        super().__init__()
        self.variant = config.variant
        self.gate_variant = config.gate_variant
        self.top_k = config.top_k
        self.top_k_unit = config.top_k_unit
        self.top_k_sink, self.top_k_window = config.top_k_sink, config.top_k_window
        self.scale = config.gate_scale
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.num_gated_heads = num_kv_heads if self.gate_variant.gates_kv_heads else num_heads
        self.width = 1 if config.granularity == "headwise" else head_dim
        # top-k selects among `num_units` units of `heads_per_unit` consecutive gated heads
        self.heads_per_unit = 1
        if config.top_k_unit == "kv_group" and self.num_gated_heads == num_heads:
            self.heads_per_unit = num_heads // num_kv_heads
        num_units = self.num_gated_heads // self.heads_per_unit
        if self.top_k is not None and self.top_k > num_units:
            unit = "key/value groups" if config.top_k_unit == "kv_group" else "gated heads"
            raise ValueError(f"GateConfig.top_k={self.top_k} exceeds the {num_units} {unit} of this model")
        weight_shape, bias_shape = self.gate_variant.parameter_shapes(self, hidden_size)
        self.weight = nn.Parameter(torch.zeros(weight_shape, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(bias_shape, dtype=dtype, device=device))
        if config.init == "paper":
            nn.init.normal_(self.weight, std=init_std)
        self.query_key_matrix_cache = None  # `variants.query_key_matrix`, kept without gradients
        # under tensor parallelism (`shard_heads`): the TP process group, its size and this rank's place in it
        self.tp_group, self.tp_size, self.tp_rank = None, 1, 0
        # the dtypes whose sigmoid `gated` computes in the dtype itself, with the float32 formula's bits
        self.sigmoid_dtypes = tuple(
            dtype
            for dtype in (torch.float32, torch.bfloat16, torch.float16)
            if rounds_like_float32(dtype, dtype, self.scale, None)
        )

    def _replicate_for_data_parallel(self):
        """Refuse `torch.nn.DataParallel`: its replicas would share the block patch of the original (one stash
        for all its threads, the original's instance `forward`s)."""
        raise RuntimeError(
            "gated attention: torch.nn.DataParallel is not supported (the Trainer wraps the model in it when "
            "it sees several GPUs without a distributed launch): launch with torchrun or `accelerate launch` "
            "(DistributedDataParallel), or make one GPU visible (CUDA_VISIBLE_DEVICES)"
        )

    def shard_heads(self, group, size: int) -> None:
        """Compute only this rank's `1/size` of the gated heads from now on (`tensor_parallel.py`): the
        parameters are `Shard(0)` DTensors over the heads, as the block's projections are; rank `r` of
        `group` holds heads `r*G/size .. (r+1)*G/size - 1` (and as many key/value heads)."""
        self.tp_group, self.tp_size, self.tp_rank = group, size, dist.get_rank(group)
        self.num_heads //= size
        self.num_kv_heads //= size
        self.num_gated_heads //= size

    def extra_repr(self) -> str:
        return (
            f"variant={self.variant}, heads={self.num_gated_heads}, width={self.width}, scale={self.scale}, "
            f"top_k={self.top_k}, heads_per_unit={self.heads_per_unit}"
        )

    def logits(
        self,
        x: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        k: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
    ):
        """Gate logits `(..., G, w)` from `x: (..., hidden)` or from `q: (..., H*D)` and `k: (..., KV*D)`; or
        `logits` themselves, computed elsewhere from this gate's weights (the query GEMM of a merged
        projection), passed through so that the gate is still called, and hooked, as a module."""
        if logits is not None:
            return logits
        weight, bias = self.weight, self.bias
        if self.tp_group is not None:  # this rank's heads, from a replicated `x` (its gradient: summed)
            weight, bias = weight.to_local(), bias.to_local()
            x = None if x is None else all_reduce_gradient(x, self.tp_group)
        return self.gate_variant.logits(self, weight, bias, x, q, k)

    def forward(
        self,
        x: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
        k: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        logits_only: bool = False,
    ):
        """Gate values `(..., G, w)` in float32, top-k sparsified when configured.

        With `logits_only=True`, returns `(logits (..., G, w), keep (..., G) or None)` instead, for the fused
        kernels that apply `scale * sigmoid(logits) * keep` themselves.
        """
        if logits_only:
            logits = self.logits(x, q, k, logits)
            keep = None if self.top_k is None else self.selection(self._sigmoid(logits))
            return logits, keep
        return self.with_selection(x, q, k, logits)[0]

    @property
    def dropped_reads_keys(self) -> bool:
        """Whether dropped units attend to sink and recent keys (`GateConfig.top_k_sink/top_k_window`)."""
        return self.top_k_sink > 0 or self.top_k_window > 0

    def with_selection(self, x=None, q=None, k=None, logits=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(gate (..., G, w) float32, keep (..., G) 0/1 or None)`; the gate of the heads top-k dropped is 0,
        unless dropped heads still read sink and recent keys (then their output is gated like the others)."""
        gate = self._sigmoid(self.logits(x, q, k, logits))
        if self.top_k is None:
            return gate, None
        keep = self.selection(gate)
        return (gate if self.dropped_reads_keys else gate * keep.unsqueeze(-1)), keep

    def gated(self, values: torch.Tensor, x=None, q=None, k=None) -> torch.Tensor:
        """`apply_gate(values, self(x, q, k))` for a dense gate (no `top_k`) in fewest torch ops: it runs per
        layer and token, where on a CPU each op's dispatch costs more than the gate's arithmetic
        (benchmarks/gate_cost.py). `values: (..., G*D)`; returns the same shape and dtype, with the same bits:
        the sigmoid in the logits' dtype where that rounds like the float32 formula (`rounds_like_float32`;
        below float32 only without gradients, whose bits it would change), the scale folded into the
        multiply; without gradients, `values` multiplied in place (callers pass a projection's input or
        output that nothing else reads). Skips the module call: callers check `called_bare(gate)`."""
        weights = self._parameters  # not `self.weight`: on Python 3.11 that costs as much as a small op
        logits = self.gate_variant.logits(self, weights["weight"], weights["bias"], x, q, k)  # (..., G, w)
        heads = values.unflatten(-1, (self.num_gated_heads, -1))  # (..., G, D)
        dtype, grad = values.dtype, torch.is_grad_enabled()
        if logits.dtype != dtype or dtype not in self.sigmoid_dtypes or (grad and dtype != torch.float32):
            return (heads * self._sigmoid(logits).to(dtype)).flatten(-2)
        gate = torch.sigmoid(logits)
        if grad:
            if self.scale == 1.0:
                return (heads * gate).flatten(-2)
            return torch.addcmul(_ZERO, heads, gate, value=self.scale).flatten(-2)  # scale * heads * gate
        if self.scale == 1.0:
            heads.mul_(gate)
        else:
            torch.addcmul(_ZERO, heads, gate, value=self.scale, out=heads)
        return values

    def _sigmoid(self, logits: torch.Tensor) -> torch.Tensor:
        """`scale * sigmoid(logits)` in float32, in as few ops as possible (it runs per layer and token)."""
        gate = torch.sigmoid(logits if logits.dtype == torch.float32 else logits.float())
        return gate if self.scale == 1.0 else gate * self.scale

    def with_kept_heads(self, x=None, q=None, k=None, logits=None) -> tuple[torch.Tensor, list[bool]]:
        """For one token: `(gate (1, 1, G, w) float32, whether top-k keeps each gated head (G bools))`, the
        selection of `with_selection` made on the host, without building `keep` on the device (a decode step
        of one sequence needs it there); the gate is not multiplied by it."""
        gate = self._sigmoid(self.logits(x, q, k, logits))
        kept_units = [False] * (self.num_gated_heads // self.heads_per_unit)
        for unit in self._top_units(gate).view(-1).tolist():
            kept_units[unit] = True
        return gate, [kept for kept in kept_units for _ in range(self.heads_per_unit)]

    def selection(self, gate: torch.Tensor) -> torch.Tensor:
        """The top-k 0/1 selection `(..., G)` for gate values `gate: (..., G, w)`."""
        top_units = self._top_units(gate)  # (..., top_k), among the units of every TP rank
        units = self.num_gated_heads // self.heads_per_unit
        keep = gate.new_zeros(*top_units.shape[:-1], units * self.tp_size).scatter(-1, top_units, 1.0)
        if self.tp_size > 1:  # this rank's units
            keep = keep[..., self.tp_rank * units : (self.tp_rank + 1) * units]
        return keep.repeat_interleave(self.heads_per_unit, dim=-1) if self.heads_per_unit > 1 else keep

    def _top_units(self, gate: torch.Tensor) -> torch.Tensor:
        """Indices `(..., top_k)` of the units with the largest (mean) gate values, `gate: (..., G, w)`."""
        score = gate[..., 0] if self.width == 1 else gate.mean(-1)  # (..., G)
        if self.heads_per_unit > 1:  # the sum ranks the units as the mean does, in one op fewer
            score = score.unflatten(-1, (-1, self.heads_per_unit)).sum(-1)  # (..., KV)
        if self.tp_group is not None:  # the scores of every rank's units, in rank order
            score = gathered_scores(score, self.tp_group)
        return score.topk(self.top_k, dim=-1).indices


_ZERO = torch.zeros(())  # the `input` of the one-op scaled multiply (`AttentionGate.gated`)


def rounds_like_float32(dtype: torch.dtype, logits_dtype: torch.dtype, gate_scale: float, keep) -> bool:
    """Whether `torch.sigmoid(logits) * gate_scale`, in `dtype`, gives the bits of the float32 formula
    (`sigmoid(logits.float()) * gate_scale`, cast to `dtype`) with two ops (bfloat16: four) fewer. PyTorch
    computes a bfloat16/float16 sigmoid in float32 and rounds once, as the cast does (checked on every
    bfloat16 and float16 value, `tests/kernels/test_fused_gate.py`); a scale of 2 is exact but comes after the
    rounding, which differs where the sigmoid is subnormal: below 1.2e-38 in bfloat16 (logits <= -87), below
    6.1e-5 in float16 (logits < -9.7, so float16 takes this formula only with scale 1). Without `keep` (a
    float32 keep would promote the gate to float32)."""
    if keep is not None or logits_dtype != dtype or gate_scale not in (1.0, 2.0):
        return False
    return dtype in (torch.float32, torch.bfloat16) or (dtype == torch.float16 and gate_scale == 1.0)


def called_bare(module: nn.Module) -> bool:
    """Whether calling `module` would run its `forward` alone: no hook on it, none on every module. (Read
    from its `__dict__`, names spelled out: it runs per layer and token.)"""
    attributes = module.__dict__
    return not (
        attributes["_forward_hooks"]
        or attributes["_forward_pre_hooks"]
        or attributes["_backward_hooks"]
        or attributes["_backward_pre_hooks"]
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
    )


def apply_gate(values: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Multiply `values: (..., G*D)` (head-major) by `gate: (..., G, w)`, `w` in {1, D}; keeps the dtype."""
    return gate_heads(values.unflatten(-1, (gate.shape[-2], -1)), gate).flatten(-2)  # via (..., G, D)


def gate_heads(heads: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """`apply_gate` of values already split into heads: `heads: (..., G, D)` times `gate: (..., G, w)`, in
    the dtype of `heads` (what attention functions that apply the gate return, `(B, L, H, D)`)."""
    return heads * (gate if gate.dtype == heads.dtype else gate.to(heads.dtype))
