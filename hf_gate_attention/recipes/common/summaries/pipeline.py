"""The steps of a summary-generating recipe (summarization, distillation): its data splits, the training
of every run on the tokenized splits, ROUGE of each model on the test split (kept per run), interleaved
timing."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import datasets
import torch

from ....files import atomic_write_json, atomic_write_text, read_json
from ..distributed import distributed_state
from ..training import is_trained
from .data import build_example, load_summarization_dataset
from .generation import evaluate_quality, generation_prompts, interleaved_speed, predictions_jsonl

logger = logging.getLogger(__name__)

QUALITY_FILE = "quality.json"
SPLIT_LIMITS = {
    "train": "max_train_examples",
    "validation": "max_validation_examples",
    "test": "max_test_examples",
}


def load_data(config) -> datasets.DatasetDict:
    """The splits the comparison needs (validation only with `eval_steps`), each cut to `max_*_examples`."""
    splits = ["train", "test"] if config.eval_steps is None else ["train", "validation", "test"]
    data = load_summarization_dataset(
        config.dataset, config.document_column, config.summary_column, splits=splits, seed=config.seed
    )
    for split in splits:
        limit = getattr(config, SPLIT_LIMITS[split])
        if limit is not None:
            data[split] = data[split].select(range(min(limit, len(data[split]))))
        if len(data[split]) == 0:
            raise ValueError(
                f"split {split!r} of {config.dataset!r} has no example with a non-empty document and summary"
            )
    return data


def training_features(split: datasets.Dataset, tokenizer, config) -> datasets.Dataset:
    """Tokenized training examples (`input_ids`, `attention_mask`, `labels`) of a document/summary split."""

    def encode(row):
        return build_example(
            tokenizer,
            row["document"],
            row["summary"],
            config.doc_token_budget,
            config.truncation,
            config.max_summary_tokens,
            config.instruction,
        )

    return split.map(encode, remove_columns=split.column_names, desc="Tokenizing")


def train_all(config, tokenizer, data, train_one: Callable) -> None:
    """Train every run of `config` not yet trained with the current budget (all processes): `train_one(run=,
    train_set=, validation_set=)` trains one run on the tokenized splits (`validation_set` may be `None`);
    the summarization recipe's is `train_run`, the distillation recipe's `train_student`."""
    state = distributed_state()
    train_set = training_features(data["train"], tokenizer, config)
    validation_set = (
        training_features(data["validation"], tokenizer, config) if "validation" in data else None
    )
    for run in config.runs:
        if config.resume and is_trained(config, run):
            logger.warning("Run %s: already trained, kept", run.name)
            continue
        if state.is_main_process:
            (config.run_dir / run.name / QUALITY_FILE).unlink(missing_ok=True)  # stale once retrained
        train_one(run=run, train_set=train_set, validation_set=validation_set)
        state.wait_for_everyone()
        gc.collect()


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate_all(
    config, names: list[str], load: Callable[[str], Any], tokenizer, test_set: datasets.Dataset
) -> dict[str, dict]:
    """ROUGE on the test split of each model `load(name)` of `names`, saved in `<name>/quality.json` (kept
    from an earlier invocation when still valid); shared by the recipes that generate summaries."""
    prompts = generation_prompts(test_set, tokenizer, config)
    references = list(test_set["summary"])
    ids = list(test_set["id"]) if "id" in test_set.column_names else list(range(len(test_set)))
    quality = {}
    for name in names:
        path = config.run_dir / name / QUALITY_FILE
        quality[name] = read_json(path)
        if quality[name] is None:
            model = load(name)
            quality[name] = evaluate_quality(model, tokenizer, prompts, references, config, name)
            del model
            _release_memory()
            atomic_write_text(
                path.with_name("predictions.jsonl"),
                predictions_jsonl(ids, quality[name]["predictions"], references),
            )
            atomic_write_json(path, quality[name])
    return quality


def measure_speed(
    config, names: list[str], load: Callable[[str], Any], tokenizer, test_set: datasets.Dataset
) -> dict[str, dict]:
    """Interleaved timing of the models `load(name)` of `names` on the first `speed_examples` test prompts."""
    prompts = generation_prompts(
        test_set.select(range(min(config.speed_examples, len(test_set)))), tokenizer, config
    )
    models = {name: load(name) for name in names}
    speed = interleaved_speed(models, prompts, config.speed_rounds, config.speed_new_tokens)
    del models
    _release_memory()
    return speed
