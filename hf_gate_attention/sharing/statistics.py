"""What a gated checkpoint contains (`hf-gate-attention info`): layout, gate config, parameter counts and the
statistics of each layer's gate tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from ..core.hooks import GATE_MODULE_NAME
from ..files import read_json
from .card import read_checkpoint
from .layouts import is_paper_config, paper_checkpoint_contents
from .loading import gate_tensors, natural_order, non_finite_tensors


def _layer_statistics(tensors: dict, scale: float) -> dict:
    """Block -> shapes, mean |value| and the gate at zero input (`scale * sigmoid(bias)`) of `attn_gate`
    tensors given by state_dict key."""
    layers = {}
    for key, tensor in sorted(tensors.items(), key=lambda item: natural_order(item[0])):
        block, name = key.split(f".{GATE_MODULE_NAME}.")
        values = tensor.float()
        entry = layers.setdefault(block, {})
        entry[f"{name}_shape"] = list(values.shape)
        entry[f"{name}_abs_mean"] = values.abs().mean().item()
        if name == "bias":
            at_zero = scale * torch.sigmoid(values)
            entry["gate_at_zero_mean"] = at_zero.mean().item()
            entry["gate_at_zero_min"] = at_zero.min().item()
            entry["gate_at_zero_max"] = at_zero.max().item()
    return layers


def checkpoint_statistics(folder: str | Path) -> dict:
    """What a gated checkpoint contains: layout, gate config, counts and per-layer gate statistics.

    Our checkpoints (`config.json` with `gate_attention`) and the paper's layout (gates packed into `q_proj`,
    `sharing.layouts`) are read. `non_finite` names the gate tensors that hold NaN or inf. The gate at zero
    input is `scale * sigmoid(bias)` (1 for an untrained identity gate).
    """
    config = read_json(Path(folder) / "config.json") or {}
    if is_paper_config(config):
        checkpoint = paper_checkpoint_contents(str(folder))
        tensors, layout = checkpoint.pop("gate_tensors"), "paper"
    else:
        checkpoint, tensors, layout = read_checkpoint(folder), gate_tensors(str(folder)), "ours"
    gate = checkpoint["gate"]
    if not checkpoint["gated_layers"]:
        raise ValueError(
            f"{folder}: its config describes gates ({gate.variant}/{gate.granularity}) but its weights hold "
            "none: the checkpoint is incomplete"
        )
    return {
        "layout": layout,
        "model_type": checkpoint["config"].get("model_type"),
        "architectures": checkpoint["config"].get("architectures"),
        "gate": gate.to_dict(),
        "total_params": checkpoint["total_params"],
        "added_params": checkpoint["added_params"],
        "gated_layers": checkpoint["gated_layers"],
        "gates_are_identity": checkpoint["gates_are_identity"],
        "trust_remote_code": "auto_map" in checkpoint["config"],
        "layers": _layer_statistics(tensors, gate.gate_scale),
        "non_finite": non_finite_tensors(tensors),
    }
