"""`benchmarks/decode.py --patch-once`: a patched copy of the model per case, made once."""

from __future__ import annotations

import copy

import decode
import torch
from helpers import tiny_model

from hf_gate_attention import gate_parameters


def test_patch_once_keeps_one_patched_copy_per_case_and_the_model_ungated():
    model = tiny_model("llama")
    bench = decode.PatchedOnce(model)
    bench.set_case("output/elementwise")
    elementwise = bench.model
    bench.set_case(decode.BASELINE)
    assert bench.model is model and not list(gate_parameters(model))
    bench.set_case("output/elementwise")
    assert bench.model is elementwise and elementwise is not model
    repatched = decode.Bench(copy.deepcopy(model))  # the one model patched again before each measurement
    repatched.set_case("output/elementwise")
    for once, again in zip(gate_parameters(elementwise), gate_parameters(repatched.model), strict=True):
        assert torch.equal(once, again)  # the same gates either way
    ids = torch.randint(model.config.vocab_size, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(elementwise(ids).logits, repatched.model(ids).logits, rtol=0, atol=0)
