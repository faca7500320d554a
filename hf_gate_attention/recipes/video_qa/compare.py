"""One command for a video QA comparison: train the baseline and the gated decoders on the same cached frame
features, seed and budget; answer the test questions; measure the gates' fusion ratio and where the frames'
attention falls, per question kind; time the runs interleaved; write the results folder.

Layout of `<output_dir>/<name>/` (the recipes' shared layout, `common/run_dir.py`, plus):

    comparison.md / .csv / .json     the tables and the verdict with its rule
    loss_curves.png, accuracy.png, gates_by_layer.png, speed.png, overlay_<kind>_<n>.png
    encoder_features.safetensors     the frozen encoder's outputs of every frame (not in git)
    <run>/model/                     final weights with the tokenizer and image processor
    <run>/predictions.json           references and greedy answers of the test questions
    <run>/metrics.json               everything about the run
"""

from __future__ import annotations

import gc
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ...files import atomic_write_json, atomic_write_text, read_json
from ..common.attention_maps import GateRecorder
from ..common.config import split_limits
from ..common.distributed import distributed_state, leave_after_training
from ..common.encoder_decoder import (
    build_encoder_decoder,
    cached_features,
    check_encoder_decoder,
    load_image_processor,
    load_trained,
    model_paths,
    patch_grid,
    start_and_end,
)
from ..common.inference import interleaved_rounds
from ..common.plots import plot_loss_curves, plot_scores, plot_speed
from ..common.run_dir import check_run_dir, claim_on_main, data_fingerprint, finish_run_dir
from ..common.speed import speed_ratios
from ..common.statistics import mean_ci, paired_delta, unpaired_delta
from ..common.training import TRAIN_SUMMARY_FILE, is_trained, train_model
from .config import VideoQAConfig
from .data import KINDS, VideoQAData, load_video_qa
from .metrics import (
    SPEED_COLUMNS,
    VERDICT_RULE,
    answer_share,
    clip_object_keys,
    exact_match,
    fusion_ratio,
    verdict,
)
from .model import QACollator, check_answers, clip_states, encode, load_tokenizer, question_rows
from .plots import plot_gates, plot_overlays
from .report import csv_table, markdown_report

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "predictions.json"
FEATURES_FILE = "encoder_features.safetensors"


def load_data(config: VideoQAConfig) -> VideoQAData:
    columns = {k: getattr(config, f"{k}_column") for k in ("frames", "passage", "question", "answer", "kind")}
    return load_video_qa(
        config.dataset, columns, split_limits(config), config.seed, config.clip_frames, config.image_size
    )


def frame_features(config, encoder_path: str, processor, data: VideoQAData, fingerprint: dict) -> dict:
    """`{split: (clips, frames, tokens, hidden) float16}`: each frame encoded once, cached."""
    images = {split: [f for clip in clips for f in clip["frames"]] for split, clips in data.splits.items()}
    metadata = {split: fingerprint[split]["sha256"] for split in data.splits}
    metadata |= {"encoder": config.encoder, "image_size": str(config.image_size)}
    flat = cached_features(
        config.run_dir / FEATURES_FILE, encoder_path, processor, images, metadata, config.feature_batch_size
    )
    return {
        split: f.reshape(len(data.splits[split]), config.clip_frames, *f.shape[1:])
        for split, f in flat.items()
    }


def train_all(config, paths, tokenizer, processor, data: VideoQAData, features: dict, callbacks) -> None:
    """Train every run not yet trained with the current budget; its `model/` holds tokenizer and processor."""
    train = question_rows(tokenizer, config, data, "train")
    validation = question_rows(tokenizer, config, data, "validation")
    for run in config.runs:
        if config.resume and is_trained(config, run):
            logger.warning("Run %s: already trained, kept", run.name)
            continue
        (config.run_dir / run.name / PREDICTIONS_FILE).unlink(missing_ok=True)  # stale once retrained
        model = build_encoder_decoder(config, *paths, tokenizer, run)
        collator = QACollator(features, tokenizer.pad_token_id)
        train_model(
            config, run, model, collator, train, validation, callbacks, processors=(tokenizer, processor)
        )
        del model
        gc.collect()


def _batch(sequences: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask, `(batch, longest)`."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def answer_questions(model, tokenizer, config, prompts: list[list[int]], states: torch.Tensor) -> list[str]:
    """Greedy answers (at most `max_answer_tokens` tokens) of `prompts`, `states`: `(n, keys, hidden)`."""
    device = next(model.parameters()).device
    end, answers = start_and_end(tokenizer)[1], []
    for first in range(0, len(prompts), config.generation_batch_size):
        batch = [list(p) for p in prompts[first : first + config.generation_batch_size]]
        memory = states[first : first + len(batch)].to(device)
        new: list[list[int]] = [[] for _ in batch]
        done = [False] * len(batch)
        for _ in range(config.max_answer_tokens + 1):
            ids, mask = _batch(batch, tokenizer.pad_token_id, device)
            logits = model(
                encoder_outputs=(memory,), decoder_input_ids=ids, decoder_attention_mask=mask
            ).logits
            last = mask.sum(1) - 1
            picked = logits[torch.arange(len(batch)), last].argmax(-1).tolist()  # (batch,)
            for i, token in enumerate(picked):
                if not done[i]:
                    done[i] = token == end or len(new[i]) == config.max_answer_tokens
                    if not done[i]:
                        new[i].append(token)
                batch[i].append(token)
            if all(done):
                break
        answers += [" ".join(tokenizer.decode(a, skip_special_tokens=True).split()) for a in new]
    return answers


def test_inputs(tokenizer, config, data: VideoQAData, features: torch.Tensor):
    """`(questions, prompts, states)` of the test split: states `(questions, frames * tokens, hidden)`."""
    questions = data.questions("test")
    prompts = [
        encode(tokenizer, config, data.splits["test"][q["clip"]]["passage"], q["question"])[0]
        for q in questions
    ]
    states = clip_states(features[[q["clip"] for q in questions]])
    return questions, prompts, states


def predict_all(config, tokenizer, questions, prompts, states) -> dict[str, list[str]]:
    """Test answers of every run (kept from an earlier invocation when still valid)."""
    references = [q["answer"] for q in questions]
    predictions = {}
    for run in config.runs:
        path = config.run_dir / run.name / PREDICTIONS_FILE
        saved = read_json(path)
        if saved is None or saved["references"] != references:
            model = load_trained(config, run)
            saved = {
                "references": references,
                "predictions": answer_questions(model, tokenizer, config, prompts, states),
            }
            atomic_write_json(path, saved)
            del model
        predictions[run.name] = saved["predictions"]
    return predictions


@torch.inference_mode()
def measure_run(
    model, tokenizer, config, data, questions, prompts, states, grid: int, keep: set[int]
) -> list[dict]:
    """Per test question, with teacher forcing on its reference answer, on the queries that emit the answer
    tokens: `cross`/`self` (mean gate per layer, `None` ungated), `ratio_layers`/`ratio` (`fusion_ratio`,
    NaN unless both are gated), `share`/`chance` (`answer_share`; NaN without masks), and for the indices
    in `keep` the frames' attention `map` `(frames, grid * grid)` (gate-weighted heads, mean of layers and
    answer queries)."""
    device = next(model.parameters()).device
    frames = config.clip_frames
    tokens = states.shape[1] // frames
    prefix = tokens - grid * grid
    cross_rec, self_rec = GateRecorder(model, "cross"), GateRecorder(model, "decoder")
    records = []
    try:
        for first in range(0, len(questions), config.generation_batch_size):
            batch = questions[first : first + config.generation_batch_size]
            answers = [encode(tokenizer, config, "", "", q["answer"])[1][:-1] for q in batch]
            sequences = [prompts[first + i] + a for i, a in enumerate(answers)]
            ids, mask = _batch(sequences, tokenizer.pad_token_id, device)
            out = model(
                encoder_outputs=(states[first : first + len(batch)].to(device),),
                decoder_input_ids=ids,
                decoder_attention_mask=mask,
                output_attentions=True,
            )
            weights = (
                torch.stack(out.cross_attentions, 1).float().cpu()
            )  # (batch, layers, heads, steps, keys)
            cross, self_ = cross_rec.take(), self_rec.take()  # (batch, layers, steps, heads) or None
            for i, q in enumerate(batch):
                start = len(prompts[first + i]) - 1
                steps = slice(start, start + len(answers[i]))  # the queries that emit the answer tokens
                w = weights[i, :, :, steps]  # (layers, heads, answer tokens, keys)
                g_cross = (
                    None if cross is None else cross[i, :, steps].cpu()
                )  # (layers, answer tokens, heads)
                record = {"kind": q["kind"], "cross": None, "self": None}
                record["ratio_layers"], record["ratio"] = [float("nan")] * w.shape[0], float("nan")
                if g_cross is not None:
                    record["cross"] = g_cross.double().mean((1, 2)).tolist()
                if self_ is not None:
                    record["self"] = self_[i, :, steps].cpu().double().mean((1, 2)).tolist()
                if record["cross"] is not None and record["self"] is not None:
                    per_layer, overall = fusion_ratio(record["cross"], record["self"])
                    record["ratio_layers"], record["ratio"] = per_layer.tolist(), overall
                clip = data.splits["test"][q["clip"]]
                record["share"] = record["chance"] = float("nan")
                if clip["masks"] and q["objects"]:
                    named = [clip["masks"][o] for o in q["objects"]]
                    keys = clip_object_keys(named, config.image_size, grid, prefix, config.mask_threshold)
                    record["share"] = answer_share(w, keys, g_cross)
                    record["chance"] = keys.sum().item() / keys.numel()
                if first + i in keep:
                    heads = w.double().mean(1) if g_cross is None else _gate_weighted(w, g_cross)
                    heat = heads.mean((0, 1)).reshape(frames, tokens)[:, prefix:]  # (frames, grid * grid)
                    record["map"] = heat.tolist()
                records.append(record)
    finally:
        cross_rec.remove()
        self_rec.remove()
    return records


def _gate_weighted(weights: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """`(layers, heads, steps, keys)` weights -> `(layers, steps, keys)`, heads weighted by `gates`
    `(layers, steps, heads)`."""
    g = gates.double().permute(0, 2, 1)[..., None]  # (layers, heads, steps, 1)
    return (g * weights.double()).sum(1) / g.sum(1).clamp_min(1e-12)


def overlay_indices(questions: list[dict], per_kind: int) -> list[int]:
    """The first `per_kind` test questions of each kind whose clip has masks or not (in order)."""
    return [i for kind in KINDS for i in [j for j, q in enumerate(questions) if q["kind"] == kind][:per_kind]]


def measure_speed(config, tokenizer, prompts, states) -> dict[str, dict]:
    """Greedy answers per second of every run on the first `speed_examples` test questions, the runs
    alternating within each round."""
    models = {run.name: load_trained(config, run) for run in config.runs}
    subset, memory = prompts[: config.speed_examples], states[: config.speed_examples]
    timing = config.replace(generation_batch_size=config.speed_batch_size)
    for model in models.values():  # warm-up
        answer_questions(model, tokenizer, timing, subset[: config.speed_batch_size], memory)

    def time_round(name: str) -> dict:
        start = time.perf_counter()
        answer_questions(models[name], tokenizer, timing, subset, memory)
        return {"answers_per_s": len(subset) / (time.perf_counter() - start)}

    per_round = interleaved_rounds(list(models), config.speed_rounds, time_round)
    results = {}
    for name, rounds in per_round.items():
        model = models[name]
        weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        results[name] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]} | {
            "rounds": rounds,
            "peak_memory_mb": weights / 2**20,  # the weights; answering adds little at these sizes
            "batch_size": config.speed_batch_size,
            "examples": len(subset),
            "device": str(next(model.parameters()).device),
        }
    models.clear()
    gc.collect()
    return results


# ------------------------------------------------------------------------------------ statistics


def kind_difference(values: np.ndarray, questions: list[dict], a: str, b: str, stats) -> dict | None:
    """Mean of `values` on kind `a` minus kind `b`: paired by clip when every clip holds one question of
    each (the generated clips), else an unpaired bootstrap; `paired` says which."""
    by = {
        kind: {q["clip"]: v for q, v in zip(questions, values, strict=True) if q["kind"] == kind}
        for kind in (a, b)
    }
    if by[a] and set(by[a]) == set(by[b]) and sum(q["kind"] == a for q in questions) == len(by[a]):
        clips = sorted(by[a])
        found = paired_delta([by[a][c] for c in clips], [by[b][c] for c in clips], stats)
        return None if found is None else found | {"paired": True}
    found = unpaired_delta(list(by[a].values()), list(by[b].values()), stats)
    return None if found is None else found | {"paired": False}


def comparison_rows(config, questions, trainings, predictions, measured, speed) -> list[dict]:
    """One row per run: accuracy, fusion ratio (per layer and overall), cross/self gates per layer, attention
    share, per kind with CIs; kind differences; deltas vs the baseline; speed; the verdict."""
    stats = (config.n_bootstrap, config.confidence, config.seed)
    kinds = np.array([q["kind"] for q in questions])
    accuracy = {
        name: np.array([exact_match(p, q["answer"]) for p, q in zip(preds, questions, strict=True)])
        for name, preds in predictions.items()
    }
    baseline = config.baseline
    rows = []
    for run in config.runs:
        name, records = run.name, measured[run.name]
        ratio = np.array([r["ratio"] for r in records])
        share = np.array([r["share"] for r in records])
        row = {
            "run": name,
            "gate": None if run.gate is None else run.gate.to_dict(),
            "trainable_params": trainings[name]["parameters"]["trainable"],
            "global_step": trainings[name]["global_step"],
            "test_questions": len(questions),
            "accuracy": {"all": mean_ci(accuracy[name], stats)},
            "ratio": {"all": mean_ci(ratio, stats)},
            "share": {"all": mean_ci(share, stats)},
            "chance": {"all": mean_ci([r["chance"] for r in records], stats)},
            "layers": {},
            "speed": speed[name],
        }
        for kind in KINDS:
            on = kinds == kind
            row["accuracy"][kind] = mean_ci(accuracy[name][on], stats)
            row["ratio"][kind] = mean_ci(ratio[on], stats)
            row["share"][kind] = mean_ci(share[on], stats)
            row["chance"][kind] = mean_ci(np.array([r["chance"] for r in records])[on], stats)
            chosen = [r for r, k in zip(records, kinds, strict=True) if k == kind]
            row["layers"][kind] = {
                part: np.mean([r[part] for r in chosen], axis=0).tolist()
                if chosen and chosen[0][part]
                else None
                for part in ("cross", "self", "ratio_layers")
            }
        row["kind_differences"] = {
            f"{a}-{b}": {
                "ratio": kind_difference(ratio, questions, a, b, stats),
                "accuracy": kind_difference(accuracy[name], questions, a, b, stats),
                "share": kind_difference(share, questions, a, b, stats),
            }
            for a, b in (("frames", "text"), ("both", "text"), ("frames", "both"))
        }
        if baseline is not None and run is not baseline:
            base = accuracy[baseline.name]
            base_share = np.array([r["share"] for r in measured[baseline.name]])
            row["deltas"] = {"accuracy": {"all": paired_delta(accuracy[name], base, stats)}}
            row["deltas"]["share"] = {"all": paired_delta(share, base_share, stats)}
            for kind in KINDS:
                on = kinds == kind
                row["deltas"]["accuracy"][kind] = paired_delta(accuracy[name][on], base[on], stats)
                row["deltas"]["share"][kind] = paired_delta(share[on], base_share[on], stats)
            row["speed_ratios"] = speed_ratios(speed[name], speed[baseline.name], SPEED_COLUMNS)
            if np.isfinite(ratio).any():
                diff = row["kind_differences"]["frames-text"]["ratio"]
                row["verdict"] = verdict(diff, row["deltas"]["accuracy"]["all"])
        rows.append(row)
    return rows


def write_results(config, data, questions, rows, trainings, predictions, measured) -> None:
    out = config.run_dir
    for row in rows:
        extra = {"training": trainings[row["run"]], "predictions_file": f"{row['run']}/{PREDICTIONS_FILE}"}
        atomic_write_json(out / row["run"] / "metrics.json", row | extra)
    sizes = {split: len(clips) for split, clips in data.splits.items()}
    counts = {kind: sum(q["kind"] == kind for q in questions) for kind in KINDS}
    summary = {"split_sizes": sizes, "test_questions_by_kind": counts, "source": data.source}
    atomic_write_text(out / "comparison.md", markdown_report(config, rows, summary))
    atomic_write_text(
        out / "comparison.csv", csv_table(rows, config.baseline.name if config.baseline else None)
    )
    document = {"config": config.to_dict(), "data": summary, "verdict_rule": VERDICT_RULE, "runs": rows}
    atomic_write_json(out / "comparison.json", document)
    plot_loss_curves({name: t["log_history"] for name, t in trainings.items()}, out / "loss_curves.png")
    labels = {"all": "all", **{kind: f"{kind} only" if kind != "both" else "both" for kind in KINDS}}
    title = f"Exact-match accuracy by question kind ({100 * config.confidence:g} % bootstrap CI)"
    plot_scores({row["run"]: row["accuracy"] for row in rows}, labels, "%", title, out / "accuracy.png")
    plot_gates(rows, out / "gates_by_layer.png")
    title = "Greedy answering throughput (interleaved rounds; bars: median, whiskers: min-max)"
    plot_speed(
        {row["run"]: row["speed"] for row in rows},
        out / "speed.png",
        (("answers_per_s", "answers/s"),),
        title,
    )
    for old in out.glob("overlay_*.png"):
        old.unlink()
    plot_overlays(config, data, questions, measured, predictions, out)


def run_video_qa(config: VideoQAConfig, callbacks=None) -> Path | None:
    """Train, evaluate and compare every run of `config`; returns the results folder (`None` on the
    non-main processes of a distributed launch)."""
    check_run_dir(config)
    with distributed_state().main_process_first():
        paths = model_paths(config)
        data = load_data(config)
    texts = [clip["passage"] for clip in data.splits["train"]]
    texts += [q["question"] + " " + q["answer"] for clip in data.splits["train"] for q in clip["questions"]]
    tokenizer = load_tokenizer(paths[1], texts)
    check_encoder_decoder(config, *paths, tokenizer, "the frames")
    check_answers(tokenizer, config, data)
    fingerprint = data_fingerprint(data.fingerprint_rows())
    claim_on_main(config, fingerprint)  # after the input was read and checked: bad input leaves no folder
    processor = load_image_processor(paths[0], config.image_size)
    with distributed_state().main_process_first():
        features = frame_features(config, paths[0], processor, data, fingerprint)
    train_all(config, paths, tokenizer, processor, data, features, callbacks)
    if not leave_after_training():
        return None
    trainings = {run.name: read_json(config.run_dir / run.name / TRAIN_SUMMARY_FILE) for run in config.runs}
    questions, prompts, states = test_inputs(tokenizer, config, data, features["test"])
    predictions = predict_all(config, tokenizer, questions, prompts, states)
    grid = patch_grid(paths[0], config.image_size)
    keep = set(overlay_indices(questions, config.overlay_examples))
    measured = {}
    for run in config.runs:
        model = load_trained(config, run, attn_implementation="eager")
        measured[run.name] = measure_run(
            model, tokenizer, config, data, questions, prompts, states, grid, keep
        )
        del model
    speed = measure_speed(config, tokenizer, prompts, states)
    rows = comparison_rows(config, questions, trainings, predictions, measured, speed)
    write_results(config, data, questions, rows, trainings, predictions, measured)
    finish_run_dir(config)
    return config.run_dir
