"""What the video QA recipe measures, as functions of answers, gate values and attention maps (tested on
hand-built inputs whose answers are known), and the verdict with its rule.

- accuracy: exact match of the greedy answer with the reference (normalised words), in %, per question.
- fusion ratio of a question: on the queries that emit its answer tokens, the cross-attention gate mean over
  heads and those queries divided by that mean plus the self-attention gate's, per layer, and overall (the
  layer means pooled: `sum(cross) / (sum(cross) + sum(self))`). Above 0.5: the gate lets the frames through
  more than the text; it scales a head's output per token, it cannot move weight between frames in a head.
- frames' attention share: on the same queries, the share of cross-attention weight on the keys of the
  objects the question names (their patches in every frame that shows them), heads weighted by their gates.
"""

from __future__ import annotations

import numpy as np
import torch

from ..common.attention_maps import object_keys, object_share, patch_coverage
from ..common.speed import SpeedColumn

SPEED_COLUMNS = (SpeedColumn("answers_per_s", "throughput", "answers/s", "throughput ratio"),)
VERDICT_RULE = (
    "reproduced if, for the run gated on cross- and self-attention, the fusion ratio on frame-only questions "
    "minus text-only questions has its 95 % bootstrap CI above 0 AND its accuracy minus the baseline's "
    "(paired over test questions) is not worse: that CI does not lie below 0 (its high end >= 0); not "
    "reproduced if the ratio difference's CI lies at or below 0; inconclusive otherwise"
)


def exact_match(prediction: str, reference: str) -> float:
    """100.0 when the answers are the same words, else 0.0."""
    return 100.0 * (prediction.split() == reference.split())


def fusion_ratio(cross: np.ndarray, self_: np.ndarray) -> tuple[np.ndarray, float]:
    """`(per-layer ratio (layers,), overall ratio)` of mean gate values `cross` and `self_`, `(layers,)`."""
    cross, self_ = np.asarray(cross, dtype=float), np.asarray(self_, dtype=float)
    if cross.shape != self_.shape:
        raise ValueError(f"cross {cross.shape} and self {self_.shape} gates need one value per layer each")
    total = cross + self_
    per_layer = np.divide(cross, total, out=np.full_like(cross, np.nan), where=total > 0)
    overall = cross.sum() / total.sum() if total.sum() > 0 else float("nan")
    return per_layer, float(overall)


def clip_object_keys(
    masks: list[np.ndarray], image_size: int, grid: int, prefix: int, threshold: float
) -> torch.Tensor:
    """Boolean `(frames * (prefix + grid * grid),)`: the keys of the named objects' patches in every frame
    that shows one (`masks`: `(frames, H, W)` per object); a frame where an object is absent adds none."""
    frames = masks[0].shape[0]
    keys = torch.zeros(frames, prefix + grid * grid, dtype=torch.bool)
    for mask in masks:
        for f in range(frames):
            if mask[f].any():
                keys[f] |= object_keys(patch_coverage(mask[f], image_size, grid), threshold, prefix)
    return keys.reshape(-1)


def answer_share(weights: torch.Tensor, keys: torch.Tensor, gates: torch.Tensor | None) -> float:
    """Mean over the answer queries of `object_share` (gate-weighted heads).

    Args:
        weights: `(layers, heads, steps, keys)` cross-attention weights of the answer queries.
        keys: `(keys,)` bool, the named objects' keys (`clip_object_keys`).
        gates: `(layers, steps, heads)` cross-attention gates of those queries, or `None`.
    """
    shares = [
        object_share(weights[:, :, s], keys, None if gates is None else gates[:, s])[0]
        for s in range(weights.shape[2])
    ]
    return float(np.mean(shares))


def verdict(ratio_difference: dict | None, accuracy_delta: dict | None) -> dict:
    """The article's claim for one run gated on both cross- and self-attention, by `VERDICT_RULE`, with
    both halves reported apart."""
    if ratio_difference is None or accuracy_delta is None:
        return {"verdict": "inconclusive", "why": "not measurable (no frame-only or text-only questions)"}
    ratio_up = ratio_difference["low"] > 0
    not_worse = accuracy_delta["high"] >= 0
    halves = {"ratio_frames_above_text": ratio_up, "accuracy_not_worse": not_worse}
    if ratio_up and not_worse:
        return {
            "verdict": "reproduced",
            "why": "ratio difference CI > 0, accuracy delta CI not below 0",
        } | halves
    if ratio_difference["high"] <= 0:
        return {"verdict": "not reproduced", "why": "ratio difference CI lies at or below 0"} | halves
    why = "ratio difference CI contains 0" if not ratio_up else "accuracy delta CI lies below 0"
    return {"verdict": "inconclusive", "why": why} | halves
