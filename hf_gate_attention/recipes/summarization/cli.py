"""Command line of the summarization recipe: `hf-gate-attention recipe summarization --config FILE
[KEY=VALUE ...]` (also `hf-gate-summarize`). Runs unchanged under `torchrun` and `accelerate launch`."""

from __future__ import annotations

import sys

from ..common.reports import report_main, tables_main
from ..common.runner import recipe_main
from .compare import run_comparison, write_tables
from .config import RecipeConfig
from .reproduction import reproduction_report

PROG = "hf-gate-attention recipe summarization"


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, <run>/metrics.json)")
    print(f"Plots:   {run_dir}/loss_curves.png, {run_dir}/rouge.png, {run_dir}/speed.png")


def main(argv: list[str] | None = None, prog: str = PROG, epilog: str = "") -> int:
    """Run a comparison; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=prog,
        description="Fine-tune and compare an ungated baseline and gated-attention variants on long-document "
        "summarization; writes <output_dir>/<name>/ with metrics, comparison tables and plots.",
        config_class=RecipeConfig,
        run=run_comparison,
        report=_report,
        epilog=epilog,
    )


def reproduction_main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """`REPRODUCTION.md` (the verdicts on the article's claims) from a comparison's results folder."""
    return report_main(
        argv,
        "hf_gate_attention.recipes.summarization.reproduction",
        reproduction_report,
        "results/REPRODUCTION.md",
        prog,
    )


def tables(argv: list[str] | None = None, prog: str = f"{PROG} tables") -> int:
    """`comparison.md` and `comparison.csv` of a results folder rewritten from its `comparison.json` by the
    run's own writer (`compare.write_tables`), without training or timing again."""
    return tables_main(argv, prog, "summarization", RecipeConfig, write_tables)


if __name__ == "__main__":
    sys.exit(main())
