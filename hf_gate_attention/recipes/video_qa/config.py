"""`VideoQAConfig`: every knob of the video question answering recipe (YAML/JSON file and `KEY=VALUE`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..common.config import (
    RecipeConfigBase,
    RunSpec,
    TrainingKeys,
    baseline_and_gated_decoders,
    check_shared_keys,
)

MAX_FRAMES = 8


@dataclass
class VideoQAConfig(RecipeConfigBase, TrainingKeys):
    """Configuration of a video QA comparison: the same data, seed and budget for every run.

    Each run is a `VisionEncoderDecoderModel`: a frozen pretrained vision encoder, whose features are computed
    once per frame and cached, and a text decoder trained from scratch that reads the passage and the question
    through self-attention and the clip's frames (the frames' encoder outputs side by side, each with a fixed
    frame code added) through cross-attention.

    Run: the keys of `RecipeConfigBase` (`name`, `output_dir`, `overwrite`, `resume`, `backend`, `runs`).

    Model:
        encoder (`str`): Hub id or local folder of a vision encoder; `"dinov2-small"` is the offline copy.
        decoder (`str`): `"scratch-gpt2"` or `"scratch-bert"` (built from `decoder_*` and a word-level
            tokenizer of the training texts), or a local folder / Hub id of a decoder that takes
            cross-attention (its own tokenizer).
        decoder_layers, decoder_hidden_size, decoder_heads (`int`), decoder_dropout (`float`, in [0, 1)).
        attn_implementation (`str`): attention kernel while training and answering; weights read with eager.

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
    # model
    encoder: str = "dinov2-small"
    decoder: str = "scratch-gpt2"
    decoder_layers: int = 3
    decoder_hidden_size: int = 128
    decoder_heads: int = 4
    decoder_dropout: float = 0.1
    attn_implementation: str = "sdpa"
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
    image_size: int = 112
    max_passage_tokens: int = 48
    max_question_tokens: int = 12
    max_answer_tokens: int = 4
    feature_batch_size: int = 32
    # training (a decoder trained from scratch)
    learning_rate: float = 1e-3
    gate_learning_rate: float | None = None
    weight_decay: float = 0.01
    max_steps: int = 1500
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 64
    logging_steps: int = 10
    save_steps: int = 100
    # evaluation
    generation_batch_size: int = 64
    mask_threshold: float = 0.25
    overlay_examples: int = 2
    n_bootstrap: int = 1000
    confidence: float = 0.95
    speed_examples: int = 64
    speed_batch_size: int = 32
    speed_rounds: int = 3

    def _validate(self) -> None:
        check_shared_keys(self)
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be in (0, 1)")
        if not 0 < self.mask_threshold <= 1:
            raise ValueError(f"mask_threshold={self.mask_threshold} must be in (0, 1]")
        if not 0 <= self.decoder_dropout < 1:
            raise ValueError(f"decoder_dropout={self.decoder_dropout} must be in [0, 1)")
        low = 4 if self.dataset == "clips" else 1
        if not low <= self.clip_frames <= MAX_FRAMES:
            raise ValueError(
                f"clip_frames={self.clip_frames} is not accepted: {low} to {MAX_FRAMES} for dataset "
                f"{self.dataset!r}"
            )
        positive = ("decoder_layers", "decoder_hidden_size", "decoder_heads", "image_size")
        positive += ("max_passage_tokens", "max_question_tokens", "max_answer_tokens", "feature_batch_size")
        positive += (
            "generation_batch_size",
            "n_bootstrap",
            "speed_examples",
            "speed_batch_size",
            "speed_rounds",
        )
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if self.overlay_examples < 0:
            raise ValueError(f"overlay_examples={self.overlay_examples} must be >= 0")
        if self.decoder_hidden_size % self.decoder_heads:
            raise ValueError(
                f"decoder_hidden_size={self.decoder_hidden_size} must be a multiple of "
                f"decoder_heads={self.decoder_heads}"
            )
