"""benchmarks/harness.py: rotated interleaved rounds, per-round ratios, tables written as CSV and Markdown."""

from __future__ import annotations

import csv
import math
import sys

import harness
import pytest


def test_rotated_moves_one_case_per_round():
    cases = ["a", "b", "c"]
    assert [harness.rotated(cases, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_interleaved_warms_up_then_runs_rotated_rounds():
    calls = []

    def run(case):
        calls.append(case)
        return len(calls)

    reported = []
    results = harness.interleaved(run, ["a", "b", "c"], 3, on_round=lambda i, r: reported.append(i))
    # warm-up (untimed, not in the results), then rounds abc, bca, cab
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert results == {"a": [4, 9, 11], "b": [5, 7, 12], "c": [6, 8, 10]}
    assert reported == [0, 1, 2]


def test_interleaved_without_warmup():
    calls = []
    results = harness.interleaved(lambda case: calls.append(case) or case, ["x", "y"], 2, warmup=False)
    assert calls == ["x", "y", "y", "x"]
    assert results == {"x": ["x", "x"], "y": ["y", "y"]}


def test_interleaved_stops_before_a_round_that_would_pass_the_deadline(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])

    def run(case):  # every call takes 1 s: a round of two cases, 2 s
        clock[0] += 1.0
        return clock[0]

    # rounds end at +2 (next would end at +4 <= +5) and +4 (next would end at +6 > +5)
    results = harness.interleaved(run, ["a", "b"], 10, warmup=False, deadline=105.0)
    assert results == {"a": [101.0, 104.0], "b": [102.0, 103.0]}
    # at least one round, even past the deadline
    assert len(harness.interleaved(run, ["a", "b"], 10, warmup=False, deadline=0.0)["a"]) == 1


def test_ratios_pair_each_round_with_its_baseline():
    case = [1.2, 1.1, 1.5]
    base = [1.0, 1.0, 1.5]
    values = harness.ratios(case, base)
    assert values == pytest.approx([1.2, 1.1, 1.0])
    # median of per-round ratios 1.1, not median(case) / median(base) = 1.2
    assert harness.median_range(values) == pytest.approx((1.1, 1.0, 1.2))
    assert harness.median_range([1.1, 0.9, 1.3, 1.0]) == pytest.approx((1.05, 0.9, 1.3))


def test_ratios_leave_out_missing_rounds_and_zero_baselines():
    values = [2.0, 4.0, None, 3.0, math.nan, 6.0]
    bases = [1.0, 2.0, 2.0, 0.0, 1.0, None]
    assert harness.ratios(values, bases) == [2.0, 2.0]
    with pytest.raises(ValueError):  # rounds must pair up
        harness.ratios([1.0], [1.0, 2.0])


def test_ratio_fields():
    assert harness.ratio_fields("speedup_ratio", [2.0, 1.0, 4.0]) == {
        "speedup_ratio": 2.0,
        "speedup_ratio_min": 1.0,
        "speedup_ratio_max": 4.0,
    }
    assert harness.ratio_fields("ratio", []) == {}
    assert (
        harness.ratio_cell(harness.ratio_fields("speed", [0.9, 1.0, 1.2]), "speed") == "x1.000 [0.900, 1.200]"
    )


def test_markdown_table_and_page():
    table = harness.markdown_table(["case", "tokens/s", "note"], [["ungated", "12.5", ""]], "lr")
    assert table == ["| case | tokens/s | note |", "|---|---:|---|", "| ungated | 12.5 |  |"]
    assert harness.markdown_page("`python x.py`", table[:2]) == (
        "`python x.py`\n\n| case | tokens/s | note |\n|---|---:|---|\n"
    )


def test_write_csv_takes_every_rows_columns(tmp_path):
    rows = [{"case": "ungated", "ratio": 1.0}, {"case": "top-1, sink 4", "error": "error: x", "ratio": 0.5}]
    path = tmp_path / "out" / "table.csv"
    harness.write_csv(path, rows)
    text = path.read_text()
    assert text == 'case,ratio,error\nungated,1.0,\n"top-1, sink 4",0.5,error: x\n'
    second = {"case": "top-1, sink 4", "ratio": "0.5", "error": "error: x"}
    assert list(csv.DictReader(text.splitlines()))[1] == second
    assert sorted(p.name for p in path.parent.iterdir()) == ["table.csv"]  # no temporary file left


def test_write_results_writes_csv_and_markdown(tmp_path):
    harness.write_results(tmp_path / "decode", [{"phase": "prefill", "tokens": 8}], "# table\n")
    assert (tmp_path / "decode.csv").read_text() == "phase,tokens\nprefill,8\n"
    assert (tmp_path / "decode.md").read_text() == "# table\n"


def test_publish_writes_the_page_and_prints_the_table(tmp_path, capsys):
    table = harness.markdown_table(["case"], [["ungated"]])
    harness.publish(tmp_path / "t", [{"case": "ungated"}], "# t", table)
    assert (tmp_path / "t.md").read_text() == "# t\n\n| case |\n|---|\n| ungated |\n"
    assert (tmp_path / "t.csv").read_text() == "case\nungated\n"
    assert capsys.readouterr().out == "\n".join(table) + "\n"


def test_command_line_names_the_script_from_the_projects_root(monkeypatch):
    argv = ["/elsewhere/benchmarks/decode.py", "--cases", "top-1 of 3, sink 4 + window 64", "--rounds", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    expected = "python benchmarks/decode.py --cases 'top-1 of 3, sink 4 + window 64' --rounds 1"
    assert harness.command_line() == expected
