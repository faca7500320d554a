"""The teacher (a gated summarization checkpoint, frozen) and the student (its pretrained base with fewer
decoder layers, or a smaller model), and the layer map between them.

Layer map: student layer `i` <- teacher layer `layer_map[i]`. A student built from the teacher's base keeps
exactly those pretrained decoder layers, in that order, and is patched with the teacher's `GateConfig`; the
gate loss compares student layer `i` with teacher layer `layer_map[i]`. The default (`default_layer_map`)
spreads the student's layers evenly over the teacher's, first and last kept. A mapped pair must have the same
number of gated heads and gate width: heads are compared one to one, never averaged.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from ...core.hooks import CONFIG_ATTRIBUTE
from ...core.patching import gate_config_of
from ...files import read_json
from ...offline import resolve_model
from ...sharing.loading import checkpoint_config
from ...sharing.loading import from_pretrained as load_gated
from ..common.distributed import patch_on_device
from ..common.run_dir import CONFIG_FILE
from .config import DistillationConfig
from .losses import gate_modules


def default_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """`student_layers` teacher layers evenly spaced, first and last kept: `round(i * (T - 1) / (S - 1))`
    (a single student layer maps to teacher layer 0). E.g. 30 -> 15: 0, 2, 4, ..., 27, 29."""
    if student_layers == 1:
        return [0]
    return [round(i * (teacher_layers - 1) / (student_layers - 1)) for i in range(student_layers)]


def teacher_base_model(teacher: str) -> str:
    """The pretrained model the teacher was fine-tuned from, as its config names it (Hub id, offline name or
    folder): `model` in `<results>/config.json` of the summarization results folder holding the teacher
    (`<results>/<run>/model`)."""
    config_file = Path(teacher).parent.parent / CONFIG_FILE
    saved = read_json(config_file)
    if saved is None or "model" not in saved:
        raise ValueError(
            f"teacher {teacher} is not inside a summarization results folder (<results>/<run>/model with "
            f"<results>/{CONFIG_FILE}; looked for {config_file}): set `student` to the smaller model to train"
        )
    return saved["model"]


def load_teacher(config: DistillationConfig) -> nn.Module:
    """The teacher in eval mode, every parameter frozen; `FileNotFoundError` for a missing folder,
    `ValueError` for a folder that is not a gated checkpoint."""
    folder = Path(config.teacher)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"teacher folder {str(folder)!r} does not exist or holds no config.json: train the teacher "
            "first with the summarization recipe (`make reproduce` writes results/reproduce/output-headwise/"
            "model)"
        )
    if getattr(checkpoint_config(folder), CONFIG_ATTRIBUTE, None) is None:
        raise ValueError(
            f"teacher folder {str(folder)!r} is not a gated checkpoint (its config.json has no "
            f"{CONFIG_ATTRIBUTE!r} entry): use a gated run of the summarization recipe, not its baseline"
        )
    teacher = load_gated(
        str(folder),
        AutoModelForCausalLM,
        backend=config.backend,
        dtype=torch.float32,
        attn_implementation=config.attn_implementation,
    )
    return teacher.requires_grad_(False).eval()


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder `layers` list: cannot keep a subset of them")
    return layers


def keep_layers(model: nn.Module, layer_map: list[int]) -> nn.Module:
    """`model` with only the decoder layers `layer_map` (in that order), renumbered `0..len - 1` (the KV
    cache's `layer_idx`, `config.num_hidden_layers`, `config.layer_types`)."""
    layers = _decoder_layers(model)
    kept = nn.ModuleList(layers[i] for i in layer_map)
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    model.get_decoder().layers = kept
    model.config.num_hidden_layers = len(layer_map)
    if getattr(model.config, "layer_types", None) is not None:
        model.config.layer_types = [model.config.layer_types[i] for i in layer_map]
    return model


def check_teacher_layers(layer_map: list[int], teacher_layers: int) -> None:
    """Raise `ValueError` naming the indices of `layer_map` that are not layers of the teacher."""
    out_of_range = [i for i in layer_map if not 0 <= i < teacher_layers]
    if out_of_range:
        raise ValueError(
            f"layer_map {layer_map} names teacher layer(s) {out_of_range}; the teacher has layers "
            f"0..{teacher_layers - 1}"
        )


def check_layer_map(layer_map: list[int], teacher: nn.Module, student: nn.Module) -> None:
    """Raise `ValueError` naming the pair when a student layer cannot be compared with its teacher layer:
    a teacher index out of range, a length that is not the student's depth, or other gated heads / width."""
    check_teacher_layers(layer_map, teacher.config.num_hidden_layers)
    student_layers = student.config.num_hidden_layers
    if len(layer_map) != student_layers:
        raise ValueError(
            f"layer_map has {len(layer_map)} entries but the student has {student_layers} layers: give the "
            "teacher layer of each student layer"
        )
    teacher_gates, student_gates = gate_modules(teacher), gate_modules(student)
    for student_layer, teacher_layer in enumerate(layer_map):
        if student_layer not in student_gates or teacher_layer not in teacher_gates:
            continue
        s, t = student_gates[student_layer], teacher_gates[teacher_layer]
        if (s.num_gated_heads, s.width) != (t.num_gated_heads, t.width):
            raise ValueError(
                f"student layer {student_layer} has {s.num_gated_heads} gated heads of width {s.width}, its "
                f"teacher layer {teacher_layer} has {t.num_gated_heads} of width {t.width}: the gate loss "
                "compares heads one to one; pick a student with the teacher's heads"
            )


def gated_pairs(layer_map: list[int], teacher: nn.Module, student: nn.Module) -> list[tuple[int, int]]:
    """`(student layer, teacher layer)` of the mapped layers gated in both models."""
    teacher_gates, student_gates = gate_modules(teacher), gate_modules(student)
    return [(s, t) for s, t in enumerate(layer_map) if s in student_gates and t in teacher_gates]


def student_name(config: DistillationConfig) -> str:
    """The student's model as named in the configs (what the results record): `student`, or the teacher's
    pretrained base."""
    return teacher_base_model(config.teacher) if config.student is None else config.student


def student_source(config: DistillationConfig) -> str:
    """The local folder of the student's weights and tokenizer (`student_name`, resolved)."""
    return resolve_model(student_name(config))


def student_layer_map(config: DistillationConfig, teacher: nn.Module) -> list[int]:
    """`layer_map`, or the default one: for a student built from the teacher's base, `student_num_layers`
    (half the teacher's, rounded up, when `None`); for a given student, its own depth."""
    teacher_layers = teacher.config.num_hidden_layers
    if config.layer_map is not None:
        layer_map = list(config.layer_map)
    elif config.student is None:
        layer_map = default_layer_map(teacher_layers, config.student_num_layers or -(-teacher_layers // 2))
    else:
        student_layers = checkpoint_config(resolve_model(config.student)).num_hidden_layers
        layer_map = default_layer_map(teacher_layers, student_layers)
    check_teacher_layers(layer_map, teacher_layers)
    if config.student is None and len(set(layer_map)) != len(layer_map):
        raise ValueError(
            f"layer_map {layer_map} repeats a teacher layer: a student built from the teacher's base keeps "
            f"each pretrained layer once (student_num_layers <= {teacher_layers}, or distinct entries)"
        )
    return layer_map


def build_student(config: DistillationConfig, teacher: nn.Module) -> tuple[nn.Module, list[int]]:
    """The untrained student, patched with the teacher's `GateConfig`, and its layer map (checked)."""
    gate = gate_config_of(teacher)
    layer_map = student_layer_map(config, teacher)
    path = student_source(config)
    kwargs = {"dtype": torch.float32, "attn_implementation": config.attn_implementation}
    if config.student is None:
        student = keep_layers(AutoModelForCausalLM.from_pretrained(path, **kwargs), layer_map)
    else:
        if getattr(checkpoint_config(path), CONFIG_ATTRIBUTE, None) is None:
            student = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        else:
            student = load_gated(path, AutoModelForCausalLM, backend=config.backend, **kwargs)
            if gate_config_of(student).replace(layers=None) != gate.replace(layers=None):
                raise ValueError(
                    f"student {config.student} is gated with {gate_config_of(student).to_dict()}, the "
                    f"teacher with {gate.to_dict()}: use an ungated student (patched with the teacher's "
                    "gate) or one gated like the teacher"
                )
    if teacher.config.vocab_size != student.config.vocab_size:
        raise ValueError(
            f"the student's vocabulary ({student.config.vocab_size} tokens) is not the teacher's "
            f"({teacher.config.vocab_size}): logit distillation needs the same tokenizer"
        )
    if getattr(student.config, CONFIG_ATTRIBUTE, None) is None:
        # a teacher gating some layers only: the student gates the layers mapped to them
        layers = None if gate.layers is None else [i for i, t in enumerate(layer_map) if t in gate.layers]
        if layers == []:
            raise ValueError(
                f"no student layer maps to a gated teacher layer {list(gate.layers)}: {layer_map}"
            )
        student = patch_on_device(student, gate.replace(layers=layers), config.backend)
    check_layer_map(layer_map, teacher, student)
    return student, layer_map
