"""The card's YAML metadata: base model, license, datasets, pipeline tag, tags, model-index results."""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import EvalResult, ModelCardData, metadata_load

from ...known_models import HUB_ALIASES
from .results import RecipeResults

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_PIPELINES = {
    "ForCausalLM": "text-generation",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
    "ForImageClassification": "image-classification",
}


def is_hub_id(name) -> bool:
    return isinstance(name, str) and bool(_HUB_ID.match(name)) and not Path(name).exists()


def base_model_id(config: dict, model: str | None) -> str | None:
    """The Hub id the checkpoint derives from: the model the recipe trained (offline copies map to their Hub
    id), else `_name_or_path` when it looks like a Hub id."""
    hub_ids = {short: hub for hub, short in HUB_ALIASES.items()}
    if model in hub_ids:
        return hub_ids[model]
    for name in (model, config.get("_name_or_path")):
        if is_hub_id(name):
            return name
    return None


def license_of(folder: Path, model: str | None) -> str | None:
    """A license stated in the folder's existing README.md, or in a local base model folder's README.md."""
    for candidate in (folder, Path(model or folder)):
        readme = candidate / "README.md"
        if candidate.is_dir() and readme.is_file():
            found = (metadata_load(readme) or {}).get("license")
            if found:
                return found
    return None


def _dataset_id(name: str) -> str:
    return name if is_hub_id(name) else Path(name).name


def architecture_suffix(config: dict) -> str:
    match = re.search(r"For\w+$", (config.get("architectures") or [""])[0])
    return match.group(0) if match else ""


def card_metadata(
    ckpt: dict, res: RecipeResults | None, base_model, datasets, model_name: str, license_id
) -> ModelCardData:
    gate, config = ckpt["gate"], ckpt["config"]
    tags = ["gated-attention", "hf-gate-attention", f"{gate.variant}-gate", config.get("model_type")]
    eval_results = None
    if res is not None:
        tags += res.tags
        dataset = datasets[0] if datasets else _dataset_id(res.dataset)
        eval_results = [
            EvalResult(
                task_type=res.task_type,
                task_name=res.task_name,
                dataset_type=dataset,
                dataset_name=res.dataset_names.get(dataset, dataset),
                dataset_split="test",
                metric_type=metric_type,
                metric_name=metric_name,
                metric_value=value,
            )
            for metric_type, metric_name, value in res.scores
        ]
    return ModelCardData(
        base_model=base_model,
        datasets=datasets or None,
        library_name="transformers",
        license=license_id,
        metrics=(res.metrics or None) if res is not None else None,
        pipeline_tag=_PIPELINES.get(architecture_suffix(config)),
        tags=[tag for tag in tags if tag],
        model_name=model_name if eval_results else None,
        eval_results=eval_results,
    )
