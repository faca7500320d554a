"""Command line of the classification recipe: `python -m recipes.classification --config FILE [--key value]`
(also `python -m hf_gate_attention.recipes.classification`)."""

from __future__ import annotations

import argparse
import logging
import sys

import transformers

from ..summarization.config import load_config, parse_overrides
from .compare import run_classification
from .config import ClassificationConfig

PROG = "python -m recipes.classification"
# Errors caused by the input (config, data, results folder, model): one line, no traceback.
INPUT_ERRORS = (ValueError, OSError, ModuleNotFoundError)


def main(argv: list[str] | None = None) -> int:
    """Run (or continue) a comparison; returns the exit status (2 for bad input, reported in one line)."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_gate_attention").setLevel(logging.INFO)
    transformers.logging.set_verbosity_warning()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Fine-tune and compare an ungated baseline and gated-attention variants on text (BERT "
        "family) or image (ViT family) classification; writes <output_dir>/<name>/ with comparison tables "
        "and plots. Config keys: see ClassificationConfig.",
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML or JSON file of config keys (command-line keys override it)")
    args, rest = parser.parse_known_args(argv)
    try:
        config = load_config(args.config, parse_overrides(rest), ClassificationConfig)
        run_dir = run_classification(config)
    except INPUT_ERRORS as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, comparison.json, <run>/metrics.json)")
    print(f"Plots:   {run_dir}/loss_curves.png, {run_dir}/quality.png, {run_dir}/speed.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
