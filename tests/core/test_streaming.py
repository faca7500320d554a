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


def _masks(kind: str, batch: int, length: int, keys: int) -> torch.Tensor | None:
    """`allowed (B, 1, L, S)` of a mask kind; the causal ones put query `i` at key `S - L + i` (static: at
    `7 + i`, the later slots unfilled) and left-pad sequence `b` by `(0, 5, 11)[b]` keys."""
    key_at = torch.arange(keys)
    padding = key_at >= torch.tensor([0, 5, 11][:batch])[:, None, None]  # (B, 1, S)
    query_at = (
        torch.arange(keys - length, keys)[:, None]
        if kind != "static"
        else torch.arange(7, 7 + length)[:, None]
    )
    causal = key_at <= query_at  # (L, S)
    masks = {
        "causal": causal & padding,
        "static": causal & padding,
        "bidirectional": padding.expand(batch, length, keys),
        "sliding": causal & (key_at > query_at - 13) & padding,
        "holes": (causal & (key_at % 5 != 2))[None],
    }
    return masks[kind].unsqueeze(1)


def _by_mask(query, key, value, allowed, sink: int, window: int) -> torch.Tensor:
    """What `blocked_streaming_attention` computes, with the `(L, S)` mask of `streaming_keys`."""
    reads = streaming.streaming_keys(allowed, sink, window)
    seen = reads.any(-1, keepdim=True)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, reads | ~seen, enable_gqa=True)
    return out * seen


BLOCKED_CASES = [
    # (mask, batch, heads, groups, queries, keys, sink, window): odd lengths, 1 to 4 heads per group
    ("causal", 3, 6, 3, 37, 37, 2, 3),
    ("causal", 2, 4, 4, 29, 45, 0, 9),  # queries after a cache
    ("static", 3, 4, 1, 50, 61, 4, 5),
    ("bidirectional", 2, 8, 2, 40, 40, 3, 0),
    ("causal", 1, 4, 2, 9, 30, 2, 3),  # one block after a cache
    ("causal", 2, 2, 1, 70, 70, 1, 16),  # several blocks of 16
]


def _assert_equal_with_gradients(out, expected, inputs, generator) -> None:
    """`out` equals `expected` (float64), and so do the gradients of `inputs` under random output weights."""
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    weights = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    ("kind", "batch", "heads", "groups", "queries", "keys", "sink", "window"),
    BLOCKED_CASES,
    ids=[f"{c[0]}-B{c[1]}-H{c[2]}-KV{c[3]}-L{c[4]}-S{c[5]}-sink{c[6]}-window{c[7]}" for c in BLOCKED_CASES],
)
def test_blocked_reads_equal_the_masked_reads_forward_and_backward(
    kind, batch, heads, groups, queries, keys, sink, window
):
    """The blocked streaming attention against SDPA with the `(L, S)` mask, float64, on fresh random inputs:
    output and the gradients of query, key and value; rows that see nothing (left padding) give 0."""
    generator = torch.Generator().manual_seed(queries * keys + sink)
    shapes = [(batch, heads, queries, 16), (batch, groups, keys, 16), (batch, groups, keys, 16)]
    inputs = [
        torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True) for shape in shapes
    ]
    allowed = _masks(kind, batch, queries, keys)
    out = streaming.blocked_streaming_attention(*inputs, allowed, True, sink, window, scaling=0.3)
    assert out is not None
    query, key, value = inputs  # SDPA's default scale is 16**-0.5
    expected = _by_mask(query * 0.3 * 16**0.5, key, value, allowed, sink, window)
    _assert_equal_with_gradients(out, expected, inputs, generator)
    sees_nothing = ~allowed.any(-1, keepdim=True)  # (B, 1, L, 1): padding queries before their sequence
    assert torch.equal(out * sees_nothing, torch.zeros_like(out))


@pytest.mark.parametrize("length", [32, 33], ids=["whole-blocks", "padded-block"])
@pytest.mark.parametrize("causal", [True, False])
def test_blocked_reads_without_a_mask_follow_causality(causal, length):
    """Without a mask (no host sync), float64: output and the query, key and value gradients equal the
    masked reads, with the last block whole or padded."""
    generator = torch.Generator().manual_seed(int(causal) + length)
    inputs = [
        torch.randn(2, 4, length, 8, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    ]
    allowed = streaming.allowed_keys(None, length, length, causal, "cpu")
    out = streaming.blocked_streaming_attention(*inputs, None, causal, 2, 5)
    expected = _by_mask(*inputs, allowed, 2, 5)
    _assert_equal_with_gradients(out, expected, inputs, generator)


@pytest.mark.parametrize("length", [32, 37], ids=["whole-blocks", "padded-block"])
def test_blocked_reads_with_their_log_sum_exp(length):
    """`lse=True`: the same reads, and each row's log-sum-exp over its sink and window keys (what sparse
    prefill merges kept rows by); with dropout or gradients it raises instead of ignoring them."""
    generator = torch.Generator().manual_seed(length)
    query = torch.randn(2, 4, length, 8, generator=generator)
    key, value = (torch.randn(2, 2, length, 8, generator=generator) for _ in range(2))
    inputs = (query, key, value, None, True, 2, 8)
    with torch.no_grad():
        out, lse = streaming.blocked_streaming_attention(*inputs, 0.3, lse=True)
        torch.testing.assert_close(out, streaming.blocked_streaming_attention(*inputs, 0.3))
        read_keys = streaming.streaming_keys(streaming.allowed_keys(None, length, length, True, "cpu"), 2, 8)
        scores = query @ key.repeat_interleave(2, 1).transpose(-1, -2) * 0.3  # (B, H, L, S)
        expected = scores.masked_fill(~read_keys, -torch.inf).logsumexp(-1)  # (B, H, L)
        torch.testing.assert_close(lse, expected)
        with pytest.raises(ValueError, match="no dropout and no gradient"):
            streaming.blocked_streaming_attention(*inputs, 0.3, 0.1, lse=True)
    with pytest.raises(ValueError, match="no dropout and no gradient"):
        streaming.blocked_streaming_attention(query.requires_grad_(), *inputs[1:], lse=True)


@pytest.mark.parametrize("length", [32, 37])
def test_blocked_reads_without_a_mask_never_sync_with_the_host(length):
    """Without a mask the blocked reads know on the host that they apply: dynamo traces them whole
    (`fullgraph=True` raises at a graph break, which any `.tolist()`/`.item()` would be), with and without
    rows padded to a whole block, and the traced function gives the same output."""
    generator = torch.Generator().manual_seed(length)
    query = torch.randn(2, 4, length, 8, generator=generator)
    key, value = (torch.randn(2, 2, length, 8, generator=generator) for _ in range(2))
    torch._dynamo.reset()
    traced = torch.compile(streaming.blocked_streaming_attention, fullgraph=True, backend="eager")
    inputs = (query, key, value, None, True, 2, 8)
    torch.testing.assert_close(traced(*inputs), streaming.blocked_streaming_attention(*inputs))


@pytest.mark.parametrize(
    ("kind", "queries", "sink", "window"),
    [("holes", 37, 2, 3), ("sliding", 37, 2, 3), ("causal", 37, 20, 9), ("causal", 7, 2, 3)],
)
def test_blocked_reads_leave_other_masks_to_the_mask(kind, queries, sink, window):
    """Rows with holes, sliding-window rows whose sink moves, reads covering most keys, and fewer query rows
    than a block of 8 (decode steps: a block slice would read keys outside the sink and window): `None`."""
    query, key, value = torch.randn(2, 4, queries, 8), torch.randn(2, 2, 37, 8), torch.randn(2, 2, 37, 8)
    allowed = _masks(kind, 2, queries, 37)
    assert streaming.blocked_streaming_attention(query, key, value, allowed, True, sink, window) is None


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
