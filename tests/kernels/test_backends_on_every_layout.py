"""The Triton backends on the layouts the structural search added (GPT-2's Conv1D, GPT-NeoX's and Falcon's
per-group fused qkv, cross-attention, T5, composite models, Swin, DeBERTa): `fused_gate` runs the gates in
the hooks, so it serves every layout and must equal the torch reference, forward and every gate's gradient;
`triton` applies them in its attention function, which serves some and refuses the others at patch time,
saying why."""

from __future__ import annotations

import pytest
import torch
from model_zoo import zoo_inputs, zoo_model
from supported_models import gate_everything

from hf_gate_attention import gate_parameters

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


def _compare(key: str, backend: str, top_k):
    reference, model = zoo_model(key).train(), zoo_model(key).train()
    gate_everything(reference, sparse=False, init="paper", top_k=top_k)
    gate_everything(model, backend=backend, init="paper", top_k=top_k)
    model.load_state_dict(reference.state_dict())
    inputs = zoo_inputs(key)
    outputs = [_output(m, inputs) for m in (reference, model)]
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    for out in outputs:
        out.float().pow(2).mean().backward()
    for expected, got in zip(gate_parameters(reference), gate_parameters(model), strict=True):
        torch.testing.assert_close(got.grad, expected.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("top_k", [None, 1])
@pytest.mark.parametrize("key", KEYS)
def test_fused_gate_equals_torch_forward_and_backward(key, top_k):
    _compare(key, "fused_gate", top_k)


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [None, 1])
@pytest.mark.parametrize("key", KEYS)
def test_triton_equals_torch_or_refuses_at_patch_time(key, top_k):
    if TRITON_REFUSES[key] is None:
        _compare(key, "triton", top_k)
        return
    model = zoo_model(key)
    with pytest.raises(ValueError, match=TRITON_REFUSES[key]):
        gate_everything(model, backend="triton", top_k=top_k)
    assert not any("attn_gate" in name for name, _ in model.named_modules())
