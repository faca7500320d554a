"""Model cards for gated checkpoints: the README.md pushed with a model.

    from hf_gate_attention.sharing.card import write_model_card

    write_model_card("results/demo/output-headwise/model", results="results/demo", repo_id="me/smollm2-gated")

The card is rendered from the checkpoint folder (gate config, parameter counts from the safetensors headers)
and, when given, a recipe's results folder, which the recipe describes (`results.RecipeResults`: training
setup, evaluation, limitations, metadata; the recipes register their describers, the card knows none).
Every number comes from those files. The template is `templates/gated_model_card.md` (`string.Template`:
`${name}` fields, `$$` for a literal dollar); `inputs` reads the folders, `metadata` and `sections` render
the parts.
"""

from __future__ import annotations

import string
from importlib import resources
from pathlib import Path

from huggingface_hub import ModelCard

from ...files import atomic_write_text
from .inputs import read_checkpoint, read_results
from .metadata import base_model_id, card_metadata, is_hub_id, license_of
from .results import RecipeResults, describe_results, register_results_describer
from .sections import (
    NO_RESULTS,
    evaluation_section,
    gate_section,
    gate_summary,
    limitations,
    serving_section,
    training_section,
    usage_without,
)

__all__ = [
    "NO_RESULTS",
    "TEMPLATE",
    "RecipeResults",
    "read_checkpoint",
    "read_results",
    "register_results_describer",
    "render_model_card",
    "write_model_card",
]

TEMPLATE = ("templates", "gated_model_card.md")
PACKAGE_URL = "https://github.com/hf-gate-attention/hf-gate-attention"


def _default_name(folder: Path) -> str:
    folder = folder.resolve()
    return folder.parent.name if folder.name == "model" else folder.name  # the recipe's <run>/model


def _recipe_results_of(folder: Path) -> tuple[Path | None, str | None]:
    """`(results folder, run)` when `folder` is a recipe's `<results>/<run>/model` (the run's `metrics.json`
    beside it, the comparison one folder up), else `(None, None)`."""
    run_dir = folder.resolve().parent
    recipe_written = (run_dir / "metrics.json").is_file() and (run_dir.parent / "comparison.json").is_file()
    return (
        (run_dir.parent, run_dir.name)
        if folder.resolve().name == "model" and recipe_written
        else (None, None)
    )


def render_model_card(
    folder, *, results=None, run=None, base_model=None, datasets=None, repo_id=None
) -> ModelCard:
    """The model card (README.md) of a gated checkpoint folder written by `save_pretrained`.

    Args:
        folder: checkpoint folder; its config.json must hold a `gate_attention` entry.
        results (*optional*): results folder of a recipe (`comparison.json`, `<run>/metrics.json`) this
            checkpoint was evaluated in, described by its recipe (registered on `import
            hf_gate_attention.recipes`). Defaults to the recipe's results folder when `folder` is a recipe's
            `<results>/<run>/model`; otherwise the card says that no results were recorded.
        run (*optional*): the run of `results` this checkpoint is; defaults to the run `folder` is in (for a
            recipe's `<run>/model`) or the single gated run with the checkpoint's gate config.
        base_model, datasets (*optional*): Hub ids for the metadata; by default the recipe's model (or
            `_name_or_path`) when it is a Hub id, and no datasets.
        repo_id (*optional*): the Hub repo shown in the usage code; defaults to the folder's name.
    """
    folder = Path(folder)
    if results is None:
        results, recipe_run = _recipe_results_of(folder)
        if results is None and run is not None:
            raise ValueError(
                f"run={run!r} names a run of a recipe's results folder: pass results= too (--results)"
            )
        run = run or recipe_run
    ckpt = read_checkpoint(folder)
    res = None if results is None else describe_results(read_results(results, ckpt["gate"], run), ckpt)
    model = res and res.model
    repo_id = repo_id or _default_name(folder)
    base_model = base_model or base_model_id(ckpt["config"], model)
    datasets = [datasets] if isinstance(datasets, str) else list(datasets or [])
    if not datasets and res and is_hub_id(res.dataset):
        datasets = [res.dataset]
    name = repo_id.split("/")[-1]
    metadata = card_metadata(ckpt, res, base_model, datasets, name, license_of(folder, model))
    gate = ckpt["gate"]
    what = f"`{base_model}`" if base_model else f"A `{ckpt['config'].get('model_type')}` model"
    summary = (
        f"{what} with **gated attention** added by [hf-gate-attention]({PACKAGE_URL}): {gate_summary(gate)}."
    )
    if res is not None:
        summary += f" {res.summary}"
    template = resources.files(__package__).joinpath(*TEMPLATE).read_text(encoding="utf-8")
    text = string.Template(template).substitute(
        metadata=metadata.to_yaml(),
        title=name,
        summary=summary,
        gate_section=gate_section(ckpt),
        training_section=training_section(res),
        evaluation_section=evaluation_section(res),
        repo_id=repo_id,
        usage_without=usage_without(ckpt, repo_id),
        serving_section=serving_section(ckpt, repo_id),
        limitations=limitations(ckpt, res),
    )
    return ModelCard(text)


def write_model_card(folder, **kwargs) -> Path:
    """Render the card (same arguments as `render_model_card`) and write `<folder>/README.md` atomically
    (temporary file in the folder, then `os.replace`); returns its path."""
    path = Path(folder) / "README.md"
    atomic_write_text(path, str(render_model_card(folder, **kwargs)))
    return path
