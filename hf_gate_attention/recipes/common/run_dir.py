"""Results folder of a recipe's run: the "does this folder hold a different run?" check, and its claim.

Layout of `<output_dir>/<name>/` shared by the fine-tuning recipes (each recipe adds its tables and plots):

    config.json                      the recipe's config (identity of the folder)
    <run>/checkpoints/checkpoint-N/  Trainer checkpoints (resume)
    <run>/model/                     final weights
    <run>/train_summary.json         written when training finished
"""

from __future__ import annotations

import shutil

from ...files import atomic_write_json, read_json
from .config import RESUMABLE_KEYS, RecipeConfigBase, identity_differences
from .distributed import distributed_state

CONFIG_FILE = "config.json"


def check_run_dir(config: RecipeConfigBase) -> None:
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


def claim_run_dir(config: RecipeConfigBase) -> None:
    """Empty the folder when `overwrite`, create it and save the config (main process, after the check)."""
    if config.overwrite and config.run_dir.exists():
        shutil.rmtree(config.run_dir)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(config.run_dir / CONFIG_FILE, config.to_dict())


def claim_on_main(config: RecipeConfigBase) -> None:
    """`claim_run_dir` by the main process of a distributed launch (or the single process), the others
    waiting until it is done."""
    state = distributed_state()
    state.wait_for_everyone()
    if state.is_main_process:
        claim_run_dir(config)
    state.wait_for_everyone()
