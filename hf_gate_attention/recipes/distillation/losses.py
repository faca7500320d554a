"""The distillation terms: logit KL with temperature on the summary tokens, gate MSE on the non-padding
tokens, and the forward hooks that read the gate values of both models during their forwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ...core.hooks import GATE_MODULE_NAME, blocks_by_layer

IGNORE_INDEX = -100


def summary_positions(labels: torch.Tensor) -> torch.Tensor:
    """Which logits predict a summary token: `(batch, seq)` bool from `labels: (batch, seq)` (-100 on the
    prompt and the padding). A causal LM's logits at position `p` predict the token at `p + 1`, as in its
    own shifted cross-entropy."""
    positions = torch.zeros_like(labels, dtype=torch.bool)
    positions[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    return positions


def kd_loss_sum(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, positions: torch.Tensor, temperature: float
) -> torch.Tensor:
    """`T^2 * KL(softmax(teacher / T) || softmax(student / T))` summed over the tokens of `positions`.

    Args:
        student_logits, teacher_logits: `(batch, seq, vocab)`; the KL is computed in float32.
        positions: `(batch, seq)` bool, the tokens to distill (`summary_positions`).
        temperature: `T` > 0; the `T^2` keeps the gradient's scale independent of `T` (Hinton et al. 2015).
    """
    student = torch.log_softmax(student_logits[positions].float() / temperature, dim=-1)  # (tokens, vocab)
    teacher = torch.log_softmax(teacher_logits[positions].float() / temperature, dim=-1)  # (tokens, vocab)
    per_token = nn.functional.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)  # (tokens,)
    return temperature**2 * per_token.sum()


def gate_mse(
    student_gates: list[torch.Tensor], teacher_gates: list[torch.Tensor], attention_mask: torch.Tensor
) -> torch.Tensor:
    """Mean over the layer pairs of the squared gate difference, averaged over the non-padding tokens and
    over heads and width.

    Args:
        student_gates, teacher_gates: per mapped layer pair, gate values `(batch, seq, heads, w)` (float32);
            pair `j` compares `student_gates[j]` with `teacher_gates[j]`.
        attention_mask: `(batch, seq)`, 1 on real tokens, 0 on padding.
    """
    mask = attention_mask.bool()  # (batch, seq)
    errors = [(s[mask] - t[mask]).pow(2).mean() for s, t in zip(student_gates, teacher_gates, strict=True)]
    return torch.stack(errors).mean()


def gate_modules(model: nn.Module) -> dict[int, nn.Module]:
    """Layer index -> `attn_gate` module of a patched model (the gated layers only)."""
    blocks = blocks_by_layer(model)
    return {
        i: getattr(b, GATE_MODULE_NAME) for i, b in sorted(blocks.items()) if hasattr(b, GATE_MODULE_NAME)
    }


@contextlib.contextmanager
def recorded_gates(model: nn.Module, layers: list[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, the forwards of `model` fill the yielded `{layer: gate values}` for `layers`:
    `(batch, seq, heads, w)` float32, top-k dropped heads at 0, with their autograd graph (the student's
    gradient flows through them). The fused Triton backend's gates return logits, made into values here.

    A gate that applies its values inside the attention function (sparse top-k attention) is not called as
    a module; the recorder then stays empty for that layer and the caller raises.
    """
    modules = gate_modules(model)
    recorded: dict[int, torch.Tensor] = {}

    def recorder(layer: int):
        def hook(module, args, output):
            if isinstance(output, tuple):  # logits_only=True: (logits (..., G, w), keep (..., G) or None)
                logits, keep = output
                output = module.scale * torch.sigmoid(logits.float())
                output = output if keep is None else output * keep.unsqueeze(-1)
            recorded[layer] = output

        return hook

    handles = [modules[layer].register_forward_hook(recorder(layer)) for layer in layers]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()
