"""Distributed launches (`torchrun`, `accelerate launch`, or a single process): the process's state, where it
patches (and the check, first, that every run's gate patches), and the end of the process group after
training."""

from __future__ import annotations

import warnings

import torch
from accelerate import PartialState

from ...core.patching import patch


def on_cpu() -> bool:
    """Whether this machine has no accelerator (then DDP runs on CPU processes over gloo)."""
    return torch.accelerator.current_accelerator() is None


def distributed_state() -> PartialState:
    """The process's distributed state (also on CPU-only machines, where accelerate needs `cpu=True`)."""
    return PartialState(cpu=on_cpu())


def patch_on_device(model, gate, backend: str):
    """`patch(model, gate, backend=backend)` on the device this process trains on (where the Trainer would
    move the model anyway), so that `backend="auto"` chooses for that device: on a GPU, the fused backends."""
    device = distributed_state().device
    if device.type != "cpu":
        model.to(device)
    return patch(model, gate, backend=backend)


def check_gates_patch(config, model_config, model_class) -> None:
    """Patch a weightless copy of the model (meta device) with the gate of every gated run of `config` and
    `config.backend`, so that what `patch` refuses (`backend="triton"` without CUDA, a gate this model cannot
    take) is a `ValueError` before anything trains, not when its turn comes after the others trained."""
    build = getattr(model_class, "from_config", None) or model_class._from_config  # Auto class, or a model's
    for run in config.runs:
        if run.gate is None:
            continue
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the real patch warns, once
            patch(build(model_config), run.gate, backend=config.backend)


def leave_after_training() -> bool:
    """Ends the process group of a distributed launch once every run is trained; `True` on the process
    that goes on to evaluate (the main one, or the single process)."""
    state = distributed_state()
    if state.use_distributed:
        state.destroy_process_group()
    return state.is_main_process
