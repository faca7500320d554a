"""The output gate's logits from the query GEMM: one projection computes `[q | z]` (backend `"fused_gate"`).

`output` gates compute `z = X W_g + b_g` from the same input `X` as the query projection `q = X W_q + b_q`.
Serving engines store `[W_q; W_g]` as one matrix and run one GEMM. We do the same without changing a single
parameter: `merge_query_gate` moves `q_proj.weight` and `attn_gate.weight` (and the biases) into one buffer
and makes both parameters views of it, so their names, shapes, values, `state_dict`, optimizers, PEFT LoRA
(it wraps `q_proj` and calls this `forward` as its base layer) and `unpatch` see nothing different; only the
query projection's `forward` (on that instance) changes: one GEMM on the merged buffer, `q` returned, `z`
stashed for the gate.

The one GEMM runs for inference on more than a few tokens (prefill) and inside CUDA-graph capture (decode
under graphs). Everywhere else the two GEMMs of the reference computation run (same values up to GEMM
rounding), because they measured faster there on an H200 (benchmarks/results/gpu/run1-270be43): training
(the merged GEMM's backward and the output it keeps alive cost x1.09-1.11 per step against x1.06 for the
torch path), eager decode (host-bound: fewer Python steps win), `torch.compile` tracing; and wherever the
merge cannot hold: the parameters no longer share the buffer (`model.to(...)`, `load_state_dict(assign=True)`,
FSDP's flat parameters, a LoRA merge that reassigned `.data`), the block's gate is no longer the merged one
(PEFT's `modules_to_save` wraps it and runs a trainable copy), or a projection that is not a plain
`nn.Linear` (not merged at patch time). There the query projection keeps its input `x` for the block's gate
now, which computes the logits itself.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from ..core.variants import linear_logits
from .ops import fused_pays


def _view_of(param: torch.Tensor, buffer: torch.Tensor, start: int) -> bool:
    """Whether `param` is the contiguous block of `buffer` starting at row `start` (pointer arithmetic only,
    no device synchronisation)."""
    return (
        param.dtype == buffer.dtype
        and param.device == buffer.device
        and param.is_contiguous()
        and param.data_ptr() == buffer.data_ptr() + start * buffer.stride(0) * buffer.element_size()
    )


def merge_query_gate(query: nn.Linear, gate: nn.Module, block_patch) -> None:
    """Merge `query`'s and the `output` gate's weights into one buffer and give `query` the one-GEMM
    `forward` (this instance only). Changes nothing if `query` is not a plain `nn.Linear` or the gate is not
    a linear map of the query projection's input."""
    variant = gate.gate_variant
    linear_of_query_input = variant.reads_query_input and variant.logits is linear_logits
    if type(query) is not nn.Linear or "forward" in query.__dict__ or not linear_of_query_input or gate.top_k:
        return
    n_q = query.out_features
    with torch.no_grad():
        weight = torch.cat([query.weight, gate.weight.to(query.weight.dtype)])  # (n_q + n_g, hidden)
        q_bias = query.bias if query.bias is not None else query.weight.new_zeros(n_q)
        bias = torch.cat([q_bias, gate.bias.to(query.weight.dtype)])  # (n_q + n_g,)
    query.weight = _reparented(query.weight, weight[:n_q])
    gate.weight = _reparented(gate.weight, weight[n_q:])
    if query.bias is not None:
        query.bias = _reparented(query.bias, bias[:n_q])
    gate.bias = _reparented(gate.bias, bias[n_q:])
    query.forward = _MergedForward(query, gate, block_patch, weight, bias)
    block_patch.query_computes_logits()


def _reparented(param: nn.Parameter, view: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(view, requires_grad=param.requires_grad)


class _MergedForward:
    """The query projection's `forward` (that instance only): `q (..., n_q)` of `x (..., hidden)`; the gate
    logits `(..., G, w)` go to `block_patch.stash["logits"]` (one GEMM on the merged `weight (n_q + n_g,
    hidden)` and `bias`), or `x` goes to `block_patch.stash["x"]` for the block's gate to compute them (the
    reference's two GEMMs).

    An object, not a closure, so that `copy.deepcopy(model)` gives the copy's projection the copy's modules;
    their parameters get storage of their own there (`nn.Parameter.__deepcopy__` clones), so a copy runs the
    two GEMMs and keeps no merged buffer (`weight=None`)."""

    def __init__(self, query: nn.Linear, gate: nn.Module, block_patch, weight, bias):
        self.query, self.gate, self.block_patch = query, gate, block_patch
        self.weight, self.bias = weight, bias  # the merged buffers, or None: the two GEMMs

    def __deepcopy__(self, memo):
        copied = memo[id(self)] = object.__new__(_MergedForward)  # before the modules that refer to it
        modules = (copy.deepcopy(x, memo) for x in (self.query, self.gate, self.block_patch))
        copied.__init__(*modules, None, None)
        return copied

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        query, gate = self.query, self.gate
        needs_grad = torch.is_grad_enabled() and (
            x.requires_grad or query.weight.requires_grad or gate.weight.requires_grad
        )
        n_tokens = x.shape[:-1].numel()
        if (
            self.weight is not None
            and fused_pays(n_tokens, x, needs_grad)
            and self.block_patch.gate() is gate
        ):
            if self._shares_buffer():
                n_q = query.out_features
                y = F.linear(x, self.weight, self.bias)  # (..., n_q + n_g)
                logits = y[..., n_q:].unflatten(-1, (gate.num_gated_heads, gate.width))
                self.block_patch.stash.setdefault("logits", logits)  # the forward's first call wins
                return y[..., :n_q]
            self.weight = self.bias = (
                None  # the parameters have storage of their own now, for good: let it go
            )
        self.block_patch.stash.setdefault("x", x)
        return F.linear(x, query.weight, query.bias)

    def _shares_buffer(self) -> bool:
        """Whether the query and gate parameters are still views of the merged buffers."""
        query, gate, n_q = self.query, self.gate, self.query.out_features
        return (
            _view_of(query.weight, self.weight, 0)
            and _view_of(gate.weight, self.weight, n_q)
            and _view_of(gate.bias, self.bias, n_q)
            and (query.bias is None or _view_of(query.bias, self.bias, 0))
        )


def restore_query_projection(query: nn.Module) -> None:
    """Undo `merge_query_gate`: the plain `forward` back, and each parameter of the query projection and the
    gate merged with it in storage of its own."""
    forward = query.__dict__.get("forward")
    if not isinstance(forward, _MergedForward):
        return
    gate = forward.gate
    del query.forward
    for module, name in ((query, "weight"), (query, "bias"), (gate, "weight"), (gate, "bias")):
        param = getattr(module, name)
        if param is not None:
            setattr(module, name, nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad))
