"""Load a gated checkpoint written by `save_pretrained` on a patched model, on the backend chosen now."""

from __future__ import annotations

import transformers

from ..core.config import GateConfig
from ..core.families import family_for
from ..core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME
from ..core.patching import patch
from .layouts.paper import is_paper_config, load_paper_checkpoint
from .tensors import gate_tensors


def from_pretrained(path: str, model_class=None, *, backend: str = "auto", **kwargs):
    """Rebuild a gated model saved with `save_pretrained` (local folder or Hub id).

    Args:
        path (`str`): folder or Hub repo id holding `config.json` with a `gate_attention` entry, or a
            checkpoint in the paper's layout (gates packed into `q_proj`), converted by
            `layouts.paper.load_paper_checkpoint`.
        model_class (*optional*): a transformers class or Auto class (e.g. `AutoModelForCausalLM`);
            defaults to the class named in `config.architectures`.
        backend (`str`, *optional*, defaults to `"auto"`): what runs the gates here, as in `patch`; the
            checkpoint only says what the gates compute (a `backend` saved by older versions is ignored).
        kwargs: passed to `model_class.from_pretrained` (`dtype`, `device_map`, `revision`, `token`, ...).
    """
    hub_kwargs = {k: kwargs[k] for k in ("revision", "token", "cache_dir", "subfolder") if k in kwargs}
    config = transformers.AutoConfig.from_pretrained(path, **hub_kwargs)
    if is_paper_config(config.to_dict()):
        return load_paper_checkpoint(path, model_class, backend=backend, **kwargs)
    gate_dict = getattr(config, CONFIG_ATTRIBUTE, None)
    if gate_dict is None:
        raise ValueError(
            f"{path} is not a gated checkpoint: its config.json has no {CONFIG_ATTRIBUTE!r} entry"
        )
    if model_class is None:
        name = (config.architectures or ["AutoModel"])[0]
        try:
            model_class = getattr(transformers, name)
        except AttributeError:
            raise ValueError(
                f"config.architectures of {path} names {name!r}, which is not a transformers class; pass "
                "model_class= (e.g. transformers.AutoModelForCausalLM)"
            ) from None
    delattr(config, CONFIG_ATTRIBUTE)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the gate keys are "unexpected" until we patch
    try:
        model = model_class.from_pretrained(path, config=config, **kwargs)
    finally:
        transformers.logging.set_verbosity(verbosity)
    patch(model, GateConfig.from_saved(gate_dict), backend=backend)

    load_gate_tensors(model, gate_tensors(path, **hub_kwargs), path)
    return model


def load_model(path: str, *, backend: str = "auto", **kwargs):
    """The model saved at `path` (folder or Hub id), gated (through `from_pretrained`: ours or the paper's
    layout) or not (through the transformers class named in `config.architectures`); `kwargs` as in
    `from_pretrained`."""
    config = transformers.AutoConfig.from_pretrained(path)
    if getattr(config, CONFIG_ATTRIBUTE, None) is not None or is_paper_config(config.to_dict()):
        return from_pretrained(path, backend=backend, **kwargs)
    name = (config.architectures or ["AutoModel"])[0]
    return getattr(transformers, name, transformers.AutoModel).from_pretrained(path, **kwargs)


def load_gate_tensors(model, saved: dict, path: str) -> None:
    """Copy saved gate tensors into a patched model, matched by (layer index, tensor name).

    Keys are matched through the family's block pattern rather than verbatim, because transformers may save
    legacy key names (e.g. ViT's `encoder.layer.N`) for modules it names differently in memory (`layers.N`).
    """
    family = family_for(model.config.model_type)

    def by_layer(keys) -> dict:
        table = {}
        for key in keys:
            prefix, name = key.split(f".{GATE_MODULE_NAME}.")
            table[(family.match_block(prefix), name)] = key
        return table

    expected = by_layer(k for k in model.state_dict() if f".{GATE_MODULE_NAME}." in k)
    found = by_layer(saved)
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected), key=str)
    if missing or extra:
        raise ValueError(
            f"gate weights of {path} do not match the model: (layer, tensor) missing {missing[:3]}, "
            f"unexpected {extra[:3]}"
        )
    state = model.state_dict()
    for slot, key in expected.items():
        tensor = saved[found[slot]]
        if tensor.shape != state[key].shape:
            raise ValueError(
                f"gate weight {key} has shape {tuple(tensor.shape)} in {path} but the model expects "
                f"{tuple(state[key].shape)}"
            )
    model.load_state_dict({key: saved[found[slot]] for slot, key in expected.items()}, strict=False)


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
