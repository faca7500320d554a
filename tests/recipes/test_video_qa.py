"""Video QA recipe: end to end on a tiny random vision encoder (with resume after an interruption), the clip
generator and the folder / `datasets` readers, bad input refused before anything trains, and the metrics on
hand-built inputs whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import tiny_model, write_config
from PIL import Image
from test_recipe import StopAtStep

from hf_gate_attention.recipes.common.encoder_decoder import build_word_tokenizer
from hf_gate_attention.recipes.video_qa import (
    VideoQAConfig,
    answer_share,
    clip_object_keys,
    exact_match,
    fusion_ratio,
    generate_clips,
    load_video_qa,
    run_video_qa,
    verdict,
)
from hf_gate_attention.recipes.video_qa.cli import main
from hf_gate_attention.recipes.video_qa.compare import kind_difference
from hf_gate_attention.recipes.video_qa.model import clip_states

IMAGE_SIZE = 56  # 4 x 4 patches of 14 pixels


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("video_qa") / "encoder"
    tiny_model("dinov2", bare=True).save_pretrained(folder)
    transformers.ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(
        folder
    )
    return folder


def tiny_keys(encoder: Path, output_dir: Path, **overrides) -> dict:
    return {
        "name": "tiny",
        "output_dir": str(output_dir),
        "encoder": str(encoder),
        "image_size": IMAGE_SIZE,
        "max_train_examples": 16,
        "max_validation_examples": 2,
        "max_test_examples": 6,
        "decoder_layers": 2,
        "decoder_hidden_size": 16,
        "decoder_heads": 2,
        "max_steps": 4,
        "per_device_train_batch_size": 8,
        "logging_steps": 1,
        "save_steps": 2,
        "eval_steps": 2,
        "overlay_examples": 1,
        "n_bootstrap": 50,
        "speed_examples": 4,
        "speed_batch_size": 2,
        "speed_rounds": 2,
        **overrides,
    }


def _losses(run_dir: Path) -> list[int]:
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    return [entry["step"] for entry in history if "loss" in entry]


@pytest.mark.slow
def test_tiny_comparison_end_to_end_and_resume_after_an_interruption(encoder, tmp_path, capsys):
    keys = tiny_keys(encoder, tmp_path)
    config = VideoQAConfig.from_dict(keys)
    out = config.run_dir
    with pytest.raises(KeyboardInterrupt):
        run_video_qa(config, callbacks=[StopAtStep(out / "gated-cross", step=3)])
    baseline = (out / "baseline" / "train_summary.json").read_text()
    features = (out / "encoder_features.safetensors").stat().st_mtime_ns
    config_file = write_config(tmp_path / "c.yaml", keys)
    assert main(["--config", str(config_file)]) == 2  # the folder holds this run: --resume or --overwrite
    assert main(["--config", str(config_file), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "## Verdict" in printed and "Rule (stated before the run): reproduced if" in printed
    assert (out / "baseline" / "train_summary.json").read_text() == baseline  # kept, not retrained
    assert (out / "encoder_features.safetensors").stat().st_mtime_ns == features  # read, not recomputed
    gated = json.loads((out / "gated-cross" / "train_summary.json").read_text())
    assert gated["resumed_from"] == "checkpoint-2" and gated["global_step"] == 4
    assert _losses(out / "gated-cross") == [1, 2, 3, 4]
    for name in ("loss_curves.png", "accuracy.png", "gates_by_layer.png", "speed.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    for kind in ("frames", "text", "both"):
        assert (out / f"overlay_{kind}_0.png").is_file()
    comparison = json.loads((out / "comparison.json").read_text())
    rows = {row["run"]: row for row in comparison["runs"]}
    assert list(rows) == ["baseline", "gated-cross", "gated-cross-self"]
    assert comparison["data"]["test_questions_by_kind"] == {"frames": 6, "text": 6, "both": 6}
    assert rows["baseline"]["ratio"]["all"] is None and "verdict" not in rows["baseline"]
    assert (
        rows["gated-cross"]["ratio"]["all"] is None and "verdict" not in rows["gated-cross"]
    )  # no self gate
    both = rows["gated-cross-self"]
    assert both["verdict"]["verdict"] in ("reproduced", "not reproduced", "inconclusive")
    assert 0 < both["ratio"]["all"]["mean"] < 1 and len(both["layers"]["frames"]["ratio_layers"]) == 2
    diff = both["kind_differences"]["frames-text"]["ratio"]
    assert diff["paired"] and diff["n"] == 6
    assert diff["delta"] == pytest.approx(both["ratio"]["frames"]["mean"] - both["ratio"]["text"]["mean"])
    predictions = json.loads((out / "gated-cross-self" / "predictions.json").read_text())
    accuracy = np.mean(
        [
            exact_match(p, r)
            for p, r in zip(predictions["predictions"], predictions["references"], strict=True)
        ]
    )
    assert both["accuracy"]["all"]["mean"] == pytest.approx(accuracy)
    assert 0 < rows["baseline"]["chance"]["all"]["mean"] < 1
    saved = out / "gated-cross-self" / "model"
    assert json.loads((saved / "config.json").read_text())["gate_attention"]["attention"] == [
        "cross",
        "decoder",
    ]
    loaded = transformers.VisionEncoderDecoderModel.from_pretrained(out / "baseline" / "model")
    assert loaded.config.decoder.add_cross_attention


# ------------------------------------------------------------------------------------------- bad input


def _folder(root: Path, rows: list[dict], frames: int = 4) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for f in range(frames):
        Image.new("RGB", (28, 28), (200, 30, 30)).save(root / f"{f}.png")
    (root / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def _row(**changes) -> dict:
    row = {"frames": [f"{f}.png" for f in range(4)], "passage": "tom is red .", "question": "who ?"}
    return row | {"answer": "tom", "kind": "text"} | changes


def test_bad_input_is_refused_before_anything_trains(encoder, tmp_path, capsys):
    def refused(message: str, **overrides) -> None:
        keys = tiny_keys(encoder, tmp_path / "results", **overrides)
        assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert not (tmp_path / "results").exists()  # nothing written, nothing trained

    no_passage = _folder(tmp_path / "no-passage", [_row(passage="")])
    refused("a 'text' question needs a passage (`passage`), and it has none", dataset=str(no_passage))
    missing = _folder(tmp_path / "missing", [_row(frames=["0.png", "1.png", "2.png", "gone.png"])])
    refused("frames missing from", dataset=str(missing))
    empty = _folder(tmp_path / "empty", [_row(answer=" ")])
    refused("the answer (`answer`) is empty", dataset=str(empty))
    kind = _folder(tmp_path / "kind", [_row(kind="audio")])
    refused("kind 'audio' is not accepted; accepted: frames, text, both", dataset=str(kind))
    refused(
        "3 frame(s); clip_frames=4", dataset=str(_folder(tmp_path / "three", [_row(frames=["0.png"] * 3)]))
    )
    llama = tmp_path / "llama"
    tiny_model("llama").save_pretrained(llama)
    build_word_tokenizer(["a red square"]).save_pretrained(llama)
    refused("has no cross-attention: it cannot read the frames", decoder=str(llama))
    refused("unknown config key 'clip_lenght'", clip_lenght=4)
    refused("clip_frames=9 is not accepted: 4 to 8", clip_frames=9)
    refused(
        "outside the decoder; the encoder is frozen",
        runs=[{"name": "all", "gate": {"attention": ["encoder"]}}],
    )
    refused(
        "answer 'a b c d e' has 5 tokens; max_answer_tokens=4",
        dataset=str(_folder(tmp_path / "long", [_row(answer="a b c d e")] * 30)),
    )


@pytest.mark.slow  # `datasets` loading parquet: ~20 s
def test_folders_and_datasets_folders_are_read(tmp_path):
    rows = [_row(kind="frames", passage="", objects=[{"boxes": [[0, 0, 14, 14], None, None, None]}])] * 40
    data = load_video_qa(str(_folder(tmp_path / "folder", rows)))
    assert sum(len(c) for c in data.splits.values()) == 40 and all(data.splits.values())
    clip = data.splits["test"][0]
    assert clip["questions"][0]["objects"] == [0] and clip["masks"][0][0, :14, :14].all()
    assert not clip["masks"][0][1].any()
    # a folder `datasets.load_dataset` reads (what a Hub id gives), with the config's column names
    import datasets

    frames = [Image.new("RGB", (28, 28), (30, 30, 200)) for _ in range(4)]
    records = {"clip": [frames] * 3, "text": ["ana is blue ."] * 3, "q": ["who ?"] * 3, "a": ["ana"] * 3}
    records["type"] = ["both"] * 3
    features = datasets.Features(
        {
            "clip": datasets.Sequence(datasets.Image()),
            **{k: datasets.Value("string") for k in ("text", "q", "a", "type")},
        }
    )
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        datasets.Dataset.from_dict(records, features=features).to_parquet(str(hub / f"{split}.parquet"))
    columns = {"frames": "clip", "passage": "text", "question": "q", "answer": "a", "kind": "type"}
    data = load_video_qa(str(tmp_path / "hub"), columns)
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [3, 3, 3]
    clip = data.splits["train"][0]
    assert len(clip["frames"]) == 4 and clip["frames"][0].getpixel((0, 0)) == (30, 30, 200)
    assert clip["questions"][0] == {"question": "who ?", "answer": "ana", "kind": "both", "objects": []}
    with pytest.raises(ValueError, match=r"Hub is off|cannot be loaded"):
        load_video_qa("someone/clips")


# ------------------------------------------------------------------------------------------- generated clips


def test_clips_are_reproducible_and_their_answers_true():
    one = generate_clips({"train": 2, "validation": 1, "test": 30}, seed=3, frames=5, image_size=IMAGE_SIZE)
    again = generate_clips({"train": 4, "validation": 1, "test": 1}, seed=3, frames=5, image_size=IMAGE_SIZE)
    for a, b in zip(one.splits["train"], again.splits["train"], strict=False):
        assert a["passage"] == b["passage"] and a["frames"][2].tobytes() == b["frames"][2].tobytes()
    for clip in one.splits["test"]:
        assert len(clip["frames"]) == 5 and [q["kind"] for q in clip["questions"]] == [
            "frames",
            "text",
            "both",
        ]
        by_frames, by_text, _by_both = clip["questions"]
        passage = clip["passage"].split()
        assert by_text["answer"] in passage  # the passage answers the text question
        assert by_frames["answer"] not in passage or by_frames["question"].startswith("which shape")
        assert not any(colour in passage for colour in ("red", "green", "blue", "yellow", "purple", "orange"))
        obj = clip["masks"][by_frames["objects"][0]]
        if by_frames["question"] == "which shape appears ?":
            assert not obj[0].any() and obj[-1].any()
        if by_frames["question"] == "which shape moves ?":
            centres = [np.argwhere(m).mean(0) for m in obj]
            assert np.hypot(*(centres[-1] - centres[0])) >= IMAGE_SIZE / 4 - 2
        if "colour" in by_frames["question"]:  # the object is drawn in the answer's colour in the last frame
            from hf_gate_attention.recipes.common.shapes import COLOURS

            pixels = np.asarray(clip["frames"][-1])[obj[-1]].mean(0)
            assert np.abs(pixels - COLOURS[by_frames["answer"]]).max() < 20


# ------------------------------------------------------------------------------------------- metrics


def test_accuracy_and_fusion_ratio_on_known_values():
    assert exact_match("blue", "blue") == 100.0 and exact_match("blue circle", "blue") == 0.0
    per_layer, overall = fusion_ratio([0.6, 0.2], [0.2, 0.2])
    np.testing.assert_allclose(per_layer, [0.75, 0.5])
    assert overall == pytest.approx(0.8 / 1.2)
    assert np.isnan(fusion_ratio([0.0], [0.0])[0][0])
    with pytest.raises(ValueError, match="one value per layer"):
        fusion_ratio([0.5, 0.5], [0.5])


def test_attention_share_on_the_named_objects_across_frames():
    # 2 frames of 1 prefix token + 2 x 2 patches; the object is in patch 0 of frame 0, absent in frame 1
    mask = np.zeros((2, 28, 28), dtype=bool)
    mask[0, :14, :14] = True
    keys = clip_object_keys([mask], 28, 2, 1, 0.25)
    assert keys.tolist() == [False, True, False, False, False] + [False] * 5
    weights = torch.zeros(1, 2, 1, 10)  # (layers, heads, steps, keys)
    weights[0, 0, 0, 1], weights[0, 0, 0, 6] = 0.6, 0.4  # head 0: 0.6 on the object
    weights[0, 1, 0, 6] = 1.0  # head 1: all on frame 1
    assert answer_share(weights, keys, None) == pytest.approx(0.3)
    assert answer_share(weights, keys, torch.tensor([[[1.0, 0.0]]])) == pytest.approx(
        0.6
    )  # gates weight heads


def test_clip_states_keep_frames_apart():
    features = torch.ones(1, 3, 2, 8)  # the same features in every frame
    states = clip_states(features)
    assert states.shape == (1, 6, 8)
    assert not torch.equal(states[0, 0], states[0, 2]) and torch.equal(states[0, 0], states[0, 1])


def test_kind_difference_and_the_verdict():
    questions = [{"kind": k, "clip": c} for c in range(4) for k in ("frames", "text")]
    values = np.array([0.7, 0.4] * 4)
    diff = kind_difference(values, questions, "frames", "text", (100, 0.95, 0))
    assert diff["paired"] and diff["delta"] == pytest.approx(0.3) and diff["low"] == pytest.approx(0.3)
    unpaired = kind_difference(values[:-1], questions[:-1], "frames", "text", (100, 0.95, 0))
    assert not unpaired["paired"] and unpaired["delta"] == pytest.approx(0.3)
    up, flat = {"low": 0.1, "high": 0.3}, {"low": -0.2, "high": 0.0}
    assert verdict(up, {"low": -5.0, "high": 2.0})["verdict"] == "reproduced"
    assert verdict(up, {"low": -9.0, "high": -1.0})["verdict"] == "inconclusive"
    assert verdict(flat, {"low": 1.0, "high": 2.0})["verdict"] == "not reproduced"
    assert verdict({"low": -0.1, "high": 0.2}, {"low": 0.0, "high": 1.0})["verdict"] == "inconclusive"
    assert verdict(None, up)["verdict"] == "inconclusive"
