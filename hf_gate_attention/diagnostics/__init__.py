"""Diagnostics: attention sinks, massive activations and gate statistics (`diagnose`), their report (JSON,
PNG heatmaps, a table) and a Trainer callback that logs them during training."""

from .callback import DiagnosticsCallback
from .inputs import read_texts
from .measure import attention_probabilities, diagnose, image_inputs, summarize, text_inputs

__all__ = [
    "DiagnosticsCallback",
    "attention_probabilities",
    "diagnose",
    "image_inputs",
    "read_texts",
    "summarize",
    "text_inputs",
]
