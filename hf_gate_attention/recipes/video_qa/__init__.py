"""Video QA recipe: a frozen vision encoder (DINOv2-small offline) reading each frame of a short clip, and a
decoder trained from scratch that reads a passage and a question through self-attention and the frames
through cross-attention, ungated and gated; compared per question kind (frames only, text only, both) on
accuracy, the gates' fusion ratio and where the frames' attention falls, with a verdict on the article's
fusion claim (`run_video_qa`, `hf-gate-attention recipe video_qa`)."""

from .compare import run_video_qa
from .config import VideoQAConfig
from .data import KINDS, VideoQAData, clip_example, generate_clips, load_video_qa
from .metrics import answer_share, clip_object_keys, exact_match, fusion_ratio, verdict

__all__ = [
    "KINDS",
    "VideoQAConfig",
    "VideoQAData",
    "answer_share",
    "clip_example",
    "clip_object_keys",
    "exact_match",
    "fusion_ratio",
    "generate_clips",
    "load_video_qa",
    "run_video_qa",
    "verdict",
]
