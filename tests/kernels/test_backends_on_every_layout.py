"""The Triton backends on the layouts the structural search added (GPT-2's Conv1D, GPT-NeoX's and Falcon's
per-group fused qkv, cross-attention, T5, composite models, Swin, DeBERTa): `fused_gate` runs the gates in
the hooks, so it serves every layout and must equal the torch reference, forward and every parameter's
gradient; `triton` applies them in its attention function, which serves some (equal likewise) and refuses
the others at patch time, saying why."""

from __future__ import annotations

import pytest
import torch
from model_zoo import zoo_inputs, zoo_model
from supported_models import gate_everything

KEYS = ("gpt2", "gpt_neox", "falcon", "bart", "t5", "llava", "deberta-v2", "swin", "vision-encoder-decoder")
# zoo key -> why the triton backend refuses it (None: it serves it)
TRITON_REFUSES = {
    "gpt2": None,
    "gpt_neox": None,
    "falcon": None,
    "bart": "is cross-attention",
    "t5": "belongs to a part with a config of its own",
    "llava": "belongs to a part with a config of its own",
    "deberta-v2": "without transformers' attention interface",
    "swin": "adds a relative position bias",
    "vision-encoder-decoder": "belongs to a part with a config of its own",
}


def _output(model, inputs) -> torch.Tensor:
    outputs = model(**inputs)
    return next(
        getattr(outputs, n) for n in ("logits", "last_hidden_state") if getattr(outputs, n, None) is not None
    )


def _outputs_and_gradients(key: str, backend: str, top_k) -> list[tuple[torch.Tensor, dict]]:
    """`(output, {parameter name: gradient})` of the torch masked reference and of `backend`, the same
    gates in both, after one backward of a loss on the output (every parameter, not only the gates)."""
    reference, model = zoo_model(key).train(), zoo_model(key).train()
    gate_everything(reference, sparse=False, init="paper", top_k=top_k)
    gate_everything(model, backend=backend, init="paper", top_k=top_k)
    model.load_state_dict(reference.state_dict())
    inputs = zoo_inputs(key)
    results = []
    for patched in (reference, model):
        output = _output(patched, inputs)
        output.float().pow(2).mean().backward()
        results.append((output.detach(), {name: p.grad for name, p in patched.named_parameters()}))
    return results


def _assert_equal_to_reference(results) -> None:
    (expected, expected_grads), (got, grads) = results
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    assert any(".attn_gate." in name and grad is not None for name, grad in grads.items())
    for name, grad in grads.items():
        if expected_grads[name] is None:
            assert grad is None, name
        else:
            torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("top_k", [None, 1])
@pytest.mark.parametrize("key", KEYS)
def test_fused_gate_equals_torch_forward_and_backward(key, top_k):
    results = _outputs_and_gradients(key, "fused_gate", top_k)
    (expected, _), (got, grads) = results
    assert got.shape == expected.shape and all(
        torch.isfinite(g).all() for g in grads.values() if g is not None
    )
    _assert_equal_to_reference(results)


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [None, 1])
@pytest.mark.parametrize("key", KEYS)
def test_triton_equals_torch_or_refuses_at_patch_time(key, top_k):
    if TRITON_REFUSES[key] is None:
        results = _outputs_and_gradients(key, "triton", top_k)
        assert results[1][0].shape == results[0][0].shape
        _assert_equal_to_reference(results)
        return
    model = zoo_model(key)
    with pytest.raises(ValueError, match=TRITON_REFUSES[key]):
        gate_everything(model, backend="triton", top_k=top_k)
    assert not any("attn_gate" in name for name, _ in model.named_modules())
