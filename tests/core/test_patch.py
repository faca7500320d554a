"""patch / unpatch on tiny random models of every registered family, for every variant and granularity."""

from __future__ import annotations

import pytest
import torch
from helpers import GRANULARITIES, TINY_MODELS, VARIANTS, first_output, tiny_inputs, tiny_model
from model_zoo import zoo_inputs, zoo_model
from supported_models import model_of_unknown_layout

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
from hf_gate_attention.core.families import _FAMILIES, find_attention

FAMILIES = sorted(TINY_MODELS)


def test_the_tiny_models_are_tested_model_types():
    assert set(TINY_MODELS) <= set(supported_model_types())


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


def test_a_model_without_a_known_layout_is_refused_with_what_was_found():
    model = model_of_unknown_layout()
    with pytest.raises(ValueError) as error:
        patch(model)
    for part in ("model type 'llama'", "Looked for", "q_proj/k_proj/v_proj/o_proj", "(LlamaAttention)"):
        assert part in str(error.value)
    assert "register_family(model_type, AttentionFamily(block=" in str(error.value)
    assert not is_patched(model)


def test_a_registered_family_replaces_the_structural_search(monkeypatch):
    monkeypatch.setattr("hf_gate_attention.core.families._FAMILIES", dict(_FAMILIES))
    model = zoo_model("gpt2")
    inputs = zoo_inputs("gpt2")
    with torch.no_grad():
        expected = model(**inputs).logits
    with pytest.raises(ValueError, match="needs `block`"):
        register_family(
            "gpt2", AttentionFamily(query="c_attn", key="c_attn", value="c_attn", output="c_proj")
        )
    family = AttentionFamily(
        block=r"h\.(1)\.attn", query="c_attn", key="c_attn", value="c_attn", output="c_proj"
    )  # only layer 1
    register_family("gpt2", family)
    with pytest.raises(ValueError, match="already registered"):
        register_family("gpt2", family)
    assert "gpt2" in supported_model_types()
    with pytest.warns(UserWarning, match=r"transformer.h.0.attn \(GPT2Attention\)"):  # not in the pattern
        patch(model)
    gated = sorted({k.rsplit(".attn_gate.", 1)[0] for k in model.state_dict() if ".attn_gate." in k})
    assert gated == ["transformer.h.1.attn"]
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, expected)


def test_family_needs_layer_group():
    with pytest.raises(ValueError, match="group capturing the layer index"):
        AttentionFamily(block=r"layers\.\d+\.self_attn", query="q", key="k", value="v", output="o")


def test_cross_attention_is_left_alone_by_default():
    model = tiny_model("bert", is_decoder=True, add_cross_attention=True)
    patch(model)
    gated = sorted({k.rsplit(".attn_gate.", 1)[0] for k in model.state_dict() if ".attn_gate." in k})
    assert gated == [f"bert.encoder.layer.{i}.attention" for i in range(2)]
    assert not any(isinstance(m, AttentionGate) for m in model.bert.encoder.layer[0].crossattention.modules())


def _gated_blocks(model) -> list[str]:
    return sorted({k.rsplit(".attn_gate.", 1)[0] for k in model.state_dict() if ".attn_gate." in k})


@pytest.mark.parametrize(
    ("attention", "layers", "expected"),
    [
        (("cross",), None, ["model.decoder.layers.0.encoder_attn", "model.decoder.layers.1.encoder_attn"]),
        (("encoder",), [1], ["model.encoder.layers.1.self_attn"]),
        (
            ("decoder", "encoder"),
            [0],
            ["model.decoder.layers.0.self_attn", "model.encoder.layers.0.self_attn"],
        ),
    ],
)
def test_attention_kinds_and_layers_of_an_encoder_decoder(attention, layers, expected):
    model = zoo_model("bart")
    patch(model, attention=attention, layers=layers)
    assert _gated_blocks(model) == expected


def test_parts_of_a_composite_model():
    model = zoo_model("llava")
    patch(model, parts=["language_model"])
    assert _gated_blocks(model) == [f"model.language_model.layers.{i}.self_attn" for i in range(2)]
    blocks = {block.name: block.geometry for block in find_attention(model)}
    # head counts from each part's own config: the CLIP tower has no grouped-query attention
    assert blocks["model.language_model.layers.0.self_attn"]["num_kv_heads"] == 2
    assert blocks["model.vision_tower.encoder.layers.0.self_attn"]["num_kv_heads"] == 4


@pytest.mark.parametrize(
    ("key", "overrides", "message"),
    [
        (
            "llama",
            {"attention": ["cross"]},
            r"asks for cross attention, which LlamaForCausalLM .* it has: decoder",
        ),
        ("llama", {"attention": ["encoder"]}, r"asks for encoder attention, .* it has: decoder"),
        ("bart", {"attention": ["cross"], "variant": "qk"}, r"variant='qk' reads the query and key"),
        ("llava", {"parts": ["vision_model"]}, r"parts \['vision_model'\] name no part .*language_model"),
        ("bart", {"layers": [2]}, r"layers \[2\] not found; this model has layers 0..1"),
    ],
)
def test_asking_for_what_the_model_lacks_is_an_error_before_any_change(key, overrides, message):
    model = zoo_model(key)
    with pytest.raises(ValueError, match=message):
        patch(model, **overrides)
    assert not is_patched(model) and not _gated_blocks(model)


@pytest.mark.parametrize("field", ["attention", "parts"])
@pytest.mark.parametrize("value", [[], "encoder", [""], [3]])
def test_bad_attention_and_parts_values(field, value):
    with pytest.raises(ValueError, match=f"GateConfig.{field}=.* is not valid"):
        GateConfig(**{field: value})
    with pytest.raises(ValueError, match="among encoder, decoder, cross"):
        GateConfig(attention=["self"])


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


@pytest.mark.parametrize(
    ("key", "overrides", "why"),
    [
        ("t5", {}, "belongs to a part with a config of its own"),
        ("bart", {"attention": ["decoder", "cross"]}, "encoder_attn .* is cross-attention"),
        ("deberta-v2", {}, "without transformers' attention interface"),
    ],
)
def test_top_k_skipping_or_sink_reads_where_the_attention_cannot_take_them_are_refused(key, overrides, why):
    """Sparse top-k and the sink/window reads run in an attention function; where the blocks do not call
    one that can be replaced, `sparse=None` masks, `sparse=True` and sink/window reads are refused."""
    patch(zoo_model(key), top_k=1, **overrides)  # sparse=None: the masked reference
    for options in ({"sparse": True}, {"top_k_sink": 2}):
        model = zoo_model(key)
        sparse = options.pop("sparse", None)
        with pytest.raises(ValueError, match=why):
            patch(model, top_k=1, sparse=sparse, **overrides, **options)
        assert not is_patched(model)


def test_bad_patch_arguments_are_named():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="train_gates_only='no' is not valid; accepted values: True, False"):
        patch(model, train_gates_only="no")
    with pytest.raises(TypeError, match="config must be a GateConfig or a dict of its fields, got int"):
        patch(model, 3)
    with pytest.raises(ValueError, match=r"GateConfig.variant=\['output'\] is not valid"):
        GateConfig(variant=["output"])
    assert all(p.requires_grad for p in model.parameters()) and not is_patched(model)
    patch(model, {"variant": "qk", "init": "paper"})
    assert gate_config_of(model) == GateConfig(variant="qk", init="paper")
