"""The tensors of a saved checkpoint (single or sharded safetensors; a local folder or a Hub repo), read
without building a model: all of them, a selection, or the gates."""

from __future__ import annotations

from transformers.utils import cached_file

from ..core.hooks import GATE_MODULE_NAME
from ..files import open_safetensors, read_json

_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"


def gate_tensors(path: str, **hub_kwargs) -> dict:
    """The `attn_gate` tensors of a checkpoint (single or sharded safetensors), by state_dict key."""
    return checkpoint_tensors(path, lambda key: f".{GATE_MODULE_NAME}." in key, **hub_kwargs)


def checkpoint_tensors(path: str, select=None, **hub_kwargs) -> dict:
    """The tensors of a checkpoint (single or sharded safetensors) whose key `select(key)` accepts (all by
    default), by state_dict key."""
    index_file = cached_file(path, _INDEX_FILE, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
    if index_file is not None:
        shards = sorted(set(read_json(index_file)["weight_map"].values()))
    else:
        shards = [_SINGLE_FILE]
    tensors = {}
    for shard in shards:
        with open_safetensors(cached_file(path, shard, **hub_kwargs)) as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if select is None or select(key):
                    tensors[key] = f.get_tensor(key)
    return tensors
