"""Models loaded the ways users load them: quantized bases (QLoRA: a tiny Llama in 4-bit and 8-bit with
bitsandbytes, which runs on the CPU), patched, trained with PEFT LoRA and the gates in `modules_to_save`; and
`device_map` through accelerate with offloaded layers."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from hf_gate_attention import gate_parameters, patch, unpatch

INPUTS = {"input_ids": torch.tensor([[5, 17, 42, 8, 93, 11, 60], [7, 7, 30, 81, 4, 56, 22]])}
QUANTIZATIONS = {
    "4bit-float32": {"load_in_4bit": True, "bnb_4bit_compute_dtype": torch.float32},
    "4bit-bfloat16": {"load_in_4bit": True, "bnb_4bit_compute_dtype": torch.bfloat16},
    "8bit": {"load_in_8bit": True},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama whose projections fit bitsandbytes' CPU kernels (widths multiples of 64)."""
    config = transformers.LlamaConfig(
        vocab_size=99, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def load_quantized(folder, quantization: str):
    bnb = pytest.importorskip("bitsandbytes")
    config = transformers.BitsAndBytesConfig(**QUANTIZATIONS[quantization])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=config, device_map="cpu"
    )
    for (
        module
    ) in model.modules():  # the CPU's bf16 weight repacking on eval has no backward (bitsandbytes 0.50)
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    return model


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_gates_are_float_identity_exact_and_trained_with_lora(checkpoint, quantization):
    peft = pytest.importorskip("peft")
    model = load_quantized(checkpoint, quantization)
    query = model.model.layers[0].self_attn.q_proj
    assert not query.weight.dtype.is_floating_point  # really quantized
    with torch.no_grad():
        expected = model(**INPUTS).logits
    patch(model)
    gates = list(gate_parameters(model))
    assert gates and all(p.dtype == model.dtype for p in gates)
    with torch.no_grad():
        assert torch.equal(model(**INPUTS).logits, expected)
    model = peft.prepare_model_for_kbit_training(model)
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["attn_gate"])
    model = peft.get_peft_model(model, lora)
    model.train()
    model(**INPUTS, labels=INPUTS["input_ids"]).loss.backward()
    copies = [p for n, p in model.named_parameters() if "attn_gate.modules_to_save" in n]
    assert len(copies) == 4 and all(p.grad is not None and p.grad.abs().sum() > 0 for p in copies)
    unpatch(model)
    assert not any("attn_gate" in name for name, _ in model.named_modules())


def _with_cpu_repacking(model) -> list:
    """The model's 4-bit layers, set to repack their weights on an evaluation as bitsandbytes sets them on a
    CPU with AVX512-BF16."""
    bnb = pytest.importorskip("bitsandbytes")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = True
    return layers


def test_patch_keeps_a_4bit_base_trainable_after_an_evaluation_on_a_cpu_with_avx512_bf16(checkpoint):
    peft = pytest.importorskip("peft")
    model = load_quantized(checkpoint, "4bit-float32")
    layers = _with_cpu_repacking(model)
    with pytest.warns(
        UserWarning, match=f"set support_avx512bf16_for_cpu = False on {len(layers)} bitsandbytes"
    ):
        patch(model)
    assert layers and not any(layer.support_avx512bf16_for_cpu for layer in layers)
    with torch.no_grad():
        model(**INPUTS)  # an evaluation: where bitsandbytes repacks, the weights lost their backward here
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["attn_gate"])
    model = peft.get_peft_model(peft.prepare_model_for_kbit_training(model), lora)
    model.train()
    model(**INPUTS, labels=INPUTS["input_ids"]).loss.backward()
    trained = [p for n, p in model.named_parameters() if "lora_B" in n or "attn_gate.modules_to_save" in n]
    assert len(trained) == 8 and all(p.grad is not None and p.grad.abs().sum() > 0 for p in trained)


def test_patch_warns_of_4bit_layers_an_evaluation_repacked_before_it(checkpoint):
    bnb = pytest.importorskip("bitsandbytes")
    if not bnb.functional.has_avx512bf16():
        pytest.skip("bitsandbytes repacks 4-bit weights only on a CPU with AVX512-BF16")
    model = load_quantized(checkpoint, "4bit-float32")
    layers = _with_cpu_repacking(model)
    with torch.no_grad():
        model(**INPUTS)
    with pytest.warns(
        UserWarning, match=f"{len(layers)} bitsandbytes 4-bit layers were repacked for CPU inference"
    ):
        patch(model)


def test_fused_gate_does_not_merge_into_a_quantized_query_and_says_so(checkpoint):
    model = load_quantized(checkpoint, "4bit-float32")
    with torch.no_grad():
        expected = model(**INPUTS).logits
    with pytest.warns(UserWarning, match="query projection of LlamaAttention is quantized"):
        patch(model, backend="fused_gate")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(model(**INPUTS).logits, expected, atol=1e-5, rtol=1e-5)


def test_device_map_with_an_offloaded_layer(checkpoint, tmp_path):
    """accelerate keeps an offloaded layer's weights on the meta device until its forward: its gate is made
    on the device the layer runs on, and the patched model computes the unpatched one."""
    with torch.no_grad():
        expected = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)(**INPUTS).logits
    parts = ("model.embed_tokens", "model.layers.0", "model.norm", "model.rotary_emb", "lm_head")
    device_map = {**dict.fromkeys(parts, "cpu"), "model.layers.1": "disk"}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, device_map=device_map, offload_folder=tmp_path
    )
    assert model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    patch(model, init="paper")
    assert {p.device.type for p in gate_parameters(model)} == {"cpu"}
    unpatch(model)
    patch(model)
    with torch.no_grad():
        assert torch.equal(model(**INPUTS).logits, expected)
