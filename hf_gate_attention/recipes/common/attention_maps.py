"""Attention maps over an image's patches, shared by the recipes that read a frozen vision encoder
(captioning, video QA): how much of an object covers each patch, its keys, the share of a query's attention
on them (weighting heads by their gates), and a recorder of the decoder's gate values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...core.families import find_attention
from ...core.hooks import GATE_MODULE_NAME


def patch_coverage(mask: np.ndarray, image_size: int, grid: int) -> np.ndarray:
    """Share of each patch's pixels covered by `mask` (`(H, W)` bool, any size; resized to `image_size`
    square like the image): `(grid * grid,)` in row-major patch order."""
    from PIL import Image

    resized = Image.fromarray(mask.astype(np.uint8) * 255).resize((image_size, image_size), Image.NEAREST)
    pixels = np.asarray(resized) > 127
    size = image_size // grid
    pixels = pixels[: grid * size, : grid * size].reshape(grid, size, grid, size)
    return pixels.mean(axis=(1, 3)).reshape(-1)


def object_keys(coverage: np.ndarray, threshold: float, prefix: int) -> torch.Tensor:
    """Boolean `(prefix + patches,)`: the keys of an object's patches, those at least `threshold` covered
    (its most covered patch when none is); the `prefix` tokens (CLS, registers) never."""
    keys = torch.as_tensor(coverage >= threshold)
    if not keys.any():
        keys[int(np.argmax(coverage))] = True
    return torch.cat([torch.zeros(prefix, dtype=torch.bool), keys])


def object_share(
    weights: torch.Tensor, keys: torch.Tensor, gates: torch.Tensor | None = None
) -> tuple[float, float]:
    """`(gate-weighted share, plain share)` of one step's attention on an object.

    Args:
        weights: `(layers, heads, keys)` post-softmax cross-attention weights of the step.
        keys: `(keys,)` bool, the object's keys (`object_keys`).
        gates: `(layers, heads)` gate values of the step, or `None` (ungated: the weighted share is the
            plain one).
    """
    share = weights[..., keys].sum(-1).double()  # (layers, heads)
    plain = share.mean().item()
    if gates is None:
        return plain, plain
    gates = gates.double()
    return ((gates * share).sum(-1) / gates.sum(-1).clamp_min(1e-12)).mean().item(), plain


def mean_or_nan(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def decoder_blocks(model, kind: str) -> list:
    """The decoder's attention blocks of `kind` (`"cross"` or `"self"`; `AttentionBlock`s), in layer order."""
    blocks = [b for b in find_attention(model) if b.kind == kind and b.name.startswith("decoder.")]
    return sorted(blocks, key=lambda b: b.index)


class GateRecorder:
    """Forward hooks on the gate modules of the decoder's attention blocks of `kind` (`"cross"`, `"self"`):
    `take()` returns the gate values of the last forward, `(batch, layers, steps, heads)` (elementwise gates
    averaged over each head's channels), or `None` when those blocks are ungated."""

    def __init__(self, model, kind: str = "cross"):
        self.kind = kind
        self.gates = [getattr(block.module, GATE_MODULE_NAME, None) for block in decoder_blocks(model, kind)]
        self.values: dict[int, torch.Tensor] = {}
        self.handles = [
            gate.register_forward_hook(self._hook(layer))
            for layer, gate in enumerate(self.gates)
            if gate is not None
        ]

    def _hook(self, layer: int):
        def hook(module, args, output):
            self.values[layer] = output.detach().float().mean(-1)  # (batch, steps, heads)

        return hook

    def take(self) -> torch.Tensor | None:
        if not self.handles:
            return None
        if len(self.values) != len(self.gates):
            raise RuntimeError(
                f"gates of {len(self.values)} of {len(self.gates)} {self.kind}-attention layers recorded"
            )
        values = torch.stack([self.values[layer] for layer in range(len(self.gates))], dim=1)
        self.values.clear()
        return values

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
