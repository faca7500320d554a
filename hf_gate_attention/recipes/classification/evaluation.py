"""Evaluation of trained classifiers: test predictions, accuracy and macro-F1 with bootstrap CIs and paired
deltas vs the baseline, and inference throughput timed in interleaved rounds (the recipes'
`interleaved_rounds`).

(Not named `evaluate.py`: that would shadow the `evaluate` package.)
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np
import torch

from ...memory import peak_growth_mib
from ..common.inference import interleaved_rounds
from ..common.speed import SpeedColumn
from ..common.speed import speed_ratios as median_ratios
from .metrics import METRICS, bootstrap_metric, paired_bootstrap_metric_delta

logger = logging.getLogger(__name__)

SPEED_COLUMNS = (SpeedColumn("examples_per_s", "throughput", "examples/s", "throughput ratio"),)


def _on(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items() if k != "labels"}


@torch.inference_mode()
def predict(model, collator, rows: list[dict], batch_size: int) -> list[int]:
    """Predicted class (argmax of the logits) of every row, in batches of `batch_size`."""
    device = next(model.parameters()).device
    predictions = []
    for start in range(0, len(rows), batch_size):
        logits = model(**_on(collator(rows[start : start + batch_size]), device)).logits  # (batch, classes)
        predictions += logits.argmax(-1).tolist()
    return predictions


def quality(
    labels: list[int], predictions: list[int], n_bootstrap: int, confidence: float, seed: int
) -> dict:
    """`{metric: {"mean", "low", "high"}}` for accuracy and macro-F1 (fractions in [0, 1])."""
    return {
        name: bootstrap_metric(metric, labels, predictions, n_bootstrap, confidence, seed)
        for name, metric in METRICS.items()
    }


def deltas(
    labels: list[int], run: list[int], baseline: list[int], n_bootstrap: int, confidence: float, seed: int
) -> dict:
    """`{metric: {"delta", "low", "high", "p_value"}}`: run - baseline, paired by example."""
    return {
        name: paired_bootstrap_metric_delta(metric, labels, run, baseline, n_bootstrap, confidence, seed)
        for name, metric in METRICS.items()
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _forward_all(model, batches: list[dict]) -> float:
    """Seconds of one forward pass over every batch."""
    device = next(model.parameters()).device
    _synchronize(device)
    start = time.perf_counter()
    for batch in batches:
        model(**batch)
    _synchronize(device)
    return time.perf_counter() - start


def interleaved_throughput(
    models: dict, collator, rows: list[dict], batch_size: int, rounds: int
) -> dict[str, dict]:
    """Inference throughput of each model on the same batches of `rows`, the models alternating within every
    round (after one untimed warm-up batch each).

    Returns:
        `{name: {"examples_per_s", "seconds_per_batch" (medians over rounds), "rounds": [per-round dicts],
        "peak_memory_mb", "batch_size", "examples", "device"}}`.
    """
    device = next(next(iter(models.values())).parameters()).device
    batches = [_on(collator(rows[i : i + batch_size]), device) for i in range(0, len(rows), batch_size)]
    for model in models.values():
        _forward_all(model, batches[:1])

    def time_round(name: str) -> dict:
        seconds = _forward_all(models[name], batches)
        return {"examples_per_s": len(rows) / seconds, "seconds_per_batch": seconds / len(batches)}

    per_round = interleaved_rounds(list(models), rounds, time_round)
    results = {}
    for name, model_rounds in per_round.items():
        results[name] = {key: statistics.median(r[key] for r in model_rounds) for key in model_rounds[0]}
        results[name] |= {
            "rounds": model_rounds,
            "peak_memory_mb": peak_memory_mb(models[name], batches[0]),
            "batch_size": batch_size,
            "examples": len(rows),
            "device": str(device),
        }
    return results


def peak_memory_mb(model, batch: dict) -> float:
    """Weights plus the peak memory growth of one forward pass on `batch`, in MiB (NaN, with a warning, where
    it cannot be measured)."""
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    try:
        growth = peak_growth_mib(lambda: _forward_all(model, [batch]), next(model.parameters()).device)
    except RuntimeError as error:
        logger.warning("peak memory not measured: %s", error)
        return float("nan")
    return weights / 2**20 + growth


def speed_ratios(run: dict, baseline: dict) -> dict:
    """Median over the interleaved rounds of run / baseline throughput (> 1: the run is faster), and the
    peak-memory ratio (> 1: the run uses more)."""
    return median_ratios(run, baseline, SPEED_COLUMNS)


def confusion_matrix(labels: list[int], predictions: list[int], num_labels: int) -> list[list[int]]:
    """Confusion matrix `(num_labels, num_labels)`: row = true class, column = predicted class."""
    matrix = np.zeros((num_labels, num_labels), dtype=int)
    np.add.at(matrix, (np.asarray(labels), np.asarray(predictions)), 1)
    return matrix.tolist()
