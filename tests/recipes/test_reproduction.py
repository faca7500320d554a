"""Verdict rules on the article's claims, and REPRODUCTION.md written from a real (tiny) comparison."""

from __future__ import annotations

import json
import shutil

import pytest

from hf_gate_attention.claims import rouge_verdict, speed_verdict
from hf_gate_attention.recipes.common.speed import NOISY_NOTE
from hf_gate_attention.recipes.summarization import reproduction
from hf_gate_attention.recipes.summarization.reproduction import main, reproduction_report

# baseline ROUGE-L 25: the claimed +3.2 % is +0.8 points
ROUGE_CASES = [
    ({"delta": 1.0, "low": 0.2, "high": 1.8}, "reproduced"),  # significant and at least the claim
    ({"delta": 0.5, "low": 0.1, "high": 0.9}, "inconclusive"),  # significant, smaller, CI reaches 0.8
    ({"delta": 0.3, "low": 0.1, "high": 0.7}, "not reproduced"),  # significant but CI below the claim
    ({"delta": 0.2, "low": -0.6, "high": 1.0}, "inconclusive"),  # CI holds 0 and the claim
    ({"delta": -0.9, "low": -1.5, "high": -0.2}, "not reproduced"),
]


@pytest.mark.parametrize(("delta", "verdict"), ROUGE_CASES)
def test_rouge_verdict(delta, verdict):
    assert rouge_verdict(delta, baseline_mean=25.0) == verdict


@pytest.mark.parametrize(
    ("speedups", "verdict"),
    [([1.2, 1.25, 1.19], "reproduced"), ([0.9, 1.0, 1.17], "not reproduced"), ([1.1, 1.3], "inconclusive")],
)
def test_speed_verdict(speedups, verdict):
    assert speed_verdict(speedups) == verdict


@pytest.mark.slow
def test_report_from_a_real_comparison(recipe_results, tmp_path):
    out = tmp_path / "REPRODUCTION.md"
    assert main([str(recipe_results), "--out", str(out)]) == 0
    text = out.read_text()
    comparison = json.loads((recipe_results / "comparison.json").read_text())
    gated = [row for row in comparison["runs"] if row["gate"] is not None]
    for row in gated:
        delta = row["deltas"]["rougeL"]
        assert f"| {row['run']} | {delta['delta']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}]" in text
    assert text.count("\n| ") >= len(gated) + 2 * len(comparison["runs"])
    assert "ROUGE-L +3.2 %: **" in text and "Inference speed +18 %: **" in text
    assert "configs/gpu.yaml" in text and f"--out {out}" in text
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_report_needs_a_baseline(recipe_results, tmp_path, capsys):
    results = tmp_path / "no_baseline"
    shutil.copytree(recipe_results, results, ignore=shutil.ignore_patterns("checkpoints", "model"))
    comparison = json.loads((results / "comparison.json").read_text())
    comparison["runs"] = [row for row in comparison["runs"] if row["gate"] is not None]
    (results / "comparison.json").write_text(json.dumps(comparison))
    with pytest.raises(ValueError, match="no baseline run"):
        reproduction_report(results, "cmd")
    assert main([str(results), "--out", str(tmp_path / "x.md")]) == 2
    assert "no baseline run" in capsys.readouterr().err and not (tmp_path / "x.md").exists()


@pytest.mark.slow
def test_a_baseline_scoring_0_shows_the_relative_changes_as_undefined(recipe_results, tmp_path):
    results = tmp_path / "zero"
    shutil.copytree(recipe_results, results, ignore=shutil.ignore_patterns("checkpoints", "model"))
    comparison = json.loads((results / "comparison.json").read_text())
    for row in comparison["runs"]:  # as `rouge_deltas` writes them against a baseline mean of 0
        metrics = json.loads((results / row["run"] / "metrics.json").read_text())
        for data in (row, metrics):
            if data["gate"] is None:
                data["rouge"]["rougeL"]["mean"] = 0.0
            else:
                data["deltas"]["rougeL"]["percent"] = None
        (results / row["run"] / "metrics.json").write_text(json.dumps(metrics))
    (results / "comparison.json").write_text(json.dumps(comparison))
    text = reproduction_report(results, "cmd")
    gated = [row for row in comparison["runs"] if row["gate"] is not None]
    for row in gated:
        delta = row["deltas"]["rougeL"]
        cell = f"{delta['delta']:+.2f} [{delta['low']:+.2f}, {delta['high']:+.2f}] (n/a (baseline 0))"
        assert f"| {row['run']} | {cell} |" in text  # the verdicts
    undefined = sum(delta["percent"] is None for row in gated for delta in row["deltas"].values())
    assert text.count("(n/a (baseline 0))") == len(gated) + undefined  # and each such cell of the table
    assert "Baseline ROUGE-L 0.00" in text


def test_validation_losses_table_lists_the_last_evaluation_of_each_evaluated_run():
    from hf_gate_attention.recipes.summarization.reproduction import _validation_losses

    history = [{"loss": 3.0, "step": 1}, {"eval_loss": 2.5, "step": 2}, {"eval_loss": 2.25, "step": 4}]
    metrics = {"a": {"training": {"log_history": history}}, "b": {"training": {"log_history": history[:1]}}}
    lines = _validation_losses(metrics)
    assert lines[-1] == "| a | 2.250 | 4 |" and not any(line.startswith("| b |") for line in lines)
    assert _validation_losses({"b": metrics["b"]}) == []


def _run_metrics(name: str, gate: dict | None, rouge_l: list[float], seconds: list[float]) -> dict:
    per_example = {kind: rouge_l for kind in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
    mean = sum(rouge_l) / len(rouge_l)
    return {
        "run": name,
        "gate": gate,
        "rouge": {kind: {"mean": mean} for kind in per_example},
        "quality": {"per_example": per_example, "rouge": {kind: {"mean": mean} for kind in per_example}},
        "speed": {"rounds": [{"seconds_per_summary": s} for s in seconds]},
        "training": {"log_history": [{"eval_loss": 2.0 + mean / 100, "step": 4}]},
    }


@pytest.mark.parametrize(
    ("sparse_scores", "verdict"),
    [([20.0, 30.0, 25.0, 35.0], "yes"), ([10.0, 20.0, 15.0, 25.0], "no"), ([17.0, 33.0, 21.0, 37.0], None)],
)
def test_sparse_runs_are_judged_against_the_same_gate_without_top_k(sparse_scores, verdict):
    from hf_gate_attention.recipes.summarization.reproduction import _sparse_against_dense

    dense_gate = {"variant": "output", "granularity": "headwise", "init": "identity", "top_k": None}
    sparse_gate = dense_gate | {"top_k": 2, "top_k_unit": "kv_group", "top_k_sink": 4, "top_k_window": 64}
    other_gate = dense_gate | {"granularity": "elementwise"}
    metrics = {
        "base": _run_metrics("base", None, [19.0, 29.0, 24.0, 34.0], [1.0, 1.0]),
        "elementwise": _run_metrics("elementwise", other_gate, [0.0, 0.0, 0.0, 0.0], [1.0, 1.0]),
        "dense": _run_metrics("dense", dense_gate, [20.0, 30.0, 25.0, 35.0], [1.0, 1.2]),
        "sparse": _run_metrics("sparse", sparse_gate, sparse_scores, [0.8, 1.0]),
    }
    config = {"n_bootstrap": 200, "confidence": 0.95, "seed": 0}
    lines = _sparse_against_dense(metrics, config)
    (row,) = [line for line in lines if line.startswith("| sparse |")]
    assert "dropped read sink 4 + window 64" in row
    assert "x1.225 [1.200, 1.250] (+22.5 %) |" in row  # dense / sparse seconds: 1.25 and 1.2, median [range]
    assert NOISY_NOTE not in lines
    cells = [cell.strip() for cell in row.split("|")]
    assert cells[5] == (verdict or "inconclusive")
    assert _sparse_against_dense({k: metrics[k] for k in ("base", "dense")}, config) == []
    # rounds that disagree (x1.25 and x0.6): the speed-up is marked noisy and the table says to rerun
    metrics["sparse"]["speed"]["rounds"][1]["seconds_per_summary"] = 2.0
    lines = _sparse_against_dense(metrics, config)
    (row,) = [line for line in lines if line.startswith("| sparse |")]
    assert row.endswith("| x0.925 [0.600, 1.250] noisy |") and lines[-1] == NOISY_NOTE


def test_long_document_section_judges_each_length(tmp_path):
    """The section lists every length and case of `benchmarks/long_document.py`'s CSV (not its profile rows)
    with the verdict of the round range, names where the claim holds, and is absent without the file."""
    path = tmp_path / "long_document.csv"
    path.write_text(
        "length,case,prefill_time_ratio,decode_time_ratio,speedup,speedup_low,speedup_high,"
        "speedup_vs_dense,speedup_vs_dense_low,speedup_vs_dense_high,phase,op,share\n"
        "1024,ungated,1,1,1,1,1,0.95,0.9,1.0,,,\n"
        "1024,top-1,0.8,0.9,1.25,1.2,1.3,1.3,1.25,1.35,,,\n"
        "8192,top-1,0.7,0.9,1.2,1.1,1.3,1.2,1.1,1.3,,,\n"
        "8192,top-2,0.9,1.1,0.9,0.85,0.95,1.0,0.9,1.1,,,\n"
        ",ungated,,,,,,,,,prefill,aten::mm,0.3\n"
    )
    lines, holds = reproduction._long_documents(path, "python bench.py", "random token ids")
    section = "\n".join(lines)
    assert (
        "| 1,024 | ungated | x1.000 | x1.000 | x1.000 [1.000, 1.000] | x0.950 [0.900, 1.000] |  |" in section
    )
    assert (
        "| 1,024 | top-1 | x0.800 | x0.900 | x1.250 [1.200, 1.300] | x1.300 [1.250, 1.350] | reproduced |"
        in section
    )
    assert "| 8,192 | top-1 |" in section and section.count("| inconclusive |") == 1
    assert section.count("| not reproduced |") == 1 and "aten::mm" not in section
    assert section.endswith("holds in every round for: top-1 at 1,024 tokens.")
    assert holds == "+18 % claim holds in every round for: top-1 at 1,024 tokens"
    assert "## Speed at long-document lengths: random token ids" in section and "`python bench.py`" in section
    assert reproduction._long_documents(tmp_path / "missing.csv", "cmd", "ids") == ([], "")
