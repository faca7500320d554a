"""Clips with a passage and questions for the video QA recipe, and where the objects a question names are in
each frame.

Every source is read into the same clips `{"id", "frames": [PIL.Image (RGB)] * clip_frames, "passage": str,
"questions": [{"question", "answer", "kind", "objects": [index into masks]}], "masks": [(frames, H, W) bool]
| None}`, a question's `kind` one of `KINDS`:

- `clips` (offline, generated): two coloured shapes of the captioning recipe's kind; in each clip one of them
  moves, appears after the first frame, or changes colour. The passage names each shape and says where it
  came from and what it will do next (facts no frame shows; it never names a colour). Three questions per
  clip: `frames` (answered by the frames alone: "which shape moves ?", "what colour is the circle at the end
  ?"), `text` (by the passage alone: "where did tom come from ?"), `both` ("what colour is tom at the end ?":
  the passage says which shape tom is, the frames its colour). Each clip is drawn from its own seed
  `(seed, split, index)`; every object keeps its mask in every frame (empty where it is not shown).
- a folder with a `metadata.jsonl` / `metadata.csv`, one row per question: `frames` (a list of image files,
  relative to the folder), `passage`, `question`, `answer`, `kind`, optionally `objects`, a list of
  `{"boxes": [[x0, y0, x1, y1] or null per frame]}` in pixels (the objects the question names); split
  subfolders (`train/`, ...) or one folder whose validation/test rows are carved out by the fixed rule.
- a Hub dataset id, or a folder `datasets.load_dataset` reads (parquet, ...), with the columns of the config
  (`frames_column`, ...; frames a list of images).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...files import require_hub_id_or_existing_path
from ..common.encoder_decoder import normalise_caption
from ..common.image_files import (
    SPLIT_NAMES,
    SPLITS,
    decoded_image,
    metadata_file,
    read_metadata,
    with_all_splits,
)
from ..common.shapes import COLOURS, SHAPES, place_shape, shape_mask

KINDS = ("frames", "text", "both")
NEEDS_PASSAGE = ("text", "both")
EVENTS = ("moves", "appears", "changes colour")
NAMES = ("tom", "ana", "bo", "kim", "max", "eve", "sam", "lia")
ORIGINS = ("shop", "park", "sea", "farm", "city", "hill")
ACTIONS = ("sleep", "jump", "swim", "sing", "run", "eat")
CLIPS_DEFAULT_SIZES = {"train": 1200, "validation": 100, "test": 200}
SPLIT_SEEDS = {"train": 10, "validation": 11, "test": 12}


@dataclass
class VideoQAData:
    """Clips of every split (see the module docstring) and where they came from."""

    splits: dict[str, list[dict]]
    source: dict = field(default_factory=dict)

    def questions(self, split: str) -> list[dict]:
        """The questions of a split in order, each with its `clip` index."""
        return [{**q, "clip": i} for i, clip in enumerate(self.splits[split]) for q in clip["questions"]]

    def fingerprint_rows(self) -> dict[str, list[dict]]:
        """What `data_fingerprint` hashes per split: every clip's frames, texts and masks."""
        return {
            split: [
                {
                    "id": clip["id"],
                    "frames": [frame.tobytes() for frame in clip["frames"]],
                    "passage": clip["passage"],
                    "questions": clip["questions"],
                    "masks": [np.packbits(m).tobytes() for m in clip["masks"] or []],
                }
                for clip in clips
            ]
            for split, clips in self.splits.items()
        }


# ------------------------------------------------------------------------------------------ generated clips


def _track(rng, size: int, half: float, other: tuple, frames: int, moves: bool) -> list | None:
    """Centres per frame of a shape that keeps clear of `other` (`(x, y, half)`): fixed, or moving in a
    straight line by at least a quarter of the frame; `None` when no such path is found."""
    for _ in range(50):
        start = place_shape(rng, size, half, [other], margin=3)
        if start is None:
            return None
        if not moves:
            return [start] * frames
        end = place_shape(rng, size, half, [other], margin=3)
        if end is None or np.hypot(end[0] - start[0], end[1] - start[1]) < size / 4:
            continue
        path = [tuple(np.add(start, np.subtract(end, start) * t / (frames - 1))) for t in range(frames)]
        if all(place_shape(_Fixed(p), size, half, [other], 2) is not None for p in path):
            return path
    return None


class _Fixed:
    """An rng whose `uniform` returns one point: `place_shape` then only checks it."""

    def __init__(self, point):
        self.point = point

    def uniform(self, *args):
        return np.asarray(self.point, dtype=float)


def clip_example(seed: int, split: str, index: int, frames: int = 4, size: int = 112) -> dict:
    """One generated clip (see the module docstring), drawn from its own seed."""
    from PIL import Image

    rng = np.random.default_rng([seed, SPLIT_SEEDS[split], index])
    while True:
        shapes = [str(s) for s in rng.choice(SHAPES, 2, replace=False)]
        colours = [str(c) for c in rng.choice(list(COLOURS), 3, replace=False)]  # the third: a new colour
        halves = rng.uniform(0.10, 0.13, 2) * size
        event, actor = str(rng.choice(EVENTS)), int(rng.integers(2))
        still = 1 - actor
        fixed = place_shape(rng, size, halves[still], [], margin=0)
        path = _track(rng, size, halves[actor], (*fixed, halves[still]), frames, event == "moves")
        if path is not None:
            break
    centres = [None, None]
    centres[still], centres[actor] = [fixed] * frames, path
    shown_from = int(rng.integers(1, frames)) if event != "moves" else 0  # the frame it appears / turns
    colour = [[colours[i]] * frames for i in range(2)]
    if event == "changes colour":
        colour[actor] = [colours[actor]] * shown_from + [colours[2]] * (frames - shown_from)
    background = rng.integers(195, 240) + rng.integers(-8, 9, 3)
    images, masks = [], np.zeros((2, frames, size, size), dtype=bool)
    for f in range(frames):
        pixels = np.clip(background + rng.integers(-6, 7, (size, size, 3)), 0, 255).astype(np.int16)
        for i in range(2):
            if i == actor and event == "appears" and f < shown_from:
                continue
            masks[i, f] = shape_mask(shapes[i], centres[i][f], halves[i], size)
            pixels[masks[i, f]] = np.clip(
                np.asarray(COLOURS[colour[i][f]]) + rng.integers(-15, 16, 3), 0, 255
            )
        images.append(Image.fromarray(pixels.astype(np.uint8), "RGB"))
    names = [str(n) for n in rng.choice(NAMES, 2, replace=False)]
    origins = [str(o) for o in rng.choice(ORIGINS, 2, replace=False)]
    actions = [str(a) for a in rng.choice(ACTIONS, 2, replace=False)]
    passage = " ".join(
        f"{names[i]} is the {shapes[i]} . {names[i]} came from the {origins[i]} . next {names[i]} will "
        f"{actions[i]} ."
        for i in rng.permutation(2)
    )
    j = int(rng.integers(2))  # the object the other questions ask about
    event_question = {"moves": "which shape moves ?", "appears": "which shape appears ?"}
    if event in event_question and rng.random() < 0.5:
        by_frames = (event_question[event], shapes[actor], actor)
    else:
        by_frames = (f"what colour is the {shapes[j]} at the end ?", colour[j][-1], j)
    by_text = [
        (f"where did {names[j]} come from ?", origins[j]),
        (f"what will {names[j]} do next ?", actions[j]),
        (f"which shape is {names[j]} ?", shapes[j]),
    ][int(rng.integers(3))]
    if rng.random() < 0.5:
        by_both = (f"what colour is {names[j]} at the end ?", colour[j][-1], j)
    else:
        by_both = (f"where did the shape that {event} come from ?", origins[actor], actor)
    questions = [
        {"question": by_frames[0], "answer": by_frames[1], "kind": "frames", "objects": [by_frames[2]]},
        {"question": by_text[0], "answer": by_text[1], "kind": "text", "objects": [j]},
        {"question": by_both[0], "answer": by_both[1], "kind": "both", "objects": [by_both[2]]},
    ]
    return {
        "id": f"clips/{split}/{index}",
        "frames": images,
        "passage": passage,
        "questions": questions,
        "masks": [masks[0], masks[1]],
        "event": event,
    }


def generate_clips(
    sizes: dict[str, int], seed: int = 0, frames: int = 4, image_size: int = 112
) -> VideoQAData:
    """The `clips` set: `sizes[split]` clips per split (see `clip_example`)."""
    splits = {
        split: [clip_example(seed, split, i, frames, image_size) for i in range(sizes[split])]
        for split in SPLITS
    }
    source = {
        "dataset": "clips",
        "kind": "generated",
        "seed": seed,
        "frames": frames,
        "image_size": image_size,
    }
    return VideoQAData(splits, source | {"events": list(EVENTS), "kinds": list(KINDS)})


# ------------------------------------------------------------------------------ folders and the Hub


def _folder_records(folder: Path, frames_column: str) -> list[dict]:
    """The rows of one folder's metadata file, frames as paths (checked to exist)."""
    metadata = metadata_file(folder)
    if metadata is None:
        raise ValueError(
            f"video QA folder {folder} has no metadata.jsonl or metadata.csv (one row per question: "
            f"{frames_column}, passage, question, answer, kind)"
        )
    rows = read_metadata(metadata)
    if not rows:
        raise ValueError(f"{metadata} holds no row")
    for number, row in enumerate(rows):
        frames = row.get(frames_column)
        if isinstance(frames, str):  # a CSV holds the list as JSON text, or one subfolder of frames
            import json

            frames = json.loads(frames) if frames.strip().startswith("[") else frames
        if isinstance(frames, str) and (folder / frames).is_dir():
            frames = sorted(p.name for p in (folder / frames).iterdir() if p.is_file())
            frames = [str(Path(row[frames_column]) / name) for name in frames]
        if not isinstance(frames, list) or not frames:
            raise ValueError(
                f"{metadata}, row {number}: `{frames_column}` must list the frames, got {frames!r}"
            )
        missing = [name for name in frames if not (folder / str(name)).is_file()]
        if missing:
            raise ValueError(
                f"{metadata}, row {number}: frames missing from {folder}: {', '.join(missing[:5])}"
            )
        row[frames_column] = [folder / str(name) for name in frames]
    return rows


def _hub_records(dataset: str, limits: dict) -> dict[str, list[dict]]:
    import datasets
    from huggingface_hub import is_offline_mode

    local = Path(dataset).is_dir()
    if not local:
        require_hub_id_or_existing_path(dataset, "dataset")
        if is_offline_mode():
            raise ValueError(
                f"dataset {dataset!r} is not a local folder, and the Hub is off (HF_HUB_OFFLINE): use the "
                "offline `clips` set or a folder with a metadata file"
            )
    try:
        loaded = datasets.load_dataset(dataset)
    except (ConnectionError, TimeoutError) as err:
        raise ValueError(f"dataset {dataset!r} cannot be loaded ({err})") from None
    records = {}
    for split in SPLITS:
        name = next((n for n in SPLIT_NAMES[split] if n in loaded), None)
        if name is not None:
            part = loaded[name]
            if limits.get(split) is not None:
                part = part.select(range(min(limits[split], len(part))))
            records[split] = list(part)
    if "train" not in records:
        raise ValueError(f"dataset {dataset!r} has no train split; it has: {', '.join(loaded)}")
    return records


def _boxes_to_masks(objects, frames: int, size: tuple[int, int], where: str) -> list[np.ndarray] | None:
    if not objects:
        return None
    if not isinstance(objects, list):
        raise ValueError(
            f"{where}: `objects` must be a list of {{boxes: [box or null per frame]}}, got {objects!r}"
        )
    width, height = size
    masks = []
    for item in objects:
        boxes = item.get("boxes") if isinstance(item, dict) else None
        if not isinstance(boxes, list) or len(boxes) != frames:
            raise ValueError(
                f"{where}: each object needs `boxes`, one [x0, y0, x1, y1] or null per frame ({frames})"
            )
        mask = np.zeros((frames, height, width), dtype=bool)
        for f, box in enumerate(boxes):
            if box is not None:
                x0, y0, x1, y1 = (float(v) for v in box)
                mask[f, max(0, int(y0)) : int(np.ceil(y1)), max(0, int(x0)) : int(np.ceil(x1))] = True
        masks.append(mask)
    return masks


def clip_from_record(
    record: dict, columns: dict[str, str], clip_frames: int, where: str, clip_id: str
) -> dict:
    """A one-question clip from a metadata or Hub row; `ValueError` naming `where` for a wrong frame count, an
    unknown kind, an empty question or answer, or a missing passage where the kind needs one."""
    frames = record.get(columns["frames"])
    if not isinstance(frames, list | tuple) or not frames:
        raise ValueError(f"{where}: no frames in `{columns['frames']}`")
    if len(frames) != clip_frames:
        raise ValueError(
            f"{where}: {len(frames)} frame(s); clip_frames={clip_frames}: every clip needs that many"
        )
    kind = record.get(columns["kind"])
    if kind not in KINDS:
        raise ValueError(f"{where}: kind {kind!r} is not accepted; accepted: {', '.join(KINDS)}")
    texts = {}
    for key in ("passage", "question", "answer"):
        value = record.get(columns[key])
        texts[key] = normalise_caption(value) if isinstance(value, str) else ""
    if not texts["question"] or not texts["answer"]:
        empty = "question" if not texts["question"] else "answer"
        raise ValueError(f"{where}: the {empty} (`{columns[empty]}`) is empty")
    if kind in NEEDS_PASSAGE and not texts["passage"]:
        raise ValueError(
            f"{where}: a {kind!r} question needs a passage (`{columns['passage']}`), and it has none; only "
            "'frames' questions may come without one"
        )
    images = [decoded_image(frame, where) for frame in frames]
    masks = _boxes_to_masks(record.get("objects"), clip_frames, images[0].size, where)
    question = {"question": texts["question"], "answer": texts["answer"], "kind": kind}
    question["objects"] = list(range(len(masks))) if masks else []
    return {
        "id": clip_id,
        "frames": images,
        "passage": texts["passage"],
        "questions": [question],
        "masks": masks,
    }


def load_video_qa(
    dataset: str,
    columns: dict[str, str] | None = None,
    limits: dict[str, int | None] | None = None,
    seed: int = 0,
    clip_frames: int = 4,
    image_size: int = 112,
) -> VideoQAData:
    """Load `dataset` (see the module docstring) into `VideoQAData`.

    Args:
        columns: `{"frames", "passage", "question", "answer", "kind"}` -> the source's column names.
        limits: `{split: N}`: for `clips`, how many are generated (`None`: `CLIPS_DEFAULT_SIZES`); else the
            first N rows (`None`: all).
    """
    limits = limits or {}
    columns = {key: key for key in ("frames", "passage", "question", "answer", "kind")} | (columns or {})
    if dataset == "clips":
        sizes = {s: limits.get(s) if limits.get(s) is not None else CLIPS_DEFAULT_SIZES[s] for s in SPLITS}
        data = generate_clips(sizes, seed, clip_frames, image_size)
    else:
        path = Path(dataset)
        if path.is_file():
            raise ValueError(f"dataset {dataset!r} is a file; give the folder holding it and its frames")
        if path.is_dir() and (
            metadata_file(path) or any(metadata_file(path / n) for n in SPLIT_NAMES["train"])
        ):
            subfolders = {
                split: path / name
                for split in SPLITS
                for name in SPLIT_NAMES[split]
                if (path / name).is_dir() and metadata_file(path / name)
            }
            if subfolders and "train" not in subfolders:
                raise ValueError(f"folder {path} has split folders {sorted(subfolders)} but no train/")
            folders = subfolders or {"train": path}
            raw = {split: _folder_records(f, columns["frames"]) for split, f in folders.items()}
            source = {"dataset": dataset, "kind": "folder"}
        else:
            raw, source = _hub_records(dataset, limits), {"dataset": dataset, "kind": "Hub dataset"}
        raw = with_all_splits(raw, path.name)
        splits = {}
        for split in SPLITS:
            splits[split] = [
                clip_from_record(
                    record,
                    columns,
                    clip_frames,
                    f"dataset {dataset!r}, {split} split, row {i}",
                    f"{split}/{i}",
                )
                for i, record in enumerate(raw[split][: limits.get(split)])
            ]
        data = VideoQAData(splits, source)
    for split, clips in data.splits.items():
        if not clips:
            raise ValueError(f"split {split!r} of dataset {dataset!r} has no clip")
    return data
