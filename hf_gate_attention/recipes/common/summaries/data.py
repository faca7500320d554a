"""Long-document summarization data: loading, truncation, prompt building and collation.

Sources accepted by [`load_summarization_dataset`]:

- `"aclsum"` (default, offline): 250 full ACL papers shipped in the PyPI package `aclsum==0.1.2`
  (S2ORC JSON). Task: paper body (section titles kept as lines) -> abstract, with the package's
  train/val/test splits (100/50/100 papers).
- a Hub dataset id (needs the Hub): `ccdv/govreport-summarization` (report -> summary),
  `ccdv/arxiv-summarization` and `ccdv/pubmed-summarization` (article -> abstract). Any other id
  needs `document_column` and `summary_column`. Offline (HF_HUB_OFFLINE=1) only datasets already in
  the local `datasets` cache load; otherwise a `ConnectionError` points to `aclsum` or local files.
- local JSON/JSONL/CSV/Parquet files, given as
    * a mapping `{split: path}` (one file per split),
    * a directory holding one file per split, named after the split (`train.jsonl`,
      `validation.jsonl` or `val`/`valid`/`dev`, `test.jsonl`),
    * a single file: its rows are shuffled with `seed` and `eval_fraction` of them go to each
      requested evaluation split (`validation`, `test`), the rest to `train`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from huggingface_hub import is_offline_mode

from ....files import require_hub_id_or_existing_path

logger = logging.getLogger(__name__)

ACLSUM_INSTALL = "pip install --no-deps aclsum==0.1.2"
# Hub id -> (document column, summary column)
HUB_COLUMNS = {
    "ccdv/govreport-summarization": ("report", "summary"),
    "ccdv/arxiv-summarization": ("article", "abstract"),
    "ccdv/pubmed-summarization": ("article", "abstract"),
}
SPLITS = ("train", "validation", "test")
_SPLIT_ALIASES = {"train": "train", "validation": "validation", "val": "validation", "valid": "validation"}
_SPLIT_ALIASES |= {"dev": "validation", "test": "test"}
_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}

TRUNCATION_STRATEGIES = ("head", "head_tail")
ELLIPSIS = " [...] "
DEFAULT_INSTRUCTION = "Summarize the following paper."
_DOC_SLOT = "<<<DOCUMENT>>>"
_SUMMARY_SLOT = "<<<SUMMARY>>>"


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def load_summarization_dataset(
    source: str | Mapping[str, str] = "aclsum",
    document_column: str | None = None,
    summary_column: str | None = None,
    splits: Sequence[str] = SPLITS,
    max_examples: int | None = None,
    eval_fraction: float = 0.1,
    seed: int = 0,
    **load_kwargs,
) -> datasets.DatasetDict:
    """Load a summarization dataset as columns `document`, `summary` (plus `id` when known).

    Args:
        source: `"aclsum"`, a Hub dataset id, a local file or directory, or a `{split: file}` mapping
            (see the module docstring).
        document_column, summary_column: source column names. Default: fixed for `aclsum` and the
            known Hub ids, `"document"`/`"summary"` for local files; required for other Hub ids.
        splits: splits to return; `val`/`valid`/`dev` are read as `validation`.
        max_examples: keep at most this many examples per split (the first ones, after skipping).
        eval_fraction: single local file only: share of rows for each requested evaluation split.
        seed: single local file only: shuffling seed of the split.
        load_kwargs: forwarded to `datasets.load_dataset` (Hub and local sources), e.g. `name`,
            `revision`, `cache_dir`.

    Returns:
        `datasets.DatasetDict` keyed by canonical split names. Examples whose document or summary is
        empty are skipped; their number per split is logged and stored in the `num_skipped`
        attribute of the returned object (`{split: count}`).
    """
    splits = _canonical_splits(splits)
    source = os.fspath(source) if isinstance(source, os.PathLike) else source
    if isinstance(source, Mapping):
        raw = _load_local({_canonical_split(k): str(v) for k, v in source.items()}, load_kwargs)
    elif source == "aclsum":
        raw = _load_aclsum(splits)
        document_column, summary_column = "document", "summary"
    elif os.path.isdir(source):
        raw = _load_local(_files_in_dir(source), load_kwargs)
    elif os.path.isfile(source):
        raw = _load_local({"train": source}, load_kwargs)
        raw = _split_single_file(raw["train"], splits, eval_fraction, seed)
    elif Path(source).suffix.lower() in _LOCAL_FORMATS:
        raise FileNotFoundError(f"Local dataset file {source!r} does not exist.")
    else:
        require_hub_id_or_existing_path(source, "dataset")
        if document_column is None or summary_column is None:
            if source not in HUB_COLUMNS:
                raise ValueError(
                    f"Unknown Hub dataset {source!r}: pass `document_column` and `summary_column` "
                    f"(ids with known columns: {', '.join(HUB_COLUMNS)})."
                )
            known = HUB_COLUMNS[source]
            document_column = document_column or known[0]
            summary_column = summary_column or known[1]
        raw = _load_hub(source, load_kwargs)

    missing = [s for s in splits if s not in raw]
    if missing:
        raise ValueError(f"Split(s) {missing} not found in {source!r}; available: {sorted(raw)}.")
    document_column = document_column or "document"
    summary_column = summary_column or "summary"
    if document_column == summary_column:
        raise ValueError(f"document_column and summary_column are both {document_column!r}.")

    out, num_skipped = datasets.DatasetDict(), {}
    for split in splits:
        ds = _standardize(raw[split], document_column, summary_column, split)
        n_before = len(ds)
        ds = ds.filter(_non_empty, input_columns=["document", "summary"], batched=True)
        num_skipped[split] = n_before - len(ds)
        if max_examples is not None:
            ds = ds.select(range(min(max_examples, len(ds))))
        out[split] = ds
    if any(num_skipped.values()):
        logger.warning("Skipped examples with an empty document or summary: %s", num_skipped)
    out.num_skipped = num_skipped
    return out


def _canonical_split(name: str) -> str:
    if name not in _SPLIT_ALIASES:
        raise ValueError(f"Unknown split {name!r}; accepted: {sorted(_SPLIT_ALIASES)}.")
    return _SPLIT_ALIASES[name]


def _canonical_splits(splits: Sequence[str]) -> list[str]:
    if isinstance(splits, str):
        splits = [splits]
    out = list(dict.fromkeys(_canonical_split(s) for s in splits))
    if not out:
        raise ValueError("`splits` is empty.")
    return out


def _non_empty(documents: list[Any], summaries: list[Any]) -> list[bool]:
    return [
        bool(d and str(d).strip()) and bool(s and str(s).strip())
        for d, s in zip(documents, summaries, strict=True)
    ]


def _standardize(ds: datasets.Dataset, document_column: str, summary_column: str, split: str):
    """Keep (and rename to) `document`, `summary` and, if present, `id`."""
    found = ds.column_names
    expected = [document_column, summary_column]
    if any(c not in found for c in expected):
        raise ValueError(
            f"Split {split!r} has columns {found}, expected document/summary columns {expected}; "
            "pass `document_column` and `summary_column`."
        )
    keep = [*(["id"] if "id" in found and "id" not in expected else []), *expected]
    ds = ds.select_columns(keep)
    renames = {c: n for c, n in zip(expected, ("document", "summary"), strict=True) if c != n}
    return ds.rename_columns(renames) if renames else ds


def _load_aclsum(splits: list[str]) -> dict[str, datasets.Dataset]:
    spec = importlib.util.find_spec("aclsum")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The offline default dataset 'aclsum' needs its PyPI package: `{ACLSUM_INSTALL}`."
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "dataset"
    files = {"train": "train.jsonl", "validation": "val.jsonl", "test": "test.jsonl"}
    out = {}
    for split in splits:
        with open(root / files[split], encoding="utf-8") as f:
            ids = [json.loads(line)["id"] for line in f if line.strip()]
        rows = []
        for paper_id in ids:
            with open(root / "paper_jsons" / f"{paper_id}.json", encoding="utf-8") as f:
                paper = json.load(f)
            rows.append(
                {
                    "id": paper_id,
                    "document": s2orc_body_text(paper),
                    "summary": (paper["abstract"] or "").strip(),
                }
            )
        out[split] = datasets.Dataset.from_list(rows)
    return out


def s2orc_body_text(paper: dict) -> str:
    """Paper body of an S2ORC JSON: one paragraph per line, each section introduced by its title line
    (`"<sec_num> <section>"`) and separated from the previous one by a blank line."""
    lines, current = [], None
    for para in paper["pdf_parse"]["body_text"]:
        title = " ".join(p for p in (para.get("sec_num"), para.get("section")) if p)
        if title != current:
            if lines:
                lines.append("")
            if title:
                lines.append(title)
            current = title
        lines.append(para["text"].strip())
    return "\n".join(lines).strip()


def _files_in_dir(directory: str) -> dict[str, str]:
    files = {}
    for path in sorted(Path(directory).iterdir()):
        stem, suffix = path.name.split(".", 1)[0].lower(), path.suffix.lower()
        if suffix in _LOCAL_FORMATS and stem in _SPLIT_ALIASES:
            files[_SPLIT_ALIASES[stem]] = str(path)
    if not files:
        raise ValueError(
            f"No split files in {directory!r}: expected e.g. train.jsonl / validation.jsonl / test.jsonl "
            f"(formats {sorted(_LOCAL_FORMATS)})."
        )
    return files


def _load_local(files: dict[str, str], load_kwargs: dict) -> datasets.DatasetDict:
    formats = {_LOCAL_FORMATS.get(Path(p).suffix.lower()) for p in files.values()}
    if None in formats or len(formats) != 1:
        raise ValueError(f"Local files must share one format among {sorted(_LOCAL_FORMATS)}; got {files}.")
    for path in files.values():
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Local dataset file {path!r} does not exist.")
    return datasets.load_dataset(formats.pop(), data_files=files, **load_kwargs)


def _split_single_file(ds: datasets.Dataset, splits: list[str], eval_fraction: float, seed: int) -> dict:
    eval_splits = [s for s in splits if s != "train"]
    if not eval_splits:
        return {"train": ds}
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}.")
    n_eval = max(1, round(eval_fraction * len(ds)))
    n_train = len(ds) - n_eval * len(eval_splits)
    if n_train < 1:
        raise ValueError(f"{len(ds)} rows are too few for eval_fraction={eval_fraction} and splits {splits}.")
    ds = ds.shuffle(seed=seed)
    out = {"train": ds.select(range(n_train))}
    for i, split in enumerate(eval_splits):
        start = n_train + i * n_eval
        out[split] = ds.select(range(start, start + n_eval))
    return out


def _load_hub(dataset_id: str, load_kwargs: dict) -> datasets.DatasetDict:
    hint = (
        f"Cannot load Hub dataset {dataset_id!r}: {{why}}. Use the offline default source='aclsum' "
        f"(needs `{ACLSUM_INSTALL}`) or a local JSON/JSONL/CSV/Parquet file with "
        "`document_column`/`summary_column`."
    )
    try:
        return datasets.load_dataset(dataset_id, **load_kwargs)
    except (ConnectionError, TimeoutError) as err:
        if is_offline_mode():
            why = "offline mode is on (HF_HUB_OFFLINE=1) and it is not in the local cache"
        else:
            why = f"the Hugging Face Hub is unreachable ({err})"
        raise ConnectionError(hint.format(why=why)) from err


# ----------------------------------------------------------------------------------------------
# Truncation and prompts
# ----------------------------------------------------------------------------------------------


def truncate_document(
    token_ids: Sequence[int], budget: int, strategy: str = "head", marker_ids: Sequence[int] = ()
) -> list[int]:
    """Truncate document token ids to at most `budget` tokens.

    Args:
        token_ids: document token ids (no special tokens).
        budget: maximum number of tokens returned.
        strategy: `"head"` keeps the first `budget` tokens. `"head_tail"` keeps the first 3/4 and the
            last 1/4 of the room left after `marker_ids` (rounded in favour of the head), joined by
            `marker_ids` (an ellipsis); the marker is dropped when it would leave fewer than 4
            document tokens.
        marker_ids: ellipsis token ids inserted by `"head_tail"` where tokens were cut.
    """
    if strategy not in TRUNCATION_STRATEGIES:
        raise ValueError(
            f"Unknown truncation strategy {strategy!r}; accepted: {list(TRUNCATION_STRATEGIES)}."
        )
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}.")
    token_ids = list(token_ids)
    if len(token_ids) <= budget:
        return token_ids
    if strategy == "head":
        return token_ids[:budget]
    marker = list(marker_ids) if budget - len(marker_ids) >= 4 else []
    room = budget - len(marker)
    n_tail = room // 4
    n_head = room - n_tail
    return token_ids[:n_head] + marker + token_ids[len(token_ids) - n_tail :]


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False, verbose=False)


def _eos_id(tokenizer) -> int:
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    if eos is None:
        raise ValueError("The tokenizer has neither an eos_token nor a sep_token to end the summary.")
    return eos


def _prompt_pieces(tokenizer, instruction: str) -> tuple[list[int], list[int]]:
    """Token ids that go before and after the document in the prompt."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": f"{instruction}\n\n{_DOC_SLOT}"}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text.count(_DOC_SLOT) != 1:
            raise ValueError("The chat template does not render the user message verbatim.")
        before, after = text.split(_DOC_SLOT)
        return _encode(tokenizer, before), _encode(tokenizer, after)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return bos + _encode(tokenizer, f"{instruction}\n\nDocument: "), _encode(tokenizer, "\n\nSummary:")


def _summary_end(tokenizer, instruction: str) -> list[int]:
    """Token ids closing the summary: the chat template's end of turn up to EOS, or EOS."""
    eos = _eos_id(tokenizer)
    if not tokenizer.chat_template:
        return [eos]
    messages = [
        {"role": "user", "content": f"{instruction}\n\n{_DOC_SLOT}"},
        {"role": "assistant", "content": _SUMMARY_SLOT},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    end = _encode(tokenizer, text.split(_SUMMARY_SLOT, 1)[1]) if _SUMMARY_SLOT in text else []
    return end[: end.index(eos) + 1] if eos in end else [*end, eos]


def build_prompt(
    tokenizer,
    document: str,
    doc_token_budget: int,
    strategy: str = "head",
    instruction: str = DEFAULT_INSTRUCTION,
) -> dict[str, list[int]]:
    """Generation prompt for a causal LM: `input_ids`, `attention_mask` (lists of ints).

    With a chat template: one user message `"{instruction}\\n\\n{document}"` and the generation prompt
    (the assistant turn opener). Without: `"{instruction}\\n\\nDocument: {document}\\n\\nSummary:"`
    (after the BOS token when the tokenizer has one).

    `doc_token_budget` bounds the whole prompt (template + instruction + document): only the document
    tokens are truncated (with `strategy`, see [`truncate_document`]) so that the prompt never exceeds
    it. The prompt pieces and the document are tokenized separately, so ids at their seams may differ
    from tokenizing the rendered string at once; training and generation share the same pieces.
    """
    before, after = _prompt_pieces(tokenizer, instruction)
    room = doc_token_budget - len(before) - len(after)
    if room < 1:
        raise ValueError(
            f"doc_token_budget={doc_token_budget} leaves no room for the document: the prompt template "
            f"alone takes {len(before) + len(after)} tokens."
        )
    doc = truncate_document(_encode(tokenizer, document), room, strategy, _encode(tokenizer, ELLIPSIS))
    input_ids = before + doc + after
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids)}


def build_example(
    tokenizer,
    document: str,
    summary: str,
    doc_token_budget: int,
    strategy: str = "head",
    max_summary_tokens: int = 512,
    instruction: str = DEFAULT_INSTRUCTION,
) -> dict[str, list[int]]:
    """Training example for a causal LM: `input_ids`, `attention_mask`, `labels` (lists of ints).

    The prompt is [`build_prompt`]'s (at most `doc_token_budget` tokens); it is followed by the first
    `max_summary_tokens` summary tokens and the end of the answer (chat template: its end-of-turn
    tokens up to EOS; otherwise EOS, or SEP for tokenizers without EOS). `labels` are -100 on every
    prompt token, so the loss covers the summary and its end only. Length is at most
    `doc_token_budget + max_summary_tokens + len(end)`.
    """
    prompt = build_prompt(tokenizer, document, doc_token_budget, strategy, instruction)["input_ids"]
    text = summary if tokenizer.chat_template else " " + summary
    answer = _encode(tokenizer, text)[:max_summary_tokens] + _summary_end(tokenizer, instruction)
    input_ids = prompt + answer
    return {
        "input_ids": input_ids,
        "attention_mask": [1] * len(input_ids),
        "labels": [-100] * len(prompt) + answer,
    }


@dataclass
class DataCollatorForSummarization:
    """Pad a list of [`build_example`] / [`build_prompt`] features into a batch of tensors.

    `input_ids` are padded with `pad_token_id`, `attention_mask` with 0 and `labels` (when present) with
    `label_pad_token_id`, on the `padding_side` (`"right"` for training, `"left"` for batched
    generation). Other keys are dropped. Returns `(batch, max_len)` long tensors.
    """

    pad_token_id: int
    padding_side: str = "right"
    label_pad_token_id: int = -100
    pad_to_multiple_of: int | None = None

    def __post_init__(self):
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}.")

    def __call__(self, features: list[Mapping[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
        length = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            length = math.ceil(length / self.pad_to_multiple_of) * self.pad_to_multiple_of
        keys = {"input_ids": self.pad_token_id, "attention_mask": 0}
        if all("labels" in f for f in features):
            keys["labels"] = self.label_pad_token_id
        batch = {}
        for key, pad in keys.items():
            rows = []
            for f in features:
                values = list(f[key]) if key in f else [1] * len(f["input_ids"])
                padding = [pad] * (length - len(values))
                rows.append(padding + values if self.padding_side == "left" else values + padding)
            batch[key] = torch.tensor(rows, dtype=torch.long)
        return batch
