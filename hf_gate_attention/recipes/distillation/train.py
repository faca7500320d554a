"""Training of one student with the recipes' Trainer loop (`train_model`: checkpoints, resume)
and a `compute_loss` that adds the distillation terms of its run."""

from __future__ import annotations

from collections import defaultdict

import torch

from ..common.summaries.data import DataCollatorForSummarization
from ..common.training import GateLearningRateTrainer, train_model
from .config import DistillationConfig, DistillRunSpec
from .losses import gate_mse, kd_loss_sum, recorded_gates, summary_positions
from .models import build_student, gated_pairs


class DistillationTrainer(GateLearningRateTrainer):
    """`GateLearningRateTrainer` whose training loss is `task + alpha_kd * KD + alpha_gate * gate MSE`.

    The task loss is the student's own cross-entropy on the summary tokens (what the summarization recipe
    trains). The teacher runs on the same batch without gradient. The KD sum is divided like the task loss:
    by the summary tokens of the whole accumulated batch (of every process of a distributed launch) when the
    Trainer gives that count, else by those of the micro-batch; the gate MSE (a per-micro-batch mean) is then
    divided by the accumulation steps (and averaged over the processes by DDP). The
    validation loss is the task loss alone, comparable across runs. Each logged step also records the mean
    `task_loss`, `kd_loss`, `gate_loss` of the micro-batches since the previous log (unweighted).

    Args:
        teacher: the frozen teacher (`load_teacher`).
        run: the run, with its weights `alpha_kd` and `alpha_gate`.
        temperature: `T` of the KD term.
        pairs: `(student layer, teacher layer)` compared by the gate loss (`gated_pairs`).
    """

    def __init__(self, *args, teacher, run: DistillRunSpec, temperature: float, pairs, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher = teacher.to(self.args.device)
        self.run, self.temperature, self.pairs = run, temperature, pairs
        self._parts: dict[str, list[float]] = defaultdict(list)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not model.training or self.run.is_baseline:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        student_layers = [s for s, _ in self.pairs] if self.run.alpha_gate else []
        teacher_layers = [t for _, t in self.pairs] if self.run.alpha_gate else []
        # hooks on the student's own modules (inside a DDP wrapper) see the wrapper's forward
        with recorded_gates(self.accelerator.unwrap_model(model), student_layers) as student_gates:
            task, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
        with torch.no_grad(), recorded_gates(self.teacher, teacher_layers) as teacher_gates:
            teacher_logits = self.teacher(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            ).logits  # (batch, seq, vocab)
        # the Trainer's rules: a loss divided by `num_items_in_batch` is not divided by the accumulation
        # steps; that count is of every process, and the Trainer multiplies the task loss by their number
        # (DDP averages the gradients): the KD term, divided by the same count, is multiplied too
        scaled_for_accumulation = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        across_processes = scaled_for_accumulation and self.args.average_tokens_across_devices
        processes = self.accelerator.num_processes if across_processes else 1
        loss, parts = task, {"task_loss": task.detach()}
        if self.run.alpha_kd:
            positions = summary_positions(inputs["labels"])  # (batch, seq)
            tokens = num_items_in_batch if scaled_for_accumulation else positions.sum().clamp(min=1)
            kd = kd_loss_sum(outputs.logits, teacher_logits, positions, self.temperature) * processes / tokens
            loss, parts["kd_loss"] = loss + self.run.alpha_kd * kd, kd.detach()
        if self.run.alpha_gate:
            missing = [s for s in student_layers if s not in student_gates]
            missing += [t for t in teacher_layers if t not in teacher_gates]
            if missing:
                raise RuntimeError(
                    f"no gate values recorded for layer(s) {missing}: gates applied inside the attention "
                    "function (sparse top-k) are not called as modules; distill with gates without top_k"
                )
            pairs = [(student_gates[s], teacher_gates[t]) for s, t in self.pairs]
            gates = gate_mse(*zip(*pairs, strict=True), inputs["attention_mask"])
            steps = self.current_gradient_accumulation_steps if scaled_for_accumulation else 1
            loss, parts["gate_loss"] = loss + self.run.alpha_gate * gates / steps, gates.detach()
        for key, value in parts.items():
            self._parts[key].append(float(value))
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            logs |= {key: sum(values) / len(values) for key, values in self._parts.items() if values}
            self._parts.clear()
        super().log(logs, *args, **kwargs)


def train_student(
    config: DistillationConfig, run: DistillRunSpec, teacher, tokenizer, train_set, validation_set, callbacks
) -> dict:
    """Build the student of `run`, train it with its distillation terms and save it to `<run>/model`;
    returns (and saves) the training summary of `train_model`."""
    student, layer_map = build_student(config, teacher)
    pairs = gated_pairs(layer_map, teacher, student)
    return train_model(
        config,
        run,
        student,
        DataCollatorForSummarization(tokenizer.pad_token_id),
        train_set,
        validation_set,
        callbacks,
        trainer_class=DistillationTrainer,
        trainer_kwargs={"teacher": teacher, "run": run, "temperature": config.temperature, "pairs": pairs},
        processors=(tokenizer,),
    )
