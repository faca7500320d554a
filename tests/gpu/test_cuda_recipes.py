"""GPU checks of the recipes' training (`pytest -m gpu tests/gpu`; they skip without CUDA): three bfloat16
Trainer steps of each recipe on its tiny test assets, on CUDA, with the gates on each backend of `BACKENDS`
(gpu_setup.py); the losses are finite, every gate and the other trained weights changed and stay finite.

Only the training of each recipe runs (evaluation, ROUGE, plots and reports are CPU code the other tests
cover), so the packages needed are those of training: accelerate, and datasets for summarization,
classification and distillation (their modules import it); a test skips when one does not import on the GPU
image (benchmarks/gpu_wheels.sh brings what fits). CPU check mode: see gpu_setup.py.
"""

from __future__ import annotations

import json
import math
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import transformers
from gpu_setup import BACKENDS, DEVICE, GPU_MARKS, require
from helpers import tiny_config

from hf_gate_attention import gate_backend_of, patch
from hf_gate_attention.core.hooks import GATE_MODULE_NAME

# tests/recipes, whose tiny set-ups these checks import (inside the tests): pytest puts a test folder on
# sys.path only when it collects a file from it, and `pytest -m gpu tests/gpu` collects none from there
RECIPE_TESTS = str(Path(__file__).resolve().parents[1] / "recipes")
if RECIPE_TESTS not in sys.path:
    sys.path.append(RECIPE_TESTS)

pytestmark = [*GPU_MARKS, pytest.mark.parametrize("backend", BACKENDS)]
STEPS = 3


class WeightWatch(transformers.TrainerCallback):
    """The trainable parameters (float32 copies on CPU) when training begins and ends, their device and the
    backend running the gates."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = self._trainable(model)
        self.device = next(model.parameters()).device.type
        self.backend = gate_backend_of(model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = self._trainable(model)

    @staticmethod
    def _trainable(model) -> dict[str, torch.Tensor]:
        return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def run_summary(run_folder: Path) -> dict:
    return json.loads((run_folder / "train_summary.json").read_text())


def assert_trained(watch: WeightWatch, summary: dict, backend: str) -> list[dict]:
    """The run of `summary` (its `global_step` and `log_history`) took STEPS steps with finite losses; on
    DEVICE, the gates on `backend`; every gate parameter and most other trained tensors changed; all finite.
    Returns its log history."""
    assert summary["global_step"] == STEPS
    log_history = summary["log_history"]
    assert watch.backend == backend
    losses = [entry["loss"] for entry in log_history if "loss" in entry]
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses), log_history
    assert watch.device == torch.device(DEVICE).type
    assert watch.before.keys() == watch.after.keys()
    changed = {name for name in watch.before if not torch.equal(watch.before[name], watch.after[name])}
    gates = {name for name in watch.before if f".{GATE_MODULE_NAME}." in name}
    assert gates and gates <= changed, f"gates that did not change: {sorted(gates - changed)}"
    others = watch.before.keys() - gates
    assert len(changed & others) >= 0.9 * len(others), f"unchanged: {sorted(others - changed)}"
    assert all(torch.isfinite(tensor).all() for tensor in watch.after.values())
    return log_history


def train_runs(config, tokenizer, train_one) -> None:
    """The training part of the summarization and distillation comparisons: claim the results folder, load
    the data, `train_one(run=, train_set=, validation_set=)` every run."""
    from hf_gate_attention.recipes.common.run_dir import claim_on_main
    from hf_gate_attention.recipes.common.summaries.pipeline import load_data, train_all

    claim_on_main(config)
    train_all(config, tokenizer, load_data(config), train_one)


@pytest.mark.parametrize("train", ["full", "gates+lora"])  # gates+lora: PEFT runs trainable gate copies
def test_summarization_recipe_bf16_steps(tiny_assets, tmp_path, backend, train):
    require("accelerate", "datasets", *(["peft"] if train == "gates+lora" else []))
    from hf_gate_attention.offline import resolve_model
    from hf_gate_attention.recipes.common.training import load_tokenizer
    from hf_gate_attention.recipes.summarization import RecipeConfig
    from hf_gate_attention.recipes.summarization.models import train_run

    gated = {"name": "output-headwise", "gate": {"variant": "output", "granularity": "headwise"}}
    keys = tiny_config(tiny_assets, tmp_path / "results", runs=[gated], eval_steps=None, max_steps=STEPS)
    config = RecipeConfig.from_dict(keys | {"bf16": True, "backend": backend, "train": train})
    watch = WeightWatch()
    model_path = resolve_model(config.model)
    tokenizer = load_tokenizer(model_path)
    train_runs(
        config,
        tokenizer,
        partial(train_run, config, model_path=model_path, tokenizer=tokenizer, callbacks=[watch]),
    )
    assert_trained(watch, run_summary(config.run_dir / "output-headwise"), backend)


def test_classification_recipe_bf16_steps(tmp_path, backend):
    require("accelerate", "datasets", "PIL")
    from test_classification import make_text_data, make_text_model, tiny_keys

    from hf_gate_attention.offline import resolve_model
    from hf_gate_attention.recipes.classification import ClassificationConfig
    from hf_gate_attention.recipes.classification.compare import load_data, train_all
    from hf_gate_attention.recipes.classification.model import load_processor
    from hf_gate_attention.recipes.common.run_dir import claim_on_main

    gated = {"name": "qk-elementwise", "gate": {"variant": "qk", "granularity": "elementwise"}}
    model, data = make_text_model(tmp_path / "bert"), make_text_data(tmp_path / "text")
    keys = tiny_keys(
        model, data, tmp_path / "results", text_column="review", label_column="topic", max_steps=STEPS
    )
    config = ClassificationConfig.from_dict(keys | {"runs": [gated], "bf16": True, "backend": backend})
    watch = WeightWatch()
    model_path = resolve_model(config.model)
    loaded = load_data(config)
    claim_on_main(config)
    train_all(config, model_path, load_processor(config, model_path, loaded.modality), loaded, [watch])
    assert_trained(watch, run_summary(config.run_dir / "qk-elementwise"), backend)


def test_distillation_recipe_bf16_steps(tiny_assets, tmp_path, backend):
    require("accelerate", "datasets")
    from test_distillation import distill_keys

    from hf_gate_attention.recipes.common.training import load_tokenizer
    from hf_gate_attention.recipes.distillation import DistillationConfig
    from hf_gate_attention.recipes.distillation.models import load_teacher, student_source
    from hf_gate_attention.recipes.distillation.train import train_student

    # a gated teacher where the recipe looks for one: <results>/<run>/model beside <results>/config.json
    teacher_dir = tmp_path / "teacher" / "output-headwise" / "model"
    teacher = transformers.AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    patch(teacher, variant="output", granularity="headwise", init="paper", backend="torch")
    teacher.save_pretrained(teacher_dir)
    (tmp_path / "teacher" / "config.json").write_text(json.dumps({"model": str(tiny_assets["model"])}))

    run = {"name": "logit-gate-kd", "alpha_kd": 1, "alpha_gate": 1}
    keys = distill_keys(tiny_assets, teacher_dir, tmp_path / "results", runs=[run], max_steps=STEPS)
    config = DistillationConfig.from_dict(keys | {"bf16": True, "backend": backend})
    watch = WeightWatch()
    teacher_model = load_teacher(config)
    tokenizer = load_tokenizer(student_source(config))
    train_runs(
        config,
        tokenizer,
        partial(train_student, config, teacher=teacher_model, tokenizer=tokenizer, callbacks=[watch]),
    )
    log_history = assert_trained(watch, run_summary(config.run_dir / "logit-gate-kd"), backend)
    logged = [entry for entry in log_history if "loss" in entry]
    assert all(math.isfinite(entry["kd_loss"]) and math.isfinite(entry["gate_loss"]) for entry in logged)


def test_pretraining_recipe_bf16_steps(tmp_path, monkeypatch, backend):
    require("accelerate")
    from test_pretraining import tiny_study

    from hf_gate_attention.recipes.pretraining import train as train_module
    from hf_gate_attention.recipes.pretraining.config import StudyConfig
    from hf_gate_attention.recipes.pretraining.study import prepare_data

    gated = {
        "name": "output-elementwise",
        "gate": {"variant": "output", "granularity": "elementwise", "init": "paper"},
    }
    keys = tiny_study(tmp_path, runs=[gated], main_runs=["output-elementwise"], seeds=[0], max_steps=STEPS)
    config = StudyConfig.from_dict(keys | {"sweep_learning_rates": [], "bf16": True, "backend": backend})
    (job,) = config.jobs()
    watch = WeightWatch()
    monkeypatch.setattr(train_module, "Trainer", partial(transformers.Trainer, callbacks=[watch]))
    tokenizer, blocks = prepare_data(config)
    metrics = train_module.train_job(config, job, Path(tmp_path / "job"), blocks, tokenizer, resume=False)
    assert math.isfinite(metrics["test_loss"])
    assert_trained(watch, metrics, backend)
