"""Every parameter's gradient on `backend="triton"` equals `backend="torch"` and the unpatched model.

One model type per registered family layout (decoder, fused-qkv decoder, BERT, ViT), bare and with a task
head, at lengths below, at and across the interpreter's block of 16 (`kernels/gated_attention.py`), padded on
the left or the right; then a short training run per family whose loss curves must agree.

The loss is a fixed random projection of the model's output over the real (non-padded) positions. A loss such
as `last_hidden_state.pow(2).mean()` is no test of gradients: the last LayerNorm (weight 1, bias 0) makes its
output's mean square almost constant, so every gradient below it is rounding noise (about 1e-9 against 1e-1
above it in float32, 1e-14 in float64) and differs between any two implementations by 100 %. Parameters
whose exact gradient is 0 (key biases: softmax ignores a per-query constant) are held to the same noise floor,
the absolute tolerance scaled by the largest gradient of the model.
"""

from __future__ import annotations

import pytest
import torch
from helpers import IMAGE_MODELS, TINY_MODELS, first_output, tiny_inputs, tiny_model

pytest.importorskip("triton")

from hf_gate_attention import patch

pytestmark = pytest.mark.slow  # the whole grid; test_fused_backend.py keeps a quick triton check
# model type per family layout -> config overrides that give 17 image tokens (across one block of 16)
FAMILY_MODEL_TYPES = {"llama": {}, "phi3": {}, "bert": {}, "vit": {"image_size": 20, "patch_size": 5}}
RTOL, ATOL_OF_MAX = 1e-4, 1e-6
# the Triton backends: our fused attention, and the vendor attention with the merged query/gate GEMM and the
# fused gate pass
FAST_BACKENDS = ("triton", "fused_gate")


def _loss_weights(output: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """Fixed random weights of the output's elements, 0 at padded positions `(B, L)`."""
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(7))
    return weights if real is None else weights * real[..., None]


def _inputs(model_type: str, length: int, padding: str, overrides: dict | None = None) -> dict:
    """Token ids of `length` with a third padded, or images of the size in `overrides` (default: the family's
    17-token size)."""
    if model_type in IMAGE_MODELS:
        overrides = FAMILY_MODEL_TYPES.get(model_type, {}) if overrides is None else overrides
        size = overrides.get("image_size", TINY_MODELS[model_type][0]["image_size"])
        return {"pixel_values": torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))}
    inputs = tiny_inputs(model_type, batch=2, length=length)
    mask = torch.ones_like(inputs["input_ids"])
    padded = length // 3
    if padding == "left":
        mask[0, :padded] = 0
    else:
        mask[1, length - padded :] = 0
    return inputs | {"attention_mask": mask}


def gradients(model_type: str, bare: bool, inputs: dict, backend: str | None, **gate) -> dict:
    """The output and `{name: grad}` of every parameter after one backward of the projection loss."""
    model = tiny_model(
        model_type, bare=bare, attn_implementation="sdpa", **FAMILY_MODEL_TYPES.get(model_type, {})
    )
    if backend is not None:
        patch(model, backend=backend, **gate)
    outputs = model(**inputs)
    output = first_output(outputs)
    real = inputs.get("attention_mask")
    real = real.bool() if real is not None and output.dim() == 3 else None
    loss = (output * _loss_weights(output, real)).sum()
    pooled = getattr(outputs, "pooler_output", None)  # bare BERT/ViT: the pooler's weights get gradients too
    loss = loss if pooled is None else loss + (pooled * _loss_weights(pooled, None)).sum()
    loss.backward()
    grads = {name: param.grad for name, param in model.named_parameters() if param.requires_grad}
    unused = [name for name, grad in grads.items() if grad is None]
    assert unused in ([], ["embeddings.mask_token"]), unused  # DINOv2's mask token: only with masked inputs
    grads = {name: grad for name, grad in grads.items() if grad is not None}
    return output.detach() if real is None else output.detach()[real], grads


def assert_same_gradients(grads: dict, expected: dict, what: str) -> None:
    assert expected.keys() <= grads.keys(), sorted(expected.keys() - grads.keys())
    atol = ATOL_OF_MAX * max(grad.abs().max().item() for grad in expected.values())
    for name, grad in expected.items():
        torch.testing.assert_close(
            grads[name], grad, rtol=RTOL, atol=atol, msg=lambda m, n=name: f"{what} {n}: {m}"
        )


GRADIENT_CASES = [
    (model_type, bare, length, padding)
    for model_type in FAMILY_MODEL_TYPES
    for bare in (True, False)
    for length, padding in (
        ((17, "none"),)  # 16 patches + CLS
        if model_type in IMAGE_MODELS
        else ((15, "left"), (16, "right"), (17, "left"), (33, "right"))
    )
]


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize(("model_type", "bare", "length", "padding"), GRADIENT_CASES)
def test_every_gradient_matches_torch_and_the_unpatched_model(model_type, bare, length, padding, backend):
    inputs = _inputs(model_type, length, padding)
    gate = {"variant": "output", "granularity": "headwise", "init": "identity"}
    out, unpatched = gradients(model_type, bare, inputs, None)
    torch_out, torch_grads = gradients(model_type, bare, inputs, "torch", **gate)
    fused_out, fused_grads = gradients(model_type, bare, inputs, backend, **gate)
    torch.testing.assert_close(fused_out, torch_out, rtol=RTOL, atol=1e-5)
    torch.testing.assert_close(fused_out, out, rtol=RTOL, atol=1e-5)
    assert fused_grads.keys() == torch_grads.keys() and len(fused_grads) > len(unpatched)
    assert_same_gradients(fused_grads, torch_grads, f"{backend} vs torch")
    assert_same_gradients(fused_grads, unpatched, f"{backend} vs unpatched")  # identity init: same function


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("model_type", list(FAMILY_MODEL_TYPES))
@pytest.mark.parametrize(("variant", "granularity"), [("qk", "elementwise"), ("value", "headwise")])
def test_every_gradient_matches_torch_for_the_other_gates(model_type, variant, granularity, backend):
    inputs = _inputs(model_type, 17, "right")
    gate = {"variant": variant, "granularity": granularity, "init": "paper"}
    torch_out, torch_grads = gradients(model_type, False, inputs, "torch", **gate)
    fused_out, fused_grads = gradients(model_type, False, inputs, backend, **gate)
    torch.testing.assert_close(fused_out, torch_out, rtol=RTOL, atol=1e-5)
    assert_same_gradients(fused_grads, torch_grads, f"{backend} vs torch")


# the tiny configs of mistral, gemma2 and gemma3_text set a sliding window, which the fused attention refuses
# (tests/kernels/test_fused_backend.py); every other registered model type runs on it
FUSED_MODEL_TYPES = [t for t in TINY_MODELS if t not in ("mistral", "gemma2", "gemma3_text")]


@pytest.mark.parametrize("model_type", FUSED_MODEL_TYPES)
def test_every_model_type_with_its_head_matches_torch(model_type):
    """On the fused attention; `fused_gate` runs every model type, sliding windows included (below)."""
    inputs = _inputs(model_type, 17, "right")
    gate = {"variant": "output", "granularity": "headwise", "init": "paper"}
    torch_out, torch_grads = gradients(model_type, False, inputs, "torch", **gate)
    fused_out, fused_grads = gradients(model_type, False, inputs, "triton", **gate)
    torch.testing.assert_close(fused_out, torch_out, rtol=RTOL, atol=1e-5)
    assert_same_gradients(fused_grads, torch_grads, "triton vs torch")


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
@pytest.mark.parametrize("model_type", [t for t in TINY_MODELS if t != "gemma2"])  # gemma2 refuses sdpa
def test_fused_gate_serves_every_model_type_with_its_head(model_type, granularity):
    """Sliding windows included: `fused_gate` keeps the model's own attention."""
    inputs = _inputs(model_type, 17, "left" if model_type not in IMAGE_MODELS else "none")
    gate = {"variant": "output", "granularity": granularity, "init": "paper"}
    torch_out, torch_grads = gradients(model_type, False, inputs, "torch", **gate)
    fused_out, fused_grads = gradients(model_type, False, inputs, "fused_gate", **gate)
    torch.testing.assert_close(fused_out, torch_out, rtol=RTOL, atol=1e-5)
    assert_same_gradients(fused_grads, torch_grads, "fused_gate vs torch")


def loss_curve(model_type: str, backend: str, steps: int) -> list[float]:
    """Losses of `steps` AdamW steps of a 1-layer gated (paper init) tiny model on one fixed random batch."""
    model = tiny_model(model_type, attn_implementation="sdpa", num_hidden_layers=1).train()
    patch(model, variant="output", granularity="elementwise", init="paper", backend=backend)
    inputs = _inputs(model_type, 12, "right", overrides={})  # within one block (crossing: the tests above)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        output = first_output(model(**inputs))
        real = inputs.get("attention_mask")
        weights = _loss_weights(output, real.bool() if real is not None and output.dim() == 3 else None)
        loss = (output * weights).sum() / weights.abs().sum() + 0.1 * output.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("model_type", list(FAMILY_MODEL_TYPES))
def test_training_loss_curves_of_both_backends_agree(model_type, backend):
    """Liger-Kernel's convergence test: the same steps on both backends give the same loss curve."""
    expected = loss_curve(model_type, "torch", steps=24)
    losses = loss_curve(model_type, backend, steps=24)
    assert expected[-1] < expected[0] - 0.1 * abs(expected[0]), f"the model did not train: {expected}"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-3, atol=1e-4)
