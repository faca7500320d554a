"""ROUGE with bootstrap confidence intervals, for "gated vs baseline" verdicts on summarization: the one
ROUGE path of the project.

Per-example F-measures are computed once through the bundled `evaluate` module (`rouge_metric/`, the
`rouge-score` package underneath, no Hub access), then examples are resampled with replacement. rougeLsum
splits texts into sentences on newlines: put one sentence per line beforehand, otherwise rougeLsum == rougeL.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
# Folder of the offline `evaluate` metric module: `evaluate.load(ROUGE_METRIC_PATH)`.
ROUGE_METRIC_PATH = str(Path(__file__).resolve().parent / "rouge_metric")


@functools.cache
def load_rouge_metric():
    """`evaluate.load` of the bundled ROUGE module (no Hub access, loaded once); scores in [0, 1]."""
    import evaluate

    return evaluate.load(ROUGE_METRIC_PATH)


def _check_texts(predictions: Sequence[str], references: Sequence[str]) -> None:
    for name, texts in (("predictions", predictions), ("references", references)):
        if isinstance(texts, str):
            raise ValueError(f"{name} must be a list of strings, not a single string.")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"{name}[{bad}] is {type(texts[bad]).__name__}, expected str.")
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    if not predictions:
        raise ValueError("predictions and references are empty.")


def per_example_rouge(
    predictions: Sequence[str], references: Sequence[str], use_stemmer: bool = True
) -> dict[str, np.ndarray]:
    """Per-example ROUGE F-measures x100: rouge type -> float array of shape `(n_examples,)`."""
    _check_texts(predictions, references)
    scores = load_rouge_metric().compute(
        predictions=list(predictions),
        references=list(references),
        rouge_types=list(ROUGE_TYPES),
        use_stemmer=use_stemmer,
        use_aggregator=False,
    )
    return {t: 100.0 * np.asarray(scores[t], dtype=np.float64) for t in ROUGE_TYPES}


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


def compute_rouge(
    predictions: Sequence[str],
    references: Sequence[str],
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    use_stemmer: bool = True,
) -> dict[str, dict[str, float]]:
    """Mean ROUGE F-measures x100 with bootstrap confidence intervals over examples.

    Returns:
        `{"rouge1": {"mean": ..., "low": ..., "high": ...}, "rouge2": ..., "rougeL": ..., "rougeLsum": ...}`
        where `(low, high)` is the percentile bootstrap interval at `confidence` (same resamples, from
        `seed`, for every type).
    """
    return summarize_rouge(
        per_example_rouge(predictions, references, use_stemmer), n_bootstrap, confidence, seed
    )


def summarize_rouge(
    per_example: dict[str, Sequence[float]], n_bootstrap: int, confidence: float, seed: int
) -> dict[str, dict[str, float]]:
    """`{type: {"mean", "low", "high"}}` of per-example scores (`per_example_rouge`), as `compute_rouge`."""
    out = {}
    for rouge_type, scores in per_example.items():
        low, high = bootstrap_ci(scores, n_bootstrap, confidence, seed)
        out[rouge_type] = {"mean": float(np.mean(scores)), "low": low, "high": high}
    return out


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
