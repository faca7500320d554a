"""Gates under transformers' tensor parallelism: each gate shards with the heads it gates.

transformers' TP plan (`config.base_model_tp_plan`, `DistributedConfig(tp_plan=...)`) shards a block's query,
key and value projections `colwise` (rank `r` holds heads `r*H/N .. (r+1)*H/N - 1`, and as many key/value
heads) and its output projection `rowwise` (its input: those heads' attention output). A gate then shards the
same way: its parameters are `Shard(0)` DTensors over its gated heads (query heads for `output`/`qk`,
key/value heads for `value`; the rows of `W: (G*w, hidden)` and of `qk`'s `W: (H, w, 2D)` are head-major),
and each rank computes the gate of its own heads from local tensors. Where a plan keeps the heads whole on
every rank (`colwise_gather_output` + `rowwise_split_input`: Phi-3, OLMo-2) the gate stays whole too. Any
other plan of a gated block is refused with the reason.

The sharding goes through transformers' own mechanism: a plan entry per gate (`GATE_STYLE`, registered in
`ALL_PARALLEL_STYLES`) that `from_pretrained(..., tp_plan="auto")` applies to a gated class built with its
gates (the `trust_remote_code` classes), or that `patch` applies itself to a model already loaded with TP.

Three things make the sharded gate compute what one process computes:
- each rank's gate reads the block input `x`, replicated: its gradient there is this rank's heads' part, so
  it is summed over the ranks in backward (`all_reduce_gradient`), as the colwise projections do for theirs;
- top-k ranks every gated unit of the token, so each rank gathers the scores of the others (a few numbers
  per token) before choosing (`gathered_scores`);
- the gate's own parameters are read as their local shards (`DTensor.to_local`, differentiable).

Needs only torch (transformers for the registration): ships as remote code with the gate runtime.
"""

from __future__ import annotations

import math
import re

import torch
import torch.distributed as dist
from torch import nn

GATE_STYLE = "gated_attention_heads"
# the plan styles of a block's query/key/value and output projections that keep every head on every rank
# (`None`: not in the plan)
WHOLE_PROJECTION_STYLES = (None, "colwise_gather_output", "colwise_rep")
WHOLE_OUTPUT_STYLES = (None, "rowwise_split_input", "rowwise_rep")


def tensor_parallel_size(config) -> int:
    """The TP size a model of `config` is (being) loaded with: `config.distributed_config.tp_size`, else 1."""
    distributed = getattr(config, "distributed_config", None)
    size = (
        getattr(distributed, "tp_size", None)
        if not isinstance(distributed, dict)
        else distributed.get("tp_size")
    )
    return size if isinstance(size, int) and size > 1 else 1


def generic_name(name: str) -> str:
    """A module name with its layer numbers as `*`, as TP plans name modules (`model.layers.*.self_attn`)."""
    return re.sub(r"\.\d+(\.|$)", lambda found: ".*" + found.group(1), name)


def effective_plan(model: nn.Module) -> dict[str, str]:
    """The TP plan transformers applies to `model`: its own, with `DistributedConfig.tp_plan` overrides."""
    plan = dict(getattr(model, "_tp_plan", None) or {})
    override = getattr(getattr(model.config, "distributed_config", None), "tp_plan", None)
    return plan | override if isinstance(override, dict) else plan


def block_sharding(block, plan: dict[str, str], size: int) -> bool:
    """Whether the gate of `block` (an `AttentionBlock`) shards with its heads (`True`) or stays whole
    (`False`) under `plan` on `size` ranks; `ValueError` saying why for a block whose heads the plan splits
    in a way a gate cannot follow."""
    family, name = block.family, f"{block.name} ({type(block.module).__name__})"
    roles = {"query": family.query, "key": family.key, "value": family.value, "output": family.output}
    styles = {role: plan.get(generic_name(f"{block.name}.{path}")) for role, path in roles.items() if path}
    projections = [styles[role] for role in ("query", "key", "value") if role in styles]
    shown = ", ".join(f"{roles[role]}: {style or 'not in the plan'}" for role, style in styles.items())
    if all(s in WHOLE_PROJECTION_STYLES for s in projections) and styles["output"] in WHOLE_OUTPUT_STYLES:
        return False
    sharded = all(s == "colwise" for s in projections) and styles["output"] == "rowwise"
    if not sharded or family.fused_qkv or family.key is None:
        raise ValueError(
            f"gated attention under tensor parallelism: the TP plan splits the heads of {name} as "
            f"{{{shown}}}; a gate follows a plan that shards separate query/key/value projections 'colwise' "
            "and the output projection 'rowwise', or one that keeps every head on every rank (projections "
            "not in the plan, or 'colwise_gather_output' with 'rowwise_split_input'). Pass "
            "DistributedConfig(tp_plan=...) with one of these for the attention, or load without TP"
        )
    geometry = block.geometry
    if geometry["num_heads"] % size or geometry["num_kv_heads"] % size:
        raise ValueError(
            f"gated attention under tensor parallelism: {name} has {geometry['num_heads']} query heads and "
            f"{geometry['num_kv_heads']} key/value heads, which {size} ranks cannot share out whole (a gate "
            "shards with whole heads: the TP size must divide both); use a TP size that divides "
            f"{math.gcd(geometry['num_heads'], geometry['num_kv_heads'])}, or load without TP"
        )
    return True


class _AllReduceGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the TP group (the gate's part of a replicated
    input's gradient is this rank's heads' part)."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_gradient(tensor: torch.Tensor, group) -> torch.Tensor:
    """`tensor`, whose gradient is summed over `group` in backward (as is, without gradients)."""
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _AllReduceGradient.apply(tensor, group)
    return tensor


def gathered_scores(score: torch.Tensor, group) -> torch.Tensor:
    """`score: (..., U_local)` of every rank of `group`, concatenated in rank order: `(..., U_local * N)`."""
    score = score.detach().contiguous()
    parts = [torch.empty_like(score) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, score, group=group)
    return torch.cat(parts, dim=-1)


def shard_gate_parameter(gate: nn.Module, name: str, mesh) -> None:
    """Make `gate.<name>` a `Shard(0)` DTensor on `mesh`: from the meta placeholder transformers fills at load
    (each rank then reads its rows of the checkpoint), or from rank 0's values of a gate added after the load
    (every rank gets the same init)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    param = gate._parameters[name]
    source = None if param.is_meta else 0
    sharded = distribute_tensor(param.detach(), mesh, [Shard(0)], src_data_rank=source)
    gate._parameters[name] = nn.Parameter(sharded, requires_grad=param.requires_grad)


def shard_gate(gate: nn.Module, mesh) -> None:
    """Shard every parameter of `gate` (an `AttentionGate`) over `mesh` and let it compute its local heads."""
    for name in list(gate._parameters):
        shard_gate_parameter(gate, name, mesh)
    gate.shard_heads(mesh.get_group(), mesh.size())


def like_parameter(param: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (a full saved gate tensor) laid out as `param`: this rank's shard of it where `param` is a
    DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        return tensor
    tensor = tensor.to(device=param.device, dtype=param.dtype)
    return distribute_tensor(tensor, param.device_mesh, param.placements, src_data_rank=None)


def _register_style() -> None:
    """Register `GATE_STYLE` in transformers' `ALL_PARALLEL_STYLES` (where torch.distributed exists)."""
    try:
        from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
        from transformers.distributed.tensor_parallel import TensorParallelLayer
    except ImportError:  # a transformers without this TP, or a torch without torch.distributed
        return

    class GateHeadsParallel(TensorParallelLayer):
        """The TP style of an `attn_gate`: its parameters `Shard(0)` over its heads, computed locally."""

        def shard_param(self, module, param, mesh, *, config=None, mesh_manager=None):
            shard_gate_parameter(module, param, mesh)

        def install_forward(self, module, mesh, *, config=None, mesh_manager=None):
            module.shard_heads(mesh.get_group(), mesh.size())
            return module

    ALL_PARALLEL_STYLES.register(GATE_STYLE, GateHeadsParallel())


_register_style()
