"""ROUGE: the offline `evaluate` module, bootstrap confidence intervals and paired deltas."""

from __future__ import annotations

import numpy as np
import pytest
from rouge_score import rouge_scorer

from hf_gate_attention.recipes.summarization import (
    ROUGE_METRIC_PATH,
    ROUGE_TYPES,
    bootstrap_ci,
    compute_rouge,
    load_rouge_metric,
    paired_bootstrap_delta,
    per_example_rouge,
)

PREDICTIONS = [
    "The cats sat on the mat.\nThey slept.",
    "gated attention improves long document summarization",
    "nothing in common",
]
REFERENCES = [
    "A cat sat on a mat.\nIt slept all day.",
    "gated attention helps summarization of long documents",
    "completely different words here",
]


def _noisy_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """References of 30 random words; predictions keep each word with a per-example probability."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(60)]
    predictions, references = [], []
    for _ in range(n):
        ref = list(rng.choice(vocab, 30))
        keep = rng.uniform(0.2, 0.9)
        predictions.append(" ".join(w if rng.random() < keep else str(rng.choice(vocab)) for w in ref))
        references.append(" ".join(ref))
    return predictions, references


def test_evaluate_module_loads_offline_and_matches_rouge_score():
    metric = load_rouge_metric()
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    direct = [scorer.score(r, p) for r, p in zip(REFERENCES, PREDICTIONS, strict=True)]
    result = metric.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert set(result) == set(ROUGE_TYPES)
    for t in ROUGE_TYPES:
        assert result[t] == pytest.approx(np.mean([s[t].fmeasure for s in direct]))
    per_example = metric.compute(predictions=PREDICTIONS, references=REFERENCES, use_aggregator=False)
    ours = per_example_rouge(PREDICTIONS, REFERENCES)
    for t in ROUGE_TYPES:
        assert per_example[t] == pytest.approx([s[t].fmeasure for s in direct])
        assert ours[t] == pytest.approx(100 * np.array(per_example[t]))
    assert ROUGE_METRIC_PATH.endswith("rouge_metric")


def test_rouge_lsum_splits_sentences_on_newlines():
    scores = per_example_rouge(["a b\nc d"], ["c d\na b"])
    assert scores["rougeL"][0] == pytest.approx(50.0)
    assert scores["rougeLsum"][0] == pytest.approx(100.0)


def test_identical_predictions_score_100():
    result = compute_rouge(REFERENCES, REFERENCES, n_bootstrap=50)
    for t in ROUGE_TYPES:
        assert result[t] == pytest.approx({"mean": 100.0, "low": 100.0, "high": 100.0})


def test_confidence_intervals_contain_mean_and_shrink():
    widths = []
    for n in (20, 400):
        result = compute_rouge(*_noisy_pairs(n, seed=n), n_bootstrap=500)
        for t in ROUGE_TYPES:
            assert result[t]["low"] < result[t]["mean"] < result[t]["high"]
            assert 0 < result[t]["mean"] < 100
        widths.append(result["rouge1"]["high"] - result["rouge1"]["low"])
    assert widths[1] < widths[0] / 2
    # wider confidence -> wider interval; same seed -> same interval
    scores = per_example_rouge(*_noisy_pairs(50, seed=1))["rougeL"]
    low90, high90 = bootstrap_ci(scores, confidence=0.9)
    low99, high99 = bootstrap_ci(scores, confidence=0.99)
    assert low99 < low90 < high90 < high99
    assert bootstrap_ci(scores, seed=3) == bootstrap_ci(scores, seed=3)


def test_paired_bootstrap_delta():
    predictions, references = _noisy_pairs(100, seed=0)
    a = per_example_rouge(predictions, references)["rouge2"]
    same = paired_bootstrap_delta(a, a)
    assert same == {"delta": 0.0, "low": 0.0, "high": 0.0, "p_value": 1.0}
    worse = per_example_rouge([" ".join(p.split()[::2]) for p in predictions], references)["rouge2"]
    result = paired_bootstrap_delta(a, worse)
    assert result["delta"] == pytest.approx(a.mean() - worse.mean())
    assert 0 < result["low"] < result["delta"] < result["high"]
    assert result["p_value"] == 0.0


def test_input_validation():
    with pytest.raises(ValueError, match="2 predictions but 1 references"):
        compute_rouge(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="empty"):
        compute_rouge([], [])
    with pytest.raises(ValueError, match="single string"):
        compute_rouge("a b", "a b")
    with pytest.raises(ValueError, match=r"predictions\[1\] is NoneType"):
        compute_rouge(["a", None], ["a", "b"])
    with pytest.raises(ValueError, match="confidence"):
        compute_rouge(["a"], ["a"], confidence=95)
    with pytest.raises(ValueError, match="aligned"):
        paired_bootstrap_delta([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap_delta([], [])
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([1.0, float("nan")])
