"""Command line of the summarization recipe: `hf-gate-summarize --config FILE [--key value ...]`.

Equivalent: `python -m hf_gate_attention.recipes.summarization ...` and, in a source checkout,
`python -m recipes.summarization ...`. Runs unchanged under `torchrun` and `accelerate launch`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

import transformers

from .compare import run_comparison
from .config import RecipeConfig, load_config, parse_overrides

PROG = "hf-gate-summarize"
# Errors caused by the input (config, data, results folder): reported in one line, without a traceback.
# OSError covers missing files, an existing results folder, no Hub connection and unloadable models.
INPUT_ERRORS = (ValueError, OSError, ModuleNotFoundError)


def _keys_help(config_class) -> str:
    lines = ["config keys (each settable in the file or as --key value; lists as JSON or a,b,c):"]
    for f in dataclasses.fields(config_class):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "runs":
            default = [r.to_dict() for r in default]
        lines.append(f"  --{f.name} (default: {default!r})")
    return "\n".join(lines)


def recipe_main(argv, *, prog: str, description: str, config_class, run, report) -> int:
    """The command line shared by the recipes: `--config FILE [--key value ...]` -> `config_class` ->
    `run(config)` -> `report(result)` prints what was written (`result` is `None` on the non-main processes
    of a distributed launch: nothing printed). Bad input is one line on stderr and exit status 2; `--help`
    lists every key of `config_class` with its default."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_gate_attention").setLevel(logging.INFO)
    transformers.logging.set_verbosity_warning()
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=_keys_help(config_class),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML or JSON file of config keys (command-line keys override it)")
    args, rest = parser.parse_known_args(argv)
    try:
        result = run(load_config(args.config, parse_overrides(rest), config_class))
    except INPUT_ERRORS as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    if result is not None:
        report(result)
    return 0


def _report(run_dir) -> None:
    print((run_dir / "comparison.md").read_text(encoding="utf-8"))
    print(f"Results: {run_dir}/ (comparison.md, comparison.csv, <run>/metrics.json)")
    print(f"Plots:   {run_dir}/loss_curves.png, {run_dir}/rouge.png, {run_dir}/speed.png")


def main(argv: list[str] | None = None) -> int:
    """Run a comparison; returns the exit status (2 for bad input, reported in one line)."""
    return recipe_main(
        argv,
        prog=PROG,
        description="Fine-tune and compare an ungated baseline and gated-attention variants on long-document "
        "summarization; writes <output_dir>/<name>/ with metrics, comparison tables and plots.",
        config_class=RecipeConfig,
        run=run_comparison,
        report=_report,
    )


if __name__ == "__main__":
    sys.exit(main())
