"""The paper's checkpoints (Qiu et al., github.com/qiuzh20/gated_attention): `model_type: "qwen3"` with
the flags `headwise_attn_output_gate` / `elementwise_attn_output_gate` and the gate packed per key/value
group into `q_proj` (`packing.py`). Loaded as our patched Qwen3 (or Llama) with `load_paper_checkpoint`,
written with `save_in_paper_layout`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from torch import nn
from transformers.utils import cached_file

from ...core.config import GateConfig
from ...core.families import DECODER
from ...core.hooks import CONFIG_ATTRIBUTE, GATE_MODULE_NAME, blocks_by_layer, unwrap_model
from ...core.patching import gate_config_of, is_patched, patch
from ...core.variants import names_where
from ...files import atomic_write_json, read_json, staged_folder
from ..tensors import checkpoint_tensors
from .packing import head_geometry, pack_q_proj, split_q_proj

PAPER_FLAGS = {"headwise": "headwise_attn_output_gate", "elementwise": "elementwise_attn_output_gate"}
# config keys of the paper's Qwen3 that transformers' classes do not have
PAPER_ONLY_KEYS = (*PAPER_FLAGS.values(), "use_qk_norm", "qkv_bias")
# Qwen3 config keys that transformers' Llama does not have (sliding windows)
QWEN3_ONLY_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")
# our model type -> the paper's `use_qk_norm` (q/k RMSNorm per head); both put the bias on q, k, v and o
PAPER_MODEL_TYPES = {"qwen3": True, "llama": False}
PAPER_ARCHITECTURE = "Qwen3ForCausalLM"
HUB_KWARGS = ("revision", "token", "cache_dir", "subfolder", "local_files_only", "force_download")
(PAPER_VARIANT,) = names_where(lambda variant: "paper" in variant.layouts)  # the gate the layout holds
_QUERY, _OUTPUT = DECODER.query, DECODER.output  # "q_proj", "o_proj" in llama and qwen3


def paper_gate(granularity: str) -> GateConfig:
    """The gate of a checkpoint in the paper's layout: `sigmoid(z)` on the attention output."""
    return GateConfig(variant=PAPER_VARIANT, granularity=granularity, init="paper")


def is_paper_config(config: dict) -> bool:
    """Whether a `config.json` dict is a gated checkpoint in the paper's layout (either flag set)."""
    return any(bool(config.get(flag)) for flag in PAPER_FLAGS.values())


def paper_granularity(config: dict, source: str = "this checkpoint") -> str:
    """`"headwise"` or `"elementwise"` from the paper's flags; `ValueError` unless exactly one is set."""
    set_flags = [granularity for granularity, flag in PAPER_FLAGS.items() if config.get(flag)]
    if len(set_flags) != 1:
        state = "sets both" if set_flags else "sets neither of"
        raise ValueError(
            f"{source} {state} {' and '.join(PAPER_FLAGS.values())}; a gated checkpoint in the paper's "
            "layout sets exactly one (neither: an ungated baseline, load it with transformers)"
        )
    if config.get("model_type") != "qwen3":
        raise ValueError(
            f"{source} has model_type={config.get('model_type')!r}; the paper's layout is model_type 'qwen3'"
        )
    return set_flags[0]


def config_from_paper(config: dict) -> transformers.PretrainedConfig:
    """The transformers config of a paper checkpoint's `config.json` dict: `Qwen3Config` when it uses q/k
    norms (`use_qk_norm`, default true), else `LlamaConfig`; `attention_bias` = `qkv_bias` (both classes put
    the bias on q, k, v and o, as the paper's code does); the paper-only keys and `auto_map` removed."""
    use_qk_norm = config.get("use_qk_norm", True)
    model_type = "qwen3" if use_qk_norm else "llama"
    if not use_qk_norm and config.get("use_sliding_window"):
        raise ValueError(
            "use_qk_norm=false with use_sliding_window=true: transformers' Llama has no sliding window"
        )
    dropped = {
        *PAPER_ONLY_KEYS,
        "auto_map",
        "model_type",
        *(QWEN3_ONLY_KEYS if model_type == "llama" else ()),
    }
    data = {key: value for key, value in config.items() if key not in dropped}
    data["attention_bias"] = bool(config.get("qkv_bias", False))
    data["architectures"] = [f"{'Qwen3' if use_qk_norm else 'Llama'}ForCausalLM"]
    return transformers.CONFIG_MAPPING[model_type].from_dict(data)


def config_to_paper(model_config, granularity: str, qkv_bias: bool) -> dict:
    """The `config.json` dict in the paper's layout of a llama or qwen3 config gated with `granularity`,
    with `qkv_bias` (and `attention_bias`, which the paper's code does not read) set to `qkv_bias`.

    The paper's code reads `rope_theta` and `rope_scaling` (transformers 5 keeps both in `rope_parameters`).
    """
    data = model_config.to_dict()
    for key in (CONFIG_ATTRIBUTE, "auto_map", "rope_parameters"):
        data.pop(key, None)
    rope = dict(model_config.rope_parameters or {})
    data["rope_theta"] = rope.pop("rope_theta")
    data["rope_scaling"] = None if rope.get("rope_type", "default") == "default" and len(rope) <= 1 else rope
    data.update(
        model_type="qwen3",
        architectures=[PAPER_ARCHITECTURE],
        use_qk_norm=PAPER_MODEL_TYPES[model_config.model_type],
        qkv_bias=qkv_bias,
        attention_bias=qkv_bias,
        **{flag: name == granularity for name, flag in PAPER_FLAGS.items()},
    )
    return data


def _attention_blocks(state: dict) -> list[str]:
    """Prefixes of the attention blocks (`model.layers.3.self_attn`) in a llama/qwen3 state dict."""
    suffix = f".{_QUERY}.weight"
    return sorted(
        key[: -len(suffix)]
        for key in state
        if key.endswith(suffix) and DECODER.match_block(key[: -len(suffix)]) is not None
    )


def _check_output_width(state: dict, block: str, geometry: dict) -> None:
    width = state[f"{block}.{_OUTPUT}.weight"].shape[1]
    expected = geometry["num_heads"] * geometry["head_dim"]
    if width != expected:
        raise ValueError(
            f"{block}.{_OUTPUT} takes {width} inputs but num_attention_heads * head_dim = "
            f"{geometry['num_heads']} * {geometry['head_dim']} = {expected}: the head counts do not match "
            "the weights"
        )


def paper_state_dict_to_ours(state: dict, config: dict) -> dict:
    """A paper checkpoint's tensors (config dict `config`) -> the state dict of our patched model: each
    `q_proj` split into the query rows and `attn_gate.weight`; `attn_gate.bias` from `q_proj.bias` (zeros
    when `qkv_bias` is false)."""
    granularity = paper_granularity(config)
    geometry = head_geometry(config)
    converted = dict(state)
    for block in _attention_blocks(state):
        _check_output_width(state, block, geometry)
        query_weight, gate_weight = split_q_proj(
            converted.pop(f"{block}.{_QUERY}.weight"), "paper", **geometry, granularity=granularity
        )
        converted[f"{block}.{_QUERY}.weight"] = query_weight
        converted[f"{block}.{GATE_MODULE_NAME}.weight"] = gate_weight
        bias = converted.pop(f"{block}.{_QUERY}.bias", None)
        if bias is None:
            gate_bias = gate_weight.new_zeros(gate_weight.shape[0])
        else:
            converted[f"{block}.{_QUERY}.bias"], gate_bias = split_q_proj(
                bias, "paper", **geometry, granularity=granularity
            )
        converted[f"{block}.{GATE_MODULE_NAME}.bias"] = gate_bias
    return converted


def ours_state_dict_to_paper(state: dict, model_config, biased: bool) -> dict:
    """Our patched llama/qwen3 state dict -> the paper's tensors: `attn_gate` packed into `q_proj`.

    `biased` (the exported `qkv_bias`): the gate bias goes into `q_proj.bias`; k, v and o biases the model
    lacks are written as zeros (the same function). Without it a nonzero gate bias is refused.
    """
    geometry = head_geometry(model_config)
    converted = dict(state)
    for block in _attention_blocks(state):
        gate_weight = converted.pop(f"{block}.{GATE_MODULE_NAME}.weight")
        gate_bias = converted.pop(f"{block}.{GATE_MODULE_NAME}.bias")
        if biased:
            for projection in (_QUERY, DECODER.key, DECODER.value, _OUTPUT):
                rows = converted[f"{block}.{projection}.weight"].shape[0]
                converted.setdefault(f"{block}.{projection}.bias", gate_bias.new_zeros(rows))
            query_bias = converted[f"{block}.{_QUERY}.bias"]
            converted[f"{block}.{_QUERY}.bias"] = pack_q_proj(query_bias, gate_bias, "paper", **geometry)
        elif gate_bias.any():
            raise ValueError(
                f"{block}: a nonzero gate bias needs biased=True (qkv_bias) in the paper's layout"
            )
        query_weight = converted[f"{block}.{_QUERY}.weight"]
        converted[f"{block}.{_QUERY}.weight"] = pack_q_proj(query_weight, gate_weight, "paper", **geometry)
    return converted


def paper_checkpoint_contents(folder: str) -> dict:
    """What a local checkpoint folder in the paper's layout holds, as `card.read_checkpoint` says it of ours:
    `config`, `gate` (`init="paper"`), `total_params`, `added_params` (the gate rows of every `q_proj`),
    `gated_layers`, `gates_are_identity` (never: `sigmoid` starts at 0.5), plus `gate_tensors` (our
    `attn_gate` keys, split out of `q_proj`; only the attention projections are read)."""
    from ..card.inputs import parameter_count

    config = read_json(Path(folder) / "config.json")
    granularity = paper_granularity(config, source=folder)
    projections = (f".{_QUERY}.", f".{_OUTPUT}.weight")
    state = checkpoint_tensors(folder, lambda key: any(part in key for part in projections))
    gates = {
        key: tensor
        for key, tensor in paper_state_dict_to_ours(state, config).items()
        if f".{GATE_MODULE_NAME}." in key
    }
    stored = [t for k, t in gates.items() if k.endswith(".weight") or config.get("qkv_bias")]
    return {
        "config": config,
        "gate": paper_gate(granularity),
        "total_params": parameter_count(Path(folder)),
        "added_params": sum(tensor.numel() for tensor in stored),
        "gated_layers": len(gates) // 2,
        "gates_are_identity": False,
        "gate_tensors": gates,
    }


def _tied_aliases(model: nn.Module) -> list[set[str]]:
    """Groups of state_dict keys that name one tensor (tied input and output embeddings)."""
    by_tensor: dict[int, set[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), set()).add(key)
    return [keys for keys in by_tensor.values() if len(keys) > 1]


def exportable_state(model: nn.Module, layout: str, export_problems) -> tuple:
    """`(base model, GateConfig, detached state dict)` of a patched `model` to write in `layout` (named in
    the messages); `ValueError` if it is not patched, or listing what `export_problems(base, gate)` says the
    layout cannot represent."""
    if not is_patched(model):
        raise ValueError(f"this model is not patched with gated attention; nothing to export in {layout}")
    base = unwrap_model(model)
    gate = gate_config_of(base)
    problems = export_problems(base, gate)
    if problems:
        raise ValueError(f"{layout} cannot represent this model: {'; '.join(problems)}")
    return base, gate, {key: tensor.detach() for key, tensor in base.state_dict().items()}


def _load_strict(model: nn.Module, state: dict, source: str, assign: bool = False) -> None:
    """Load `state` into `model`; tied keys may be given once; any other missing or extra key is an error.
    `assign`: the tensors become the parameters (a model built on the meta device)."""
    state = dict(state)
    for keys in _tied_aliases(model):
        given = sorted(keys & set(state))
        if given:
            state.update({key: state[given[0]] for key in keys - set(given)})
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"the converted weights of {source} do not match {type(model).__name__}: missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    model.load_state_dict(state, strict=True, assign=assign)


def load_paper_checkpoint(
    path: str,
    model_class=None,
    *,
    backend: str = "auto",
    dtype: torch.dtype | str = "auto",
    attn_implementation: str | None = None,
    **hub_kwargs,
):
    """Load a checkpoint in the paper's layout as our patched transformers model.

    The result is transformers' `Qwen3ForCausalLM` (or `LlamaForCausalLM` for `use_qk_norm: false`) patched
    with `GateConfig(variant="output", granularity=<the flag set>, init="paper")`; its gate weight holds the
    gate rows of each `q_proj` (see `split_q_proj`), its bias the gate part of `q_proj.bias` or zeros.
    Every tensor is loaded strictly (a missing or unexpected key is a `ValueError`).

    Args:
        path (`str`): local folder or Hub repo id with `config.json` and safetensors weights.
        model_class (*optional*): a transformers class or Auto class; defaults to `AutoModelForCausalLM`.
        backend (`str`, *optional*, defaults to `"auto"`): what runs the gates, as in `patch`.
        dtype (`torch.dtype` or `"auto"`): the model's dtype; `"auto"` keeps the dtype of the saved weights.
        attn_implementation (`str`, *optional*): transformers' attention implementation (`"sdpa"`, `"eager"`).
        hub_kwargs: `revision`, `token`, `cache_dir`, `subfolder`, `local_files_only`, `force_download`.
    """
    unknown = sorted(set(hub_kwargs) - set(HUB_KWARGS))
    if unknown:
        raise ValueError(
            f"unsupported argument(s) for a checkpoint in the paper's layout: {', '.join(unknown)}; "
            f"accepted: backend, dtype, attn_implementation, {', '.join(HUB_KWARGS)}"
        )
    config_dict = read_json(cached_file(path, "config.json", **hub_kwargs))
    granularity = paper_granularity(config_dict, source=path)
    state = paper_state_dict_to_ours(checkpoint_tensors(path, **hub_kwargs), config_dict)
    if dtype == "auto":  # the dtype of the saved weights
        dtype = next(iter(state.values())).dtype
    options = {"dtype": dtype}
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    model_class = model_class or transformers.AutoModelForCausalLM
    model = model_class.from_config(config_from_paper(config_dict), **options)
    patch(model, paper_gate(granularity), backend=backend)
    _load_strict(model, state, path)
    return model.eval()


def _paper_export_problems(model: nn.Module, gate: GateConfig) -> list[str]:
    """What the paper's layout cannot represent in this patched model (empty when it can)."""
    config = model.config
    problems = []
    if config.model_type not in PAPER_MODEL_TYPES:
        problems.append(f"model_type {config.model_type!r} (accepted: {', '.join(PAPER_MODEL_TYPES)})")
    elif type(model).__name__ != f"{'Qwen3' if config.model_type == 'qwen3' else 'Llama'}ForCausalLM":
        problems.append(f"class {type(model).__name__} (the paper's checkpoints are causal LMs)")
    if "paper" not in gate.gate_variant.layouts:
        problems.append(f"variant={gate.variant!r} (the paper's gate is {PAPER_VARIANT!r})")
    if gate.init != "paper":
        problems.append(
            f"init={gate.init!r}: its gate is 2*sigmoid(z), and no sigmoid(z') equals it everywhere (the "
            "paper's gate is sigmoid(z), init='paper')"
        )
    if gate.top_k is not None:
        problems.append(f"top_k={gate.top_k} (the paper's gates are dense)")
    every = set(blocks_by_layer(model))
    gated = every if gate.layers is None else set(gate.layers)
    if gated != every:
        problems.append(f"gates on layers {sorted(gated)} only (the paper's layout gates all {len(every)})")
    if getattr(config, "mlp_bias", False):
        problems.append("mlp_bias=true (the paper's MLP has no bias)")
    return problems


def write_paper_layout(model: nn.Module, folder) -> None:
    """Write a patched llama/qwen3 causal LM into the existing `folder` in the paper's layout: `config.json`
    (model_type qwen3 with its gate flags) and `model.safetensors` (gates packed into `q_proj`).

    Refuses (`ValueError`, every reason at once) what the layout cannot represent: `init="identity"`, variants
    other than `output`, `top_k`, gates on some layers only, model types other than llama/qwen3, Llama's
    `mlp_bias`. A nonzero gate bias in a model without attention bias is written with `qkv_bias: true` and
    zero k, v, o and query biases (the same function). Not atomic: `save_in_paper_layout` is.
    """
    base, gate, state = exportable_state(model, "the paper's layout", _paper_export_problems)
    gate_biases = (state[key] for key in state if key.endswith(f".{GATE_MODULE_NAME}.bias"))
    biased = bool(base.config.attention_bias) or any(bias.any() for bias in gate_biases)
    paper_state = ours_state_dict_to_paper(state, base.config, biased)
    if base.config.tie_word_embeddings:  # saved once, as the input embeddings (as transformers saves it)
        (output_name,) = (
            name for name, module in base.named_modules() if module is base.get_output_embeddings()
        )
        del paper_state[f"{output_name}.weight"]
    tensors = {key: tensor.contiguous().clone() for key, tensor in paper_state.items()}
    save_file(tensors, Path(folder) / "model.safetensors", metadata={"format": "pt"})
    atomic_write_json(Path(folder) / "config.json", config_to_paper(base.config, gate.granularity, biased))


def save_in_paper_layout(model: nn.Module, folder, *, overwrite: bool = False) -> None:
    """`write_paper_layout` into a new `folder`, atomically: written to a temporary folder beside it, then
    renamed; an existing non-empty `folder` is replaced only with `overwrite`."""
    with staged_folder(folder, overwrite=overwrite) as staging:
        write_paper_layout(model, staging)
