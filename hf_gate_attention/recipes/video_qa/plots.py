"""The video QA recipe's own pictures: the cross- and self-attention gates per layer by question kind
(`gates_by_layer.png`), and for a few test questions of each kind the frames with their attention, gated
beside ungated (`overlay_<kind>_<n>.png`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...plotting import pyplot, save_figure
from .data import KINDS

OVERLAY_COLOUR = (1.0, 0.0, 0.55)  # magenta: not a colour of the shapes


def plot_gates(rows: list[dict], path: Path) -> None:
    """One panel per gated run: the mean gate per layer on the answer tokens, cross-attention (frames, solid)
    and self-attention (text, dashed), one colour per question kind."""
    gated = [row for row in rows if row["gate"] is not None]
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(gated)), figsize=(4.5 * max(1, len(gated)), 3.4), squeeze=False)
    for ax, row in zip(axes[0], gated, strict=False):
        for kind, colour in zip(KINDS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
            layers = row["layers"][kind]
            for part, style in (("cross", "-"), ("self", "--")):
                if layers[part] is not None:
                    label = f"{kind}: {'frames (cross)' if part == 'cross' else 'text (self)'}"
                    ax.plot(layers[part], style, marker="o", color=colour, label=label)
        ax.set_title(row["run"], fontsize=9)
        ax.set_xlabel("decoder layer")
        ax.set_ylabel("mean gate on the answer tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="xx-small")
    save_figure(fig, path)


def plot_overlays(
    config, data, questions: list[dict], measured: dict, predictions: dict, out: Path
) -> list[Path]:
    """Per kept test question: its frames (columns) with the frames' attention on the answer tokens
    (opacity, one scale per figure) for every run (rows); cyan: the objects the question names."""
    plt = pyplot()
    names = list(measured)
    paths, seen = [], dict.fromkeys(KINDS, 0)
    for index, question in enumerate(questions):
        maps = [measured[n][index].get("map") for n in names]
        if maps[0] is None:
            continue
        clip = data.splits["test"][question["clip"]]
        frames, size = config.clip_frames, config.image_size
        grid = round(np.sqrt(len(maps[0][0])))
        top = max(float(np.max(m)) for m in maps) or 1.0
        fig, axes = plt.subplots(
            len(names), frames, figsize=(1.3 * frames, 1.4 * len(names) + 0.6), squeeze=False
        )
        for r, name in enumerate(names):
            for f in range(frames):
                ax = axes[r][f]
                ax.imshow(np.asarray(clip["frames"][f].resize((size, size))))
                overlay = np.zeros((grid, grid, 4))
                overlay[..., :3] = OVERLAY_COLOUR
                overlay[..., 3] = 0.9 * np.clip(np.asarray(maps[r][f]).reshape(grid, grid) / top, 0, 1)
                ax.imshow(overlay, extent=(-0.5, size - 0.5, size - 0.5, -0.5), interpolation="nearest")
                for o in question["objects"] if clip["masks"] else []:
                    mask = clip["masks"][o][f]
                    if mask.any():
                        from PIL import Image

                        small = (
                            np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize((size, size)))
                            > 127
                        )
                        ax.contour(small, levels=[0.5], colors="cyan", linewidths=0.6)
                ax.set_xticks([])
                ax.set_yticks([])
                if r == 0:
                    ax.set_title(f"frame {f}", fontsize=7)
                if f == 0:
                    ax.set_ylabel(f"{name}\n{predictions[name][index]!r}", fontsize=6)
        fig.suptitle(
            f"[{question['kind']}] {question['question']} -> {question['answer']!r}\n"
            f"frames' attention on the answer tokens (gate-weighted heads), 0 to {top:.3f}",
            fontsize=6,
        )
        path = out / f"overlay_{question['kind']}_{seen[question['kind']]}.png"
        seen[question["kind"]] += 1
        save_figure(fig, path)
        paths.append(path)
    return paths
