"""The classifier of a run (BERT family for text, ViT family for images; patched with the run's gate), its
preprocessing (tokenizer or image processor) and the collator that turns rows into batches."""

from __future__ import annotations

import inspect

import torch
import transformers
from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification, set_seed

from ...sharing.loading import checkpoint_config
from ...sharing.loading import from_pretrained as load_gated
from ..common.config import RunSpec
from ..common.distributed import patch_on_device
from .config import ClassificationConfig

AUTO_CLASSES = {"text": AutoModelForSequenceClassification, "image": AutoModelForImageClassification}


def model_modality(model_path: str) -> str:
    """`"image"` for a vision config (it has `num_channels`, as ViT and DINOv2), else `"text"`."""
    config = checkpoint_config(model_path)
    return "image" if hasattr(config, "num_channels") else "text"


def check_modality(model_path: str, modality: str, dataset: str) -> None:
    """ValueError when the data's modality is not the model's (an image model on text, or the reverse)."""
    expected = model_modality(model_path)
    if expected != modality:
        raise ValueError(
            f"model {model_path!r} is a{'n' if expected == 'image' else ''} {expected} model but dataset "
            f"{dataset!r} holds {modality}s; use a {modality} model (text: BERT family such as "
            "all-MiniLM-L6-v2; images: ViT family such as dinov2-small)"
        )


def load_processor(config: ClassificationConfig, model_path: str, modality: str):
    """The model's tokenizer (text) or image processor (images, resized to `image_size` when set)."""
    if modality == "text":
        return transformers.AutoTokenizer.from_pretrained(model_path)
    processor = transformers.AutoImageProcessor.from_pretrained(model_path)
    if config.image_size is not None:
        processor.size = {"height": config.image_size, "width": config.image_size}
        processor.do_center_crop = False
    return processor


def load_classifier(
    config: ClassificationConfig, model_path: str, run: RunSpec, label_names: list[str], modality: str
):
    """The pretrained model with a new classification head of `len(label_names)` classes (initialised from
    `config.seed`, the same for every run), patched with the run's gate (identity init)."""
    set_seed(config.seed)
    model = AUTO_CLASSES[modality].from_pretrained(
        model_path,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={name: i for i, name in enumerate(label_names)},
        ignore_mismatched_sizes=True,  # a checkpoint with another head gets a new one
        dtype=torch.float32,
        attn_implementation=config.attn_implementation,
    )
    return patch_on_device(model, run.gate, config.backend) if run.gate is not None else model


def load_trained_classifier(config: ClassificationConfig, run: RunSpec, modality: str):
    """The final weights of `run` (`<run>/model`), in eval mode on the inference device."""
    final = str(config.run_dir / run.name / "model")
    kwargs = {"dtype": torch.float32, "attn_implementation": config.attn_implementation}
    if run.gate is not None:
        model = load_gated(final, AUTO_CLASSES[modality], backend=config.backend, **kwargs)
    else:
        model = AUTO_CLASSES[modality].from_pretrained(final, **kwargs)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval()


class ClassificationCollator:
    """Rows `{"text" | "image", "label"}` -> a batch: `input_ids`/`attention_mask` (`(batch, length)`, padded,
    truncated to `max_length`) or `pixel_values` (`(batch, 3, height, width)`), and `labels` (`(batch,)`).

    `interpolate_pos_encoding=True` is added for models that take it (ViT), so that images of another size
    than the checkpoint's are accepted; DINOv2 always interpolates.
    """

    def __init__(self, processor, modality: str, max_length: int, interpolate_pos_encoding: bool = False):
        self.processor, self.modality, self.max_length = processor, modality, max_length
        self.interpolate_pos_encoding = interpolate_pos_encoding

    @classmethod
    def for_model(cls, processor, modality: str, max_length: int, model) -> ClassificationCollator:
        takes = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
        return cls(processor, modality, max_length, takes)

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        if self.modality == "text":
            batch = self.processor(
                [row["text"] for row in rows],
                truncation=True,
                max_length=self.max_length,
                padding=True,
                return_tensors="pt",
            )
        else:
            batch = self.processor(images=[row["image"] for row in rows], return_tensors="pt")
        batch = dict(batch)
        if self.interpolate_pos_encoding:
            batch["interpolate_pos_encoding"] = True
        batch["labels"] = torch.tensor([row["label"] for row in rows])
        return batch
