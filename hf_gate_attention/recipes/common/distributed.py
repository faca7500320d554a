"""Distributed launches (`torchrun`, `accelerate launch`, or a single process): the process's state, where it
patches, the results folder claimed by the main process, and the end of the process group after training."""

from __future__ import annotations

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


def leave_after_training() -> bool:
    """Ends the process group of a distributed launch once every run is trained; `True` on the process
    that goes on to evaluate (the main one, or the single process)."""
    state = distributed_state()
    if state.use_distributed:
        state.destroy_process_group()
    return state.is_main_process
