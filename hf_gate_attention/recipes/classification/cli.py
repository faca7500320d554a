"""Command line of the classification recipe: `hf-gate-attention recipe classification --config FILE
[KEY=VALUE ...]`."""

from __future__ import annotations

import sys

from ..common.reports import tables_main
from ..common.runner import recipe_main
from .compare import run_classification, write_tables
from .config import ClassificationConfig

PROG = "hf-gate-attention recipe classification"


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, comparison.json, <run>/metrics.json)")
    print(f"Plots:   {run_dir}/loss_curves.png, {run_dir}/quality.png, {run_dir}/speed.png")


def main(argv: list[str] | None = None, prog: str = PROG, epilog: str = "") -> int:
    """Run (or continue) a comparison; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=prog,
        description="Fine-tune and compare an ungated baseline and gated-attention variants on text (BERT "
        "family) or image (ViT family) classification; writes <output_dir>/<name>/ with comparison tables "
        "and plots. Config keys: see ClassificationConfig.",
        config_class=ClassificationConfig,
        run=run_classification,
        report=_report,
        epilog=epilog,
    )


def tables(argv: list[str] | None = None, prog: str = f"{PROG} tables") -> int:
    """`comparison.md` and `comparison.csv` of a results folder rewritten from its `comparison.json` by the
    run's own writer (`compare.write_tables`), without training or timing again."""
    return tables_main(argv, prog, "classification", ClassificationConfig, write_tables)


if __name__ == "__main__":
    sys.exit(main())
