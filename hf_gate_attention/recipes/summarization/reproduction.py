"""The verdicts on the source article's claims, and `REPRODUCTION.md` written from a comparison's results.

python -m hf_gate_attention.recipes.summarization.reproduction results/reproduce --out results/REPRODUCTION.md
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from ...claims import ROUGE_L_CLAIM_PERCENT, SPEEDUP_CLAIM, rouge_verdict, round_speedups, speed_verdict
from ...files import read_json
from ...formatting import gate_label, signed_percent
from ..common.reports import report_main
from ..common.speed import NOISY_NOTE, ratio_cell, ratio_summary, round_ratios
from ..common.summaries.report import SPEED_COLUMNS, markdown_table, rouge_deltas
from .lengths import LENGTHS_FOLDER, LENGTHS_REPORT, length_rows, lengths_table

# `benchmarks/long_document.py`'s results, relative to the project's root: (CSV, the command that wrote it,
# its documents, its cases); a section each, left out where the file is missing
TRAINED_CASES = "the runs' trained models that have their weights, at 1k to 8k tokens"
LONG_DOCUMENT_RESULTS = (
    (
        "benchmarks/results/long_document_trained_text.csv",
        "python benchmarks/long_document.py --trained results/reproduce --real-text --lengths 1024 2048 4096 "
        "8064 --out benchmarks/results/long_document_trained_text",
        "the longest test paper's prompt",
        TRAINED_CASES,
    ),
    (
        "benchmarks/results/long_document_trained.csv",
        "python benchmarks/long_document.py --trained results/reproduce --out "
        "benchmarks/results/long_document_trained",
        "random token ids",
        TRAINED_CASES,
    ),
    (
        "benchmarks/results/long_document.csv",
        "python benchmarks/long_document.py --out benchmarks/results/long_document",
        "random token ids, untrained gates",
        "the runs' gate configurations with random gates, which keep the runs' number of groups per token, "
        "at 1k to 8k tokens",
    ),
    (
        "benchmarks/results/long_document_1k.csv",
        "python benchmarks/long_document.py --lengths 1024 --rounds 5 --out "
        "benchmarks/results/long_document_1k",
        "the runs' 1,024 tokens, random ids, untrained gates",
        "the runs' gate configurations with random gates, which keep the runs' number of groups per token",
    ),
)
GPU_COMMAND = (
    "accelerate launch --config_file recipes/summarization/accelerate/fsdp.yaml \\\n"
    "    -m hf_gate_attention recipe summarization --config recipes/summarization/configs/gpu.yaml"
)


def _overall(verdicts: list[str]) -> str:
    if "reproduced" in verdicts:
        return "reproduced"
    return "not reproduced" if set(verdicts) == {"not reproduced"} else "inconclusive"


def _setup(config: dict, baseline: dict) -> str:
    quality, speed, training = baseline["quality"], baseline["speed"], baseline["training"]
    rows = {
        "model": f"`{config['model']}`",
        "data": f"`{config['dataset']}`, {quality['num_examples']} test examples (used only here)",
        "prompt": f"{config['doc_token_budget']} tokens, documents truncated `{config['truncation']}`",
        "targets": f"up to {config['max_summary_tokens']} summary tokens, loss on the summary only",
        "training": f"`{config['train']}`, {baseline['global_step']} steps x effective batch "
        f"{training.get('effective_batch_size')}, seed {config['seed']}, identical for every run",
        "learning rates": f"{config['learning_rate']:g} (gates {config['gate_learning_rate']:g})",
        "generation": f"greedy, up to {config['max_new_tokens']} new tokens",
        "speed": f"{config['speed_examples']} test prompts, batch 1, {speed['new_tokens']} decoded tokens, "
        f"{len(speed['rounds'])} interleaved rounds, device `{speed['device']}`",
        "CIs": f"{100 * config['confidence']:g} % bootstrap, {config['n_bootstrap']} resamples",
    }
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows.items())])


def _validation_losses(metrics: dict[str, dict]) -> list[str]:
    """A table of each run's last validation loss (none if no run was evaluated)."""
    rows = []
    for name, run in metrics.items():
        evaluations = [e for e in run["training"]["log_history"] if "eval_loss" in e]
        if evaluations:
            last = evaluations[-1]
            rows.append(f"| {name} | {last['eval_loss']:.3f} | {last['step']} |")
    if not rows:
        return []
    return [
        "",
        "Validation loss (token cross-entropy on the validation examples, last evaluation of the training)",
        "",
        "| run | validation loss | step |",
        "|---|---:|---:|",
        *rows,
    ]


SPEEDUP = next(column for column in SPEED_COLUMNS if column.ratio == "speedup")

# the goal for sparse top-k (issue 25): ROUGE-L within this many points of the same gate without top-k
SPARSE_TOLERANCE_POINTS = 1.0
SPARSE_FIELDS = ("top_k", "top_k_unit", "top_k_sink", "top_k_window")


def _dense_of(gate: dict, metrics: dict[str, dict]) -> dict | None:
    """The run whose gate is `gate` without top-k (same variant, granularity, init, layers), if any."""
    for run in metrics.values():
        other = run["gate"]
        dense = other is not None and other.get("top_k") is None
        if dense and all(other.get(k) == gate.get(k) for k in gate if k not in SPARSE_FIELDS):
            return run
    return None


def _last_validation_loss(run: dict) -> str:
    losses = [e["eval_loss"] for e in run["training"]["log_history"] if "eval_loss" in e]
    return f"{losses[-1]:.3f}" if losses else "-"


def _sparse_against_dense(metrics: dict[str, dict], config: dict) -> list[str]:
    """Each top-k run against the same gate without top-k: paired ROUGE-L delta, the 1-point goal,
    validation losses and the speed-up per summary over the dense gate (median of the rounds [range])."""
    rows, noisy = [], False
    for run in metrics.values():
        gate = run["gate"]
        dense = None if gate is None or gate.get("top_k") is None else _dense_of(gate, metrics)
        if dense is None:
            continue
        delta = rouge_deltas(
            run["quality"], dense["quality"], config["n_bootstrap"], config["confidence"], config["seed"]
        )["rougeL"]
        goal = -SPARSE_TOLERANCE_POINTS
        kept = "yes" if delta["low"] >= goal else "no" if delta["high"] < goal else "inconclusive"
        speedup = ratio_summary(round_ratios(run["speed"], dense["speed"], SPEEDUP))
        noisy = noisy or speedup["noisy"]
        rows.append(
            f"| {run['run']} | {gate_label(gate)} | {run['rouge']['rougeL']['mean']:.2f} | "
            f"{delta['delta']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}] | {kept} | "
            f"{_last_validation_loss(run)} ({_last_validation_loss(dense)}) | "
            f"{ratio_cell(speedup)} |"
        )
    if not rows:
        return []
    level = f"{100 * config['confidence']:g} %"
    return [
        "",
        "## Sparse top-k against the same gate without it",
        "",
        f"Goal: ROUGE-L within {SPARSE_TOLERANCE_POINTS:g} point of the dense gate: *yes* when the whole "
        f"paired {level} CI of the delta lies above -{SPARSE_TOLERANCE_POINTS:g}, *no* when it lies below, "
        "*inconclusive* otherwise. Speed-up: dense seconds per summary / sparse, per interleaved round: "
        "the median [lowest, highest round].",
        "",
        "| run | gate | ROUGE-L | delta vs dense, points [CI] | within 1 point | validation loss (dense) "
        "| speed-up vs dense [rounds] |",
        "|---|---|---:|---|---|---|---|",
        *rows,
        *(["", NOISY_NOTE] if noisy else []),
    ]


def _long_documents(
    path: Path, command: str, documents: str, cases: str = TRAINED_CASES
) -> tuple[list[str], str]:
    """The speed claim judged per document length, from `benchmarks/long_document.py`'s CSV at `path`
    written by `command` on `documents` for `cases` (its rows per length and case, the reference case first;
    the profile rows have no speed-up): the lines of a section and the sentence saying where the claim
    holds; `([], "")` where `path` is missing."""
    if not path.is_file():
        return [], ""
    with path.open(newline="", encoding="utf-8") as file:
        rows = [row for row in csv.DictReader(file) if row.get("speedup")]
    reference = rows[0]["case"] if rows else None
    cells, reproduced_at = [], []
    for row in rows:
        ranges = {
            name: (float(row[name]), float(row[f"{name}_low"]), float(row[f"{name}_high"]))
            for name in ("speedup", "speedup_vs_dense")
        }
        verdict = "" if row["case"] == reference else speed_verdict(list(ranges["speedup"][1:]))
        if verdict == "reproduced":
            reproduced_at.append(f"{row['case']} at {int(row['length']):,} tokens")
        cells.append(
            f"| {int(row['length']):,} | {row['case']} | x{float(row['prefill_time_ratio']):.3f} "
            f"| x{float(row['decode_time_ratio']):.3f} | "
            + " | ".join("x{:.3f} [{:.3f}, {:.3f}]".format(*ranges[name]) for name in ranges)
            + f" | {verdict} |"
        )
    holds = "+18 % claim holds in every round for: " + (", ".join(reproduced_at) or "no case, at no length")
    section = [
        "",
        f"## Speed at long-document lengths: {documents}",
        "",
        f"From `{path}` (`{command}`, whose header gives the setup): {cases}, on {documents}; "
        f"`{reference}` is the reference. One summary = the "
        "prefill of the document and its decoded tokens. Time ratios: case / reference, prefill and decode "
        "apart (below 1 is faster); speed-ups per summary and the verdict by the rule above, per length.",
        "",
        "| document tokens | case | prefill time ratio | decode time ratio | speed-up per summary [rounds] "
        "| vs the dense gate [rounds] | +18 % claim |",
        "|---:|---|---:|---:|---|---|---|",
        *cells,
        "",
        f"The {holds}.",
    ]
    return section, holds


def _quality_at_lengths(results: Path) -> tuple[list[str], str]:
    """The ROUGE-L claim judged per prompt length, from `recipe summarization lengths` (`lengths.md`'s
    table): the lines of a section and the sentence saying where the claim holds; `([], "")` where no
    longer length was evaluated."""
    if not (results / LENGTHS_FOLDER).is_dir():
        return [], ""
    rows = length_rows(results)
    reproduced = [
        f"{row['run']} at {row['length']:,} tokens" for row in rows if row["verdict"] == "reproduced"
    ]
    holds = f"+{ROUGE_L_CLAIM_PERCENT} % ROUGE-L claim holds for: " + (
        ", ".join(reproduced) or "no run, at no length"
    )
    section = [
        "",
        "## Quality at long-document lengths",
        "",
        f"From `{results / LENGTHS_REPORT}` (`hf-gate-attention recipe summarization lengths {results} "
        "--tokens ...`): the trained runs' summaries of the same test papers, cut to each length. ROUGE-L "
        "with its CI, deltas against the baseline at the same length, verdicts by the rule above.",
        "",
        lengths_table(rows),
        "",
        f"The {holds}.",
    ]
    return section, holds


def reproduction_report(
    results: str | Path, command: str, long_documents: tuple = LONG_DOCUMENT_RESULTS
) -> str:
    """Markdown: the claims, the setup, the measured tables and a verdict per claim and gated run; the speed
    claim per document length from each of `long_documents` (`LONG_DOCUMENT_RESULTS`) that exists."""
    results = Path(results)
    comparison = read_json(results / "comparison.json")
    if comparison is None:
        raise FileNotFoundError(f"{results} holds no comparison.json: run the summarization recipe first")
    config, rows = comparison["config"], comparison["runs"]
    metrics = {row["run"]: read_json(results / row["run"] / "metrics.json") for row in rows}
    baseline = next((m for m in metrics.values() if m["gate"] is None), None)
    if baseline is None:
        raise ValueError(f"{results} has no baseline run (gate: null); the claims compare against one")
    gated = [m for m in metrics.values() if m["gate"] is not None]
    base_rouge_l = baseline["rouge"]["rougeL"]["mean"]
    claim_points = base_rouge_l * ROUGE_L_CLAIM_PERCENT / 100

    verdict_rows, rouge_verdicts, speed_verdicts, noisy = [], [], [], False
    for run in gated:
        delta, speedups = run["deltas"]["rougeL"], round_speedups(run, baseline)
        speedup = ratio_summary(speedups)
        noisy = noisy or speedup["noisy"]
        rouge_verdicts.append(rouge_verdict(delta, base_rouge_l))
        speed_verdicts.append(speed_verdict(speedups))
        verdict_rows.append(
            f"| {run['run']} | {delta['delta']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}] "
            f"({signed_percent(delta['percent'])}) | {rouge_verdicts[-1]} | {ratio_cell(speedup)} "
            f"| {speed_verdicts[-1]} |"
        )
    level = f"{100 * config['confidence']:g} %"
    speed_at_lengths = [
        (documents, cases, *_long_documents(Path(path), command, documents, cases))
        for path, command, documents, cases in long_documents
    ]
    quality_lines, quality_holds = _quality_at_lengths(results)
    lines = [
        "# Reproduction of the source article's claims",
        "",
        f"Written by `{command}` from `{results}/` (tables: `comparison.md`, per run `<run>/metrics.json`).",
        "",
        "## Claims",
        "",
        f"The source article claims that gated attention improves long-document summarization by **ROUGE-L "
        f"+{ROUGE_L_CLAIM_PERCENT} %** and **inference speed +{100 * (SPEEDUP_CLAIM - 1):.0f} %**.",
        "",
        "## Verdicts",
        "",
        f"- ROUGE-L +{ROUGE_L_CLAIM_PERCENT} %: **{_overall(rouge_verdicts)}**.",
        f"- Inference speed +{100 * (SPEEDUP_CLAIM - 1):.0f} %: **{_overall(speed_verdicts)}**.",
        *(
            f"- At long-document lengths ({cases}, timed on {documents}; section *Speed at long-document "
            f"lengths: {documents}*): the {holds}."
            for documents, cases, section, holds in speed_at_lengths
            if section
        ),
        *(
            [
                "- At longer prompts (the trained runs' test summaries with the papers cut to each length; "
                f"section *Quality at long-document lengths*): the {quality_holds}."
            ]
            if quality_lines
            else []
        ),
        "",
        f"Baseline ROUGE-L {base_rouge_l:.2f}, so the claimed gain is {claim_points:+.2f} points. "
        f"ROUGE-L: *reproduced* for a significant gain (paired {level} CI above 0) at least that large, "
        "*not reproduced* when the whole CI lies below it, *inconclusive* otherwise (the CI holds the "
        f"claim). Speed: *reproduced* when every interleaved round is >= x{SPEEDUP_CLAIM} faster per "
        "summary, *not reproduced* when no round is, *inconclusive* otherwise. The speed-ups below were "
        "timed when the runs were trained, with the code of then; the sections *Speed at long-document "
        "lengths* time the same gates later, each with the code of its date (in its CSV's Markdown page), "
        "the last one at the runs' own 1,024 tokens.",
        "",
        "| run | ROUGE-L delta, points [CI] (relative) | ROUGE-L claim | speedup (median [rounds]) "
        "| speed claim |",
        "|---|---|---|---|---|",
        *verdict_rows,
        *(["", NOISY_NOTE] if noisy else []),
        "",
        "## Setup",
        "",
        _setup(config, baseline),
        "",
        "## Measured",
        "",
        markdown_table(rows, config["confidence"], reference=baseline["run"]).rstrip(),
        *_validation_losses(metrics),
        *_sparse_against_dense(metrics, config),
        "",
        "Plots: `loss_curves.png`, `rouge.png`, `speed.png` in the results folder.",
        *(line for _, _, section, _ in speed_at_lengths for line in section),
        *quality_lines,
        "",
        "## Reading these numbers",
        "",
        "- The article does not state its model, data or budget; this run fine-tunes a pretrained 135M model "
        "with gates added at identity, which is not the paper's setting (gates trained from scratch). The "
        "paper's own appendix finds little change when gates are added during continued training. "
        "Attention sinks, massive activations and gate values of these models: "
        "`results/diagnostics/DIAGNOSTICS.md` (`make diagnose`); gates trained from scratch, the paper's "
        "setting, at a small scale: `results/STUDY.md` (`make study`).",
        "- A dense gate adds a projection and a multiply and skips nothing, so a speed-up is not expected "
        "from it. A run with `top_k` (variants `output`/`qk`) skips the attention of the heads or key/value "
        "groups it drops (`hf_gate_attention/core/sparse.py`); the projections and the rest of the layer "
        "still run, so the saving grows with the context and is small at these prompt lengths "
        "(`benchmarks/decode.py` measures it up to 8k tokens). CPU timings are noisy even interleaved.",
        "- With `top_k_sink`/`top_k_window` (runs `...-sink4-window64`) a dropped group is not zeroed: it "
        "attends to the first 4 and the last 64 keys its query sees (`hf_gate_attention/core/streaming.py`). "
        "On the CPU this costs time at these lengths: at decode each dropped group adds an attention over "
        "its 68 gathered keys, and in prefill every head's reads are computed in blocks of rows "
        "(`benchmarks/results/decode_sink_window.md` at 1k to 8k tokens, "
        "`benchmarks/results/sparse_prefill_train.md`). From 2,048 tokens a prefill without gradients "
        "skips the rows that drop a group (`benchmarks/results/sparse_prefill.md`); the speed per document "
        "length: `benchmarks/results/long_document_trained.md` (trained runs) and "
        "`benchmarks/results/long_document.md` (untrained gates of every run's shape).",
        "- A GPU-scale run would use `recipes/summarization/configs/gpu.yaml`: SmolLM2-1.7B-Instruct, "
        "GovReport (`ccdv/govreport-summarization`), 7,160-token prompts (head+tail), up to 1,024 summary "
        "tokens, bf16, one epoch, the full 973-report test split, the four dense runs:",
        "",
        "```bash",
        GPU_COMMAND,
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return report_main(
        argv,
        "hf_gate_attention.recipes.summarization.reproduction",
        reproduction_report,
        "results/REPRODUCTION.md",
    )


if __name__ == "__main__":
    sys.exit(main())
