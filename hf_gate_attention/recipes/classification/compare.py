"""One command for a classification comparison: train the baseline and the gated runs on the same data, seed
and budget, evaluate them on the test split, time them interleaved, and write the results folder.

Layout of `<output_dir>/<name>/` (the summarization recipe's, with classification metrics):

    config.json                      the ClassificationConfig (identity of the folder)
    comparison.md / .csv / .json     the comparison table
    loss_curves.png, quality.png, speed.png
    <run>/checkpoints/checkpoint-N/  Trainer checkpoints (resume)
    <run>/model/                     final weights
    <run>/train_summary.json         written when training finished
    <run>/predictions.json           test labels and predictions, written when evaluation finished
    <run>/metrics.json               everything about the run: training, quality with CIs, speed, deltas
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path

from transformers import TrainerCallback

from ...files import atomic_write_json, atomic_write_text, read_json
from ...offline import resolve_model
from ...sharing.loading import checkpoint_config
from ..common.config import split_limits
from ..common.distributed import check_gates_patch, distributed_state, leave_after_training
from ..common.plots import plot_loss_curves, plot_scores, plot_speed
from ..common.run_dir import check_run_dir, claim_on_main, data_fingerprint, finish_run_dir
from ..common.training import TRAIN_SUMMARY_FILE, is_trained, train_model
from .config import ClassificationConfig
from .data import ClassificationData, load_classification_dataset
from .evaluation import confusion_matrix, deltas, interleaved_throughput, predict, quality, speed_ratios
from .metrics import METRIC_LABELS
from .model import (
    AUTO_CLASSES,
    ClassificationCollator,
    check_modality,
    load_classifier,
    load_processor,
    load_trained_classifier,
)
from .report import csv_table, markdown_table

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "predictions.json"


def load_data(config: ClassificationConfig) -> ClassificationData:
    return load_classification_dataset(
        config.dataset,
        config.text_column,
        config.image_column,
        config.label_column,
        config.archive_dir,
        split_limits(config),
    )


def train_all(config, model_path: str, processor, data: ClassificationData, callbacks) -> None:
    """Train every run not yet trained with the current budget."""
    for run in config.runs:
        if config.resume and is_trained(config, run):
            logger.warning("Run %s: already trained, kept", run.name)
            continue
        (config.run_dir / run.name / PREDICTIONS_FILE).unlink(missing_ok=True)  # stale once retrained
        model = load_classifier(config, model_path, run, data.label_names, data.modality)
        collator = ClassificationCollator.for_model(processor, data.modality, config.max_length, model)
        validation = data.splits["validation"]
        train_model(
            config, run, model, collator, data.splits["train"], validation, callbacks, processors=(processor,)
        )
        del model
        gc.collect()


def predict_all(config, processor, data: ClassificationData) -> dict[str, list[int]]:
    """Test predictions of every run (kept from an earlier invocation when still valid)."""
    test, labels = data.splits["test"], [row["label"] for row in data.splits["test"]]
    predictions = {}
    for run in config.runs:
        path = config.run_dir / run.name / PREDICTIONS_FILE
        saved = read_json(path)
        if saved is None or saved["labels"] != labels:
            model = load_trained_classifier(config, run, data.modality)
            collator = ClassificationCollator.for_model(processor, data.modality, config.max_length, model)
            saved = {
                "labels": labels,
                "predictions": predict(model, collator, test, config.per_device_eval_batch_size),
            }
            atomic_write_json(path, saved)
            del model
        predictions[run.name] = saved["predictions"]
    return predictions


def measure_speed(config, processor, data: ClassificationData) -> dict[str, dict]:
    models = {run.name: load_trained_classifier(config, run, data.modality) for run in config.runs}
    first = next(iter(models.values()))
    collator = ClassificationCollator.for_model(processor, data.modality, config.max_length, first)
    rows = data.splits["test"][: config.speed_examples]
    speed = interleaved_throughput(models, collator, rows, config.speed_batch_size, config.speed_rounds)
    del models, first
    gc.collect()
    return speed


def comparison_rows(
    config, data: ClassificationData, trainings: dict, predictions: dict, speed: dict
) -> list:
    """One row per run: trained parameters and steps, quality with CIs, speed, deltas and ratios vs the
    baseline."""
    labels = [row["label"] for row in data.splits["test"]]
    stats = (config.n_bootstrap, config.confidence, config.seed)
    baseline = config.baseline
    rows = []
    for run in config.runs:
        row = {
            "run": run.name,
            "gate": None if run.gate is None else run.gate.to_dict(),
            "trainable_params": trainings[run.name]["parameters"]["trainable"],
            "global_step": trainings[run.name]["global_step"],
            "test_examples": len(labels),
            "quality": quality(labels, predictions[run.name], *stats),
            "speed": speed[run.name],
        }
        if baseline is not None and run is not baseline:
            row["deltas"] = deltas(labels, predictions[run.name], predictions[baseline.name], *stats)
            row["speed_ratios"] = speed_ratios(speed[run.name], speed[baseline.name])
        rows.append(row)
    return rows


def write_tables(folder: Path, config: ClassificationConfig, rows: list[dict]) -> None:
    """`comparison.md` and `comparison.csv` of `rows` in `folder`: quality, deltas and throughput ratios vs
    the baseline. Written by `write_results`, and from a saved comparison.json by the recipe's `tables`
    action."""
    reference = config.baseline.name if config.baseline else None
    markdown = markdown_table(rows, config.confidence, reference)
    csv = csv_table(rows, reference)
    atomic_write_text(folder / "comparison.md", markdown)
    atomic_write_text(folder / "comparison.csv", csv)


def write_results(
    config, data: ClassificationData, rows: list[dict], trainings: dict, predictions: dict
) -> None:
    """Per-run metrics.json, comparison.md/.csv/.json and the plots."""
    out = config.run_dir
    labels = [row["label"] for row in data.splits["test"]]
    for row in rows:
        confusion = confusion_matrix(labels, predictions[row["run"]], len(data.label_names))
        metrics = row | {"training": trainings[row["run"]], "confusion_matrix": confusion}
        atomic_write_json(out / row["run"] / "metrics.json", metrics)
    write_tables(out, config, rows)
    sizes = {split: len(rows_) for split, rows_ in data.splits.items()}
    summary = {
        "modality": data.modality,
        "labels": data.label_names,
        "split_sizes": sizes,
        "source": data.source,
    }
    atomic_write_json(out / "comparison.json", {"config": config.to_dict(), "data": summary, "runs": rows})
    plot_loss_curves({name: t["log_history"] for name, t in trainings.items()}, out / "loss_curves.png")
    scores = {
        row["run"]: {m: {k: 100 * v for k, v in s.items()} for m, s in row["quality"].items()} for row in rows
    }
    title = f"Test split ({100 * config.confidence:g} % bootstrap CI)"
    plot_scores(scores, METRIC_LABELS, "%", title, out / "quality.png")
    title = "Inference throughput (interleaved rounds; bars: median, whiskers: min-max)"
    plot_speed(
        {row["run"]: row["speed"] for row in rows},
        out / "speed.png",
        (("examples_per_s", "examples/s"),),
        title,
    )


def run_classification(
    config: ClassificationConfig, callbacks: list[TrainerCallback] | None = None
) -> Path | None:
    """Train, evaluate and compare every run of `config`; returns the results folder (`None` on the non-main
    processes of a distributed launch: every process trains with DDP, the main one alone evaluates).

    Args:
        config: the comparison (see [`ClassificationConfig`]).
        callbacks: extra `TrainerCallback`s for every training (e.g. to stop early).
    """
    check_run_dir(config)
    with distributed_state().main_process_first():  # what is fetched or unpacked, once
        model_path = resolve_model(config.model)
        data = load_data(config)
    check_modality(model_path, data.modality, config.dataset)
    check_gates_patch(config, checkpoint_config(model_path), AUTO_CLASSES[data.modality])
    claim_on_main(
        config, data_fingerprint(data.splits)
    )  # after the input was read: bad input leaves no folder
    processor = load_processor(config, model_path, data.modality)
    train_all(config, model_path, processor, data, callbacks)
    if not leave_after_training():
        return None
    trainings = {run.name: read_json(config.run_dir / run.name / TRAIN_SUMMARY_FILE) for run in config.runs}
    predictions = predict_all(config, processor, data)
    speed = measure_speed(config, processor, data)
    rows = comparison_rows(config, data, trainings, predictions, speed)
    write_results(config, data, rows, trainings, predictions)
    finish_run_dir(config)
    return config.run_dir
