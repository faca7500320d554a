"""Image files the recipes read: a folder's metadata file (transformers' `imagefolder` convention:
`metadata.jsonl` or `metadata.csv`), images decoded to RGB, and the validation/test splits carved out of a
source that has only a training split (`archives.split_of`, the recipes' fixed rule)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from .archives import split_of

SPLITS = ("train", "validation", "test")
SPLIT_NAMES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def metadata_file(folder: Path) -> Path | None:
    """The folder's metadata file, or `None`."""
    return next((folder / name for name in METADATA_FILES if (folder / name).is_file()), None)


def read_metadata(path: Path) -> list[dict]:
    """The rows of a metadata file (a CSV's `objects` column read as JSON)."""
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        for row in rows:  # a CSV holds `objects` as JSON text
            if isinstance(row.get("objects"), str) and row["objects"].strip():
                row["objects"] = json.loads(row["objects"])
        return rows
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not valid JSON ({err})") from None
    return rows


def with_all_splits(raw: dict[str, list[dict]], name: str) -> dict[str, list[dict]]:
    """Carve missing validation/test splits out of `train` by the fixed rule on `<name>/<row>`."""
    missing = [split for split in ("validation", "test") if split not in raw]
    if not missing:
        return raw
    kept = {"train": [], **{s: raw[s] for s in raw if s != "train"}, **{s: [] for s in missing}}
    for index, row in enumerate(raw["train"]):
        rule = split_of(f"{name}/{index}")
        target = (
            rule if rule in missing else "validation" if rule != "train" and "validation" in missing else None
        )
        kept[target or "train"].append(row)
    return kept


def decoded_image(image, where: str):
    """`image` (a path, `{"bytes"}`, a PIL image or an array) as an RGB PIL image; `ValueError` naming
    `where` when it does not decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        if isinstance(image, str | Path):
            with Image.open(image) as opened:
                return opened.convert("RGB")
        if isinstance(image, dict) and image.get("bytes") is not None:
            import io

            return Image.open(io.BytesIO(image["bytes"])).convert("RGB")
        if isinstance(image, Image.Image):
            return image.convert("RGB")
        return Image.fromarray(np.asarray(image)).convert("RGB")
    except (UnidentifiedImageError, OSError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: the image does not decode ({err})") from err
