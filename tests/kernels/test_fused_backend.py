"""`patch(..., backend="triton")`: patched models on the fused kernels equal the torch reference path.

On this CPU machine the kernels run through Triton's interpreter (`TRITON_INTERPRET=1`, set in conftest).
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import tiny_inputs, tiny_model

pytest.importorskip("triton")

import hf_gate_attention.kernels
from hf_gate_attention import (
    GateConfig,
    from_pretrained,
    gate_backend_of,
    gate_config_of,
    gate_parameters,
    patch,
    unpatch,
)
from hf_gate_attention.kernels import backends
from hf_gate_attention.kernels.backends import ATTN_IMPLEMENTATION


def _run(model_type, backend, variant, top_k, inputs, sparse=None):
    model = tiny_model(model_type, attn_implementation="sdpa")
    config = GateConfig(variant=variant, granularity="elementwise", init="paper", top_k=top_k)
    patch(model, config, backend=backend, sparse=sparse)
    logits = model(**inputs).logits
    logits.float().pow(2).sum().backward()
    named = dict(model.named_parameters())
    grads = {n: named[n].grad for n in named if "attn_gate" in n or "layers.0.self_attn.q_proj" in n}
    return model, logits.detach(), grads


def _spy_on_prefill_attention(monkeypatch) -> list[str]:
    """The names of the attention functions backend "triton" calls for queries too long for the decode
    kernel, in call order: SDPA and the gate pass (`masked_top_k_attention`) or our flash kernel."""
    calls = []
    for module, name in (
        (backends, "masked_top_k_attention"),
        (hf_gate_attention.kernels, "gated_flash_attention"),
    ):
        function = getattr(module, name)

        def spy(*args, _function=function, _name=name, **kwargs):
            calls.append(_name)
            return _function(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return calls


# (variant, top_k, sparse): `value` gates have nothing to skip (sparse=True is refused, tested below)
TRAINING_CASES = [
    *((variant, top_k, None) for variant in ("output", "qk", "value") for top_k in (None, 2)),
    ("output", 2, True),
    ("qk", 2, True),
]


@pytest.mark.parametrize(("variant", "top_k", "sparse"), TRAINING_CASES)
@pytest.mark.parametrize("model_type", ["llama", "bert"])
def test_triton_backend_matches_torch_forward_and_backward(model_type, variant, top_k, sparse, monkeypatch):
    """Training on backend "triton": the flash kernel, or with `top_k` SDPA and the masked gate pass
    (`sparse=True`: the flash kernel skipping tiles); `value` gates keep the model's attention."""
    inputs = tiny_inputs(model_type, batch=2, length=9)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    inputs["attention_mask"][0, :3] = 0  # left padding in the first sequence
    _, expected, expected_grads = _run(model_type, "torch", variant, top_k, inputs)
    calls = _spy_on_prefill_attention(monkeypatch)
    model, logits, grads = _run(model_type, "triton", variant, top_k, inputs, sparse)
    fused_attention = variant != "value"
    assert (model.config._attn_implementation == ATTN_IMPLEMENTATION) == fused_attention
    ran = "masked_top_k_attention" if top_k and not sparse else "gated_flash_attention"
    assert calls == ([ran] * model.config.num_hidden_layers if fused_attention else [])
    rows = inputs["attention_mask"].bool() if model_type == "llama" else slice(None)  # skip padded queries
    torch.testing.assert_close(logits[rows], expected[rows], atol=1e-5, rtol=1e-4)
    assert grads.keys() == expected_grads.keys() and len(grads) > 1
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    unpatch(model)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("sparse", [None, True])
@pytest.mark.parametrize("cache", [None, "dynamic", "static"])
def test_top_k_prefill_on_triton_equals_the_masked_reference(cache, sparse, monkeypatch):
    """A no-grad prefill of 20 left-padded tokens per sequence (too long for the decode kernel) with top-1 of
    3 key/value groups, after 4 tokens already in the cache, equals the masked torch reference: SDPA with the
    keys each query sees (padding, the cache's offset, a static cache's unfilled slots), then the gate pass
    (`sparse=True`: the flash kernel)."""
    gqa = {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3}
    config = GateConfig(init="paper", top_k=1, top_k_unit="kv_group")
    inputs = tiny_inputs("llama", batch=2, length=24)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    inputs["attention_mask"][1, :3] = 0
    logits = {}
    for backend, options in (("torch", {"sparse": False}), ("triton", {"sparse": sparse})):
        model = tiny_model("llama", **gqa)
        torch.manual_seed(7)  # the same gate weights on both backends
        patch(model, config, backend=backend, **options)
        if backend == "triton":
            calls = _spy_on_prefill_attention(monkeypatch)
        cached = {}
        if cache is not None:
            past = (
                transformers.StaticCache(config=model.config, max_cache_len=32)
                if cache == "static"
                else transformers.DynamicCache(config=model.config)
            )
            cached = {"past_key_values": past, "use_cache": True}
            with torch.no_grad():  # the first 4 tokens (the decode kernel), then 20 more
                model(
                    input_ids=inputs["input_ids"][:, :4],
                    attention_mask=inputs["attention_mask"][:, :4],
                    **cached,
                )
        with torch.no_grad():
            ids = inputs["input_ids"][:, 4:] if cache else inputs["input_ids"]
            out = model(input_ids=ids, attention_mask=inputs["attention_mask"], **cached)
        logits[backend] = out.logits
    rows = inputs["attention_mask"][:, -logits["torch"].shape[1] :].bool()
    torch.testing.assert_close(logits["triton"][rows], logits["torch"][rows], atol=1e-5, rtol=1e-5)
    expected = "gated_flash_attention" if sparse else "masked_top_k_attention"
    assert calls == [expected] * model.config.num_hidden_layers


def test_sparse_true_on_triton_needs_something_to_skip():
    with pytest.raises(ValueError, match="sparse=True cannot run: variant 'value' gates the values"):
        patch(tiny_model("llama"), variant="value", top_k=1, backend="triton", sparse=True)
    with pytest.raises(ValueError, match=r"sparse=True cannot run: sparse execution needs GateConfig\.top_k"):
        patch(tiny_model("llama"), backend="triton", sparse=True)
    with pytest.raises(ValueError, match=r"sparse=False .* needs backend='torch'"):
        patch(tiny_model("llama"), top_k=1, backend="triton", sparse=False)


def test_triton_backend_generate_with_kv_cache():
    model = patch(tiny_model("llama"), variant="qk", init="paper", backend="triton")
    reference = patch(tiny_model("llama"), variant="qk", init="paper", backend="torch")
    prompt = tiny_inputs("llama", batch=1, length=5)["input_ids"]
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = reference.generate(prompt, **settings)
        assert torch.equal(model.generate(prompt, use_cache=True, **settings), expected)


def test_triton_unavailable_names_the_fallback(monkeypatch):
    monkeypatch.setattr(hf_gate_attention.kernels, "triton_available", lambda: (False, "no CUDA GPU"))
    model = tiny_model("llama")
    with pytest.raises(
        ValueError, match=r"backend='triton' cannot run here: no CUDA GPU. Fallback: backend='torch'"
    ):
        patch(model, backend="triton")
    patch(model, backend="auto")  # auto falls back to the torch path
    assert model.config._attn_implementation == "eager" and gate_backend_of(model) == "torch"


def test_unsupported_head_dim_and_options_are_refused():
    with pytest.raises(ValueError, match=r"head_dim=12 is not supported.*supported head dims"):
        patch(tiny_model("llama", head_dim=12), backend="triton")
    with pytest.raises(ValueError, match="does not support sliding_window"):
        patch(tiny_model("mistral", sliding_window=4), backend="triton")
    value_gated = patch(tiny_model("mistral", sliding_window=4), variant="value", backend="triton")
    assert len(list(gate_parameters(value_gated))) == 4  # value gates never replace the attention


def test_auto_on_cpu_keeps_the_torch_path():
    model = patch(tiny_model("llama"), backend="auto")
    assert model.config._attn_implementation == "eager"


def test_attention_dropout_is_refused_not_ignored():
    model = patch(
        tiny_model("bert", attention_probs_dropout_prob=0.1), init="paper", backend="triton"
    ).train()
    with pytest.raises(ValueError, match="no attention dropout"):
        model(**tiny_inputs("bert"))


def test_invalid_backend_names_the_accepted_values():
    with pytest.raises(
        ValueError, match=r"backend='cuda' is not valid; accepted values: auto, torch, fused_gate, triton"
    ):
        patch(tiny_model("llama"), backend="cuda")


@pytest.mark.parametrize("variant", ["output", "value"])
def test_checkpoints_do_not_remember_the_backend(tmp_path, variant, monkeypatch):
    """Saved on the fused kernels, loaded where they cannot run: the checkpoint holds what the gate computes,
    the backend is chosen at load time."""
    model = patch(tiny_model("llama"), variant=variant, init="paper", backend="triton")
    assert gate_backend_of(model) == "triton"
    inputs = tiny_inputs("llama", batch=1, length=7)
    with torch.no_grad():
        expected = model(**inputs).logits
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["gate_attention"]
    assert "backend" not in saved and saved["variant"] == variant
    assert model.config._attn_implementation in ("eager", ATTN_IMPLEMENTATION)  # save changed nothing

    monkeypatch.setattr(hf_gate_attention.kernels, "triton_available", lambda: (False, "no CUDA GPU"))
    loaded = from_pretrained(tmp_path)  # auto: the torch path here
    assert gate_backend_of(loaded) == "torch" and gate_config_of(loaded) == gate_config_of(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="backend='triton' cannot run here"):
        from_pretrained(tmp_path, backend="triton")


def test_old_checkpoints_that_saved_a_backend_still_load(tmp_path):
    model = patch(tiny_model("llama"), variant="qk", init="paper", backend="torch")
    model.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    config["gate_attention"]["backend"] = "triton"  # what version 0.1.0 wrote
    config_file.write_text(json.dumps(config))
    loaded = from_pretrained(tmp_path, backend="torch")
    assert gate_config_of(loaded) == gate_config_of(model) and gate_backend_of(loaded) == "torch"
    inputs = tiny_inputs("llama", batch=1, length=5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits)
