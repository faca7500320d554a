"""`CaptioningConfig`: every knob of the captioning recipe (YAML/JSON file and `KEY=VALUE`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.config import (
    EncoderDecoderKeys,
    RecipeConfigBase,
    RunSpec,
    TrainingKeys,
    baseline_and_gated_decoders,
    check_encoder_decoder_keys,
)


@dataclass
class CaptioningConfig(RecipeConfigBase, EncoderDecoderKeys, TrainingKeys):
    """Configuration of a captioning comparison: the same data, seed and budget for every run.

    Each run is a `VisionEncoderDecoderModel`: a frozen pretrained vision encoder, whose features are computed
    once per invocation and fed to the decoder as `encoder_outputs`, and a text decoder with cross-attention,
    built from the same seed for every run and patched with the run's gate.

    Run: the keys of `RecipeConfigBase` (`name`, `output_dir`, `overwrite`, `resume`, `backend`, `runs`).

    Model: the keys of `EncoderDecoderKeys` (encoder, decoder and its size, attention kernel).

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
    # model, images, statistics and timing: `EncoderDecoderKeys`
    # data
    dataset: str = "shapes"
    image_column: str | None = None
    caption_column: str | None = None
    max_train_examples: int | None = None
    max_validation_examples: int | None = None
    max_test_examples: int | None = None
    shapes_distractors: int = 2
    max_caption_tokens: int = 24
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
    overlay_examples: int = 3

    @property
    def decoder_positions(self) -> int:
        """Positions of a scratch decoder: a caption between its start and end tokens."""
        return self.max_caption_tokens + 2

    def _validate(self) -> None:
        check_encoder_decoder_keys(
            self, ("max_caption_tokens", "max_new_tokens"), non_negative=("shapes_distractors",)
        )
