"""Qwen3-Next / Qwen3.5 attention layers (transformers' `Qwen3NextAttention`): the gate packed per head into
`q_proj` (`packing.py`, always elementwise) and zero-centred q/k norms, converted at state-dict level to and
from one patched qwen3 attention block.
"""

from __future__ import annotations

from ...core.families import DECODER
from ...core.hooks import GATE_MODULE_NAME
from .packing import head_geometry, pack_q_proj, split_q_proj

# Qwen3-Next config fields that must equal the target qwen3 config's for the attention to compute the same
QWEN3_NEXT_MATCHING_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "attention_bias",
)
_QUERY = DECODER.query  # "q_proj" in qwen3


def check_qwen3_next_match(next_config, config) -> None:
    """`ValueError` unless one full-attention layer of `next_config` (Qwen3-Next) and one attention block of
    `config` (qwen3) compute the same function up to the gate's layout: the fields of
    `QWEN3_NEXT_MATCHING_FIELDS` and the rotary parameters equal, and `partial_rotary_factor` 1 (qwen3 rotates
    every channel of a head; Qwen3-Next by default only the first quarter)."""
    problems = []
    if config.model_type != "qwen3":
        problems.append(
            f"the target model_type is {config.model_type!r}, not 'qwen3' (Qwen3-Next has q/k norms)"
        )
    for field in QWEN3_NEXT_MATCHING_FIELDS:
        theirs, ours = getattr(next_config, field, None), getattr(config, field, None)
        if theirs != ours:
            problems.append(f"{field} {theirs} (Qwen3-Next) != {ours}")
    next_rope, our_rope = dict(next_config.rope_parameters or {}), dict(config.rope_parameters or {})
    for side, rope in (("Qwen3-Next", next_rope), ("qwen3", our_rope)):
        factor = rope.pop("partial_rotary_factor", 1.0)
        if factor != 1.0:
            problems.append(f"partial_rotary_factor {factor} ({side}) != 1.0 (qwen3 rotates every channel)")
    if next_rope != our_rope:
        problems.append(f"rotary parameters {next_rope} (Qwen3-Next) != {our_rope}")
    if problems:
        raise ValueError(f"Qwen3-Next attention cannot become this qwen3 attention: {'; '.join(problems)}")


def qwen3_next_attention_to_ours(state: dict, next_config, config) -> dict:
    """One Qwen3-Next attention layer's tensors -> one patched qwen3 attention block's.

    Keys are relative to the layer (`q_proj.weight`, `k_proj.weight`, ..., `q_norm.weight`, `k_norm.weight`,
    biases with `attention_bias`). `q_proj (2*H*D, hidden)` is split per head into the query rows and
    `attn_gate.weight (H*D, hidden)` (elementwise, `init="paper"`); `attn_gate.bias` is the gate part of
    `q_proj.bias`, or zeros. Qwen3-Next's zero-centred norms `x * (1 + w)` become qwen3's `x * w'` with
    `w' = 1 + w` computed in float32, as Qwen3-Next computes it (returned in float32). The configs must match
    (`check_qwen3_next_match`).
    """
    check_qwen3_next_match(next_config, config)
    geometry = head_geometry(config)
    converted = dict(state)
    for name in ("weight", "bias"):
        packed = converted.pop(f"{_QUERY}.{name}", None)
        if packed is not None:
            converted[f"{_QUERY}.{name}"], converted[f"{GATE_MODULE_NAME}.{name}"] = split_q_proj(
                packed, "qwen3_next", **geometry
            )
    gate_weight = converted[f"{GATE_MODULE_NAME}.weight"]
    converted.setdefault(f"{GATE_MODULE_NAME}.bias", gate_weight.new_zeros(gate_weight.shape[0]))
    for norm in ("q_norm.weight", "k_norm.weight"):
        converted[norm] = state[norm].float() + 1.0
    return converted


def ours_to_qwen3_next_attention(state: dict, config, next_config) -> dict:
    """The inverse of `qwen3_next_attention_to_ours`: one patched qwen3 attention block's tensors (keys
    relative to the block, `attn_gate` elementwise with `init="paper"`) -> one Qwen3-Next attention layer's.

    Norms: `w = w' - 1` in float32. Without `attention_bias` a nonzero gate bias cannot be represented
    (`ValueError`). Exact round trip when `1 + w` is exact in float32 (e.g. bfloat16 norm weights).
    """
    check_qwen3_next_match(next_config, config)
    geometry = head_geometry(config)
    converted = dict(state)
    gate_weight = converted.pop(f"{GATE_MODULE_NAME}.weight")
    gate_bias = converted.pop(f"{GATE_MODULE_NAME}.bias")
    if gate_weight.shape[0] != geometry["num_heads"] * geometry["head_dim"]:
        raise ValueError(
            f"attn_gate.weight has {gate_weight.shape[0]} rows; Qwen3-Next gates are elementwise "
            f"({geometry['num_heads']} heads * head_dim {geometry['head_dim']} rows)"
        )
    converted[f"{_QUERY}.weight"] = pack_q_proj(
        converted[f"{_QUERY}.weight"], gate_weight, "qwen3_next", **geometry
    )
    if f"{_QUERY}.bias" in converted:
        converted[f"{_QUERY}.bias"] = pack_q_proj(
            converted[f"{_QUERY}.bias"], gate_bias, "qwen3_next", **geometry
        )
    elif gate_bias.any():
        raise ValueError(
            "the gate bias is nonzero but attention_bias is false: Qwen3-Next keeps the gate bias in "
            "q_proj.bias"
        )
    for norm in ("q_norm.weight", "k_norm.weight"):
        converted[norm] = state[norm].float() - 1.0
    return converted
