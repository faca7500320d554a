"""Dense gates on backend `torch` run from instance `forward`s of the projections, not hooks
(`core/hooks.py: InlineForward`), and multiply in fewest ops (`AttentionGate.gated`): the same bits as the
hook path with `apply_gate`, forward and backward, in float32 and bfloat16, under PEFT wrapping, deep copies
and hooks on the gate; and no more torch ops per layer than the gate's formula needs."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from helpers import added_ops_per_layer, first_output, tiny_inputs, tiny_model

from hf_gate_attention import GateConfig, patch, unpatch
from hf_gate_attention.core.hooks import InlineForward, use_hooks

GATES = [
    {"variant": "output", "granularity": "headwise"},
    {"variant": "output", "granularity": "elementwise", "init": "identity"},
    {"variant": "value", "granularity": "headwise"},
    {"variant": "qk", "granularity": "elementwise"},
]


def _pair(dtype=torch.float32, **gate) -> tuple:
    """(hook-free model, hook-path model): the same tiny Llama and gate weights (`init="paper"` unless
    given, so that no gate is a no-op)."""
    config = GateConfig(**{"init": "paper", **gate})
    model = patch(tiny_model("llama", attn_implementation="sdpa").to(dtype), config, backend="torch")
    reference = copy.deepcopy(model)
    use_hooks(reference)
    return model, reference


def _assert_same_bits(model, reference, inputs, backward: bool = True) -> None:
    for side in (model, reference) if backward else ():
        side.zero_grad()
        side(**inputs).logits.float().square().mean().backward()
    torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, rtol=0, atol=0)
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("gate", GATES, ids=lambda gate: "-".join(gate.values()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_same_bits_as_the_hooks_forward_and_backward(gate, dtype):
    model, reference = _pair(dtype, **gate)
    projections = model.model.layers[0].self_attn
    assert isinstance(projections.o_proj.__dict__.get("forward"), InlineForward) == (
        gate["variant"] != "value"
    )
    assert not projections.q_proj._forward_hooks and not projections.o_proj._forward_pre_hooks
    assert isinstance(projections.__dict__["forward"], InlineForward) and not projections._forward_pre_hooks
    _assert_same_bits(model, reference, tiny_inputs("llama", length=13, seed=2))
    with torch.no_grad():  # the sigmoid in bfloat16, and the multiply in place, without gradients
        inputs = tiny_inputs("llama", length=5, seed=3)
        torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, rtol=0, atol=0)
    generated = [
        side.generate(
            inputs["input_ids"],
            max_new_tokens=4,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
        for side in (model, reference)
    ]
    assert torch.equal(generated[0].sequences, generated[1].sequences)
    torch.testing.assert_close(generated[0].scores, generated[1].scores, rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["output", "value", "qk"])
@pytest.mark.parametrize(
    "model_type, bare", [("llama", True), ("phi3", False), ("bert", False), ("vit", False)], ids=str
)
def test_same_bits_as_the_hooks_on_bare_models_fused_projections_and_task_heads(model_type, bare, variant):
    """Bare decoder, fused `qkv_proj` (the value gate multiplies a view of it, in place without gradients),
    encoder and vision heads: outputs and every gradient as the hook path gives them."""
    config = GateConfig(variant=variant, init="paper")
    model = patch(tiny_model(model_type, bare=bare), config, backend="torch")
    reference = copy.deepcopy(model)
    use_hooks(reference)
    assert any(isinstance(module.__dict__.get("forward"), InlineForward) for module in model.modules())
    assert not any(
        isinstance(module.__dict__.get("forward"), InlineForward) for module in reference.modules()
    )
    inputs = tiny_inputs(model_type)
    for side in (model, reference):
        first_output(side(**inputs)).square().mean().backward()
    torch.testing.assert_close(
        first_output(model(**inputs)), first_output(reference(**inputs)), rtol=0, atol=0
    )
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert param.grad is not None or "attn_gate" not in name, name
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=0, atol=0, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(
            first_output(model(**inputs)), first_output(reference(**inputs)), rtol=0, atol=0
        )


def test_peft_wrapping_after_patch_moves_the_forwards_to_the_wrappers():
    """LoRA on every projection, added after `patch`: the gate still multiplies the input of the whole wrapped
    output projection (base layer and LoRA), as the hooks do."""
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(
        r=2, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False
    )
    model, reference = _pair()
    models = []
    for side in (model, reference):
        torch.manual_seed(5)
        models.append(peft.get_peft_model(side, lora))
    inputs = tiny_inputs("llama", seed=4)
    _assert_same_bits(*models, inputs)
    output = models[0].get_base_model().model.layers[0].self_attn.o_proj
    assert isinstance(output.__dict__.get("forward"), InlineForward)  # the LoRA wrapper
    assert "forward" not in output.base_layer.__dict__
    merged = [side.merge_and_unload() for side in models]
    _assert_same_bits(*merged, inputs, backward=False)  # nothing trainable left


def test_hooks_on_the_gate_still_run():
    """A hook on `attn_gate` (the recipes' gate recorders) sees every call: the module is called then."""
    model, reference = _pair()
    seen = []
    model.model.layers[1].self_attn.attn_gate.register_forward_hook(
        lambda module, args, out: seen.append(out)
    )
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, rtol=0, atol=0)
    assert len(seen) == 1 and seen[0].shape == (2, 11, 4, 1)


def test_deep_copy_and_unpatch():
    model, _ = _pair()
    copied = copy.deepcopy(model)
    forward = copied.model.layers[0].self_attn.o_proj.forward
    assert isinstance(forward, InlineForward) and forward.module is copied.model.layers[0].self_attn.o_proj
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        expected = model(**inputs).logits
        unpatch(copied)
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=0)  # the original is intact
    for layer in copied.model.layers:
        assert all("forward" not in module.__dict__ for module in layer.modules())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("init", ["paper", "identity"])  # gate scale 1 and 2
def test_eager_decode_step_adds_the_gate_formula_and_two_views(init, dtype):
    """Per layer and token: the gate's GEMM, its sigmoid and one multiply in place on the attention output
    (the identity init's scale of 2 in the same op), plus the views of logits and values as heads; no cast in
    bfloat16, no copy."""
    model = tiny_model("llama", attn_implementation="sdpa").to(dtype)
    added = added_ops_per_layer(model, GateConfig(variant="output", init=init), "torch")
    multiply = "aten::mul_" if init == "paper" else "aten::addcmul"
    assert added == Counter({"aten::linear": 1, "aten::sigmoid": 1, multiply: 1, "aten::unflatten": 2})
