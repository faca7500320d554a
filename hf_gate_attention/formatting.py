"""Number and table formatting shared by the model cards and the recipes' reports (Markdown)."""

from __future__ import annotations

import csv
import io

ROUGE_LABELS = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def score_with_ci(score: dict) -> str:
    """`{"mean", "low", "high"}` as `mean [low, high]`, 2 decimals."""
    return f"{score['mean']:.2f} [{score['low']:.2f}, {score['high']:.2f}]"


def signed(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f}"


def signed_percent(value: float | None) -> str:
    """A change relative to a baseline, in %; `None` (a baseline of 0: the relative change is undefined)
    shows as `n/a (baseline 0)`."""
    return "n/a (baseline 0)" if value is None else f"{value:+.1f} %"


def gate_label(gate: dict | None, baseline: str = "none (baseline)") -> str:
    """`variant/granularity[ top-k[ kv groups][, dropped read sink s + window w]]` of a gate config dict;
    `baseline` for `None`."""
    if gate is None:
        return baseline
    label = f"{gate['variant']}/{gate['granularity']}"
    if gate.get("top_k"):
        label += f" top-{gate['top_k']}" + (" kv groups" if gate.get("top_k_unit") == "kv_group" else "")
    if gate.get("top_k_sink") or gate.get("top_k_window"):
        label += f", dropped read sink {gate.get('top_k_sink', 0)} + window {gate.get('top_k_window', 0)}"
    return label


def comparison_csv(
    rows: list[dict],
    scores: str,
    metrics: tuple[str, ...],
    delta_columns: dict[str, str],
    speed_columns: tuple[str, ...],
    ratio_columns: dict[str, dict],
    extra_columns: tuple[str, ...] = (),
) -> str:
    """One CSV row per run of a comparison, every number in its own column: `run`, `gate`, the row keys
    `extra_columns`, `trainable_params`, `global_step`, `<metric>_mean/low/high` from `row[scores]`,
    `delta_<metric>_<suffix>` from `row["deltas"][metric][delta_columns[suffix]]`, `row["speed"]`'s
    `speed_columns` (each run's own medians over the timing rounds), then `ratio_columns[run]` (the speed
    ratios' columns, the same keys in every row; the reference row: empty ratios, no deltas)."""
    records = []
    for row in rows:
        record = {
            "run": row["run"],
            "gate": gate_label(row["gate"]),
            **{key: row.get(key) for key in extra_columns},
            "trainable_params": row["trainable_params"],
            "global_step": row["global_step"],
        }
        for metric in metrics:
            record |= {f"{metric}_{k}": row[scores][metric][k] for k in ("mean", "low", "high")}
        for metric in metrics:
            delta = (row.get("deltas") or {}).get(metric, {})
            record |= {f"delta_{metric}_{suffix}": delta.get(key) for suffix, key in delta_columns.items()}
        record |= {key: row["speed"][key] for key in speed_columns}
        record |= ratio_columns[row["run"]]
        records.append(record)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()
