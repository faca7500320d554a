"""benchmarks/gate_cost.py: its inline cases compute what the package's headwise output gate computes (so
that their timings are of the same arithmetic), and every case leaves the model as it found it."""

from __future__ import annotations

import gate_cost
import pytest
import torch
from helpers import tiny_model

from hf_gate_attention import GateConfig, gate_parameters, patch, unpatch


@pytest.mark.parametrize("case", ["inline, own GEMM", "inline, merged GEMM"])
def test_inline_gates_are_the_packages_gate(case):
    model = tiny_model("llama", num_attention_heads=4, num_key_value_heads=2).eval()
    inputs = torch.randint(model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    patch(model, GateConfig(init="paper"), backend="torch")
    with torch.no_grad():
        for gate in gate_parameters(model):
            gate.normal_(0, 0.5)  # gates far from 0.5, bias included
        expected = model(input_ids=inputs).logits
    params = list(gate_parameters(model))
    unpatch(model)
    cases = gate_cost.Cases(model, "torch", GateConfig(init="paper"))
    cases.gates = [(params[2 * i], params[2 * i + 1]) for i in range(len(model.model.layers))]
    handles = cases.install(case)
    with torch.no_grad():
        got = model(input_ids=inputs).logits
    cases.remove(case, handles)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not any("forward" in module.__dict__ for module in model.modules())
    with torch.no_grad():
        assert not torch.allclose(model(input_ids=inputs).logits, expected)  # the gate is gone again


def test_sigmoid_and_multiply_only_gates_and_goes():
    """The floor case multiplies each head's output by a sigmoid of fixed logits; it leaves nothing behind."""
    model = tiny_model("llama", num_attention_heads=4, num_key_value_heads=2).eval()
    inputs = torch.randint(model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=inputs).logits
        cases = gate_cost.Cases(model, "torch", GateConfig(init="paper"))
        handles = cases.install("sigmoid and multiply only")
        gated = model(input_ids=inputs).logits
        cases.remove("sigmoid and multiply only", handles)
        assert not torch.allclose(gated, expected)
        torch.testing.assert_close(model(input_ids=inputs).logits, expected, rtol=0, atol=0)
    assert not any("forward" in module.__dict__ for module in model.modules())
