"""Files of a diagnosis: `diagnostics.json`, PNG heatmaps (layers x heads) and per-layer line plots, and the
short table the command line prints."""

from __future__ import annotations

from pathlib import Path

import torch

from ..files import atomic_write_json
from ..formatting import table
from ..plotting import pyplot, save_figure

JSON_FILE = "diagnostics.json"
HEATMAPS_FILE = "heatmaps.png"
LAYERS_FILE = "layers.png"


def _heatmaps(result: dict) -> list[tuple[str, list[list[float]], list[int]]]:
    """`(title, values (layers x heads), layer indices)` of every heatmap the result has."""
    layers = list(range(len(result["attention"]["first_token"])))
    maps = [
        ("first-token attention", result["attention"]["first_token"], layers),
        ("top-1 attention", result["attention"]["top1"], layers),
    ]
    gates = result["gates"]
    if gates is not None:
        maps.append(("gate mean", gates["mean"], gates["layers"]))
        maps.append(("share of gates < 0.1", gates["below_0.1"], gates["layers"]))
        if gates["keep_rate"] is not None:
            maps.append(("top-k keep rate", gates["keep_rate"], gates["layers"]))
    cross = result.get("cross_gates")
    if cross is not None:
        maps.append(("cross-attention gate mean", cross["mean"], cross["layers"]))
    return maps


def plot_heatmaps(result: dict, path: Path, title: str = "") -> None:
    plt = pyplot()
    maps = _heatmaps(result)
    fig, axes = plt.subplots(
        1, len(maps), figsize=(3.4 * len(maps), 4.4), squeeze=False, layout="constrained"
    )
    for ax, (name, values, layers) in zip(axes[0], maps, strict=True):
        low, high = min(map(min, values)), max(map(max, values))
        image = ax.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest", vmin=low,
                          vmax=high if high > low else low + 1e-6)  # fmt: skip
        ax.set(title=name, xlabel="head", ylabel="layer")
        ax.set_yticks(range(len(layers)), [str(i) for i in layers], fontsize="xx-small")
        fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title)
    save_figure(fig, path)


def plot_layers(results: dict[str, dict], path: Path) -> None:
    """Per-layer lines of one or several diagnoses (`{label: result}`): first-token attention (mean over
    heads), max |hidden state| (log scale) and, for gated models, the gate mean."""
    plt = pyplot()
    gated = any(r["gates"] is not None for r in results.values())
    fig, axes = plt.subplots(1, 3 if gated else 2, figsize=(13 if gated else 9, 3.8), layout="constrained")
    for index, (label, result) in enumerate(results.items()):
        color = f"C{index}"
        first = torch.tensor(result["attention"]["first_token"]).mean(-1).tolist()
        axes[0].plot(range(len(first)), first, "o-", color=color, label=label)
        activations = result["activations"]["max_abs"]
        axes[1].plot(range(len(activations)), activations, "o-", color=color, label=label)
        if result["gates"] is not None:
            means = torch.tensor(result["gates"]["mean"]).mean(-1).tolist()
            axes[2].plot(result["gates"]["layers"], means, "o-", color=color, label=label)
    axes[0].set(xlabel="layer", ylabel="mean over heads", title="attention on the first token")
    axes[1].set(xlabel="layer", ylabel="max |hidden state|", yscale="log", title="massive activations")
    if gated:
        axes[2].set(xlabel="layer", ylabel="mean over heads and tokens", title="gate mean")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    save_figure(fig, path)


def write_diagnosis(result: dict, out_dir: Path, title: str = "") -> list[Path]:
    """`diagnostics.json`, `heatmaps.png` and `layers.png` in `out_dir` (each written atomically)."""
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / JSON_FILE, result)
    plot_heatmaps(result, out_dir / HEATMAPS_FILE, title)
    plot_layers({title or "model": result}, out_dir / LAYERS_FILE)
    return [out_dir / name for name in (JSON_FILE, HEATMAPS_FILE, LAYERS_FILE)]


def _cross_cells(summary: dict) -> tuple[str, str]:
    if "cross_gate_mean" not in summary:
        return "-", "-"
    return f"{summary['cross_gate_mean']:.3f}", f"{summary['cross_gate_below_0.1']:.3f}"


def summary_table(summaries: dict[str, dict]) -> str:
    """A Markdown table of `summarize` scalars, one row per labelled model."""
    header = ["model", "first-token attn", "top-1 attn", "top-1 key: first / previous / self"]
    header += ["max \\|h\\| (layer)", "median \\|h\\|", "gate mean", "gates < 0.1"]
    top_k = any("keep_rate_min" in s for s in summaries.values())
    if top_k:
        header.append("top-k keep rate, min / max over layers and heads")
    cross = any("cross_gate_mean" in s for s in summaries.values())
    if cross:
        header += ["cross gate mean", "cross gates < 0.1"]
    rows = []
    for label, s in summaries.items():
        gate = ("-", "-") if "gate_mean" not in s else (f"{s['gate_mean']:.3f}", f"{s['gate_below_0.1']:.3f}")
        if top_k:
            keep = "-" if "keep_rate_min" not in s else f"{s['keep_rate_min']:.2f} / {s['keep_rate_max']:.2f}"
            gate = (*gate, keep)
        if cross:
            gate = (*gate, *_cross_cells(s))
        rows.append(
            [
                label,
                f"{s['first_token_attention']:.3f}",
                f"{s['top1_attention']:.3f}",
                " / ".join(f"{s[f'top1_at_{where}_share']:.2f}" for where in ("first", "previous", "self")),
                f"{s['max_activation']:.1f} ({s['max_activation_layer']})",
                f"{s['median_activation']:.2f}",
                *gate,
            ]
        )
    return table(header, rows)
