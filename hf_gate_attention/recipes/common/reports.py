"""The command line of the recipes' report writers: a Markdown file written from a results folder, naming
the command that wrote it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ...files import atomic_write_text


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
