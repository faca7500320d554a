"""Sparse top-k (`core/sparse.py`) against the masked reference (`patch(..., sparse=False)`): same outputs and
gradients on every architecture it serves, batches whose sequences keep different heads, padding, KV cache
and `generate`; and the dropped key/value groups' cache is never read at decode (with `top_k_sink` and
`top_k_window`: nothing outside their sink and window keys)."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import transformers
from helpers import first_output, tiny_inputs, tiny_model
from model_zoo import zoo_inputs, zoo_model
from torch.nn import functional as F

from hf_gate_attention import GateConfig, patch, unpatch
from hf_gate_attention.core import sparse
from hf_gate_attention.core.gate import AttentionGate
from hf_gate_attention.core.hooks import InlineForward, use_hooks
from hf_gate_attention.core.streaming import streaming_keys

# 6 query heads in 3 key/value groups of 2, so that top-1 and top-2 of the groups both drop something
GQA = {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 8}
ARCHITECTURES = {
    "llama-gqa": ("llama", GQA),
    "qwen2-qkv-bias": ("qwen2", GQA),
    "gemma3-sliding-window": (
        "gemma3_text",
        {**GQA, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "phi3-fused-qkv": ("phi3", {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3}),
    "bert": ("bert", {}),
    "vit": ("vit", {}),
}
# GateConfig fields of the selection; with 3 groups, top-3 of them keeps everything (the path without any
# skip); with top_k_sink/top_k_window a dropped unit reads its sink and window keys (`core/streaming.py`)
SELECTIONS = {
    "top1-kv_group": {"top_k": 1, "top_k_unit": "kv_group"},
    "top2-kv_group": {"top_k": 2, "top_k_unit": "kv_group"},
    "top3-kv_group": {"top_k": 3, "top_k_unit": "kv_group"},
    "top3-head": {"top_k": 3, "top_k_unit": "head"},
    "top1-kv_group-sink2-window3": {"top_k": 1, "top_k_unit": "kv_group", "top_k_sink": 2, "top_k_window": 3},
    "top2-head-window4": {"top_k": 2, "top_k_unit": "head", "top_k_window": 4},
    "top1-kv_group-sink1-window2": {"top_k": 1, "top_k_unit": "kv_group", "top_k_sink": 1, "top_k_window": 2},
}


def _inputs(model_type: str) -> dict:
    """Batch 3 with different paddings: none, 4 left-padded tokens, 2 right-padded tokens."""
    inputs = tiny_inputs(model_type, batch=3, length=13)
    if "input_ids" in inputs:
        mask = torch.ones_like(inputs["input_ids"])
        mask[1, :4] = 0
        mask[2, -2:] = 0
        inputs["attention_mask"] = mask
    return inputs


def _run(model, config: GateConfig, inputs: dict, sparse_mode: bool, compiled: bool = False):
    """Outputs at the non-padded positions and the gradients of every parameter, the gates seeded alike;
    `compiled`: through `torch.compile(fullgraph=True)`, which fails at any graph break."""
    torch.manual_seed(7)
    patch(model, config, backend="torch", sparse=sparse_mode)
    model.zero_grad()
    forward = torch.compile(model, fullgraph=True, backend="eager") if compiled else model
    out = first_output(forward(**inputs))
    mask = inputs.get("attention_mask")
    rows = mask.bool() if mask is not None and out.shape[:2] == mask.shape else slice(None)  # per token
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * weights)[rows].sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    implementation = model.config._attn_implementation
    unpatch(model)
    return out.detach()[rows], grads, implementation


@pytest.mark.parametrize("selection", SELECTIONS, ids=list(SELECTIONS))
@pytest.mark.parametrize("variant", ["output", "qk"])
@pytest.mark.parametrize("architecture", ARCHITECTURES, ids=list(ARCHITECTURES))
@pytest.mark.parametrize("bare", [True, False], ids=["bare", "task-head"])
def test_sparse_matches_masked_forward_and_backward(bare, architecture, variant, selection):
    model_type, overrides = ARCHITECTURES[architecture]
    model = tiny_model(model_type, attn_implementation="sdpa", bare=bare, **overrides).train()
    config = GateConfig(variant=variant, init="paper", **SELECTIONS[selection])
    inputs = _inputs(model_type)
    expected, expected_grads, _ = _run(model, config, inputs, sparse_mode=False)
    out, grads, implementation = _run(model, config, inputs, sparse_mode=True)
    assert implementation == sparse.ATTN_IMPLEMENTATION
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():  # float32 rounding relative to the gradient's size (up to ~300 here)
        scale = max(1.0, expected_grads[name].abs().max().item())
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    ("selection", "blocked"), [("top1-kv_group-sink1-window2", True), ("top1-kv_group-sink2-window3", False)]
)
def test_prefill_reads_run_blocked_unless_they_cover_most_keys(monkeypatch, selection, blocked):
    """The 13-token prefill of the matrix above: with sink 1 + window 2 every layer's dropped heads read
    through `blocked_streaming_attention` (8-row blocks, 1 + 8 + 2 keys < 13); with sink 2 + window 3 they
    read through the mask (2 + 8 + 3 keys is not fewer than 13)."""
    results = []
    blocked_reads = sparse.blocked_streaming_attention
    monkeypatch.setattr(
        sparse,
        "blocked_streaming_attention",
        lambda *a, **kw: results.append(blocked_reads(*a, **kw)) or results[-1],
    )
    model = tiny_model("llama", attn_implementation="sdpa", **GQA)
    patch(model, GateConfig(init="paper", **SELECTIONS[selection]), backend="torch", sparse=True)
    with torch.no_grad():
        model(**_inputs("llama"))
    assert len(results) == 2 and all((out is not None) == blocked for out in results)


def _selections(model, inputs) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The top-k `keep` (B, L, H) of every gated block, in layer order, in one forward of `inputs`, and the
    outputs of that forward (a single sequence's decode step selects on the host: `with_kept_heads`)."""
    kept = []

    def on_host(*args, select, **kwargs):
        gate, heads = select(*args, **kwargs)
        kept.append(torch.tensor(heads, dtype=gate.dtype).view(1, 1, -1))
        return gate, heads

    gates = [module for module in model.modules() if isinstance(module, AttentionGate)]
    for gate in gates:  # instance attributes over the methods, deleted below
        gate.selection = lambda g, select=gate.selection: kept.append(select(g)) or kept[-1]
        gate.with_kept_heads = partial(on_host, select=gate.with_kept_heads)
    try:
        with torch.no_grad():
            outputs = first_output(model(**inputs))
    finally:
        for gate in gates:
            del gate.selection, gate.with_kept_heads
    return kept, outputs


def test_kv_group_selection_keeps_or_drops_whole_groups_and_differs_across_the_batch():
    model = tiny_model("llama", **GQA)
    patch(model, init="paper", top_k=1, top_k_unit="kv_group")
    kept, _ = _selections(model, _inputs("llama"))
    assert len(kept) == 2
    for keep in kept:  # (B, L, 6)
        groups = keep.unflatten(-1, (3, 2))  # (B, L, KV, 2)
        assert torch.equal(groups[..., 0], groups[..., 1])  # both heads of a group alike
        assert torch.equal(groups[..., 0].sum(-1), torch.ones(3, 13))  # exactly one group per token
        assert len({tuple(row.tolist()) for row in groups[..., 0].flatten(0, 1)}) > 1  # tokens differ
    # the sequences of the batch do not all keep the same group at their last token
    assert any(len({tuple(row.tolist()) for row in keep[:, -1]}) > 1 for keep in kept)


def _generate(model, config, inputs, sparse_mode, cache):
    torch.manual_seed(7)
    patch(model, config, backend="torch", sparse=sparse_mode)
    options = {"use_cache": cache != "none"}
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        tokens = model.generate(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0, **options)
        scores = first_output(model(input_ids=tokens, attention_mask=torch.ones_like(tokens)))
    unpatch(model)
    return tokens, scores


STREAMING = {"top_k_sink": 2, "top_k_window": 3}


@pytest.mark.parametrize("dropped", ["nothing", "sink2-window3"])
@pytest.mark.parametrize("architecture", ["llama-gqa", "qwen2-qkv-bias", "gemma3-sliding-window"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("cache", ["dynamic", "static", "none"])
def test_generate_matches_masked_with_left_padding(architecture, cache, batch, dropped):
    model_type, overrides = ARCHITECTURES[architecture]
    model = tiny_model(model_type, attn_implementation="sdpa", **overrides)
    reads = STREAMING if dropped != "nothing" else {}
    config = GateConfig(init="paper", top_k=1, top_k_unit="kv_group", **reads)
    inputs = tiny_inputs(model_type, batch=batch, length=9)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    inputs["attention_mask"][1:, :3] = 0  # left padding, as for batched generation
    inputs["attention_mask"][2:, :5] = 0
    expected_tokens, expected_scores = _generate(model, config, inputs, False, cache)
    tokens, scores = _generate(model, config, inputs, True, cache)
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(scores, expected_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("selection", ["top1-kv_group", "top1-kv_group-sink2-window3", "top2-head-window4"])
@pytest.mark.parametrize("bare", [True, False], ids=["bare", "task-head"])
def test_decode_step_with_gradients_matches_masked_forward_and_backward(bare, selection):
    """A single sequence's decode step on an 11-token cache, with gradients (the eager skipping path:
    host selection, gathered reads, kept groups' calls, partial projections): outputs and every parameter's
    gradient as the masked reference's, bare model and task head."""
    prompt = tiny_inputs("llama", batch=1, length=12)["input_ids"]
    results = []
    for sparse_mode in (False, None):
        model = tiny_model("llama", attn_implementation="sdpa", bare=bare, **GQA).train()
        torch.manual_seed(7)
        patch(model, GateConfig(init="paper", **SELECTIONS[selection]), backend="torch", sparse=sparse_mode)
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=prompt[:, :-1], past_key_values=cache, use_cache=True)
        out = first_output(model(input_ids=prompt[:, -1:], past_key_values=cache, use_cache=True))
        out.square().sum().backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        results.append((out.detach(), grads))
    (expected, expected_grads), (out, grads) = results
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("attn_gate" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
@pytest.mark.parametrize("selection", ["top1-kv_group", "top2-kv_group", "top3-head"])
def test_kept_heads_on_the_host_are_the_selection(selection, granularity):
    """`with_kept_heads` (a single sequence's decode step) keeps the heads `with_selection` keeps, and gives
    the gate values before the selection, on fresh random tokens."""
    config = GateConfig(init="paper", granularity=granularity, **SELECTIONS[selection])
    gate = AttentionGate(config, hidden_size=48, num_heads=6, num_kv_heads=3, head_dim=8)
    for _ in range(20):
        x = torch.randn(1, 1, 48)
        values, kept_heads = gate.with_kept_heads(x=x)
        expected_values, keep = gate.with_selection(x=x)
        assert kept_heads == (keep.view(-1) > 0).tolist()
        torch.testing.assert_close(values, torch.sigmoid(gate.logits(x)), rtol=0, atol=0)
        torch.testing.assert_close(values * keep.unsqueeze(-1), expected_values, rtol=0, atol=0)


def test_a_selection_the_query_projection_made_on_the_host_serves_every_attention_path():
    """After the partial query projection selected on the host (`with_kept_heads`, stashed as `gate`),
    `take_gate()` gives what `with_selection` gives (an attention call that does not take the one-token
    path) and `take_gate(kept_on_host=True)` the kept heads as bools."""
    model = tiny_model("llama", **GQA)
    patch(model, init="paper", top_k=1, top_k_unit="kv_group")
    block_patch = model._gate_attention_patches[0]
    gate = block_patch.gate()
    for kept_on_host in (False, True):
        x = torch.randn(1, 1, 48)
        block_patch.stash.update(x=x, gate=gate.with_kept_heads(x=x))
        values, keep = block_patch.take_gate(kept_on_host=kept_on_host)
        expected_values, expected_keep = gate.with_selection(x=x)
        if kept_on_host:
            assert keep == (expected_keep.view(-1) > 0).tolist()
            torch.testing.assert_close(values * expected_keep.unsqueeze(-1), expected_values, rtol=0, atol=0)
        else:
            torch.testing.assert_close(keep, expected_keep, rtol=0, atol=0)
            torch.testing.assert_close(values, expected_values, rtol=0, atol=0)


@pytest.mark.parametrize("batch", [1, 2])
def test_decode_never_reads_the_cache_of_dropped_groups(batch):
    """One decode step, then the same step again with NaN in the cache of every group the step dropped (per
    layer and sequence) and, for a single sequence, in the dropped heads' rows of the query projection and
    columns of the output projection: identical, finite logits."""
    model = tiny_model("llama", **GQA)
    patch(model, init="paper", top_k=1, top_k_unit="kv_group")
    prompt = tiny_inputs("llama", batch=batch, length=10)["input_ids"]
    _assert_decode_step_ignores_nan_outside(model, prompt, read_positions=[], poison_projections=batch == 1)


@pytest.mark.parametrize("length", [12, 30])
@pytest.mark.parametrize("batch", [1, 2])
def test_decode_of_dropped_groups_reads_only_sink_and_window_keys(batch, length):
    """The same with `top_k_sink=2, top_k_window=3` and a 12- or 30-token prompt (long enough for the
    blocked reads of prefill): NaN in every cached position of a dropped group but the first 2 and the last
    3 the step sees (its own key, written by the step, among them)."""
    model = tiny_model("llama", **GQA)
    patch(model, init="paper", top_k=1, top_k_unit="kv_group", sparse=True, **STREAMING)
    prompt = tiny_inputs("llama", batch=batch, length=length)["input_ids"]
    _assert_decode_step_ignores_nan_outside(model, prompt, read_positions=[0, 1, length - 3, length - 2])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("unit", ["top1-kv_group", "top2-head"])
@pytest.mark.parametrize("reads", [STREAMING, {"top_k_sink": 2, "top_k_window": 40}], ids=["window", "all"])
@pytest.mark.parametrize("skip", [True, False], ids=["skipping", "one-masked-call"])
def test_single_sequence_decode_with_sink_and_window_skips_the_keys_it_does_not_read(
    monkeypatch, skip, reads, unit, cache
):
    """`sparse=None`: a single sequence's decode step skips the keys its dropped groups do not read, or with
    `SKIP_DECODE` off runs one SDPA call with each dropped head masked to its sink and window keys (all the
    keys, when these cover the cache); either way the masked reference's tokens and scores: groups kept
    whole or (top-2 heads of 6) in part, without a mask (dynamic cache) and with one (static cache)."""
    monkeypatch.setattr(sparse, "SKIP_DECODE", skip)
    skipping_steps = []
    decode_one_token = sparse._decode_one_token
    monkeypatch.setattr(
        sparse, "_decode_one_token", lambda *args: skipping_steps.append(1) or decode_one_token(*args)
    )
    model = tiny_model("llama", attn_implementation="sdpa", **GQA)
    selection = SELECTIONS.get(unit, {"top_k": 2, "top_k_unit": "head"})
    config = GateConfig(init="paper", **selection, **reads)
    inputs = tiny_inputs("llama", batch=1, length=9)
    expected_tokens, expected_scores = _generate(model, config, inputs, False, cache)
    tokens, scores = _generate(model, config, inputs, None, cache)
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(scores, expected_scores, atol=1e-5, rtol=1e-5)
    assert bool(skipping_steps) == skip


def test_read_positions_of_a_mask_are_computed_once_per_unchanged_mask():
    """A decode step's layers share one mask: its sink and window positions are computed for the first and
    reused while the tensor is unchanged; a mask written in place, another mask, other sink/window settings
    and a mask made in inference mode (no version counter) each get their own, equal to a fresh count."""

    class Reads:
        dropped_reads_keys, top_k_sink, top_k_window = True, 2, 3

    def fresh(mask, sink=2, window=3):
        return streaming_keys(mask, sink, window)[0, 0, 0].nonzero().squeeze(1)

    mask = torch.ones(1, 1, 1, 12, dtype=torch.bool)
    mask[..., 9:] = False  # a static cache filled up to 9 keys
    first = sparse._read_positions(Reads, mask, 12, mask.device)
    assert torch.equal(first, fresh(mask)) and torch.equal(first, torch.tensor([0, 1, 6, 7, 8]))
    assert sparse._read_positions(Reads, mask, 12, mask.device) is first
    mask[..., 9] = True  # the next step written in place
    assert torch.equal(sparse._read_positions(Reads, mask, 12, mask.device), fresh(mask))
    other = mask.clone()
    other[..., :4] = False  # left padding
    assert torch.equal(sparse._read_positions(Reads, other, 12, mask.device), torch.tensor([4, 5, 7, 8, 9]))
    Reads.top_k_window = 1
    assert torch.equal(sparse._read_positions(Reads, other, 12, mask.device), fresh(other, window=1))
    with torch.inference_mode():
        inference_mask = mask.clone()
        assert torch.equal(sparse._read_positions(Reads, inference_mask, 12, mask.device), fresh(mask, 2, 1))
        inference_mask[..., 1:3] = False
        positions = sparse._read_positions(Reads, inference_mask, 12, mask.device)
        assert torch.equal(positions, torch.tensor([0, 3, 9]))


def _assert_decode_step_ignores_nan_outside(
    model, prompt, read_positions: list[int], poison_projections=False
):
    """Decode the last token of `prompt` after the others, then again with NaN in the cache of the groups
    the step dropped except at `read_positions` (and in the dropped heads' query rows and output columns
    when `poison_projections`): the logits must be identical and finite."""
    batch = prompt.shape[0]
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt[:, :-1], past_key_values=cache, use_cache=True)
    step = {"input_ids": prompt[:, -1:], "past_key_values": cache, "use_cache": True}
    kept, expected = _selections(model, step)  # per layer (B, 1, 6); logits (B, 1, V)
    cache.crop(-1)
    with torch.no_grad():
        for layer, cached, keep in zip(model.model.layers, cache.layers, kept, strict=True):
            dropped = keep[:, 0].unflatten(-1, (3, 2))[..., 0] == 0  # (B, KV)
            assert torch.equal(dropped.sum(-1), torch.full((batch,), 2))  # 2 of 3 groups per sequence
            unread = torch.ones(cached.keys.shape[2], dtype=torch.bool)  # (S,) cached positions
            unread[read_positions] = False
            for b, g in dropped.nonzero().tolist():
                cached.keys[b, g, unread] = float("nan")
                cached.values[b, g, unread] = float("nan")
            if poison_projections:
                channels = (keep[0, 0] == 0).repeat_interleave(8)  # (H*D,) of the dropped heads
                layer.self_attn.q_proj.weight[channels] = float("nan")
                layer.self_attn.o_proj.weight[:, channels] = float("nan")
        logits = model(**step).logits
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("hooks", [False, True], ids=["inline", "hooks"])
def test_single_sequence_decode_projections_are_instance_level_and_removed_by_unpatch(hooks):
    """The partial query and output projections run as the `project` of the projections' `InlineForward`
    or, where hooks run the gate (`use_hooks`), as their instance `forward`."""

    def partial_projection(module) -> bool:
        forward = module.__dict__.get("forward")
        return sparse._is_partial_projection(getattr(forward, "project", forward))

    model = tiny_model("llama", **GQA)
    attention = model.model.layers[0].self_attn
    patch(model, init="paper", top_k=1, top_k_unit="kv_group")
    if hooks:
        use_hooks(model)
    assert isinstance(attention.o_proj.__dict__["forward"], InlineForward) != hooks
    assert partial_projection(attention.q_proj) and partial_projection(attention.o_proj)
    assert "forward" not in attention.k_proj.__dict__
    assert "forward" not in tiny_model("llama").model.layers[0].self_attn.q_proj.__dict__  # no class patch
    unpatch(model)
    assert not any("forward" in module.__dict__ for module in model.modules())
    patch(model, variant="qk", init="paper", top_k=1, top_k_unit="kv_group")  # qk needs every query
    assert partial_projection(attention.o_proj)
    assert getattr(attention.q_proj.__dict__["forward"], "project", None) is None


def test_a_deep_copy_decodes_with_its_own_projections_and_unpatches_alone():
    """`copy.deepcopy` of a sparse patch: the copy's partial projections belong to the copy's modules and
    block patches, its decode step gives the original's logits, and unpatching it leaves the original
    patched and unchanged."""
    model = tiny_model("llama", **GQA)
    patch(model, init="paper", top_k=1, top_k_unit="kv_group")
    copied = copy.deepcopy(model)
    output = copied.model.layers[0].self_attn.o_proj
    project = output.__dict__["forward"].project
    assert project.args[0] is output and project.args[1] is copied._gate_attention_patches[0]
    prompt = tiny_inputs("llama", batch=1, length=10)["input_ids"]

    def decode_step(side):
        cache = transformers.DynamicCache(config=side.config)
        with torch.no_grad():
            side(input_ids=prompt[:, :-1], past_key_values=cache, use_cache=True)
            return side(input_ids=prompt[:, -1:], past_key_values=cache, use_cache=True).logits

    expected = decode_step(model)
    torch.testing.assert_close(decode_step(copied), expected, rtol=0, atol=0)
    unpatch(copied)
    assert not any("forward" in module.__dict__ for module in copied.modules())
    torch.testing.assert_close(decode_step(model), expected, rtol=0, atol=0)


def test_unpatch_restores_the_attention_implementation_and_outputs():
    model = tiny_model("llama", attn_implementation="eager", **GQA)
    inputs = _inputs("llama")
    with torch.no_grad():
        before = first_output(model(**inputs))
    patch(model, init="paper", top_k=2, top_k_unit="kv_group")
    assert model.config._attn_implementation == sparse.ATTN_IMPLEMENTATION
    unpatch(model)
    assert model.config._attn_implementation == "eager"
    with torch.no_grad():
        assert torch.equal(first_output(model(**inputs)), before)


def test_sparse_none_falls_back_to_masked_where_it_cannot_skip():
    for config, model in (
        (GateConfig(variant="value", init="paper", top_k=1), tiny_model("llama")),  # gates the values
        (GateConfig(init="paper"), tiny_model("llama")),  # no top_k
        (GateConfig(init="paper", top_k=2), tiny_model("gemma2")),  # attention logit softcapping
    ):
        patch(model, config)
        assert model.config._attn_implementation == "eager"


# model types whose attention the sparse path (SDPA, the gate at its output) cannot replace, and why
OWN_ATTENTION = {
    "gpt_oss": "does not support SDPA attention",  # learned sinks in its eager attention
    "granite_swa": "does not support SDPA attention",
    "bitnet": "through attn_sub_norm before its output projection",  # a norm between attention and o_proj
    "diffllama": "through groupnorm before its output projection",  # two attention calls, then a norm
    "inkling_text": "passes a position bias to its attention function",
}


@pytest.mark.parametrize("model_type", OWN_ATTENTION)
def test_sparse_none_masks_where_the_model_computes_more_than_sdpa(model_type):
    """sparse=None keeps the model's own attention (masked top-k) and equals sparse=False; sparse=True and
    the sink/window reads (also an attention function) are refused with the reason, nothing half-patched."""
    model, reference = zoo_model(model_type), zoo_model(model_type)
    patch(model, init="paper", top_k=1)
    patch(reference, init="paper", top_k=1, sparse=False)
    reference.load_state_dict(model.state_dict())
    assert model.config._attn_implementation == "eager"
    inputs = zoo_inputs(model_type)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, atol=1e-6, rtol=1e-6)
    for options in ({"sparse": True}, {"top_k_sink": 1, "top_k_window": 2}):
        fresh = zoo_model(model_type)
        with pytest.raises(ValueError, match=OWN_ATTENTION[model_type]):
            patch(fresh, top_k=1, **options)
        assert not any("attn_gate" in name for name, _ in fresh.named_modules())


@pytest.mark.parametrize(
    ("model_type", "config", "message"),
    [
        ("llama", GateConfig(variant="value", top_k=1), "gates the values before they enter the KV cache"),
        ("llama", GateConfig(), "needs GateConfig.top_k"),
        ("gemma2", GateConfig(top_k=2), "no attn_logit_softcapping"),
    ],
    ids=["value", "no-top_k", "softcapping"],
)
def test_sparse_true_says_why_it_cannot_run(model_type, config, message):
    model = tiny_model(model_type)
    with pytest.raises(ValueError, match=message):
        patch(model, config, sparse=True)
    assert not hasattr(model.model.layers[0].self_attn, "attn_gate")  # nothing half-patched


def test_invalid_sparse_values_are_refused():
    with pytest.raises(ValueError, match="accepted values: None, True, False"):
        patch(tiny_model("llama"), top_k=1, sparse="yes")
    with pytest.raises(ValueError, match="top_k=3 exceeds the 2 key/value groups"):
        patch(tiny_model("llama"), top_k=3, top_k_unit="kv_group")


@pytest.mark.parametrize("order", ["lora-then-patch", "patch-then-lora"])
def test_peft_lora_on_the_projections_keeps_sparse_decode_exact(order):
    """LoRA on q_proj/o_proj (random, non-zero B), before or after patching: single-sequence decode through
    the sparse path (whose partial projections then sit inside the LoRA wrapper, or are not installed)
    equals the masked reference."""
    peft = pytest.importorskip("peft")
    config = GateConfig(init="paper", top_k=1, top_k_unit="kv_group")
    inputs = tiny_inputs("llama", batch=1, length=9)
    results = []
    for sparse_mode in (False, True):
        model = tiny_model("llama", **GQA)
        lora = peft.LoraConfig(r=2, target_modules=["q_proj", "o_proj"], init_lora_weights=False)
        if order == "lora-then-patch":
            model = peft.get_peft_model(model, lora)
        torch.manual_seed(7)
        patch(model, config, backend="torch", sparse=sparse_mode)
        if order == "patch-then-lora":
            torch.manual_seed(11)
            model = peft.get_peft_model(model, lora)
        with torch.no_grad():
            results.append(
                model.generate(
                    **inputs,
                    max_new_tokens=5,
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            )
    expected, got = results
    assert torch.equal(got.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("batch", "heads", "groups", "length", "keys", "block", "dtype"),
    [
        (2, 6, 3, 37, 37, 8, torch.float32),  # blocks that do not divide the rows
        (1, 4, 1, 50, 61, 7, torch.float32),  # 11 cached keys before the rows (a chunk of a prefill)
        (2, 8, 2, 9, 9, 16, torch.float32),  # one block, larger than the rows
        (1, 3, 3, 100, 130, 32, torch.float32),  # one head per group
        (1, 6, 3, 40, 40, 16, torch.bfloat16),
    ],
)
@pytest.mark.parametrize(
    "sink_window", [None, (2, 3), (1, 9)], ids=["no-reads", "sink2-window3", "sink1-window9"]
)
def test_kept_rows_in_blocks_equal_masked_attention_of_the_kept_rows(
    monkeypatch, batch, heads, groups, length, keys, block, dtype, sink_window
):
    """The blocked causal attention of the kept rows (`_kept_rows_in_blocks`) against SDPA with the causal
    mask of all rows, at the kept rows; some groups are kept by every row, some by none, some by few. With
    `sink_window`, given every row's attention to its sink and window keys and their log-sum-exp, the kept
    rows attend to their other keys only and merge."""
    monkeypatch.setattr(sparse, "BLOCK_ROWS", block)
    generator = torch.Generator().manual_seed(length)
    query = torch.randn(batch, heads, length, 8, generator=generator).to(dtype)
    key, value = (torch.randn(batch, groups, keys, 8, generator=generator).to(dtype) for _ in range(2))
    rows = torch.rand(batch, length, groups, generator=generator) < 0.6  # (B, L, KV)
    rows[0, :, 0] = True
    rows[-1, :, groups // 2] = torch.arange(length) % 5 == 0  # few kept rows: blocks also without a cache
    rows[-1, :, -1] = False
    in_blocks = [[group > 0 for group in range(groups)]] * batch  # group 0: one causal call without a cache
    causal = torch.arange(keys) <= torch.arange(keys - length, keys)[:, None]  # (L, S)
    reads = None
    if sink_window is not None:
        read_keys = streaming_keys(causal, *sink_window)  # (L, S)
        read_key, read_value = (t.float().repeat_interleave(heads // groups, 1) for t in (key, value))
        scores = (query.float() @ read_key.transpose(-1, -2) * 0.3).masked_fill(~read_keys, -torch.inf)
        lse = scores.logsumexp(-1)  # (B, H, L)
        attended = scores.softmax(-1) @ read_value  # (B, H, L, D)
        reads = (attended.transpose(1, 2).to(dtype), lse.transpose(1, 2), *sink_window)
    out = sparse._kept_rows_in_blocks(query, key, value, rows, 0.3, in_blocks, reads)  # (B, L, H, D)
    expected = F.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=causal, scale=0.3, enable_gqa=True
    ).transpose(1, 2)
    kept = rows.repeat_interleave(heads // groups, -1)  # (B, L, H)
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float()[kept], expected[kept], atol=tolerance, rtol=tolerance)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("selection", [*SELECTIONS, "top2-head-sink1-window2"])
def test_prefill_without_gradients_runs_the_kept_rows_in_blocks(monkeypatch, selection):
    """A causal prefill of unpadded sequences without gradients (no mask reaches the attention function) runs
    `_kept_rows_in_blocks` (here with 4-row blocks from 8 keys) and gives the masked reference's logits; not
    where no group pays (top-3 of 3: every row keeps every group), nor with gradients."""
    monkeypatch.setattr(sparse, "BLOCK_ROWS", 4)
    monkeypatch.setattr(sparse, "BLOCKED_MIN_KEYS", 8)
    monkeypatch.setattr(sparse, "BLOCKS_PAY", 0.9)  # a group in blocks where it keeps at most 18 of 21 rows
    calls = []
    kept_rows_in_blocks = sparse._kept_rows_in_blocks
    monkeypatch.setattr(
        sparse, "_kept_rows_in_blocks", lambda *args: calls.append(1) or kept_rows_in_blocks(*args)
    )
    selections = {**SELECTIONS, "top2-head-sink1-window2": {"top_k": 2, "top_k_sink": 1, "top_k_window": 2}}
    config = GateConfig(init="paper", **selections[selection])
    model = tiny_model("llama", attn_implementation="sdpa", **GQA)
    input_ids = tiny_inputs("llama", batch=2, length=21)["input_ids"]
    expected = _no_grad_logits(model, config, input_ids, sparse_mode=False)
    unpatch(model)
    logits = _no_grad_logits(model, config, input_ids, sparse_mode=True)
    blocked_calls = len(calls)
    model(input_ids=input_ids).logits.sum().backward()  # with gradients: the per-group path
    unpatch(model)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    # one call per layer (2 layers), none where nothing is skipped
    assert blocked_calls == (0 if selection == "top3-kv_group" else 2) and len(calls) == blocked_calls


def test_prefill_keeps_the_all_rows_rule_without_the_cpu_flash_op(monkeypatch):
    """Where torch lacks the private CPU op that returns the log-sum-exp, prefill runs the all-rows rule and
    still gives the masked reference's logits."""
    monkeypatch.setattr(sparse, "CPU_FLASH", None)
    monkeypatch.setattr(sparse, "BLOCK_ROWS", 4)  # with the op, top-1's groups would run in blocks here
    monkeypatch.setattr(sparse, "BLOCKED_MIN_KEYS", 8)
    monkeypatch.setattr(sparse, "_kept_rows_in_blocks", None)  # calling it would fail
    model = tiny_model("llama", attn_implementation="sdpa", **GQA)
    input_ids = tiny_inputs("llama", batch=2, length=21)["input_ids"]
    config = GateConfig(init="paper", top_k=1, top_k_unit="kv_group")
    logits = {}
    for sparse_mode in (False, True):
        logits[sparse_mode] = _no_grad_logits(model, config, input_ids, sparse_mode)
        unpatch(model)
    torch.testing.assert_close(logits[True], logits[False], atol=1e-5, rtol=1e-5)


def _no_grad_logits(model, config: GateConfig, input_ids: torch.Tensor, sparse_mode) -> torch.Tensor:
    """The logits of a forward without gradients, `model` patched (and left patched) with `sparse_mode` and
    the gates seeded alike."""
    torch.manual_seed(7)
    patch(model, config, backend="torch", sparse=sparse_mode)
    with torch.no_grad():
        return model(input_ids=input_ids).logits


@pytest.mark.parametrize("batch", [1, 2], ids=["one-sequence", "batch-2"])
@pytest.mark.parametrize("sparse_mode", [None, True], ids=["sparse-none", "sparse-true"])
@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("selection", ["top1-kv_group", "top1-kv_group-sink2-window3", "top2-head-window4"])
def test_compiled_decode_has_no_graph_break(selection, cache, sparse_mode, batch):
    """`torch.compile(fullgraph=True)` of a decode step traces without a graph break (no host sync: one
    sequence's step attends in one SDPA call, a batch's as the masked reference) and gives the masked
    reference's logits, also where the eager step skips, with `sparse=None` and `sparse=True`."""
    torch._dynamo.reset()
    model = tiny_model("llama", attn_implementation="sdpa", **GQA)
    prompt = tiny_inputs("llama", batch=batch, length=12)["input_ids"]
    logits = {}
    for mode in (False, sparse_mode):
        torch.manual_seed(7)
        patch(model, GateConfig(init="paper", **SELECTIONS[selection]), backend="torch", sparse=mode)
        if cache == "static":
            past = transformers.StaticCache(config=model.config, max_cache_len=16)
        else:
            past = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=prompt[:, :-1], past_key_values=past, use_cache=True)
            forward = (
                model.forward
                if mode is False
                else torch.compile(model.forward, fullgraph=True, backend="eager")
            )
            logits[mode] = forward(input_ids=prompt[:, -1:], past_key_values=past, use_cache=True).logits
        unpatch(model)
    torch.testing.assert_close(logits[sparse_mode], logits[False], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("selection", ["top1-kv_group", "top1-kv_group-sink2-window3", "top2-head-window4"])
@pytest.mark.parametrize("bare", [True, False], ids=["bare", "task-head"])
def test_compiled_padded_forward_with_gradients_has_no_graph_break(bare, selection):
    """`torch.compile(fullgraph=True)` traces a padded batch's forward with gradients without a graph break
    (no host sync: every head on every row, as the masked reference) and gives the masked reference's
    outputs and every parameter's gradient, bare model and task head."""
    torch._dynamo.reset()
    model = tiny_model("llama", attn_implementation="sdpa", bare=bare, **GQA).train()
    config = GateConfig(init="paper", **SELECTIONS[selection])
    inputs = _inputs("llama")  # batch 3, padded left and right
    expected, expected_grads, _ = _run(model, config, inputs, sparse_mode=False)
    out, grads, implementation = _run(model, config, inputs, sparse_mode=True, compiled=True)
    assert implementation == sparse.ATTN_IMPLEMENTATION
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("attn_gate" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "eager"])
@pytest.mark.parametrize("selection", ["top1-kv_group", "top1-kv_group-sink2-window3", "top2-head-window4"])
@pytest.mark.parametrize("bare", [True, False], ids=["bare", "task-head"])
def test_single_token_matches_masked_forward_and_backward(bare, selection, compiled):
    """The one-token path (one sequence, one query) with gradients, compiled (one SDPA call) and eager (the
    host selection, the gathered reads and the kept groups' calls): outputs and every parameter's gradient
    as the masked reference's, bare model and task head."""
    torch._dynamo.reset()
    model = tiny_model("llama", attn_implementation="sdpa", bare=bare, **GQA).train()
    inputs = {"input_ids": tiny_inputs("llama", batch=1, length=1)["input_ids"]}
    config = GateConfig(init="paper", **SELECTIONS[selection])
    expected, expected_grads, _ = _run(model, config, inputs, sparse_mode=False)
    out, grads, _ = _run(model, config, inputs, sparse_mode=None, compiled=compiled)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("attn_gate" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
