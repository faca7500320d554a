"""Results folder of a comparison: the "does this folder hold a different run?" check.

Layout of `<output_dir>/<name>/`:

    config.json                      the RecipeConfig of the run (identity of the folder)
    comparison.md / .csv / .json     the comparison table
    loss_curves.png, rouge.png, speed.png
    <run>/checkpoints/checkpoint-N/  Trainer checkpoints (resume)
    <run>/model/                     final weights (or LoRA adapter + gates)
    <run>/train_summary.json         written when training finished
    <run>/quality.json               ROUGE of the test summaries, written when generation finished
    <run>/predictions.jsonl          generated summaries
    <run>/metrics.json               everything about the run: training, ROUGE with CIs, speed, deltas
"""

from __future__ import annotations

import shutil

from ...files import atomic_write_json, read_json
from .config import RESUMABLE_KEYS, RecipeConfig, identity_differences

CONFIG_FILE = "config.json"


def check_run_dir(config: RecipeConfig) -> None:
    """Refuse (`FileExistsError`) a results folder that holds something else than what `config` asks for.

    Accepted: a missing or empty folder; any folder with `overwrite`; with `resume`, a folder holding the same
    run (only `RESUMABLE_KEYS` may differ). Read-only, so every process of a distributed launch can run it.
    """
    run_dir = config.run_dir
    if config.overwrite or not run_dir.exists() or not any(run_dir.iterdir()):
        return
    saved = read_json(run_dir / CONFIG_FILE)
    if saved is None:
        raise FileExistsError(
            f"{run_dir} is not empty and holds no {CONFIG_FILE}: it is not a run of this recipe. Pass "
            "--overwrite to delete it, or choose another --name / --output_dir."
        )
    differences = identity_differences(saved, config, RESUMABLE_KEYS if config.resume else ())
    if differences:
        now = config.to_dict()
        changes = "; ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in differences[:5])
        raise FileExistsError(
            f"{run_dir} holds a different run ({changes}). Pass --overwrite to replace it, or choose another "
            f"--name. --resume may only change: {', '.join(RESUMABLE_KEYS)}."
        )
    if not config.resume:
        raise FileExistsError(
            f"{run_dir} already holds this run. Pass --resume to continue it, or --overwrite to start over."
        )


def claim_run_dir(config: RecipeConfig) -> None:
    """Empty the folder when `overwrite`, create it and save the config (main process, after the check)."""
    if config.overwrite and config.run_dir.exists():
        shutil.rmtree(config.run_dir)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(config.run_dir / CONFIG_FILE, config.to_dict())
