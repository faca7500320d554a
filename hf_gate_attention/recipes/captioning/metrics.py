"""What the captioning recipe measures, as functions of captions and of attention maps (tested on hand-built
maps whose answers are known).

Caption quality, per test caption: exact match, the accuracy of each attribute of the shapes template
(colour and shape of both objects, their relative position), ROUGE-L (the project's offline ROUGE).

Where attention falls, per decoding step (the query that emits a word; cross-attention weights
`(layers, heads, keys)` after the softmax, keys = the encoder's prefix tokens (CLS) then its patch grid):

- object-attention share of a step that emits a word naming an object: the weight on that object's patches,
  averaged over heads weighting each head by its gate value at that step (ungated: plain mean), then over
  layers; also without the gate weighting (the plain mean over heads), and the share uniform attention
  would give (the object's keys / all keys).
- sink share of a step: per head, the weight on the most-attended key outside every object (the prefix
  tokens count as outside), averaged over heads and layers.
- gate value of a step: the cross-attention gate averaged over heads and layers, grouped by the class of the
  emitted word (`word_class`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..common.speed import SpeedColumn
from .data import COLOURS, RELATIONS, SHAPES, parse_shapes_caption

# the word classes of the gate comparison: "visual" (colours and shapes), "function" (articles,
# prepositions), "relation" (where), "other", and "end" (the step that emits the end token)
COLOUR_WORDS = frozenset({*COLOURS, "white", "black", "grey", "gray", "brown", "pink", "gold", "silver"})
SHAPE_WORDS = frozenset({*SHAPES, "rectangle", "star", "diamond", "oval", "cross", "heart", "ring"})
RELATION_WORDS = frozenset(
    {*(w for r in RELATIONS for w in r.split() if w != "of"), "under", "over", "beside"}
)
FUNCTION_WORDS = frozenset(
    {"a", "an", "the", "of", "in", "on", "at", "to", "and", "with", "is", "are", "by", "for", "from"}
    | {"into", "onto", "this", "that", "these", "those", "it", "its"}
)
WORD_CLASSES = ("visual", "function", "relation", "other", "end")
ATTRIBUTES = ("colour", "shape", "position")
ATTENTION_METRICS = ("share_weighted", "share_plain", "sink")
SPEED_COLUMNS = (SpeedColumn("captions_per_s", "throughput", "captions/s", "throughput ratio"),)
QUALITY_METRICS = ("exact_match", "colour", "shape", "position", "rougeL")
QUALITY_LABELS = {
    "exact_match": "exact match",
    "colour": "colour acc.",
    "shape": "shape acc.",
    "position": "position acc.",
    "rougeL": "ROUGE-L",
}


def word_class(word: str) -> str:
    """`"visual"`, `"function"`, `"relation"` or `"other"` (see `WORD_CLASSES`)."""
    if word in COLOUR_WORDS or word in SHAPE_WORDS:
        return "visual"
    if word in FUNCTION_WORDS:
        return "function"
    return "relation" if word in RELATION_WORDS else "other"


# ------------------------------------------------------------------------------------ caption quality


def attribute_scores(prediction: str, reference: str) -> dict[str, float] | None:
    """Per attribute, the share of its slots the prediction gets right (colour: both objects' colours,
    shape: both shapes, position: the relation), in %; a prediction off the template scores 0; `None` when
    the reference is not in the shapes template."""
    ref = parse_shapes_caption(reference)
    if ref is None:
        return None
    pred = parse_shapes_caption(prediction)
    if pred is None:
        return dict.fromkeys(ATTRIBUTES, 0.0)
    return {
        "colour": 50.0 * sum(a == b for a, b in zip(pred["colour"], ref["colour"], strict=True)),
        "shape": 50.0 * sum(a == b for a, b in zip(pred["shape"], ref["shape"], strict=True)),
        "position": 100.0 * (pred["position"] == ref["position"]),
    }


def caption_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, np.ndarray]:
    """Per-caption scores in %, `{metric: (n,)}`: `exact_match`, `rougeL`, and `colour`, `shape`,
    `position` when every reference is in the shapes template."""
    from ..common.summaries.rouge import per_example_rouge

    if len(predictions) != len(references) or not references:
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    scores = {
        "exact_match": np.array(
            [
                100.0 * (" ".join(p.split()) == " ".join(r.split()))
                for p, r in zip(predictions, references, strict=True)
            ]
        ),
        "rougeL": per_example_rouge(predictions, references, use_stemmer=False)["rougeL"],
    }
    attributes = [attribute_scores(p, r) for p, r in zip(predictions, references, strict=True)]
    if all(a is not None for a in attributes):
        scores |= {name: np.array([a[name] for a in attributes]) for name in ATTRIBUTES}
    return {name: scores[name] for name in QUALITY_METRICS if name in scores}


# ------------------------------------------------------------------------------------ attention maps


def sink_share(weights: torch.Tensor, outside: torch.Tensor) -> float:
    """Per head, the weight on the most-attended key outside every object (`outside`: `(keys,)` bool),
    averaged over heads and layers (`weights: (layers, heads, keys)`); 0 without such a key."""
    if not outside.any():
        return 0.0
    return weights[..., outside].max(-1).values.double().mean().item()


# ------------------------------------------------------------------------------------ the verdict


def verdict(share_delta: dict | None, gate_contrast: dict | None) -> dict:
    """The article's claim for one gated run, by the rule of `VERDICT_RULE`."""
    if share_delta is None or gate_contrast is None:
        return {
            "verdict": "inconclusive",
            "why": "not measurable here (no object masks, or no visual/function words)",
        }
    if share_delta["low"] > 0 and gate_contrast["low"] > 0:
        return {"verdict": "reproduced", "why": "share delta CI > 0 and gate visual - function CI > 0"}
    if share_delta["high"] <= 0 or gate_contrast["high"] <= 0:
        which = "share delta" if share_delta["high"] <= 0 else "gate visual - function"
        return {"verdict": "not reproduced", "why": f"{which} CI lies at or below 0"}
    return {"verdict": "inconclusive", "why": "a CI contains 0"}


VERDICT_RULE = (
    "reproduced if, for the gated run, the object-attention share (gate-weighted) minus the baseline's has "
    "its 95 % paired-bootstrap CI above 0 AND the gate on the steps emitting visual words (colours, shapes) "
    "minus the gate on the steps emitting function words (a, of) has its CI above 0; not reproduced if "
    "either CI lies at or below 0; inconclusive otherwise"
)
