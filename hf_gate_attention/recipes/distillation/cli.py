"""Command line of the distillation recipe: `hf-gate-attention recipe distillation --config FILE
[KEY=VALUE ...]`."""

from __future__ import annotations

import sys

from ..common.reports import tables_main
from ..common.runner import recipe_main
from .compare import run_distillation, write_tables
from .config import DistillationConfig

PROG = "hf-gate-attention recipe distillation"


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, comparison.json, <run>/metrics.json)")
    print(f"Plots:   {run_dir}/loss_curves.png, {run_dir}/rouge.png, {run_dir}/speed.png")
    print(f"Verdicts: hf-gate-attention recipe distillation report {run_dir}")


def main(argv: list[str] | None = None, prog: str = PROG, epilog: str = "") -> int:
    """Run (or continue) a distillation comparison; returns the exit status (2 for bad input, one line)."""
    return recipe_main(
        argv,
        prog=prog,
        description="Distill a gated summarization model (the teacher) into a smaller gated student: "
        "students trained alone, with logit KD and with logit + gate matching on the same data and budget; "
        "writes <output_dir>/<name>/ with comparison tables and plots. Config keys: see DistillationConfig.",
        config_class=DistillationConfig,
        run=run_distillation,
        report=_report,
        epilog=epilog,
    )


def tables(argv: list[str] | None = None, prog: str = f"{PROG} tables") -> int:
    """`comparison.md` and `comparison.csv` of a results folder rewritten from its `comparison.json` by the
    run's own writer (`compare.write_tables`), without training or timing again."""
    return tables_main(argv, prog, "distillation", DistillationConfig, write_tables)


if __name__ == "__main__":
    sys.exit(main())
