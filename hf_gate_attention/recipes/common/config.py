"""The config every recipe shares: `RecipeConfigBase` (where the results go, how this invocation runs, the
compared runs), `RunSpec`, the training keys of the fine-tuning recipes, and what `--resume` may change."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from transformers import SchedulerType

from ...core.backends import backend_names
from ...core.config import GateConfig
from .config_files import from_mapping

# Keys that say where a run lives or how this invocation behaves; never part of a run's identity.
INVOCATION_KEYS = ("name", "output_dir", "overwrite", "resume", "backend")
# Keys that `--resume` may change: they extend the training budget or only touch bookkeeping.
RESUMABLE_KEYS = (
    "runs",  # only by appending new runs
    "max_steps",
    "num_train_epochs",
    "save_steps",
    "save_total_limit",
    "logging_steps",
    "eval_steps",
)
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class RunSpec:
    """One model of a comparison: a name (its results subfolder) and its gate (`None`: the baseline)."""

    name: str
    gate: GateConfig | None = None

    @property
    def is_baseline(self) -> bool:
        return self.gate is None

    def to_dict(self) -> dict:
        return {"name": self.name, "gate": None if self.gate is None else self.gate.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> RunSpec:
        if not isinstance(data, dict):
            raise ValueError(f"each entry of `runs` must be a mapping {{name, gate}}, got {data!r}")
        unknown = sorted(set(data) - {"name", "gate"})
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in run {data!r}; a run has the keys: name, gate")
        name = data.get("name")
        if not isinstance(name, str) or not RUN_NAME.match(name):
            raise ValueError(f"run name {name!r} is not valid: use letters, digits, '.', '_' or '-'")
        gate = data.get("gate")
        if gate is not None and not isinstance(gate, dict):
            raise ValueError(
                f"run {name!r}: `gate` must be null (baseline) or a GateConfig mapping, got {gate!r}"
            )
        return cls(name, None if gate is None else GateConfig.from_dict(gate))


def check_shared_keys(config) -> None:
    """The checks every recipe's config shares: `name` (a folder name), `runs` (at least one, unique names,
    at most one ungated baseline), `backend`, not both `resume` and `overwrite`, the `max_<split>_examples`
    (where the config has them) and the training keys; `ValueError` naming what is wrong and what is
    accepted."""
    if not RUN_NAME.match(config.name):
        raise ValueError(f"name={config.name!r} is not valid: use letters, digits, '.', '_' or '-'")
    names = [r.name for r in config.runs]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`runs` must list at least one model, with unique names; got {names}")
    if sum(r.is_baseline for r in config.runs) > 1:
        raise ValueError(f"at most one run may be the ungated baseline (gate: null), got {names}")
    if config.backend not in backend_names():
        raise ValueError(f"backend={config.backend!r} is not valid; accepted: {', '.join(backend_names())}")
    if config.resume and config.overwrite:
        raise ValueError(
            "--resume and --overwrite conflict: --resume continues the run in "
            f"{config.run_dir} (finished trainings kept, interrupted ones continued from their checkpoints), "
            "--overwrite starts it over (the old results deleted once the new ones are complete); pass one"
        )
    for key in [f"max_{split}_examples" for split in ("train", "validation", "test")]:
        value = getattr(config, key, None)
        if value is not None and value < 1:
            raise ValueError(f"{key}={value!r} is not valid; accepted: an integer >= 1, or null (all)")
    check_training_keys(config)


SCRATCH_DECODERS = ("scratch-gpt2", "scratch-bert")  # decoders the encoder-decoder recipes draw from scratch


@dataclass
class EncoderDecoderKeys:
    """The keys of the recipes that train a text decoder on a frozen vision encoder (captioning, video QA),
    checked by `check_encoder_decoder_keys`; a recipe redeclares a field to change its default.

    Model:
        encoder (`str`): Hub id or local folder of a vision encoder; `"dinov2-small"` is the offline copy.
        decoder (`str`): `"scratch-gpt2"` or `"scratch-bert"` (a `GPT2LMHeadModel` or `BertLMHeadModel` with
            cross-attention, built from `decoder_*` and a word-level tokenizer of the training texts), or a
            Hub id / local folder of a pretrained decoder that takes cross-attention (GPT-2, BERT, ...; its
            own tokenizer).
        decoder_layers, decoder_hidden_size, decoder_heads (`int`): size of a `scratch-*` decoder.
        decoder_dropout (`float`): dropout of a `scratch-*` decoder, in [0, 1).
        attn_implementation (`str`, defaults to `"sdpa"`): attention kernel while training, generating and
            timing; the attention weights are always read with `"eager"`.

    Images:
        image_size (`int`): images are resized to this square size, a multiple of the encoder's patch size
            (112: 8 x 8 patches of 14 pixels for DINOv2).
        feature_batch_size (`int`): images per batch when the encoder features are computed.

    Statistics and timing:
        mask_threshold (`float`): a patch belongs to an object when at least this share of its pixels does,
            in (0, 1]; an object covering no patch that much gets its most covered patch.
        n_bootstrap (`int`): bootstrap resamples of the confidence intervals.
        confidence (`float`): level of the confidence intervals, in (0, 1).
        speed_rounds (`int`): interleaved timing rounds over the models (ratios are taken per round).
    """

    encoder: str = "dinov2-small"
    decoder: str = "scratch-gpt2"
    decoder_layers: int = 3
    decoder_hidden_size: int = 128
    decoder_heads: int = 4
    decoder_dropout: float = 0.1
    attn_implementation: str = "sdpa"
    image_size: int = 112
    feature_batch_size: int = 32
    generation_batch_size: int = 64
    mask_threshold: float = 0.25
    overlay_examples: int = 2
    n_bootstrap: int = 1000
    confidence: float = 0.95
    speed_examples: int = 64
    speed_batch_size: int = 32
    speed_rounds: int = 3


def check_encoder_decoder_keys(config, counts: tuple[str, ...], non_negative: tuple[str, ...] = ()) -> None:
    """The checks of the recipes that train a decoder on a frozen vision encoder (captioning, video QA):
    `decoder` (a built-in scratch decoder, or a Hub id or folder), the intervals, the keys >= 1 (theirs and
    `counts`) and >= 0 (`overlay_examples` and `non_negative`), heads dividing the hidden size."""
    check_shared_keys(config)
    decoder = config.decoder
    if decoder.startswith("scratch-") and decoder not in SCRATCH_DECODERS and not Path(decoder).exists():
        raise ValueError(
            f"decoder={decoder!r} is not a built-in decoder; accepted: {', '.join(SCRATCH_DECODERS)}, "
            "or a Hub id or local folder of a pretrained decoder that takes cross-attention"
        )
    if not 0 < config.confidence < 1:
        raise ValueError(f"confidence={config.confidence} must be in (0, 1)")
    if not 0 < config.mask_threshold <= 1:
        raise ValueError(f"mask_threshold={config.mask_threshold} must be in (0, 1]")
    if not 0 <= config.decoder_dropout < 1:
        raise ValueError(f"decoder_dropout={config.decoder_dropout} must be in [0, 1)")
    positive = ("decoder_layers", "decoder_hidden_size", "decoder_heads", "image_size", "feature_batch_size")
    positive += ("generation_batch_size", "n_bootstrap", "speed_examples", "speed_batch_size", "speed_rounds")
    for key in (*positive, *counts):
        if getattr(config, key) < 1:
            raise ValueError(f"{key}={getattr(config, key)} must be >= 1")
    for key in ("overlay_examples", *non_negative):
        if getattr(config, key) < 0:
            raise ValueError(f"{key}={getattr(config, key)} must be >= 0")
    if config.decoder_hidden_size % config.decoder_heads:
        raise ValueError(
            f"decoder_hidden_size={config.decoder_hidden_size} must be a multiple of "
            f"decoder_heads={config.decoder_heads}"
        )


def split_limits(config) -> dict[str, int | None]:
    """`{split: config.max_<split>_examples}`: examples of each split a recipe keeps (`None`: all)."""
    return {split: getattr(config, f"max_{split}_examples") for split in ("train", "validation", "test")}


def baseline_and_headwise() -> list[RunSpec]:
    """The default comparison: the ungated baseline and the article's output headwise gate."""
    return [RunSpec("baseline"), RunSpec("output-headwise", GateConfig("output", "headwise"))]


def baseline_and_gated_decoders() -> list[RunSpec]:
    """The default comparison of the recipes with a decoder trained from scratch (captioning, video QA): no
    gate; gated cross-attention; gated cross- and self-attention (headwise output gates of the decoder only,
    the paper's normal init)."""
    gate = {"variant": "output", "granularity": "headwise", "init": "paper", "parts": ["decoder"]}
    return [
        RunSpec("baseline"),
        RunSpec("gated-cross", GateConfig.from_dict({**gate, "attention": ["cross"]})),
        RunSpec("gated-cross-self", GateConfig.from_dict({**gate, "attention": ["cross", "decoder"]})),
    ]


@dataclass
class RecipeConfigBase:
    """The keys every recipe's config has, and what goes with them: the results folder
    `<output_dir>/<name>/`, the ungated (or reference) run, and the dict form that `config.json` saves.

    A recipe's config is a dataclass deriving from this one (listed first among its bases, so that these keys
    come after the `TrainingKeys` in the saved config); it sets its own `name` default and, for runs of
    another kind than `RunSpec`, `run_class` and `runs`. `__post_init__` reads the runs, then calls
    `_validate`.

        name (`str`): the results folder is `<output_dir>/<name>/`.
        output_dir (`str`, defaults to `"results"`): parent folder of the results folders.
        overwrite (`bool`): start over in `<output_dir>/<name>/`; what it held is set aside (a hidden folder
            beside it) and deleted once the new results are complete.
        resume (`bool`): continue the run in `<output_dir>/<name>/` (finished trainings kept, interrupted ones
            restart from their last checkpoint; only runs (appended), max_steps, num_train_epochs, save_steps,
            save_total_limit, logging_steps and eval_steps may change; the data must be the same).
        backend (`str`, defaults to `"auto"`): what runs the gates, as in `patch`; not part of the identity.
        runs (`list`): the compared models.
    """

    run_class: ClassVar[type] = RunSpec

    name: str = "demo"
    output_dir: str = "results"
    overwrite: bool = False
    resume: bool = False
    backend: str = "auto"
    runs: list[RunSpec] = field(default_factory=baseline_and_headwise)

    def __post_init__(self):
        self.runs = [r if isinstance(r, self.run_class) else self.run_class.from_dict(r) for r in self.runs]
        self._validate()

    def _validate(self) -> None:
        check_shared_keys(self)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @property
    def baseline(self):
        """The run the others are compared with (`is_baseline`), or `None`."""
        return next((r for r in self.runs if r.is_baseline), None)

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["runs"] = [r.to_dict() for r in self.runs]
        return data

    @classmethod
    def from_dict(cls, data: dict, source: str = "config"):
        """Build from a mapping whose values may be strings (command line) or typed (YAML/JSON)."""
        return from_mapping(cls, data, source)

    def replace(self, **changes):
        """A copy with some keys changed (checked like a new config)."""
        return type(self).from_dict({**self.to_dict(), **changes})


@dataclass
class TrainingKeys:
    """The training keys every fine-tuning recipe's config has, as in `transformers.TrainingArguments`; a
    recipe redeclares a field to change its default. Read by `training.training_arguments`, checked by
    `check_training_keys`.

    Keys:
        learning_rate (`float`): peak learning rate of the model's weights (AdamW), > 0.
        gate_learning_rate (`float`, *optional*): learning rate of the gate parameters (new, zero-initialised
            weights need a larger one than pretrained weights); `None`: `learning_rate`.
        weight_decay (`float`): AdamW weight decay, >= 0 (never on the gates, biases and norms).
        warmup_steps (`float`): linear warm-up steps; < 1 is a ratio of the total steps.
        lr_scheduler_type (`str`): the learning-rate schedule after warm-up (`linear`, `cosine`, ...).
        num_train_epochs (`float`): passes over the training split, > 0 (when `max_steps` is -1).
        max_steps (`int`): optimizer steps (overrides `num_train_epochs`); -1: use `num_train_epochs`.
        per_device_train_batch_size, per_device_eval_batch_size (`int`): examples per device and step.
        gradient_accumulation_steps (`int`): steps whose gradients are summed per optimizer step.
        bf16, fp16 (`bool`): mixed-precision training (at most one).
        gradient_checkpointing (`bool`): recompute activations in the backward pass (less memory, slower).
        seed (`int`): seed of the initialisation and of the data order, the same for every run, >= 0.
        logging_steps (`int`): training loss logged every N steps (the loss curves).
        eval_steps (`int`, *optional*): validation loss every N steps (validation split, never test);
            `None`: never.
        save_steps (`int`): a checkpoint every N steps (what `--resume` continues from).
        save_total_limit (`int`, *optional*): checkpoints kept per run; `None`: all.
        ddp_backend (`str`, *optional*): torch.distributed backend of a multi-process launch (`nccl`, `gloo`);
            `None`: the Trainer's choice.
    """

    learning_rate: float = 5e-5
    gate_learning_rate: float | None = 1e-3
    weight_decay: float = 0.0
    warmup_steps: float = 0.1
    lr_scheduler_type: str = "linear"
    num_train_epochs: float = 1.0
    max_steps: int = -1
    per_device_train_batch_size: int = 1
    per_device_eval_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    bf16: bool = False
    fp16: bool = False
    gradient_checkpointing: bool = False
    seed: int = 0
    logging_steps: int = 1
    eval_steps: int | None = None
    save_steps: int = 50
    save_total_limit: int | None = 1
    ddp_backend: str | None = None


# key -> (lowest accepted value, whether that value itself is refused, whether null is accepted)
TRAINING_RANGES = {
    "learning_rate": (0, True, False),
    "gate_learning_rate": (0, True, True),
    "num_train_epochs": (0, True, False),
    "weight_decay": (0, False, False),
    "warmup_steps": (0, False, False),
    "per_device_train_batch_size": (1, False, False),
    "per_device_eval_batch_size": (1, False, False),
    "gradient_accumulation_steps": (1, False, False),
    "logging_steps": (1, False, False),
    "save_steps": (1, False, False),
    "eval_steps": (1, False, True),
    "save_total_limit": (1, False, True),
    "seed": (0, False, False),
}


def check_training_keys(config) -> None:
    """The training keys' ranges (`TRAINING_RANGES`, for the keys `config` has; `max_steps` -1 or >= 1, a
    known `lr_scheduler_type`, not both bf16 and fp16), checked before anything is written or trained:
    `ValueError` naming the key, its value and what is accepted (the Trainer would train a full epoch for
    max_steps=-3, 0 steps for num_train_epochs=-1, and NaN for learning_rate=inf, without an error)."""
    for name, (low, refuse_low, nullable) in TRAINING_RANGES.items():
        if not hasattr(config, name):
            continue
        value = getattr(config, name)
        if value is None and nullable:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not number or value < low or (refuse_low and value == low):
            accepted = f"a finite number {'>' if refuse_low else '>='} {low}" + (
                " or null" if nullable else ""
            )
            raise ValueError(f"{name}={value!r} is not valid; accepted: {accepted}")
    max_steps = getattr(config, "max_steps", -1)
    if max_steps != -1 and (isinstance(max_steps, bool) or max_steps < 1):
        raise ValueError(f"max_steps={max_steps!r} is not valid; accepted: -1 (use num_train_epochs) or >= 1")
    schedulers = [scheduler.value for scheduler in SchedulerType]
    if hasattr(config, "lr_scheduler_type") and config.lr_scheduler_type not in schedulers:
        raise ValueError(
            f"lr_scheduler_type={config.lr_scheduler_type!r} is not valid; accepted: {', '.join(schedulers)}"
        )
    if getattr(config, "bf16", False) and getattr(config, "fp16", False):
        raise ValueError("bf16 and fp16 are both set; choose one of them")


def _saved_runs(runs: list[dict]) -> list[dict]:
    """Runs of a saved config as the current version writes them (older gate fields read by `from_saved`);
    runs without a `gate` (another recipe's runs, such as the distillation's) are compared as saved."""
    return [
        RunSpec(run["name"], None if run["gate"] is None else GateConfig.from_saved(run["gate"])).to_dict()
        if "gate" in run
        else run
        for run in runs
    ]


def identity_differences(saved: dict, current: RecipeConfigBase, allowed: tuple[str, ...] = ()) -> list[str]:
    """Keys (beyond `INVOCATION_KEYS` and `allowed`) whose values differ in a saved config and `current`.

    `runs` is compared as the current version writes it; with `"runs"` in `allowed` the current runs may
    extend the saved ones (new runs appended at the end, the saved ones unchanged)."""
    now = json.loads(json.dumps(current.to_dict()))
    saved = {**saved, "runs": _saved_runs(saved.get("runs") or [])}
    if "runs" in allowed and now["runs"][: len(saved["runs"])] == saved["runs"]:
        now["runs"] = saved["runs"]
    keys = sorted((set(saved) | set(now)) - set(INVOCATION_KEYS) - (set(allowed) - {"runs"}))
    return [key for key in keys if saved.get(key) != now.get(key)]
