"""One command for a whole comparison: train the baseline and the gated runs with the same data, seed and
budget, evaluate them on the test split, time them interleaved, and write the results folder.

Distributed launches (`torchrun`, `accelerate launch`): every process trains (the `Trainer` handles DDP, FSDP
and DeepSpeed); evaluation and timing then run on the main process alone, from the saved final weights.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import TrainerCallback

from ...files import atomic_write_json, atomic_write_text, read_json
from ...offline import resolve_model
from .config import RecipeConfig
from .data import load_summarization_dataset
from .evaluation import (
    evaluate_quality,
    generation_prompts,
    interleaved_speed,
    load_trained_model,
    predictions_jsonl,
)
from .files import check_run_dir, claim_run_dir
from .plots import plot_loss_curves, plot_rouge, plot_speed
from .report import csv_table, markdown_table, rouge_deltas, speed_ratios
from .train import (
    TRAIN_SUMMARY_FILE,
    distributed_state,
    is_trained,
    load_tokenizer,
    train_run,
    training_features,
)

logger = logging.getLogger(__name__)

QUALITY_FILE = "quality.json"
SPLIT_LIMITS = {
    "train": "max_train_examples",
    "validation": "max_validation_examples",
    "test": "max_test_examples",
}


def load_data(config: RecipeConfig) -> datasets.DatasetDict:
    """The splits the comparison needs (validation only with `eval_steps`), each cut to `max_*_examples`."""
    splits = ["train", "test"] if config.eval_steps is None else ["train", "validation", "test"]
    data = load_summarization_dataset(
        config.dataset, config.document_column, config.summary_column, splits=splits, seed=config.seed
    )
    for split in splits:
        limit = getattr(config, SPLIT_LIMITS[split])
        if limit is not None:
            data[split] = data[split].select(range(min(limit, len(data[split]))))
        if len(data[split]) == 0:
            raise ValueError(
                f"split {split!r} of {config.dataset!r} has no example with a non-empty document and summary"
            )
    return data


def train_all(config, tokenizer, data, train_one: Callable) -> None:
    """Train every run of `config` not yet trained with the current budget (all processes): `train_one(run=,
    train_set=, validation_set=)` trains one run on the tokenized splits (`validation_set` may be `None`);
    the summarization recipe's is `train_run`, the distillation recipe's `train_student`."""
    state = distributed_state()
    train_set = training_features(data["train"], tokenizer, config)
    validation_set = (
        training_features(data["validation"], tokenizer, config) if "validation" in data else None
    )
    for run in config.runs:
        if config.resume and is_trained(config, run):
            logger.warning("Run %s: already trained, kept", run.name)
            continue
        if state.is_main_process:
            (config.run_dir / run.name / QUALITY_FILE).unlink(missing_ok=True)  # stale once retrained
        train_one(run=run, train_set=train_set, validation_set=validation_set)
        state.wait_for_everyone()
        gc.collect()


def claim_on_main(config) -> None:
    """`claim_run_dir` by the main process of a distributed launch (or the single process), the others
    waiting until it is done."""
    state = distributed_state()
    state.wait_for_everyone()
    if state.is_main_process:
        claim_run_dir(config)
    state.wait_for_everyone()


def leave_after_training() -> bool:
    """Ends the process group of a distributed launch once every run is trained; `True` on the process
    that goes on to evaluate (the main one, or the single process)."""
    state = distributed_state()
    if state.use_distributed:
        state.destroy_process_group()
    return state.is_main_process


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate_all(
    config: RecipeConfig, names: list[str], load: Callable[[str], Any], tokenizer, test_set: datasets.Dataset
) -> dict[str, dict]:
    """ROUGE on the test split of each model `load(name)` of `names`, saved in `<name>/quality.json` (kept
    from an earlier invocation when still valid); shared by the recipes that generate summaries."""
    prompts = generation_prompts(test_set, tokenizer, config)
    references = list(test_set["summary"])
    ids = list(test_set["id"]) if "id" in test_set.column_names else list(range(len(test_set)))
    quality = {}
    for name in names:
        path = config.run_dir / name / QUALITY_FILE
        quality[name] = read_json(path)
        if quality[name] is None:
            model = load(name)
            quality[name] = evaluate_quality(model, tokenizer, prompts, references, config, name)
            del model
            _release_memory()
            atomic_write_text(
                path.with_name("predictions.jsonl"),
                predictions_jsonl(ids, quality[name]["predictions"], references),
            )
            atomic_write_json(path, quality[name])
    return quality


def measure_speed(
    config: RecipeConfig, names: list[str], load: Callable[[str], Any], tokenizer, test_set: datasets.Dataset
) -> dict[str, dict]:
    """Interleaved timing of the models `load(name)` of `names` on the first `speed_examples` test prompts."""
    prompts = generation_prompts(
        test_set.select(range(min(config.speed_examples, len(test_set)))), tokenizer, config
    )
    models = {name: load(name) for name in names}
    speed = interleaved_speed(models, prompts, config.speed_rounds, config.speed_new_tokens)
    del models
    _release_memory()
    return speed


def comparison_rows(config: RecipeConfig, trainings: dict, quality: dict, speed: dict) -> list[dict]:
    """One row per run: trained parameters and steps, ROUGE, speed, and deltas and ratios vs the baseline."""
    baseline = config.baseline
    rows = []
    for run in config.runs:
        row = {
            "run": run.name,
            "gate": None if run.gate is None else run.gate.to_dict(),
            "train_mode": config.train,
            "trainable_params": trainings[run.name]["parameters"]["trainable"],
            "global_step": trainings[run.name]["global_step"],
            "rouge": quality[run.name]["rouge"],
            "speed": speed[run.name],
        }
        if baseline is not None and run is not baseline:
            row["deltas"] = rouge_deltas(
                quality[run.name], quality[baseline.name], config.n_bootstrap, config.confidence, config.seed
            )
            row["speed_ratios"] = speed_ratios(speed[run.name], speed[baseline.name])
        rows.append(row)
    return rows


def write_results(config: RecipeConfig, rows: list[dict], trainings: dict, quality: dict, data) -> None:
    """Per-run metrics.json, comparison.md/.csv/.json and the plots."""
    out = config.run_dir
    for row in rows:
        metrics = row | {
            "training": trainings[row["run"]],
            "quality": {k: v for k, v in quality[row["run"]].items() if k != "predictions"},
            "skipped_examples": data.num_skipped,
        }
        atomic_write_json(out / row["run"] / "metrics.json", metrics)
    atomic_write_text(out / "comparison.md", markdown_table(rows, config.confidence))
    atomic_write_text(out / "comparison.csv", csv_table(rows))
    atomic_write_json(
        out / "comparison.json",
        {"config": config.to_dict(), "skipped_examples": data.num_skipped, "runs": rows},
    )
    plot_loss_curves({name: t["log_history"] for name, t in trainings.items()}, out / "loss_curves.png")
    plot_rouge({row["run"]: row["rouge"] for row in rows}, config.confidence, out / "rouge.png")
    plot_speed({row["run"]: row["speed"] for row in rows}, out / "speed.png")


def run_comparison(config: RecipeConfig, callbacks: list[TrainerCallback] | None = None) -> Path | None:
    """Train, evaluate and compare every run of `config`; returns the results folder (`None` on non-main
    processes of a distributed launch, which stop after training).

    Args:
        config: the comparison (see [`RecipeConfig`]).
        callbacks: extra `TrainerCallback`s for every training (e.g. to stop early).
    """
    check_run_dir(config)
    claim_on_main(config)

    model_path = resolve_model(config.model)
    tokenizer = load_tokenizer(model_path)
    data = load_data(config)
    train_all(
        config,
        tokenizer,
        data,
        partial(train_run, config, model_path=model_path, tokenizer=tokenizer, callbacks=callbacks),
    )
    if not leave_after_training():
        return None

    trainings = {run.name: read_json(config.run_dir / run.name / TRAIN_SUMMARY_FILE) for run in config.runs}
    runs = {run.name: run for run in config.runs}

    def load(name: str):
        return load_trained_model(config, runs[name], model_path)

    quality = evaluate_all(config, list(runs), load, tokenizer, data["test"])
    speed = measure_speed(config, list(runs), load, tokenizer, data["test"])
    rows = comparison_rows(config, trainings, quality, speed)
    write_results(config, rows, trainings, quality, data)
    return config.run_dir
