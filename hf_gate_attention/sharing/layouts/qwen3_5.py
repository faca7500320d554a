"""Whole checkpoints in transformers' Qwen3.5 text layout (`Qwen3_5ForCausalLM`, `model_type: "qwen3_5_text"`)
from a patched qwen3 causal LM, and back.

A qwen3 model gated with our `output` gate is a Qwen3.5 model whose layers are all full attention
(`layer_types` all `"full_attention"`) with rotary on every channel (`partial_rotary_factor` 1.0):

- each attention layer goes through `qwen3_next.ours_to_qwen3_next_attention` (gate rows packed per head
  after the query rows of `q_proj`, q/k norms `w - 1`); a headwise gate is first expanded to elementwise
  (each head's gate row repeated `D` times); the gate's scale (`GateConfig.gate_scale`, 2 for
  `init="identity"`) is folded into `o_proj.weight`;
- every other RMSNorm (`input_layernorm`, `post_attention_layernorm`, the final `norm`) is zero-centred in
  Qwen3.5 as well (`Qwen3_5RMSNorm`: `x * (1 + w)`): `w - 1`; the MLP is the same SwiGLU
  (`down(act(gate(x)) * up(x))`, no bias), the embeddings are unchanged.

What the serving engines read from `config.json` (read in their source on the stored snapshots):

- vLLM, `vllm/model_executor/models/qwen3_5.py` (commit 00def4f8421153e037ff6270c0a8c31912a00206): the layer
  kind from `config.layer_types[i]` (`Qwen3_5DecoderLayer`); `load_weights` skips a `.bias` the model has no
  parameter for, silently. `vllm/model_executor/models/qwen3_next.py` (commit
  002d6073aa034d4f5545d45021b0e56d1f3c3593), `Qwen3NextAttention`: `attn_output_gate` (default true), the
  q/k/v bias from `qkv_bias` (default false; not `attention_bias`), `o_proj` always without bias, rotary
  from `config.rope_parameters`. `vllm/transformers_utils/configs/qwen3_5.py` (commit
  c04143bb7e0ee85205ce41b129562b48d7b1e741): `rope_parameters` (or `rope_scaling`), `partial_rotary_factor`
  inside it, else top-level (default 0.25); `layer_types`, else `full_attention_interval` (default 4).
- SGLang, `python/sglang/srt/configs/qwen3_next.py` (commit 041bacd339d73f09b23e1f5d916017cc21c55640):
  the layer kinds from `full_attention_interval` only (`layers_block_type`; `layer_types` is dropped), a
  top-level `partial_rotary_factor` (default 0.25) and `rope_theta`; `configs/qwen3_5.py` (commit
  0f6f0002e7c307205aa661654ee3e47d01398838) copies `rope_parameters` into `rope_scaling`.
  `python/sglang/srt/models/qwen3_5.py` (commit 005fa711897e800d45bc46e72e02ab730fca3b31),
  `Qwen3_5AttentionDecoderLayer`: top-level `partial_rotary_factor`, `attn_output_gate` (default true),
  `qkv_proj` and `o_proj` always without bias (their biases skipped silently); its `EntryClass` names
  `Qwen3_5ForConditionalGeneration`, not the text-only `Qwen3_5ForCausalLM`.

So `config.json` gets, beside transformers' keys, `full_attention_interval: 1`, a top-level
`partial_rotary_factor: 1.0` and `rope_theta`, `attn_output_gate: true` and `qkv_bias` (= `attention_bias`).
Attention biases (the gate's, and q/k/v/o) are written only with `keep_biases=True`: SGLang drops all of
them and vLLM `o_proj`'s. All zero, they are left out (`attention_bias: false`, the same function).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers.utils import cached_file

from ...core.config import GateConfig
from ...core.families import DECODER
from ...core.hooks import GATE_MODULE_NAME, blocks_by_layer, unwrap_model
from ...core.patching import patch
from ...files import atomic_write_json, read_json, staged_folder
from ..tensors import checkpoint_tensors
from .packing import head_geometry
from .paper import HUB_KWARGS, _load_strict, exportable_state
from .qwen3_next import check_qwen3_next_match, ours_to_qwen3_next_attention, qwen3_next_attention_to_ours

QWEN3_5_MODEL_TYPE = "qwen3_5_text"
QWEN3_5_ARCHITECTURE = "Qwen3_5ForCausalLM"
QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
# config fields with the same name and meaning in Qwen3Config and Qwen3_5TextConfig
SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "use_cache",
    "tie_word_embeddings",
    "attention_dropout",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
_PROJECTIONS = (DECODER.query, DECODER.key, DECODER.value, DECODER.output)  # q_proj, k_proj, v_proj, o_proj
_ATTENTION_NORMS = ("q_norm", "k_norm")


def _rms_norm_keys(model: nn.Module, skip: tuple[str, ...] = ()) -> list[str]:
    """`<module>.weight` of every RMSNorm (by class name) outside the modules named `skip`."""
    return [
        f"{name}.weight"
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RMSNorm") and name.rsplit(".", 1)[-1] not in skip
    ]


def qwen3_5_config(config, attention_bias: bool) -> transformers.Qwen3_5TextConfig:
    """The `Qwen3_5TextConfig` computing what the qwen3 `config` computes: `SHARED_FIELDS` copied, every layer
    full attention, `rope_parameters` with `partial_rotary_factor` 1.0, the given `attention_bias`."""
    rope = {**dict(config.rope_parameters or {}), "partial_rotary_factor": 1.0}
    next_config = transformers.Qwen3_5TextConfig(
        **{field: getattr(config, field) for field in SHARED_FIELDS},
        layer_types=["full_attention"] * config.num_hidden_layers,
        rope_parameters=rope,
        attention_bias=attention_bias,
        architectures=[QWEN3_5_ARCHITECTURE],
    )
    next_config.dtype = config.dtype
    return next_config


def engine_config_keys(next_config) -> dict:
    """The `config.json` keys the serving engines read instead of transformers' (module docstring)."""
    rope = next_config.rope_parameters
    return {
        "full_attention_interval": 1,  # SGLang: every layer full attention
        "partial_rotary_factor": rope["partial_rotary_factor"],  # SGLang reads it top-level
        "rope_theta": rope["rope_theta"],  # SGLang's Qwen3NextConfig reads it top-level
        "attn_output_gate": True,  # both engines default to true; explicit
        "qkv_bias": next_config.attention_bias,  # vLLM reads qkv_bias, not attention_bias
    }


def _export_problems(model: nn.Module, gate: GateConfig) -> list[str]:
    """What a Qwen3.5 checkpoint cannot represent in this patched model (empty when it can)."""
    config = model.config
    problems = []
    if config.model_type != "qwen3":
        problems.append(
            f"model_type {config.model_type!r} (accepted: 'qwen3'; Qwen3.5 attention has q/k norms)"
        )
    elif type(model).__name__ != QWEN3_ARCHITECTURE:
        problems.append(f"class {type(model).__name__} (accepted: {QWEN3_ARCHITECTURE})")
    if gate.variant != "output":
        problems.append(f"variant={gate.variant!r} (Qwen3.5 gates the attention output: 'output')")
    if gate.top_k is not None:
        problems.append(f"top_k={gate.top_k} (Qwen3.5's gates are dense)")
    every = set(blocks_by_layer(model))
    gated = every if gate.layers is None else set(gate.layers)
    if gated != every:
        problems.append(
            f"gates on layers {sorted(gated)} only (Qwen3.5 gates every layer, and no sigmoid gate is "
            f"constant 1: the {len(every) - len(gated)} ungated layers cannot be written)"
        )
    sliding = [
        i for i, kind in enumerate(getattr(config, "layer_types", None) or []) if kind != "full_attention"
    ]
    if sliding:
        problems.append(f"layers {sliding} use sliding-window attention (Qwen3.5's full attention has none)")
    return problems


def _check_biases(state: dict, keep_biases: bool) -> bool:
    """Whether the attention biases must be written (`attention_bias`): some is nonzero. Without `keep_biases`
    a nonzero one is a `ValueError` (the engines would drop it silently)."""
    suffixes = tuple(f".{name}.bias" for name in (*_PROJECTIONS, GATE_MODULE_NAME))
    nonzero = [key for key, tensor in state.items() if key.endswith(suffixes) and tensor.any()]
    if nonzero and not keep_biases:
        raise ValueError(
            f"nonzero attention biases ({', '.join(nonzero[:3])}{', ...' if len(nonzero) > 3 else ''}): "
            "transformers' Qwen3.5 loads them with attention_bias, but SGLang's Qwen3.5 attention has no "
            "bias and vLLM's no o_proj bias, and both drop them silently; pass keep_biases=True "
            "(--keep-biases) to write them anyway (exact in transformers)"
        )
    return bool(nonzero)


def _block_state(state: dict, block: str) -> dict:
    prefix = f"{block}."
    return {key[len(prefix) :]: tensor for key, tensor in state.items() if key.startswith(prefix)}


def qwen3_5_state_dict(model: nn.Module, *, keep_biases: bool = False) -> tuple[dict, object]:
    """`(state dict, Qwen3_5TextConfig)` of the Qwen3.5 model computing what a patched qwen3 causal LM
    computes; `ValueError` (every reason at once) for what Qwen3.5 cannot represent (`_export_problems`,
    `_check_biases`). Tensors keep the model's dtype (the norm shift `w - 1` is exact in float32 for
    `w` in [0.5, 2])."""
    base, gate, state = exportable_state(model, "Qwen3.5's layout", _export_problems)
    biased = _check_biases(state, keep_biases)
    next_config = qwen3_5_config(base.config, attention_bias=biased)
    geometry = head_geometry(base.config)
    biased_config = copy.copy(base.config)  # the qwen3 block as written: biases zero-filled or left out
    biased_config.attention_bias = biased
    for block_module in blocks_by_layer(base).values():
        block = next(name for name, module in base.named_modules() if module is block_module)
        attention = _block_state(state, block)
        dtypes = {key: tensor.dtype for key, tensor in attention.items()}
        for name in _PROJECTIONS:  # all present with attention_bias, none without
            weight = attention[f"{name}.weight"]
            if biased:
                attention.setdefault(f"{name}.bias", weight.new_zeros(weight.shape[0]))
            else:
                attention.pop(f"{name}.bias", None)
        if gate.granularity == "headwise":  # (H, ...) -> (H*D, ...): each head's row D times
            for name in ("weight", "bias"):
                key = f"{GATE_MODULE_NAME}.{name}"
                attention[key] = attention[key].repeat_interleave(geometry["head_dim"], dim=0)
        output = f"{DECODER.output}.weight"
        attention[output] = attention[output] * gate.gate_scale  # s * sigmoid(z) -> sigmoid(z), s folded
        converted = ours_to_qwen3_next_attention(attention, biased_config, next_config)
        for key in [key for key in state if key.startswith(f"{block}.")]:
            del state[key]
        for key, tensor in converted.items():  # the norms come back in float32
            state[f"{block}.{key}"] = tensor.to(dtypes.get(key, tensor.dtype))
    for key in _rms_norm_keys(base, skip=_ATTENTION_NORMS):
        state[key] = (state[key].float() - 1.0).to(state[key].dtype)
    return state, next_config


def write_qwen3_5_checkpoint(model: nn.Module, folder, *, keep_biases: bool = False) -> None:
    """Write a patched qwen3 causal LM into the existing `folder` as a transformers `Qwen3_5ForCausalLM`
    checkpoint (`save_pretrained`: `config.json`, `model.safetensors`, `generation_config.json`), with the
    serving engines' keys added to `config.json` (`engine_config_keys`). No remote code, no gate config.
    Refusals: `qwen3_5_state_dict`. Not atomic: `save_as_qwen3_5` is."""
    state, next_config = qwen3_5_state_dict(model, keep_biases=keep_biases)
    with torch.device("meta"):  # no second copy of the weights: the converted tensors are assigned
        target = transformers.Qwen3_5ForCausalLM(next_config)
    _load_strict(target, state, "this model", assign=True)
    generation_config = getattr(unwrap_model(model), "generation_config", None)
    if generation_config is not None:
        target.generation_config = copy.deepcopy(generation_config)
    target.save_pretrained(folder)
    config_file = Path(folder) / "config.json"
    atomic_write_json(config_file, {**read_json(config_file), **engine_config_keys(next_config)})


def save_as_qwen3_5(model: nn.Module, folder, *, overwrite: bool = False, keep_biases: bool = False) -> None:
    """`write_qwen3_5_checkpoint` into a new `folder`, atomically (a staging folder beside it, then renamed);
    an existing non-empty `folder` is replaced only with `overwrite`."""
    with staged_folder(folder, overwrite=overwrite) as staging:
        write_qwen3_5_checkpoint(model, staging, keep_biases=keep_biases)


def is_qwen3_5_config(config: dict) -> bool:
    """Whether a `config.json` dict is a Qwen3.5 text checkpoint (`model_type: "qwen3_5_text"`)."""
    return config.get("model_type") == QWEN3_5_MODEL_TYPE


def qwen3_config_from_qwen3_5(next_config) -> transformers.Qwen3Config:
    """The qwen3 config of a Qwen3.5 text config whose layers are all full attention (`ValueError` else)."""
    hybrid = [i for i, kind in enumerate(next_config.layer_types) if kind != "full_attention"]
    if hybrid:
        raise ValueError(
            f"layers {hybrid} of this Qwen3.5 checkpoint are {next_config.layer_types[hybrid[0]]!r}: only "
            "checkpoints whose layers are all full attention convert to a gated qwen3"
        )
    if not getattr(next_config, "attn_output_gate", True):
        raise ValueError("this Qwen3.5 checkpoint sets attn_output_gate=false: it has no gate to convert")
    rope = {k: v for k, v in dict(next_config.rope_parameters).items() if k != "partial_rotary_factor"}
    config = transformers.Qwen3Config(
        **{field: getattr(next_config, field) for field in SHARED_FIELDS},
        rope_parameters=rope,
        attention_bias=next_config.attention_bias,
        architectures=[QWEN3_ARCHITECTURE],
    )
    check_qwen3_next_match(next_config, config)  # partial_rotary_factor 1
    return config


def load_qwen3_5_checkpoint(path: str, *, backend: str = "auto", dtype="auto", **hub_kwargs):
    """Load a Qwen3.5 text checkpoint whose layers are all full attention as our patched `Qwen3ForCausalLM`
    (`GateConfig(variant="output", granularity="elementwise", init="paper")`), the inverse of
    `write_qwen3_5_checkpoint`: `qwen3_next.qwen3_next_attention_to_ours` per layer, norms `1 + w`."""
    unknown = sorted(set(hub_kwargs) - set(HUB_KWARGS))
    if unknown:
        raise ValueError(f"unsupported argument(s) for a Qwen3.5 checkpoint: {', '.join(unknown)}")
    config_dict = read_json(cached_file(path, "config.json", **hub_kwargs))
    if not is_qwen3_5_config(config_dict):
        raise ValueError(
            f"{path} has model_type={config_dict.get('model_type')!r}, not {QWEN3_5_MODEL_TYPE!r} (a "
            "multimodal 'qwen3_5' checkpoint holds its text model in text_config)"
        )
    next_config = transformers.AutoConfig.from_pretrained(path, **hub_kwargs)
    config = qwen3_config_from_qwen3_5(next_config)
    state = checkpoint_tensors(path, **hub_kwargs)
    if dtype == "auto":
        dtype = next(iter(state.values())).dtype
    model = transformers.Qwen3ForCausalLM._from_config(config, dtype=dtype)
    patch(model, GateConfig(variant="output", granularity="elementwise", init="paper"), backend=backend)
    for block_module in blocks_by_layer(model).values():
        block = next(name for name, module in model.named_modules() if module is block_module)
        converted = qwen3_next_attention_to_ours(_block_state(state, block), next_config, config)
        state = {key: tensor for key, tensor in state.items() if not key.startswith(f"{block}.")}
        state.update({f"{block}.{key}": tensor for key, tensor in converted.items()})
    for key in _rms_norm_keys(model, skip=_ATTENTION_NORMS):
        state[key] = state[key].float() + 1.0
    _load_strict(model, state, path)
    return model.eval()
