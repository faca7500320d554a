"""hf-gate-attention: gated attention for pretrained Hugging Face models in one call.

from hf_gate_attention import GateConfig, patch
model = patch(model, GateConfig(variant="output", granularity="headwise", init="identity"))
"""

from .card import render_model_card, write_model_card
from .config import GateConfig
from .families import AttentionFamily, register_family, supported_model_types
from .gate import AttentionGate
from .hub import push_to_hub
from .loading import (
    AutoGatedModel,
    AutoGatedModelForCausalLM,
    AutoGatedModelForImageClassification,
    AutoGatedModelForMaskedLM,
    AutoGatedModelForQuestionAnswering,
    AutoGatedModelForSequenceClassification,
    AutoGatedModelForTokenClassification,
    from_pretrained,
)
from .patching import gate_config_of, gate_parameters, is_patched, patch, unpatch

__version__ = "0.1.0"

__all__ = [
    "AttentionFamily",
    "AttentionGate",
    "AutoGatedModel",
    "AutoGatedModelForCausalLM",
    "AutoGatedModelForImageClassification",
    "AutoGatedModelForMaskedLM",
    "AutoGatedModelForQuestionAnswering",
    "AutoGatedModelForSequenceClassification",
    "AutoGatedModelForTokenClassification",
    "GateConfig",
    "from_pretrained",
    "gate_config_of",
    "gate_parameters",
    "is_patched",
    "patch",
    "push_to_hub",
    "register_family",
    "render_model_card",
    "supported_model_types",
    "unpatch",
    "write_model_card",
]
