"""Bootstrap statistics over examples, shared by the recipes: confidence intervals of a mean, and paired
deltas of two systems scored on the same examples."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


def _as_scores(scores: Sequence[float], name: str = "scores") -> np.ndarray:
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {array.shape}.")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    return array


def bootstrap_samples(n: int, n_bootstrap: int, seed: int) -> Iterator[np.ndarray]:
    """`n_bootstrap` resamples (with replacement) of `n` examples: index arrays of shape `(n,)`, the same
    for a given `seed` whatever statistic is computed on them."""
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be >= 1, got {n_bootstrap}.")
    rng = np.random.default_rng(seed)
    for _ in range(n_bootstrap):
        yield rng.integers(0, n, n)


def _bootstrap_means(values: np.ndarray, n_bootstrap: int, seed: int) -> np.ndarray:
    """Means of `n_bootstrap` resamples (with replacement) of `values`: shape `(n_bootstrap,)`."""
    return np.array([values[index].mean() for index in bootstrap_samples(len(values), n_bootstrap, seed)])


def percentile_interval(means: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` interval `(low, high)` of bootstrap statistics `means` (percentile method)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    alpha = 100.0 * (1 - confidence) / 2
    low, high = np.percentile(means, [alpha, 100.0 - alpha])
    return float(low), float(high)


def bootstrap_ci(
    scores: Sequence[float], n_bootstrap: int = 1000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval `(low, high)` of the mean of per-example `scores`."""
    return percentile_interval(_bootstrap_means(_as_scores(scores), n_bootstrap, seed), confidence)


def paired_bootstrap_delta(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Paired bootstrap of the difference of means of two systems scored on the same examples.

    Args:
        scores_a, scores_b: per-example scores (e.g. `per_example_rouge(...)["rougeL"]`) of systems A
            and B, aligned by example.

    Returns:
        `{"delta": mean(a) - mean(b), "low": ..., "high": ..., "p_value": ...}`: `(low, high)` is the
        percentile interval of the resampled deltas; `p_value` is the share of resamples where A is not
        better (delta <= 0), a one-sided test of "A > B". A CI above 0 means A wins at `confidence`.
    """
    a, b = _as_scores(scores_a, "scores_a"), _as_scores(scores_b, "scores_b")
    if a.shape != b.shape:
        raise ValueError(f"scores_a and scores_b must be aligned: {a.size} vs {b.size} examples.")
    deltas = _bootstrap_means(a - b, n_bootstrap, seed)
    low, high = percentile_interval(deltas, confidence)
    return {"delta": float((a - b).mean()), "low": low, "high": high, "p_value": float((deltas <= 0).mean())}


def _finite_pairs(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]


def mean_ci(values, stats) -> dict | None:
    """`{"mean", "low", "high", "n"}` of the finite `values` (`stats`: n_bootstrap, confidence, seed), or
    `None` when none is finite."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    low, high = bootstrap_ci(values, *stats)
    return {"mean": float(values.mean()), "low": low, "high": high, "n": int(values.size)}


def paired_delta(a, b, stats) -> dict | None:
    """`paired_bootstrap_delta` of `a` - `b` over the examples where both are finite, with their count `n`;
    `None` without such an example."""
    a, b = _finite_pairs(a, b)
    if a.size == 0:
        return None
    return paired_bootstrap_delta(a, b, *stats) | {"n": int(a.size)}


def unpaired_delta(a, b, stats) -> dict | None:
    """Mean of the finite `a` minus the finite `b`, each group resampled on its own (`stats`: n_bootstrap,
    confidence, seed): `{"delta", "low", "high", "p_value", "n"}` (p: share of resamples <= 0); `None` when a
    group is empty."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size == 0 or b.size == 0:
        return None
    n_bootstrap, confidence, seed = stats
    rng = np.random.default_rng(seed)
    deltas = np.array(
        [
            a[rng.integers(0, a.size, a.size)].mean() - b[rng.integers(0, b.size, b.size)].mean()
            for _ in range(n_bootstrap)
        ]
    )
    low, high = percentile_interval(deltas, confidence)
    delta = float(a.mean() - b.mean())
    return {
        "delta": delta,
        "low": low,
        "high": high,
        "p_value": float((deltas <= 0).mean()),
        "n": int(a.size + b.size),
    }
