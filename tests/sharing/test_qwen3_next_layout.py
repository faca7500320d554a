"""Qwen3-Next's attention layers (query and gate interleaved per head in `q_proj`), converted to and from
ours: the reference is written from Qwen3-Next's formulas (`layout_references.py`), independently of the
converter and checked against transformers' own layer."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import tiny_model
from layout_references import HEAD_DIM, HEADS, HIDDEN, KV_HEADS, causal_attention, rms_norm, rotate
from torch.nn import functional as F

from hf_gate_attention import GateConfig, patch
from hf_gate_attention.sharing.layouts import ours_to_qwen3_next_attention, qwen3_next_attention_to_ours

# ---- Qwen3-Next attention layers ------------------------------------------------------------------------


def _qwen3_next_config(**overrides):
    keys = {
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "partial_rotary_factor": 1.0,
        "rms_norm_eps": 1e-6,
        "num_hidden_layers": 1,
        "layer_types": ["full_attention"],
        **overrides,
    }
    config = transformers.Qwen3NextConfig(**keys)
    config._attn_implementation = "eager"
    return config


def _qwen3_next_layer(attention_bias: bool):
    """transformers' Qwen3NextAttention with random weights, norms bfloat16-representable (exact 1 + w)."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    config = _qwen3_next_config(attention_bias=attention_bias)
    torch.manual_seed(7)
    layer = modeling.Qwen3NextAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, param in layer.named_parameters():
            scale = 0.1 if "norm" in name else 0.2
            param.copy_((torch.randn(param.shape) * scale).bfloat16().float())
    return config, layer


def _qwen3_block(attention_bias: bool):
    model = patch(
        tiny_model("qwen3", attention_bias=attention_bias),
        GateConfig(granularity="elementwise", init="paper"),
    )
    return model, model.model.layers[0].self_attn


def _layer_inputs(model):
    hidden = torch.randn(2, 6, HIDDEN, generator=torch.Generator().manual_seed(11))
    position_embeddings = model.model.rotary_emb(hidden, torch.arange(6)[None])
    mask = torch.full((6, 6), torch.finfo(torch.float32).min).triu(1)[None, None]  # (1, 1, T, T) additive
    return hidden, position_embeddings, mask


def _qwen3_next_reference(state: dict, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Qwen3-Next full attention from its formulas: q_proj(x).view(B, T, H, 2D).chunk(2) -> [q_h | g_h],
    zero-centred q/k norms x * (1 + w), RoPE, attention, then attn_out * sigmoid(gate) before o_proj."""
    batch, length, _ = hidden.shape

    def linear(name, inputs):
        return F.linear(inputs, state[f"{name}.weight"], state.get(f"{name}.bias"))

    q, gate = linear("q_proj", hidden).view(batch, length, HEADS, 2 * HEAD_DIM).chunk(2, dim=-1)
    k = linear("k_proj", hidden).view(batch, length, KV_HEADS, HEAD_DIM)
    v = linear("v_proj", hidden).view(batch, length, KV_HEADS, HEAD_DIM)
    q = rms_norm(q, 1 + state["q_norm.weight"])
    k = rms_norm(k, 1 + state["k_norm.weight"])
    out = causal_attention(rotate(q, cos, sin), rotate(k, cos, sin), v) * torch.sigmoid(gate)
    return linear("o_proj", out.reshape(batch, length, HEADS * HEAD_DIM))


@pytest.mark.parametrize("attention_bias", [False, True])
def test_qwen3_next_layer_computes_the_same_as_transformers(attention_bias):
    next_config, layer = _qwen3_next_layer(attention_bias)
    model, block = _qwen3_block(attention_bias)
    state = {key: tensor.detach() for key, tensor in layer.state_dict().items()}
    block.load_state_dict(qwen3_next_attention_to_ours(state, next_config, model.config), strict=True)
    hidden, position_embeddings, mask = _layer_inputs(model)
    with torch.no_grad():
        expected, _ = layer(hidden, position_embeddings, mask)
        ours, _ = block(hidden, position_embeddings, mask)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        ours, _qwen3_next_reference(state, hidden, *position_embeddings), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("attention_bias", [False, True])
def test_qwen3_next_round_trips_are_bit_exact(attention_bias):
    next_config, layer = _qwen3_next_layer(attention_bias)
    model, block = _qwen3_block(attention_bias)
    state = {key: tensor.detach() for key, tensor in layer.state_dict().items()}
    there = qwen3_next_attention_to_ours(state, next_config, model.config)
    back = ours_to_qwen3_next_attention(there, model.config, next_config)
    assert back.keys() == state.keys() and all(torch.equal(back[key], state[key]) for key in state)
    ours = {key: tensor.detach() for key, tensor in block.state_dict().items()}
    for norm in ("q_norm.weight", "k_norm.weight"):
        ours[norm] = 1 + (torch.randn(HEAD_DIM) * 0.1).bfloat16().float()
    if not attention_bias:
        ours["attn_gate.bias"] = torch.zeros(HEADS * HEAD_DIM)
    again = qwen3_next_attention_to_ours(
        ours_to_qwen3_next_attention(ours, model.config, next_config), next_config, model.config
    )
    assert again.keys() == ours.keys() and all(torch.equal(again[key], ours[key]) for key in ours)


def test_qwen3_next_refuses_what_does_not_match():
    model = tiny_model("qwen3")
    config, layer = _qwen3_next_layer(False)
    state = layer.state_dict()
    partial = _qwen3_next_config(partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match=r"partial_rotary_factor 0.25 \(Qwen3-Next\) != 1.0"):
        qwen3_next_attention_to_ours(state, partial, model.config)
    with pytest.raises(ValueError, match=r"head_dim 16 \(Qwen3-Next\) != 8"):
        qwen3_next_attention_to_ours(state, _qwen3_next_config(head_dim=16), model.config)
    with pytest.raises(ValueError, match="the target model_type is 'llama', not 'qwen3'"):
        qwen3_next_attention_to_ours(state, config, tiny_model("llama").config)
    ours = qwen3_next_attention_to_ours(state, config, model.config)
    ours["attn_gate.bias"] = torch.ones(HEADS * HEAD_DIM)
    with pytest.raises(ValueError, match="the gate bias is nonzero but attention_bias is false"):
        ours_to_qwen3_next_attention(ours, model.config, config)
