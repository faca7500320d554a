"""The coloured shapes the generated image sets draw (captioning's images, video QA's clips): colours, shape
names, a shape's pixel mask, a free place for a shape."""

from __future__ import annotations

import numpy as np

# colour name -> RGB (a caption or an answer names these)
COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 205, 30),
    "purple": (140, 60, 180),
    "orange": (240, 130, 20),
}
SHAPES = ("circle", "square", "triangle")


def shape_mask(shape: str, centre: tuple[float, float], half: float, size: int) -> np.ndarray:
    """Boolean `(size, size)` mask of one shape of half-extent `half` (pixels) at `centre` (x, y)."""
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    x, y = centre
    box = (x - half, y - half, x + half, y + half)
    if shape == "circle":
        draw.ellipse(box, fill=255)
    elif shape == "square":
        draw.rectangle(box, fill=255)
    elif shape == "triangle":
        draw.polygon([(x, y - half), (x - half, y + half), (x + half, y + half)], fill=255)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return np.asarray(canvas) > 127


def place_shape(rng, size: int, half: float, boxes: list, margin: float) -> tuple[float, float] | None:
    """A centre for a shape of half-extent `half` whose box keeps `margin` pixels from every box in `boxes`
    (`(x, y, half)`), or `None` after 200 tries."""
    for _ in range(200):
        x, y = rng.uniform(half + 1, size - half - 1, 2)
        if all(
            abs(x - bx) >= half + bh + margin or abs(y - by) >= half + bh + margin for bx, by, bh in boxes
        ):
            return float(x), float(y)
    return None
