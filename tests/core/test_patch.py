"""patch / unpatch on tiny random models of every registered family, for every variant and granularity."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import GRANULARITIES, TINY_MODELS, VARIANTS, first_output, tiny_inputs, tiny_model

from hf_gate_attention import (
    AttentionFamily,
    AttentionGate,
    GateConfig,
    gate_config_of,
    gate_parameters,
    is_patched,
    patch,
    register_family,
    supported_model_types,
    unpatch,
)
from hf_gate_attention.core.families import _FAMILIES

FAMILIES = sorted(TINY_MODELS)


def test_every_registered_family_has_a_tiny_model():
    assert set(supported_model_types()) == set(TINY_MODELS)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_type", FAMILIES)
def test_identity_init_is_exact_and_unpatch_restores(model_type, variant, granularity):
    model = tiny_model(model_type)
    inputs = tiny_inputs(model_type)
    keys_before = list(model.state_dict())
    with torch.no_grad():
        reference = first_output(model(**inputs))

        config = GateConfig(variant=variant, granularity=granularity)
        patch(model, config)
        assert is_patched(model) and gate_config_of(model) == config
        assert (first_output(model(**inputs)) - reference).abs().max().item() <= 1e-6

        unpatch(model)
        assert not is_patched(model) and not hasattr(model.config, "gate_attention")
        assert list(model.state_dict()) == keys_before
        assert torch.equal(first_output(model(**inputs)), reference)

        # a trained-looking gate changes the output, so the gate really is on the computation path
        patch(model, variant=variant, granularity=granularity, init="paper")
        assert (first_output(model(**inputs)) - reference).abs().max().item() > 1e-4
        unpatch(model)
        assert torch.equal(first_output(model(**inputs)), reference)


def test_patch_returns_model_with_new_state_dict_keys():
    model = tiny_model("llama")
    assert patch(model) is model
    added = [k for k in model.state_dict() if "attn_gate" in k]
    assert added == [
        f"model.layers.{i}.self_attn.attn_gate.{p}" for i in range(2) for p in ("weight", "bias")
    ]


def test_layers_selection_and_errors():
    model = tiny_model("llama")
    patch(model, layers=[1])
    assert [k for k in model.state_dict() if "attn_gate" in k] == [
        "model.layers.1.self_attn.attn_gate.weight",
        "model.layers.1.self_attn.attn_gate.bias",
    ]
    unpatch(model)
    with pytest.raises(ValueError, match=r"layers \[5\] not found; this model has layers 0..1"):
        patch(model, layers=[0, 5])
    assert not is_patched(model) and not any("attn_gate" in k for k in model.state_dict())


def test_double_patch_and_unpatch_errors():
    model = tiny_model("bert")
    patch(model)
    with pytest.raises(ValueError, match="already patched"):
        patch(model)
    unpatch(model)
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)


def test_unsupported_model_lists_types_and_points_to_register_family():
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=99)
    with pytest.raises(
        ValueError, match=r"'gpt2' is not supported; supported: bert, dinov2.*register_family"
    ):
        patch(transformers.GPT2Model(config))


def test_register_family_for_a_new_model_type(monkeypatch):
    monkeypatch.setattr("hf_gate_attention.core.families._FAMILIES", dict(_FAMILIES))
    with pytest.raises(ValueError, match="already registered"):
        register_family("llama", _FAMILIES["llama"])
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=99)
    model = transformers.GPT2LMHeadModel(config).eval()
    # GPT-2 fuses q, k, v in a Conv1D: not a Linear, so the patcher must refuse with a clear error
    register_family(
        "gpt2",
        AttentionFamily(
            block=r"h\.(\d+)\.attn",
            query="c_attn",
            key="c_attn",
            value="c_attn",
            output="c_proj",
            num_heads_attr="n_head",
        ),
    )
    assert "gpt2" in supported_model_types()
    with pytest.raises(TypeError, match="expected a Linear projection, found Conv1D"):
        patch(model)


def test_family_needs_layer_group():
    with pytest.raises(ValueError, match="group capturing the layer index"):
        AttentionFamily(block=r"layers\.\d+\.self_attn", query="q", key="k", value="v", output="o")


def test_cross_attention_is_left_alone():
    model = tiny_model("bert", is_decoder=True, add_cross_attention=True)
    patch(model)
    gated = sorted({k.rsplit(".attn_gate.", 1)[0] for k in model.state_dict() if ".attn_gate." in k})
    assert gated == [f"bert.encoder.layer.{i}.attention" for i in range(2)]
    assert not any(isinstance(m, AttentionGate) for m in model.bert.encoder.layer[0].crossattention.modules())


def test_top_k_zeroes_exactly_the_heads_outside_the_k_largest():
    model = tiny_model("llama")
    patch(model, init="paper", top_k=2)
    seen = []
    block = model.model.layers[0].self_attn
    handle = block.o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(**tiny_inputs("llama"))
        gate = block.attn_gate(x=torch.randn(3, 32))
    handle.remove()
    per_head = seen[0].unflatten(-1, (4, 8))  # (B, L, H, D)
    zero_heads = (per_head == 0).all(-1).sum(-1)  # (B, L): heads that are exactly zero
    assert torch.equal(zero_heads, torch.full_like(zero_heads, 2))
    assert torch.equal((gate.squeeze(-1) > 0).sum(-1), torch.full((3,), 2))
    with pytest.raises(ValueError, match="top_k=3 exceeds the 2 gated heads"):
        patch(tiny_model("llama"), variant="value", top_k=3)


def test_train_gates_only_freezes_everything_else():
    model = tiny_model("llama")
    patch(model, train_gates_only=True)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".attn_gate." in n for n in trainable)
    assert len(trainable) == len(list(gate_parameters(model)))


def test_gate_sigmoid_runs_in_float32_under_bf16():
    model = tiny_model("llama").to(torch.bfloat16)
    patch(model, init="paper")
    gate = model.model.layers[0].self_attn.attn_gate
    assert gate.weight.dtype == torch.bfloat16
    assert gate(x=torch.randn(2, 32, dtype=torch.bfloat16)).dtype == torch.float32
