"""hf-gate-attention: gated attention for pretrained Hugging Face models in one call.

from hf_gate_attention import GateConfig, patch
model = patch(model, GateConfig(variant="output", granularity="headwise", init="identity"))
"""

from .config import GateConfig
from .families import AttentionFamily, register_family, supported_model_types
from .gate import AttentionGate
from .loading import from_pretrained
from .patching import gate_config_of, gate_parameters, is_patched, patch, unpatch

__version__ = "0.1.0"

__all__ = [
    "AttentionFamily",
    "AttentionGate",
    "GateConfig",
    "from_pretrained",
    "gate_config_of",
    "gate_parameters",
    "is_patched",
    "patch",
    "register_family",
    "supported_model_types",
    "unpatch",
]
