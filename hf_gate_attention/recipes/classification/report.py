"""Runs vs the baseline: accuracy and macro-F1 with CIs, paired deltas and throughput ratios (`common.speed`),
as Markdown and CSV tables."""

from __future__ import annotations

from ...formatting import comparison_csv, gate_label, signed, table
from ..common.speed import MEMORY_RATIO, ratio_csv_fields, speed_table, stats_by_run
from .evaluation import SPEED_COLUMNS
from .metrics import METRIC_LABELS, METRICS


def _percent_with_ci(score: dict) -> str:
    return f"{100 * score['mean']:.2f} [{100 * score['low']:.2f}, {100 * score['high']:.2f}]"


def _delta_cell(delta: dict) -> str:
    points = {k: 100 * delta[k] for k in ("delta", "low", "high")}
    interval = f"[{signed(points['low'])}, {signed(points['high'])}]"
    return f"{signed(points['delta'])} {interval} (p={delta['p_value']:.3f})"


def markdown_table(rows: list[dict], confidence: float, reference: str | None = "baseline") -> str:
    """Markdown tables of the comparison rows: quality with CIs, deltas vs the baseline, speed and its ratios
    vs the run named `reference` (none without such a run)."""
    level = f"{100 * confidence:g} %"
    labels = [METRIC_LABELS[m] for m in METRICS]
    lines = [f"Test split, in % (mean [{level} bootstrap CI]); {rows[0]['test_examples']} examples", ""]
    quality_rows = [
        [row["run"], gate_label(row["gate"]), f"{row['trainable_params']:,}", str(row["global_step"])]
        + [_percent_with_ci(row["quality"][m]) for m in METRICS]
        for row in rows
    ]
    lines.append(table(["run", "gate", "trained params", "steps", *labels], quality_rows))
    gated = [row for row in rows if row.get("deltas")]
    if gated:
        lines += [
            "",
            f"Delta vs baseline in points [{level} paired bootstrap CI] (p: share of resamples <= 0)",
            "",
        ]
        lines.append(
            table(
                ["run", *labels], [[r["run"]] + [_delta_cell(r["deltas"][m]) for m in METRICS] for r in gated]
            )
        )
    speed = rows[0]["speed"]
    caption = (
        f"Inference throughput (batches of {speed['batch_size']}, {speed['examples']} test examples, "
        "interleaved rounds)"
    )
    lines += ["", *speed_table(rows, reference, SPEED_COLUMNS, caption)]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict], reference: str | None = "baseline") -> str:
    """One CSV row per run with every number of the comparison in its own column (fractions, not %): each
    run's own speed medians, and the ratios vs the run named `reference` with their range over the rounds
    and noisy flag (`common.speed`)."""
    deltas = {key: key for key in ("delta", "low", "high", "p_value")}
    speed = ("examples_per_s", "seconds_per_batch", "peak_memory_mb")
    stats = stats_by_run(rows, reference, SPEED_COLUMNS)
    names = (*(column.ratio for column in SPEED_COLUMNS), MEMORY_RATIO)
    ratios = {row["run"]: ratio_csv_fields(stats.get(row["run"]), names) for row in rows}
    return comparison_csv(rows, "quality", METRICS, deltas, speed, ratios)
