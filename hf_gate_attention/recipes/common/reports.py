"""The command lines of the recipes' report writers: a Markdown file written from a results folder, naming
the command that wrote it; and a comparison's tables rewritten from its saved comparison.json."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...files import atomic_write_text, read_json


def report_main(
    argv: list[str] | None,
    module: str,
    build: Callable[[str, str], str],
    default_out: str,
    prog: str | None = None,
) -> int:
    """`PROG RESULTS [--out FILE]` writes `build(RESULTS, command)` to FILE (atomically; `command` is the
    line that wrote it, for the report to name); `prog` defaults to `python -m <module>`. Returns 2 with a
    one-line error when the results folder is missing or incomplete."""
    label, prog = prog or module, prog or f"python -m {module}"
    name = Path(default_out).name
    parser = argparse.ArgumentParser(prog=prog, description=f"Write {name} from a results folder.")
    parser.add_argument("results", help="results folder of the comparison")
    parser.add_argument("--out", default=default_out, help="Markdown file to write")
    args = parser.parse_args(argv)
    command = f"{prog} {args.results} --out {args.out}"
    try:
        atomic_write_text(Path(args.out), build(args.results, command))
    except (OSError, ValueError, KeyError) as error:
        print(f"{label}: error: {error}", file=sys.stderr)
        return 2
    print(f"Wrote {args.out}")
    return 0


COMPARISON_FILE = "comparison.json"
TABLE_FILES = ("comparison.md", "comparison.csv")


def read_comparison(results: str | Path, recipe: str, config_class) -> tuple[Any, list[dict]]:
    """The config (rebuilt as `config_class`) and the rows saved in `results/comparison.json` by `recipe`'s
    run; `FileNotFoundError` or `ValueError` in one line naming the file and what is expected when the
    folder, the file or its recipe is not the right one."""
    results = Path(results)
    expected = f"expected the results folder of a `hf-gate-attention recipe {recipe}` comparison"
    if not results.is_dir():
        raise FileNotFoundError(f"{results} is not a folder; {expected}")
    path = results / COMPARISON_FILE
    comparison = read_json(path)
    if comparison is None:
        raise FileNotFoundError(
            f"{results} holds no {COMPARISON_FILE}; {expected}, which writes it when it ends"
        )
    saved = comparison.get("config") if isinstance(comparison, dict) else None
    rows = comparison.get("runs") if isinstance(comparison, dict) else None
    if not isinstance(saved, dict) or not isinstance(rows, list):
        raise ValueError(f"{path} holds no `config` and `runs`; {expected}")
    known = {field.name for field in dataclasses.fields(config_class)}
    unknown = [key for key in saved if key not in known]
    if unknown:
        raise ValueError(
            f"{path} is not a comparison of the {recipe} recipe (its config has keys {unknown[:3]} that "
            f"{config_class.__name__} has not); {expected}"
        )
    try:
        config = config_class.from_dict(saved, source=str(path))
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return config, rows


def tables_main(
    argv: list[str] | None,
    prog: str,
    recipe: str,
    config_class,
    write_tables: Callable[[Path, Any, list[dict]], None],
) -> int:
    """`PROG RESULTS` rewrites `RESULTS/comparison.md` and `comparison.csv` from `RESULTS/comparison.json`
    with `write_tables(RESULTS, config, rows)`, the writer that `recipe`'s run calls, the config rebuilt from
    the saved one (no training, evaluation or timing). Returns 2 with a one-line error naming the file and
    what is expected when the folder, its comparison.json or its recipe is not the right one."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"Rewrite {' and '.join(TABLE_FILES)} of a {recipe} results folder from its saved "
        f"{COMPARISON_FILE} (nothing is trained, evaluated or timed again).",
    )
    parser.add_argument(
        "results", help=f"results folder of a {recipe} comparison (holding {COMPARISON_FILE})"
    )
    args = parser.parse_args(argv)
    results = Path(args.results)
    try:
        config, rows = read_comparison(results, recipe, config_class)
        try:
            write_tables(results, config, rows)
        except (KeyError, TypeError) as error:
            raise ValueError(
                f"{results / COMPARISON_FILE} has runs that the {recipe} tables cannot read ({error!r}); "
                f"expected the runs that `hf-gate-attention recipe {recipe}` writes"
            ) from None
    except (OSError, ValueError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"Wrote {' and '.join(str(results / name) for name in TABLE_FILES)}")
    return 0
