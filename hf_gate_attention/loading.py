"""Load a gated checkpoint written by `save_pretrained` on a patched model."""

from __future__ import annotations

import json

import transformers
from safetensors import safe_open
from transformers.utils import cached_file

from .config import GateConfig
from .patching import CONFIG_ATTRIBUTE, GATE_MODULE_NAME, patch

_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"


def _gate_tensors(path: str, **hub_kwargs) -> dict:
    """The `attn_gate` tensors of a checkpoint (single or sharded safetensors), by state_dict key."""
    index_file = cached_file(path, _INDEX_FILE, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
    if index_file is not None:
        with open(index_file) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = [_SINGLE_FILE]
    tensors = {}
    for shard in shards:
        with safe_open(cached_file(path, shard, **hub_kwargs), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if f".{GATE_MODULE_NAME}." in key:
                    tensors[key] = f.get_tensor(key)
    return tensors


def from_pretrained(path: str, model_class=None, **kwargs):
    """Rebuild a gated model saved with `save_pretrained` (local folder or Hub id).

    Args:
        path (`str`): folder or Hub repo id holding `config.json` with a `gate_attention` entry.
        model_class (*optional*): a transformers class or Auto class (e.g. `AutoModelForCausalLM`); defaults to
            the class named in `config.architectures`.
        kwargs: passed to `model_class.from_pretrained` (`dtype`, `device_map`, `revision`, `token`, ...).
    """
    hub_kwargs = {k: kwargs[k] for k in ("revision", "token", "cache_dir") if k in kwargs}
    config = transformers.AutoConfig.from_pretrained(path, **hub_kwargs)
    gate_dict = getattr(config, CONFIG_ATTRIBUTE, None)
    if gate_dict is None:
        raise ValueError(f"{path} is not a gated checkpoint: its config.json has no {CONFIG_ATTRIBUTE!r} entry")
    if model_class is None:
        model_class = getattr(transformers, (config.architectures or ["AutoModel"])[0])
    delattr(config, CONFIG_ATTRIBUTE)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the gate keys are "unexpected" until we patch
    try:
        model = model_class.from_pretrained(path, config=config, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    patch(model, GateConfig.from_dict(gate_dict))

    saved = _gate_tensors(path, **hub_kwargs)
    expected = {k: v for k, v in model.state_dict().items() if f".{GATE_MODULE_NAME}." in k}
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or extra:
        raise ValueError(
            f"gate weights of {path} do not match the model: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    for key, tensor in expected.items():
        if saved[key].shape != tensor.shape:
            raise ValueError(
                f"gate weight {key} has shape {tuple(saved[key].shape)} in {path} but the model expects "
                f"{tuple(tensor.shape)}"
            )
    model.load_state_dict({k: saved[k] for k in expected}, strict=False)
    return model
