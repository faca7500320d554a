"""benchmarks/long_document.py: the +18 % verdict follows REPRODUCTION.md's rule, and a summary's rows are
ratios of the same rounds (on a tiny model: the logic, not the timings)."""

from __future__ import annotations

import argparse

import long_document
import pytest
from decode import Bench
from helpers import tiny_model


@pytest.mark.parametrize(
    ("speedups", "expected"),
    [
        ([1.20, 1.18, 1.31], "reproduced"),
        ([1.10, 1.179, 0.9], "not reproduced"),
        ([1.25, 1.05, 1.19], "inconclusive"),
    ],
)
def test_verdict_is_the_reproduction_rule(speedups, expected):
    assert long_document.speed_verdict(speedups) == expected  # `claims.speed_verdict`, as imported there


def test_rows_of_one_length_on_a_tiny_model():
    model = tiny_model("llama", hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    args = argparse.Namespace(rounds=2, new_tokens=2)
    rows = long_document.measure_length(Bench(model), 40, args)
    assert [row["case"] for row in rows] == long_document.CASES
    by_case = {row["case"]: row for row in rows}
    assert by_case["ungated"]["speedup"] == 1.0
    assert by_case[long_document.DENSE]["speedup_vs_dense"] == 1.0
    for row in rows:
        assert row["rounds"] == 2 and row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["summary_s"] > row["prefill_s"] > 0 and row["decode_s"] > 0
    assert not any("forward" in module.__dict__ for module in model.modules())  # left ungated
