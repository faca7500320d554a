"""Command line of the pretraining study: `python -m recipes.pretraining --config FILE [--key value ...]`."""

from __future__ import annotations

import argparse
import logging
import sys

import transformers

from ..summarization.config import load_config, parse_overrides
from .config import StudyConfig
from .study import run_study

PROG = "python -m recipes.pretraining"
INPUT_ERRORS = (ValueError, OSError, ModuleNotFoundError)


def main(argv: list[str] | None = None) -> int:
    """Run (or continue) a study; returns the exit status (2 for bad input, reported in one line)."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_gate_attention").setLevel(logging.INFO)
    transformers.logging.set_verbosity_warning()
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train Llama-style models from scratch, ungated and gated, on the same data and budget; "
        "writes <output_dir>/<name>/ with STUDY.md. Config keys: see StudyConfig.",
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML or JSON file of config keys (command-line keys override it)")
    args, rest = parser.parse_known_args(argv)
    try:
        config = load_config(args.config, parse_overrides(rest), StudyConfig)
        run_dir = run_study(config)
    except INPUT_ERRORS as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    print((run_dir / "STUDY.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
