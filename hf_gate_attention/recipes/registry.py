"""Every recipe and its actions, in one place: what `hf-gate-attention recipe NAME [ACTION] ...` runs, and
how a model card describes a recipe's results.

A recipe's run and each action are named `module:function` and imported only when called; the function takes
`(argv, prog=...)` (the run also `epilog=...`, appended to its `--help`) and returns the exit status. A
recipe's `card` describer, `(results, checkpoint) -> RecipeResults | None`, is registered with the model card
when this module is imported (by `hf_gate_attention.recipes`).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from ..sharing.card.results import RecipeResults, register_results_describer

PACKAGE = "hf_gate_attention.recipes"


@dataclass(frozen=True)
class Action:
    """A command of a recipe besides its run: a report written from a results folder, a data step, ..."""

    name: str
    target: str  # module:function, the module relative to `PACKAGE`
    help: str


@dataclass(frozen=True)
class Recipe:
    """A recipe: its name on the command line, a line of help, its run, its actions, its card describer."""

    name: str
    help: str
    run: str  # module:function of the run
    actions: tuple[Action, ...] = ()
    card: str | None = None  # module:function describing its results in a model card

    def action(self, name: str) -> Action | None:
        return next((action for action in self.actions if action.name == name), None)


RECIPES = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            "summarization",
            "fine-tune and compare ungated and gated causal LMs on long-document summarization",
            "summarization.cli:main",
            (
                Action(
                    "reproduction",
                    "summarization.cli:reproduction_main",
                    "write REPRODUCTION.md (verdicts on the article's claims) from a results folder",
                ),
                Action(
                    "diagnosis",
                    "summarization.diagnosis:main",
                    "attention sink, massive activations and gates of a comparison's models (DIAGNOSTICS.md)",
                ),
                Action(
                    "recreate",
                    "summarization.recreate:main",
                    "retrain the runs whose final weights are missing (checked against the saved loss curve)",
                ),
                Action(
                    "lengths",
                    "summarization.lengths:main",
                    "ROUGE-L of the trained runs on the test documents cut to longer lengths (lengths.md)",
                ),
                Action(
                    "tables",
                    "summarization.cli:tables",
                    "rewrite comparison.md/.csv from a results folder's comparison.json (no retraining)",
                ),
            ),
            card="summarization.card:describe",
        ),
        Recipe(
            "classification",
            "fine-tune and compare ungated and gated text (BERT) or image (ViT) classifiers",
            "classification.cli:main",
            (
                Action(
                    "tables",
                    "classification.cli:tables",
                    "rewrite comparison.md/.csv from a results folder's comparison.json (no retraining)",
                ),
            ),
        ),
        Recipe(
            "captioning",
            "train and compare captioners (frozen ViT encoder, decoder with cross-attention), ungated and "
            "gated: caption quality, attention on the named objects, gates by word",
            "captioning.cli:main",
        ),
        Recipe(
            "video_qa",
            "train and compare video question answerers (frozen ViT per frame, decoder reading passage and "
            "question by self-attention, frames by cross-attention), ungated and gated: accuracy, fusion "
            "ratio and attention by question kind",
            "video_qa.cli:main",
        ),
        Recipe(
            "distillation",
            "distill a gated summarization model into a smaller student (logit KD, gate matching)",
            "distillation.cli:main",
            (
                Action(
                    "report",
                    "distillation.report:main",
                    "write DISTILLATION.md (verdicts per question) from a results folder",
                ),
                Action(
                    "tables",
                    "distillation.cli:tables",
                    "rewrite comparison.md/.csv from a results folder's comparison.json (no retraining)",
                ),
            ),
        ),
        Recipe(
            "pretraining",
            "train small Llama-style models from scratch, ungated and gated (sinks, activations, loss)",
            "pretraining.cli:main",
            (
                Action("report", "pretraining.report:main", "write STUDY.md from a study folder"),
                Action(
                    "corpus",
                    "pretraining.corpus:main",
                    "build the offline corpus, or export a dataset's text column as a corpus folder",
                ),
            ),
        ),
    )
}


def _function(target: str):
    module, function = target.split(":")
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), function)


def actions_help(recipe: Recipe, prog: str) -> str:
    """The lines of `--help` that list a recipe's actions."""
    if not recipe.actions:
        return ""
    lines = [f"actions ({prog} ACTION --help):"]
    return "\n".join(lines + [f"  {action.name:<13} {action.help}" for action in recipe.actions])


def run_recipe(name: str, argv: list[str], prog: str) -> int:
    """Run recipe `name` with `argv` (`--config FILE [KEY=VALUE ...]`), or its action when `argv` starts
    with an action's name; returns the exit status."""
    recipe = RECIPES[name]
    action = recipe.action(argv[0]) if argv else None
    if action is not None:
        return _function(action.target)(argv[1:], prog=f"{prog} {action.name}")
    if argv and not argv[0].startswith("-") and "=" not in argv[0]:
        actions = ", ".join(action.name for action in recipe.actions) or "none"
        print(
            f"{prog}: error: {argv[0]!r} is not an action of this recipe (its actions: {actions}); its run "
            "takes --config FILE and KEY=VALUE or --key value overrides",
            file=sys.stderr,
        )
        return 2
    return _function(recipe.run)(argv, prog=prog, epilog=actions_help(recipe, prog))


def describe_results(res: dict, ckpt: dict) -> RecipeResults | None:
    """A model card's description of a results folder, by the first recipe whose `card` describer knows it."""
    for recipe in RECIPES.values():
        found = recipe.card and _function(recipe.card)(res, ckpt)
        if found:
            return found
    return None


register_results_describer(describe_results)
