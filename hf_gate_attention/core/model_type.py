"""What a gated checkpoint calls itself in `config.json`: model type `gated_<base model type>` and
architectures `Gated<transformers class>` (`gated_llama`, `GatedLlamaForCausalLM`).

A loader that builds transformers' own class from these names without this package or the checkpoint's
remote code (an Auto class without `trust_remote_code`, `transformers serve`, a serving engine's native
model) then refuses, instead of loading the model without its gates. In memory a loaded config keeps the
base model type (PEFT, transformers' weight conversions and this package look it up); the remote code's
config class reads and writes the gated names. Checkpoints written before keep their base names and load as
before.

Needs nothing: ships as remote code with the gate runtime.
"""

from __future__ import annotations

GATED_MODEL_TYPE_PREFIX = "gated_"
GATED_CLASS_PREFIX = "Gated"


def is_gated_model_type(model_type) -> bool:
    """Whether `model_type` (a `config.json` value) names a gated checkpoint of ours."""
    return isinstance(model_type, str) and model_type.startswith(GATED_MODEL_TYPE_PREFIX)


def gated_names(config_dict: dict) -> dict:
    """`config.json` contents with the gated model type and architectures (unchanged if already gated)."""
    if is_gated_model_type(config_dict.get("model_type")) or "model_type" not in config_dict:
        return dict(config_dict)
    named = {**config_dict, "model_type": GATED_MODEL_TYPE_PREFIX + config_dict["model_type"]}
    if config_dict.get("architectures"):
        named["architectures"] = [  # a remote-code class is named so already
            name if name.startswith(GATED_CLASS_PREFIX) else GATED_CLASS_PREFIX + name
            for name in config_dict["architectures"]
        ]
    return named


def base_names(config_dict: dict, architectures: bool = True) -> dict:
    """The inverse of `gated_names`: the base model type, and with `architectures` the transformers class
    names (unchanged if not gated)."""
    if not is_gated_model_type(config_dict.get("model_type")):
        return dict(config_dict)
    named = {**config_dict, "model_type": config_dict["model_type"][len(GATED_MODEL_TYPE_PREFIX) :]}
    if architectures and config_dict.get("architectures"):
        named["architectures"] = [name.removeprefix(GATED_CLASS_PREFIX) for name in named["architectures"]]
    return named
