"""The source article's claims and the rules that call them reproduced, not reproduced or inconclusive.

Used by the reproduction report (`summarization/reproduction.py`) and the model cards (`card.py`).
"""

from __future__ import annotations

ROUGE_L_CLAIM_PERCENT = 3.2  # "Rouge-L +3.2 %" on long-document summarization
SPEEDUP_CLAIM = 1.18  # "inference speed +18 %"


def rouge_verdict(delta: dict, baseline_mean: float) -> str:
    """`reproduced`, `not reproduced` or `inconclusive` for the +3.2 % ROUGE-L claim.

    Args:
        delta: the paired bootstrap delta of a run vs the baseline, ROUGE points (`delta`, `low`, `high`).
        baseline_mean: the baseline's mean ROUGE-L; the claim is `baseline_mean * 3.2 / 100` points.

    Reproduced: a significant gain (CI above 0) at least as large as claimed. Not reproduced: the whole CI
    lies below the claimed gain. Inconclusive: the CI holds the claimed gain and 0, or a significant gain
    smaller than the claim whose CI still reaches it.
    """
    claim = baseline_mean * ROUGE_L_CLAIM_PERCENT / 100
    if delta["low"] > 0 and delta["delta"] >= claim:
        return "reproduced"
    if delta["high"] < claim:
        return "not reproduced"
    return "inconclusive"


def round_speedups(run: dict, baseline: dict) -> list[float]:
    """Baseline seconds per summary / run seconds per summary, per interleaved round (> 1: run faster)."""
    pairs = zip(run["speed"]["rounds"], baseline["speed"]["rounds"], strict=True)
    return [b["seconds_per_summary"] / r["seconds_per_summary"] for r, b in pairs]


def speed_verdict(speedups: list[float]) -> str:
    """`reproduced` if every round is >= 1.18x faster, `not reproduced` if none is, else `inconclusive`."""
    if min(speedups) >= SPEEDUP_CLAIM:
        return "reproduced"
    if max(speedups) < SPEEDUP_CLAIM:
        return "not reproduced"
    return "inconclusive"
