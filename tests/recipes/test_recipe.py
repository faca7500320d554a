"""Summarization recipe end to end on a tiny random Llama: compare, resume after interruption, bad input."""

from __future__ import annotations

import csv
import dataclasses
import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from helpers import RUNS, loss_steps, tiny_config, write_config, write_jsonl
from PIL import Image
from safetensors import safe_open

from hf_gate_attention import gate_backend_of
from hf_gate_attention.cli import main as cli_main
from hf_gate_attention.cli import summarize_main
from hf_gate_attention.recipes.common.config import RESUMABLE_KEYS
from hf_gate_attention.recipes.common.config_files import parse_overrides
from hf_gate_attention.recipes.common.run_dir import (
    check_run_data,
    check_run_dir,
    claim_run_dir,
    data_fingerprint,
    finish_run_dir,
)
from hf_gate_attention.recipes.common.runner import key_help
from hf_gate_attention.recipes.common.training import check_checkpoint, last_complete_checkpoint
from hf_gate_attention.recipes.registry import RECIPES
from hf_gate_attention.recipes.summarization import RecipeConfig, load_config, run_comparison
from hf_gate_attention.recipes.summarization.cli import main
from hf_gate_attention.recipes.summarization.models import load_pretrained
from hf_gate_attention.sharing.card import NO_RESULTS, render_model_card

# ------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_compare_end_to_end(tiny_assets, tmp_path, capsys):
    config_file = write_config(tmp_path / "tiny.yaml", tiny_config(tiny_assets, tmp_path / "results"))
    command = ["recipe", "summarization", "--config", str(config_file), "learning_rate=2e-4"]
    assert cli_main(command) == 0
    out = tmp_path / "results" / "tiny"
    printed = capsys.readouterr()
    assert "Delta vs baseline" in printed.out and str(out) in printed.out
    assert all(f"Training {run['name']}:" in printed.err for run in RUNS if run["gate"])  # named bars
    assert (out / "data.json").is_file() and set(json.loads((out / "data.json").read_text())) == {
        "train",
        "validation",
        "test",
    }

    for name in ("comparison.md", "comparison.csv", "comparison.json", "config.json"):
        assert (out / name).is_file()
    for name in ("loss_curves.png", "rouge.png", "speed.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    saved = json.loads((out / "config.json").read_text())
    assert saved["learning_rate"] == 2e-4  # command line overrides the file

    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["skipped_examples"] == {"train": 2, "validation": 0, "test": 0}
    rows = {row["run"]: row for row in comparison["runs"]}
    assert set(rows) == {run["name"] for run in RUNS}
    assert "deltas" not in rows["baseline"]
    for name in ("output-headwise", "qk-elementwise"):
        delta = rows[name]["deltas"]["rougeL"]
        expected = rows[name]["rouge"]["rougeL"]["mean"] - rows["baseline"]["rouge"]["rougeL"]["mean"]
        assert delta["delta"] == pytest.approx(expected) and delta["low"] <= delta["high"]
        assert set(rows[name]["speed_ratios"]) == {"prefill", "decode", "speedup", "peak_memory"}
        assert rows[name]["trainable_params"] > rows["baseline"]["trainable_params"]  # + the gates

    for name in rows:
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert metrics["global_step"] == 4 and metrics["training"]["trained"]
        assert loss_steps(out / name) == [1, 2, 3, 4]
        assert any("eval_loss" in entry for entry in metrics["training"]["log_history"])  # validation loss
        assert len(metrics["quality"]["per_example"]["rougeL"]) == 4
        assert metrics["speed"]["decode_tokens_per_s"] > 0 and metrics["speed"]["peak_memory_mb"] > 0
        assert len((out / name / "predictions.jsonl").read_text().splitlines()) == 4
        assert (out / name / "model" / "config.json").is_file()
    # the gated checkpoints hold trained gates, the baseline none
    gate_config = json.loads((out / "qk-elementwise" / "model" / "config.json").read_text())
    assert gate_config["gate_attention"]["variant"] == "qk"
    # a run's model folder stands on its own: pipeline finds its tokenizer, its card shows the run
    folder = out / "output-headwise" / "model"
    generator = transformers.pipeline("text-generation", model=str(folder), trust_remote_code=True)
    assert type(generator.model).__name__ == "GatedLlamaForCausalLM"
    assert generator("Hello", max_new_tokens=2, do_sample=False)[0]["generated_text"].startswith("Hello")
    card = str(render_model_card(folder))
    assert NO_RESULTS not in card and "Not recorded" not in card
    assert f"{rows['output-headwise']['rouge']['rougeL']['mean']:.2f}" in card

    with open(out / "comparison.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == [run["name"] for run in RUNS]
    assert table[0]["delta_rougeL_points"] == "" and table[1]["delta_rougeL_percent"] != ""


@pytest.mark.parametrize("mode", ["gates", "gates+lora"])
@pytest.mark.slow
def test_training_modes_train_the_same_set_minus_the_gates(tiny_assets, tmp_path, mode):
    if mode == "gates+lora":
        pytest.importorskip("peft")
    keys = tiny_config(
        tiny_assets, tmp_path / "results", runs=RUNS[:2], train=mode, eval_steps=None, max_steps=2
    )
    out = run_comparison(RecipeConfig.from_dict(keys))
    baseline, gated = (
        json.loads((out / r / "train_summary.json").read_text()) for r in ("baseline", "output-headwise")
    )
    gate_params = 2 * (32 * 4 + 4)  # 2 layers x headwise output gate (hidden 32 -> 4 heads, + bias)
    assert gated["parameters"]["trainable"] - baseline["parameters"]["trainable"] == gate_params
    if mode == "gates":
        assert not baseline["trained"] and baseline["parameters"]["trainable"] == 0
        assert not (out / "baseline" / "model").exists()  # evaluated as the pretrained model
        with safe_open(out / "output-headwise" / "model" / "model.safetensors", framework="pt") as f:
            gates = [f.get_tensor(k) for k in f.keys() if ".attn_gate.weight" in k]  # noqa: SIM118
        assert len(gates) == 2 and all(g.abs().sum() > 0 for g in gates)  # trained away from the identity (0)
    else:
        assert baseline["global_step"] == gated["global_step"] == 2
        assert (out / "output-headwise" / "model" / "adapter_config.json").is_file()
    assert (out / "comparison.md").is_file()


def test_backend_runs_the_gates_and_is_not_part_of_a_runs_identity(tiny_assets, tmp_path):
    config = RecipeConfig.from_dict(tiny_config(tiny_assets, tmp_path / "results", runs=RUNS[:2]))
    for backend in ("torch", "triton"):  # triton: the kernels through the interpreter on CPU
        model = load_pretrained(config.replace(backend=backend), str(tiny_assets["model"]), config.runs[1])
        assert gate_backend_of(model) == backend
    claim_run_dir(config)
    (config.run_dir / "baseline").mkdir()
    check_run_dir(config.replace(resume=True, backend="triton"))  # same run, run another way


class StopAtStep(transformers.TrainerCallback):
    """Simulates an interruption (Ctrl-C, preemption) of the training of one run."""

    def __init__(self, run_dir: Path, step: int):
        self.run_dir, self.step = str(run_dir), step

    def on_step_end(self, args, state, control, **kwargs):
        if args.output_dir.startswith(self.run_dir) and state.global_step == self.step:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_resume_after_interruption_then_extend_the_budget(tiny_assets, tmp_path, capsys):
    runs = RUNS[:2]
    data = Path(shutil.copytree(tiny_assets["data"], tmp_path / "data"))  # changed below, then restored
    keys = tiny_config(tiny_assets, tmp_path / "results", runs=runs, eval_steps=None, dataset=str(data))
    config = RecipeConfig.from_dict(keys)
    out = config.run_dir
    with pytest.raises(KeyboardInterrupt):
        run_comparison(config, callbacks=[StopAtStep(out / "output-headwise", step=3)])
    baseline_summary = (out / "baseline" / "train_summary.json").read_text()
    assert not (out / "output-headwise" / "train_summary.json").exists()
    assert (out / "output-headwise" / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()

    # without --resume the folder is refused; so is resuming from a checkpoint without its optimizer state or
    # on data changed at the same path (both would go on silently otherwise)
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    optimizer = out / "output-headwise" / "checkpoints" / "checkpoint-2" / "optimizer.pt"
    optimizer.rename(tmp_path / "optimizer.pt")
    assert main(["--config", str(tmp_path / "c.yaml"), "--resume"]) == 2
    assert "checkpoint-2 holds no optimizer state" in capsys.readouterr().err
    (tmp_path / "optimizer.pt").rename(optimizer)
    kept = (data / "train.jsonl").read_bytes()
    (data / "train.jsonl").write_bytes(kept.replace(b"w1", b"w2", 1))
    assert main(["--config", str(tmp_path / "c.yaml"), "--resume"]) == 2
    assert "changed since it started (train: 12 rows" in capsys.readouterr().err
    (data / "train.jsonl").write_bytes(kept)
    # with --resume, the interrupted run continues from checkpoint-2
    assert main(["--config", str(tmp_path / "c.yaml"), "--resume"]) == 0
    assert (out / "baseline" / "train_summary.json").read_text() == baseline_summary  # kept, not retrained
    gated = json.loads((out / "output-headwise" / "train_summary.json").read_text())
    assert gated["resumed_from"] == "checkpoint-2" and gated["global_step"] == 4
    assert loss_steps(out / "output-headwise") == [1, 2, 3, 4]

    # a larger budget continues both runs from their last checkpoint (a KEY=VALUE after --resume is its own)
    assert main(["--config", str(tmp_path / "c.yaml"), "--resume", "max_steps=6"]) == 0
    for name in ("baseline", "output-headwise"):
        summary = json.loads((out / name / "train_summary.json").read_text())
        assert summary["resumed_from"] == "checkpoint-4" and summary["global_step"] == 6
        assert loss_steps(out / name) == [1, 2, 3, 4, 5, 6]
    metrics = json.loads((out / "output-headwise" / "metrics.json").read_text())
    assert metrics["global_step"] == 6

    # resuming a finished run keeps its trainings and summaries, and only re-times the models
    finished = {
        p: p.read_text() for p in out.glob("*/*.json") if p.name in ("train_summary.json", "quality.json")
    }
    assert main(["--config", str(tmp_path / "c.yaml"), "--resume", "--max_steps", "6"]) == 0
    assert {p: p.read_text() for p in finished} == finished


# ------------------------------------------------------------------------------------------- bad input


def _error(capsys) -> str:
    return capsys.readouterr().err


def test_missing_columns_names_found_and_expected(tiny_assets, tmp_path, capsys):
    data = write_jsonl(tmp_path / "papers.jsonl", [{"text": "w1 w2 .", "abstract": "w1 ."}] * 10)
    keys = tiny_config(tiny_assets, tmp_path / "results", dataset=str(data), eval_steps=None)
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    err = _error(capsys)
    assert "['text', 'abstract']" in err and "['document', 'summary']" in err


def test_hub_dataset_while_offline_suggests_the_offline_default(tiny_assets, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    keys = tiny_config(tiny_assets, tmp_path / "results", dataset="ccdv/govreport-summarization")
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    err = _error(capsys)
    assert "offline" in err and "aclsum" in err and "local" in err


@pytest.mark.parametrize("where", ["file", "command line"])
def test_unknown_config_key_is_named(tmp_path, capsys, where):
    keys = {"learning_rate": 1e-4} | ({"lerning_rate": 1e-4} if where == "file" else {})
    argv = ["--config", str(write_config(tmp_path / "c.yaml", keys))]
    argv += ["--lerning-rate", "1e-4"] if where == "command line" else []
    assert main(argv) == 2
    err = _error(capsys)
    assert "'lerning_rate'" in err and "did you mean 'learning_rate'" in err and where in err


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"runs": [{"name": "a", "gate": {"variant": "output", "granulrity": "headwise"}}]}, "granulrity"),
        ({"runs": [{"name": "a", "gates": None}]}, "'gates'"),
        ({"runs": [{"name": "a"}, {"name": "b"}]}, "at most one"),
        ({"train": "everything"}, "train='everything'"),
        ({"backend": "cuda"}, "backend='cuda' is not valid; accepted: auto, torch, fused_gate, triton"),
        ({"max_steps": "many"}, "'max_steps'"),
        ({"max_steps": -3}, "max_steps=-3 is not valid; accepted: -1 (use num_train_epochs) or >= 1"),
        ({"num_train_epochs": -1}, "num_train_epochs=-1.0 is not valid; accepted: a finite number > 0"),
        ({"learning_rate": "inf"}, "learning_rate=inf is not valid; accepted: a finite number > 0"),
        (
            {"gate_learning_rate": -1},
            "gate_learning_rate=-1.0 is not valid; accepted: a finite number > 0 or null",
        ),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0 is not valid"),
        ({"save_steps": 0}, "save_steps=0 is not valid; accepted: a finite number >= 1"),
        ({"eval_steps": 0}, "eval_steps=0 is not valid; accepted: a finite number >= 1 or null"),
        ({"save_total_limit": 0}, "save_total_limit=0 is not valid"),
        ({"weight_decay": -5}, "weight_decay=-5.0 is not valid; accepted: a finite number >= 0"),
        ({"lr_scheduler_type": "cosin"}, "lr_scheduler_type='cosin' is not valid; accepted: linear, cosine"),
        ({"bf16": True, "fp16": True}, "bf16 and fp16 are both set"),
        (
            {"resume": True, "overwrite": True},
            "--resume and --overwrite conflict: --resume continues the run",
        ),
        (
            {"max_train_examples": -5},
            "max_train_examples=-5 is not valid; accepted: an integer >= 1, or null (all)",
        ),
        ({"max_test_examples": 0}, "max_test_examples=0 is not valid"),
        ({"seed": -1}, "seed=-1 is not valid; accepted: a finite number >= 0"),
        ({"lora_r": 0}, "lora_r=0 is not valid; accepted: an integer >= 1"),
        ({"lora_dropout": 1}, "lora_dropout=1.0 is not valid; accepted: 0 <= lora_dropout < 1"),
        ({"dataset": "./missing/docs"}, "dataset './missing/docs': no such file or folder"),
        ({"model": "./missing/model"}, "model './missing/model': no such file or folder"),
    ],
)
def test_invalid_values_are_named(tmp_path, capsys, keys, message):
    keys = {"output_dir": str(tmp_path / "results"), **keys}
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    assert message in _error(capsys)
    assert not (tmp_path / "results").exists()  # refused before the results folder is made


def test_output_folder_holding_a_different_run_is_refused_unless_overwrite(tmp_path):
    config = RecipeConfig(output_dir=str(tmp_path))
    claim_run_dir(config)
    (config.run_dir / "baseline").mkdir()
    changed = config.replace(learning_rate=1e-3)
    for attempt in (changed, changed.replace(resume=True)):
        with pytest.raises(
            FileExistsError, match=r"different run \(learning_rate: 5e-05 -> 0.001\).*--overwrite"
        ):
            check_run_dir(attempt)
    with pytest.raises(FileExistsError, match=r"already holds this run.*--resume"):
        check_run_dir(config)
    check_run_dir(config.replace(resume=True, max_steps=99))  # a longer budget may be resumed

    overwrite = changed.replace(overwrite=True)
    check_run_dir(overwrite)
    claim_run_dir(overwrite)
    assert not (config.run_dir / "baseline").exists()
    assert json.loads((config.run_dir / "config.json").read_text())["learning_rate"] == 1e-3

    foreign = tmp_path / "foreign"
    (foreign / "mine").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="not a run of this recipe"):
        check_run_dir(RecipeConfig(output_dir=str(tmp_path), name="foreign"))


def test_resume_with_overwrite_is_refused_and_the_run_kept(tmp_path, capsys):
    config = RecipeConfig(output_dir=str(tmp_path))
    claim_run_dir(config)
    checkpoint = _checkpoint(config.run_dir / "baseline" / "checkpoints" / "checkpoint-2", STATE)
    argv = ["--output_dir", str(tmp_path), "--resume", "--overwrite"]
    assert main(argv) == 2
    assert "--resume and --overwrite conflict" in _error(capsys)
    assert (checkpoint / "optimizer.pt").is_file()  # nothing set aside or deleted


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is a folder; expected a YAML or JSON file"),
        (
            b"max_steps: \xff\xfe\n",
            "is not UTF-8 text (invalid start byte at byte 11); expected a YAML or JSON",
        ),
        (b"max_steps: [\n", "is not valid YAML"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_named(tmp_path, capsys, content, message):
    path = tmp_path / "c.yaml"
    path.mkdir() if content is None else path.write_bytes(content)
    assert main(["--config", str(path)]) == 2
    assert f"config file {str(path)!r} {message}" in _error(capsys)


def test_config_file_and_overrides(tmp_path):
    path = write_config(tmp_path / "c.yaml", {"max_steps": 10, "bf16": False, "runs": RUNS[:2]})
    overrides = parse_overrides(
        ["--max-steps=20", "--bf16", "--lora_target_modules", "q_proj,v_proj", "--name", "x"]
    )
    config = load_config(path, overrides)
    assert (config.max_steps, config.bf16, config.name) == (20, True, "x")
    assert config.lora_target_modules == ["q_proj", "v_proj"]
    assert config.baseline.name == "baseline" and config.runs[1].gate.variant == "output"
    overrides = parse_overrides(["max_steps=30", "instruction=Summarize: a=b", "--name", "y", "--resume"])
    assert overrides == {"max_steps": "30", "instruction": "Summarize: a=b", "name": "y", "resume": "true"}
    with pytest.raises(ValueError, match="expected KEY=VALUE or --key value, got 'max_steps'"):
        parse_overrides(["max_steps"])
    config = load_config(None, {"runs": json.dumps(RUNS[1:]), "eval_steps": "null", "learning_rate": "3e-4"})
    assert config.baseline is None and config.eval_steps is None and config.learning_rate == 3e-4
    assert RecipeConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_the_recipe_command_lists_every_recipe_and_its_actions(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["recipe", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert all(name in text for name in ("summarization", "classification", "distillation", "pretraining"))
    assert "actions: reproduction, diagnosis, recreate" in text and "actions: report, corpus" in text
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["recipe", "translation"])
    assert exit_info.value.code == 2 and "invalid choice: 'translation'" in capsys.readouterr().err


def test_the_command_lines_help_names_every_registered_recipe(capsys):
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"run a recipe ({', '.join(RECIPES)}) or one of its actions" in text
    assert "captioning" in RECIPES


@pytest.mark.parametrize(
    ("recipe", "actions"),
    [("summarization", "reproduction, diagnosis, recreate, lengths, tables"), ("captioning", "none")],
)
def test_a_word_that_is_not_an_action_is_named_with_the_actions(recipe, actions, capsys):
    assert cli_main(["recipe", recipe, "frobnicate", "max_steps=2"]) == 2
    assert capsys.readouterr().err == (
        f"hf-gate-attention recipe {recipe}: error: 'frobnicate' is not an action of this recipe (its "
        f"actions: {actions}); its run takes --config FILE and KEY=VALUE or --key value overrides\n"
    )


def test_a_recipe_action_runs_under_its_command(tmp_path, capsys):
    assert cli_main(["recipe", "distillation", "report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("hf-gate-attention recipe distillation report: error:")
    assert cli_main(["recipe", "summarization", "--config", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err.startswith("hf-gate-attention recipe summarization: error: config file")


def test_resume_may_append_runs_and_reads_configs_saved_by_older_versions(tmp_path):
    runs = [{"name": "baseline", "gate": None}, {"name": "gated", "gate": {"variant": "output"}}]
    config = RecipeConfig.from_dict({"output_dir": str(tmp_path), "runs": runs})
    claim_run_dir(config)
    (config.run_dir / "baseline").mkdir()
    saved = json.loads((config.run_dir / "config.json").read_text())
    gate = saved["runs"][1]["gate"]
    del gate["top_k_unit"]  # as 0.1.0 wrote it: no top_k_unit, a backend entry
    gate["backend"] = "auto"
    (config.run_dir / "config.json").write_text(json.dumps(saved))

    def with_runs(more: list[dict], resume: bool = True) -> RecipeConfig:
        keys = {"output_dir": str(tmp_path), "runs": more, "resume": resume}
        return RecipeConfig.from_dict(keys)

    check_run_dir(with_runs(runs))
    sparse = {"name": "sparse", "gate": {"variant": "output", "top_k": 1, "top_k_unit": "kv_group"}}
    check_run_dir(with_runs([*runs, sparse]))  # appended: trained on resume, the others kept
    with pytest.raises(FileExistsError, match="already holds this run"):
        check_run_dir(with_runs(runs, resume=False))
    for changed, resume in (
        ([*runs, sparse], False),  # appending needs --resume
        ([runs[0]], True),  # a run removed
        ([sparse, *runs], True),  # not appended at the end
        ([runs[0], {**runs[1], "gate": {"variant": "qk"}}], True),  # a run changed
    ):
        with pytest.raises(FileExistsError, match=r"different run \(runs:"):
            check_run_dir(with_runs(changed, resume))


def test_a_key_given_twice_in_a_yaml_config_is_refused(tmp_path, capsys):
    config = tmp_path / "twice.yaml"
    config.write_text("max_steps: 2\nlearning_rate: 1e-4\nmax_steps: 3\n")
    assert main(["--config", str(config)]) == 2
    assert "key 'max_steps' is given twice" in _error(capsys)


# ------------------------------------------------------------------------------- resume, help, backend


def test_a_flag_before_a_key_value_takes_no_value():
    assert parse_overrides(["--resume", "max_steps=6"]) == {"resume": "true", "max_steps": "6"}
    assert parse_overrides(["--resume", "--max_steps", "6"]) == {"resume": "true", "max_steps": "6"}
    assert parse_overrides(["--name", "a=b"]) == {"name": "true", "a": "b"}  # such a value: --name=a=b
    assert parse_overrides(["--name=a=b", "--dataset", "./x=y"]) == {"name": "a=b", "dataset": "./x=y"}


CONFIG_CLASSES = {
    "summarization": "summarization.config:RecipeConfig",
    "classification": "classification.config:ClassificationConfig",
    "captioning": "captioning.config:CaptioningConfig",
    "distillation": "distillation.config:DistillationConfig",
    "pretraining": "pretraining.config:StudyConfig",
}


@pytest.mark.parametrize("recipe", sorted(CONFIG_CLASSES))
def test_every_config_key_has_its_help(recipe, capsys):
    module, name = CONFIG_CLASSES[recipe].split(":")
    config_class = getattr(importlib.import_module(f"hf_gate_attention.recipes.{module}"), name)
    helps = key_help(config_class)
    keys = [f.name for f in dataclasses.fields(config_class)]
    assert [key for key in keys if not helps.get(key)] == []
    with pytest.raises(SystemExit):
        cli_main(["recipe", recipe, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    for key in keys:
        assert f"{key} (default: " in text and " ".join(helps[key].split()) in text
    if recipe != "pretraining":  # what --resume may change, as the code decides
        assert all(key.replace("_", "") in helps["resume"].replace("_", "") for key in RESUMABLE_KEYS)


def test_summarize_help_names_the_command_it_was_called_as(capsys):
    for argv, prog in ((["summarize", "--help"], "hf-gate-attention summarize"), (None, "hf-gate-summarize")):
        with pytest.raises(SystemExit):
            cli_main(argv) if argv else summarize_main(["--help"])
        assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def _checkpoint(folder: Path, files: dict[str, str | None]) -> Path:
    """A checkpoint folder holding `files`: text, or `None` for a file that `torch.save` writes."""
    folder.mkdir(parents=True)
    for name, text in files.items():
        if text is None:
            torch.save({"state": 1}, folder / name)
        else:
            (folder / name).write_text(text)
    return folder


STATE = {"trainer_state.json": "{}", "optimizer.pt": None, "scheduler.pt": None, "rng_state.pth": None}


@pytest.mark.parametrize(
    ("dropped", "message"),
    [
        ("optimizer.pt", "checkpoint-4 holds no optimizer state: resuming would start them afresh"),
        ("scheduler.pt", "checkpoint-4 holds no scheduler state"),
        ("rng_state.pth", "checkpoint-4 holds no random number generator state"),
    ],
)
def test_a_checkpoint_without_part_of_its_training_state_is_refused(tmp_path, dropped, message):
    check_checkpoint(_checkpoint(tmp_path / "complete", STATE))
    incomplete = _checkpoint(tmp_path / "checkpoint-4", {k: v for k, v in STATE.items() if k != dropped})
    with pytest.raises(
        ValueError, match=f"{message}.*Delete .*checkpoint-4 to resume from the checkpoint before"
    ):
        last_complete_checkpoint(tmp_path)
    assert incomplete.is_dir()  # the user's to delete: not removed like a checkpoint interrupted mid-save


@pytest.mark.parametrize(
    ("damaged", "message"),
    [
        ({"trainer_state.json": '{"global_step": '}, r"trainer_state\.json is not valid JSON"),
        ({"config.json": "{"}, r"config\.json is not valid JSON"),
        ({"optimizer.pt": "garbage"}, r"optimizer\.pt cannot be read \(not a file that torch\.save writes"),
        ({"rng_state_1.pth": "garbage"}, r"rng_state_1\.pth cannot be read"),
        ({"model.safetensors": "garbage"}, r"model\.safetensors is not a readable safetensors file"),
    ],
)
def test_a_damaged_checkpoint_names_its_file_and_what_to_do(tmp_path, damaged, message):
    folder = _checkpoint(tmp_path / "checkpoint-6", {**STATE, **damaged})
    with pytest.raises(
        ValueError, match=f"checkpoint .*checkpoint-6 is damaged: .*{message}.*Delete .*checkpoint-6 "
    ):
        check_checkpoint(folder)


def test_a_deepspeed_checkpoint_keeps_its_optimizer_and_scheduler_state_in_its_own_folder(tmp_path):
    deepspeed = _checkpoint(tmp_path / "deepspeed", {"trainer_state.json": "{}", "rng_state_0.pth": None})
    (deepspeed / "global_step4").mkdir()
    check_checkpoint(deepspeed)


def test_resuming_on_changed_data_is_refused(tmp_path):
    config = RecipeConfig(output_dir=str(tmp_path))
    first = data_fingerprint({"train": [{"document": "a b", "summary": "a"}], "test": [{"document": "c"}]})
    claim_run_dir(config, first)
    resume = config.replace(resume=True)
    check_run_data(resume, first)
    changed = data_fingerprint({"train": [{"document": "a b", "summary": "b"}], "test": [{"document": "c"}]})
    assert changed["test"] == first["test"] and changed["train"]["rows"] == first["train"]["rows"]
    with pytest.raises(ValueError, match=r"data of the run .* changed since it started \(train: 1 rows"):
        check_run_data(resume, changed)
    check_run_data(config.replace(overwrite=True), changed)  # starts over: nothing to compare
    images = [{"image": Image.new("L", (4, 4), color), "label": 0} for color in (0, 1)]
    assert data_fingerprint({"t": images[:1]}) != data_fingerprint({"t": images[1:]})


def test_overwrite_sets_the_old_results_aside_until_the_new_are_complete(tmp_path):
    config = RecipeConfig(output_dir=str(tmp_path))
    claim_run_dir(config)
    (config.run_dir / "comparison.md").write_text("old")
    claim_run_dir(config.replace(overwrite=True, learning_rate=1e-3))
    assert sorted(p.name for p in config.run_dir.iterdir()) == ["config.json"]
    (aside,) = (p for p in tmp_path.iterdir() if p.name != "demo")
    assert (aside / "comparison.md").read_text() == "old"
    finish_run_dir(config)
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]


def test_a_backend_that_cannot_run_is_refused_before_anything_trains(
    tiny_assets, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("hf_gate_attention.kernels.triton_available", lambda: (False, "no CUDA device here"))
    keys = tiny_config(tiny_assets, tmp_path / "results", backend="triton")
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    assert "backend='triton' cannot run here: no CUDA device here" in _error(capsys)
    assert not (tmp_path / "results").exists()
