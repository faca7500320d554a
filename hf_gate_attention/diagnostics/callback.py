"""`DiagnosticsCallback`: the diagnostics of `diagnose` on a fixed probe, logged during Trainer training."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import TrainerCallback

from ..files import atomic_write_json, read_json
from .measure import diagnose

PREFIX = "diagnostics/"


def per_layer(result: dict) -> dict:
    """Per-layer curves of a diagnosis: first-token attention (mean over heads), max |hidden|, gate mean."""
    layers = {
        "first_token_attention": torch.tensor(result["attention"]["first_token"]).mean(-1).tolist(),
        "max_activation": result["activations"]["max_abs"],
    }
    if result["gates"] is not None:
        layers["gate_mean"] = torch.tensor(result["gates"]["mean"]).mean(-1).tolist()
    return layers


class DiagnosticsCallback(TrainerCallback):
    """Runs `diagnose` on `probe` every `every_steps` optimizer steps (and before the first one) and logs
    `diagnostics/first_token_attention`, `diagnostics/max_activation`, `diagnostics/gate_mean`, ... with the
    Trainer's next log (into `state.log_history` and, after `attach`, into TensorBoard/W&B/...).

    Args:
        probe (`list[dict]`): model inputs of one example each (see `text_inputs`).
        every_steps (`int`): how often to measure.
        output_file (*optional*): JSON file rewritten (atomically) after each measurement with every entry
            so far, per-layer curves included; on resume, the entries after the resumed step are dropped.

    `trainer.add_callback(cb)` runs it after the reporting integrations, whose logs then miss the numbers;
    `cb.attach(trainer)` puts it first. It measures on the main process only, with the unwrapped model: fine
    for one device and DDP, not for sharded models (FSDP, DeepSpeed ZeRO-3), whose forward needs every rank.
    """

    def __init__(self, probe: list[dict], every_steps: int = 100, output_file: str | Path | None = None):
        if every_steps < 1:
            raise ValueError(f"every_steps={every_steps} must be >= 1")
        if not probe:
            raise ValueError("the diagnostics probe is empty: pass at least one input")
        self.probe, self.every_steps = probe, every_steps
        self.output_file = None if output_file is None else Path(output_file)
        self.history: list[dict] = []
        self._pending: dict | None = None

    def attach(self, trainer) -> DiagnosticsCallback:
        """Register as the trainer's first callback, so that the integrations log what it adds."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        saved = read_json(self.output_file) if self.output_file is not None else None
        self.history = [entry for entry in (saved or []) if entry["step"] <= state.global_step]
        if state.global_step == 0 and state.is_world_process_zero:
            self._measure(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every_steps == 0 and state.is_world_process_zero:
            self._measure(model, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending is None or logs is None:
            return
        logs.update(self._pending)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._pending)
        self._pending = None

    def _measure(self, model, step: int) -> None:
        result = diagnose(model, self.probe)
        self._pending = {PREFIX + key: value for key, value in result["summary"].items()}
        self.history.append({"step": step, **result["summary"], "layers": per_layer(result)})
        if self.output_file is not None:
            atomic_write_json(self.output_file, self.history)
