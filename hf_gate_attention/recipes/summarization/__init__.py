"""Long-document summarization recipe: data loading, prompt building, ROUGE with confidence intervals,
training, evaluation and the baseline-vs-gated comparison (`run_comparison`, command `hf-gate-summarize`)."""

from .compare import run_comparison
from .config import RecipeConfig, RunSpec, load_config
from .data import (
    DataCollatorForSummarization,
    build_example,
    build_prompt,
    load_summarization_dataset,
    truncate_document,
)
from .rouge import (
    ROUGE_METRIC_PATH,
    ROUGE_TYPES,
    bootstrap_ci,
    compute_rouge,
    load_rouge_metric,
    paired_bootstrap_delta,
    per_example_rouge,
)

__all__ = [
    "ROUGE_METRIC_PATH",
    "ROUGE_TYPES",
    "DataCollatorForSummarization",
    "RecipeConfig",
    "RunSpec",
    "bootstrap_ci",
    "build_example",
    "build_prompt",
    "compute_rouge",
    "load_config",
    "load_rouge_metric",
    "load_summarization_dataset",
    "paired_bootstrap_delta",
    "per_example_rouge",
    "run_comparison",
    "truncate_document",
]
