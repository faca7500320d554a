"""The captioning comparison as Markdown (`comparison.md`: verdict, caption quality, where attention falls,
gates by word class, diagnostics, speed) and CSV (every number in its own column)."""

from __future__ import annotations

import csv
import io

from ...diagnostics.report import summary_table
from ...formatting import gate_label, signed, table
from ..common.speed import MEMORY_RATIO, ratio_csv_fields, speed_table, stats_by_run
from .metrics import ATTENTION_METRICS, QUALITY_LABELS, SPEED_COLUMNS, VERDICT_RULE, WORD_CLASSES

CLAIM = (
    'The article (section 3.2): when generating "a woman in red", the model strengthens, through the gate, '
    'the attention on the "red region" and suppresses the background.'
)
ATTENTION_LABELS = {
    "share_weighted": "object share, gate-weighted heads",
    "share_plain": "object share, plain mean of heads",
    "sink": "sink share",
}


def _ci(score: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if score is None:
        return "n/a"
    values = [scale * score[k] for k in ("mean", "low", "high")]
    return f"{values[0]:.{digits}f} [{values[1]:.{digits}f}, {values[2]:.{digits}f}]"


def _delta(delta: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if delta is None:
        return "n/a"
    d, low, high = (scale * delta[k] for k in ("delta", "low", "high"))
    return f"{signed(d, digits)} [{signed(low, digits)}, {signed(high, digits)}] (p={delta['p_value']:.3f})"


def _verdict_lines(rows: list[dict], level: str) -> list[str]:
    gated = [row for row in rows if "verdict" in row]
    if not gated:
        return ["No gated run compared with an ungated baseline: no verdict."]
    body = [
        [
            row["run"],
            _delta(row["deltas"]["share_weighted"], 100),
            _delta(row["deltas"]["share_plain"], 100),
            _delta(row["gate_contrast"], 1, 3),
            f"**{row['verdict']['verdict']}** ({row['verdict']['why']})",
        ]
        for row in gated
    ]
    header = ["run", "object share - baseline's, points", "the same, plain mean of heads (not in the rule)"]
    header += ["gate: visual - function words", "verdict"]
    return [
        CLAIM,
        "",
        f"Rule: {VERDICT_RULE}. Intervals: {level} paired bootstrap over test captions (p: share of "
        "resamples <= 0).",
        "",
        table(header, body),
    ]


def markdown_report(config, rows: list[dict], data: dict, diagnostics: dict) -> str:
    level = f"{100 * config.confidence:g} %"
    sizes = data["split_sizes"]
    first = rows[0]
    source = data["source"]
    lines = [
        "# Captioning: does the gate look where the caption points?",
        "",
        f"Data: `{source.get('dataset')}` ({source.get('kind')}), {sizes['train']} / {sizes['validation']} / "
        f"{sizes['test']} train / validation / test images at {config.image_size} px. Encoder "
        f"`{config.encoder}` (frozen, features cached); decoder `{config.decoder}`"
        + (
            f" ({config.decoder_layers} layers x {config.decoder_hidden_size}, {config.decoder_heads} heads)"
            if config.decoder.startswith("scratch")
            else ""
        )
        + f"; {first['global_step']} steps x {config.per_device_train_batch_size} captions per run, seed "
        f"{config.seed}.",
        "",
        "## Verdict on the article's claim",
        "",
        *_verdict_lines(rows, level),
        "",
        f"## Caption quality (greedy, test split, in %, mean [{level} bootstrap CI])",
        "",
    ]
    metrics = list(first["quality"])
    labels = [QUALITY_LABELS[m] for m in metrics]
    body = [
        [row["run"], gate_label(row["gate"]), f"{row['trainable_params']:,}", str(row["global_step"])]
        + [_ci(row["quality"][m]) for m in metrics]
        for row in rows
    ]
    lines += [table(["run", "gate", "trained params", "steps", *labels], body)]
    gated = [row for row in rows if row.get("deltas")]
    if gated:
        lines += ["", f"Delta vs baseline in points [{level} paired bootstrap CI]", ""]
        lines.append(
            table(["run", *labels], [[r["run"]] + [_delta(r["deltas"][m]) for m in metrics] for r in gated])
        )
    lines += [
        "",
        "## Where cross-attention falls (teacher forcing on the reference captions)",
        "",
        "Per step that emits a word naming an object (its colour or shape): the share of the cross-attention "
        "weight on that object's patches, averaged over heads weighting each by its gate value (ungated: the "
        "plain mean), then over layers; also the plain mean over heads (what the weights themselves do: a "
        "gate per head and token scales a head's output, it cannot move weight between patches). Sink share: "
        "per step and head, the weight on the most-attended key outside every object (background patches, "
        "CLS). In %, mean over test captions [" + level + " CI].",
        "",
    ]
    chance = first["share_chance"]
    body = [[row["run"]] + [_ci(row["attention"][m], 100) for m in ATTENTION_METRICS] for row in rows]
    lines.append(table(["run", *(ATTENTION_LABELS[m] for m in ATTENTION_METRICS)], body))
    if chance is not None:
        lines += ["", f"Uniform attention would put {100 * chance['mean']:.2f} % on the named object's keys."]
    if gated:
        lines += ["", f"Delta vs baseline in points [{level} paired bootstrap CI]", ""]
        body = [[r["run"]] + [_delta(r["deltas"][m], 100) for m in ATTENTION_METRICS] for r in gated]
        lines.append(table(["run", *(ATTENTION_LABELS[m] for m in ATTENTION_METRICS)], body))
    layered = [row for row in rows if row["share_layers"]]
    if layered:
        count = len(layered[0]["share_layers"])
        lines += ["", "Object share (gate-weighted) per cross-attention layer, in %:", ""]
        body = [[r["run"]] + [f"{100 * v:.2f}" for v in r["share_layers"]] for r in layered]
        lines.append(table(["run", *(f"layer {i}" for i in range(count))], body))
    with_gates = [row for row in rows if row["gates"]]
    if with_gates:
        lines += [
            "",
            "## Cross-attention gate values by the word a step emits",
            "",
            "Mean over heads and layers of the cross-attention gate at the step that emits the word (visual: "
            "colours and shapes; function: a, of; relation: left, right, above, below; end: the end token), "
            f"mean over test captions [{level} CI]; last column: visual - function, paired by caption.",
            "",
        ]
        body = [
            [row["run"]]
            + [_ci(row["gates"][cls], 1, 3) for cls in WORD_CLASSES if cls != "other"]
            + [_delta(row["gate_contrast"], 1, 3)]
            for row in with_gates
        ]
        header = ["run", *(cls for cls in WORD_CLASSES if cls != "other"), "visual - function"]
        lines.append(table(header, body))
    if diagnostics:
        lines += [
            "",
            '## Diagnostics (`diagnose(..., part="decoder")`: decoder self-attention, cross gates beside)',
            "",
            f"First {min(16, sizes['test'])} test images with their reference captions; query 0 left out.",
            "",
            summary_table(diagnostics),
        ]
    speed = first["speed"]
    caption = (
        f"## Speed\n\nGreedy captioning from the cached encoder outputs (the frozen encoder is the same in "
        f"every run), batches of {speed['batch_size']}, {speed['examples']} test images, up to "
        f"{speed['max_new_tokens']} tokens, interleaved rounds on `{speed['device']}`; on a shared machine "
        "the ratios are noisy."
    )
    reference = config.baseline.name if config.baseline else None
    lines += ["", *speed_table(rows, reference, SPEED_COLUMNS, caption)]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict], reference: str | None = "baseline") -> str:
    """One CSV row per run, every number in its own column (quality in %, shares as fractions)."""
    stats = stats_by_run(rows, reference, SPEED_COLUMNS)
    names = (*(column.ratio for column in SPEED_COLUMNS), MEMORY_RATIO)
    records = []
    for row in rows:
        record = {
            "run": row["run"],
            "gate": gate_label(row["gate"]),
            "trainable_params": row["trainable_params"],
            "global_step": row["global_step"],
        }
        groups = {**row["quality"], **row["attention"], "share_chance": row["share_chance"]}
        groups |= {f"gate_{cls}": (row["gates"] or {}).get(cls) for cls in WORD_CLASSES}
        for name, score in groups.items():
            record |= {f"{name}_{k}": (score or {}).get(k) for k in ("mean", "low", "high")}
        deltas = {**(row.get("deltas") or {}), "gate_visual_minus_function": row["gate_contrast"]}
        for name in (*row["quality"], *ATTENTION_METRICS, "gate_visual_minus_function"):
            delta = deltas.get(name) or {}
            record |= {f"delta_{name}_{k}": delta.get(k) for k in ("delta", "low", "high", "p_value")}
        record["verdict"] = row.get("verdict", {}).get("verdict")
        record |= {
            key: row["speed"][key] for key in ("captions_per_s", "seconds_per_batch", "peak_memory_mb")
        }
        record |= ratio_csv_fields(stats.get(row["run"]), names)
        records.append(record)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()
