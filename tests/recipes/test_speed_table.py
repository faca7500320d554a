"""The speed table shared by the recipes' reports (`recipes/common/speed.py`): ratios are medians of per-round
ratios shown with their range, the absolute columns are the reference's medians times the ratios, and
ratios whose rounds disagree are marked noisy. Built from fake rounds with known values."""

from __future__ import annotations

import csv
import io
import statistics

import pytest

from hf_gate_attention.recipes.classification import report as classification_report
from hf_gate_attention.recipes.common.speed import NOISY_NOTE, is_noisy, ratio_cell, ratio_stats, speed_table
from hf_gate_attention.recipes.common.summaries.report import SPEED_COLUMNS, csv_table, markdown_table


def _speed(prefill: list[float], decode: list[float], seconds: list[float], memory: float) -> dict:
    rounds = [
        {"prefill_tokens_per_s": p, "decode_tokens_per_s": d, "seconds_per_summary": s}
        for p, d, s in zip(prefill, decode, seconds, strict=True)
    ]
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return medians | {"rounds": rounds, "peak_memory_mb": memory, "new_tokens": 8}


BASELINE = _speed([100.0, 200.0, 400.0], [10.0, 20.0, 40.0], [4.0, 2.0, 1.0], 500.0)
# every round 0.94-0.96 of the baseline: quiet
QUIET = _speed([94.0, 190.0, 384.0], [9.5, 18.8, 38.4], [4.0 / 0.95, 2.0 / 0.94, 1.0 / 0.96], 510.0)
# decode: 0.9, 0.1 (a busy round), 0.9: the run's own median (9) / the baseline's (20) would read 0.45
NOISY = _speed([94.0, 190.0, 384.0], [9.0, 2.0, 36.0], [4.0 / 0.95, 2.0 / 0.94, 1.0 / 0.96], 490.0)


def _row(name: str, speed: dict) -> dict:
    score = {"mean": 20.0, "low": 18.0, "high": 22.0}
    return {
        "run": name,
        "gate": None,
        "trainable_params": 10,
        "global_step": 2,
        "rouge": {t: score for t in ("rouge1", "rouge2", "rougeL", "rougeLsum")},
        "speed": speed,
    }


def _table_rows(lines: list[str]) -> dict[str, list[str]]:
    """`{run: cells}` of the Markdown table rows in `lines` (a line may hold several)."""
    rows = [line for line in "\n".join(lines).splitlines() if line.startswith("| ")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


@pytest.mark.parametrize(
    ("ratio", "low", "high", "noisy"),
    [
        (1.00, 0.96, 1.04, False),  # spans 8 % of the median
        (1.00, 0.94, 1.06, True),  # spans 12 %
        (0.90, 0.86, 0.94, False),  # 9 %, all slower
        (0.94, 0.93, 1.01, True),  # a faster and a slower round, median claims -6 %
        (0.97, 0.93, 1.01, False),  # a faster and a slower round, median claims -3 % only
        (1.80, 1.75, 1.90, False),  # 8 % of the median (not 0.15 absolute)
    ],
)
def test_noisy_rule(ratio, low, high, noisy):
    assert is_noisy(ratio, low, high) is noisy


def test_ratio_cell():
    assert (
        ratio_cell({"ratio": 0.969, "low": 0.948, "high": 1.021, "noisy": False})
        == "x0.969 [0.948, 1.021] (-3.1 %)"
    )
    assert (
        ratio_cell({"ratio": 0.708, "low": 0.08, "high": 1.1, "noisy": True}) == "x0.708 [0.080, 1.100] noisy"
    )
    assert ratio_cell({"ratio": 1.021, "low": None, "high": None, "noisy": False}) == "x1.021 (+2.1 %)"


def test_ratios_are_medians_of_per_round_ratios_with_their_range():
    stats = ratio_stats(NOISY, BASELINE, SPEED_COLUMNS)
    assert stats["decode"] == pytest.approx({"ratio": 0.9, "low": 0.1, "high": 0.9, "noisy": True})
    assert stats["speedup"] == pytest.approx({"ratio": 0.95, "low": 0.94, "high": 0.96, "noisy": False})
    assert stats["prefill"] == pytest.approx({"ratio": 0.95, "low": 0.94, "high": 0.96, "noisy": False})
    assert stats["peak_memory"] == {"ratio": 0.98, "low": None, "high": None, "noisy": False}


def test_a_quiet_table_shows_ranges_and_columns_consistent_with_the_ratios():
    lines = speed_table(
        [_row("baseline", BASELINE), _row("gated", QUIET)], "baseline", SPEED_COLUMNS, "Speed"
    )
    rows = _table_rows(lines)
    assert rows["baseline"] == ["200.0", "20.0", "2.000", "500.0", "-", "-", "-", "-"]
    prefill, decode, seconds, memory, *ratios = rows["gated"]
    assert ratios == [
        "x0.950 [0.940, 0.960] (-5.0 %)",
        "x0.950 [0.940, 0.960] (-5.0 %)",
        "x0.950 [0.940, 0.960] (-5.0 %)",
        "x1.020 (+2.0 %)",
    ]
    # the absolute columns: the baseline's medians x the ratio (time: / the ratio)
    assert (prefill, decode, seconds, memory) == ("190.0", "19.0", "2.105", "510.0")
    assert not any("noisy" in line for line in lines)
    assert "baseline's median over the rounds; each other row is that median x its ratio" in "\n".join(lines)


def test_a_noisy_ratio_is_marked_and_the_table_says_to_rerun():
    lines = speed_table(
        [_row("baseline", BASELINE), _row("gated", NOISY)], "baseline", SPEED_COLUMNS, "Speed"
    )
    gated = _table_rows(lines)["gated"]
    assert gated[5] == "x0.900 [0.100, 0.900] noisy"
    assert gated[4] == "x0.950 [0.940, 0.960] (-5.0 %)"  # the quiet ratios of the same run are not marked
    # decode tok/s: 20 x 0.9 = 18.0, consistent with the ratio shown, not the run's own median 9.0
    assert gated[1] == "18.0" and NOISY["decode_tokens_per_s"] == 9.0
    assert lines[-1] == NOISY_NOTE and "rerun on an idle machine" in NOISY_NOTE


def test_each_row_divided_by_the_reference_gives_the_ratio_shown():
    rows = [_row("gated", NOISY), _row("quiet", QUIET), _row("teacher", BASELINE)]
    text = markdown_table(rows, 0.95, reference="gated", speed_reference="teacher")
    table = _table_rows(text.split("Inference speed")[1].splitlines())
    reference = [float(cell) for cell in table["teacher"][:3]]
    for name in ("gated", "quiet"):
        cells = table[name]
        shown = [float(cell.split()[0].lstrip("x")) for cell in cells[4:7]]
        values = [float(cell) for cell in cells[:3]]
        assert values[0] / reference[0] == pytest.approx(shown[0], abs=1e-3)
        assert values[1] / reference[1] == pytest.approx(shown[1], abs=1e-2)  # tok/s shown with 1 decimal
        assert reference[2] / values[2] == pytest.approx(shown[2], abs=1e-3)  # s/summary: teacher / the run
    assert "Ratio cells: the run / teacher in each of the 3 interleaved rounds" in text


def test_no_reference_row_means_no_ratios_and_own_medians():
    lines = speed_table([_row("a", NOISY), _row("b", QUIET)], None, SPEED_COLUMNS, "Speed")
    # each run's own medians (s/summary: median of 4/0.95, 2/0.94, 1/0.96 = 2.128; derived it would be 2.105)
    assert _table_rows(lines)["a"] == ["190.0", "9.0", "2.128", "490.0", "-", "-", "-", "-"]
    assert (
        lines[-1]
        == "prefill tok/s, decode tok/s, s/summary: each run's median over the 3 interleaved rounds."
    )


def test_csv_has_each_ratio_with_its_range_and_noisy_flag():
    text = csv_table([_row("baseline", BASELINE), _row("gated", NOISY)], speed_reference="baseline")
    baseline, gated = csv.DictReader(io.StringIO(text))
    assert float(gated["decode_ratio"]) == pytest.approx(0.9)
    assert float(gated["decode_ratio_low"]) == pytest.approx(0.1)
    assert float(gated["decode_ratio_high"]) == pytest.approx(0.9)
    assert gated["decode_ratio_noisy"] == "True" and gated["speedup_ratio_noisy"] == "False"
    assert gated["peak_memory_ratio_low"] == "" and float(gated["peak_memory_ratio"]) == pytest.approx(0.98)
    assert float(gated["decode_tokens_per_s"]) == 9.0  # the CSV keeps each run's own median
    assert baseline["decode_ratio"] == baseline["decode_ratio_noisy"] == ""


def test_classification_uses_the_same_table():
    def speed(examples_per_s: list[float]) -> dict:
        rounds = [{"examples_per_s": v, "seconds_per_batch": 1 / v} for v in examples_per_s]
        return {
            "examples_per_s": statistics.median(examples_per_s),
            "seconds_per_batch": statistics.median(1 / v for v in examples_per_s),
            "rounds": rounds,
            "peak_memory_mb": 100.0,
            "batch_size": 8,
            "examples": 32,
        }

    score = {"mean": 0.9, "low": 0.8, "high": 1.0}
    rows = [
        {"run": name, "gate": None, "trainable_params": 1, "global_step": 1, "test_examples": 32}
        | {"quality": {"accuracy": score, "macro_f1": score}, "speed": speed(values)}
        for name, values in (("baseline", [40.0, 40.0, 40.0]), ("gated", [30.0, 50.0, 40.0]))
    ]
    text = classification_report.markdown_table(rows, 0.95)
    gated = _table_rows(text.split("Inference throughput")[1].splitlines())["gated"]
    assert gated == ["40.0", "100.0", "x1.000 [0.750, 1.250] noisy", "x1.000 (+0.0 %)"]
    assert NOISY_NOTE in text
    table = list(csv.DictReader(io.StringIO(classification_report.csv_table(rows))))
    assert table[1]["throughput_ratio_low"] == "0.75" and table[1]["throughput_ratio_noisy"] == "True"
