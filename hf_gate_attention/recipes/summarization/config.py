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

    Run: the keys of `RecipeConfigBase` (`name`, `output_dir`, `overwrite`, `resume`, `backend`, `runs`).

    Model:
        model (`str`): causal LM Hub id or local folder; `"SmolLM2-135M-Instruct"` is the offline copy.
        attn_implementation (`str`, defaults to `"sdpa"`): attention kernel (`"eager"`, `"sdpa"`, ...).

    Data and evaluation: the keys of `SummaryKeys`.

    Training (besides the keys of `TrainingKeys`):
        train (`str`, defaults to `"full"`): what is trained. `"full"`: every weight (+ the gates); `"gates"`:
            only the gates (the baseline then has nothing to train and is evaluated as is); `"gates+lora"`:
            LoRA adapters on `lora_target_modules` (+ the gates). The baseline trains the same set minus the
            gates.
        lora_r, lora_alpha, lora_dropout, lora_target_modules: LoRA settings for `train="gates+lora"` (rank
            and alpha >= 1, dropout in [0, 1)).
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
        for key in ("lora_r", "lora_alpha"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r} is not valid; accepted: an integer >= 1")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(
                f"lora_dropout={self.lora_dropout!r} is not valid; accepted: 0 <= lora_dropout < 1"
            )
        check_summary_keys(self)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RecipeConfig:
    """Defaults, then the file at `path`, then `overrides` (command line); unknown keys raise ValueError."""
    return load_recipe_config(path, overrides, RecipeConfig)
