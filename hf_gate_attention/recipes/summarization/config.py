"""`RecipeConfig`: every knob of the summarization recipe, from YAML/JSON files and `KEY=VALUE` overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.config import RecipeConfigBase, TrainingKeys, check_shared_keys
from ..common.config_files import load_config as load_recipe_config
from ..common.summaries.keys import SummaryKeys, check_summary_keys

TRAIN_MODES = ("full", "gates", "gates+lora")


@dataclass
class RecipeConfig(RecipeConfigBase, SummaryKeys, TrainingKeys):
    """Configuration of a summarization comparison: the same data, seed and budget for every run.

    Run:
        name (`str`, defaults to `"demo"`): the results folder is `<output_dir>/<name>/`.
        output_dir (`str`, defaults to `"results"`): parent folder of the results folders.
        overwrite (`bool`): delete what `<output_dir>/<name>/` holds and start over.
        resume (`bool`): continue the run in `<output_dir>/<name>/`: finished trainings are kept, interrupted
            ones restart from their last checkpoint. Only the keys in `RESUMABLE_KEYS` may change (`runs`
            only by appending new runs, which are trained; the others are kept).
        backend (`str`, defaults to `"auto"`): what runs the gates, as in `patch` (`"torch"`, `"triton"`,
            `"auto"`); how this invocation runs, not part of a run's identity (`--resume` may change it).
        runs (`list`): the compared models, each `{name, gate}`; `gate` is a `GateConfig` mapping, or null for
            the ungated baseline (at most one; deltas and speed ratios are computed against it).

    Model and data:
        model (`str`): causal LM Hub id or local folder; `"SmolLM2-135M-Instruct"` is the offline copy.
        attn_implementation (`str`, defaults to `"sdpa"`): attention kernel (`"eager"`, `"sdpa"`, ...).
        dataset (`str`): `"aclsum"` (offline), a Hub dataset id, a local file or folder
            (see `load_summarization_dataset`).
        document_column, summary_column (`str`, *optional*): source columns, when not known for `dataset`.
        max_train_examples, max_validation_examples, max_test_examples (`int`, *optional*): keep the first N.
        doc_token_budget (`int`): tokens of the whole prompt (template + instruction + truncated document).
        truncation (`str`): `"head"` or `"head_tail"` (see `truncate_document`).
        max_summary_tokens (`int`): reference summary tokens kept as training target.
        instruction (`str`): the instruction before the document.

    Training:
        train (`str`, defaults to `"full"`): what is trained. `"full"`: every weight (+ the gates); `"gates"`:
            only the gates (the baseline then has nothing to train and is evaluated as is); `"gates+lora"`:
            LoRA adapters on `lora_target_modules` (+ the gates). The baseline trains the same set minus the
            gates.
        learning_rate, weight_decay, warmup_steps, lr_scheduler_type, num_train_epochs, max_steps,
        per_device_train_batch_size, per_device_eval_batch_size, gradient_accumulation_steps, bf16, fp16,
        gradient_checkpointing, seed, logging_steps, save_steps, save_total_limit, ddp_backend:
            as in `transformers.TrainingArguments` (`warmup_steps` < 1 is a ratio of the total steps).
        gate_learning_rate (`float`, *optional*): learning rate of the gate parameters (new, zero-initialised
            weights need a larger one than pretrained weights); `None` uses `learning_rate`.
        eval_steps (`int`, *optional*): validation loss every N steps (on the validation split, never test).
        lora_r, lora_alpha, lora_dropout, lora_target_modules: LoRA settings for `train="gates+lora"`.

    Evaluation:
        max_new_tokens (`int`): length limit of the greedy summaries.
        generation_batch_size (`int`): prompts per `generate` call (left padding).
        n_bootstrap, confidence: bootstrap resamples and level of the ROUGE confidence intervals.
        speed_examples, speed_rounds, speed_new_tokens: test prompts timed one by one, interleaved rounds
            over the models, and tokens decoded per timed summary.
    """

    # name, output_dir, overwrite, resume, backend, runs: `RecipeConfigBase`
    name: str = "demo"
    # model
    model: str = "SmolLM2-135M-Instruct"
    attn_implementation: str = "sdpa"
    # data and evaluation: `SummaryKeys`
    # training (and `TrainingKeys`)
    train: str = "full"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def _validate(self) -> None:
        check_shared_keys(self)
        if self.train not in TRAIN_MODES:
            raise ValueError(f"train={self.train!r} is not valid; accepted: {', '.join(TRAIN_MODES)}")
        check_summary_keys(self)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RecipeConfig:
    """Defaults, then the file at `path`, then `overrides` (command line); unknown keys raise ValueError."""
    return load_recipe_config(path, overrides, RecipeConfig)
