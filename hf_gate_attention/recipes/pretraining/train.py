"""One job of the pretraining study: a fresh Llama-style model, gated or not, trained with the Trainer."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

from ...diagnostics import DiagnosticsCallback, diagnose
from ...files import atomic_write_json, read_json
from ..common.distributed import on_cpu, patch_on_device
from ..common.training import last_complete_checkpoint, name_progress_bar
from .config import Job, StudyConfig
from .data import BlockDataset

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"  # written last: a job with it is finished
DIAGNOSTICS_FILE = "diagnostics.json"
FINAL_DIAGNOSTICS_FILE = "final_diagnostics.json"


def llama_config(config: StudyConfig, vocab_size: int, eos_token_id: int) -> LlamaConfig:
    """The study's model configuration (Llama-style, tied embeddings)."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.seq_len,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )


def build_model(config: StudyConfig, job: Job, vocab_size: int, eos_token_id: int) -> LlamaForCausalLM:
    """The untrained model of `job`: the base weights depend only on the seed (the gate, drawn after them,
    does not change them), so every run of a seed starts from the same ungated weights."""
    set_seed(job.seed)
    model_config = llama_config(config, vocab_size, eos_token_id)
    model = LlamaForCausalLM._from_config(model_config, attn_implementation="sdpa")
    return patch_on_device(model, job.run.gate, config.backend) if job.run.gate is not None else model


def training_arguments(config: StudyConfig, job: Job, checkpoint_dir: Path) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(checkpoint_dir),
        max_steps=config.max_steps,
        learning_rate=job.learning_rate,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type=config.lr_scheduler_type,
        weight_decay=config.weight_decay,
        adam_beta2=config.adam_beta2,
        max_grad_norm=config.max_grad_norm,
        per_device_train_batch_size=config.per_device_train_batch_size,
        per_device_eval_batch_size=16,
        bf16=config.bf16,
        seed=job.seed,
        data_seed=config.seeds[0],  # the same data order for every job
        logging_steps=config.logging_steps,
        logging_first_step=True,
        logging_nan_inf_filter=False,  # a diverging run must show its NaN/inf losses
        eval_strategy="steps",
        eval_steps=config.eval_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=1,
        use_cpu=on_cpu(),
        dataloader_pin_memory=torch.cuda.is_available(),
        report_to="none",
    )


def is_finished(job_dir: Path) -> bool:
    return (Path(job_dir) / METRICS_FILE).is_file()


def train_job(
    config: StudyConfig,
    job: Job,
    job_dir: Path,
    blocks: dict[str, torch.Tensor],
    tokenizer,
    resume: bool,
) -> dict:
    """Train `job`, evaluate it on the test blocks, diagnose it, and write `<job_dir>/metrics.json`.

    `blocks`: `(N, seq_len)` token blocks of `train`, `validation` (loss curves, the probe) and `test` (the
    final loss and diagnostics the verdicts use). With `resume`, training continues from the last checkpoint.
    """
    job_dir = Path(job_dir)
    checkpoint_dir = job_dir / "checkpoints"
    model = build_model(config, job, len(tokenizer), tokenizer.eos_token_id)
    validation = blocks["validation"][: config.validation_blocks]
    trainer = Trainer(
        model=model,
        args=training_arguments(config, job, checkpoint_dir),
        train_dataset=BlockDataset(blocks["train"]),
        eval_dataset=BlockDataset(validation),
    )
    probe = [{"input_ids": block[None]} for block in validation[: config.probe_blocks]]
    DiagnosticsCallback(probe, config.diagnostics_steps, job_dir / DIAGNOSTICS_FILE).attach(trainer)
    name_progress_bar(trainer, job.name)
    checkpoint = last_complete_checkpoint(checkpoint_dir) if resume else None
    if checkpoint is not None:
        logger.warning("Job %s: resuming from %s", job.name, checkpoint)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    test = blocks["test"][: config.test_blocks]
    test_loss = trainer.evaluate(BlockDataset(test), metric_key_prefix="test")["test_loss"]
    final = diagnose(model, [{"input_ids": block[None]} for block in test[: config.test_probe_blocks]])
    atomic_write_json(job_dir / FINAL_DIAGNOSTICS_FILE, final)
    trainer.save_model(str(job_dir / "model"))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(job_dir / "model")  # the folder loads on its own (`pipeline`)
    metrics = {
        "job": job.name,
        "run": job.run.to_dict(),
        "learning_rate": job.learning_rate,
        "seed": job.seed,
        "global_step": trainer.state.global_step,
        "resumed_from": None if checkpoint is None else Path(checkpoint).name,
        "train_loss": result.training_loss,
        "train_runtime_s": result.metrics.get("train_runtime"),
        "test_loss": test_loss,
        "test_perplexity": math.exp(test_loss) if test_loss < 50 else float("inf"),
        "diverged": is_diverged(test_loss, len(tokenizer)),
        "diagnostics": final["summary"],
        "log_history": trainer.state.log_history,
        "diagnostics_history": read_json(job_dir / DIAGNOSTICS_FILE),
    }
    atomic_write_json(job_dir / METRICS_FILE, metrics)
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    return metrics


def is_diverged(test_loss: float, vocab_size: int) -> bool:
    """Not finite, or worse than predicting every token uniformly (`log(vocab_size)`)."""
    return not math.isfinite(test_loss) or test_loss > math.log(vocab_size)
