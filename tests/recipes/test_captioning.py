"""Captioning recipe: end to end on a tiny random vision encoder (with resume after an interruption), the
shapes generator and the image-folder reader, bad input refused before anything trains, and the metrics on
hand-built attention maps whose answers are known."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import tiny_model, write_config
from PIL import Image
from test_recipe import StopAtStep

from hf_gate_attention.recipes.captioning import (
    CaptioningConfig,
    caption_scores,
    generate_shapes,
    load_caption_dataset,
    object_keys,
    object_share,
    parse_shapes_caption,
    patch_coverage,
    run_captioning,
    sink_share,
    word_class,
)
from hf_gate_attention.recipes.captioning.attention import END, _caption_record, _steps
from hf_gate_attention.recipes.captioning.cli import main
from hf_gate_attention.recipes.captioning.data import COLOURS, shapes_example
from hf_gate_attention.recipes.captioning.metrics import verdict
from hf_gate_attention.recipes.common.encoder_decoder import build_word_tokenizer

IMAGE_SIZE = 56  # 4 x 4 patches of 14 pixels


# ------------------------------------------------------------------------------------------- tiny assets


def make_encoder(folder: Path) -> Path:
    """A random 2-layer Dinov2Model (hidden 32, patches of 14 pixels) and its image processor."""
    tiny_model("dinov2", bare=True).save_pretrained(folder)
    transformers.ViTImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    return make_encoder(tmp_path_factory.mktemp("captioning") / "encoder")


def tiny_keys(encoder: Path, output_dir: Path, **overrides) -> dict:
    """Config keys of a comparison that runs in seconds (the three default runs)."""
    return {
        "name": "tiny",
        "output_dir": str(output_dir),
        "encoder": str(encoder),
        "image_size": IMAGE_SIZE,
        "max_train_examples": 24,
        "max_validation_examples": 4,
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
        "max_new_tokens": 10,
        **overrides,
    }


def _losses(run_dir: Path) -> list[int]:
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    return [entry["step"] for entry in history if "loss" in entry]


# ------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_tiny_comparison_end_to_end_and_resume_after_an_interruption(encoder, tmp_path, capsys):
    keys = tiny_keys(encoder, tmp_path)
    config = CaptioningConfig.from_dict(keys)
    out = config.run_dir
    with pytest.raises(KeyboardInterrupt):
        run_captioning(config, callbacks=[StopAtStep(out / "gated-cross", step=3)])
    baseline = (out / "baseline" / "train_summary.json").read_text()
    assert not (out / "gated-cross" / "train_summary.json").exists()
    features = (out / "encoder_features.safetensors").stat().st_mtime_ns
    config_file = write_config(tmp_path / "c.yaml", keys)
    assert main(["--config", str(config_file)]) == 2  # the folder holds this run: --resume or --overwrite
    assert "Pass --resume" in capsys.readouterr().err
    assert main(["--config", str(config_file), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "## Verdict on the article's claim" in printed and "overlay_*.png" in printed
    assert (out / "baseline" / "train_summary.json").read_text() == baseline  # kept, not retrained
    assert (out / "encoder_features.safetensors").stat().st_mtime_ns == features  # read, not recomputed
    gated = json.loads((out / "gated-cross" / "train_summary.json").read_text())
    assert gated["resumed_from"] == "checkpoint-2" and gated["global_step"] == 4
    assert _losses(out / "gated-cross") == [1, 2, 3, 4]

    for name in ("comparison.md", "comparison.csv", "comparison.json", "config.json", "data.json"):
        assert (out / name).is_file()
    for name in ("loss_curves.png", "quality.png", "attention.png", "speed.png", "overlay_0.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    comparison = json.loads((out / "comparison.json").read_text())
    rows = {row["run"]: row for row in comparison["runs"]}
    assert list(rows) == ["baseline", "gated-cross", "gated-cross-self"]
    assert comparison["data"]["split_sizes"] == {"train": 24, "validation": 4, "test": 6}
    assert rows["baseline"]["gates"] is None and "verdict" not in rows["baseline"]
    for name in ("gated-cross", "gated-cross-self"):
        row = rows[name]
        assert row["verdict"]["verdict"] in ("reproduced", "not reproduced", "inconclusive")
        assert set(row["gates"]) == {"visual", "function", "relation", "other", "end"}
        assert 0 < row["gates"]["visual"]["mean"] < 1  # the paper's init: sigmoid, no factor 2
        assert row["gate_contrast"]["n"] == 6
        delta = row["deltas"]["share_weighted"]
        expected = (
            row["attention"]["share_weighted"]["mean"]
            - rows["baseline"]["attention"]["share_weighted"]["mean"]
        )
        assert delta["delta"] == pytest.approx(expected) and delta["low"] <= delta["high"]
        assert row["trainable_params"] > rows["baseline"]["trainable_params"]  # + the gates
    assert set(rows["baseline"]["quality"]) == {"exact_match", "colour", "shape", "position", "rougeL"}
    assert 0 < rows["baseline"]["share_chance"]["mean"] < 1
    # the models are whole captioners: tokenizer and image processor saved beside the weights
    saved = out / "gated-cross-self" / "model"
    assert json.loads((saved / "config.json").read_text())["gate_attention"]["attention"] == [
        "cross",
        "decoder",
    ]
    assert (saved / "tokenizer.json").is_file() and (saved / "preprocessor_config.json").is_file()
    diagnosis = json.loads((out / "gated-cross" / "diagnostics.json").read_text())
    assert diagnosis["gates"] is None and len(diagnosis["cross_gates"]["mean"]) == 2  # 2 layers
    text = (out / "comparison.md").read_text()
    assert "cross gate mean" in text and "Rule: reproduced if" in text
    with open(out / "comparison.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == list(rows) and table[0]["delta_share_weighted_delta"] == ""
    assert table[1]["verdict"] == rows["gated-cross"]["verdict"]["verdict"]


@pytest.mark.slow
def test_a_saved_captioner_generates_from_pixels(encoder, tmp_path):
    """What the recipe saves is a standard `VisionEncoderDecoderModel`: `generate(pixel_values=...)` with
    its own image processor and tokenizer gives the captions the recipe wrote (from cached features)."""
    from hf_gate_attention import from_pretrained

    keys = tiny_keys(
        encoder, tmp_path, runs=[{"name": "gated", "gate": {"attention": ["cross"], "parts": ["decoder"]}}]
    )
    out = run_captioning(CaptioningConfig.from_dict(keys))
    folder = out / "gated" / "model"
    model = from_pretrained(folder, transformers.VisionEncoderDecoderModel).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    data = load_caption_dataset(
        "shapes", limits={"train": 1, "validation": 1, "test": 2}, image_size=IMAGE_SIZE
    )
    pixels = processor(images=[row["image"] for row in data.splits["test"]], return_tensors="pt")[
        "pixel_values"
    ]
    with torch.no_grad():
        generated = model.generate(pixel_values=pixels, max_new_tokens=10)
    captions = [" ".join(t.split()) for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    saved = json.loads((out / "gated" / "predictions.json").read_text())["predictions"]
    assert captions == saved[:2]


# ------------------------------------------------------------------------------------------- bad input


def _folder(root: Path, rows: list[dict], images: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in images:
        Image.new("RGB", (28, 28), (200, 30, 30)).save(root / name)
    if rows:
        (root / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_bad_input_is_refused_before_anything_trains(encoder, tmp_path, capsys):
    def refused(message: str, **overrides) -> None:
        keys = tiny_keys(encoder, tmp_path / "results", **overrides)
        assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
        err = capsys.readouterr().err
        assert message in err, err
        assert not (tmp_path / "results").exists()  # nothing written, nothing trained

    no_captions = _folder(tmp_path / "no-captions", [], ["a.png", "b.png"])
    refused(
        "holds 2 image(s) but no metadata.jsonl or metadata.csv with the captions", dataset=str(no_captions)
    )
    missing = _folder(
        tmp_path / "missing",
        [{"file_name": "a.png", "text": "a red square"}, {"file_name": "gone.png", "text": "x"}],
        ["a.png"],
    )
    refused("names 1 image(s) that are not in", dataset=str(missing))
    no_column = _folder(tmp_path / "no-column", [{"file_name": "a.png", "label": "red"}], ["a.png"])
    refused("has no caption column (any of ['text', 'caption', 'captions'])", dataset=str(no_column))
    llama = tmp_path / "llama"
    tiny_model("llama").save_pretrained(llama)
    build_word_tokenizer(["a red square"]).save_pretrained(llama)
    refused("has no cross-attention: it cannot read the image", decoder=str(llama))
    refused(
        "outside the decoder; the encoder is frozen",
        runs=[{"name": "all", "gate": {"attention": ["encoder", "cross"]}}],
    )
    refused("image_size=60 is not a multiple of the encoder's patch size 14", image_size=60)
    refused(
        "decoder='scratch-gpt3' is not a built-in decoder; accepted: scratch-gpt2, scratch-bert, or a Hub id",
        decoder="scratch-gpt3",
    )
    refused(
        "decoder 'nobody/no-decoder': ", decoder="nobody/no-decoder"
    )  # the Hub's message follows (offline)
    refused("(the built-in decoders: scratch-gpt2, scratch-bert)", decoder="nobody/no-decoder")


def test_metadata_objects_are_read_into_masks_and_splits_are_carved(tmp_path):
    rows = [
        {
            "file_name": f"{i}.png",
            "text": "A red square.",
            "objects": [{"words": ["red", "square"], "box": [0, 0, 14, 14]}],
        }
        for i in range(40)
    ]
    root = _folder(tmp_path / "folder", rows, [f"{i}.png" for i in range(40)])
    data = load_caption_dataset(str(root))
    assert sum(len(rows) for rows in data.splits.values()) == 40 and all(data.splits.values())
    row = data.splits["test"][0]
    assert row["caption"] == "a red square ." and row["objects"][0]["positions"] == [1, 2]
    np.testing.assert_array_equal(patch_coverage(row["objects"][0]["mask"], 28, 2), [1, 0, 0, 0])
    assert data.has_objects
    with pytest.raises(ValueError, match="object words \\['blue'\\] are not all in the caption"):
        _folder(
            tmp_path / "bad",
            [
                {
                    "file_name": "0.png",
                    "text": "a red square",
                    "objects": [{"words": ["blue"], "box": [0, 0, 1, 1]}],
                }
            ],
            ["0.png"],
        )
        load_caption_dataset(str(tmp_path / "bad"))
    with pytest.raises(
        ValueError, match=r"Hub is off|the Hub cannot be reached"
    ):  # offline mode, or no network
        load_caption_dataset("someone/captions")


# ------------------------------------------------------------------------------------------- shapes


def test_shapes_are_reproducible_and_their_captions_true():
    one = generate_shapes({"train": 3, "validation": 1, "test": 20}, seed=3)
    again = generate_shapes({"train": 5, "validation": 1, "test": 2}, seed=3)
    for a, b in zip(one.splits["train"], again.splits["train"], strict=False):  # independent of the count
        assert a["caption"] == b["caption"] and a["image"].tobytes() == b["image"].tobytes()
    assert shapes_example(4, "test", 0)["caption"] != shapes_example(5, "test", 0)["caption"]
    for row in one.splits["test"]:
        parsed = parse_shapes_caption(row["caption"])
        first, second = row["objects"]
        assert parsed["colour"] == [first["words"][0], second["words"][0]]
        assert list(COLOURS).index(parsed["colour"][0]) < list(COLOURS).index(parsed["colour"][1])
        assert not (first["mask"] & second["mask"]).any() and first["mask"].any()
        (y1, x1), (y2, x2) = (np.argwhere(o["mask"]).mean(0) for o in row["objects"])
        relation = parsed["position"]
        assert {"left of": x1 < x2, "right of": x1 > x2, "above": y1 < y2, "below": y1 > y2}[relation]
        words = row["caption"].split()
        assert [words[p] for p in first["positions"] + second["positions"]] == first["words"] + second[
            "words"
        ]
        pixels = np.asarray(row["image"])[first["mask"]].mean(0)  # the object is drawn in its colour
        assert np.abs(pixels - COLOURS[parsed["colour"][0]]).max() < 20


# ------------------------------------------------------------------------------------------- metrics


def test_object_share_weights_heads_by_their_gates():
    # 1 layer, 2 heads, keys: CLS + 4 patches; the object is patch 1 (key 2)
    weights = torch.tensor([[[0.1, 0.0, 0.8, 0.1, 0.0], [0.5, 0.1, 0.2, 0.1, 0.1]]])
    keys = torch.tensor([False, False, True, False, False])
    weighted, plain = object_share(weights, keys, torch.tensor([[0.9, 0.1]]))
    assert weighted == pytest.approx(0.9 * 0.8 + 0.1 * 0.2) and plain == pytest.approx(0.5)
    assert object_share(weights, keys) == (pytest.approx(0.5), pytest.approx(0.5))
    assert object_share(weights, keys, torch.tensor([[2.0, 2.0]]))[0] == pytest.approx(0.5)  # scale-free
    # sink: per head, the largest weight outside every object (CLS counts): 0.1 and 0.5
    assert sink_share(weights, ~keys) == pytest.approx(0.3)
    assert sink_share(weights, torch.zeros(5, dtype=torch.bool)) == 0.0


def test_patch_coverage_and_object_keys():
    mask = np.zeros((28, 28), dtype=bool)
    mask[:14, :7] = True  # half of the top-left patch
    np.testing.assert_allclose(patch_coverage(mask, 28, 2), [0.5, 0, 0, 0])
    np.testing.assert_allclose(
        patch_coverage(np.kron(mask, np.ones((2, 2), dtype=bool)), 28, 2), [0.5, 0, 0, 0]
    )
    assert object_keys(np.array([0.5, 0.3, 0, 0]), 0.25, 1).tolist() == [False, True, True, False, False]
    assert object_keys(np.array([0.1, 0.2, 0, 0]), 0.25, 1).tolist() == [False, False, True, False, False]


def test_a_word_is_measured_at_the_step_that_emits_it():
    tokenizer = build_word_tokenizer(["a red square above a blue circle"])
    ids, steps = _steps(tokenizer, "a red square above a blue circle", 24)
    assert [s for s, _ in steps] == list(range(8)) and steps[-1] == (7, END) and len(ids) == 7
    # keys: CLS + 4 patches; red square = patch 0 (key 1), blue circle = patch 3 (key 4)
    objects = [{"positions": [1, 2]}, {"positions": [5, 6]}]
    keys = [
        torch.tensor([False, True, False, False, False]),
        torch.tensor([False, False, False, False, True]),
    ]
    weights = torch.full((1, 2, 8, 5), 0.2)  # (layers, heads, steps, keys): uniform ...
    weights[0, :, 1] = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])  # ... but "red" looks at the red square
    gates = torch.full((1, 8, 2), 0.5)
    gates[0, 1] = gates[0, 2] = gates[0, 5] = gates[0, 6] = 0.9  # visual words
    gates[0, 0] = gates[0, 4] = 0.1  # "a"
    record = _caption_record(weights, gates, steps, {"objects": objects}, keys)
    assert record["share_weighted"] == pytest.approx((1.0 + 0.2 + 0.2 + 0.2) / 4)
    assert record["share_chance"] == pytest.approx(1 / 5)
    # sink: outside = CLS, patches 1 and 2: 0.2 at every step but step 1 (0.0)
    assert record["sink"] == pytest.approx(0.2 * 7 / 8)
    assert record["gate"]["visual"] == pytest.approx(0.9) and record["gate"]["function"] == pytest.approx(0.1)
    assert record["gate"]["relation"] == pytest.approx(0.5) and np.isnan(record["gate"]["other"])
    # truncated to 2 tokens: the second object's words are not measured
    _, short = _steps(tokenizer, "a red square above a blue circle", 2)
    assert short == [(0, "a"), (1, "red"), (2, END)]
    short_record = _caption_record(weights[:, :, :3], gates[:, :3], short, {"objects": objects}, keys)
    assert short_record["share_weighted"] == pytest.approx(1.0)


def test_caption_scores_and_word_classes():
    references = ["a red circle left of a blue square", "a green square above a red triangle"]
    predictions = ["a red circle left of a blue square", "a green circle below a purple"]
    scores = caption_scores(predictions, references)
    assert scores["exact_match"].tolist() == [100.0, 0.0]
    assert scores["colour"].tolist() == [100.0, 0.0]  # off the template: every attribute wrong
    assert scores["position"].tolist() == [100.0, 0.0] and scores["rougeL"][0] == pytest.approx(100.0)
    almost = caption_scores(["a green circle below a red triangle"], references[1:])
    assert almost["colour"].tolist() == [100.0] and almost["shape"].tolist() == [50.0]
    assert almost["position"].tolist() == [0.0]
    assert set(caption_scores(["a dog"], ["a cat runs"])) == {"exact_match", "rougeL"}  # not the template
    assert [word_class(w) for w in ("red", "square", "a", "of", "left", "dog")] == [
        "visual",
        "visual",
        "function",
        "function",
        "relation",
        "other",
    ]


def test_the_verdict_rule():
    above, around, below = ({"low": lo, "high": hi} for lo, hi in ((0.1, 0.3), (-0.1, 0.2), (-0.3, 0.0)))
    assert verdict(above, above)["verdict"] == "reproduced"
    assert verdict(below, above)["verdict"] == "not reproduced"
    assert verdict(above, below)["verdict"] == "not reproduced"
    assert verdict(around, above)["verdict"] == "inconclusive"
    assert verdict(None, above)["verdict"] == "inconclusive"


def test_the_preset_and_tiny_configs_are_valid():
    root = Path(__file__).resolve().parents[2] / "recipes" / "captioning" / "configs"
    from hf_gate_attention.recipes.common.config_files import load_config

    for name in ("preset.yaml", "tiny.yaml"):
        config = load_config(root / name, {}, CaptioningConfig)
        assert [run.name for run in config.runs] == ["baseline", "gated-cross", "gated-cross-self"]
    assert os.path.basename(str(root)) == "configs"


@pytest.mark.parametrize("name", ["captioning", "captioning-4000-steps"])
def test_committed_results_are_what_the_report_writes(name):
    """`results/<name>/comparison.md` and `.csv` are what the report writers make of its comparison.json."""
    from helpers import REPO

    from hf_gate_attention.recipes.captioning.report import csv_table, markdown_report

    out = REPO / "results" / name
    comparison = json.loads((out / "comparison.json").read_text())
    config = CaptioningConfig.from_dict(comparison["config"])
    rows, data = comparison["runs"], comparison["data"]
    written = markdown_report(config, rows, data, comparison["diagnostics"])
    assert (out / "comparison.md").read_text() == written
    assert (out / "comparison.csv").read_text() == csv_table(rows, "baseline")
    assert [row.get("verdict", {}).get("verdict") for row in rows] == [None, "reproduced", "reproduced"]
