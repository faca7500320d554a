"""The command line every recipe runs with: `--config FILE [KEY=VALUE | --key value ...]` read into the
recipe's config, the recipe run, what it wrote printed. Runs unchanged under `torchrun` and
`accelerate launch`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

import transformers

from .config_files import load_config, parse_overrides

# Errors caused by the input (config, data, results folder): reported in one line, without a traceback.
# OSError covers missing files, an existing results folder, no Hub connection and unloadable models.
INPUT_ERRORS = (ValueError, OSError, ModuleNotFoundError)


def _keys_help(config_class) -> str:
    lines = ["config keys (each settable in the file or as KEY=VALUE / --key value; lists as JSON or a,b,c):"]
    for f in dataclasses.fields(config_class):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "runs":
            default = [r.to_dict() for r in default]
        lines.append(f"  {f.name} (default: {default!r})")
    return "\n".join(lines)


def recipe_main(argv, *, prog: str, description: str, config_class, run, report, epilog: str = "") -> int:
    """The command line shared by the recipes: `--config FILE [KEY=VALUE ...]` -> `config_class` ->
    `run(config)` -> `report(result)` prints what was written (`result` is `None` on the non-main processes
    of a distributed launch: nothing printed). Bad input is one line on stderr and exit status 2; `--help`
    lists every key of `config_class` with its default, then `epilog`."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("hf_gate_attention").setLevel(logging.INFO)
    transformers.logging.set_verbosity_warning()
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="\n\n".join(filter(None, [_keys_help(config_class), epilog])),
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
