"""`VideoQAConfig`: every knob of the video question answering recipe (YAML/JSON file and `KEY=VALUE`)."""

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

MAX_FRAMES = 8


@dataclass
class VideoQAConfig(RecipeConfigBase, EncoderDecoderKeys, TrainingKeys):
    """Configuration of a video QA comparison: the same data, seed and budget for every run.

    Each run is a `VisionEncoderDecoderModel`: a frozen pretrained vision encoder, whose features are computed
    once per frame and cached, and a text decoder trained from scratch that reads the passage and the question
    through self-attention and the clip's frames (the frames' encoder outputs side by side, each with a fixed
    frame code added) through cross-attention.

    Run: the keys of `RecipeConfigBase` (`name`, `output_dir`, `overwrite`, `resume`, `backend`, `runs`).

    Model: the keys of `EncoderDecoderKeys` (encoder, decoder and its size, attention kernel).

    Data:
        dataset (`str`): `"clips"` (offline, generated), a folder with a `metadata.jsonl`/`.csv` (one row per
            question: its frames, passage, question, answer, kind), or a Hub dataset id (or a folder that
            `datasets.load_dataset` reads, e.g. parquet) with the columns below; see `data.load_video_qa`.
        frames_column, passage_column, question_column, answer_column, kind_column (`str`): the columns.
        clip_frames (`int`): frames per clip, 1 to 8 (generated clips: 4 to 8); every clip must have as many.
        max_train_examples, max_validation_examples, max_test_examples (`int`, *optional*): clips generated
            (`None`: 1200 / 100 / 200; three questions each), or the first N rows of another source.
        image_size (`int`): frames are resized to this square size, a multiple of the encoder's patch size.
        max_passage_tokens, max_question_tokens, max_answer_tokens (`int`): kept per text (longer: refused
            for answers, truncated for the others).
        feature_batch_size (`int`): frames per batch when the encoder features are computed.

    Training: the keys of `TrainingKeys`.

    Evaluation:
        generation_batch_size (`int`): questions answered (greedy) or measured per batch.
        mask_threshold (`float`): a patch belongs to an object when at least this share of it does, (0, 1].
        overlay_examples (`int`): test questions of each kind drawn with the frames' attention.
        n_bootstrap (`int`), confidence (`float`): bootstrap resamples and level of the intervals.
        speed_examples, speed_batch_size, speed_rounds (`int`): the interleaved timing of answering.
    """

    name: str = "video_qa"
    runs: list[RunSpec] = field(default_factory=baseline_and_gated_decoders)
    # model, images, statistics and timing: `EncoderDecoderKeys`
    # data
    dataset: str = "clips"
    frames_column: str = "frames"
    passage_column: str = "passage"
    question_column: str = "question"
    answer_column: str = "answer"
    kind_column: str = "kind"
    clip_frames: int = 4
    max_train_examples: int | None = None
    max_validation_examples: int | None = None
    max_test_examples: int | None = None
    max_passage_tokens: int = 48
    max_question_tokens: int = 12
    max_answer_tokens: int = 4
    # training (a decoder trained from scratch)
    learning_rate: float = 1e-3
    gate_learning_rate: float | None = None
    weight_decay: float = 0.01
    max_steps: int = 1500
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    logging_steps: int = 10
    save_steps: int = 100

    @property
    def decoder_positions(self) -> int:
        """Positions of a scratch decoder: `<s> passage <q> question <a> answer </s>`."""
        return self.max_passage_tokens + self.max_question_tokens + self.max_answer_tokens + 4

    def _validate(self) -> None:
        counts = ("max_passage_tokens", "max_question_tokens", "max_answer_tokens")
        check_encoder_decoder_keys(self, counts)
        low = 4 if self.dataset == "clips" else 1
        if not low <= self.clip_frames <= MAX_FRAMES:
            raise ValueError(
                f"clip_frames={self.clip_frames} is not accepted: {low} to {MAX_FRAMES} for dataset "
                f"{self.dataset!r}"
            )
