"""One command for a whole comparison: train the baseline and the gated runs with the same data, seed and
budget, evaluate them on the test split, time them interleaved, and write the results folder.

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

Distributed launches (`torchrun`, `accelerate launch`): every process trains (the `Trainer` handles DDP, FSDP
and DeepSpeed); evaluation and timing then run on the main process alone, from the saved final weights.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from transformers import AutoModelForCausalLM, TrainerCallback

from ...files import atomic_write_json, atomic_write_text, read_json
from ...offline import resolve_model
from ...sharing.loading import checkpoint_config
from ..common.distributed import check_gates_patch, leave_after_training
from ..common.plots import plot_loss_curves, plot_speed
from ..common.run_dir import check_run_dir, claim_on_main, data_fingerprint, finish_run_dir
from ..common.summaries.pipeline import evaluate_all, load_data, measure_speed, train_all
from ..common.summaries.report import csv_table, markdown_table, plot_rouge, rouge_deltas, speed_ratios
from ..common.training import TRAIN_SUMMARY_FILE, load_tokenizer
from .config import RecipeConfig
from .models import load_trained_model, train_run


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


def write_tables(folder: Path, config: RecipeConfig, rows: list[dict]) -> None:
    """`comparison.md` and `comparison.csv` of `rows` in `folder`: ROUGE, deltas and speed ratios vs the
    baseline. Written by `write_results`, and from a saved comparison.json by the recipe's `tables` action."""
    reference = config.baseline.name if config.baseline else None
    markdown = markdown_table(rows, config.confidence, reference=reference)
    csv = csv_table(rows, speed_reference=reference)
    atomic_write_text(folder / "comparison.md", markdown)
    atomic_write_text(folder / "comparison.csv", csv)


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
    write_tables(out, config, rows)
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
    model_path = resolve_model(config.model)  # the model and data resolve before the results folder is made
    check_gates_patch(config, checkpoint_config(model_path), AutoModelForCausalLM)
    tokenizer = load_tokenizer(model_path)
    data = load_data(config)
    claim_on_main(config, data_fingerprint(data))
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
    finish_run_dir(config)
    return config.run_dir
