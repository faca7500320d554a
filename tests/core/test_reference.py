"""Patched attention blocks against an independent eager reference of each gate formula, and the gates'
parameter counts against the formulas of the README: what a new variant adds to the tests.

The reference re-implements attention from the block's weights (plain matmuls, explicit per-head loops for the
`qk` gate) and, for the headwise `qk` gate, materialises the gated weight matrix the way the source article's
code does (`gated_attn = softmax(Q K^T / sqrt(d)) * gate_signal; output = gated_attn @ V`).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from helpers import GRANULARITIES, TINY_MODELS, VARIANTS, first_output, tiny_inputs, tiny_model

from hf_gate_attention import GateConfig, gate_parameters, patch
from hf_gate_attention.core.families import find_attention


def expected_gate_params(model, config: GateConfig) -> int:
    """Parameter count from the formulas in the README (weights + biases per layer)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    width = 1 if config.granularity == "headwise" else head_dim
    if config.variant == "qk":
        per_layer = heads * width * (2 * head_dim + 1)
    else:
        gated = kv_heads if config.variant == "value" else heads
        per_layer = gated * width * (cfg.hidden_size + 1)
    return per_layer * cfg.num_hidden_layers


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_type", sorted(TINY_MODELS))
def test_parameter_count_matches_the_formulas(model_type, variant, granularity):
    config = GateConfig(variant=variant, granularity=granularity)
    model = patch(tiny_model(model_type), config)
    assert sum(p.numel() for p in gate_parameters(model)) == expected_gate_params(model, config)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def reference_block(block, family, x, mask, rope=None):
    """Gated self-attention of one block up to the output projection.

    x: (B, L, hidden); mask: (B, 1, L, L) additive."""
    gate = block.attn_gate
    heads, kv_heads, dim, width = gate.num_heads, gate.num_kv_heads, gate.head_dim, gate.width

    def linear(path, t):
        module = block.get_submodule(path)
        return F.linear(t, module.weight, module.bias)

    if family.fused_qkv:
        q, k, v = linear(family.query, x).split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    else:
        q, k, v = linear(family.query, x), linear(family.key, x), linear(family.value, x)
    batch, length = x.shape[:2]
    q, k, v = (t.reshape(batch, length, -1, dim) for t in (q, k, v))  # (B, L, heads, D)
    sigmoid = lambda z: gate.scale * torch.sigmoid(z.float())  # noqa: E731

    if gate.variant == "qk":
        group = heads // kv_heads
        g = torch.stack(
            [
                sigmoid(torch.cat([q[:, :, h], k[:, :, h // group]], -1) @ gate.weight[h].T + gate.bias[h])
                for h in range(heads)
            ],
            dim=2,
        )  # (B, L, H, width)
    else:
        g = sigmoid(x @ gate.weight.T + gate.bias).reshape(batch, length, -1, width)  # (B, L, G, width)
    if gate.top_k is not None:
        kept = g.mean(-1).topk(gate.top_k, dim=-1).indices
        g = g * torch.zeros_like(g[..., 0]).scatter(-1, kept, 1.0).unsqueeze(-1)
    if gate.variant == "value":
        v = v * g

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, L, D)
    if rope is not None:
        cos, sin = (t.unsqueeze(1) for t in rope)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    weights = torch.softmax(q @ k.transpose(-1, -2) / dim**0.5 + mask, dim=-1)  # (B, H, L, L)
    if gate.variant == "qk" and width == 1:
        weights = weights * g.permute(0, 2, 1, 3)  # the article: row i of the weights times g_i
    out = (weights @ v).transpose(1, 2)  # (B, L, H, D)
    if gate.variant == "output" or (gate.variant == "qk" and width > 1):
        out = out * g
    return linear(family.output, out.flatten(-2))


def _additive_mask(keep: torch.Tensor, causal: bool) -> torch.Tensor:
    """keep: (B, L) bool key mask -> additive (B, 1, L, L) float mask."""
    length = keep.shape[1]
    allowed = keep[:, None, None, :].expand(-1, 1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("top_k", [None, 2])
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_type", ["llama", "phi3", "bert", "vit"])
def test_block_matches_reference(model_type, variant, granularity, top_k):
    model = tiny_model(model_type)
    if variant == "value" and top_k and model_type in ("llama", "phi3"):
        top_k = 1  # value gates act on the 2 key/value heads
    patch(model, variant=variant, granularity=granularity, init="paper", top_k=top_k)
    found = find_attention(model)[1]
    block, family = found.module, found.family
    causal = model_type in ("llama", "phi3")
    batch, length = 3, 13
    x = torch.randn(batch, length, model.config.hidden_size)
    keep = torch.ones(batch, length, dtype=torch.bool)
    keep[1, :4] = False  # left padding
    keep[2, -5:] = False  # right padding
    mask = _additive_mask(keep, causal)

    captured = []
    handle = block.get_submodule(family.output).register_forward_hook(lambda m, a, out: captured.append(out))
    kwargs, rope = {"attention_mask": mask}, None
    if causal:
        rope = model.model.rotary_emb(x, torch.arange(length).expand(batch, -1))
        kwargs["position_embeddings"] = rope
    with torch.no_grad():
        block(x, **kwargs)
        expected = reference_block(block, family, x, mask, rope)
    handle.remove()
    rows = (
        keep if causal else torch.ones_like(keep)
    )  # fully masked query rows are undefined under causal masks
    torch.testing.assert_close(captured[0][rows], expected[rows], atol=2e-5, rtol=1e-4)


def _implementations():
    impls = ["eager", "sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)]  # slow: compiles
    if importlib.util.find_spec("flash_attn") is not None:
        impls.append("flash_attention_2")
    return impls


def test_flash_attention_2_availability_is_reported():
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed (CPU machine): flash_attention_2 is not tested here")
    assert "flash_attention_2" in _implementations()


@pytest.mark.parametrize("implementation", _implementations())
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_type", ["llama", "bert", "vit"])
def test_attention_implementations_agree(model_type, variant, implementation):
    inputs = tiny_inputs(model_type, batch=2, length=12)
    if "input_ids" in inputs:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs["attention_mask"][0, -3:] = 0  # right padding
    outputs = {}
    for impl in ("eager", implementation):
        try:
            model = tiny_model(model_type, attn_implementation=impl)
        except (ValueError, ImportError) as error:
            pytest.skip(f"{impl} is not available for {model_type} here: {error}")
        patch(model, variant=variant, granularity="elementwise", init="paper")
        with torch.no_grad():
            outputs[impl] = first_output(model(**inputs))
    torch.testing.assert_close(outputs[implementation], outputs["eager"], atol=2e-5, rtol=1e-4)
