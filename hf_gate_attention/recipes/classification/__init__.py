"""Encoder classification recipe: BERT-family text and ViT-family image classifiers, ungated and gated,
fine-tuned with the Trainer on the same data and budget and compared on accuracy and macro-F1 (bootstrap CIs,
paired deltas) and inference throughput (`run_classification`, `hf-gate-attention recipe classification`)."""

from .compare import run_classification
from .config import ClassificationConfig
from .data import ClassificationData, load_classification_dataset
from .metrics import accuracy, bootstrap_metric, macro_f1, paired_bootstrap_metric_delta

__all__ = [
    "ClassificationConfig",
    "ClassificationData",
    "accuracy",
    "bootstrap_metric",
    "load_classification_dataset",
    "macro_f1",
    "paired_bootstrap_metric_delta",
    "run_classification",
]
