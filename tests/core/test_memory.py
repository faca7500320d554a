"""`memory.peak_growth_mib`: the one peak-memory measurement (recipe speed tables, overhead benchmark)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from hf_gate_attention.memory import peak_growth_mib

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self (Linux)")


def test_a_freed_allocation_is_still_seen_at_its_peak():
    def allocate_and_free():
        block = torch.ones(32 * 2**20 // 4)  # 32 MiB of float32, every page written
        del block

    growth = peak_growth_mib(allocate_and_free)
    assert 30 <= growth <= 48, growth  # the block, plus at most a little of the interpreter's own


def test_a_call_that_allocates_nothing_grows_by_almost_nothing():
    existing = torch.ones(32 * 2**20 // 4)  # allocated before the call: not part of its growth
    assert peak_growth_mib(lambda: existing.sum()) < 8


def test_other_systems_get_an_error_not_a_guess(monkeypatch, tmp_path):
    monkeypatch.setattr("hf_gate_attention.memory._STATUS", tmp_path / "no-such-file")
    with pytest.raises(RuntimeError, match="Linux only"):
        peak_growth_mib(lambda: None)


def test_the_recipe_reports_nan_where_memory_cannot_be_measured(monkeypatch, tmp_path):
    from hf_gate_attention.recipes.common.summaries import generation

    monkeypatch.setattr("hf_gate_attention.memory._STATUS", tmp_path / "no-such-file")
    monkeypatch.setattr(generation, "_summarize_one", lambda *args: None)
    assert math.isnan(
        generation.peak_memory_mb(torch.nn.Linear(2, 2), torch.zeros(1, 3, dtype=torch.long), 4)
    )
