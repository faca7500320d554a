"""The captioner of a run: a `VisionEncoderDecoderModel` (frozen vision encoder, text decoder with
cross-attention) patched with the run's gate; its tokenizer and image processor, the checks made before
anything trains, the encoder features computed once, and the collator that feeds them to the decoder.

The model stays a standard `VisionEncoderDecoderModel` (save, load, `generate(pixel_values=...)`); only
training and evaluation skip the frozen encoder by passing its cached output as `encoder_outputs`.
"""

from __future__ import annotations

import logging

import torch

from ...sharing.loading import load_processor
from ..common.config import SCRATCH_DECODERS
from ..common.encoder_decoder import build_word_tokenizer, start_and_end
from ..common.encoder_decoder import cached_features as shared_cached_features
from .config import CaptioningConfig

logger = logging.getLogger(__name__)

FEATURES_FILE = "encoder_features.safetensors"


# ------------------------------------------------------------------------------------ tokenizer


def load_tokenizer(config: CaptioningConfig, decoder_path: str | None, train_captions: list[str]):
    """The word-level tokenizer of the training captions for a `scratch-*` decoder, else the decoder's own
    (its EOS as pad token when it has none)."""
    if decoder_path is None:
        return build_word_tokenizer(train_captions)
    try:
        tokenizer = load_processor(decoder_path)
    except OSError as err:  # the first read of the decoder: a Hub id offline or mistyped, a folder without it
        raise OSError(
            f"decoder {config.decoder!r}: {err} (the built-in decoders: {', '.join(SCRATCH_DECODERS)})"
        ) from err
    if not tokenizer.is_fast:
        raise ValueError(f"decoder {config.decoder!r}: the recipe needs a fast tokenizer (word offsets)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.sep_token
    return tokenizer


def encode_caption(tokenizer, caption: str, max_tokens: int) -> tuple[list[int], list[int | None]]:
    """`(token ids, index of the first token of each word)` of a caption (no special tokens), truncated to
    `max_tokens` (a word cut off gets `None`)."""
    encoded = tokenizer(caption, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"][:max_tokens], encoded["offset_mapping"][:max_tokens]
    starts, position = [], 0
    for word in caption.split():
        position = caption.index(word, position)
        starts.append(next((i for i, (a, b) in enumerate(offsets) if a <= position < b), None))
        position += len(word)
    return ids, starts


# ------------------------------------------------------------------------------------ the model


# ------------------------------------------------------------------------------------ images and features


# ------------------------------------------------------------------------------------ training batches


def caption_rows(tokenizer, captions: list[str], max_tokens: int) -> list[dict]:
    """Training rows `{"index": i, "labels": caption ids + end id}` (the index into the split's features)."""
    end = start_and_end(tokenizer)[1]
    return [
        {"index": i, "labels": encode_caption(tokenizer, caption, max_tokens)[0] + [end]}
        for i, caption in enumerate(captions)
    ]


class CaptionCollator:
    """Rows `{"index", "labels"}` -> `{"encoder_outputs": ((batch, tokens, hidden),), "labels": (batch,
    length)}`, labels padded with -100 (the model shifts them right behind the start token)."""

    def __init__(self, features: torch.Tensor):
        self.features = features

    def __call__(self, rows: list[dict]) -> dict:
        length = max(len(row["labels"]) for row in rows)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            labels[i, : len(row["labels"])] = torch.tensor(row["labels"])
        features = self.features[[row["index"] for row in rows]].float()
        return {"encoder_outputs": (features,), "labels": labels}


def cached_features(config: CaptioningConfig, encoder_path: str, processor, data, fingerprint: dict) -> dict:
    """`{split: (n, tokens, hidden) float16}` of every split (`common.encoder_decoder.cached_features`)."""
    images = {split: [row["image"] for row in rows] for split, rows in data.splits.items()}
    metadata = {split: fingerprint[split]["sha256"] for split in data.splits}
    metadata |= {"encoder": config.encoder, "image_size": str(config.image_size)}
    return shared_cached_features(
        config.run_dir / FEATURES_FILE, encoder_path, processor, images, metadata, config.feature_batch_size
    )
