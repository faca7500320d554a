"""Number and table formatting shared by the model cards and the recipes' reports (Markdown)."""

from __future__ import annotations

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
    return "n/a" if value is None else f"{value:+.1f} %"


def gate_label(gate: dict | None, baseline: str = "none (baseline)") -> str:
    """`variant/granularity[ top-k[ kv groups]]` of a gate config dict; `baseline` for `None`."""
    if gate is None:
        return baseline
    label = f"{gate['variant']}/{gate['granularity']}"
    if gate.get("top_k"):
        label += f" top-{gate['top_k']}" + (" kv groups" if gate.get("top_k_unit") == "kv_group" else "")
    return label
