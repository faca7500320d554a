"""Distillation recipe on a tiny gated Llama teacher (fine-tuned 2 steps by the summarization recipe) and a
1-layer student: end to end, the loss terms against hand computations, resume, bad input."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
from helpers import REPO, loss_steps, tiny_config, tiny_model, torchrun, write_config
from test_recipe import StopAtStep

from hf_gate_attention import patch
from hf_gate_attention.core.config import GateConfig
from hf_gate_attention.recipes.common.config_files import load_config
from hf_gate_attention.recipes.distillation import (
    DistillationConfig,
    default_layer_map,
    gate_mse,
    kd_loss_sum,
    recorded_gates,
    run_distillation,
    summary_positions,
)
from hf_gate_attention.recipes.distillation.cli import main
from hf_gate_attention.recipes.distillation.report import main as report_main
from hf_gate_attention.recipes.summarization import RecipeConfig, run_comparison

OUTPUT = {"variant": "output", "granularity": "headwise"}
DISTILL_RUNS = [
    {"name": "student-alone", "alpha_kd": 0, "alpha_gate": 0},
    {"name": "logit-kd", "alpha_kd": 1, "alpha_gate": 0},
    {"name": "logit-gate-kd", "alpha_kd": 1, "alpha_gate": 1},
]


@pytest.fixture(scope="module")
def teacher(tiny_assets, tmp_path_factory):
    """`<results>/output-headwise/model`: the tiny Llama with a headwise output gate, 2 steps of the
    summarization recipe."""
    keys = tiny_config(
        tiny_assets,
        tmp_path_factory.mktemp("teacher"),
        runs=[{"name": "output-headwise", "gate": OUTPUT}],
        eval_steps=None,
        max_steps=2,
        speed_examples=1,
        speed_rounds=1,
    )
    return run_comparison(RecipeConfig.from_dict(keys)) / "output-headwise" / "model"


def distill_keys(tiny_assets, teacher, output_dir, **overrides) -> dict:
    """The summarization test's tiny keys (without `model`: the student comes from the teacher's base)."""
    keys = tiny_config(tiny_assets, output_dir, eval_steps=None, max_steps=2, speed_rounds=1)
    keys.pop("model")
    return keys | {"name": "distill", "teacher": str(teacher), "runs": DISTILL_RUNS} | overrides


def _run(tmp_path, keys: dict, *extra: str) -> int:
    return main(["--config", str(write_config(tmp_path / "distill.yaml", keys)), *extra])


# ------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_distill_end_to_end(tiny_assets, teacher, tmp_path, capsys):
    assert _run(tmp_path, distill_keys(tiny_assets, teacher, tmp_path / "results")) == 0
    out = tmp_path / "results" / "distill"
    assert "Delta vs student-alone" in capsys.readouterr().out
    for name in ("comparison.md", "comparison.csv", "comparison.json", "config.json"):
        assert (out / name).is_file()
    for name in ("loss_curves.png", "rouge.png", "speed.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")

    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["layer_map"] == [0] and comparison["gate_pairs"] == [[0, 0]]
    assert comparison["student"]["layers"] == 1 and comparison["teacher"]["layers"] == 2
    rows = {row["run"]: row for row in comparison["runs"]}
    assert list(rows) == ["student-alone", "logit-kd", "logit-gate-kd", "teacher"]
    assert "deltas" not in rows["student-alone"] and "speed_ratios" not in rows["teacher"]
    for name in ("logit-kd", "logit-gate-kd", "teacher"):
        delta = rows[name]["deltas"]["rougeL"]
        expected = rows[name]["rouge"]["rougeL"]["mean"] - rows["student-alone"]["rouge"]["rougeL"]["mean"]
        assert delta["delta"] == pytest.approx(expected) and delta["low"] <= delta["high"]
    for name in ("student-alone", "logit-kd", "logit-gate-kd"):
        assert rows[name]["layers"] == 1 and rows[name]["global_step"] == 2
        assert set(rows[name]["speed_ratios"]) == {"prefill", "decode", "speedup", "peak_memory"}
        saved = json.loads((out / name / "model" / "config.json").read_text())
        assert saved["num_hidden_layers"] == 1 and saved["gate_attention"]["variant"] == "output"
    history = json.loads((out / "logit-gate-kd" / "train_summary.json").read_text())["log_history"]
    logged = [h for h in history if "loss" in h]
    assert all({"task_loss", "kd_loss", "gate_loss"} <= set(h) for h in logged)
    assert all(h["loss"] > h["task_loss"] for h in logged)  # the distillation terms were added
    with open(out / "comparison.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == list(rows) and table[2]["alpha_gate"] == "1.0"

    report = tmp_path / "DISTILLATION.md"
    assert report_main([str(out), "--out", str(report)]) == 0
    text = report.read_text()
    assert "- Does logit KD help the student? **" in text and "logit-kd vs student-alone" in text
    assert "logit-gate-kd vs logit-kd" in text and "*inconclusive* when it contains 0" in text


# ------------------------------------------------------------------------------------------ loss terms


def test_kd_loss_matches_the_hand_computation():
    labels = torch.tensor([[-100, -100, 5, 6]])  # prompt, prompt, summary, summary
    positions = summary_positions(labels)
    assert positions.tolist() == [[False, True, True, False]]  # logits 1 and 2 predict tokens 2 and 3
    student = torch.zeros(1, 4, 3)
    teacher = torch.zeros(1, 4, 3)
    student[0, 1], teacher[0, 1] = torch.tensor([2.0, 0.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])
    teacher[0, 0] = torch.tensor([9.0, -9.0, 0.0])  # a prompt position: not distilled
    temperature = 2.0

    def softmax(values):
        exps = [math.exp(v / temperature) for v in values]
        return [e / sum(exps) for e in exps]

    p, q = softmax([0.0, 2.0, 0.0]), softmax([2.0, 0.0, 0.0])  # teacher, student at position 1
    expected = temperature**2 * sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    # position 2: equal logits, KL 0
    assert kd_loss_sum(student, teacher, positions, temperature).item() == pytest.approx(expected, rel=1e-5)


def test_gate_mse_ignores_padding():
    mask = torch.tensor([[1, 1, 0]])  # the third token is padding
    student = torch.zeros(1, 3, 2, 1)  # (batch, seq, heads, w)
    teacher = torch.zeros(1, 3, 2, 1)
    teacher[0, 0, :, 0] = torch.tensor([1.0, 0.0])  # errors 1 and 0
    teacher[0, 1, :, 0] = torch.tensor([0.5, 0.5])  # errors 0.25 and 0.25
    teacher[0, 2] = 100.0  # padding: ignored
    layer_a = (1 + 0 + 0.25 + 0.25) / 4
    student_b, teacher_b = torch.ones(1, 3, 2, 1), torch.ones(1, 3, 2, 1)  # a second layer pair, error 0
    loss = gate_mse([student, student_b], [teacher, teacher_b], mask)
    assert loss.item() == pytest.approx(layer_a / 2)


def test_recorded_gates_are_the_gate_values_per_layer():
    model = patch(tiny_model("llama"), GateConfig("output", "headwise"))  # identity init: every gate is 1
    inputs = torch.randint(3, 99, (2, 5))
    with recorded_gates(model, [1]) as gates:
        model(input_ids=inputs)
    assert list(gates) == [1] and gates[1].shape == (2, 5, 4, 1) and gates[1].dtype == torch.float32
    assert torch.allclose(gates[1], torch.ones_like(gates[1]))


def test_default_layer_map_spreads_evenly_keeping_first_and_last():
    assert default_layer_map(30, 15) == [0, 2, 4, 6, 8, 10, 12, 14, 17, 19, 21, 23, 25, 27, 29]
    assert default_layer_map(4, 2) == [0, 3] and default_layer_map(2, 1) == [0]


# -------------------------------------------------------------------------------------------------- resume


@pytest.mark.slow
def test_resume_after_interruption(tiny_assets, teacher, tmp_path):
    runs = [DISTILL_RUNS[0], DISTILL_RUNS[2]]
    keys = distill_keys(tiny_assets, teacher, tmp_path / "results", runs=runs, max_steps=3, save_steps=2)
    out = tmp_path / "results" / "distill"
    with pytest.raises(KeyboardInterrupt):
        run_distillation(DistillationConfig.from_dict(keys), [StopAtStep(out / "logit-gate-kd", step=3)])
    alone = (out / "student-alone" / "train_summary.json").read_text()
    assert (out / "logit-gate-kd" / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    assert _run(tmp_path, keys) == 2  # the folder holds this run: refused without --resume
    assert _run(tmp_path, keys, "--resume") == 0
    assert (out / "student-alone" / "train_summary.json").read_text() == alone  # kept
    resumed = json.loads((out / "logit-gate-kd" / "train_summary.json").read_text())
    assert resumed["resumed_from"] == "checkpoint-2" and resumed["global_step"] == 3
    assert loss_steps(out / "logit-gate-kd") == [1, 2, 3]


# ----------------------------------------------------------------------------------- distributed launch


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_on_the_same_global_batch(tiny_assets, teacher, tmp_path):
    """`torchrun --nproc_per_node 2` x batch 1 trains on the same two papers as one process x batch 2: the
    first step's loss and gradient norm of the student alone and with logit KD agree (the KD term is scaled
    across processes like the task loss); gate matching trains too; only the main process evaluates and
    prints."""
    # the tiny student starts close to the teacher (KL ~6e-5): a large alpha_kd makes the KD term a tenth
    # of the loss, so that a KD term not scaled across processes would show
    runs = [DISTILL_RUNS[0], {"name": "logit-kd", "alpha_kd": 1e4, "alpha_gate": 0}, DISTILL_RUNS[2]]
    keys = {"runs": runs, "max_train_examples": 2, "max_steps": 1, "speed_examples": 1}
    one = distill_keys(tiny_assets, teacher, tmp_path / "one", per_device_train_batch_size=2, **keys)
    assert _run(tmp_path, one) == 0
    two = distill_keys(tiny_assets, teacher, tmp_path / "two", per_device_train_batch_size=1, **keys)
    config_file = write_config(tmp_path / "ddp.yaml", two | {"ddp_backend": "gloo"})
    assert (
        torchrun("-m", "hf_gate_attention", "recipe", "distillation", "--config", str(config_file)).count(
            "Delta vs student-alone"
        )
        == 1
    )

    for run in runs:
        summaries = [
            json.loads((tmp_path / f / "distill" / run["name"] / "train_summary.json").read_text())
            for f in ("one", "two")
        ]
        assert [s["world_size"] for s in summaries] == [1, 2]
        assert [s["effective_batch_size"] for s in summaries] == [2, 2]
        first = [next(h for h in s["log_history"] if "loss" in h) for s in summaries]
        assert "gate_loss" in first[1] if run["alpha_gate"] else "gate_loss" not in first[1]
        if run["alpha_gate"]:  # a per-process mean over its tokens, averaged over the processes: not equal
            continue
        assert first[1]["loss"] == pytest.approx(first[0]["loss"], rel=1e-4), run["name"]
        assert first[1]["grad_norm"] == pytest.approx(first[0]["grad_norm"], rel=1e-4), run["name"]
        if run["alpha_kd"]:
            assert first[0]["loss"] > 1.1 * first[0]["task_loss"]  # the KD term weighs in the comparison
    assert (tmp_path / "two" / "distill" / "comparison.md").is_file()


# ------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("layer_map", "message"),
    [([5], "teacher layer(s) [5]; the teacher has layers 0..1"), ([1, 1], "layer_map [1, 1] repeats")],
)
def test_layer_map_the_teacher_cannot_serve_is_named(
    tiny_assets, teacher, tmp_path, capsys, layer_map, message
):
    keys = distill_keys(tiny_assets, teacher, tmp_path / "results", layer_map=layer_map)
    assert _run(tmp_path, keys) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results" / "distill").exists()  # nothing written


def test_student_with_other_heads_is_named(tiny_assets, teacher, tmp_path, capsys):
    vocab = json.loads((teacher / "config.json").read_text())["vocab_size"]
    student = tmp_path / "student"
    tiny_model(
        "llama", vocab_size=vocab, num_hidden_layers=1, num_attention_heads=2, head_dim=16
    ).save_pretrained(student)
    keys = distill_keys(tiny_assets, teacher, tmp_path / "results", student=str(student))
    assert _run(tmp_path, keys) == 2
    err = capsys.readouterr().err
    assert "student layer 0 has 2 gated heads of width 1, its teacher layer 0 has 4 of width 1" in err


@pytest.mark.parametrize("case", ["ungated", "missing"])
def test_teacher_folder_that_is_not_gated_or_missing_is_named(tiny_assets, teacher, tmp_path, capsys, case):
    folder = tiny_assets["model"] if case == "ungated" else tmp_path / "nowhere"
    keys = distill_keys(tiny_assets, folder, tmp_path / "results")
    assert _run(tmp_path, keys) == 2
    err = capsys.readouterr().err
    expected = "is not a gated checkpoint" if case == "ungated" else "does not exist"
    assert f"teacher folder {str(folder)!r} {expected}" in err


def test_the_preset_reads_and_distills_the_reproductions_teacher():
    preset = REPO / "recipes" / "distillation" / "configs" / "distill.yaml"
    config = load_config(preset, None, DistillationConfig)
    assert config.teacher == "results/reproduce/output-headwise/model" and config.student_num_layers == 15
    assert [r.name for r in config.runs] == [r["name"] for r in DISTILL_RUNS]
