"""Results folder of a recipe's run: the "does this folder hold a different run, or was its data
changed?" checks, and its claim.

Layout of `<output_dir>/<name>/` shared by the fine-tuning recipes (each recipe adds its tables and plots):

    config.json                      the recipe's config (identity of the folder)
    data.json                        rows and SHA-256 of every split the run reads (checked on --resume)
    <run>/checkpoints/checkpoint-N/  Trainer checkpoints (resume)
    <run>/model/                     final weights
    <run>/train_summary.json         written when training finished
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ...files import atomic_write_json, discard_set_aside, read_json, set_aside
from .config import RESUMABLE_KEYS, RecipeConfigBase, identity_differences
from .distributed import distributed_state

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
DATA_FILE = "data.json"


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


def _value_bytes(value: Any) -> bytes:
    """The bytes a data fingerprint hashes for one value of a row (text, number, image, tensor, nested)."""
    if isinstance(value, Mapping):
        return b"{" + b",".join(repr(k).encode() + b":" + _value_bytes(v) for k, v in value.items()) + b"}"
    if isinstance(value, list | tuple):
        return b"[" + b",".join(_value_bytes(v) for v in value) + b"]"
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{tuple(value.shape)}".encode() + value.contiguous().cpu().numpy().tobytes()
    if hasattr(value, "tobytes") and hasattr(value, "mode"):  # a PIL image
        return f"{value.mode}{value.size}".encode() + value.tobytes()
    return repr(value).encode()


def data_fingerprint(splits: Mapping[str, Iterable]) -> dict:
    """`{split: {"rows": n, "sha256": hex}}` of the rows of every split (dicts of text, numbers, images or
    tensors), what `data.json` records so that `--resume` notices data changed at the same path."""
    record = {}
    for split, rows in splits.items():
        digest, count = hashlib.sha256(), 0
        for row in rows:
            digest.update(_value_bytes(row))
            count += 1
        record[split] = {"rows": count, "sha256": digest.hexdigest()}
    return record


def _describe(split: dict | None) -> str:
    return "absent" if split is None else f"{split['rows']} rows, sha256 {split['sha256'][:12]}"


def check_run_data(config: RecipeConfigBase, fingerprint: dict | None) -> None:
    """Refuse (`ValueError`) to resume a run whose recorded data (`data.json`) differs from `fingerprint`:
    training would continue on other data, and the comparison would mix the two. Read-only."""
    if fingerprint is None or config.overwrite:
        return
    saved = read_json(config.run_dir / DATA_FILE)
    if saved is None or saved == fingerprint:
        return
    changes = "; ".join(
        f"{split}: {_describe(saved.get(split))} -> {_describe(fingerprint.get(split))}"
        for split in sorted(set(saved) | set(fingerprint))
        if saved.get(split) != fingerprint.get(split)
    )
    raise ValueError(
        f"the data of the run in {config.run_dir} changed since it started ({changes}; {DATA_FILE} records "
        "what it read): resuming would train or evaluate on other data. Restore the data, or pass "
        "--overwrite to start over, or choose another --name."
    )


def claim_run_dir(config: RecipeConfigBase, fingerprint: dict | None = None) -> None:
    """Create the folder and save the config and the data's `fingerprint` (main process, after the checks).
    With `overwrite` the old folder is set aside, not deleted: it stays on disk until `finish_run_dir`."""
    if config.overwrite:
        set_aside(config.run_dir)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(config.run_dir / CONFIG_FILE, config.to_dict())
    if fingerprint is not None:
        if config.resume and not (config.run_dir / DATA_FILE).is_file():
            logger.warning("%s: no record of the data this run read so far; recorded now", config.run_dir)
        atomic_write_json(config.run_dir / DATA_FILE, fingerprint)


def claim_on_main(config: RecipeConfigBase, fingerprint: dict | None = None) -> None:
    """`check_run_data` on every process, then `claim_run_dir` by the main process of a distributed launch
    (or the single process), the others waiting until it is done."""
    check_run_data(config, fingerprint)
    state = distributed_state()
    state.wait_for_everyone()
    if state.is_main_process:
        claim_run_dir(config, fingerprint)
    state.wait_for_everyone()


def finish_run_dir(config: RecipeConfigBase) -> None:
    """Delete the old results that an `overwrite` set aside, now that the new ones are complete."""
    discard_set_aside(config.run_dir)
