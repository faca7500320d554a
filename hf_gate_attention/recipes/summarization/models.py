"""The summarization recipe's models: the pretrained causal LM patched with a run's gate, what `train` makes
trainable (full, gates, gates + LoRA), its training, and the trained model loaded back for evaluation."""

from __future__ import annotations

import datasets
import torch
from transformers import AutoModelForCausalLM, TrainerCallback, set_seed

from ...core.hooks import GATE_MODULE_NAME
from ...core.patching import freeze_all_but_gates
from ...sharing.loading import from_pretrained as load_gated
from ..common.config import RunSpec
from ..common.distributed import patch_on_device
from ..common.inference import inference_device, inference_dtype
from ..common.summaries.data import DataCollatorForSummarization
from ..common.training import train_model
from .config import RecipeConfig

LORA_INSTALL = "pip install 'peft>=0.21'"


def load_pretrained(config: RecipeConfig, model_path: str, run: RunSpec, dtype=torch.float32):
    """The pretrained causal LM, patched with the run's gate (identity init: it still computes the same)."""
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=dtype, attn_implementation=config.attn_implementation
    )
    return patch_on_device(model, run.gate, config.backend) if run.gate is not None else model


def build_trainable_model(config: RecipeConfig, model_path: str, run: RunSpec):
    """The model of `run` with `config.train` applied: what requires grad is what gets trained.

    `full` trains every weight; `gates` only the gates (nothing for the baseline); `gates+lora` LoRA adapters
    on `lora_target_modules` plus the gates (kept trainable by PEFT through `modules_to_save`).
    """
    model = load_pretrained(config, model_path, run)
    set_seed(config.seed)  # the same LoRA initialisation for every run, whatever patching drew
    if config.train == "gates":
        freeze_all_but_gates(model)
    elif config.train == "gates+lora":
        peft = import_peft()
        lora = peft.LoraConfig(
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=list(config.lora_target_modules),
            modules_to_save=[GATE_MODULE_NAME] if run.gate is not None else None,
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, lora)
    return model


def import_peft():
    try:
        import peft
    except ImportError as err:
        raise ModuleNotFoundError(f"train='gates+lora' needs PEFT: {LORA_INSTALL}") from err
    return peft


def train_run(
    config: RecipeConfig,
    run: RunSpec,
    model_path: str,
    tokenizer,
    train_set: datasets.Dataset,
    validation_set: datasets.Dataset | None,
    callbacks: list[TrainerCallback] | None = None,
) -> dict:
    """Fine-tune `run`, save its final weights to `<run>/model` and return (and save) its training summary.

    With `config.resume`, training continues from the last complete checkpoint in `<run>/checkpoints`. A run
    without trainable parameters (the baseline under `train="gates"`) is not trained.
    """
    model = build_trainable_model(config, model_path, run)
    collator = DataCollatorForSummarization(tokenizer.pad_token_id)
    return train_model(
        config, run, model, collator, train_set, validation_set, callbacks, processors=(tokenizer,)
    )


def load_trained_model(config: RecipeConfig, run: RunSpec, model_path: str):
    """The model of `run` as trained (the pretrained one, patched, when it was not trained), in eval mode."""
    final = config.run_dir / run.name / "model"
    dtype = inference_dtype(config)
    kwargs = {"dtype": dtype, "attn_implementation": config.attn_implementation}
    if not final.is_dir():
        model = load_pretrained(config, model_path, run, dtype)
    elif config.train == "gates+lora":
        base = load_pretrained(config, model_path, run, dtype)
        model = import_peft().PeftModel.from_pretrained(base, str(final)).merge_and_unload()
    elif run.gate is not None:
        model = load_gated(str(final), AutoModelForCausalLM, backend=config.backend, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(final), **kwargs)
    return model.to(inference_device()).eval()
