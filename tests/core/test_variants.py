"""The variant registry (`core/variants.py`): its entries are consistent and documented, and a variant
declared there alone (a gate on the keys, declared only in this test) runs through `patch`, the hooks, top-k
and `unpatch`."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import REPO, first_output, tiny_inputs, tiny_model
from torch.nn import functional as F

from hf_gate_attention import GateConfig, gate_parameters, patch, unpatch
from hf_gate_attention.core.gate import AttentionGate
from hf_gate_attention.core.hooks import QKV_ROLES
from hf_gate_attention.core.variants import GATE_VARIANTS, GateVariant
from hf_gate_attention.sharing.layouts import LAYOUTS

KEY_GATE = GateVariant(
    name="key",
    origin="test",
    description="a sigmoid gate on the key projection's output, per key/value head",
    gates="key",
    inputs=(("x", "key"),),
    top_k_skips=False,
    dropped_read_keys=False,
)


@pytest.mark.parametrize("variant", GATE_VARIANTS.values(), ids=list(GATE_VARIANTS))
def test_entries_are_consistent(variant):
    assert GATE_VARIANTS[variant.name] is variant
    assert variant.gates in ("output", *QKV_ROLES)
    assert {role for _, role in variant.inputs} <= set(QKV_ROLES)
    if variant.top_k_skips or variant.dropped_read_keys:  # both need the attention function to apply the gate
        assert variant.gates_attention_output
    assert set(variant.layouts) <= set(LAYOUTS)


def test_readme_table_lists_every_variant():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Gate variants", 1)[1].split("\n\n")[2]
    assert re.findall(r"^\| `(\w+)`", table, flags=re.MULTILINE) == list(GATE_VARIANTS)


def test_a_variant_declared_in_the_registry_alone_runs(monkeypatch):
    monkeypatch.setitem(GATE_VARIANTS, "key", KEY_GATE)
    model, inputs = tiny_model("llama"), tiny_inputs("llama")
    config = model.config
    kv_heads, hidden = config.num_key_value_heads, config.hidden_size
    with torch.no_grad():
        ungated = first_output(model(**inputs))
        patch(model, variant="key")  # identity init: the same function
        assert sum(p.numel() for p in gate_parameters(model)) == 2 * kv_heads * (hidden + 1)
        torch.testing.assert_close(first_output(model(**inputs)), ungated, atol=1e-6, rtol=0)
        unpatch(model)

        patch(model, variant="key", init="paper")
        gates = {layer.self_attn.k_proj: layer.self_attn.attn_gate for layer in model.model.layers}
        gated = first_output(model(**inputs))
        gate_weights = {k_proj: (gate.weight.clone(), gate.bias.clone()) for k_proj, gate in gates.items()}
        unpatch(model)

        def gate_keys(module, args, output):  # K'_h = K_h * sigmoid(X W + b)_h
            weight, bias = gate_weights[module]
            gate = torch.sigmoid(F.linear(args[0], weight, bias))  # (B, L, KV)
            return (output.unflatten(-1, (kv_heads, -1)) * gate.unsqueeze(-1)).flatten(-2)

        handles = [k_proj.register_forward_hook(gate_keys) for k_proj in gate_weights]
        expected = first_output(model(**inputs))
        for handle in handles:
            handle.remove()
        torch.testing.assert_close(gated, expected, atol=1e-5, rtol=1e-5)
        assert (gated - ungated).abs().max() > 1e-4  # the gate changes the keys

    with pytest.raises(ValueError, match="gates the keys before they enter the KV cache"):
        patch(tiny_model("llama"), GateConfig(variant="key", top_k=1), sparse=True)
    patch(model, GateConfig(variant="key", top_k=1))  # a mask, like the value gate's
    assert model(**inputs).logits.isfinite().all()


def _query_key_reference(weight, bias, q, k, heads, kv_heads):
    """The `qk` formula read off its docstring: `W[h] [q_h; k_{h // (H / KV)}] + b[h]`, head by head."""
    q, k = q.unflatten(-1, (heads, -1)), k.unflatten(-1, (kv_heads, -1))
    rows = [
        torch.cat([q[..., h, :], k[..., h // (heads // kv_heads), :]], -1) @ weight[h].T + bias[h]
        for h in range(heads)
    ]
    return torch.stack(rows, dim=-2)  # (..., H, w)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 2, 8), (6, 3, 5), (3, 3, 7), (8, 1, 4)])
@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_query_key_logits_match_the_formula_forward_and_backward(heads, kv_heads, head_dim, granularity):
    """Headwise as one GEMM of `[q | k]` (`query_key_matrix`), elementwise by einsum: both the formula."""
    torch.manual_seed(heads * head_dim)
    gate = AttentionGate(GateConfig(variant="qk", granularity=granularity), 16, heads, kv_heads, head_dim)
    with torch.no_grad():
        gate.weight.normal_(), gate.bias.normal_()
    q = torch.randn(2, 3, heads * head_dim, requires_grad=True)
    k = torch.randn(2, 3, kv_heads * head_dim, requires_grad=True)
    got = gate.logits(q=q, k=k)
    leaves = (gate.weight, gate.bias, q, k)
    grads = torch.autograd.grad(got.square().sum(), leaves)
    expected = _query_key_reference(gate.weight, gate.bias, q, k, heads, kv_heads)
    torch.testing.assert_close(got, expected)
    expected_grads = torch.autograd.grad(expected.square().sum(), leaves)
    for got_grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got_grad, expected_grad)
    assert gate.query_key_matrix_cache is None  # nothing kept while gradients are recorded


def test_query_key_matrix_is_kept_without_gradients_until_the_weights_change():
    gate = AttentionGate(GateConfig(variant="qk", init="paper"), 16, 4, 2, 8)
    q, k = torch.randn(1, 1, 32), torch.randn(1, 1, 16)
    with torch.no_grad():
        first = gate.logits(q=q, k=k)
        kept = gate.query_key_matrix_cache[1][0]
        assert gate.logits(q=q, k=k).equal(first) and gate.query_key_matrix_cache[1][0] is kept
        gate.weight.mul_(-1)  # an optimizer step, in place
        flipped = gate.logits(q=q, k=k) - gate.bias[:, 0, None]
        torch.testing.assert_close(flipped, -(first - gate.bias[:, 0, None]))
        state = {name: torch.randn_like(value) for name, value in gate.state_dict().items()}
        gate.load_state_dict(state)
        expected = _query_key_reference(state["weight"], state["bias"], q, k, 4, 2)
        torch.testing.assert_close(gate.logits(q=q, k=k), expected)
