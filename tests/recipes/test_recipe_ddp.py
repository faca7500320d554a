"""The recipe under `torchrun --nproc_per_node 2` on CPU (DDP over gloo), as a user would launch it."""

from __future__ import annotations

import json

import pytest
from helpers import RUNS, loss_steps, make_dataset, make_tiny_model, tiny_config, torchrun, write_config


@pytest.mark.slow
def test_two_process_ddp_run(tmp_path):
    assets = {"model": make_tiny_model(tmp_path / "model"), "data": make_dataset(tmp_path / "data")}
    keys = tiny_config(assets, tmp_path / "results", runs=RUNS[:2], eval_steps=None, ddp_backend="gloo")
    config_file = write_config(tmp_path / "ddp.yaml", keys)
    stdout = torchrun("-m", "hf_gate_attention", "recipe", "summarization", "--config", str(config_file))
    assert stdout.count("Delta vs baseline") == 1  # the table is written and printed by the main process only

    out = tmp_path / "results" / "tiny"
    for run in RUNS[:2]:
        summary = json.loads((out / run["name"] / "train_summary.json").read_text())
        assert summary["world_size"] == 2 and summary["effective_batch_size"] == 4
        assert summary["global_step"] == 4 and loss_steps(out / run["name"]) == [1, 2, 3, 4]
        assert (out / run["name"] / "metrics.json").is_file()
    assert (out / "comparison.md").is_file() and (out / "speed.png").is_file()
