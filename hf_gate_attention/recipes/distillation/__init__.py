"""Distillation of gating into a smaller model: a frozen gated summarization model (the teacher) teaches a
student with fewer layers through its logits (KL with temperature) and its gate values (MSE on the mapped
layers); students with and without each term are compared on ROUGE and speed as in the summarization recipe
(`run_distillation`, `hf-gate-attention recipe distillation`)."""

from .compare import run_distillation
from .config import DistillationConfig, DistillRunSpec
from .losses import gate_mse, kd_loss_sum, recorded_gates, summary_positions
from .models import build_student, default_layer_map, load_teacher

__all__ = [
    "DistillRunSpec",
    "DistillationConfig",
    "build_student",
    "default_layer_map",
    "gate_mse",
    "kd_loss_sum",
    "load_teacher",
    "recorded_gates",
    "run_distillation",
    "summary_positions",
]
