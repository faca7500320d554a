"""Tokenizer and token blocks of the pretraining study: a byte-level BPE trained on the training split only,
and each split as one stream of documents (each followed by EOS) cut into blocks of `seq_len` tokens;
`prepare_data` builds both from the study's corpus (the training jobs and the report read the same)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from ...files import atomic_write_bytes, atomic_write_json, read_json
from ..common.archives import download_sources
from .config import StudyConfig
from .corpus import SOURCES, build_corpus, read_split

EOS = "<|endoftext|>"
TOKENIZER_DIR = "tokenizer"


def _fingerprint(corpus_dir: Path, *parts) -> str:
    """A hash of the corpus files and the settings that built something from them."""
    digest = hashlib.sha256(json.dumps(parts).encode())
    for path in sorted(Path(corpus_dir).glob("*.jsonl")) + sorted(Path(corpus_dir).glob("*.txt")):
        digest.update(path.name.encode())
        digest.update(str(path.stat().st_size).encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def train_tokenizer(corpus_dir: Path, out_dir: Path, vocab_size: int):
    """A `PreTrainedTokenizerFast` (byte-level BPE, EOS also the pad token) trained on the training split,
    saved to `out_dir` and reused while the corpus and `vocab_size` are unchanged."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    key = _fingerprint(corpus_dir, "tokenizer", vocab_size)
    stamp = read_json(out_dir / "built_from.json")
    if stamp is None or stamp.get("key") != key:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(read_split(corpus_dir, "train"), trainer=trainer)
        wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)
        wrapped.save_pretrained(out_dir)
        atomic_write_json(out_dir / "built_from.json", {"key": key, "vocab_size": vocab_size})
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def token_blocks(corpus_dir: Path, split: str, tokenizer, seq_len: int, cache_dir: Path) -> torch.Tensor:
    """`(N, seq_len)` int32 blocks of one split (the tail shorter than a block is dropped), cached."""
    key = _fingerprint(corpus_dir, "blocks", split, seq_len, tokenizer.vocab_size, len(tokenizer))
    path = Path(cache_dir) / f"{split}-{seq_len}-{key}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    documents = read_split(corpus_dir, split)
    pieces = []
    for start in range(0, len(documents), 1000):  # batches keep memory at a few bytes per token
        encoded = tokenizer(documents[start : start + 1000], add_special_tokens=False)["input_ids"]
        pieces += [np.asarray([*ids, tokenizer.eos_token_id], dtype=np.int32) for ids in encoded]
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    usable = len(stream) // seq_len * seq_len
    if usable == 0:
        raise ValueError(f"the {split} split of {corpus_dir} has {len(stream)} tokens, fewer than one block")
    blocks = torch.from_numpy(stream[:usable]).view(-1, seq_len)  # (N, seq_len)
    buffer = io.BytesIO()
    torch.save(blocks, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return blocks


class BlockDataset(torch.utils.data.Dataset):
    """Causal LM examples (`input_ids` = `labels`) from `(N, seq_len)` blocks."""

    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict:
        block = self.blocks[index].long()
        return {"input_ids": block, "labels": block}


def corpus_folder(config: StudyConfig) -> Path:
    """The corpus folder: built from the pinned archives for `corpus: offline`, else the given folder."""
    if config.corpus != "offline":
        folder = Path(config.corpus)
        if not folder.is_dir():
            raise FileNotFoundError(f"corpus folder {folder} does not exist (or use corpus: offline)")
        return folder
    archives = Path(config.corpus_archives)
    download_sources(archives, SOURCES)
    folder = Path(config.cache_dir) / "corpus"
    build_corpus(archives, folder)
    return folder


def prepare_data(config: StudyConfig):
    """`(tokenizer, {"train", "validation", "test"}: (N, seq_len) blocks)`."""
    corpus = corpus_folder(config)
    tokenizer = train_tokenizer(
        corpus, Path(config.cache_dir) / f"tokenizer-{config.vocab_size}", config.vocab_size
    )
    blocks = {
        split: token_blocks(corpus, split, tokenizer, config.seq_len, Path(config.cache_dir) / "blocks")
        for split in ("train", "validation", "test")
    }
    for split, minimum in (("validation", config.validation_blocks), ("test", config.test_blocks)):
        if blocks[split].shape[0] < minimum:
            raise ValueError(
                f"the {split} split has {blocks[split].shape[0]} blocks, fewer than {minimum} asked"
            )
    return tokenizer, blocks
