"""Speed ratios of runs timed in interleaved rounds, and the speed table of the recipes' reports
(summarization, distillation, classification).

In each round the runs ran one after another on the same inputs (`inference.interleaved_rounds`), so a ratio
taken within a round cancels the slow and fast phases of a shared machine. A ratio is the median of the
per-round ratios, shown with their range [lowest round, highest round]; it is *noisy* when the rounds
disagree too much for the median to mean anything (`is_noisy`). The table's absolute columns are derived
from the reference row's medians and the ratios, so that a row's value / the reference's is the ratio shown
(each run's own medians stay in `row["speed"]`, the CSV and the speed plot).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ...formatting import table

# A ratio is noisy when its rounds span more than NOISY_SPREAD of the median, or when some rounds were faster
# and others slower while the median claims a difference of NOISY_CLAIM or more.
NOISY_SPREAD = 0.10
NOISY_CLAIM = 0.05
NOISY_NOTE = (
    "*noisy*: the rounds disagree too much for that ratio to mean anything (their range spans more than "
    f"{100 * NOISY_SPREAD:g} % of the median, or holds a faster and a slower round while the median is "
    f"{100 * NOISY_CLAIM:g} % or more from 1); rerun on an idle machine."
)
MEMORY_RATIO = "peak_memory"


@dataclass(frozen=True)
class SpeedColumn:
    """A timed quantity of the rounds and its ratio.

    Attributes:
        key: the per-round (and per-run median) value in the speed dict, e.g. `"decode_tokens_per_s"`.
        ratio: the ratio's name, e.g. `"decode"`.
        label: the header of the absolute column.
        ratio_label: the header of the ratio column.
        digits: decimals of the absolute column.
        seconds: a time, so the ratio is reference / run (> 1: the run is faster, as for throughputs).
    """

    key: str
    ratio: str
    label: str
    ratio_label: str
    digits: int = 1
    seconds: bool = False


def round_ratios(run: dict, reference: dict, column: SpeedColumn) -> list[float]:
    """Run vs reference in each interleaved round (`run`, `reference`: speed dicts with `"rounds"`): run /
    reference for a throughput, reference / run for a time; > 1: the run is faster."""
    pairs = zip(run["rounds"], reference["rounds"], strict=True)
    if column.seconds:
        return [b[column.key] / r[column.key] for r, b in pairs]
    return [r[column.key] / b[column.key] for r, b in pairs]


def is_noisy(ratio: float, low: float, high: float) -> bool:
    """Whether per-round ratios with median `ratio` and range [`low`, `high`] disagree too much to read:
    the range spans more than `NOISY_SPREAD` of the median, or it holds rounds on both sides of 1 while the
    median is `NOISY_CLAIM` or more from 1."""
    wide = (high - low) > NOISY_SPREAD * ratio
    both_ways = low < 1 < high and abs(ratio - 1) >= NOISY_CLAIM
    return wide or both_ways


def ratio_summary(ratios: list[float]) -> dict:
    """`{"ratio": median, "low": min, "high": max, "noisy": is_noisy(...)}` of per-round ratios."""
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    return {"ratio": median, "low": low, "high": high, "noisy": is_noisy(median, low, high)}


def ratio_stats(run: dict, reference: dict, columns: tuple[SpeedColumn, ...]) -> dict[str, dict]:
    """`{column.ratio: ratio_summary(...)}` of run vs reference (speed dicts), and `"peak_memory"`: run /
    reference peak memory (> 1: the run uses more), one measurement per run, so no range and never noisy."""
    stats = {column.ratio: ratio_summary(round_ratios(run, reference, column)) for column in columns}
    memory = run["peak_memory_mb"] / reference["peak_memory_mb"]
    return stats | {MEMORY_RATIO: {"ratio": memory, "low": None, "high": None, "noisy": False}}


def speed_ratios(run: dict, reference: dict, columns: tuple[SpeedColumn, ...]) -> dict[str, float]:
    """The ratios' medians, `{name: float}` (what a comparison row stores as `speed_ratios`)."""
    return {name: stats["ratio"] for name, stats in ratio_stats(run, reference, columns).items()}


def stats_by_run(rows: list[dict], reference: str | None, columns: tuple[SpeedColumn, ...]) -> dict:
    """`{run: ratio_stats(row, reference row)}` of every row but the one named `reference`; `{}` when no row
    is named so (no ratios)."""
    ref = next((row for row in rows if row["run"] == reference), None)
    if ref is None:
        return {}
    return {row["run"]: ratio_stats(row["speed"], ref["speed"], columns) for row in rows if row is not ref}


def ratio_cell(stats: dict) -> str:
    """`x0.969 [0.948, 1.021] (-3.1 %)`; `x0.708 [0.080, 1.100] noisy`; `x1.021 (+2.1 %)` without range."""
    cell = f"x{stats['ratio']:.3f}"
    if stats["low"] is not None:
        cell += f" [{stats['low']:.3f}, {stats['high']:.3f}]"
    return f"{cell} noisy" if stats["noisy"] else f"{cell} ({100 * (stats['ratio'] - 1):+.1f} %)"


def _absolute(row: dict, reference: dict | None, stats: dict | None, column: SpeedColumn) -> str:
    if stats is None:  # the reference, or no reference: the run's own median
        value = row["speed"][column.key]
    else:
        ratio = stats[column.ratio]["ratio"]
        base = reference["speed"][column.key]
        value = base / ratio if column.seconds else base * ratio
    return f"{value:.{column.digits}f}"


def speed_table(
    rows: list[dict],
    reference: str | None,
    columns: tuple[SpeedColumn, ...],
    caption: str,
    own_medians: str | None = "`comparison.csv`, `speed.png`",
) -> list[str]:
    """Markdown lines: `caption`, the table (the absolute `columns`, peak memory, their ratios vs the row
    named `reference`), what each column is (`own_medians`: where each run's own medians are shown), and
    `NOISY_NOTE` when a ratio is noisy."""
    stats = stats_by_run(rows, reference, columns)
    ref = next((row for row in rows if row["run"] == reference), None) if stats else None
    body = []
    for row in rows:
        run_stats = stats.get(row["run"])
        cells = [_absolute(row, ref, run_stats, column) for column in columns]
        cells.append(f"{row['speed']['peak_memory_mb']:.1f}")
        names = [column.ratio for column in columns] + [MEMORY_RATIO]
        cells += [ratio_cell(run_stats[name]) for name in names] if run_stats else ["-"] * len(names)
        body.append([row["run"], *cells])
    header = ["run", *(c.label for c in columns), "peak MiB"]
    header += [*(c.ratio_label for c in columns), "memory ratio"]
    labels = ", ".join(c.label for c in columns)
    rounds = len(rows[0]["speed"]["rounds"])
    if stats:
        times = ", ".join(c.label for c in columns if c.seconds)
        legend = [
            f"- Ratio cells: the run / {reference} in each of the {rounds} interleaved rounds (the runs of a "
            "round ran one after another on the same inputs"
            + (f"; {times}: {reference} / the run" if times else "")
            + "), their median [lowest, highest round]; > 1 is faster. Memory ratio: the run's peak MiB / "
            f"{reference}'s (one measurement each), > 1 uses more.",
            f"- {labels}: {reference}'s median over the rounds; each other row is that median x its ratio"
            + (f" ({times}: / its ratio)" if times else "")
            + f", so that a row / {reference} is the ratio shown."
            + (f" Each run's own medians: {own_medians}." if own_medians else ""),
        ]
    else:
        legend = [f"{labels}: each run's median over the {rounds} interleaved rounds."]
    lines = [caption, "", table(header, body), "", *legend]
    if any(s["noisy"] for run_stats in stats.values() for s in run_stats.values()):
        lines += ["", NOISY_NOTE]
    return lines


def ratio_csv_fields(stats: dict | None, names: tuple[str, ...]) -> dict:
    """CSV columns `<name>_ratio`, `<name>_ratio_low`, `<name>_ratio_high`, `<name>_ratio_noisy` of one row's
    `ratio_stats` (empty for the reference row)."""
    fields = {}
    for name in names:
        ratio = (stats or {}).get(name, {})
        fields |= {
            f"{name}_ratio": ratio.get("ratio"),
            f"{name}_ratio_low": ratio.get("low"),
            f"{name}_ratio_high": ratio.get("high"),
            f"{name}_ratio_noisy": ratio.get("noisy"),
        }
    return fields
