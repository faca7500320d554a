"""Captioning recipe: a frozen vision encoder (DINOv2-small offline) and a text decoder with cross-attention,
ungated and gated, trained on the same cached encoder features, seed and budget; compared on caption quality,
on where the cross-attention falls on the objects a caption names, on the gate values by word and on speed,
with a verdict on the article's captioning claim (`run_captioning`, `hf-gate-attention recipe captioning`)."""

from ..common.attention_maps import object_keys, object_share, patch_coverage
from .compare import run_captioning
from .config import CaptioningConfig
from .data import CaptionData, generate_shapes, load_caption_dataset, parse_shapes_caption
from .metrics import caption_scores, sink_share, word_class

__all__ = [
    "CaptionData",
    "CaptioningConfig",
    "caption_scores",
    "generate_shapes",
    "load_caption_dataset",
    "object_keys",
    "object_share",
    "parse_shapes_caption",
    "patch_coverage",
    "run_captioning",
    "sink_share",
    "word_class",
]
