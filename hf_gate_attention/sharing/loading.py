"""Load a gated checkpoint written by `save_pretrained` on a patched model, on the backend chosen now."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import transformers
from transformers.models.auto.auto_factory import _BaseAutoModelClass
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from ..core.config import GateConfig
from ..core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME
from ..core.model_type import base_names, is_gated_model_type
from ..core.patching import patch
from ..core.tensor_parallel import like_parameter
from ..files import check_safetensors_folder, read_config_json, require_checkpoint_folder
from .layouts.paper import is_paper_config, load_paper_checkpoint
from .tensors import gate_tensors

logger = logging.getLogger(__name__)
HUB_KEYS = ("revision", "token", "cache_dir", "subfolder")


def checkpoint_config(path: str, **hub_kwargs):
    """transformers' config of the checkpoint at `path` (folder or Hub id), as `AutoConfig` reads it, except
    that a gated checkpoint of ours (`config.json` naming model type `gated_<base>`, `core/model_type.py`)
    is read as its base model's config, without its remote code. `hub_kwargs`: `revision`, `token`, ...
    A local path that is missing, a file, or a folder without a readable `config.json` is named as such."""
    require_checkpoint_folder(path)
    local = Path(path, hub_kwargs.get("subfolder") or "")
    if local.is_dir():
        read_config_json(local)
    config_dict, _ = transformers.PretrainedConfig.get_config_dict(path, **hub_kwargs)
    if not is_gated_model_type(config_dict.get("model_type")):
        return transformers.AutoConfig.from_pretrained(path, **hub_kwargs)
    named = base_names(config_dict)
    named.pop("auto_map", None)  # the remote code's classes; this package patches transformers' own
    return CONFIG_MAPPING[named["model_type"]].from_dict(named)


def model_class_named(name: str, what: str, hint: str = "use"):
    """transformers' model class (or Auto class) called `name`; `ValueError` starting with `what` when there
    is none (`logging`, a typo), followed by `hint` and examples."""
    found = getattr(transformers, name, None)
    if not (
        isinstance(found, type) and issubclass(found, (transformers.PreTrainedModel, _BaseAutoModelClass))
    ):
        raise ValueError(
            f"{what} {name!r}, which is not a transformers model class; {hint} e.g. AutoModelForCausalLM, "
            "LlamaForCausalLM, AutoModelForSequenceClassification"
        )
    return found


def load_processor(path: str, auto_class=transformers.AutoTokenizer, **kwargs):
    """`auto_class.from_pretrained(path, **kwargs)` (`AutoTokenizer`, `AutoProcessor`, `AutoImageProcessor`,
    ...) without a question about remote code. The Auto classes read `config.json` to pick a processor
    class, and a gated checkpoint's model type is one transformers does not know: they would ask whether to
    run the checkpoint's code. For a gated checkpoint they get its base model's config and no remote code
    (its processors are transformers' own); anything else loads as `auto_class` loads it."""
    hub_kwargs = {k: kwargs[k] for k in HUB_KEYS if k in kwargs}
    try:
        config_dict, _ = transformers.PretrainedConfig.get_config_dict(path, **hub_kwargs)
    except OSError:  # no config.json: a tokenizer-only repository
        config_dict = {}
    if is_gated_model_type(config_dict.get("model_type")):
        kwargs = {"config": checkpoint_config(path, **hub_kwargs), **kwargs, "trust_remote_code": False}
    return auto_class.from_pretrained(path, **kwargs)


def from_pretrained(path: str, model_class=None, *, backend: str = "auto", **kwargs):
    """Rebuild a gated model saved with `save_pretrained` (local folder or Hub id).

    Args:
        path (`str`): folder or Hub repo id holding `config.json` with a `gate_attention` entry, or a
            checkpoint in the paper's layout (gates packed into `q_proj`), converted by
            `layouts.paper.load_paper_checkpoint`.
        model_class (*optional*): a transformers class or Auto class (e.g. `AutoModelForCausalLM`), or its
            name; defaults to the class named in `config.architectures`.
        backend (`str`, *optional*, defaults to `"auto"`): what runs the gates here, as in `patch`; the
            checkpoint only says what the gates compute (a `backend` saved by older versions is ignored).
        kwargs: passed to `model_class.from_pretrained` (`dtype`, `device_map`, `revision`, `token`, ...).
    """
    hub_kwargs = {k: kwargs[k] for k in HUB_KEYS if k in kwargs}
    config = checkpoint_config(path, **hub_kwargs)
    if is_paper_config(config.to_dict()):
        return load_paper_checkpoint(path, model_class, backend=backend, **kwargs)
    gate_dict = getattr(config, CONFIG_ATTRIBUTE, None)
    if gate_dict is None:
        raise ValueError(
            f"{path} is not a gated checkpoint: its config.json has no {CONFIG_ATTRIBUTE!r} entry"
        )
    if model_class is None:
        name = (config.architectures or ["AutoModel"])[0]
        model_class = model_class_named(name, f"config.architectures of {path} names", "pass model_class=,")
    elif isinstance(model_class, str):
        model_class = model_class_named(model_class, "model_class=")
    delattr(config, CONFIG_ATTRIBUTE)
    check_safetensors_folder(path)  # transformers' error on a truncated file does not name it
    with_info = kwargs.pop("output_loading_info", False)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its report would list the gate keys: ours follows
    try:
        model, info = model_class.from_pretrained(path, config=config, output_loading_info=True, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    info = _without_gate_keys(info)
    _report_loading(path, type(model).__name__, info)
    patch(model, GateConfig.from_checkpoint(gate_dict), backend=backend)
    load_gate_tensors(model, gate_tensors(path, **hub_kwargs), path)
    gates = {name: p.detach() for name, p in model.named_parameters() if f".{GATE_MODULE_NAME}." in name}
    if broken := non_finite_tensors(gates):
        logger.warning(
            "loading %s: %d gate tensor(s) hold NaN or inf, so every output will too: %s",
            path,
            len(broken),
            _first_five(broken),
        )
    return (model, info) if with_info else model


def _without_gate_keys(info: dict) -> dict:
    """transformers' loading info without the gate keys (unexpected until `patch` adds the gates)."""
    marker = f".{GATE_MODULE_NAME}."
    return {
        name: [key for key in keys if not (isinstance(key, str) and marker in key)]
        if name == "unexpected_keys"
        else keys
        for name, keys in info.items()
    }


def _first_five(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _report_loading(path: str, class_name: str, info: dict) -> None:
    """Warn, as transformers' load report does, about weights the checkpoint lacks (left at their random
    init), weights it has that the model does not use, and weights of another shape."""
    lines = []
    for name, what in (
        ("missing_keys", "not in the checkpoint, newly initialised"),
        ("unexpected_keys", "in the checkpoint, not used by the model"),
        ("mismatched_keys", "of another shape in the checkpoint, newly initialised"),
    ):
        keys = sorted(str(key) for key in info.get(name) or ())
        if keys:
            lines.append(f"{len(keys)} weight(s) {what}: {_first_five(keys)}")
    if lines:
        logger.warning("loading %s as %s: %s", path, class_name, "; ".join(lines))


def load_model(path: str, *, backend: str = "auto", **kwargs):
    """The model saved at `path` (folder or Hub id), gated (through `from_pretrained`: ours or the paper's
    layout) or not (through the transformers class named in `config.architectures`); `kwargs` as in
    `from_pretrained`."""
    config = checkpoint_config(path)
    if getattr(config, CONFIG_ATTRIBUTE, None) is not None or is_paper_config(config.to_dict()):
        return from_pretrained(path, backend=backend, **kwargs)
    name = (config.architectures or ["AutoModel"])[0]
    return getattr(transformers, name, transformers.AutoModel).from_pretrained(path, **kwargs)


def natural_order(prefix: str) -> tuple:
    """Sort key of a module name with its numbers compared as numbers (`layers.2` before `layers.10`)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in prefix.split("."))


def non_finite_tensors(tensors: dict) -> list[str]:
    """The names (state_dict keys, in layer order) of the tensors in `tensors` holding NaN or inf."""
    return [k for k in sorted(tensors, key=natural_order) if not torch.isfinite(tensors[k].float()).all()]


def _same_block(a: str, b: str) -> bool:
    """Whether two names of a block can be the in-memory and the saved name of one block: same numbers and
    same last name (transformers saves some modules under legacy names: ViT's `layers.N.attention` as
    `encoder.layer.N.attention`)."""
    numbers = [[part for part in name.split(".") if part.isdigit()] for name in (a, b)]
    return numbers[0] == numbers[1] and a.rsplit(".", 1)[-1] == b.rsplit(".", 1)[-1]


def _paired_blocks(expected: list[str], saved: list[str]) -> dict[str, str] | None:
    """In-memory block name -> saved block name: the same names, or else the two lists in natural order
    paired one to one when every pair is `_same_block`; `None` when they cannot be paired."""
    if set(expected) == set(saved):
        return {name: name for name in expected}
    pairs = list(zip(sorted(expected, key=natural_order), sorted(saved, key=natural_order), strict=False))
    if len(expected) != len(saved) or not all(_same_block(a, b) for a, b in pairs):
        return None
    return dict(pairs)


def load_gate_tensors(model, saved: dict, path: str) -> None:
    """Copy saved gate tensors into a patched model, matched by block and tensor name.

    Blocks are matched by name, or else in natural order with the same layer numbers (`_paired_blocks`),
    because transformers may save legacy key names (e.g. ViT's `encoder.layer.N`) for modules it names
    differently in memory (`layers.N`).
    """
    marker = f".{GATE_MODULE_NAME}."

    def by_block(keys) -> dict[str, dict[str, str]]:
        table: dict[str, dict[str, str]] = {}
        for key in keys:
            prefix, name = key.split(marker)
            table.setdefault(prefix, {})[name] = key
        return table

    expected = by_block(k for k in model.state_dict() if marker in k)
    found = by_block(saved)
    pairs = _paired_blocks(list(expected), list(found))
    if pairs is None or any(set(expected[a]) != set(found[b]) for a, b in pairs.items()):
        missing = sorted(set(expected) - set(found), key=natural_order)
        extra = sorted(set(found) - set(expected), key=natural_order)
        raise ValueError(
            f"gate weights of {path} do not match the model: blocks missing {missing[:3]}, unexpected "
            f"{extra[:3]} ({len(found)} gated blocks saved, {len(expected)} in the model)"
        )
    state = model.state_dict()
    tensors = {}
    for block, saved_block in pairs.items():
        for name, key in expected[block].items():
            tensor = saved[found[saved_block][name]]
            if tensor.shape != state[key].shape:
                raise ValueError(
                    f"gate weight {key} has shape {tuple(tensor.shape)} in {path} but the model expects "
                    f"{tuple(state[key].shape)}"
                )
            tensors[key] = like_parameter(state[key], tensor)  # this rank's shard under TP
    model.load_state_dict(tensors, strict=False)


class _AutoGated:
    """`from_pretrained` of a gated checkpoint through one transformers Auto class (the task head)."""

    auto_class_name = "AutoModel"

    @classmethod
    def from_pretrained(cls, path: str, **kwargs):
        """Rebuild the gated model at `path` (folder or Hub id); `kwargs` as in `from_pretrained`."""
        return from_pretrained(path, model_class=getattr(transformers, cls.auto_class_name), **kwargs)


def _auto_gated(auto_class_name: str) -> type:
    gated_name = auto_class_name.replace("AutoModel", "AutoGatedModel", 1)
    doc = f"`transformers.{auto_class_name}` for gated checkpoints: `{gated_name}.from_pretrained(path)`."
    return type(gated_name, (_AutoGated,), {"auto_class_name": auto_class_name, "__doc__": doc})


AutoGatedModel = _auto_gated("AutoModel")
AutoGatedModelForCausalLM = _auto_gated("AutoModelForCausalLM")
AutoGatedModelForMaskedLM = _auto_gated("AutoModelForMaskedLM")
AutoGatedModelForSequenceClassification = _auto_gated("AutoModelForSequenceClassification")
AutoGatedModelForTokenClassification = _auto_gated("AutoModelForTokenClassification")
AutoGatedModelForQuestionAnswering = _auto_gated("AutoModelForQuestionAnswering")
AutoGatedModelForImageClassification = _auto_gated("AutoModelForImageClassification")
