"""Long-document summarization recipe: the baseline-vs-gated comparison (`run_comparison`, command
`hf-gate-attention recipe summarization`), with the data loading, prompt building and ROUGE with confidence
intervals of `recipes.common.summaries` (re-exported here)."""

from ..common.config import RunSpec
from ..common.statistics import bootstrap_ci, paired_bootstrap_delta
from ..common.summaries.data import (
    DataCollatorForSummarization,
    build_example,
    build_prompt,
    load_summarization_dataset,
    truncate_document,
)
from ..common.summaries.rouge import (
    ROUGE_METRIC_PATH,
    ROUGE_TYPES,
    compute_rouge,
    load_rouge_metric,
    per_example_rouge,
)
from .compare import run_comparison
from .config import RecipeConfig, load_config

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
