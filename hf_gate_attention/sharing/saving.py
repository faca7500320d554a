"""`save_pretrained` for patched models: the usual folder plus the code that loads it without this package.

The folder gets `modeling_gated_attention.py` and copies of the torch-only gate runtime (`core/config.py`,
`core/variants.py`, `core/families.py`, `core/gate.py`, `core/hooks.py`, `core/streaming.py`, renamed
`gated_attention_*.py`); `config.json` gets an `auto_map`, so
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` (or the Auto class of the task head)
builds transformers' own model class and adds the same gates with the same hooks.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import torch.distributed as dist
import transformers
from torch import nn
from torch.distributed.tensor import DTensor
from transformers.models.auto import modeling_auto

from ..core.families import AttentionFamily, registered_family
from ..core.hooks import unwrap_model
from ..core.model_type import GATED_CLASS_PREFIX, GATED_MODEL_TYPE_PREFIX, gated_names
from ..files import atomic_write_text, read_json, staged_update
from ..version import __version__

logger = logging.getLogger(__name__)

ENTRY_MODULE = "modeling_gated_attention"
# copied verbatim, imports renamed
RUNTIME_MODULES = (
    "config",
    "variants",
    "families",
    "gate",
    "hooks",
    "streaming",
    "tensor_parallel",
    "model_type",
)
RUNTIME_PREFIX = "gated_attention_"
_CORE_DIR = Path(__file__).parents[1] / "core"

ENTRY_TEMPLATE = '''"""Gated attention for this checkpoint (written by hf-gate-attention {version}).

`{auto_class}.from_pretrained(<this folder or repo>, trust_remote_code=True)` builds transformers' own
`{base_class}` and adds the gates described by `config.gate_attention` with the hooks of
`gated_attention_hooks.py` (a copy of `hf_gate_attention/core/hooks.py`). `config.json` names the model type
`{gated_model_type}` (`gated_attention_model_type.py`), so that loaders without this code refuse it rather
than load the model without its gates. Needs only torch and transformers.
"""

import json

import transformers
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)

from .gated_attention_config import GateConfig
from .gated_attention_families import AttentionFamily
from .gated_attention_hooks import add_gates, attention_layout
from .gated_attention_model_type import base_names, gated_names
from .gated_attention_streaming import ATTN_IMPLEMENTATION, register_attention_implementation

# a family registered by hand for this model type when it was saved; None: the structural search
FAMILY = {family!r}


def _add_gates(model):
    config = GateConfig.from_checkpoint(model.config.gate_attention)
    # dropped units that read sink and window keys need the attention function that applies the gate
    in_attention = config.dropped_reads_keys
    add_gates(model, config, attention_layout(model, config, FAMILY), gate_in_attention=in_attention)
    if in_attention:
        register_attention_implementation()
        model.set_attn_implementation(ATTN_IMPLEMENTATION)


def _share_conversions(gated):
    """transformers' weight conversions registered for the name of the class `gated` extends apply to it."""
    base = gated.__mro__[1].__name__
    conversions = get_checkpoint_conversion_mapping(base)
    if conversions is not None:
        register_checkpoint_conversion_mapping(gated.__name__, conversions, overwrite=True)


class {gated_config}(transformers.{base_config}):
    """transformers' `{base_config}` (model type `{model_type}` in memory), read from and written to a
    config.json that names the model type `{gated_model_type}`."""

    @classmethod
    def get_config_dict(cls, *args, **kwargs):
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        return base_names(config_dict, architectures=False), kwargs

    def to_json_string(self, use_diff: bool = True) -> str:
        named = gated_names(json.loads(super().to_json_string(use_diff)))
        return json.dumps(named, indent=2, sort_keys=True) + "\\n"
'''

CLASS_TEMPLATE = '''

class {gated_class}(transformers.{base_class}):
    """transformers' `{base_class}` with gated attention."""

    config_class = {gated_config}
    _auto_class = "{auto_class}"

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        _add_gates(self)

    @classmethod
    def is_custom_code(cls):
        # transformers' own class plus hooks: its checkpoint key conversions (legacy names) still apply
        return False


_share_conversions({gated_class})
'''


def auto_classes(model_type: str, class_name: str) -> list[str]:
    """Names of the transformers Auto classes that map `model_type` to `class_name`."""
    names = []
    for name, auto in vars(modeling_auto).items():
        mapping = getattr(auto, "_model_mapping", None)
        if name.startswith("AutoModel") and mapping is not None:
            mapped = mapping._model_mapping.get(model_type)
            if class_name in (mapped if isinstance(mapped, (list, tuple)) else [mapped]):
                names.append(name)
    return sorted(names)


def transformers_class(model: nn.Module) -> type | None:
    """The transformers class of `model`, also under FSDP2 (`fully_shard` swaps `LlamaForCausalLM` for a
    generated `FSDPLlamaForCausalLM(FSDPModule, LlamaForCausalLM)`); `None` for other classes, subclasses
    of users included (their code is not shipped)."""
    cls = type(model)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None and isinstance(model, fsdp.FSDPModule):
        cls = next(base for base in cls.__bases__ if not issubclass(base, fsdp.FSDPModule))
    return cls if getattr(transformers, cls.__name__, None) is cls else None


def remote_classes(model: nn.Module) -> dict[str, str]:
    """Auto class name -> transformers class name for the saved class and its base model class.

    Empty when the model's class or its config's is not one of transformers' own (then `trust_remote_code`
    loading is unavailable and only `hf_gate_attention.from_pretrained` loads the checkpoint).
    """
    model_type = model.config.model_type
    cls = transformers_class(model)
    config_class = type(model.config)
    if cls is None or getattr(transformers, config_class.__name__, None) is not config_class:
        return {}
    classes = {}
    for class_name in (cls.__name__, modeling_auto.MODEL_MAPPING_NAMES.get(model_type)):
        if not isinstance(class_name, str):  # no base model class (VisionEncoderDecoder), or several
            continue
        for auto_name in auto_classes(model_type, class_name):
            classes.setdefault(auto_name, class_name)
    return classes


def runtime_files() -> dict[str, str]:
    """File name -> source of the gate runtime copied into checkpoints, relative imports renamed."""
    pattern = re.compile(rf"^from \.({'|'.join(RUNTIME_MODULES)}) import", flags=re.MULTILINE)
    files = {}
    for module in RUNTIME_MODULES:
        source = (_CORE_DIR / f"{module}.py").read_text(encoding="utf-8")
        files[f"{RUNTIME_PREFIX}{module}.py"] = pattern.sub(rf"from .{RUNTIME_PREFIX}\1 import", source)
    return files


def entry_file(config, family: AttentionFamily | None, classes: dict[str, str]) -> str:
    """Source of `modeling_gated_attention.py`: a gated subclass of `config`'s class (the `AutoConfig` of
    the checkpoint) and of each transformers class in `classes`."""
    first_auto, first_class = next(iter(classes.items()))
    source = ENTRY_TEMPLATE.format(
        version=__version__,
        auto_class=first_auto,
        base_class=first_class,
        family=family,
        base_config=type(config).__name__,
        gated_config=GATED_CLASS_PREFIX + type(config).__name__,
        model_type=config.model_type,
        gated_model_type=GATED_MODEL_TYPE_PREFIX + config.model_type,
    )
    auto_by_class = {}
    for auto_name, class_name in classes.items():
        auto_by_class.setdefault(class_name, auto_name)
    for class_name, auto_name in auto_by_class.items():
        source += CLASS_TEMPLATE.format(
            base_class=class_name,
            gated_class=GATED_CLASS_PREFIX + class_name,
            gated_config=GATED_CLASS_PREFIX + type(config).__name__,
            auto_class=auto_name,
        )
    return source


def unshared_state_dict(state: dict) -> dict:
    """`state` with a copy of each tensor that shares its buffer with another tensor of `state` at another
    offset (the merged query/gate weights of backend `fused_gate`): transformers would take them for tied
    weights and save only one. Real aliases (tied embeddings: one tensor under two names) stay as they are,
    and so do DTensors (tensor parallelism: transformers gathers them; `fused_gate` does not run under TP)."""
    plain = {key: tensor for key, tensor in state.items() if not isinstance(tensor, DTensor)}
    starts_by_buffer: dict[int, set[int]] = {}
    for tensor in plain.values():
        starts_by_buffer.setdefault(tensor.untyped_storage().data_ptr(), set()).add(tensor.data_ptr())
    return {
        key: tensor.detach().clone()
        if key in plain and len(starts_by_buffer[tensor.untyped_storage().data_ptr()]) > 1
        else tensor
        for key, tensor in state.items()
    }


# what a save_pretrained writes into its folder: replaced by a new save, never carried over from the old one
_SAVED_BY_US = re.compile(
    r"(model|pytorch_model)([-.\w]*)\.(safetensors|bin)(\.index\.json)?|(generation_)?config\.json"
    rf"|{ENTRY_MODULE}\.py|{RUNTIME_PREFIX}\w+\.py"
)


def save_pretrained(model: nn.Module, save_directory, *args, **kwargs):
    """`model.save_pretrained` of a patched model: transformers' save plus the remote code and `auto_map`.

    Bound to the patched instance by `patch` (and removed by `unpatch`); arguments are transformers'. The
    main process writes into a staging folder that then replaces `save_directory` (`files.staged_update`:
    the other files of that folder are kept), so that a kill leaves the previous checkpoint or the new one,
    never new config over old weights.
    """
    base = unwrap_model(model)
    classes = remote_classes(base)
    if not classes:
        logger.warning(
            "%s is not a transformers class: the checkpoint loads with hf_gate_attention.from_pretrained "
            "only (no trust_remote_code code written)",
            type(base).__name__,
        )
    if len(args) < 2:  # the state_dict is transformers' third positional argument
        kwargs["state_dict"] = unshared_state_dict(kwargs.get("state_dict") or base.state_dict())
    main_process = args[0] if args else kwargs.get("is_main_process", True)
    if dist.is_available() and dist.is_initialized():  # transformers writes on rank 0 alone (and gathers
        main_process = main_process and dist.get_rank() == 0  # a TP model's shards on every rank)
    if not main_process:  # the other ranks of a distributed save write nothing of ours
        return type(base).save_pretrained(base, save_directory, *args, **kwargs)
    with staged_update(Path(save_directory), owned=_SAVED_BY_US.fullmatch) as folder:
        result = _save_with_remote_code(base, folder, classes, *args, **kwargs)
    return result


def _save_with_remote_code(base: nn.Module, folder: Path, classes: dict, *args, **kwargs):
    """transformers' save into `folder`, then the gated names in its `config.json` (`core/model_type.py`)
    and, for a transformers class, the remote code that `auto_map` points to."""
    previous = getattr(base.config, "auto_map", None)
    if classes:
        gated_config = GATED_CLASS_PREFIX + type(base.config).__name__
        base.config.auto_map = {
            "AutoConfig": f"{ENTRY_MODULE}.{gated_config}",
            **{auto: f"{ENTRY_MODULE}.{GATED_CLASS_PREFIX}{name}" for auto, name in classes.items()},
        }
    try:
        result = type(base).save_pretrained(base, folder, *args, **kwargs)
    finally:
        if previous is None and classes:
            del base.config.auto_map
        elif classes:
            base.config.auto_map = previous
    config_file = folder / "config.json"
    named = gated_names(read_json(config_file))
    atomic_write_text(config_file, json.dumps(named, indent=2, sort_keys=True) + "\n")
    if classes:
        family = registered_family(base.config.model_type)
        files = {f"{ENTRY_MODULE}.py": entry_file(base.config, family, classes), **runtime_files()}
        for name, text in files.items():
            atomic_write_text(folder / name, text)
    return result
