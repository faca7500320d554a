"""The committed benchmark results stay what the scripts write: their Markdown tables, rebuilt from the
committed CSVs by the scripts' own `markdown`, are the committed Markdown files."""

from __future__ import annotations

import csv
from pathlib import Path

import decode
import overhead
import pytest

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def read_rows(path: Path, integers: set[str], texts: set[str]) -> list[dict]:
    rows = list(csv.DictReader(path.read_text().splitlines()))
    for row in rows:
        for key, value in row.items():
            if key in integers:
                row[key] = int(value)
            elif key not in texts:
                row[key] = float(value)
    return rows


@pytest.mark.parametrize("name", ["decode", "decode_sink_window", "sparse_prefill_train"])
def test_decode_markdown_is_the_committed_one(name):
    texts = {"phase", "case", "torch", "transformers", "cpu", "command", "dtype", "backend"}
    rows = read_rows(RESULTS / f"{name}.csv", {"tokens", "rounds", "decode_steps"}, texts)
    committed = (RESULTS / f"{name}.md").read_text()
    assert rows[0]["command"] in committed.splitlines()[0]
    assert decode.markdown(rows, committed.splitlines()[0]) == committed


def test_overhead_markdown_is_the_committed_one():
    texts = {"case", "phase", "torch", "transformers", "cpu"}
    rows = read_rows(RESULTS / "overhead_prefill.csv", {"added_params", "seq_len", "repeats"}, texts)
    committed = (RESULTS / "overhead_prefill.md").read_text()
    assert overhead.markdown(rows, committed.splitlines()[0]) == committed
