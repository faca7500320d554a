"""Gate-only adapters: share trained gates (and a PEFT LoRA over the patched model) without the base weights.

An adapter folder holds, in PEFT's layout (a JSON config beside safetensors weights):

- `gate_adapter_config.json`: the base model it needs (`base_model_name_or_path`, `revision`, its class and
  attention geometry), the `GateConfig`, and whether a LoRA is included.
- `gate_adapter_model.safetensors`: the `attn_gate` tensors, by the base model's state_dict key.
- with a LoRA: PEFT's own `adapter_config.json` and `adapter_model.safetensors` (those of
  `PeftModel.save_pretrained`), loaded by PEFT on top of the patched base.

PEFT cannot load the gates itself: `peft.register_peft_method` only accepts names of its closed `PeftType`
enum, and a `PeftModel` refuses adapters of different types side by side (a gate type next to LoRA); see
docs/sharing.md, "Gate-only adapters".
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import torch
import transformers
from safetensors.torch import save as safetensors_bytes
from torch import nn
from transformers.utils import cached_file

from ..core.config import GateConfig
from ..core.hooks import GATE_MODULE_NAME, unwrap_model
from ..core.patching import gate_config_of, is_patched, patch
from ..files import atomic_write_folder, open_safetensors, read_json, require_checkpoint_folder
from .card.metadata import is_hub_id
from .loading import load_gate_tensors

GATE_CONFIG_NAME = "gate_adapter_config.json"
GATE_WEIGHTS_NAME = "gate_adapter_model.safetensors"
LORA_CONFIG_NAME = "adapter_config.json"  # PEFT's names
LORA_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_TYPE = "gate_attention"
FORMAT_VERSION = 1
# the base reference of the adapter a model was loaded with: the default when it is saved again
_BASE_ATTRIBUTE = "_gate_adapter_base"
DEFAULT_COMMIT_MESSAGE = "Upload gate adapter (hf-gate-attention)"


def base_fingerprint(model_config) -> dict:
    """What an adapter must match in its base model's config: model type and attention geometry."""
    num_heads = getattr(model_config, "num_attention_heads", None)
    return {
        "model_type": model_config.model_type,
        "hidden_size": getattr(model_config, "hidden_size", None),
        "num_attention_heads": num_heads,
        "num_key_value_heads": getattr(model_config, "num_key_value_heads", None) or num_heads,
        "num_hidden_layers": getattr(model_config, "num_hidden_layers", None),
    }


def _active_gate(module: nn.Module) -> nn.Module:
    """The gate a block runs: itself, or the active copy when PEFT wraps it (`modules_to_save`)."""
    copies = getattr(module, "modules_to_save", None)
    if copies is None:
        return module
    active = [name for name in module.active_adapters if name in copies]
    return copies[active[0]] if active and not module.disable_adapters else module.original_module


def _gate_tensors(base: nn.Module) -> dict[str, torch.Tensor]:
    """The gate tensors a patched model computes with, by state_dict key (`...self_attn.attn_gate.weight`)."""
    tensors = {}
    for name, module in base.named_modules():
        if name.rsplit(".", 1)[-1] == GATE_MODULE_NAME:
            for key, tensor in _active_gate(module).state_dict().items():
                tensors[f"{name}.{key}"] = tensor.detach().contiguous()
    return tensors


def _lora_files(model: nn.Module, base_ref: dict) -> dict[str, bytes]:
    """PEFT's adapter files of the active LoRA of a PEFT model (none for a transformers model)."""
    if unwrap_model(model) is model:
        return {}
    from peft import get_peft_model_state_dict

    name = model.active_adapter
    config = model.peft_config[name]
    peft_type = getattr(config.peft_type, "value", config.peft_type)  # PeftType is a str enum
    if peft_type != "LORA":
        raise ValueError(f"gate adapters carry a LoRA only; the active PEFT adapter {name!r} is {peft_type}")
    state = get_peft_model_state_dict(model, adapter_name=name)
    entries = config.to_dict() | base_ref | {"inference_mode": True}  # as PeftModel.from_pretrained sets
    entries = {k: sorted(v) if isinstance(v, set) else v for k, v in entries.items()}
    return {
        LORA_CONFIG_NAME: (json.dumps(entries, indent=2, sort_keys=True) + "\n").encode(),
        LORA_WEIGHTS_NAME: safetensors_bytes(
            {k: v.detach().contiguous() for k, v in state.items()}, metadata={"format": "pt"}
        ),
    }


def save_gate_adapter(
    model: nn.Module, folder, *, base_model_name_or_path: str | None = None, base_revision: str | None = None
) -> Path:
    """Write the gate adapter of a patched model (and its LoRA when it is a PEFT LoRA model) to `folder`.

    Args:
        model: a model patched with `patch`, or a PEFT LoRA model over one (`get_peft_model(patched, ...)`).
        folder: written atomically (a temporary folder, then renamed); an existing folder keeps other files.
        base_model_name_or_path (`str`, *optional*): the base the adapter needs, a Hub id or a local folder.
            Defaults to the base of the adapter the model was loaded with, else `config._name_or_path`; the
            adapter records `None` when neither is set (then loading needs a base model or id).
        base_revision (`str`, *optional*): the base's Hub revision; defaults to the loaded adapter's when the
            base is the same.
    Returns the folder's `Path`.
    """
    base = unwrap_model(model)
    if not is_patched(base):
        raise ValueError("this model is not patched with gated attention: patch it and train the gates first")
    loaded = getattr(base, _BASE_ATTRIBUTE, {})
    name = (
        base_model_name_or_path or loaded.get("base_model_name_or_path") or base.config._name_or_path or None
    )
    same_base = name == loaded.get("base_model_name_or_path")  # the loaded revision is that base's only
    base_ref = {
        "base_model_name_or_path": name,
        "revision": base_revision or (loaded.get("revision") if same_base else None),
    }
    lora = _lora_files(model, base_ref)
    config = {
        "adapter_type": ADAPTER_TYPE,
        "format_version": FORMAT_VERSION,
        **base_ref,
        "base_model_class": type(base).__name__,
        "base_model": base_fingerprint(base.config),
        "gate_config": gate_config_of(base).to_dict(),
        "lora": bool(lora),
    }
    files = {
        GATE_CONFIG_NAME: (json.dumps(config, indent=2) + "\n").encode(),
        GATE_WEIGHTS_NAME: safetensors_bytes(_gate_tensors(base), metadata={"format": "pt"}),
        **lora,
    }
    atomic_write_folder(Path(folder), files, stale=(LORA_CONFIG_NAME, LORA_WEIGHTS_NAME))
    return Path(folder)


def _resolve(adapter, revision: str | None = None, token=None) -> tuple[dict, dict[str, str]]:
    """The adapter's config and its file name -> local path (downloaded when `adapter` is a Hub id)."""
    require_checkpoint_folder(adapter, "gate adapter")

    def fetch(name: str) -> str | None:
        return cached_file(
            str(adapter), name, revision=revision, token=token, _raise_exceptions_for_missing_entries=False
        )

    config_file = fetch(GATE_CONFIG_NAME)
    if config_file is None:
        found = sorted(os.listdir(adapter)) if Path(adapter).is_dir() else "a Hub repo without it"
        raise ValueError(f"{adapter} is not a gate adapter: expected {GATE_CONFIG_NAME}, found {found}")
    config = read_json(config_file)
    if config.get("adapter_type") != ADAPTER_TYPE or config.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{adapter}/{GATE_CONFIG_NAME} describes adapter_type={config.get('adapter_type')!r} format "
            f"{config.get('format_version')}; accepted: {ADAPTER_TYPE!r} format <= {FORMAT_VERSION}"
        )
    names = [GATE_WEIGHTS_NAME] + ([LORA_CONFIG_NAME, LORA_WEIGHTS_NAME] if config["lora"] else [])
    paths = {name: fetch(name) for name in names}
    missing = [name for name, path in paths.items() if path is None]
    if missing:
        raise ValueError(f"gate adapter {adapter} is incomplete: missing {missing}, expected {names}")
    return config, {GATE_CONFIG_NAME: config_file, **paths}


def _check_base(config: dict, model_config, class_name: str | None, adapter) -> None:
    """`ValueError` naming expected vs found when the base differs from the one the adapter was saved on."""
    found = base_fingerprint(model_config)
    expected = config["base_model"]
    if class_name is not None:
        found, expected = {"class": class_name, **found}, {"class": config["base_model_class"], **expected}
    wrong = {key: (expected[key], found[key]) for key in expected if expected[key] != found[key]}
    if wrong:
        details = ", ".join(f"{key} {want!r} (found {got!r})" for key, (want, got) in wrong.items())
        raise ValueError(
            f"gate adapter {adapter} was saved on another base model: it expects {details}; its base is "
            f"{config['base_model_name_or_path']!r}"
        )


def _warn_other_base(config: dict, name: str | None, revision: str | None, adapter) -> None:
    expected = (config["base_model_name_or_path"], config["revision"])
    if expected[0] and name and (name, revision or expected[1]) != expected:
        warnings.warn(
            f"gate adapter {adapter} was saved on base {expected[0]!r} (revision {expected[1]!r}); loading "
            f"it on {name!r} (revision {revision!r}), which has the same architecture and geometry",
            UserWarning,
            stacklevel=3,
        )


def load_gate_adapter(
    model_or_base_id,
    adapter,
    *,
    adapter_revision: str | None = None,
    token: str | None = None,
    backend: str = "auto",
    **from_pretrained_kwargs,
):
    """A base model with a gate adapter loaded: patched with the adapter's `GateConfig`, gates set, and
    wrapped by PEFT (`PeftModel`) when the adapter includes a LoRA.

    Args:
        model_or_base_id: an unpatched transformers model instance (not PEFT-wrapped), a Hub id or folder of
            the base, or `None` for the base recorded in the adapter (at its recorded revision). Another
            architecture or attention geometry raises `ValueError`; another name with the same architecture
            warns (a local copy of the base is fine, other fine-tuned weights are not).
        adapter: folder or Hub repo id of the adapter (`save_gate_adapter`, `push_gate_adapter_to_hub`).
        adapter_revision (`str`, *optional*): the adapter repo's revision.
        token (`str`, *optional*): for both the adapter and the base.
        backend (`str`, *optional*, defaults to `"auto"`): what runs the gates, as in `patch`.
        from_pretrained_kwargs: passed to the base class's `from_pretrained` when a base id is given
            (`dtype`, `device_map`, `attn_implementation`, `revision` of the base, ...).
    """
    config, files = _resolve(adapter, adapter_revision, token)
    if model_or_base_id is None or isinstance(model_or_base_id, (str, os.PathLike)):
        model = _load_base(config, model_or_base_id, adapter, token, from_pretrained_kwargs)
    else:
        if from_pretrained_kwargs:
            raise ValueError(
                f"{sorted(from_pretrained_kwargs)} only apply when a base id is given, not a model instance"
            )
        model = model_or_base_id
        if unwrap_model(model) is not model:
            raise ValueError("the base model is PEFT-wrapped; pass the transformers model it wraps")
        if is_patched(model):
            raise ValueError(
                f"the base model is already patched with gated attention ({gate_config_of(model)}); the "
                "adapter brings its own gates: pass an unpatched base (hf_gate_attention.unpatch(model))"
            )
        _check_base(config, model.config, type(model).__name__, adapter)
        _warn_other_base(config, model.config._name_or_path or None, None, adapter)
        setattr(model, _BASE_ATTRIBUTE, {k: config[k] for k in ("base_model_name_or_path", "revision")})
    patch(model, GateConfig.from_checkpoint(config["gate_config"]), backend=backend)
    load_gate_tensors(model, _tensors(files[GATE_WEIGHTS_NAME]), str(adapter))
    if not config["lora"]:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(Path(files[LORA_CONFIG_NAME]).parent))


def _load_base(config: dict, base_id, adapter, token, kwargs: dict):
    """The base model of `config` from `base_id` (or the recorded base), checked before its weights load."""
    recorded = config["base_model_name_or_path"]
    if base_id is None and recorded is None:
        raise ValueError(
            f"gate adapter {adapter} records no base model; pass the base model or its Hub id / folder"
        )
    base_id = str(base_id or recorded)
    revision = kwargs.pop("revision", config["revision"] if base_id == recorded else None)
    _warn_other_base(config, base_id, revision, adapter)
    model_config = transformers.AutoConfig.from_pretrained(base_id, revision=revision, token=token)
    _check_base(config, model_config, None, adapter)
    model_class = getattr(transformers, config["base_model_class"], None)
    if model_class is None:
        raise ValueError(
            f"gate adapter {adapter} was saved on a {config['base_model_class']}, which is not a "
            "transformers class: load that model yourself and pass it"
        )
    model = model_class.from_pretrained(base_id, revision=revision, token=token, **kwargs)
    setattr(model, _BASE_ATTRIBUTE, {"base_model_name_or_path": base_id, "revision": revision})
    return model


def _tensor_shapes(path: str) -> dict[str, list[int]]:
    """Tensor name -> shape, from a safetensors header (no tensor is read)."""
    with open_safetensors(path) as f:
        return {key: list(f.get_slice(key).get_shape()) for key in sorted(f.keys())}


def _tensors(path: str) -> dict[str, torch.Tensor]:
    with open_safetensors(path) as f:
        return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def adapter_info(folder, *, revision: str | None = None, token: str | None = None) -> dict:
    """What a gate adapter (folder or Hub id) holds, for `hf-gate-attention info`.

    Returns `{"base_model_name_or_path", "revision", "base_model_class", "base_model": {model_type,
    hidden_size, num_attention_heads, num_key_value_heads, num_hidden_layers}, "gate_config": GateConfig dict,
    "gate_tensors": {name: shape}, "gate_parameters": int, "lora": None or {"config": PEFT's dict,
    "tensors": {name: shape}, "parameters": int}}`.
    """
    config, files = _resolve(folder, revision, token)
    gates = _tensor_shapes(files[GATE_WEIGHTS_NAME])
    lora = None
    if config["lora"]:
        shapes = _tensor_shapes(files[LORA_WEIGHTS_NAME])
        lora = {
            "config": read_json(files[LORA_CONFIG_NAME]),
            "tensors": shapes,
            "parameters": sum(_numel(shape) for shape in shapes.values()),
        }
    return {
        **{k: config[k] for k in ("base_model_name_or_path", "revision", "base_model_class", "base_model")},
        "gate_config": config["gate_config"],
        "gate_tensors": gates,
        "gate_parameters": sum(_numel(shape) for shape in gates.values()),
        "lora": lora,
    }


def _numel(shape: list[int]) -> int:
    return int(torch.Size(shape).numel())


def render_adapter_card(folder, repo_id: str) -> str:
    """The README.md of an adapter repo: the base it needs, the gate, the LoRA if any, how to load it."""
    from huggingface_hub import ModelCard, ModelCardData

    from .card.sections import gate_summary

    info = adapter_info(folder)
    base, gate = info["base_model_name_or_path"], GateConfig.from_dict(info["gate_config"])
    lora = info["lora"]
    data = ModelCardData(
        base_model=base,
        library_name="peft" if lora else None,
        tags=["gated-attention", "hf-gate-attention", "gate-adapter", f"{gate.variant}-gate"]
        + ["lora"] * bool(lora),
    )
    revision = f" at revision `{info['revision']}`" if info["revision"] else ""
    lora_line = (
        f"- a LoRA (r={lora['config']['r']}, on {', '.join(lora['config']['target_modules'])}): "
        f"{lora['parameters']:,} parameters in PEFT's `{LORA_CONFIG_NAME}` / `{LORA_WEIGHTS_NAME}`\n"
        if lora
        else ""
    )
    text = f"""---
{data.to_yaml()}
---

# {repo_id.split("/")[-1]}

A **gate-only adapter** made with hf-gate-attention for the base model `{base}`{revision}
(`{info["base_model_class"]}`); it holds no base weights, only:

- gated attention: {gate_summary(gate)}; {info["gate_parameters"]:,}
  gate parameters in `{GATE_WEIGHTS_NAME}`, the gate config and the base it needs in `{GATE_CONFIG_NAME}`
{lora_line}
## Usage

```python
from hf_gate_attention import load_gate_adapter

# downloads the base and adds the gates{" and the LoRA (a PeftModel)" * bool(lora)}
model = load_gate_adapter("{base}", "{repo_id}")
```
"""
    return str(ModelCard(text))


def push_gate_adapter_to_hub(
    model_or_folder,
    repo_id: str,
    *,
    base_model_name_or_path: str | None = None,
    base_revision: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    token: str | bool | None = None,
    create_pr: bool = False,
    tags: list[str] | None = None,
):
    """Upload a gate adapter with a model card naming its base; returns the `CommitInfo`.

    Args:
        model_or_folder: a patched model (or PEFT LoRA model over one), saved with `save_gate_adapter`, or
            an adapter folder, uploaded as it is (the user's folder is never written to).
        repo_id (`str`): `"namespace/name"`; created if missing.
        base_model_name_or_path, base_revision (*optional*): as in `save_gate_adapter` (model input only).
            The recorded base must be a Hub id: an adapter on the Hub that names a local folder or no base
            cannot be loaded by anyone else, so it is refused (`ValueError`) before any request.
        private, revision, commit_message, commit_description, token, create_pr, tags: as in `push_to_hub`
            (`revision` is the adapter repo's branch).
    """
    from .hub import checked_tags, mirror, resolve_token, upload

    tags = checked_tags(tags)

    folder_input = isinstance(model_or_folder, (str, os.PathLike))
    if folder_input and (base_model_name_or_path or base_revision):
        raise ValueError(
            "base_model_name_or_path/base_revision only apply to a model; a folder records its base"
        )
    if folder_input:
        _resolve(model_or_folder)  # a complete adapter folder, else ValueError
    elif not is_patched(model_or_folder):
        raise ValueError("this model is not patched with gated attention: patch it and train the gates first")
    token = resolve_token(token)
    with tempfile.TemporaryDirectory(prefix="hf-gate-adapter-push-") as tmp:
        folder = Path(tmp) / "adapter"
        if folder_input:
            mirror(Path(model_or_folder), folder)
        else:
            save_gate_adapter(
                model_or_folder,
                folder,
                base_model_name_or_path=base_model_name_or_path,
                base_revision=base_revision,
            )
        base = adapter_info(folder)["base_model_name_or_path"]
        if not is_hub_id(base):
            raise ValueError(
                f"the adapter's base model is {base!r}, not a Hub id: pass "
                "base_model_name_or_path='org/name' (the base's Hub repo) so that others can load the adapter"
            )
        if not (folder / "README.md").exists():
            (folder / "README.md").write_text(render_adapter_card(folder, repo_id), encoding="utf-8")
        return upload(
            folder,
            repo_id,
            token=token,
            private=private,
            revision=revision,
            commit_message=commit_message or DEFAULT_COMMIT_MESSAGE,
            commit_description=commit_description,
            create_pr=create_pr,
            tags=tags,
        )
