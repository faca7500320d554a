"""Command line of the captioning recipe: `hf-gate-attention recipe captioning --config FILE [KEY=VALUE
...]`."""

from __future__ import annotations

import sys

from ..common.runner import recipe_main
from .compare import run_captioning
from .config import CaptioningConfig

PROG = "hf-gate-attention recipe captioning"


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, comparison.json, <run>/metrics.json)")
    print(
        f"Plots:   {run_dir}/attention.png, {run_dir}/overlay_*.png, {run_dir}/quality.png, "
        f"{run_dir}/loss_curves.png, {run_dir}/speed.png"
    )


def main(argv: list[str] | None = None, prog: str = PROG, epilog: str = "") -> int:
    """Run (or continue) a comparison; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=prog,
        description="Train and compare captioners (a frozen vision encoder and a text decoder with "
        "cross-attention) without and with gated attention; measure caption quality, where the "
        "cross-attention falls on the objects the caption names, and the gates by word; writes "
        "<output_dir>/<name>/ with comparison tables, plots and a verdict on the article's claim. Config "
        "keys: see CaptioningConfig.",
        config_class=CaptioningConfig,
        run=run_captioning,
        report=_report,
        epilog=epilog,
    )


if __name__ == "__main__":
    sys.exit(main())
