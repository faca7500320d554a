"""The command line every recipe runs with: `--config FILE [KEY=VALUE | --key value ...]` read into the
recipe's config, the recipe run, what it wrote printed. Runs unchanged under `torchrun` and
`accelerate launch`."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import re
import sys
import textwrap

import transformers

from ...formatting import gate_label
from .config_files import load_config, parse_overrides

# Errors caused by the input (config, data, results folder): reported in one line, without a traceback.
# OSError covers missing files, an existing results folder, no Hub connection and unloadable models.
INPUT_ERRORS = (ValueError, OSError, ModuleNotFoundError)


_NAMES = re.compile(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*)(.*)$")
_TYPE = re.compile(r"^ \((?:[^()]|\([^()]*\))*\)")  # ` (`type`, defaults to ...)`, one nesting level


def _entry(line: str) -> tuple[list[str], str] | None:
    """`(names, text)` of a docstring line `name[, name...] [(`type`, ...)]: text`, else `None`."""
    match = _NAMES.match(line)
    if match is None:
        return None
    names, rest = match.group(1).split(", "), _TYPE.sub("", match.group(2), count=1)
    return (names, rest[1:].strip()) if rest.startswith(":") else None


def key_help(config_class) -> dict[str, str]:
    """Each config key's help, read from the docstrings of `config_class` and its bases (the first class
    that documents a key wins): lines `name[, name...] [(`type`, ...)]: text` one level into a section,
    continued by the deeper-indented lines below them."""
    helps: dict[str, str] = {}
    for cls in config_class.__mro__:
        entry_names, lines = None, inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines()
        for line in lines:
            indent = len(line) - len(line.lstrip())
            parsed = _entry(line.strip()) if indent == 4 else None
            if parsed is not None:
                entry_names = [name for name in parsed[0] if name not in helps]
                for name in entry_names:
                    helps[name] = parsed[1]
            elif entry_names and indent > 4 and line.strip():
                for name in entry_names:
                    helps[name] = f"{helps[name]} {line.strip()}".strip()
            else:
                entry_names = None
    return helps


def _help_order(config_class) -> list:
    """The config's fields in the order `--help` lists them: the run keys (`RecipeConfigBase`), the recipe's
    own, then those of its other bases (data, training), each group in declaration order."""
    mro = config_class.__mro__

    def origin(f) -> float:
        index = max(i for i, cls in enumerate(mro) if f.name in inspect.get_annotations(cls))
        return 1.5 if index == 0 else index  # the recipe's own keys after the first base's (the run keys)

    return sorted(dataclasses.fields(config_class), key=origin)


def _run_label(run: dict) -> str:
    """`name: gate` of a run (`name: key=value, ...` for runs without a gate, such as the distillation's)."""
    name = run.pop("name")
    if "gate" in run:
        return f"{name}: {gate_label(run['gate'], 'baseline')}"
    return f"{name}: {', '.join(f'{key}={value}' for key, value in run.items())}"


def _keys_help(config_class) -> str:
    helps = key_help(config_class)
    lines = ["config keys (each settable in the file or as KEY=VALUE / --key value; lists as JSON or a,b,c):"]
    for f in _help_order(config_class):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "runs":
            default = [_run_label(run.to_dict()) for run in default]
        lines.append(f"  {f.name} (default: {default!r})")
        lines += [f"      {line}" for line in textwrap.wrap(helps.get(f.name, ""), 100)]
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
