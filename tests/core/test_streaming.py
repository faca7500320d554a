"""Dropped units that read their sink and window keys (`GateConfig.top_k_sink/top_k_window`,
`core/streaming.py`): the semantics against a direct computation, the limits that reduce it to known cases,
its validation, the backends that serve it, and a few training steps. The sparse path's equality with this
reference, `generate` and "reads nothing else" are tested in `test_sparse.py`."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import first_output, tiny_inputs, tiny_model

from hf_gate_attention import GateConfig, patch, unpatch
from hf_gate_attention.core import streaming
from hf_gate_attention.core.gate import AttentionGate

GQA = {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 8}


def _streaming_keys_by_loop(allowed: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """`streaming_keys` written out: per row, the first `sink` and the last `window` allowed keys."""
    out = torch.zeros_like(allowed)
    for index in itertools.product(*(range(n) for n in allowed.shape[:-1])):
        keys = allowed[index].nonzero().flatten().tolist()
        for key in keys[:sink] + keys[max(len(keys) - window, 0) :]:
            out[(*index, key)] = True
    return out


@pytest.mark.parametrize(("sink", "window"), [(0, 1), (2, 0), (1, 3), (4, 64)])
def test_streaming_keys_are_the_first_and_last_keys_each_query_may_see(sink, window):
    generator = torch.Generator().manual_seed(sink * 10 + window)
    allowed = torch.rand(3, 1, 7, 11, generator=generator) > 0.4  # rows with gaps, and empty rows
    allowed[0, 0, 2] = False
    expected = _streaming_keys_by_loop(allowed, sink, window)
    assert torch.equal(streaming.streaming_keys(allowed, sink, window), expected)


def test_allowed_keys_follow_the_mask_or_causality():
    additive = torch.zeros(1, 1, 2, 3)
    additive[..., 0, 2] = torch.finfo(torch.float32).min
    assert streaming.allowed_keys(additive, 2, 3, True, "cpu").tolist() == [
        [[[True, True, False], [True] * 3]]
    ]
    causal = streaming.allowed_keys(None, 2, 4, True, "cpu")  # queries at positions 2 and 3
    assert causal.tolist() == [[[[True, True, True, False], [True, True, True, True]]]]
    assert streaming.allowed_keys(None, 2, 4, False, "cpu").all()


def _logits(model, config: GateConfig, inputs: dict, sparse=None) -> torch.Tensor:
    torch.manual_seed(7)  # the same gate weights for every config of the same shape
    patch(model, config, backend="torch", sparse=sparse)
    with torch.no_grad():
        out = first_output(model(**inputs))
    unpatch(model)
    return out


@pytest.mark.parametrize("sparse", [False, True], ids=["masked", "sparse"])
def test_a_window_over_every_key_is_the_dense_gate_and_no_window_is_todays_top_k(sparse):
    model = tiny_model("llama", attn_implementation="sdpa", **GQA)
    inputs = tiny_inputs("llama", batch=2, length=9)
    top_k = GateConfig(init="paper", top_k=1, top_k_unit="kv_group")
    dense = _logits(model, top_k.replace(top_k=None, top_k_unit="head"), inputs)
    everything = _logits(model, top_k.replace(top_k_window=9), inputs, sparse)
    torch.testing.assert_close(everything, dense, atol=1e-5, rtol=1e-5)
    nothing = _logits(model, top_k, inputs, sparse)
    some = _logits(model, top_k.replace(top_k_sink=1, top_k_window=2), inputs, sparse)
    assert (some - nothing).abs().max() > 1e-3 and (some - dense).abs().max() > 1e-3


def test_dropped_units_keep_their_gate_values():
    gate = AttentionGate(GateConfig(init="paper", top_k=1, top_k_window=4), 16, 4, 4, 4)
    x = torch.randn(2, 3, 16)
    values, keep = gate.with_selection(x=x)
    assert torch.equal(keep.sum(-1), torch.ones(2, 3))
    torch.testing.assert_close(values, torch.sigmoid(gate.logits(x)))  # paper init: scale 1, no zeros


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_k": 1, "top_k_sink": -1}, "top_k_sink=-1 is not valid; accepted values: an int >= 0"),
        ({"top_k": 1, "top_k_window": 2.5}, "top_k_window=2.5 is not valid"),
        ({"top_k": 1, "top_k_window": True}, "top_k_window=True is not valid"),
        ({"top_k_window": 4}, "need top_k and variant 'output' or 'qk'"),
        ({"variant": "value", "top_k": 1, "top_k_sink": 4}, "need top_k and variant 'output' or 'qk'"),
    ],
)
def test_bad_sink_and_window_values_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        GateConfig(**fields)


def test_configs_saved_before_the_fields_existed_read_as_dropping_to_zero():
    saved = {"variant": "output", "granularity": "headwise", "init": "identity", "top_k": 2}
    config = GateConfig.from_saved(saved)
    assert (config.top_k_sink, config.top_k_window, config.dropped_reads_keys) == (0, 0, False)


def test_fused_gate_says_it_does_not_serve_it():
    pytest.importorskip("triton")
    config = GateConfig(top_k=1, top_k_unit="kv_group", top_k_window=4)
    with pytest.raises(ValueError, match="top_k_window\\) run on backends 'torch' and 'triton'"):
        patch(tiny_model("llama", **GQA), config, backend="fused_gate")
    model = patch(tiny_model("llama", **GQA), config, backend="auto", sparse=False)  # on CPU: torch
    assert model.config._attn_implementation == streaming.ATTN_IMPLEMENTATION


def test_training_lowers_the_loss_and_reaches_every_gate():
    """A few AdamW steps on one batch with top-1 of 3 groups and sink/window reads: the loss falls, and
    every gate gets a gradient (a dropped group's output is gated, so its gate learns too)."""
    model = tiny_model("llama", attn_implementation="sdpa", **GQA).train()
    patch(model, init="identity", top_k=1, top_k_unit="kv_group", top_k_sink=1, top_k_window=3)
    inputs = tiny_inputs("llama", batch=2, length=12)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
        losses.append(loss.item())
        gates = [m for m in model.modules() if isinstance(m, AttentionGate)]
        assert all(gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0 for gate in gates)
        optimizer.step()
    assert losses[-1] < losses[0] - 0.1
