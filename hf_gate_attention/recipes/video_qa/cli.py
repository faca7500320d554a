"""Command line of the video QA recipe: `hf-gate-attention recipe video_qa --config FILE [KEY=VALUE ...]`."""

from __future__ import annotations

import sys

from ..common.runner import recipe_main
from .compare import run_video_qa
from .config import VideoQAConfig

PROG = "hf-gate-attention recipe video_qa"


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, comparison.json, <run>/metrics.json)")
    print(
        f"Plots:   {run_dir}/accuracy.png, {run_dir}/gates_by_layer.png, {run_dir}/overlay_*.png, "
        f"{run_dir}/speed.png"
    )


def main(argv: list[str] | None = None, prog: str = PROG, epilog: str = "") -> int:
    """Run (or continue) a comparison; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=prog,
        description="Train and compare video question answerers (a frozen vision encoder reading each frame, "
        "a decoder reading passage and question by self-attention and the frames by cross-attention) without "
        "and with gated attention; measure accuracy, the gates' fusion ratio and where the frames' attention "
        "falls, per question kind (frames only, text only, both). Config keys: see VideoQAConfig.",
        config_class=VideoQAConfig,
        run=run_video_qa,
        report=_report,
        epilog=epilog,
    )


if __name__ == "__main__":
    sys.exit(main())
