"""Runs vs the baseline: ROUGE deltas with paired bootstrap CIs, speed ratios, Markdown and CSV tables, the
ROUGE plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from ....formatting import comparison_csv, gate_label, score_with_ci, signed, table
from ..plots import plot_scores
from ..statistics import paired_bootstrap_delta
from .rouge import ROUGE_TYPES

# short column labels of the report's wide tables
ROUGE_LABELS = {"rouge1": "R-1", "rouge2": "R-2", "rougeL": "R-L", "rougeLsum": "R-Lsum"}

SPEED_KEYS = ("prefill_tokens_per_s", "decode_tokens_per_s", "seconds_per_summary")
RATIO_KEYS = ("prefill", "decode", "speedup", "peak_memory")


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
    """Medians over the interleaved rounds of run / baseline throughput (> 1: the run is faster), and of
    baseline / run seconds per summary (`speedup`, > 1: the run is faster)."""
    pairs = list(zip(run["rounds"], baseline["rounds"], strict=True))
    return {
        "prefill": statistics.median(r["prefill_tokens_per_s"] / b["prefill_tokens_per_s"] for r, b in pairs),
        "decode": statistics.median(r["decode_tokens_per_s"] / b["decode_tokens_per_s"] for r, b in pairs),
        "speedup": statistics.median(b["seconds_per_summary"] / r["seconds_per_summary"] for r, b in pairs),
        "peak_memory": run["peak_memory_mb"] / baseline["peak_memory_mb"],
    }


def _ratio(value: float) -> str:
    return f"x{value:.3f} ({100 * (value - 1):+.1f} %)"


def _delta_cell(delta: dict) -> str:
    interval = f"[{signed(delta['low'])}, {signed(delta['high'])}]"
    return f"{signed(delta['delta'])} {interval} ({signed(delta['percent'], 1)} %)"


def _speed_cells(row: dict) -> list[str]:
    speed, ratios = row["speed"], row.get("speed_ratios")
    cells = [
        f"{speed['prefill_tokens_per_s']:.1f}",
        f"{speed['decode_tokens_per_s']:.1f}",
        f"{speed['seconds_per_summary']:.3f}",
        f"{speed['peak_memory_mb']:.1f}",
    ]
    return cells + ([_ratio(ratios[key]) for key in RATIO_KEYS] if ratios else ["-"] * len(RATIO_KEYS))


def markdown_table(
    rows: list[dict],
    confidence: float,
    *,
    reference: str = "baseline",
    speed_reference: str | None = None,
    extra_columns: tuple[str, ...] = (),
) -> str:
    """Markdown tables of `comparison_rows`: ROUGE with CIs, deltas vs the baseline, speed and its ratios.

    `reference` and `speed_reference` (default: `reference`) name, in the captions, what the rows' `deltas`
    and `speed_ratios` compare against; `extra_columns` are row keys shown after the gate column."""
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
    new_tokens = rows[0]["speed"]["new_tokens"]
    lines += [
        "",
        f"Inference speed (batch 1, summaries of {new_tokens} tokens, medians of interleaved rounds); "
        f"ratios vs {speed_reference or reference}: > 1 is faster (memory: > 1 uses more)",
        "",
    ]
    header = ["run", "prefill tok/s", "decode tok/s", "s/summary", "peak MiB"]
    header += ["prefill ratio", "decode ratio", "speedup (s/summary)", "memory ratio"]
    lines.append(table(header, [[row["run"], *_speed_cells(row)] for row in rows]))
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict], extra_columns: tuple[str, ...] = ()) -> str:
    """One CSV row per run with every number of the comparison in its own column (`extra_columns`: row keys
    added after the gate)."""
    deltas = {"points": "delta", "low": "low", "high": "high", "percent": "percent", "p_value": "p_value"}
    speed = (*SPEED_KEYS, "peak_memory_mb")
    return comparison_csv(rows, "rouge", ROUGE_TYPES, deltas, speed, RATIO_KEYS, extra_columns)


def plot_rouge(rouge: dict[str, dict], confidence: float, path: Path) -> None:
    """Grouped bars of mean ROUGE with bootstrap CIs; `rouge` is `{run: {type: {mean, low, high}}}`."""
    title = f"ROUGE on the test split ({100 * confidence:g} % bootstrap CI)"
    plot_scores(rouge, ROUGE_LABELS, "F1 x100", title, path)
