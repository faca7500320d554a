"""Runs vs the baseline: ROUGE deltas with paired bootstrap CIs, speed ratios (`common.speed`), Markdown and
CSV tables, the ROUGE plot."""

from __future__ import annotations

from pathlib import Path

from ....formatting import comparison_csv, gate_label, score_with_ci, signed, signed_percent, table
from ..plots import plot_scores
from ..speed import MEMORY_RATIO, SpeedColumn, ratio_csv_fields, speed_table, stats_by_run
from ..speed import speed_ratios as median_ratios
from ..statistics import paired_bootstrap_delta
from .rouge import ROUGE_TYPES

# short column labels of the report's wide tables
ROUGE_LABELS = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L", "rougeLsum": "R-Lsum"}

SPEED_COLUMNS = (
    SpeedColumn("prefill_tokens_per_s", "prefill", "prefill tok/s", "prefill ratio"),
    SpeedColumn("decode_tokens_per_s", "decode", "decode tok/s", "decode ratio"),
    SpeedColumn("seconds_per_summary", "speedup", "s/summary", "speedup (s/summary)", 3, seconds=True),
)
SPEED_KEYS = tuple(column.key for column in SPEED_COLUMNS)
RATIO_KEYS = (*(column.ratio for column in SPEED_COLUMNS), MEMORY_RATIO)


def rouge_deltas(run: dict, baseline: dict, n_bootstrap: int, confidence: float, seed: int) -> dict:
    """`{type: {"delta", "low", "high", "p_value", "percent"}}`: run - baseline in ROUGE points, paired by
    example; `percent` is the delta relative to the baseline's mean (`None` when that mean is 0)."""
    deltas = {}
    for rouge_type in ROUGE_TYPES:
        delta = paired_bootstrap_delta(
            run["per_example"][rouge_type], baseline["per_example"][rouge_type], n_bootstrap, confidence, seed
        )
        base = baseline["rouge"][rouge_type]["mean"]
        deltas[rouge_type] = delta | {"percent": 100.0 * delta["delta"] / base if base else None}
    return deltas


def speed_ratios(run: dict, baseline: dict) -> dict:
    """Medians over the interleaved rounds of run / baseline throughput (> 1: the run is faster), of
    baseline / run seconds per summary (`speedup`, > 1: the run is faster), and the peak-memory ratio."""
    return median_ratios(run, baseline, SPEED_COLUMNS)


def _delta_cell(delta: dict) -> str:
    interval = f"[{signed(delta['low'])}, {signed(delta['high'])}]"
    return f"{signed(delta['delta'])} {interval} ({signed_percent(delta['percent'])})"


def markdown_table(
    rows: list[dict],
    confidence: float,
    *,
    reference: str | None = "baseline",
    speed_reference: str | None = None,
    extra_columns: tuple[str, ...] = (),
) -> str:
    """Markdown tables of `comparison_rows`: ROUGE with CIs, deltas vs the baseline, speed and its ratios.

    `reference` names, in the captions, what the rows' `deltas` compare against; `speed_reference` (default:
    `reference`) is the run the speed ratios compare against (no row of that name: no ratios);
    `extra_columns` are row keys shown after the gate column."""
    level = f"{100 * confidence:g} %"
    labels = [ROUGE_LABELS[t] for t in ROUGE_TYPES]
    lines = [f"ROUGE F1 x100 on the test split, mean [{level} bootstrap CI]", ""]
    rouge_rows = [
        [
            row["run"],
            gate_label(row["gate"]),
            *("-" if row.get(key) is None else str(row[key]) for key in extra_columns),
        ]
        + [f"{row['trainable_params']:,}", str(row["global_step"])]
        + [score_with_ci(row["rouge"][t]) for t in ROUGE_TYPES]
        for row in rows
    ]
    header = ["run", "gate", *extra_columns, "trained params", "steps", *labels]
    lines.append(table(header, rouge_rows))
    gated = [row for row in rows if row.get("deltas")]
    if gated:
        caption = f"Delta vs {reference} in ROUGE points [{level} paired bootstrap CI] (relative delta)"
        lines += ["", caption, ""]
        delta_rows = [[row["run"]] + [_delta_cell(row["deltas"][t]) for t in ROUGE_TYPES] for row in gated]
        lines.append(table(["run", *labels], delta_rows))
    caption = (
        f"Inference speed (batch 1, summaries of {rows[0]['speed']['new_tokens']} tokens, interleaved rounds)"
    )
    lines += ["", *speed_table(rows, speed_reference or reference, SPEED_COLUMNS, caption)]
    return "\n".join(lines) + "\n"


def csv_table(
    rows: list[dict], extra_columns: tuple[str, ...] = (), *, speed_reference: str | None = "baseline"
) -> str:
    """One CSV row per run with every number of the comparison in its own column (`extra_columns`: row keys
    added after the gate): each run's own speed medians, and the ratios vs the row named `speed_reference`
    with their range over the rounds and noisy flag (`common.speed`)."""
    deltas = {"points": "delta", "low": "low", "high": "high", "percent": "percent", "p_value": "p_value"}
    speed = (*SPEED_KEYS, "peak_memory_mb")
    stats = stats_by_run(rows, speed_reference, SPEED_COLUMNS)
    ratios = {row["run"]: ratio_csv_fields(stats.get(row["run"]), RATIO_KEYS) for row in rows}
    return comparison_csv(rows, "rouge", ROUGE_TYPES, deltas, speed, ratios, extra_columns)


def plot_rouge(rouge: dict[str, dict], confidence: float, path: Path) -> None:
    """Grouped bars of mean ROUGE with bootstrap CIs; `rouge` is `{run: {type: {mean, low, high}}}`."""
    title = f"ROUGE on the test split ({100 * confidence:g} % bootstrap CI)"
    plot_scores(rouge, ROUGE_LABELS, "F1 x100", title, path)
