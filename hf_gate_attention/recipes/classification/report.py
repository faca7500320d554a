"""Runs vs the baseline: accuracy and macro-F1 with CIs, paired deltas and throughput ratios, as Markdown
and CSV tables."""

from __future__ import annotations

from ...formatting import comparison_csv, gate_label, signed, table
from .metrics import METRIC_LABELS, METRICS


def _percent_with_ci(score: dict) -> str:
    return f"{100 * score['mean']:.2f} [{100 * score['low']:.2f}, {100 * score['high']:.2f}]"


def _delta_cell(delta: dict) -> str:
    points = {k: 100 * delta[k] for k in ("delta", "low", "high")}
    interval = f"[{signed(points['low'])}, {signed(points['high'])}]"
    return f"{signed(points['delta'])} {interval} (p={delta['p_value']:.3f})"


def _ratio(value: float) -> str:
    return f"x{value:.3f} ({100 * (value - 1):+.1f} %)"


def markdown_table(rows: list[dict], confidence: float) -> str:
    """Markdown tables of the comparison rows: quality with CIs, deltas vs the baseline, speed and ratios."""
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
    lines += [
        "",
        f"Inference throughput (batches of {speed['batch_size']}, {speed['examples']} test examples, medians "
        "of interleaved rounds); ratios vs baseline: > 1 is faster (memory: > 1 uses more)",
        "",
    ]
    speed_rows = []
    for row in rows:
        ratios = row.get("speed_ratios")
        cells = [f"{row['speed']['examples_per_s']:.1f}", f"{row['speed']['peak_memory_mb']:.1f}"]
        cells += [_ratio(ratios["throughput"]), _ratio(ratios["peak_memory"])] if ratios else ["-", "-"]
        speed_rows.append([row["run"], *cells])
    lines.append(table(["run", "examples/s", "peak MiB", "throughput ratio", "memory ratio"], speed_rows))
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict]) -> str:
    """One CSV row per run with every number of the comparison in its own column (fractions, not %)."""
    deltas = {key: key for key in ("delta", "low", "high", "p_value")}
    speed = ("examples_per_s", "seconds_per_batch", "peak_memory_mb")
    return comparison_csv(rows, "quality", METRICS, deltas, speed, ("throughput", "peak_memory"))
