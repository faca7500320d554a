"""The captioner of a run: a `VisionEncoderDecoderModel` (frozen vision encoder, text decoder with
cross-attention) patched with the run's gate; its tokenizer and image processor, the checks made before
anything trains, the encoder features computed once, and the collator that feeds them to the decoder.

The model stays a standard `VisionEncoderDecoderModel` (save, load, `generate(pixel_values=...)`); only
training and evaluation skip the frozen encoder by passing its cached output as `encoder_outputs`.
"""

from __future__ import annotations

import logging
import warnings

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, VisionEncoderDecoderModel, set_seed

from ...core.hooks import attention_layout
from ...offline import resolve_model
from ...sharing.loading import checkpoint_config, load_processor
from ...sharing.loading import from_pretrained as load_gated
from ..common.config import RunSpec
from ..common.distributed import patch_on_device
from ..common.encoder_decoder import (
    assemble_model,
    build_word_tokenizer,
    require_cross_attention,
    scratch_decoder_config,
    start_and_end,
)
from ..common.encoder_decoder import cached_features as shared_cached_features
from .config import DECODERS, CaptioningConfig

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
            f"decoder {config.decoder!r}: {err} (the built-in decoders: {', '.join(DECODERS)})"
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


def model_paths(config: CaptioningConfig) -> tuple[str, str | None]:
    """`(encoder folder or Hub id, decoder folder or Hub id, or None for a scratch-* decoder)`."""
    decoder = None if config.decoder in DECODERS else resolve_model(config.decoder)
    return resolve_model(config.encoder), decoder


def decoder_config(config: CaptioningConfig, decoder_path: str | None, tokenizer):
    """The decoder's config, with cross-attention asked for (`is_decoder`, `add_cross_attention`)."""
    start, end = start_and_end(tokenizer)
    tokens = {"bos_token_id": start, "eos_token_id": end, "pad_token_id": tokenizer.pad_token_id}
    cross = {"is_decoder": True, "add_cross_attention": True}
    if decoder_path is not None:
        return AutoConfig.from_pretrained(decoder_path, **cross)
    return scratch_decoder_config(config, len(tokenizer), config.max_caption_tokens + 2, tokens, cross)


def check_captioner(config: CaptioningConfig, encoder_path: str, decoder_path: str | None, tokenizer) -> None:
    """`ValueError` before anything trains: an encoder that is not a vision model or whose patches do not
    tile `image_size`, a decoder without cross-attention, a gate that touches the encoder (its features are
    computed once) or that cannot patch this model (`patch` on a weightless copy, `backend` included)."""
    from ...core.patching import patch, unpatch

    encoder_config = checkpoint_config(encoder_path)
    patch_size = getattr(encoder_config, "patch_size", None)
    if getattr(encoder_config, "num_channels", None) is None or not isinstance(patch_size, int):
        raise ValueError(
            f"encoder {config.encoder!r} is not a vision transformer (no num_channels/patch_size)"
        )
    if config.image_size % patch_size:
        raise ValueError(
            f"image_size={config.image_size} is not a multiple of the encoder's patch size {patch_size}"
        )
    decoder_cfg = decoder_config(config, decoder_path, tokenizer)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoder = AutoModelForCausalLM.from_config(decoder_cfg)
        model = assemble_model(AutoModel.from_config(encoder_config), decoder, tokenizer)
        require_cross_attention(model, config.decoder, decoder_cfg.model_type, "the image")
        for run in config.runs:
            if run.gate is None:
                continue
            outside = [b.name for b in attention_layout(model, run.gate) if not b.name.startswith("decoder.")]
            if outside:
                raise ValueError(
                    f"run {run.name!r} gates {outside[0]} (and {len(outside) - 1} more) outside the decoder; "
                    "the encoder is frozen and its features computed once: set the gate's parts: [decoder]"
                )
            unpatch(patch(model, run.gate, backend=config.backend))


def build_captioner(
    config: CaptioningConfig, encoder_path: str, decoder_path: str | None, tokenizer, run: RunSpec
):
    """The captioner of `run`: the pretrained encoder (frozen), the decoder (from scratch, or pretrained) and
    the projection between them drawn from `config.seed` (the same for every run), then the run's gate."""
    set_seed(config.seed)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
    decoder_cfg = decoder_config(config, decoder_path, tokenizer)
    if decoder_path is None:
        decoder = AutoModelForCausalLM.from_config(decoder_cfg)
    else:
        decoder = AutoModelForCausalLM.from_pretrained(decoder_path, config=decoder_cfg, dtype=torch.float32)
    set_seed(config.seed)
    model = assemble_model(encoder, decoder, tokenizer)
    model.set_attn_implementation(config.attn_implementation)
    model.encoder.requires_grad_(False)
    if run.gate is not None:
        set_seed(config.seed)
        patch_on_device(model, run.gate, config.backend)
    return model


def load_trained_captioner(config: CaptioningConfig, run: RunSpec, attn_implementation: str | None = None):
    """The final weights of `run` (`<run>/model`), in eval mode on the inference device."""
    final = str(config.run_dir / run.name / "model")
    kwargs = {
        "dtype": torch.float32,
        "attn_implementation": attn_implementation or config.attn_implementation,
    }
    if run.gate is not None:
        model = load_gated(final, VisionEncoderDecoderModel, backend=config.backend, **kwargs)
    else:
        model = VisionEncoderDecoderModel.from_pretrained(final, **kwargs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval()


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
