"""`DistillationConfig`: every knob of the distillation recipe (YAML/JSON file and `KEY=VALUE`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..common.config import RUN_NAME, RecipeConfigBase, TrainingKeys, check_shared_keys
from ..common.summaries.keys import SummaryKeys, check_summary_keys

TEACHER_ROW = "teacher"  # the teacher's row of the tables; no run may take this name
DEFAULT_TEACHER = "results/reproduce/output-headwise/model"


@dataclass(frozen=True)
class DistillRunSpec:
    """One student of a comparison: a name (its results subfolder) and the weights of its distillation
    terms; the run with both at 0 is the student trained alone (the reference of the deltas)."""

    name: str
    alpha_kd: float = 0.0
    alpha_gate: float = 0.0

    @property
    def is_baseline(self) -> bool:
        return self.alpha_kd == 0 and self.alpha_gate == 0

    def to_dict(self) -> dict:
        return {"name": self.name, "alpha_kd": self.alpha_kd, "alpha_gate": self.alpha_gate}

    @classmethod
    def from_dict(cls, data: Any) -> DistillRunSpec:
        if not isinstance(data, dict):
            raise ValueError(
                f"each entry of `runs` must be a mapping {{name, alpha_kd, alpha_gate}}, got {data!r}"
            )
        unknown = sorted(set(data) - {"name", "alpha_kd", "alpha_gate"})
        if unknown:
            raise ValueError(
                f"unknown key(s) {unknown} in run {data!r}; a run has the keys: name, alpha_kd, alpha_gate"
            )
        name = data.get("name")
        if not isinstance(name, str) or not RUN_NAME.match(name) or name == TEACHER_ROW:
            raise ValueError(
                f"run name {name!r} is not valid: use letters, digits, '.', '_' or '-' ({TEACHER_ROW!r} is "
                "the teacher's row)"
            )
        weights = {}
        for key in ("alpha_kd", "alpha_gate"):
            value = data.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"run {name!r}: {key}={value!r} must be a number >= 0")
            weights[key] = float(value)
        return cls(name, **weights)


def _default_runs() -> list[DistillRunSpec]:
    return [
        DistillRunSpec("student-alone"),
        DistillRunSpec("logit-kd", alpha_kd=1.0),
        DistillRunSpec("logit-gate-kd", alpha_kd=1.0, alpha_gate=1.0),
    ]


@dataclass
class DistillationConfig(RecipeConfigBase, SummaryKeys, TrainingKeys):
    """Configuration of a distillation comparison: every student gets the same data, seed and budget.

    Loss of a run: `task + alpha_kd * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + alpha_gate *
    MSE(student gates, teacher gates)`, the task loss and the KL on the summary tokens, the gate MSE on the
    non-padding tokens of the mapped layers (`hf_gate_attention.recipes.distillation.losses`).

    Run (besides `name`, `output_dir`, `overwrite`, `resume`, `backend` of `RecipeConfigBase`):
        runs (`list`): the students `{name, alpha_kd, alpha_gate}`; the one with both weights 0 (at most
            one) is the student trained alone, the reference of the ROUGE deltas.

    Teacher and student:
        teacher (`str`): folder of a gated causal LM fine-tuned by the summarization recipe
            (`<results>/<run>/model`, loaded with `hf_gate_attention.from_pretrained`); frozen.
        student (`str`, *optional*): a smaller causal LM (Hub id or folder) of the same vocabulary, used whole
            and patched with the teacher's `GateConfig` (or already gated with it). `None`: the pretrained
            model named `model` in the teacher's results config (`<results>/config.json`), keeping only the
            decoder layers `layer_map`.
        student_num_layers (`int`, *optional*): layers of the student built from the teacher's base
            (`None`: half the teacher's, rounded up); ignored when `layer_map` or `student` is set.
        layer_map (`list[int]`, *optional*): student layer `i` <- teacher layer `layer_map[i]` (the built
            student keeps those pretrained layers, in that order; the gate loss compares those layers).
            `None`: evenly spaced, first and last kept (`default_layer_map`).
        temperature (`float`): `T` of the logit distillation.
        attn_implementation (`str`, defaults to `"sdpa"`): attention kernel (`"eager"`, `"sdpa"`, ...).

    Data, training and evaluation: the keys of `SummaryKeys` and `TrainingKeys`, as in the summarization
    recipe; the preset uses the values the teacher was trained with. Every weight of the student is trained.
    """

    run_class: ClassVar[type] = DistillRunSpec

    # output_dir, overwrite, resume, backend: `RecipeConfigBase`
    name: str = "distill"
    runs: list[DistillRunSpec] = field(default_factory=_default_runs)
    # teacher and student
    teacher: str = DEFAULT_TEACHER
    student: str | None = None
    student_num_layers: int | None = None
    layer_map: list[int] | None = None
    temperature: float = 2.0
    attn_implementation: str = "sdpa"
    # data and evaluation: `SummaryKeys`; training: `TrainingKeys`

    def _validate(self) -> None:
        if sum(r.is_baseline for r in self.runs) > 1:
            names = [r.name for r in self.runs if r.is_baseline]
            raise ValueError(
                f"at most one run may train the student alone (alpha_kd: 0, alpha_gate: 0), got {names}"
            )
        check_shared_keys(self)
        check_summary_keys(self)
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} must be > 0")
        if self.layer_map is not None and not self.layer_map:
            raise ValueError(
                "layer_map=[] is not valid: give the teacher layer of each student layer, or null"
            )
        if self.student_num_layers is not None and self.student_num_layers < 1:
            raise ValueError(f"student_num_layers={self.student_num_layers} must be >= 1")
