"""Command line of the classification recipe: `python -m recipes.classification --config FILE [--key value]`
(also `python -m hf_gate_attention.recipes.classification`)."""

from __future__ import annotations

import sys

from ..summarization.cli import recipe_main
from .compare import run_classification
from .config import ClassificationConfig

PROG = "python -m recipes.classification"


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, comparison.json, <run>/metrics.json)")
    print(f"Plots:   {run_dir}/loss_curves.png, {run_dir}/quality.png, {run_dir}/speed.png")


def main(argv: list[str] | None = None) -> int:
    """Run (or continue) a comparison; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=PROG,
        description="Fine-tune and compare an ungated baseline and gated-attention variants on text (BERT "
        "family) or image (ViT family) classification; writes <output_dir>/<name>/ with comparison tables "
        "and plots. Config keys: see ClassificationConfig.",
        config_class=ClassificationConfig,
        run=run_classification,
        report=_report,
    )


if __name__ == "__main__":
    sys.exit(main())
