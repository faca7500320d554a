"""Training with sparse top-k through the summarization recipe, dropped groups reading their sink and window
keys (`top_k_sink`, `top_k_window`): the loss falls, and a run interrupted mid-training and resumed from its
checkpoint ends exactly where the uninterrupted run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from helpers import tiny_config

from hf_gate_attention.recipes.summarization import RecipeConfig, run_comparison

SPARSE_RUN = {
    "name": "top1-sink1-window4",
    "gate": {"init": "identity", "top_k": 1, "top_k_unit": "kv_group", "top_k_sink": 1, "top_k_window": 4},
}


class _StopAtStep(transformers.TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def _losses(run_dir: Path) -> list[float]:
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    return [entry["loss"] for entry in history if "loss" in entry]


@pytest.mark.slow
def test_sparse_training_lowers_the_loss_and_resumes_exactly(tiny_assets, tmp_path):
    keys = tiny_config(
        tiny_assets, tmp_path / "whole", runs=[SPARSE_RUN], max_steps=6, eval_steps=None, learning_rate=1e-3
    )
    whole = run_comparison(RecipeConfig.from_dict(keys)) / SPARSE_RUN["name"]
    losses = _losses(whole)
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2])
    metrics = json.loads((whole / "metrics.json").read_text())
    assert metrics["gate"]["top_k_sink"] == 1 and metrics["gate"]["top_k_window"] == 4

    interrupted = RecipeConfig.from_dict(keys | {"output_dir": str(tmp_path / "interrupted")})
    with pytest.raises(KeyboardInterrupt):
        run_comparison(interrupted, callbacks=[_StopAtStep(3)])
    resumed = run_comparison(interrupted.replace(resume=True)) / SPARSE_RUN["name"]
    assert json.loads((resumed / "train_summary.json").read_text())["resumed_from"] == "checkpoint-2"
    assert _losses(resumed) == pytest.approx(losses, rel=1e-5)
