"""`RecipeConfig`: every knob of the summarization recipe, from YAML/JSON files and `--key value` options."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...core.backends import backend_names
from ...core.config import GateConfig
from .data import DEFAULT_INSTRUCTION, TRUNCATION_STRATEGIES

TRAIN_MODES = ("full", "gates", "gates+lora")
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
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


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
    at most one ungated baseline) and `backend`; `ValueError` naming what is wrong and what is accepted."""
    if not RUN_NAME.match(config.name):
        raise ValueError(f"name={config.name!r} is not valid: use letters, digits, '.', '_' or '-'")
    names = [r.name for r in config.runs]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`runs` must list at least one model, with unique names; got {names}")
    if sum(r.is_baseline for r in config.runs) > 1:
        raise ValueError(f"at most one run may be the ungated baseline (gate: null), got {names}")
    if config.backend not in backend_names():
        raise ValueError(f"backend={config.backend!r} is not valid; accepted: {', '.join(backend_names())}")


def _default_runs() -> list[RunSpec]:
    return [RunSpec("baseline"), RunSpec("output-headwise", GateConfig("output", "headwise"))]


class RecipeConfigBase:
    """What the config dataclass of every recipe has beside its keys: the results folder
    `<output_dir>/<name>/`, the ungated (or reference) run, and the dict form that `config.json` saves."""

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
    """The training keys every fine-tuning recipe's config has (as in `transformers.TrainingArguments`;
    `warmup_steps` < 1 is a ratio of the total steps; `gate_learning_rate` is the gates' own rate, `None`:
    `learning_rate`); a recipe redeclares a field to change its default. Read by
    `train.training_arguments`."""

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


@dataclass
class SummaryKeys:
    """The data and evaluation keys every summary-generating recipe's config has (documented in
    `RecipeConfig`), checked by `check_summary_keys`."""

    # data
    dataset: str = "aclsum"
    document_column: str | None = None
    summary_column: str | None = None
    max_train_examples: int | None = None
    max_validation_examples: int | None = None
    max_test_examples: int | None = None
    doc_token_budget: int = 512
    truncation: str = "head"
    max_summary_tokens: int = 256
    instruction: str = DEFAULT_INSTRUCTION
    # evaluation
    max_new_tokens: int = 128
    generation_batch_size: int = 4
    n_bootstrap: int = 1000
    confidence: float = 0.95
    speed_examples: int = 4
    speed_rounds: int = 3
    speed_new_tokens: int = 64


@dataclass
class RecipeConfig(SummaryKeys, TrainingKeys, RecipeConfigBase):
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

    name: str = "demo"
    output_dir: str = "results"
    overwrite: bool = False
    resume: bool = False
    backend: str = "auto"
    runs: list[RunSpec] = field(default_factory=_default_runs)
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

    def __post_init__(self):
        self.runs = [r if isinstance(r, RunSpec) else RunSpec.from_dict(r) for r in self.runs]
        self._validate()

    def _validate(self) -> None:
        check_shared_keys(self)
        if self.train not in TRAIN_MODES:
            raise ValueError(f"train={self.train!r} is not valid; accepted: {', '.join(TRAIN_MODES)}")
        check_summary_keys(self)


def check_summary_keys(config) -> None:
    """The checks of the keys every summary-generating recipe's config has (prompt truncation and budgets,
    precision, evaluation); `ValueError` naming the key and what is accepted."""
    if config.truncation not in TRUNCATION_STRATEGIES:
        raise ValueError(
            f"truncation={config.truncation!r} is not valid; accepted: {', '.join(TRUNCATION_STRATEGIES)}"
        )
    if config.bf16 and config.fp16:
        raise ValueError("bf16 and fp16 are both true; pick one")
    if not 0 < config.confidence < 1:
        raise ValueError(f"confidence={config.confidence} must be in (0, 1)")
    positive = ("doc_token_budget", "max_summary_tokens", "max_new_tokens", "generation_batch_size")
    positive += ("n_bootstrap", "speed_examples", "speed_rounds", "per_device_train_batch_size")
    for key, minimum in [(key, 1) for key in positive] + [("speed_new_tokens", 2)]:
        if getattr(config, key) < minimum:
            raise ValueError(f"{key}={getattr(config, key)} must be >= {minimum}")


def from_mapping(config_class, data: dict, source: str = "config"):
    """A config dataclass built from a mapping whose values may be strings (command line) or typed."""
    check_keys(data, source, config_class)
    hints = typing.get_type_hints(config_class)
    return config_class(**{key: _coerce(key, value, hints[key]) for key, value in data.items()})


def check_keys(data: dict, source: str, config_class=None) -> None:
    """Raise `ValueError` naming the first key of `data` that is not a field of `config_class`
    (default: `RecipeConfig`)."""
    known = [f.name for f in dataclasses.fields(config_class or RecipeConfig)]
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown config key {key!r} in {source}{hint}; known keys: {', '.join(known)}")


def _coerce(key: str, value: Any, annotation) -> Any:
    """Convert `value` (command-line string or YAML/JSON value) to the field's type, or raise naming `key`."""
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
        if type(None) in options:
            return None
        raise ValueError(f"config key {key!r} may not be null")
    errors = []
    for option in (o for o in options if o is not type(None)):
        try:
            return _convert(value, option)
        except (TypeError, ValueError, yaml.YAMLError) as err:
            errors.append(str(err))
    raise ValueError(f"config key {key!r}: cannot read {value!r} as {annotation}: {'; '.join(errors)}")


def _convert(value: Any, target) -> Any:
    origin = typing.get_origin(target) or target
    if origin is bool:
        text = str(value).lower()
        if isinstance(value, bool) or text in _TRUE | _FALSE:
            return value if isinstance(value, bool) else text in _TRUE
        raise ValueError(f"expected true/false, got {value!r}")
    if origin is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    if origin is float:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if origin is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"expected a string, got {value!r}")
        return str(value)
    if origin is list:
        items = yaml.safe_load(value) if isinstance(value, str) else value
        if isinstance(items, str):  # comma-separated on the command line: q_proj,v_proj
            items = [item.strip() for item in items.split(",") if item.strip()]
        if not isinstance(items, list):
            raise ValueError(f"expected a list, got {value!r}")
        (item_type,) = typing.get_args(target)
        # runs (`RunSpec`, or another recipe's run dataclass) are read by the config's own __post_init__
        return items if dataclasses.is_dataclass(item_type) else [_convert(item, item_type) for item in items]
    raise TypeError(f"unsupported config type {target}")


def read_config_file(path: str | Path) -> dict:
    """The mapping in a YAML or JSON config file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {str(path)!r} must hold a mapping of config keys, got {type(data).__name__}"
        )
    return data


def parse_overrides(args: list[str]) -> dict[str, str]:
    """`["--lr_key", "v", "--flag", "--other=v2"]` -> `{"lr_key": "v", "flag": "true", "other": "v2"}`.

    Dashes in key names are read as underscores; a key without a value (followed by another `--key` or by
    nothing) means `true`.
    """
    overrides, i = {}, 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ValueError(f"expected --key value, got {arg!r}")
        key, has_value, value = arg[2:].partition("=")
        if not has_value:
            has_next = i + 1 < len(args) and not args[i + 1].startswith("--")
            value = args[i + 1] if has_next else "true"
            i += has_next
        overrides[key.replace("-", "_")] = value
        i += 1
    return overrides


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None, config_class=None
) -> RecipeConfig:
    """Defaults, then the file at `path`, then `overrides` (command line); unknown keys raise ValueError.
    `config_class` defaults to `RecipeConfig`."""
    config_class = config_class or RecipeConfig
    data = read_config_file(path) if path is not None else {}
    check_keys(data, f"config file {str(path)!r}", config_class)
    check_keys(overrides or {}, "the command line", config_class)
    return config_class.from_dict({**data, **(overrides or {})})


def _saved_runs(runs: list[dict]) -> list[dict]:
    """Runs of a saved config as the current version writes them (older gate fields read by `from_saved`);
    runs without a `gate` (another recipe's runs, such as the distillation's) are compared as saved."""
    return [
        RunSpec(run["name"], None if run["gate"] is None else GateConfig.from_saved(run["gate"])).to_dict()
        if "gate" in run
        else run
        for run in runs
    ]


def identity_differences(saved: dict, current: RecipeConfig, allowed: tuple[str, ...] = ()) -> list[str]:
    """Keys (beyond `INVOCATION_KEYS` and `allowed`) whose values differ in a saved config and `current`.

    `runs` is compared as the current version writes it; with `"runs"` in `allowed` the current runs may
    extend the saved ones (new runs appended at the end, the saved ones unchanged)."""
    now = json.loads(json.dumps(current.to_dict()))
    saved = {**saved, "runs": _saved_runs(saved.get("runs") or [])}
    if "runs" in allowed and now["runs"][: len(saved["runs"])] == saved["runs"]:
        now["runs"] = saved["runs"]
    keys = sorted((set(saved) | set(now)) - set(INVOCATION_KEYS) - (set(allowed) - {"runs"}))
    return [key for key in keys if saved.get(key) != now.get(key)]
