"""The captioning recipe's own pictures: where cross-attention falls and the gates by word class
(`attention.png`), and, for a few test images, each word's attention map over the image, gated beside
ungated, with the gate value of each word (`overlay_<n>.png`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...plotting import pyplot, save_figure
from ..common.plots import _error_bars
from .attention import END
from .metrics import WORD_CLASSES

OVERLAY_COLOUR = (1.0, 0.0, 0.55)  # magenta: not a colour of the shapes


def _bars(
    ax, groups: dict[str, dict], keys: list[str], labels: list[str], scale: float, colours: dict
) -> None:
    """Grouped bars with CIs: one group per key, one bar per name of `groups` (`{name: {key: score}}`), in
    `colours[name]`."""
    x, width = np.arange(len(keys)), 0.8 / max(1, len(groups))
    for index, (name, scores) in enumerate(groups.items()):
        present = [k for k in keys if scores.get(k) is not None]
        means = [scale * scores[k]["mean"] for k in present]
        errors = _error_bars(
            means, [scale * scores[k]["low"] for k in present], [scale * scores[k]["high"] for k in present]
        )
        offset = (index - (len(groups) - 1) / 2) * width
        positions = [x[keys.index(k)] + offset for k in present]
        ax.bar(positions, means, width, yerr=errors, capsize=3, label=name, color=colours[name])
    ax.set_xticks(x, labels)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="x-small")


def plot_attention(rows: list[dict], path: Path, confidence: float) -> None:
    """Left: object share (gate-weighted, plain) and sink share per run; right: the cross-attention gate
    per class of the emitted word, per gated run (bars: means over test captions, whiskers: CIs)."""
    plt = pyplot()
    gated = [row for row in rows if row["gates"]]
    fig, axes = plt.subplots(1, 2 if gated else 1, figsize=(11 if gated else 6, 3.8), squeeze=False)
    keys = ["share_weighted", "share_plain", "sink"]
    colours = {row["run"]: f"C{index}" for index, row in enumerate(rows)}  # one colour per run in both panels
    labels = ["object share\n(gate-weighted heads)", "object share\n(plain mean of heads)", "sink share"]
    _bars(axes[0][0], {r["run"]: r["attention"] for r in rows}, keys, labels, 100, colours)
    chance = rows[0]["share_chance"]
    if chance is not None:
        axes[0][0].axhline(100 * chance["mean"], color="grey", ls="--", lw=1, label="uniform attention")
        axes[0][0].legend(fontsize="x-small")
    axes[0][0].set(ylabel="% of cross-attention weight", title="Where cross-attention falls")
    if gated:
        classes = [cls for cls in WORD_CLASSES if cls != "other"]
        _bars(axes[0][1], {r["run"]: r["gates"] for r in gated}, classes, classes, 1, colours)
        axes[0][1].set(ylabel="gate value", title="Cross-attention gate by emitted word")
    fig.suptitle(f"Test captions, teacher forcing ({100 * confidence:g} % bootstrap CI)", y=1.02)
    save_figure(fig, path)


def plot_overlays(config, data, measured: dict, predictions: dict, out: Path) -> list[Path]:
    """`overlay_<n>.png` for the first `overlay_examples` test images: a row per run, a column per word of the
    reference caption (and the end), each the image under that step's cross-attention map (gate-weighted
    mean over heads, mean over layers; its opacity the weight on one scale per figure,
    transparent where it is 0), the named object outlined, the gate value under it."""
    from PIL import Image

    plt = pyplot()
    paths = []
    names = list(measured)
    first = measured[names[0]]
    grid, prefix = first["grid"], first["prefix"]
    for index, _ in enumerate(first["maps"]):
        row = data.splits["test"][index]
        image = np.asarray(row["image"].resize((config.image_size, config.image_size)))
        words = first["maps"][index]["words"]
        masks = _word_masks(row, len(words), config.image_size)
        fig, axes = plt.subplots(
            len(names), len(words), figsize=(0.9 * len(words), 1.05 * len(names) + 0.5), squeeze=False
        )
        fig.subplots_adjust(wspace=0.06, hspace=0.3, top=0.82, bottom=0.08)
        every = [np.asarray(measured[n]["maps"][index]["maps"]) for n in names]  # (steps, keys) per run
        top = max(float(m[:, prefix:].max()) for m in every) or 1.0  # one colour scale per figure
        for column in range(len(words)):
            maps = [m[column] for m in every]
            for r, name in enumerate(names):
                ax = axes[r][column]
                entry = measured[name]["maps"][index]
                heat = np.clip(maps[r][prefix:].reshape(grid, grid) / top, 0, 1)
                overlay = np.zeros((grid, grid, 4))  # one colour no shape has, opaque where attention is high
                overlay[..., :3] = OVERLAY_COLOUR
                overlay[..., 3] = 0.9 * heat
                ax.imshow(image)
                extent = (-0.5, config.image_size - 0.5, config.image_size - 0.5, -0.5)
                ax.imshow(overlay, extent=extent, interpolation="nearest")
                if masks[column] is not None:
                    ax.contour(masks[column], levels=[0.5], colors="cyan", linewidths=0.6)
                ax.set_xticks([])
                ax.set_yticks([])
                if r == 0:
                    ax.set_title("<end>" if words[column] == END else words[column], fontsize=8)
                if entry["gates"] is not None:
                    ax.set_xlabel(f"g={entry['gates'][column]:.2f}", fontsize=7, labelpad=1)
                if column == 0:
                    ax.set_ylabel(name, fontsize=7)
        captions = "; ".join(f"{n}: {predictions[n][index]!r}" for n in names)
        fig.suptitle(f"reference: {row['caption']!r}\n{captions}", fontsize=6)
        fig.text(
            0.5,
            0.0,
            "cross-attention of the step emitting each word (gate-weighted heads, mean of layers); "
            f"opacity: the weight, 0 to {top:.2f} (one scale per figure); cyan: the object the word names; "
            "g: its cross-attention gate",
            ha="center",
            fontsize=6,
        )
        path = out / f"overlay_{index}.png"
        save_figure(fig, path)
        _quantise(path, Image)
        paths.append(path)
    return paths


def _word_masks(row: dict, steps: int, size: int) -> list:
    """Per step (word, then the end), the mask of the object that word names, resized to `size`, or None."""
    from PIL import Image

    masks: list = [None] * steps
    for obj in row["objects"] or []:
        resized = np.asarray(Image.fromarray(obj["mask"].astype(np.uint8) * 255).resize((size, size))) > 127
        for position in obj["positions"]:
            if position < steps - 1:
                masks[position] = resized.astype(float)
    return masks


def _quantise(path: Path, image_module) -> None:
    """Rewrite a PNG with a 64-colour palette (smaller; the plots are read, not measured)."""
    with image_module.open(path) as opened:
        small = opened.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)
