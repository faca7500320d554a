"""`recipe summarization lengths`: ROUGE of the trained runs with the test prompts cut to other lengths."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers import REPO

from hf_gate_attention.files import read_json
from hf_gate_attention.recipes.common.summaries import pipeline
from hf_gate_attention.recipes.summarization import lengths, reproduction
from hf_gate_attention.recipes.summarization.lengths import LENGTHS_FOLDER, evaluate_lengths, length_rows


@pytest.fixture
def results(recipe_results, tmp_path):
    """A copy of the session's real results folder (tiny Llama, 256 positions, trained on 48-token
    prompts)."""
    return shutil.copytree(recipe_results, tmp_path / recipe_results.name)


def test_each_length_evaluates_every_run_against_the_baseline_at_that_length(results, monkeypatch):
    report = evaluate_lengths(results, [96])
    names = [run["name"] for run in read_json(results / "config.json")["runs"]]
    for name in names:
        quality = read_json(results / LENGTHS_FOLDER / "96" / name / "quality.json")
        assert quality["num_examples"] == read_json(results / name / "quality.json")["num_examples"]
    rows = length_rows(results)
    assert [(row["length"], row["run"]) for row in rows] == [(n, name) for n in (48, 96) for name in names]
    setup = read_json(results / LENGTHS_FOLDER / "setup.json")
    tokens = {length: setup[length]["mean_prompt_tokens"] for length in ("48", "96")}
    assert 0 < tokens["48"] <= 48 and tokens["48"] <= tokens["96"] <= 96
    assert setup["48"]["batch_size"] == setup["96"]["batch_size"] == 3  # the recipe's generation_batch_size
    for row in rows:  # the baseline has no delta; a gated run's is against the baseline of its length
        assert (row["delta"] is None) == (row["run"] == names[0])
        if row["delta"] is not None:
            assert row["delta"]["low"] <= row["delta"]["delta"] <= row["delta"]["high"]
            assert row["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    text = report.read_text(encoding="utf-8")
    assert "| 96 |" in text and "| 48 |" in text and "trained on prompts of at most 48 tokens" in text

    def fail(*args, **kwargs):
        raise AssertionError("a run evaluated at this length was evaluated again")

    monkeypatch.setattr(pipeline, "evaluate_quality", fail)  # resumable: nothing left to generate
    evaluate_lengths(results, [96])


def test_every_run_of_a_length_takes_the_same_batch_size(results):
    gated = read_json(results / "config.json")["runs"][1]["name"]
    evaluate_lengths(results, [64], [gated], batch_size=1)
    assert read_json(results / LENGTHS_FOLDER / "setup.json")["64"]["batch_size"] == 1
    with pytest.raises(ValueError, match="pass --batch-size 1, or delete"):
        evaluate_lengths(results, [64])  # the recipe's 3 at a time
    evaluate_lengths(results, [64], batch_size=1)  # the same size resumes
    assert [row["batch_size"] for row in length_rows(results) if row["length"] == 64] == [1] * 4


def test_runs_selects_runs_and_keeps_the_baseline(results):
    gated = read_json(results / "config.json")["runs"][1]["name"]
    evaluate_lengths(results, [64], [gated])
    assert sorted(p.name for p in (results / LENGTHS_FOLDER / "64").iterdir()) == sorted(["baseline", gated])


@pytest.mark.parametrize(
    ("tokens", "runs", "batch", "message"),
    [
        ([251], None, None, "accepted: up to 250"),  # 256 positions, 6 new tokens
        ([0], None, None, "positive number of tokens"),
        ([48], None, None, "the runs' own length"),
        ([64], None, 0, re.escape("--batch-size 0: summaries at a time is a positive number")),
        ([64], ["nope"], None, re.escape("runs ['nope'] are not in")),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(results, tokens, runs, batch, message):
    with pytest.raises(ValueError, match=message):
        evaluate_lengths(results, tokens, runs, batch)
    assert not (results / LENGTHS_FOLDER).exists()


def test_runs_without_weights_name_the_recreate_command(results, capsys):
    gated = read_json(results / "config.json")["runs"][1]["name"]
    shutil.rmtree(results / gated / "model")
    assert lengths.main([str(results), "--tokens", "64"]) == 2
    error = capsys.readouterr().err
    assert f"recipe summarization recreate {results} {gated}" in error


def test_the_committed_lengths_report_is_what_its_command_writes(monkeypatch):
    monkeypatch.chdir(REPO)
    results = Path("results/reproduce")
    assert (results / "lengths.md").read_text(encoding="utf-8") == lengths.lengths_report(results)


def test_reproduction_report_judges_quality_per_length_where_lengths_were_evaluated(results):
    assert reproduction._quality_at_lengths(results) == ([], "")
    evaluate_lengths(results, [64])
    lines, holds = reproduction._quality_at_lengths(results)
    verdicts = [row["verdict"] for row in length_rows(results)]
    assert "## Quality at long-document lengths" in lines and lines[-1] == f"The {holds}."
    assert holds.endswith("no run, at no length") == ("reproduced" not in verdicts)
    assert lengths.lengths_table(length_rows(results)) in lines
    report = reproduction.reproduction_report(results, "test")
    assert f"section *Quality at long-document lengths*): the {holds}." in report
