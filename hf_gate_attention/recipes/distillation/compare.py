"""One command for a distillation comparison: train every student on the same data, seed and budget with its
distillation weights, evaluate them and the teacher with the summaries' ROUGE (`common.summaries`), time them
interleaved (the teacher as a reference row), and write the results folder.

Layout of `<output_dir>/<name>/` (the summarization recipe's, plus the teacher's row):

    config.json                      the DistillationConfig (identity of the folder)
    comparison.md / .csv / .json     the comparison table (comparison.json: also the layer map)
    loss_curves.png, rouge.png, speed.png
    <run>/checkpoints/checkpoint-N/  Trainer checkpoints (resume)
    <run>/model/                     the trained student (a gated checkpoint)
    <run>/train_summary.json         written when training finished
    <run>/quality.json, predictions.jsonl, metrics.json
    teacher/quality.json, predictions.jsonl, metrics.json   the teacher's ROUGE and speed (not trained here)

Distributed launches (`torchrun`, `accelerate launch`) train every student with DDP (each process holds the
teacher); the main process then evaluates and times alone, as in the summarization recipe.
"""

from __future__ import annotations

import gc
from functools import partial
from pathlib import Path

from transformers import AutoModelForCausalLM, TrainerCallback

from ...core.patching import gate_config_of
from ...files import atomic_write_json, atomic_write_text, read_json
from ...sharing.loading import from_pretrained as load_gated
from ..common.distributed import leave_after_training
from ..common.inference import inference_device, inference_dtype
from ..common.plots import plot_loss_curves, plot_speed
from ..common.run_dir import check_run_dir, claim_on_main, data_fingerprint, finish_run_dir
from ..common.summaries.pipeline import evaluate_all, load_data, measure_speed, train_all
from ..common.summaries.report import csv_table, markdown_table, plot_rouge, rouge_deltas, speed_ratios
from ..common.training import TRAIN_SUMMARY_FILE, count_parameters, load_tokenizer
from .config import TEACHER_ROW, DistillationConfig
from .models import build_student, gated_pairs, load_teacher, student_name, student_source
from .train import train_student

EXTRA_COLUMNS = ("alpha_kd", "alpha_gate", "layers")


def load_for_evaluation(config: DistillationConfig, name: str):
    """The teacher (`name == "teacher"`) or a trained student, in the evaluation dtype, in eval mode."""
    folder = config.teacher if name == TEACHER_ROW else config.run_dir / name / "model"
    model = load_gated(
        str(folder),
        AutoModelForCausalLM,
        backend=config.backend,
        dtype=inference_dtype(config),
        attn_implementation=config.attn_implementation,
    )
    return model.to(inference_device()).eval()


def comparison_rows(
    config: DistillationConfig, setup: dict, trainings: dict, quality: dict, speed: dict
) -> list:
    """One row per student, then the teacher's: weights, depth, trained parameters and steps, ROUGE, speed;
    ROUGE deltas vs the student trained alone, speed ratios vs the teacher."""
    baseline = config.baseline
    rows = []
    for run in config.runs:
        training = trainings[run.name]
        rows.append(
            run.to_dict()
            | {
                "run": run.name,
                "layers": read_json(config.run_dir / run.name / "model" / "config.json")["num_hidden_layers"],
                "trainable_params": training["parameters"]["trainable"],
                "global_step": training["global_step"],
                "speed_ratios": speed_ratios(speed[run.name], speed[TEACHER_ROW]),
            }
        )
    rows.append(
        {
            "run": TEACHER_ROW,
            "layers": setup["teacher"]["layers"],
            "trainable_params": 0,  # frozen here
            "global_step": 0,
        }
    )
    stats = (config.n_bootstrap, config.confidence, config.seed)
    gate = setup["teacher"]["gate"]
    for row in rows:
        row |= {"gate": gate, "rouge": quality[row["run"]]["rouge"], "speed": speed[row["run"]]}
        if baseline is not None and row["run"] != baseline.name:
            row["deltas"] = rouge_deltas(quality[row["run"]], quality[baseline.name], *stats)
    return rows


def comparison_tables(rows: list[dict], confidence: float, reference: str) -> str:
    """The summaries' Markdown tables (`common.summaries.report`) with the distillation weights and depth
    of each row, ROUGE deltas vs `reference` (the student trained alone) and speed ratios vs the teacher."""
    return markdown_table(
        rows, confidence, reference=reference, speed_reference=TEACHER_ROW, extra_columns=EXTRA_COLUMNS
    )


def deltas_reference(config: DistillationConfig) -> str:
    """The row the ROUGE deltas are taken against: the student trained alone (`"-"`: none)."""
    return config.baseline.name if config.baseline else "-"


def write_tables(folder: Path, config: DistillationConfig, rows: list[dict]) -> None:
    """`comparison.md` (`comparison_tables`) and `comparison.csv` of `rows` in `folder`. Written by
    `write_results`, and from a saved comparison.json by the recipe's `tables` action."""
    markdown = comparison_tables(rows, config.confidence, deltas_reference(config))
    csv = csv_table(rows, EXTRA_COLUMNS, speed_reference=TEACHER_ROW)
    atomic_write_text(folder / "comparison.md", markdown)
    atomic_write_text(folder / "comparison.csv", csv)


def write_results(config: DistillationConfig, rows: list[dict], trainings: dict, quality: dict, setup: dict):
    """Per-run metrics.json, comparison.md/.csv/.json and the plots (loss curves: the task loss)."""
    out = config.run_dir
    for row in rows:
        metrics = row | {
            "training": trainings.get(row["run"]),
            "quality": {k: v for k, v in quality[row["run"]].items() if k != "predictions"},
        }
        atomic_write_json(out / row["run"] / "metrics.json", metrics)
    write_tables(out, config, rows)
    comparison = {"config": config.to_dict(), **setup, "reference": deltas_reference(config), "runs": rows}
    atomic_write_json(out / "comparison.json", comparison)
    task_losses = {
        name: [{**h, "loss": h["task_loss"]} if "task_loss" in h else h for h in t["log_history"]]
        for name, t in trainings.items()
    }
    plot_loss_curves(task_losses, out / "loss_curves.png")
    plot_rouge({row["run"]: row["rouge"] for row in rows}, config.confidence, out / "rouge.png")
    plot_speed({row["run"]: row["speed"] for row in rows}, out / "speed.png")


def run_distillation(
    config: DistillationConfig, callbacks: list[TrainerCallback] | None = None
) -> Path | None:
    """Train, evaluate and compare every student of `config` and the teacher; returns the results folder
    (`None` on the non-main processes of a distributed launch, which stop after training).

    The teacher, the student and their layer map are checked before anything is written: a missing or
    ungated teacher folder, a layer the teacher lacks or a head count that differs is a `ValueError` /
    `FileNotFoundError` naming it.

    Args:
        config: the comparison (see [`DistillationConfig`]).
        callbacks: extra `TrainerCallback`s for every training (e.g. to stop early).
    """
    check_run_dir(config)
    teacher = load_teacher(config)
    student, layer_map = build_student(config, teacher)  # checks the pair
    setup = {
        "teacher": {
            "folder": config.teacher,
            "layers": teacher.config.num_hidden_layers,
            "gate": gate_config_of(teacher).to_dict(),
        },
        "student": {
            "source": student_name(config),
            "layers": student.config.num_hidden_layers,
            "parameters": count_parameters(student)["total"],
        },
        "layer_map": layer_map,
        "gate_pairs": gated_pairs(layer_map, teacher, student),
    }
    del student
    tokenizer = load_tokenizer(student_source(config))
    data = load_data(config)
    claim_on_main(config, data_fingerprint(data))  # after the input was read: bad input leaves no folder
    train_all(
        config,
        tokenizer,
        data,
        partial(train_student, config, teacher=teacher, tokenizer=tokenizer, callbacks=callbacks),
    )
    del teacher
    gc.collect()
    if not leave_after_training():
        return None

    names = [run.name for run in config.runs] + [TEACHER_ROW]
    trainings = {run.name: read_json(config.run_dir / run.name / TRAIN_SUMMARY_FILE) for run in config.runs}

    def load(name: str):
        return load_for_evaluation(config, name)

    quality = evaluate_all(config, names, load, tokenizer, data["test"])
    speed = measure_speed(config, names, load, tokenizer, data["test"])
    rows = comparison_rows(config, setup, trainings, quality, speed)
    write_results(config, rows, trainings, quality, setup)
    finish_run_dir(config)
    return config.run_dir
