"""Training of one run with the Hugging Face `Trainer`, shared by the recipes: the gates' own learning rate,
the training arguments of `TrainingKeys`, checkpoints and resume, the training summary."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from zipfile import is_zipfile

import torch
from tqdm.auto import tqdm
from transformers import ProgressCallback, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from ...core.patching import gate_parameters
from ...files import atomic_write_json, check_safetensors_folder, read_json
from ...sharing.loading import load_processor
from .config import RunSpec
from .distributed import distributed_state, on_cpu

logger = logging.getLogger(__name__)

TRAIN_SUMMARY_FILE = "train_summary.json"


def load_tokenizer(model_path: str):
    """The model's tokenizer, with its EOS token as pad token when it has none."""
    tokenizer = load_processor(model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def count_parameters(model) -> dict[str, int]:
    params = {id(p): p for p in model.parameters()}.values()
    return {
        "total": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


class GateLearningRateTrainer(Trainer):
    """`Trainer` whose optimizer gives the gate parameters their own learning rate and no weight decay."""

    def __init__(self, *args, gate_learning_rate: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate_learning_rate = gate_learning_rate

    def create_optimizer(self, model=None):
        if self.optimizer is not None or self.gate_learning_rate is None:
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        gate_ids = {id(p) for p in gate_parameters(opt_model)}
        decay_names = set(self.get_decay_parameter_names(opt_model))
        groups = {"decay": [], "no_decay": [], "gates": []}
        for name, param in opt_model.named_parameters():
            if param.requires_grad:
                group = "gates" if id(param) in gate_ids else "decay" if name in decay_names else "no_decay"
                groups[group].append(param)
        settings = {
            "decay": {"weight_decay": self.args.weight_decay},
            "no_decay": {"weight_decay": 0.0},
            "gates": {"weight_decay": 0.0, "lr": self.gate_learning_rate},
        }
        param_groups = [{"params": params, **settings[key]} for key, params in groups.items() if params]
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        self.optimizer = optimizer_cls(param_groups, **optimizer_kwargs)
        return self.optimizer


class RunProgressCallback(ProgressCallback):
    """The Trainer's progress bar, named after the run it trains (runs train one after another)."""

    def __init__(self, run_name: str):
        super().__init__()
        self.run_name = run_name

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                total=state.max_steps, dynamic_ncols=True, desc=f"Training {self.run_name}"
            )
        self.current_step = 0


def name_progress_bar(trainer: Trainer, run_name: str) -> None:
    """Replace the Trainer's progress bar (where it shows one) by one named after `run_name`."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(RunProgressCallback(run_name))


def training_arguments(config, checkpoint_dir: Path) -> TrainingArguments:
    validate = config.eval_steps is not None
    return TrainingArguments(
        output_dir=str(checkpoint_dir),
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type=config.lr_scheduler_type,
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=config.per_device_eval_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        bf16=config.bf16,
        fp16=config.fp16,
        activation_checkpointing=config.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False},
        seed=config.seed,
        data_seed=config.seed,
        logging_steps=config.logging_steps,
        logging_first_step=True,
        eval_strategy="steps" if validate else "no",
        eval_steps=config.eval_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        ddp_backend=config.ddp_backend,
        use_cpu=on_cpu(),
        ddp_find_unused_parameters=False,
        remove_unused_columns=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        report_to="none",
    )


# What a checkpoint must hold besides its weights and trainer state for training to continue where it stopped
# (glob patterns: the optimizer's and scheduler's state as the Trainer writes them, or DeepSpeed's folder; the
# random number generators' state, one file per process); without them the Trainer starts a fresh optimizer,
# schedule or random stream without a word.
RESUME_STATE = {
    "optimizer": ("optimizer*", "global_step*"),
    "scheduler": ("scheduler*", "global_step*"),
    "random number generator": ("rng_state*",),
}


def check_checkpoint(checkpoint: Path) -> None:
    """`ValueError` naming what a checkpoint lacks or what cannot be read (its trainer state, model config,
    weights, the optimizer's, scheduler's and random number generators' state), and what to do about it."""
    checkpoint = Path(checkpoint)
    advice = f"Delete {checkpoint} to resume from the checkpoint before it, or pass --overwrite to start over"
    try:
        for name in ("trainer_state.json", "config.json"):
            read_json(checkpoint / name)  # names the file when truncated
        check_safetensors_folder(checkpoint)
    except ValueError as err:
        raise ValueError(f"checkpoint {checkpoint} is damaged: {err}. {advice}") from None
    # torch.save writes zip archives: a file that is not one (truncated, overwritten) fails in torch.load
    damaged = [
        path.name for g in ("*.pt", "*.pth") for path in sorted(checkpoint.glob(g)) if not is_zipfile(path)
    ]
    if damaged:
        raise ValueError(
            f"checkpoint {checkpoint} is damaged: {', '.join(damaged)} cannot be read (not a file that "
            f"torch.save writes: truncated or corrupt?). {advice}"
        )
    missing = [
        part for part, globs in RESUME_STATE.items() if not any(any(checkpoint.glob(g)) for g in globs)
    ]
    if missing:
        raise ValueError(
            f"checkpoint {checkpoint} holds no {' and no '.join(missing)} state: resuming would start "
            f"them afresh. {advice}"
        )


def last_complete_checkpoint(checkpoint_dir: Path) -> str | None:
    """The newest checkpoint whose trainer state was written (the Trainer writes it last), checked
    (`check_checkpoint`). Newer folders left by a save that was interrupted are deleted, so that checkpoint
    rotation and numbering ignore them."""
    if not checkpoint_dir.is_dir():
        return None
    while (last := get_last_checkpoint(str(checkpoint_dir))) is not None:
        if (Path(last) / "trainer_state.json").is_file():
            check_checkpoint(Path(last))
            return last
        logger.warning("Deleting the incomplete checkpoint %s (interrupted while saving)", last)
        shutil.rmtree(last, ignore_errors=True)  # every process of a distributed launch may try
    return None


def training_budget(config) -> dict:
    return {"max_steps": config.max_steps, "num_train_epochs": config.num_train_epochs}


def is_trained(config, run: RunSpec) -> bool:
    """Whether `run` finished training with the current budget (a resume may have extended it)."""
    summary = read_json(config.run_dir / run.name / TRAIN_SUMMARY_FILE)
    return summary is not None and summary["budget"] == training_budget(config)


def train_model(
    config,
    run: RunSpec,
    model,
    data_collator,
    train_set,
    validation_set,
    callbacks=None,
    *,
    trainer_class: type[GateLearningRateTrainer] = GateLearningRateTrainer,
    trainer_kwargs: dict | None = None,
    processors: tuple = (),
) -> dict:
    """Train `model` (the model of `run`, built by the recipe) with the Trainer and the training keys of
    `config` (those `training_arguments` reads, plus `run_dir`, `resume`, `gate_learning_rate`), save it to
    `<run>/model` and return (and save) the training summary; shared by the recipes.

    `data_collator` turns a list of `train_set` rows into the model's batch. `trainer_class` (a
    `GateLearningRateTrainer`, e.g. one with its own `compute_loss`) gets `trainer_kwargs` as extra keyword
    arguments. `processors` (the tokenizer, an image processor) are saved beside the weights, so that
    `<run>/model` loads on its own (`pipeline`, `transformers serve`). With `config.resume`, training
    continues from the last complete checkpoint in `<run>/checkpoints`. A model without trainable parameters
    is not trained (`"trained": False`).
    """
    run_dir = config.run_dir / run.name
    params = count_parameters(model)
    summary = {"run": run.name, "budget": training_budget(config), "parameters": params}
    if params["trainable"] == 0:
        logger.warning("Run %s has no trainable parameters: not trained", run.name)
        summary |= {"trained": False, "global_step": 0, "log_history": []}
    else:
        checkpoint_dir = run_dir / "checkpoints"
        trainer = trainer_class(
            model=model,
            args=training_arguments(config, checkpoint_dir),
            train_dataset=train_set,
            eval_dataset=validation_set if config.eval_steps is not None else None,
            data_collator=data_collator,
            callbacks=callbacks,
            gate_learning_rate=config.gate_learning_rate,
            **(trainer_kwargs or {}),
        )
        name_progress_bar(trainer, run.name)
        checkpoint = last_complete_checkpoint(checkpoint_dir) if config.resume else None
        if checkpoint is not None:
            logger.warning("Run %s: resuming from %s", run.name, checkpoint)
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model(str(run_dir / "model"))
        if trainer.is_world_process_zero():
            for processor in processors:
                processor.save_pretrained(run_dir / "model")
        summary |= {
            "trained": True,
            "resumed_from": None if checkpoint is None else Path(checkpoint).name,
            "global_step": trainer.state.global_step,
            "train_loss": result.training_loss,
            "train_runtime_s": result.metrics.get("train_runtime"),
            "world_size": trainer.args.world_size,
            "effective_batch_size": trainer.args.train_batch_size
            * trainer.args.gradient_accumulation_steps
            * trainer.args.world_size,
            "log_history": trainer.state.log_history,
        }
    if distributed_state().is_main_process:
        atomic_write_json(run_dir / TRAIN_SUMMARY_FILE, summary)
    return summary
