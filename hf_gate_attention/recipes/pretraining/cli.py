"""Command line of the pretraining recipe: `hf-gate-attention recipe pretraining --config FILE
[KEY=VALUE ...]`."""

from __future__ import annotations

import sys

from ..common.runner import recipe_main
from .config import StudyConfig
from .study import run_study

PROG = "hf-gate-attention recipe pretraining"


def main(argv: list[str] | None = None, prog: str = PROG, epilog: str = "") -> int:
    """Run (or continue) a study; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=prog,
        description="Train Llama-style models from scratch, ungated and gated, on the same data and budget; "
        "writes <output_dir>/<name>/ with STUDY.md. Config keys: see StudyConfig.",
        config_class=StudyConfig,
        run=run_study,
        report=lambda run_dir: print((run_dir / "STUDY.md").read_text(encoding="utf-8")),
        epilog=epilog,
    )


if __name__ == "__main__":
    sys.exit(main())
