"""What the timing scripts share: interleaved rounds, medians and ranges of per-round ratios, the machine and
the command line for a table's header, and tables written atomically as CSV and Markdown.

Interleaved rounds: every case is called once untimed (warm-up), then each round calls every case once, in an
order rotated by one case from round to round, so that drift of the machine (heat, other processes) falls on
every case alike. A case's ratio is the median over rounds of (case / baseline of the same round), reported
with the range (min, max) of the rounds.
"""

from __future__ import annotations

import csv
import io
import math
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hf_gate_attention.files import atomic_write_text


def rotated(cases: list, round_index: int) -> list:
    """The order of `cases` in round `round_index`: rotated left by `round_index` places."""
    shift = round_index % len(cases)
    return cases[shift:] + cases[:shift]


def interleaved(
    run: Callable,
    cases: list,
    rounds: int,
    warmup: bool = True,
    on_round: Callable[[int, dict], None] | None = None,
    deadline: float | None = None,
) -> dict[str, list]:
    """`{case: [run(case) of each round]}`: one untimed call per case first (unless `warmup` is False), then
    `rounds` rounds in rotated order. `on_round(index, results)` follows each round; with `deadline` (a
    `time.perf_counter()` value) no further round starts when one more as long as the last would end past it
    (at least one round runs)."""
    cases = list(cases)
    if warmup:
        for case in cases:
            run(case)
    results = {case: [] for case in cases}
    for index in range(rounds):
        start = time.perf_counter()
        for case in rotated(cases, index):
            results[case].append(run(case))
        if on_round is not None:
            on_round(index, results)
        now = time.perf_counter()
        if deadline is not None and index + 1 < rounds and now + (now - start) > deadline:
            break
    return results


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def ratios(values: Iterable, baselines: Iterable) -> list[float]:
    """Per-round value / baseline of the same round, leaving out rounds where either is missing (None or NaN)
    or the baseline is 0."""
    return [
        value / base
        for value, base in zip(values, baselines, strict=True)
        if not missing(value) and not missing(base) and base != 0
    ]


def median_range(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of `values`."""
    return statistics.median(values), min(values), max(values)


def ratio_fields(name: str, values: list[float]) -> dict[str, float]:
    """`{name: median, name_min: min, name_max: max}` of per-round ratios (nothing when there are none)."""
    if not values:
        return {}
    median, low, high = median_range(values)
    return {name: median, f"{name}_min": low, f"{name}_max": high}


def ratio_cell(row: dict, name: str = "ratio") -> str:
    """`x<median> [<min>, <max>]` of the fields `ratio_fields(name, ...)` put in `row`."""
    return f"x{row[name]:.3f} [{row[f'{name}_min']:.3f}, {row[f'{name}_max']:.3f}]"


def cpu_model() -> str:
    """The CPU's model name from `/proc/cpuinfo` (or `platform.processor()` elsewhere)."""
    try:
        return re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text()).group(1).strip()
    except (OSError, AttributeError):
        return platform.processor() or "unknown CPU"


def command_line() -> str:
    """The command that runs this script from the project's root, as a header names it."""
    return shlex.join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def markdown_table(columns: list[str], rows: Iterable[list[str]], align: str = "") -> list[str]:
    """The lines of a Markdown table; `align` holds one letter per column, `l` (default) or `r`."""
    align = align.ljust(len(columns), "l")
    rule = "|" + "".join("---:|" if side == "r" else "---|" for side in align)
    return ["| " + " | ".join(columns) + " |", rule, *("| " + " | ".join(row) + " |" for row in rows)]


def markdown_page(header: str, table: list[str]) -> str:
    """`header`, a blank line and the lines of `table`, as one text ending in a newline."""
    return "\n".join([header, "", *table]) + "\n"


def write_csv(path: Path, rows: list[dict]) -> None:
    """`rows` as CSV (the columns of every row in order of appearance, blank where a row has none),
    written atomically."""
    fields = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(Path(path), buffer.getvalue())


def write_results(prefix: str | Path, rows: list[dict], markdown: str) -> None:
    """`<prefix>.csv` of `rows` and `<prefix>.md` holding `markdown`, each written atomically."""
    write_csv(Path(f"{prefix}.csv"), rows)
    atomic_write_text(Path(f"{prefix}.md"), markdown)


def publish(prefix: str | Path, rows: list[dict], header: str, table: list[str]) -> None:
    """`write_results` of `rows` and the page of `header` and `table`, then `table` printed."""
    write_results(prefix, rows, markdown_page(header, table))
    print("\n".join(table))
