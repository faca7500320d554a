"""What a recipe's results say about a checkpoint, in the card's own terms: the recipe describes its results
(`RecipeResults`), the card renders that description as given, so that it knows no recipe.

The recipes register their describer (`register_results_describer`; `hf_gate_attention.recipes` does on
import); `describe_results` asks each in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RecipeResults:
    """A recipe's description of one checkpoint's results: Markdown sections and card metadata.

    Args:
        summary: a sentence added to the card's summary (what the model was trained for).
        training, evaluation: the Markdown of the card's Training and Evaluation sections.
        limitations: items put first in the card's Limitations list (without the leading `- `).
        model, dataset: the base model and the training data the recipe used (Hub ids, offline names or
            local paths), for the metadata's `base_model`, `datasets` and license.
        task_type, task_name: the metadata's model-index task (e.g. `summarization`, `Summarization`).
        scores: `(metric type, metric name, value)` of the test split, for the model-index.
        metrics, tags: added to the metadata.
        dataset_names: display names of datasets in the model-index, by id (`{"aclsum": "ACLSum"}`).
    """

    summary: str
    training: str
    evaluation: str
    limitations: list[str]
    model: str | None
    dataset: str | None
    task_type: str
    task_name: str
    scores: list[tuple[str, str, float]]
    metrics: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    dataset_names: dict[str, str] = field(default_factory=dict)


# (results, checkpoint) -> RecipeResults, or None when the results are not the describer's recipe's
Describer = Callable[[dict, dict], "RecipeResults | None"]
_DESCRIBERS: list[Describer] = []


def register_results_describer(describe: Describer) -> None:
    """Let `describe(res, ckpt)` describe results folders (`res`: `inputs.read_results`; `ckpt`:
    `inputs.read_checkpoint`); it returns `None` for another recipe's results."""
    if describe not in _DESCRIBERS:
        _DESCRIBERS.append(describe)


def describe_results(res: dict, ckpt: dict) -> RecipeResults:
    """The description of `res` by the first registered describer that knows it; `ValueError` otherwise."""
    for describe in _DESCRIBERS:
        found = describe(res, ckpt)
        if found is not None:
            return found
    known = (
        "none is registered: `import hf_gate_attention.recipes` registers the recipes'"
        if not _DESCRIBERS
        else ("the registered ones do not know it")
    )
    raise ValueError(f"no recipe describes the results folder {res['name']!r} in a card ({known})")
