"""The video QA comparison as Markdown (`comparison.md`: the verdict with its rule, accuracy, fusion ratio,
gates per layer and attention share per question kind, speed) and CSV (every number in its own column)."""

from __future__ import annotations

import csv
import io

from ...formatting import gate_label, signed, table
from ..common.speed import MEMORY_RATIO, ratio_csv_fields, speed_table, stats_by_run
from .data import KINDS
from .metrics import SPEED_COLUMNS, VERDICT_RULE

CLAIM = (
    "The article (its third use, multimodal fusion in video question answering): through the gate the model "
    "judges whether the current query depends more on the text description or on the visual features, and "
    "adjusts the fusion ratio dynamically."
)
LIMITS = (
    "What a gate can and cannot do here: an output gate scales a head's output per token (per query); it "
    "cannot move attention weight between frames or patches within a head. A fusion ratio above 0.5 says the "
    "cross-attention (frames) is let through more than the self-attention (passage and question) on the "
    "answer tokens; where in the frames a head looks is the softmax's doing, reported as the attention share."
)
GROUPS = ("all", *KINDS)


def _ci(score, scale: float = 1.0, digits: int = 2) -> str:
    if score is None:
        return "n/a"
    m, lo, hi = (scale * score[k] for k in ("mean", "low", "high"))
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _delta(delta, scale: float = 1.0, digits: int = 2) -> str:
    if delta is None:
        return "n/a"
    d, lo, hi = (scale * delta[k] for k in ("delta", "low", "high"))
    paired = "" if delta.get("paired", True) else ", unpaired"
    return (
        f"{signed(d, digits)} [{signed(lo, digits)}, {signed(hi, digits)}] (p={delta['p_value']:.3f}{paired})"
    )


def markdown_report(config, rows: list[dict], data: dict) -> str:
    level = f"{100 * config.confidence:g} %"
    sizes, counts = data["split_sizes"], data["test_questions_by_kind"]
    lines = [
        "# Video QA: does the gate weigh frames against text by question kind?",
        "",
        f"Data: `{data['source'].get('dataset')}` ({data['source'].get('kind')}), {sizes['train']} / "
        f"{sizes['validation']} / {sizes['test']} train / validation / test clips of "
        f"{config.clip_frames} frames at {config.image_size} px; test questions: "
        + ", ".join(f"{counts[k]} {k}" for k in KINDS)
        + f". Encoder `{config.encoder}` (frozen, features cached per frame); decoder `{config.decoder}`; "
        f"{rows[0]['global_step']} steps x {config.per_device_train_batch_size} questions per run, seed "
        f"{config.seed}.",
        "",
        "## Verdict",
        "",
        CLAIM,
        "",
        f"Rule (stated before the run): {VERDICT_RULE}.",
        "",
    ]
    judged = [row for row in rows if "verdict" in row]
    if judged:
        body = [
            [
                row["run"],
                _delta(row["kind_differences"]["frames-text"]["ratio"], 1, 3),
                "yes" if row["verdict"]["ratio_frames_above_text"] else "no",
                _delta(row["deltas"]["accuracy"]["all"]),
                "yes" if row["verdict"]["accuracy_not_worse"] else "no",
                f"**{row['verdict']['verdict']}** ({row['verdict']['why']})",
            ]
            for row in judged
        ]
        header = [
            "run",
            "ratio: frames - text",
            "CI > 0",
            "accuracy - baseline, points",
            "not worse",
            "verdict",
        ]
        lines.append(table(header, body))
    else:
        lines.append("No run gated on both cross- and self-attention beside a baseline: no verdict.")
    lines += ["", LIMITS, "", f"## Accuracy (exact match, %, [{level} bootstrap CI])", ""]
    body = [
        [r["run"], gate_label(r["gate"]), f"{r['trainable_params']:,}"]
        + [_ci(r["accuracy"][g]) for g in GROUPS]
        for r in rows
    ]
    lines.append(table(["run", "gate", "trained params", *GROUPS], body))
    gated = [r for r in rows if r.get("deltas")]
    if gated:
        lines += ["", f"Gated minus baseline, points [{level} paired bootstrap CI over test questions]", ""]
        body = [[r["run"]] + [_delta(r["deltas"]["accuracy"][g]) for g in GROUPS] for r in gated]
        lines.append(table(["run", *GROUPS], body))
    lines += [
        "",
        "## Fusion ratio on the answer tokens (cross gate / (cross + self gate))",
        "",
        f"Mean over test questions [{level} CI]; only where both cross- and self-attention are gated.",
        "",
    ]
    with_ratio = [r for r in rows if r["ratio"]["all"] is not None]
    body = [[r["run"]] + [_ci(r["ratio"][g], 1, 3) for g in GROUPS] for r in with_ratio]
    lines.append(table(["run", *GROUPS], body) if body else "No run with both gates.")
    lines += [
        "",
        "Between kinds (paired by clip where each clip has one question of each kind; accuracy and share in"
        " points, ratio as is):",
        "",
    ]
    pairs = list(rows[0]["kind_differences"])
    body = [
        [r["run"], measure]
        + [_delta(r["kind_differences"][p][measure], 100 if measure == "share" else 1, 3) for p in pairs]
        for r in rows
        for measure in ("ratio", "accuracy", "share")
        if measure != "ratio" or r in with_ratio
    ]
    lines.append(table(["run", "measure", *pairs], body))
    lines += ["", "Per layer, by kind (cross gate / self gate / ratio):", ""]
    body = []
    for r in rows:
        for kind in KINDS:
            layers = r["layers"][kind]
            if layers["cross"] is None:
                continue
            cells = []
            for layer, cross in enumerate(layers["cross"]):
                own = f"{cross:.3f}"
                if layers["self"] is not None:
                    own += f" / {layers['self'][layer]:.3f} / {layers['ratio_layers'][layer]:.3f}"
                cells.append(own)
            body.append([r["run"], kind, *cells])
    if body:
        lines.append(table(["run", "kind", *(f"layer {i}" for i in range(len(body[0]) - 2))], body))
    lines += [
        "",
        f"## Where the frames' attention falls (share on the objects the question names, %, [{level} CI])",
        "",
    ]
    body = [[r["run"]] + [_ci(r["share"][g], 100) for g in GROUPS] for r in rows]
    body.append(["uniform attention"] + [_ci(rows[0]["chance"][g], 100) for g in GROUPS])
    lines.append(table(["run", *GROUPS], body))
    speed = rows[0]["speed"]
    caption = (
        f"## Speed\n\nGreedy answers from the cached frame features, batches of {speed['batch_size']}, "
        f"{speed['examples']} test questions, interleaved rounds on `{speed['device']}`; peak MiB: weights."
    )
    lines += [
        "",
        *speed_table(rows, config.baseline.name if config.baseline else None, SPEED_COLUMNS, caption),
    ]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict], reference: str | None = "baseline") -> str:
    """One CSV row per run, every number in its own column (accuracy in %, shares and ratios as fractions)."""
    stats = stats_by_run(rows, reference, SPEED_COLUMNS)
    records = []
    for row in rows:
        record = {
            "run": row["run"],
            "gate": gate_label(row["gate"]),
            "trainable_params": row["trainable_params"],
        }
        for measure in ("accuracy", "ratio", "share"):
            for group in GROUPS:
                score = row[measure][group] or {}
                record |= {f"{measure}_{group}_{k}": score.get(k) for k in ("mean", "low", "high")}
                delta = ((row.get("deltas") or {}).get(measure) or {}).get(group) or {}
                if measure != "ratio":
                    record |= {f"delta_{measure}_{group}_{k}": delta.get(k) for k in ("delta", "low", "high")}
        diff = row["kind_differences"]["frames-text"]["ratio"] or {}
        record |= {f"ratio_frames_minus_text_{k}": diff.get(k) for k in ("delta", "low", "high")}
        record["verdict"] = row.get("verdict", {}).get("verdict")
        record["answers_per_s"] = row["speed"]["answers_per_s"]
        record |= ratio_csv_fields(stats.get(row["run"]), (*(c.ratio for c in SPEED_COLUMNS), MEMORY_RATIO))
        records.append(record)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()
