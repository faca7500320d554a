"""One command for a captioning comparison: train the baseline and the gated decoders on the same cached
encoder features, seed and budget; caption the test images; measure where their cross-attention falls and
what their gates do; time them interleaved; write the results folder.

Layout of `<output_dir>/<name>/` (the recipes' shared layout, `common/run_dir.py`, plus):

    comparison.md / .csv / .json     the comparison tables and the verdict on the article's claim
    loss_curves.png, quality.png, attention.png, speed.png, overlay_<n>.png
    diagnostics.md                   `diagnose` of every run (decoder self-attention sink, cross gates)
    encoder_features.safetensors     the frozen encoder's outputs of every split (not in git)
    <run>/model/                     final weights with the tokenizer and image processor (a captioner)
    <run>/predictions.json           references and greedy captions of the test split
    <run>/metrics.json               everything about the run
"""

from __future__ import annotations

import gc
import logging
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback

from ...files import atomic_write_json, atomic_write_text, read_json
from ...memory import peak_growth_mib
from ..common.config import split_limits
from ..common.distributed import distributed_state, leave_after_training
from ..common.encoder_decoder import (
    build_encoder_decoder,
    check_encoder_decoder,
    encoder_outputs,
    load_image_processor,
    load_trained,
    model_paths,
    patch_grid,
)
from ..common.inference import interleaved_rounds
from ..common.plots import plot_loss_curves, plot_scores, plot_speed
from ..common.run_dir import check_run_dir, claim_on_main, data_fingerprint, finish_run_dir
from ..common.speed import speed_ratios as median_ratios
from ..common.statistics import mean_ci, paired_delta
from ..common.training import TRAIN_SUMMARY_FILE, is_trained, train_model
from .attention import measure_attention, object_key_sets
from .config import CaptioningConfig
from .data import CaptionData, load_caption_dataset, normalise_caption
from .diagnosis import diagnose_runs
from .metrics import (
    ATTENTION_METRICS,
    QUALITY_LABELS,
    SPEED_COLUMNS,
    VERDICT_RULE,
    WORD_CLASSES,
    caption_scores,
    verdict,
)
from .model import CaptionCollator, cached_features, caption_rows, load_tokenizer
from .plots import plot_attention, plot_overlays
from .report import csv_table, markdown_report

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "predictions.json"


def load_data(config: CaptioningConfig) -> CaptionData:
    return load_caption_dataset(
        config.dataset,
        config.image_column,
        config.caption_column,
        split_limits(config),
        config.seed,
        config.image_size,
        config.shapes_distractors,
    )


def train_all(config, paths, tokenizer, processor, data: CaptionData, features: dict, callbacks) -> None:
    """Train every run not yet trained with the current budget; its folder `model/` is a whole captioner
    (weights, tokenizer, image processor)."""
    captions = {split: [row["caption"] for row in rows] for split, rows in data.splits.items()}
    train = caption_rows(tokenizer, captions["train"], config.max_caption_tokens)
    validation = caption_rows(tokenizer, captions["validation"], config.max_caption_tokens)
    for run in config.runs:
        if config.resume and is_trained(config, run):
            logger.warning("Run %s: already trained, kept", run.name)
            continue
        (config.run_dir / run.name / PREDICTIONS_FILE).unlink(missing_ok=True)  # stale once retrained
        model = build_encoder_decoder(config, *paths, tokenizer, run)
        collator = _SplitCollator(features)
        train_model(
            config,
            run,
            model,
            collator,
            _tagged(train, "train"),
            _tagged(validation, "validation"),
            callbacks,
            processors=(tokenizer, processor),
        )
        del model
        gc.collect()


def _tagged(rows: list[dict], split: str) -> list[dict]:
    return [{**row, "split": split} for row in rows]


class _SplitCollator:
    """`CaptionCollator` over the features of the split each row names (training and validation rows)."""

    def __init__(self, features: dict):
        self.collators = {split: CaptionCollator(f) for split, f in features.items()}

    def __call__(self, rows: list[dict]) -> dict:
        return self.collators[rows[0]["split"]](rows)


@torch.inference_mode()
def generate_captions(model, tokenizer, features: torch.Tensor, batch_size: int, max_new_tokens: int) -> list:
    """Greedy captions of the images whose encoder outputs are `features` `(n, keys, hidden)`."""
    device = next(model.parameters()).device
    captions = []
    for start in range(0, len(features), batch_size):
        out = model.generate(
            encoder_outputs=encoder_outputs(features[start : start + batch_size], device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
        )
        captions += [
            normalise_caption(text) for text in tokenizer.batch_decode(out, skip_special_tokens=True)
        ]
    return captions


def predict_all(config, tokenizer, data: CaptionData, features: torch.Tensor) -> dict[str, list[str]]:
    """Test captions of every run (kept from an earlier invocation when still valid)."""
    references = [row["caption"] for row in data.splits["test"]]
    predictions = {}
    for run in config.runs:
        path = config.run_dir / run.name / PREDICTIONS_FILE
        saved = read_json(path)
        if saved is None or saved["references"] != references:
            model = load_trained(config, run)
            captions = generate_captions(
                model, tokenizer, features, config.generation_batch_size, config.max_new_tokens
            )
            saved = {"references": references, "predictions": captions}
            atomic_write_json(path, saved)
            del model
        predictions[run.name] = saved["predictions"]
    return predictions


def measure_all(config, tokenizer, data: CaptionData, features: torch.Tensor, paths) -> dict[str, dict]:
    """`measure_attention` of every run on the test split (eager attention, reference captions)."""
    grid = patch_grid(paths[0], config.image_size)
    prefix = features.shape[1] - grid * grid
    keys = object_key_sets(data.splits["test"], config.image_size, grid, prefix, config.mask_threshold)
    measured = {}
    for run in config.runs:
        model = load_trained(config, run, attn_implementation="eager")
        measured[run.name] = measure_attention(
            model,
            tokenizer,
            features,
            data.splits["test"],
            keys,
            config.generation_batch_size,
            config.max_caption_tokens,
            keep_maps=config.overlay_examples,
        )
        measured[run.name]["grid"], measured[run.name]["prefix"] = grid, prefix
        del model
    return measured


def measure_speed(config, tokenizer, features: torch.Tensor) -> dict[str, dict]:
    """Greedy captions per second of every run on the first `speed_examples` test images (from their cached
    encoder outputs: the frozen encoder is the same in every run), the runs alternating within each round."""
    models = {run.name: load_trained(config, run) for run in config.runs}
    subset = features[: config.speed_examples]
    size, new = config.speed_batch_size, config.max_new_tokens

    def generate(name: str) -> None:
        generate_captions(models[name], tokenizer, subset, size, new)

    for name in models:  # warm-up
        generate_captions(models[name], tokenizer, subset[:size], size, new)

    def time_round(name: str) -> dict:
        start = time.perf_counter()
        generate(name)
        seconds = time.perf_counter() - start
        return {
            "captions_per_s": len(subset) / seconds,
            "seconds_per_batch": seconds / math.ceil(len(subset) / size),
        }

    per_round = interleaved_rounds(list(models), config.speed_rounds, time_round)
    results = {}
    for name, rounds in per_round.items():
        model = models[name]
        weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        try:
            device = next(model.parameters()).device
            growth = peak_growth_mib(
                lambda m=model: generate_captions(m, tokenizer, subset[:size], size, new), device
            )
            peak = weights / 2**20 + growth
        except RuntimeError as error:
            logger.warning("peak memory not measured: %s", error)
            peak = float("nan")
        results[name] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        results[name] |= {
            "rounds": rounds,
            "peak_memory_mb": peak,
            "batch_size": size,
            "examples": len(subset),
            "max_new_tokens": new,
            "device": str(next(model.parameters()).device),
        }
    models.clear()
    gc.collect()
    return results


# ------------------------------------------------------------------------------------ statistics


def attention_arrays(measured: dict) -> dict[str, np.ndarray]:
    """Per-caption arrays of a run's measurement: the `ATTENTION_METRICS`, `share_chance`, and
    `gate_<class>` for gated runs."""
    captions = measured["captions"]
    arrays = {
        name: np.array([c[name] for c in captions], dtype=float)
        for name in (*ATTENTION_METRICS, "share_chance")
    }
    if captions and captions[0]["gate"] is not None:
        arrays |= {
            f"gate_{cls}": np.array([c["gate"][cls] for c in captions], dtype=float) for cls in WORD_CLASSES
        }
    return arrays


def comparison_rows(config, data, trainings, predictions, measured, speed) -> list[dict]:
    """One row per run: training, caption quality and attention measures with CIs, gates by word class, the
    gate contrast, speed; deltas, speed ratios and the verdict vs the baseline."""
    stats = (config.n_bootstrap, config.confidence, config.seed)
    references = [row["caption"] for row in data.splits["test"]]
    scores = {name: caption_scores(p, references) for name, p in predictions.items()}
    arrays = {name: attention_arrays(m) for name, m in measured.items()}
    baseline = config.baseline
    rows = []
    for run in config.runs:
        name, own = run.name, arrays[run.name]
        row = {
            "run": name,
            "gate": None if run.gate is None else run.gate.to_dict(),
            "trainable_params": trainings[name]["parameters"]["trainable"],
            "global_step": trainings[name]["global_step"],
            "test_examples": len(references),
            "quality": {m: mean_ci(v, stats) for m, v in scores[name].items()},
            "attention": {m: mean_ci(own[m], stats) for m in ATTENTION_METRICS},
            "share_chance": mean_ci(own["share_chance"], stats),
            "share_layers": np.nanmean(
                np.array([c["share_layers"] for c in measured[name]["captions"]], dtype=float), axis=0
            ).tolist()
            if np.isfinite(own["share_weighted"]).any()
            else None,
            "gates": None,
            "gate_contrast": None,
            "speed": speed[name],
        }
        if run.gate is not None:
            row["gates"] = {cls: mean_ci(own[f"gate_{cls}"], stats) for cls in WORD_CLASSES}
            row["gate_contrast"] = paired_delta(own["gate_visual"], own["gate_function"], stats)
        if baseline is not None and run is not baseline:
            base = arrays[baseline.name]
            row["deltas"] = {
                m: paired_delta(v, scores[baseline.name][m], stats) for m, v in scores[name].items()
            }
            row["deltas"] |= {m: paired_delta(own[m], base[m], stats) for m in ATTENTION_METRICS}
            row["speed_ratios"] = median_ratios(speed[name], speed[baseline.name], SPEED_COLUMNS)
            if run.gate is not None:
                row["verdict"] = verdict(row["deltas"]["share_weighted"], row["gate_contrast"])
        rows.append(row)
    return rows


def write_results(config, data: CaptionData, rows, trainings, predictions, measured, diagnostics) -> None:
    out = config.run_dir
    for row in rows:
        metrics = row | {
            "training": trainings[row["run"]],
            "predictions_file": f"{row['run']}/{PREDICTIONS_FILE}",
        }
        atomic_write_json(out / row["run"] / "metrics.json", metrics)
    sizes = {split: len(split_rows) for split, split_rows in data.splits.items()}
    summary = {"split_sizes": sizes, "source": data.source, "has_objects": data.has_objects}
    atomic_write_text(out / "comparison.md", markdown_report(config, rows, summary, diagnostics))
    atomic_write_text(
        out / "comparison.csv", csv_table(rows, config.baseline.name if config.baseline else None)
    )
    atomic_write_json(
        out / "comparison.json",
        {
            "config": config.to_dict(),
            "data": summary,
            "verdict_rule": VERDICT_RULE,
            "runs": rows,
            "diagnostics": diagnostics,
        },
    )
    plot_loss_curves({name: t["log_history"] for name, t in trainings.items()}, out / "loss_curves.png")
    labels = {m: QUALITY_LABELS[m] for m in rows[0]["quality"]}
    title = f"Test captions ({100 * config.confidence:g} % bootstrap CI)"
    plot_scores({row["run"]: row["quality"] for row in rows}, labels, "%", title, out / "quality.png")
    plot_attention(rows, out / "attention.png", config.confidence)
    title = "Greedy captioning throughput (interleaved rounds; bars: median, whiskers: min-max)"
    plot_speed(
        {row["run"]: row["speed"] for row in rows},
        out / "speed.png",
        (("captions_per_s", "captions/s"),),
        title,
    )
    for old in out.glob("overlay_*.png"):
        old.unlink()
    if data.has_objects:
        plot_overlays(config, data, measured, predictions, out)


def run_captioning(config: CaptioningConfig, callbacks: list[TrainerCallback] | None = None) -> Path | None:
    """Train, evaluate and compare every run of `config`; returns the results folder (`None` on the non-main
    processes of a distributed launch: every process trains with DDP, the main one alone evaluates).

    Args:
        config: the comparison (see [`CaptioningConfig`]).
        callbacks: extra `TrainerCallback`s for every training (e.g. to stop early).
    """
    check_run_dir(config)
    with distributed_state().main_process_first():  # what is fetched or converted, once
        paths = model_paths(config)
        data = load_data(config)
    tokenizer = load_tokenizer(config, paths[1], [row["caption"] for row in data.splits["train"]])
    check_encoder_decoder(config, *paths, tokenizer, "the image")
    fingerprint = data_fingerprint(data.fingerprint_rows())
    claim_on_main(config, fingerprint)  # after the input was read and checked: bad input leaves no folder
    processor = load_image_processor(paths[0], config.image_size)
    with distributed_state().main_process_first():
        features = cached_features(config, paths[0], processor, data, fingerprint)
    train_all(config, paths, tokenizer, processor, data, features, callbacks)
    if not leave_after_training():
        return None
    trainings = {run.name: read_json(config.run_dir / run.name / TRAIN_SUMMARY_FILE) for run in config.runs}
    predictions = predict_all(config, tokenizer, data, features["test"])
    measured = measure_all(config, tokenizer, data, features["test"], paths)
    speed = measure_speed(config, tokenizer, features["test"])
    diagnostics = diagnose_runs(config, tokenizer, data, features["test"])
    rows = comparison_rows(config, data, trainings, predictions, measured, speed)
    write_results(config, data, rows, trainings, predictions, measured, diagnostics)
    finish_run_dir(config)
    return config.run_dir
