"""benchmarks/long_document.py: the +18 % verdict follows REPRODUCTION.md's rule, and a summary's rows are
ratios of the same rounds (on a tiny model: the logic, not the timings)."""

from __future__ import annotations

import argparse

import long_document
import pytest
import torch
from helpers import tiny_model
from safetensors.torch import load_file

from hf_gate_attention import is_patched


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
    rows = long_document.measure_length(long_document.PatchedCases(model), 40, args)
    assert [row["case"] for row in rows] == long_document.CASES
    by_case = {row["case"]: row for row in rows}
    assert by_case["ungated"]["speedup"] == 1.0
    assert by_case[long_document.DENSE]["speedup_vs_dense"] == 1.0
    for row in rows:
        assert row["rounds"] == 2 and row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["summary_s"] > row["prefill_s"] > 0 and row["decode_s"] > 0
    assert not any("forward" in module.__dict__ for module in model.modules())  # left ungated


def test_trained_runs_are_the_runs_with_weights(recipe_results, tmp_path):
    """`--trained`: one model per run whose weights are in `<run>/model`, loaded as trained (the gated runs
    patched, their gate weights those saved), the ungated run the reference, the first dense gated run the
    dense one; rows as in the untrained mode."""
    runs = long_document.TrainedRuns(recipe_results)
    assert runs.cases == ["baseline", "output-headwise", "output-headwise-b", "qk-elementwise"]
    assert (runs.baseline, runs.dense) == ("baseline", "output-headwise")
    assert not is_patched(runs.models["baseline"]) and is_patched(runs.models["output-headwise"])
    saved = load_file(recipe_results / "output-headwise" / "model" / "model.safetensors")
    state = runs.models["output-headwise"].state_dict()
    gate_keys = [key for key in saved if "attn_gate" in key]
    assert gate_keys and all(torch.equal(state[key], saved[key]) for key in gate_keys)
    rows = long_document.measure_length(runs, 24, argparse.Namespace(rounds=1, new_tokens=1))
    assert [row["case"] for row in rows] == runs.cases
    assert {row["case"]: row["speedup"] for row in rows}["baseline"] == 1.0
    only = long_document.TrainedRuns(recipe_results, ["baseline", "qk-elementwise"])
    assert only.cases == ["baseline", "qk-elementwise"] and only.dense == "qk-elementwise"
    assert long_document.TrainedRuns(recipe_results, ["baseline"]).dense == "baseline"  # none gated


def test_trained_runs_need_an_ungated_run_with_weights(recipe_results):
    with pytest.raises(SystemExit, match="no ungated run with weights"):
        long_document.TrainedRuns(recipe_results, ["output-headwise"])


def test_real_text_documents_are_the_longest_test_prompt(recipe_results):
    """`--real-text`: each length's document is the longest of the test papers' prompts built by the recipe
    within that length (the length itself where a paper fills it), and the rows record its tokens."""
    from hf_gate_attention.recipes.common.summaries.generation import generation_prompts

    runs = long_document.TrainedRuns(recipe_results, ["baseline"], real_text=True)
    prompts = generation_prompts(runs.test_set, runs.tokenizer, runs.config.replace(doc_token_budget=16))
    short, long = runs.tokens(16), runs.tokens(48)
    assert short.tolist() == [max(prompts, key=len)]
    assert short.shape[1] == 16 and 16 < long.shape[1] <= 48
    assert torch.equal(runs.tokens(16), short)  # the same document in every round
    [row] = long_document.measure_length(runs, 16, argparse.Namespace(rounds=1, new_tokens=1))
    assert row["prompt_tokens"] == short.shape[1]
    random_ids = long_document.TrainedRuns(recipe_results, ["baseline"])
    assert random_ids.tokens(16).shape == (1, 16)
