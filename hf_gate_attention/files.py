"""Files: atomic writes (a temporary file or folder beside the target, then a rename; never a half-written
file or folder) and the one JSON reader."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # same folder: os.replace stays atomic
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


@contextmanager
def staged_folder(path: Path, overwrite: bool = False) -> Iterator[Path]:
    """A new temporary folder beside `path` to write into, renamed to `path` when the block ends without an
    error (replacing `path` only with `overwrite`), removed otherwise."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ValueError(
            f"{path} exists and is not an empty folder; pass overwrite=True (--overwrite) to replace it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    try:
        yield staging
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def atomic_write_folder(path: Path, files: dict[str, bytes], stale: Iterable[str] = ()) -> None:
    """Write `files` (name -> bytes) into the folder `path` through a temporary sibling folder.

    A new folder appears whole (one rename). Into an existing folder each file is moved with `os.replace`
    (each one atomic), then the names in `stale` that `files` does not hold are removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.mkdir()
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        if not path.exists():
            os.replace(tmp, path)
            return
        for name in files:
            os.replace(tmp / name, path / name)
        for name in set(stale) - set(files):
            (path / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or `None` when the file does not exist."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
