"""Accuracy and macro-F1 with bootstrap confidence intervals and paired deltas, computed directly with numpy.

(`evaluate.load("accuracy")` and `evaluate.load("f1")` fetch their scripts from the Hub and fail offline,
and scikit-learn is not a dependency; the two metrics are a few lines and tested against hand-computed
values.) Resampling shares the recipes' bootstrap (`bootstrap_samples`, `percentile_interval`):
the interval of the accuracy equals `bootstrap_ci` of the per-example correctness for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..common.statistics import bootstrap_samples, percentile_interval

Metric = Callable[[np.ndarray, np.ndarray], float]


def _labels(labels: Sequence[int], predictions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    y, p = np.asarray(labels), np.asarray(predictions)
    if y.ndim != 1 or y.shape != p.shape or y.size == 0:
        raise ValueError(
            f"labels and predictions must be non-empty 1-D sequences of equal length, got shapes {y.shape} "
            f"and {p.shape}"
        )
    return y, p


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Share of examples whose predicted class (`(n,)` ints) equals the label (`(n,)` ints)."""
    y, p = _labels(labels, predictions)
    return float((y == p).mean())


def macro_f1(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN), over the classes that occur in `labels`
    or `predictions` (`(n,)` ints each), as scikit-learn's `f1_score(average="macro")`."""
    y, p = _labels(labels, predictions)
    scores = []
    for cls in np.union1d(y, p):
        tp = np.sum((p == cls) & (y == cls))
        scores.append(2 * tp / (2 * tp + np.sum((p == cls) & (y != cls)) + np.sum((p != cls) & (y == cls))))
    return float(np.mean(scores))


METRICS: dict[str, Metric] = {"accuracy": accuracy, "macro_f1": macro_f1}
METRIC_LABELS = {"accuracy": "accuracy", "macro_f1": "macro-F1"}


def bootstrap_metric(
    metric: Metric,
    labels: Sequence[int],
    predictions: Sequence[int],
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """`{"mean", "low", "high"}`: `metric` on all examples and its percentile bootstrap interval (examples
    resampled with replacement; `labels`, `predictions`: `(n,)` ints)."""
    y, p = _labels(labels, predictions)
    values = [metric(y[index], p[index]) for index in bootstrap_samples(len(y), n_bootstrap, seed)]
    low, high = percentile_interval(np.asarray(values), confidence)
    return {"mean": metric(y, p), "low": low, "high": high}


def paired_bootstrap_metric_delta(
    metric: Metric,
    labels: Sequence[int],
    predictions_a: Sequence[int],
    predictions_b: Sequence[int],
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Paired bootstrap of `metric(a) - metric(b)` for two systems' predictions (`(n,)` ints) on the same
    examples.

    Returns:
        `{"delta", "low", "high", "p_value"}`: the difference on all examples, the percentile interval of the
        resampled differences, and the share of resamples where A is not better (a one-sided test of A > B).
    """
    y, a = _labels(labels, predictions_a)
    _, b = _labels(labels, predictions_b)
    deltas = np.asarray(
        [metric(y[i], a[i]) - metric(y[i], b[i]) for i in bootstrap_samples(len(y), n_bootstrap, seed)]
    )
    low, high = percentile_interval(deltas, confidence)
    return {
        "delta": metric(y, a) - metric(y, b),
        "low": low,
        "high": high,
        "p_value": float((deltas <= 0).mean()),
    }
