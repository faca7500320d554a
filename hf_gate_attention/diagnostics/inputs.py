"""Texts to diagnose, read from a file: a `.jsonl` file (field `text` or `document`) or a text file."""

from __future__ import annotations

import json
from pathlib import Path


def read_texts(path: str) -> list[str]:
    """Documents of a `.jsonl` file (field `text` or `document`) or of a text file (one per line)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"text file {path!r} does not exist")
    lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if file.suffix != ".jsonl":
        return lines
    texts = []
    for number, line in enumerate(lines, 1):
        row = json.loads(line)
        text = row.get("text", row.get("document")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{path}:{number}: expected a JSON object with a 'text' or 'document' string")
        texts.append(text)
    return texts
