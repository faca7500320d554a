"""The data and evaluation keys of every recipe that generates summaries (summarization, distillation)."""

from __future__ import annotations

from dataclasses import dataclass

from .data import DEFAULT_INSTRUCTION, TRUNCATION_STRATEGIES


@dataclass
class SummaryKeys:
    """The data and evaluation keys every summary-generating recipe's config has, checked by
    `check_summary_keys`.

    Data:
        dataset (`str`): `"aclsum"` (offline), a Hub dataset id, a local file or folder
            (see `load_summarization_dataset`).
        document_column, summary_column (`str`, *optional*): source columns, when not known for `dataset`.
        max_train_examples, max_validation_examples, max_test_examples (`int`, *optional*): keep the first N.
        doc_token_budget (`int`): tokens of the whole prompt (template + instruction + truncated document).
        truncation (`str`): `"head"` or `"head_tail"` (see `truncate_document`).
        max_summary_tokens (`int`): reference summary tokens kept as training target.
        instruction (`str`): the instruction before the document.

    Evaluation:
        max_new_tokens (`int`): length limit of the greedy summaries.
        generation_batch_size (`int`): prompts per `generate` call (left padding).
        n_bootstrap (`int`): bootstrap resamples of the ROUGE confidence intervals.
        confidence (`float`): level of the ROUGE confidence intervals, in (0, 1).
        speed_examples (`int`): test prompts timed one by one.
        speed_rounds (`int`): interleaved timing rounds over the models (ratios are taken per round).
        speed_new_tokens (`int`): tokens decoded per timed summary.
    """

    # data
    dataset: str = "aclsum"
    document_column: str | None = None
    summary_column: str | None = None
    max_train_examples: int | None = None
    max_validation_examples: int | None = None
    max_test_examples: int | None = None
    doc_token_budget: int = 512
    truncation: str = "head"
    max_summary_tokens: int = 256
    instruction: str = DEFAULT_INSTRUCTION
    # evaluation
    max_new_tokens: int = 128
    generation_batch_size: int = 4
    n_bootstrap: int = 1000
    confidence: float = 0.95
    speed_examples: int = 4
    speed_rounds: int = 3
    speed_new_tokens: int = 64


def check_summary_keys(config) -> None:
    """The checks of the keys every summary-generating recipe's config has (prompt truncation and budgets,
    evaluation); `ValueError` naming the key and what is accepted."""
    if config.truncation not in TRUNCATION_STRATEGIES:
        raise ValueError(
            f"truncation={config.truncation!r} is not valid; accepted: {', '.join(TRUNCATION_STRATEGIES)}"
        )
    if not 0 < config.confidence < 1:
        raise ValueError(f"confidence={config.confidence} must be in (0, 1)")
    positive = ("doc_token_budget", "max_summary_tokens", "max_new_tokens", "generation_batch_size")
    positive += ("n_bootstrap", "speed_examples", "speed_rounds")  # training keys: check_training_keys
    for key, minimum in [(key, 1) for key in positive] + [("speed_new_tokens", 2)]:
        if getattr(config, key) < minimum:
            raise ValueError(f"{key}={getattr(config, key)} must be >= {minimum}")
