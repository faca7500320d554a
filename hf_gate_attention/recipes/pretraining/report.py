"""Report of the pretraining study: `STUDY.md` (setup, tables, plots, one verdict per paper claim) and
`study.json`, from the jobs' `metrics.json` files. Jobs not finished yet are listed as missing.

    hf-gate-attention recipe pretraining report results/study --out results/STUDY.md
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

from ...diagnostics.callback import per_layer
from ...files import atomic_write_json, atomic_write_text, read_json
from ...formatting import gate_label, table
from ...plotting import pyplot, save_figure
from .config import CONFIG_FILE, StudyConfig
from .data import prepare_data
from .train import METRICS_FILE, build_model

# two-sided 95 % Student t quantiles by degrees of freedom (CIs over seeds)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
SINK_THRESHOLD = 0.1  # mean first-token attention above which the baseline is said to have a sink
MASSIVE_RATIO = 20.0  # max |hidden| / median |hidden| above which activations are said to be massive
# Qiu et al. 2025 (15B-total MoE, 400B tokens): baseline -> SDPA output gate, elementwise (headwise)
PAPER = {
    "sink": "first-token attention 0.467 -> 0.048 (headwise 0.073)",
    "activation": "max activation 1053 -> 94 (headwise 98)",
    "perplexity": "perplexity 6.026 -> 5.761 (headwise 5.792)",
    "lr": "the baseline diverges at lr 8e-3, where the gated models still train",
}
METRICS = (
    ("validation_loss", "val loss", "{:.3f}"),
    ("test_loss", "test loss", "{:.3f}"),
    ("test_perplexity", "test ppl", "{:.1f}"),
    ("first_token_attention", "first-token attn", "{:.3f}"),
    ("top1_attention", "top-1 attn", "{:.3f}"),
    ("max_activation", "max \\|h\\|", "{:.1f}"),
    ("gate_mean", "gate mean", "{:.3f}"),
    ("gate_below_0.1", "gates < 0.1", "{:.3f}"),
)


def mean_ci(values: list[float]) -> dict:
    """Mean and 95 % t-interval over seeds (`low` = `high` = mean for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "low": mean, "high": mean, "n": len(values)}
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(values)}


def _value(metrics: dict, key: str) -> float | None:
    """A metric of a finished job: its own, a final diagnostic, or the last logged validation loss."""
    if key == "validation_loss":
        losses = [h["eval_loss"] for h in metrics["log_history"] if "eval_loss" in h]
        return losses[-1] if losses else None
    return metrics.get(key, metrics["diagnostics"].get(key))


def load_jobs(config: StudyConfig) -> dict[str, dict | None]:
    """Job name -> its metrics (`None` while not finished), in `config.jobs()` order."""
    return {job.name: read_json(config.run_dir / "jobs" / job.name / METRICS_FILE) for job in config.jobs()}


def main_comparison(config: StudyConfig, metrics: dict) -> dict[str, dict]:
    """Run name -> metric -> mean/CI over the seeds finished at the main learning rate."""
    rows = {}
    for run in config.runs:
        finished = _main_jobs(config, run.name, metrics)
        if finished:
            rows[run.name] = {
                key: mean_ci([v for m in finished if (v := _value(m, key)) is not None])
                for key, _, _ in METRICS
                if _value(finished[0], key) is not None
            }
    return rows


def _cell(stats: dict, fmt: str) -> str:
    if stats["n"] < 2:
        return fmt.format(stats["mean"])
    return f"{fmt.format(stats['mean'])} [{fmt.format(stats['low'])}, {fmt.format(stats['high'])}]"


def _separated(lower: dict, upper: dict) -> bool:
    """Whether `lower`'s interval lies entirely below `upper`'s (both need >= 2 seeds)."""
    return lower["n"] > 1 and upper["n"] > 1 and lower["high"] < upper["low"]


def verdicts(config: StudyConfig, rows: dict, sweep: dict, metrics: dict) -> dict[str, str]:
    """One verdict per claim ("reproduced at this scale" / "not reproduced" / "inconclusive", with why),
    comparing the baseline with the first gated main run; the rules are stated in the report."""
    baseline = config.baseline
    gated = next((n for n in config.main_runs if baseline is None or n != baseline.name), None)
    if baseline is None or gated is None or baseline.name not in rows or gated not in rows:
        return dict.fromkeys(PAPER, "inconclusive: the baseline or the gated main run has not finished")
    base, gate = rows[baseline.name], rows[gated]
    out = {}
    sink_b, sink_g = base["first_token_attention"], gate["first_token_attention"]
    if sink_b["mean"] < SINK_THRESHOLD:
        out["sink"] = (
            f"inconclusive: no sink formed in the baseline (first-token attention {sink_b['mean']:.3f} < "
            f"{SINK_THRESHOLD}; gated {sink_g['mean']:.3f})"
        )
    else:
        out["sink"] = _compare_lower(sink_g, sink_b, "first-token attention", halve=True)
    act_b, act_g = base["max_activation"], gate["max_activation"]
    median = statistics.fmean(
        m["diagnostics"]["median_activation"] for m in _main_jobs(config, baseline.name, metrics)
    )
    if act_b["mean"] < MASSIVE_RATIO * median:
        out["activation"] = (
            f"inconclusive: no massive activation in the baseline (max {act_b['mean']:.1f} < "
            f"{MASSIVE_RATIO:g} x its median {median:.2f}); the max alone: "
            f"{_compare_lower(act_g, act_b, 'max', halve=True)}"
        )
    else:
        out["activation"] = _compare_lower(act_g, act_b, "max activation", halve=True)
    out["perplexity"] = _compare_lower(gate["test_loss"], base["test_loss"], "test loss", halve=False)
    out["lr"] = _lr_verdict(config, sweep, baseline.name, gated)
    return out


def _main_jobs(config, run_name: str, metrics: dict) -> list[dict]:
    """The finished jobs of one run at the main learning rate (one per seed)."""
    return [
        metrics[j.name]
        for j in config.jobs()
        if j.run.name == run_name and j.learning_rate == config.learning_rate and metrics[j.name]
    ]


def _compare_lower(gated: dict, baseline: dict, what: str, halve: bool) -> str:
    numbers = f"{what} {baseline['mean']:.3g} (baseline) vs {gated['mean']:.3g} (gated), {gated['n']} seeds"
    if _separated(gated, baseline) and (not halve or gated["mean"] <= baseline["mean"] / 2):
        return f"reproduced at this scale: {numbers}, 95 % intervals apart"
    if _separated(baseline, gated) or (gated["n"] > 1 and gated["mean"] >= baseline["mean"]):
        return f"not reproduced: {numbers}"
    return f"inconclusive: {numbers}; the difference is within the seed spread or too small"


def _lr_verdict(config: StudyConfig, sweep: dict, baseline: str, gated: str) -> str:
    rates = sweep["rates"]
    diverged = {
        run: [sweep["cells"][run].get(r, {}).get("diverged") for r in rates] for run in (baseline, gated)
    }
    if any(flag is None for flags in diverged.values() for flag in flags):
        return "inconclusive: the learning-rate sweep has not finished"
    base_fails = [r for r, flag in zip(rates, diverged[baseline], strict=True) if flag]
    gate_fails = [r for r, flag in zip(rates, diverged[gated], strict=True) if flag]
    where = (
        f"the baseline diverged at {base_fails or 'no rate'}, the gated model at {gate_fails or 'no rate'}"
    )
    if any(r not in base_fails for r in gate_fails):
        return f"not reproduced: {where}"
    if not base_fails:
        return f"inconclusive: the baseline did not diverge at any rate up to {max(rates):g}"
    if len(gate_fails) < len(base_fails):
        return f"reproduced at this scale: {where}"
    return f"not reproduced: {where}"


def sweep_table(config: StudyConfig, metrics: dict) -> dict:
    """Test loss per run and learning rate (first seed), with divergence flags."""
    rates = sorted([config.learning_rate, *config.sweep_learning_rates])
    cells = {run.name: {} for run in config.runs}
    for job in config.jobs():
        m = metrics[job.name]
        if job.seed == config.seeds[0] and m is not None:
            cells[job.run.name][job.learning_rate] = {"test_loss": m["test_loss"], "diverged": m["diverged"]}
    return {"rates": rates, "cells": cells}


def _plots(config: StudyConfig, metrics: dict, sweep: dict, out_dir: Path) -> list[str]:
    plt = pyplot()
    first = {
        run.name: metrics.get(f"{run.name}-lr{config.learning_rate:g}-seed{config.seeds[0]}")
        for run in config.runs
    }
    first = {name: m for name, m in first.items() if m}
    names = []
    fig, (train_ax, valid_ax) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for index, (name, m) in enumerate(first.items()):
        train = [(h["step"], h["loss"]) for h in m["log_history"] if "loss" in h]
        valid = [(h["step"], h["eval_loss"]) for h in m["log_history"] if "eval_loss" in h]
        train_ax.plot(*zip(*train, strict=True), color=f"C{index}", label=name)
        valid_ax.plot(*zip(*valid, strict=True), "o-", color=f"C{index}", label=name)
    train_ax.set(xlabel="step", ylabel="training loss", title=f"Training loss (lr {config.learning_rate:g})")
    valid_ax.set(xlabel="step", ylabel="validation loss", title="Validation loss")
    for ax in (train_ax, valid_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, out_dir / "loss_curves.png")
    names.append("loss_curves.png")

    keys = (("first_token_attention", "first-token attention"), ("max_activation", "max |hidden|"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), layout="constrained")
    for index, (name, m) in enumerate(first.items()):
        history = m["diagnostics_history"]
        final = read_json(config.run_dir / "jobs" / m["job"] / "final_diagnostics.json")
        for row, (key, label) in enumerate(keys):
            axes[row][0].plot(
                [h["step"] for h in history], [h[key] for h in history], color=f"C{index}", label=name
            )
            axes[row][0].set(xlabel="step", ylabel=label, title=f"{label} during training (validation probe)")
            layers = per_layer(final)[key]
            axes[row][1].plot(range(len(layers)), layers, "o-", color=f"C{index}", label=name)
            axes[row][1].set(xlabel="layer", ylabel=label, title=f"{label} per layer, end (test probe)")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    save_figure(fig, out_dir / "diagnostics.png")
    names.append("diagnostics.png")

    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for index, run in enumerate(config.runs):
        points = sorted((r, c["test_loss"]) for r, c in sweep["cells"][run.name].items())
        if points:
            ax.plot(*zip(*points, strict=True), "o-", color=f"C{index}", label=run.name)
    ax.set(
        xscale="log", xlabel="peak learning rate", ylabel="test loss (seed 0)", title="Learning-rate sweep"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    save_figure(fig, out_dir / "lr_sweep.png")
    names.append("lr_sweep.png")
    return names


def _setup(config: StudyConfig) -> str:
    tokenizer, blocks = prepare_data(config)
    job = config.jobs()[0]
    params = sum(
        p.numel() for p in build_model(config, job, len(tokenizer), tokenizer.eos_token_id).parameters()
    )
    manifest = (
        read_json(Path(config.cache_dir) / "corpus" / "manifest.json") if config.corpus == "offline" else None
    )
    tokens = {split: blocks[split].numel() for split in blocks}
    budget = config.max_steps * config.per_device_train_batch_size * config.seq_len
    lines = [
        f"- Model: Llama-style, {config.num_layers} layers, hidden {config.hidden_size}, {config.num_heads} "
        "heads "
        f"({config.num_kv_heads} key/value), MLP {config.intermediate_size}, tied embeddings, "
        f"{params / 1e6:.2f}M "
        "parameters (ungated), SDPA, fp32" + (" with bf16 autocast" if config.bf16 else "") + ".",
        f"- Tokenizer: byte-level BPE, {len(tokenizer)} tokens, trained on the training split only.",
        f"- Corpus: {config.corpus}; tokens per split: "
        + ", ".join(f"{split} {count:,}" for split, count in tokens.items())
        + f" ({config.seq_len}-token blocks).",
        f"- Budget per job: {config.max_steps} steps x {config.per_device_train_batch_size} blocks = "
        f"{budget:,} "
        f"tokens; AdamW (beta2 {config.adam_beta2}, weight decay {config.weight_decay}), "
        f"{config.lr_scheduler_type} "
        f"schedule, warmup {config.warmup_steps}, gradient clipping {config.max_grad_norm}. The same data "
        "order "
        f"(data_seed {config.seeds[0]}) for every job; seeds change the initialisation only.",
        f"- Validation ({config.validation_blocks} blocks): loss curves and the diagnostics probe "
        f"({config.probe_blocks} blocks) during training. Test: the final loss ({config.test_blocks} blocks) "
        "and "
        f"the final diagnostics ({config.test_probe_blocks} blocks) that the verdicts use. Nothing was "
        "chosen by "
        "looking at the test split; the learning rates were fixed before the runs.",
    ]
    if manifest is not None:
        rows = [
            [
                n,
                s["requirement"],
                f"{sum(s[k]['words'] for k in ('train', 'validation', 'test')):,}",
                s["license"],
            ]
            for n, s in manifest["sources"].items()
        ]
        lines += [
            "",
            table(["source", "package", "words", "license"], rows),
            "",
            f"Split rule: {manifest['split_rule']}",
        ]
    return "\n".join(lines)


def summarize_study(config: StudyConfig) -> dict:
    """Everything the report shows, from the finished jobs (`ValueError` if none has finished)."""
    metrics = load_jobs(config)
    if all(m is None for m in metrics.values()):
        raise ValueError(f"no job of {config.run_dir} has finished yet")
    rows = main_comparison(config, metrics)
    sweep = sweep_table(config, metrics)
    return {
        "metrics": metrics,
        "main": rows,
        "sweep": sweep,
        "verdicts": verdicts(config, rows, sweep, metrics),
        "missing_jobs": [name for name, m in metrics.items() if m is None],
    }


def markdown(
    config: StudyConfig, summary: dict, images: list[str], command: str, image_prefix: str = ""
) -> str:
    """`STUDY.md`: setup, the main table, the sweep, the plots (`image_prefix` + name) and the verdicts."""
    rows, sweep, claims, missing = (summary[k] for k in ("main", "sweep", "verdicts", "missing_jobs"))
    header = ["run", "gate", "seeds", *[label for _, label, _ in METRICS]]
    body = []
    for run in config.runs:
        if run.name in rows:
            stats = rows[run.name]
            cells = [_cell(stats[key], fmt) if key in stats else "-" for key, _, fmt in METRICS]
            gate = gate_label(None if run.gate is None else run.gate.to_dict())
            body.append([run.name, gate, str(stats["test_loss"]["n"]), *cells])
    sweep_rows = []
    for run in config.runs:
        cells = []
        for rate in sweep["rates"]:
            cell = sweep["cells"][run.name].get(rate)
            diverged = cell is not None and cell["diverged"]
            cells.append(
                "-" if cell is None else f"{cell['test_loss']:.3f}" + (" (diverged)" if diverged else "")
            )
        sweep_rows.append([run.name, *cells])
    gated = ", ".join(n for n in config.main_runs if config.baseline is None or n != config.baseline.name)
    finished = len(summary["metrics"]) - len(missing)
    return "\n".join(
        [
            "# From-scratch study: does gating remove the attention sink and massive activations here too?",
            "",
            f"Produced by `{command}` ({finished} of {len(summary['metrics'])} jobs finished"
            + (f"; missing: {', '.join(missing)}" if missing else "")
            + f"). Every number comes from the jobs' `metrics.json` under `{config.run_dir}/jobs/`.",
            "",
            "## Setup",
            "",
            _setup(config),
            "",
            f"Training time of the finished jobs (sum of the Trainer's train_runtime): {_hours(summary)}.",
            "",
            f"## Main comparison (lr {config.learning_rate:g}; mean and 95 % t-interval over seeds)",
            "",
            table(header, body),
            "",
            "Attention and activation numbers are the final diagnostics on the test probe. First-token "
            "attn: the"
            " mean over layers, heads and query positions >= 4 of the softmax weight on token 0 (before any "
            "gate;"
            " uniform causal attention would give about 0.016 here). Top-1 attn: the same for the largest "
            "weight."
            " Max |h|: the largest |hidden state| of any layer's output. Gate values are `sigmoid(z)`, in "
            "(0, 1).",
            "",
            f"## Learning-rate sweep (test loss, seed {config.seeds[0]})",
            "",
            table(["run", *[f"lr {r:g}" for r in sweep["rates"]]], sweep_rows),
            "",
            "Diverged: the test loss is not finite or above log(vocabulary size), worse than uniform "
            "guessing.",
            "",
            "## Plots",
            "",
            *[f"![{name}]({image_prefix}{name})" for name in images],
            "",
            f"## Verdicts (baseline vs {gated})",
            "",
            table(
                ["claim", "paper (Qiu et al. 2025, 15B MoE, 400B tokens)", "here"],
                [[claim, PAPER[claim], claims[claim]] for claim in PAPER],
            ),
            "",
            f"Rules: a sink needs a baseline first-token attention >= {SINK_THRESHOLD}; massive activations "
            "need"
            f" a baseline max |h| >= {MASSIVE_RATIO:g} x its median |h|. Reproduced: the gated mean is at "
            "most half"
            " the baseline's (sink, activation) or lower (loss), with the 95 % intervals over seeds apart. "
            "Not"
            " reproduced: the gated mean is not lower, or its interval lies above. Otherwise inconclusive. "
            "Learning"
            " rate: reproduced if the baseline diverges at more rates than the gated model and the gated "
            "model never"
            " diverges alone.",
            "",
        ]
    )


def _hours(summary: dict) -> str:
    seconds = sum(m["train_runtime_s"] or 0 for m in summary["metrics"].values() if m is not None)
    return f"{seconds / 3600:.2f} h"


def write_report(config: StudyConfig, out: Path | None = None, command: str = "make study") -> Path:
    """Write `STUDY.md`, `study.json` and the plots into the study folder, and the Markdown also to `out`
    (image links relative to `out`)."""
    summary = summarize_study(config)
    images = _plots(config, summary["metrics"], summary["sweep"], config.run_dir)
    atomic_write_text(config.run_dir / "STUDY.md", markdown(config, summary, images, command))
    sweep = {
        str(r): {n: c.get(r) for n, c in summary["sweep"]["cells"].items()} for r in summary["sweep"]["rates"]
    }
    data = {
        "config": config.to_dict(),
        "main": summary["main"],
        "sweep": sweep,
        "verdicts": summary["verdicts"],
    }
    atomic_write_json(config.run_dir / "study.json", {**data, "missing_jobs": summary["missing_jobs"]})
    if out is not None:
        prefix = os.path.relpath(config.run_dir, Path(out).parent) + "/"
        atomic_write_text(Path(out), markdown(config, summary, images, command, prefix))
    return config.run_dir / "STUDY.md"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Write STUDY.md of a pretraining study folder.")
    parser.add_argument("study", help="the study folder (results/study)")
    parser.add_argument("--out", help="also write the Markdown here (image links adjusted)")
    parser.add_argument("--command", default="make study", help="the command named as the producer")
    args = parser.parse_args(argv)
    folder = Path(args.study)
    try:
        saved = read_json(folder / CONFIG_FILE)
        if saved is None:
            raise FileNotFoundError(f"{folder} holds no {CONFIG_FILE}: not a pretraining study folder")
        config = StudyConfig.from_dict({**saved, "output_dir": str(folder.parent), "name": folder.name})
        path = write_report(config, args.out, args.command)
    except (ValueError, OSError) as err:
        print(f"study report: error: {err}", file=sys.stderr)
        return 2
    print(path.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
