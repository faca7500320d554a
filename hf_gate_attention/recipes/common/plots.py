"""PNG plots of a comparison (matplotlib, Agg backend): loss curves, score bars with CIs, speed bars."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...plotting import pyplot, save_figure


def plot_loss_curves(log_histories: dict[str, list[dict]], path: Path) -> None:
    """Training loss per logged step (lines) and validation loss (dashed, when logged) of every run."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for index, (name, history) in enumerate(log_histories.items()):
        color = f"C{index}"
        train = [(h["step"], h["loss"]) for h in history if "loss" in h]
        valid = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
        if train:
            ax.plot(*zip(*train, strict=True), color=color, label=f"{name} (train)")
        if valid:
            ax.plot(*zip(*valid, strict=True), "o--", color=color, label=f"{name} (validation)")
    ax.set(xlabel="optimizer step", ylabel="loss", title="Loss curves")
    if ax.has_data():
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no training logged", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def _error_bars(values: list[float], lows: list[float], highs: list[float]) -> np.ndarray:
    """Matplotlib `yerr` (2, n): distances from each value down to its low and up to its high."""
    values = np.asarray(values)
    return np.stack([values - np.asarray(lows), np.asarray(highs) - values])


def plot_scores(scores: dict[str, dict], labels: dict[str, str], ylabel: str, title: str, path: Path) -> None:
    """Grouped bars with error bars: one group per metric of `labels` (`{key: axis label}`), one bar per run;
    `scores` is `{run: {key: {"mean", "low", "high"}}}`."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = list(labels)
    x, width = np.arange(len(keys)), 0.8 / len(scores)
    for index, (name, run_scores) in enumerate(scores.items()):
        means = [run_scores[k]["mean"] for k in keys]
        errors = _error_bars(
            means, [run_scores[k]["low"] for k in keys], [run_scores[k]["high"] for k in keys]
        )
        offset = (index - (len(scores) - 1) / 2) * width
        ax.bar(x + offset, means, width, yerr=errors, capsize=3, label=name)
    ax.set_xticks(x, [labels[k] for k in keys])
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    save_figure(fig, path)


GENERATION_PANELS = (
    ("prefill_tokens_per_s", "prefill tokens/s"),
    ("decode_tokens_per_s", "decode tokens/s"),
    ("seconds_per_summary", "seconds per summary"),
)


def plot_speed(
    speed: dict[str, dict],
    path: Path,
    panels: tuple[tuple[str, str], ...] = GENERATION_PANELS,
    title: str = "Inference speed (batch 1, interleaved rounds; bars: median, whiskers: min-max)",
) -> None:
    """One bar chart per `(key, label)` of `panels` (default: prefill and decode throughput and seconds per
    summary) of every run: the median over the interleaved rounds, whiskers from min to max."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.7 * len(panels), 3.5), squeeze=False)
    names = list(speed)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        medians = [speed[n][key] for n in names]
        rounds = [[row[key] for row in speed[n]["rounds"]] for n in names]
        errors = _error_bars(medians, [min(r) for r in rounds], [max(r) for r in rounds])
        ax.bar(range(len(names)), medians, yerr=errors, capsize=3, color=[f"C{i}" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, y=1.04)
    save_figure(fig, path)
