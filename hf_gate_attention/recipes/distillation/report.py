"""`DISTILLATION.md` written from a distillation comparison's results: a plain verdict per question.

hf-gate-attention recipe distillation report results/distill --out results/DISTILLATION.md
(also `python -m hf_gate_attention.recipes.distillation.report ...`, the command the committed report names)

Questions, each answered on the ROUGE-L paired bootstrap delta between two students (same data, seed and
budget): does logit KD help the student (a run with `alpha_kd > 0, alpha_gate = 0` vs the student trained
alone), and does gate matching add to it (a run with `alpha_gate > 0` vs the run with the same `alpha_kd` and
`alpha_gate = 0`). Rule: *reproduced* when the CI lies above 0, *not reproduced* when it lies at or below 0,
*inconclusive* when it contains 0 (no equivalence margin is claimed).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...files import read_json
from ...formatting import gate_label
from ..common.reports import report_main
from ..common.summaries.report import rouge_deltas
from .compare import comparison_tables

RULE = (
    "Each answer compares two students on ROUGE-L, paired by test example: *reproduced* when the paired "
    "{level} bootstrap CI of the delta lies above 0, *not reproduced* when it lies at or below 0 (no gain), "
    "*inconclusive* when it contains 0."
)


def verdict(delta: dict) -> str:
    """`reproduced` / `not reproduced` / `inconclusive` for a paired delta `{"delta", "low", "high"}`."""
    if delta["low"] > 0:
        return "reproduced"
    return "not reproduced" if delta["high"] <= 0 else "inconclusive"


def overall(verdicts: list[str]) -> str:
    """One answer from several pairs: all alike gives that verdict, else (or none) inconclusive."""
    return verdicts[0] if verdicts and len(set(verdicts)) == 1 else "inconclusive"


def question_pairs(runs: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """`{question: [(run, reference run)]}` from the comparison's runs (`{name, alpha_kd, alpha_gate}`)."""
    alone = next((r["name"] for r in runs if r["alpha_kd"] == r["alpha_gate"] == 0), None)
    kd_only = {r["alpha_kd"]: r["name"] for r in runs if r["alpha_kd"] > 0 and r["alpha_gate"] == 0}
    return {
        "Does logit KD help the student?": [(name, alone) for name in kd_only.values() if alone],
        "Does gate matching add to logit KD?": [
            (r["name"], kd_only[r["alpha_kd"]])
            for r in runs
            if r["alpha_gate"] > 0 and r["alpha_kd"] in kd_only
        ],
    }


def distillation_report(results: str | Path, command: str) -> str:
    """Markdown: the verdicts with their rule, the setup and the measured tables."""
    results = Path(results)
    comparison = read_json(results / "comparison.json")
    if comparison is None:
        raise FileNotFoundError(f"{results} holds no comparison.json: run the distillation recipe first")
    config, rows = comparison["config"], comparison["runs"]
    quality = {row["run"]: read_json(results / row["run"] / "metrics.json")["quality"] for row in rows}
    level = f"{100 * config['confidence']:g} %"
    stats = (config["n_bootstrap"], config["confidence"], config["seed"])
    lines_verdicts, lines_pairs = [], []
    for question, pairs in question_pairs(config["runs"]).items():
        verdicts = []
        for run, reference in pairs:
            delta = rouge_deltas(quality[run], quality[reference], *stats)["rougeL"]
            verdicts.append(verdict(delta))
            lines_pairs.append(
                f"| {question} | {run} vs {reference} | {delta['delta']:+.2f} [{delta['low']:+.2f}, "
                f"{delta['high']:+.2f}] | {verdicts[-1]} |"
            )
        answer = overall(verdicts) if pairs else "not measured (no such pair of runs)"
        lines_verdicts.append(f"- {question} **{answer}**.")
    teacher, student = comparison["teacher"], comparison["student"]
    return "\n".join(
        [
            "# Distillation of gating into a smaller model",
            "",
            f"Written by `{command}` from `{results}/` (tables: `comparison.md`, per run "
            "`<run>/metrics.json`).",
            "",
            "## Verdicts",
            "",
            *lines_verdicts,
            "",
            RULE.format(level=level),
            "",
            "| question | pair | ROUGE-L delta, points [CI] | verdict |",
            "|---|---|---|---|",
            *lines_pairs,
            "",
            "## Setup",
            "",
            f"- Teacher: `{teacher['folder']}` ({teacher['layers']} layers, gate "
            f"{gate_label(teacher['gate'])}), frozen.",
            f"- Student: `{student['source']}` with {student['layers']} layers ({student['parameters']:,} "
            f"parameters); student layer i <- teacher layer `layer_map[i]` = {comparison['layer_map']}.",
            f"- Loss: task + alpha_kd * T^2 * KL (T = {config['temperature']:g}, summary tokens) + "
            "alpha_gate * gate MSE (non-padding tokens, mapped layers).",
            f"- Data `{config['dataset']}`, {config['max_steps']} steps x batch "
            f"{config['per_device_train_batch_size']}, seed {config['seed']}, identical for every student.",
            "",
            "## Measured",
            "",
            comparison_tables(rows, config["confidence"], comparison["reference"]).rstrip(),
            "",
            "Plots: `loss_curves.png` (task loss), `rouge.png`, `speed.png` in the results folder.",
            "",
        ]
    )


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return report_main(
        argv,
        "hf_gate_attention.recipes.distillation.report",
        distillation_report,
        "results/DISTILLATION.md",
        prog,
    )


if __name__ == "__main__":
    sys.exit(main())
