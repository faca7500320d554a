"""ROUGE with bootstrap confidence intervals, for "gated vs baseline" verdicts on summaries: the one ROUGE
path of the project.

Per-example F-measures are computed once through the bundled `evaluate` module (`rouge_metric/`, the
`rouge-score` package underneath, no Hub access), then examples are resampled with replacement. rougeLsum
splits texts into sentences on newlines: put one sentence per line beforehand, otherwise rougeLsum == rougeL.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..statistics import bootstrap_ci

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
