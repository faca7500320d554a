"""`CaptioningConfig`: every knob of the captioning recipe (YAML/JSON file and `KEY=VALUE`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..common.config import (
    RecipeConfigBase,
    RunSpec,
    TrainingKeys,
    baseline_and_gated_decoders,
    check_shared_keys,
)

DECODERS = ("scratch-gpt2", "scratch-bert")


@dataclass
class CaptioningConfig(RecipeConfigBase, TrainingKeys):
    """Configuration of a captioning comparison: the same data, seed and budget for every run.

    Each run is a `VisionEncoderDecoderModel`: a frozen pretrained vision encoder, whose features are computed
    once per invocation and fed to the decoder as `encoder_outputs`, and a text decoder with cross-attention,
    built from the same seed for every run and patched with the run's gate.

    Run: the keys of `RecipeConfigBase` (`name`, `output_dir`, `overwrite`, `resume`, `backend`, `runs`).

    Model:
        encoder (`str`): Hub id or local folder of a vision encoder; `"dinov2-small"` is the offline copy.
        decoder (`str`): `"scratch-gpt2"` or `"scratch-bert"` (a `GPT2LMHeadModel` or `BertLMHeadModel` with
            cross-attention, built from `decoder_*` and a word-level tokenizer of the training captions), or
            a Hub id / local folder of a pretrained decoder that takes cross-attention (GPT-2, BERT, ...; its
            own tokenizer).
        decoder_layers, decoder_hidden_size, decoder_heads (`int`): size of a `scratch-*` decoder.
        decoder_dropout (`float`): dropout of a `scratch-*` decoder, in [0, 1).
        attn_implementation (`str`, defaults to `"sdpa"`): attention kernel while training, generating and
            timing; the attention weights are always read with `"eager"`.

    Data:
        dataset (`str`): `"shapes"` (offline, generated coloured shapes with distractors, masks kept), an
            image folder with a `metadata.jsonl`/`metadata.csv` (transformers' `imagefolder` convention), or a
            Hub dataset id; see `load_caption_dataset`.
        image_column, caption_column (`str`, *optional*): the source's columns, when they are not
            `image`/`text` (or `caption`, `captions`).
        max_train_examples, max_validation_examples, max_test_examples (`int`, *optional*): for `shapes`, how
            many are generated (`None`: 2000 / 200 / 300); for other sources, keep the first N (`None`: all).
        image_size (`int`): images are resized to this square size, a multiple of the encoder's patch size
            (112: 8 x 8 patches of 14 pixels for DINOv2); `shapes` are drawn at this size.
        shapes_distractors (`int`): at most this many grey distractor shapes per `shapes` image.
        max_caption_tokens (`int`): caption tokens kept (truncated) for training.
        feature_batch_size (`int`): images per batch when the encoder features are computed.

    Training: the keys of `TrainingKeys`.

    Evaluation:
        max_new_tokens (`int`): tokens generated per caption (greedy).
        generation_batch_size (`int`): captions generated (or measured) per batch.
        mask_threshold (`float`): a patch belongs to an object when at least this share of its pixels does,
            in (0, 1]; an object covering no patch that much gets its most covered patch.
        overlay_examples (`int`): test images drawn with each word's attention map, gated beside ungated.
        n_bootstrap (`int`): bootstrap resamples of the confidence intervals.
        confidence (`float`): level of the confidence intervals, in (0, 1).
        speed_examples (`int`): test captions generated per timing round, in batches of `speed_batch_size`.
        speed_batch_size (`int`): captions per timed batch.
        speed_rounds (`int`): interleaved timing rounds over the models (ratios are taken per round).
    """

    # name, output_dir, overwrite, resume, backend: `RecipeConfigBase`
    name: str = "captioning"
    runs: list[RunSpec] = field(default_factory=baseline_and_gated_decoders)
    # model
    encoder: str = "dinov2-small"
    decoder: str = "scratch-gpt2"
    decoder_layers: int = 3
    decoder_hidden_size: int = 128
    decoder_heads: int = 4
    decoder_dropout: float = 0.1
    attn_implementation: str = "sdpa"
    # data
    dataset: str = "shapes"
    image_column: str | None = None
    caption_column: str | None = None
    max_train_examples: int | None = None
    max_validation_examples: int | None = None
    max_test_examples: int | None = None
    image_size: int = 112
    shapes_distractors: int = 2
    max_caption_tokens: int = 24
    feature_batch_size: int = 32
    # training: `TrainingKeys`, with these defaults of this recipe (a decoder trained from scratch)
    learning_rate: float = 1e-3
    gate_learning_rate: float | None = None
    weight_decay: float = 0.01
    max_steps: int = 600
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    logging_steps: int = 10
    save_steps: int = 100
    # evaluation
    max_new_tokens: int = 16
    generation_batch_size: int = 64
    mask_threshold: float = 0.25
    overlay_examples: int = 3
    n_bootstrap: int = 1000
    confidence: float = 0.95
    speed_examples: int = 64
    speed_batch_size: int = 32
    speed_rounds: int = 3

    def _validate(self) -> None:
        check_shared_keys(self)
        if (
            self.decoder.startswith("scratch-")
            and self.decoder not in DECODERS
            and not Path(self.decoder).exists()
        ):
            raise ValueError(
                f"decoder={self.decoder!r} is not a built-in decoder; accepted: {', '.join(DECODERS)}, "
                "or a Hub id or local folder of a pretrained decoder that takes cross-attention"
            )
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be in (0, 1)")
        if not 0 < self.mask_threshold <= 1:
            raise ValueError(f"mask_threshold={self.mask_threshold} must be in (0, 1]")
        if not 0 <= self.decoder_dropout < 1:
            raise ValueError(f"decoder_dropout={self.decoder_dropout} must be in [0, 1)")
        positive = ("decoder_layers", "decoder_hidden_size", "decoder_heads", "image_size")
        positive += ("max_caption_tokens", "feature_batch_size", "max_new_tokens", "generation_batch_size")
        positive += ("n_bootstrap", "speed_examples", "speed_batch_size", "speed_rounds")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        for key in ("shapes_distractors", "overlay_examples"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 0")
        if self.decoder_hidden_size % self.decoder_heads:
            raise ValueError(
                f"decoder_hidden_size={self.decoder_hidden_size} must be a multiple of "
                f"decoder_heads={self.decoder_heads}"
            )
