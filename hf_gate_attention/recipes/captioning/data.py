"""Images with captions for the captioning recipe, and where the objects the captions name lie in them.

Sources (`load_caption_dataset`), all read into the same rows
`{"id": str, "image": PIL.Image (RGB), "caption": str, "objects": [{"words", "positions", "mask"}] | None}`:

- `shapes` (offline, generated): coloured shapes on a light background, with grey distractor shapes that no
  caption names. Each image holds two coloured objects of different colours; its caption names their colour,
  shape and relative position, the object whose colour comes first in `COLOURS` first: "a red circle left of
  a blue square". Every image is drawn from its own seed `(seed, split, index)`, so a split's rows do not
  depend on how many are drawn; each named object keeps its pixel mask and the caption words naming it.
- an image folder in transformers' `imagefolder` convention: images beside a `metadata.jsonl` (or
  `metadata.csv`) whose `file_name` column names them and whose caption column (`text`, `caption` or
  `captions`; `caption_column`) holds the caption, either in the folder itself or in split subfolders
  (`train/`, `validation/`, `test/`). An optional `objects` column, a list of `{"words": [...], "box": [x0,
  y0, x1, y1]}` in pixels of the image, says where the objects a caption names are: without it, the recipe
  measures caption quality and gates, not where attention falls.
- a Hub dataset id (`datasets.load_dataset`, online only), with an image and a caption column.

A source without a test (validation) split gets one from its training rows by the recipes' fixed rule
(`archives.split_of` on `<name>/<row>`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...files import require_hub_id_or_existing_path
from ..common.encoder_decoder import normalise_caption
from ..common.image_files import (
    IMAGE_SUFFIXES,
    METADATA_FILES,
    SPLIT_NAMES,
    SPLITS,
    decoded_image,
    metadata_file,
    read_metadata,
    with_all_splits,
)
from ..common.shapes import COLOURS, SHAPES, place_shape, shape_mask

SPLIT_SEEDS = {"train": 0, "validation": 1, "test": 2}
RELATIONS = ("left of", "right of", "above", "below")
SHAPES_DEFAULT_SIZES = {"train": 2000, "validation": 200, "test": 300}
CAPTION_COLUMNS = ("text", "caption", "captions")
IMAGE_COLUMNS = ("image", "img")
OFFLINE_DATASETS = ("shapes",)


@dataclass
class CaptionData:
    """Rows of every split (see the module docstring) and where they came from."""

    splits: dict[str, list[dict]]
    source: dict = field(default_factory=dict)

    @property
    def has_objects(self) -> bool:
        """Whether every test row says where the objects its caption names are (masks or boxes)."""
        return all(row["objects"] for row in self.splits["test"])

    def fingerprint_rows(self) -> dict[str, list[dict]]:
        """What `data_fingerprint` hashes per split: id, image, caption and every object's words and mask."""
        return {
            split: [
                {
                    "id": row["id"],
                    "image": row["image"],
                    "caption": row["caption"],
                    "objects": [
                        {
                            "words": o["words"],
                            "positions": o["positions"],
                            "mask": np.packbits(o["mask"]).tobytes(),
                        }
                        for o in row["objects"] or []
                    ],
                }
                for row in rows
            ]
            for split, rows in self.splits.items()
        }


# ------------------------------------------------------------------------------------------ shapes


def _relation(first: tuple[float, float], second: tuple[float, float]) -> str:
    """Where `first` lies relative to `second` (centres, image coordinates: y grows downwards)."""
    dx, dy = first[0] - second[0], first[1] - second[1]
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


def shapes_example(seed: int, split: str, index: int, size: int = 112, max_distractors: int = 2) -> dict:
    """One generated example (a row, see the module docstring), drawn from its own seed."""
    from PIL import Image

    rng = np.random.default_rng([seed, SPLIT_SEEDS[split], index])
    while True:  # two named objects whose relation is clear (the centres differ by a patch more along it)
        names = rng.choice(list(COLOURS), 2, replace=False)
        shapes = rng.choice(SHAPES, 2)
        halves = rng.uniform(0.10, 0.14, 2) * size
        boxes: list = []
        for half in halves:
            centre = place_shape(rng, size, half, boxes, margin=3)
            if centre is None:
                break
            boxes.append((*centre, half))
        if len(boxes) == 2:
            dx, dy = abs(boxes[0][0] - boxes[1][0]), abs(boxes[0][1] - boxes[1][1])
            if abs(dx - dy) >= size / 8:
                break
    background = rng.integers(195, 240) + rng.integers(-8, 9, 3)
    pixels = np.clip(background + rng.integers(-6, 7, (size, size, 3)), 0, 255).astype(np.int16)
    for _ in range(rng.integers(0, max_distractors + 1)):  # grey shapes no caption names
        half = rng.uniform(0.07, 0.11) * size
        centre = place_shape(rng, size, half, boxes, margin=2)
        if centre is not None:
            boxes.append((*centre, half))
            pixels[shape_mask(str(rng.choice(SHAPES)), centre, half, size)] = rng.integers(95, 165)
    objects = []
    for name, shape, (x, y, half) in zip(names, shapes, boxes[:2], strict=True):
        mask = shape_mask(str(shape), (x, y), half, size)
        pixels[mask] = np.clip(np.asarray(COLOURS[name]) + rng.integers(-15, 16, 3), 0, 255)
        objects.append({"colour": str(name), "shape": str(shape), "centre": (x, y), "mask": mask})
    order = sorted(range(2), key=lambda i: list(COLOURS).index(objects[i]["colour"]))
    first, second = (objects[i] for i in order)
    relation = _relation(first["centre"], second["centre"])
    words = ["a", first["colour"], first["shape"], *relation.split(), "a", second["colour"], second["shape"]]
    named = [
        {"words": [first["colour"], first["shape"]], "positions": [1, 2], "mask": first["mask"]},
        {
            "words": [second["colour"], second["shape"]],
            "positions": [len(words) - 2, len(words) - 1],
            "mask": second["mask"],
        },
    ]
    image = Image.fromarray(pixels.astype(np.uint8), "RGB")
    return {"id": f"shapes/{split}/{index}", "image": image, "caption": " ".join(words), "objects": named}


def generate_shapes(
    sizes: dict[str, int], seed: int = 0, image_size: int = 112, max_distractors: int = 2
) -> CaptionData:
    """The `shapes` set: `sizes[split]` examples per split (see `shapes_example`)."""
    splits = {
        split: [shapes_example(seed, split, i, image_size, max_distractors) for i in range(sizes[split])]
        for split in SPLITS
    }
    source = {
        "dataset": "shapes",
        "kind": "generated",
        "seed": seed,
        "image_size": image_size,
        "max_distractors": max_distractors,
        "colours": list(COLOURS),
        "shapes": list(SHAPES),
        "relations": list(RELATIONS),
    }
    return CaptionData(splits, source)


def parse_shapes_caption(caption: str) -> dict | None:
    """`{"colour": [c1, c2], "shape": [s1, s2], "position": relation}` of a caption in the shapes template
    ("a red circle left of a blue square"), or `None` when it does not follow it."""
    colours, shapes = "|".join(COLOURS), "|".join(SHAPES)
    relations = "|".join(RELATIONS)
    pattern = rf"a ({colours}) ({shapes}) ({relations}) a ({colours}) ({shapes})"
    found = re.fullmatch(pattern, " ".join(caption.split()))
    if found is None:
        return None
    c1, s1, relation, c2, s2 = found.groups()
    return {"colour": [c1, c2], "shape": [s1, s2], "position": relation}


# ------------------------------------------------------------------------ image folders and the Hub


def _folder_rows(folder: Path, caption_column: str | None) -> list[dict]:
    """Rows `{"id", "image" (path), "caption", "objects" (raw)}` of one folder with a metadata file."""
    metadata = metadata_file(folder)
    if metadata is None:
        images = [p.name for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
        what = f"holds {len(images)} image(s) but" if images else "has"
        raise ValueError(
            f"image folder {folder} {what} no {' or '.join(METADATA_FILES)} with the captions (transformers' "
            "imagefolder convention: one row per image, a `file_name` column and a caption column)"
        )
    rows = read_metadata(metadata)
    if not rows:
        raise ValueError(f"{metadata} holds no row")
    columns = list(rows[0])
    if "file_name" not in columns:
        raise ValueError(f"{metadata} has no `file_name` column naming the images; its columns: {columns}")
    column = caption_column or next((c for c in CAPTION_COLUMNS if c in columns), None)
    if column is None or column not in columns:
        wanted = repr(caption_column) if caption_column else f"any of {list(CAPTION_COLUMNS)}"
        raise ValueError(f"{metadata} has no caption column ({wanted}); its columns: {columns}")
    missing = [row["file_name"] for row in rows if not (folder / str(row["file_name"])).is_file()]
    if missing:
        raise ValueError(
            f"{metadata} names {len(missing)} image(s) that are not in {folder}: {', '.join(missing[:5])}"
        )
    out = []
    for number, row in enumerate(rows):
        caption = row[column][0] if isinstance(row[column], list) and row[column] else row[column]
        if not isinstance(caption, str) or not caption.strip():
            raise ValueError(f"{metadata}: row {number} ({row['file_name']}) has no caption in `{column}`")
        path = folder / str(row["file_name"])
        out.append({"id": str(path), "image": path, "caption": caption, "objects": row.get("objects")})
    return out


def _image_folder(root: Path, caption_column: str | None) -> dict[str, list[dict]]:
    subfolders = {
        split: root / name
        for split in SPLITS
        for name in SPLIT_NAMES[split]
        if (root / name).is_dir() and metadata_file(root / name)
    }
    if subfolders and "train" not in subfolders:
        raise ValueError(f"image folder {root} has split folders {sorted(subfolders)} but no train/")
    if subfolders:
        return {split: _folder_rows(folder, caption_column) for split, folder in subfolders.items()}
    return {"train": _folder_rows(root, caption_column)}


def _hub_rows(dataset: str, image_column, caption_column, limits) -> dict[str, list[dict]]:
    import datasets
    from huggingface_hub import is_offline_mode

    require_hub_id_or_existing_path(dataset, "dataset")
    if is_offline_mode():
        raise ValueError(
            f"dataset {dataset!r} is not a local folder, and the Hub is off (HF_HUB_OFFLINE): use the "
            "offline `shapes` set or an image folder with a metadata file"
        )
    try:
        loaded = datasets.load_dataset(dataset)
    except (ConnectionError, TimeoutError) as err:  # no connection, or offline mode set after import
        raise ValueError(
            f"dataset {dataset!r} is not a local folder, and the Hub cannot be reached ({err}): use the "
            "offline `shapes` set or an image folder with a metadata file"
        ) from None
    rows = {}
    for split in SPLITS:
        name = next((n for n in SPLIT_NAMES[split] if n in loaded), None)
        if name is None:
            continue
        part = loaded[name]
        if limits.get(split) is not None:
            part = part.select(range(min(limits[split], len(part))))
        columns = list(part.features)
        image = image_column or next((c for c in IMAGE_COLUMNS if c in columns), None)
        caption = caption_column or next((c for c in CAPTION_COLUMNS if c in columns), None)
        if image not in columns or caption not in columns:
            raise ValueError(
                f"dataset {dataset!r} ({name} split) needs an image and a caption column (image_column, "
                f"caption_column); its columns: {columns}"
            )
        rows[split] = [
            {
                "id": f"{dataset}/{name}/{i}",
                "image": row[image],
                "caption": row[caption][0] if isinstance(row[caption], list) else row[caption],
                "objects": row.get("objects"),
            }
            for i, row in enumerate(part)
        ]
    if "train" not in rows:
        raise ValueError(f"dataset {dataset!r} has no train split; it has: {', '.join(loaded)}")
    return rows


def _objects(raw, caption: str, size: tuple[int, int], where: str) -> list[dict] | None:
    """Objects `{"words", "positions", "mask"}` from a metadata `objects` entry (`{"words", "box"}` in
    pixels, optional `positions`: the caption's word indices); `None` without one."""
    if not raw:
        return None
    if not isinstance(raw, list):
        raise ValueError(f"{where}: `objects` must be a list of {{words, box}}, got {raw!r}")
    words = caption.split()
    taken: set[int] = set()
    width, height = size
    out = []
    for item in raw:
        if not isinstance(item, dict) or "words" not in item or "box" not in item:
            raise ValueError(f"{where}: each object needs `words` and `box` [x0, y0, x1, y1], got {item!r}")
        names = [normalise_caption(w) for w in item["words"]]
        positions = item.get("positions")
        if positions is None:  # the first occurrences of its words not taken by an earlier object
            positions = [
                next((i for i, w in enumerate(words) if w == n and i not in taken), None) for n in names
            ]
        if any(p is None or not 0 <= p < len(words) for p in positions):
            raise ValueError(f"{where}: object words {item['words']} are not all in the caption {caption!r}")
        taken.update(positions)
        x0, y0, x1, y1 = (float(v) for v in item["box"])
        mask = np.zeros((height, width), dtype=bool)
        mask[max(0, int(y0)) : int(np.ceil(y1)), max(0, int(x0)) : int(np.ceil(x1))] = True
        if not mask.any():
            raise ValueError(f"{where}: object box {item['box']} lies outside the {width}x{height} image")
        out.append({"words": names, "positions": [int(p) for p in positions], "mask": mask})
    return out


def load_caption_dataset(
    dataset: str,
    image_column: str | None = None,
    caption_column: str | None = None,
    limits: dict[str, int | None] | None = None,
    seed: int = 0,
    image_size: int = 112,
    max_distractors: int = 2,
) -> CaptionData:
    """Load `dataset` (see the module docstring) into `CaptionData`.

    Args:
        limits: `{split: N}`: for `shapes`, how many are generated (`None`: `SHAPES_DEFAULT_SIZES`); for the
            other sources, keep the first N rows (`None`: all).
        seed, image_size, max_distractors: of the `shapes` generator.

    Raises:
        ValueError: an image folder without a metadata file or without a caption column, a metadata file
            naming missing images, an image that does not decode, an empty caption or split.
    """
    limits = limits or {}
    if dataset == "shapes":
        sizes = {s: limits.get(s) if limits.get(s) is not None else SHAPES_DEFAULT_SIZES[s] for s in SPLITS}
        data = generate_shapes(sizes, seed, image_size, max_distractors)
        data.splits = {
            s: [{**r, "caption": normalise_caption(r["caption"])} for r in rows]
            for s, rows in data.splits.items()
        }
    else:
        path = Path(dataset)
        if path.is_dir():
            raw, source = _image_folder(path, caption_column), {"dataset": dataset, "kind": "image folder"}
        elif path.exists():
            raise ValueError(
                f"dataset {dataset!r} is a file; give the image folder holding it and its metadata file"
            )
        else:
            raw, source = (
                _hub_rows(dataset, image_column, caption_column, limits),
                {
                    "dataset": dataset,
                    "kind": "Hub dataset",
                },
            )
        raw = with_all_splits(raw, path.name)
        splits = {}
        for split in SPLITS:
            rows = []
            for row in raw[split][: limits.get(split)]:
                where = f"dataset {dataset!r}, {split} split, {row['id']}"
                image = decoded_image(row["image"], where)
                caption = normalise_caption(row["caption"])
                objects = _objects(row["objects"], caption, image.size, where)
                rows.append({"id": row["id"], "image": image, "caption": caption, "objects": objects})
            splits[split] = rows
        data = CaptionData(splits, source)
    for split, rows in data.splits.items():
        if not rows:
            raise ValueError(f"split {split!r} of dataset {dataset!r} has no example")
    return data
