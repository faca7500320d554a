"""`backend="fused_gate"`: the model's own attention, the output gate's logits from the query GEMM (one merged
buffer, `kernels/query_gate.py`) and one fused gate pass; and the backend contract (`core/backends.py`).

Every parameter's gradient against `backend="torch"` on every family: test_backend_gradients.py. Here:
the merge itself (active, equal, undone), its fallbacks, PEFT LoRA, saving, autocast, `torch.compile`, and
what `"auto"` picks. On CPU the kernels run through Triton's interpreter (conftest).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from helpers import VARIANTS, added_ops_per_layer, tiny_inputs, tiny_model

pytest.importorskip("triton")

from hf_gate_attention import GateConfig, from_pretrained, gate_backend_of, is_patched, patch, unpatch
from hf_gate_attention.core import backends
from hf_gate_attention.core.backends import GateBackend, register_backend, resolve_backend

GATE = {"variant": "output", "init": "paper"}


def _padded_inputs(batch: int = 2, length: int = 9) -> dict:
    inputs = tiny_inputs("llama", batch=batch, length=length)
    mask = torch.ones_like(inputs["input_ids"])
    mask[0, :3] = 0  # left padding
    return inputs | {"attention_mask": mask}


def _pair(model_type: str = "llama", backend: str = "fused_gate", **gate) -> tuple:
    """The same tiny model with the same gate weights on `torch` and on `backend`."""
    gate = {**GATE, **gate}
    reference = patch(tiny_model(model_type, attn_implementation="sdpa"), backend="torch", **gate)
    model = patch(tiny_model(model_type, attn_implementation="sdpa"), backend=backend, **gate)
    model.load_state_dict(reference.state_dict())
    return reference, model


def _merged(model) -> bool:
    """Whether layer 0's query and gate weights are views of one buffer (the merged GEMM runs)."""
    attention = model.model.layers[0].self_attn
    query, gate = attention.q_proj, attention.attn_gate
    query = query.get_base_layer() if hasattr(query, "get_base_layer") else query
    gate = getattr(gate, "original_module", gate)  # PEFT's modules_to_save wrapper: the gate patch made
    storage = query.weight.untyped_storage().data_ptr()
    return gate.weight.untyped_storage().data_ptr() == storage


def _logits_and_grads(model, inputs):
    logits = model(**inputs).logits
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    (logits * weights * inputs["attention_mask"][..., None]).sum().backward()
    grads = {n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _assert_same(model, reference, inputs):
    logits, grads = _logits_and_grads(model, inputs)
    expected, expected_grads = _logits_and_grads(reference, inputs)
    rows = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[rows], expected[rows], rtol=1e-4, atol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("attn_gate" in n for n in grads)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: the query projection has a bias
def test_merged_projection_equals_the_reference(model_type, granularity):
    reference, model = _pair(model_type, granularity=granularity)
    assert _merged(model) and not _merged(reference)
    stashed = []
    block_patch = model._gate_attention_patches[0]
    block_patch.block.o_proj.register_forward_pre_hook(lambda m, a: stashed.append(set(block_patch.stash)))
    _assert_same(model, reference, _padded_inputs())
    assert stashed and all(not keys for keys in stashed)  # logits and x taken, nothing left behind
    with torch.no_grad():  # the no-grad path (one GEMM without autograd) too
        torch.testing.assert_close(model(**_padded_inputs()).logits, reference(**_padded_inputs()).logits)


def test_one_gemm_for_inference_two_for_training_and_eager_decode(monkeypatch):
    """The merged GEMM runs where it measured faster (inference on more than a few tokens); training and
    host-bound decode steps run the two GEMMs of the reference (kernels/query_gate.py)."""
    import types

    from hf_gate_attention.kernels import query_gate

    widths = []

    def linear(x, weight, bias=None):
        widths.append(weight.shape[0])
        return torch.nn.functional.linear(x, weight, bias)

    monkeypatch.setattr(query_gate, "F", types.SimpleNamespace(linear=linear))
    _, model = _pair(granularity="elementwise")  # query 4 heads x 8 + gate 4 x 8 rows
    prefill, decode = _padded_inputs(length=9), _padded_inputs(length=4)  # 18 tokens, 8 tokens
    with torch.no_grad():
        model(**prefill)
        assert set(widths) == {64}
        widths.clear()
        model(**decode)
    assert set(widths) == {32}
    widths.clear()
    model(**prefill).logits.sum().backward()
    assert set(widths) == {32}


@pytest.mark.parametrize("init", ["paper", "identity"])  # gate scale 1 and 2
def test_eager_bfloat16_decode_step_adds_three_or_four_ops_per_layer(init):
    """Eager decode is host-bound (every op is host time on a GPU): per layer, the gate adds its logits
    GEMM, the sigmoid and the multiply (and the identity init's scale of 2), plus three views; no cast (the
    bfloat16 sigmoid rounds as the float32 formula's cast does) and no hook on the query projection, whose
    merged forward stashes the logits itself."""
    model = tiny_model("llama", attn_implementation="sdpa").to(torch.bfloat16)
    added = added_ops_per_layer(model, GateConfig(variant="output", init=init), "fused_gate")
    views = {"aten::unflatten": 2, "aten::flatten": 1}
    assert added == Counter(
        {"aten::linear": 1, "aten::sigmoid": 1, "aten::mul": 1 + (init == "identity")} | views
    )
    assert not model.model.layers[0].self_attn.q_proj._forward_hooks


def test_host_bound_gate_has_the_bits_of_the_float32_formula():
    """Every finite bfloat16 and float16 logit, gated on 16 tokens without gradients (host-bound): the
    sigmoid in the model's dtype gives the bits of the float32 formula cast to it, also with the identity
    init's scale 2 except where the sigmoid is subnormal (bfloat16: logits <= -87); float16 with scale 2
    keeps the float32 formula."""
    from hf_gate_attention.core.gate import rounds_like_float32
    from hf_gate_attention.kernels.ops import gate_multiply_unchecked
    from hf_gate_attention.kernels.reference import sigmoid_gate

    for dtype in (torch.bfloat16, torch.float16):
        every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
        logits = every[torch.isfinite(every)].view(16, -1, 1)  # (tokens, G, w): 65,280 or 63,488 values
        values = torch.randn(*logits.shape[:-1], 2).to(dtype)  # (tokens, G, D)
        for scale in (1.0, 2.0):
            with torch.no_grad():
                out = gate_multiply_unchecked(values, logits, scale, None)
            expected = values * sigmoid_gate(logits, scale, None).to(dtype)
            normal = torch.sigmoid(logits.float()) >= torch.finfo(dtype).tiny  # (tokens, G, 1)
            assert torch.equal(out[normal.expand_as(out)], expected[normal.expand_as(out)]), (dtype, scale)
            assert torch.equal(out, expected) or scale != 1.0
    assert not rounds_like_float32(torch.float16, torch.float16, 2.0, None)
    assert not rounds_like_float32(torch.bfloat16, torch.bfloat16, 1.0, torch.ones(1))  # a float32 keep
    assert not rounds_like_float32(torch.bfloat16, torch.float32, 1.0, None)
    assert not rounds_like_float32(torch.bfloat16, torch.bfloat16, 0.5, None)


def _saved_bytes(function) -> int:
    """Bytes of the distinct tensors autograd keeps for backward while `function()` runs."""
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function()
    return sum(saved.values())


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("scale", [1.0, 2.0])
@pytest.mark.parametrize("width", [1, 16], ids=["headwise", "elementwise"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_training_gate_has_the_gradients_of_the_formula_and_keeps_less(dtype, width, scale, keep):
    """`RecomputedSigmoidGate` (fused_gate's training path) against autograd of `values *
    sigmoid_gate(logits, scale, keep).to(dtype)`: the same output and gradients, bit for bit, on fresh random
    inputs (24 tokens, 3 heads of 16); it keeps only the values and the logits for backward (elementwise:
    4 bytes an element instead of 8 in 16-bit dtypes, 8 instead of 12 in float32)."""
    from hf_gate_attention.kernels.ops import RecomputedSigmoidGate
    from hf_gate_attention.kernels.reference import sigmoid_gate

    values = (torch.randn(24, 3, 16) * 3).to(dtype)
    logits = (torch.randn(24, 3, width) * 4).to(dtype)
    mask = (torch.rand(24, 3) > 0.3).float() if keep else None
    grad = torch.randn(24, 3, 16).to(dtype)

    gates = {
        "formula": lambda v, z: v * sigmoid_gate(z, scale, mask).to(dtype),
        "recomputed": lambda v, z: RecomputedSigmoidGate.apply(v, z, scale, mask),
    }

    def leaves():
        return values.clone().requires_grad_(), logits.clone().requires_grad_()

    results, kept = {}, {}
    for name, gate in gates.items():
        v, z = leaves()
        out = gate(v, z)
        out.backward(grad)
        results[name] = (out, v.grad, z.grad)
        kept[name] = _saved_bytes(lambda gate=gate: gate(*leaves()))
    for expected, got in zip(results["formula"], results["recomputed"], strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    element = torch.finfo(dtype).bits // 8
    assert kept["recomputed"] == (values.numel() + logits.numel()) * element + (
        mask.numel() * 4 if keep else 0
    )
    if width > 1:
        assert kept["recomputed"] < kept["formula"]


def test_state_dict_names_and_values_are_those_of_the_unmerged_model():
    reference, model = _pair()
    state, expected = model.state_dict(), reference.state_dict()
    assert list(state) == list(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_optimizer_steps_update_the_merged_buffer_in_place():
    reference, model = _pair()
    inputs = _padded_inputs()
    for m in (reference, model):
        optimizer = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(3):
            optimizer.zero_grad()
            m(**inputs, labels=inputs["input_ids"]).loss.backward()
            optimizer.step()
    assert _merged(model)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, rtol=1e-4, atol=1e-5)


def test_train_gates_only_gives_gradients_to_the_gates_alone():
    reference, model = _pair()
    for m in (reference, model):
        m.requires_grad_(False)
        for name, param in m.named_parameters():
            param.requires_grad_("attn_gate" in name)
    inputs = _padded_inputs()
    _, grads = _logits_and_grads(model, inputs)
    _, expected = _logits_and_grads(reference, inputs)
    assert grads.keys() == expected.keys() and all("attn_gate" in n for n in grads)
    for name, grad in expected.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6)


def test_separated_storage_falls_back_to_two_gemms():
    """`model.to(dtype)` gives every parameter storage of its own: the reference computation runs, and the
    first call that would have run the merged GEMM lets the merged buffers go (no dead copy of the query
    weights stays in memory)."""
    reference, model = _pair()
    model.to(torch.float16).float()
    reference.to(torch.float16).float()
    assert not _merged(model)
    _assert_same(model, reference, _padded_inputs())
    forwards = [layer.self_attn.q_proj.forward for layer in model.model.layers]
    assert all(forward.weight is not None for forward in forwards)  # training calls never merge
    prefill = _padded_inputs(length=20)  # 40 tokens without gradients: where the merged GEMM would run
    with torch.no_grad():
        logits, expected = model(**prefill).logits, reference(**prefill).logits
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    assert all(forward.weight is None and forward.bias is None for forward in forwards)


def test_unpatch_gives_the_query_projection_storage_of_its_own():
    model = tiny_model("llama", attn_implementation="sdpa")
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        expected = model(**inputs).logits
    patch(model, backend="fused_gate", variant="output")  # identity init: same function
    unpatch(model)
    query = model.model.layers[0].self_attn.q_proj
    assert "forward" not in query.__dict__
    assert query.weight.untyped_storage().nbytes() == query.weight.numel() * query.weight.element_size()
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected)


@pytest.mark.parametrize("order", ["patch then lora", "lora then patch"])
def test_peft_lora_on_the_query_projection(order):
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    models = {}
    for backend in ("torch", "fused_gate"):
        torch.manual_seed(0)
        model = tiny_model("llama", attn_implementation="sdpa")
        if order == "patch then lora":
            patch(model, backend=backend, **GATE)
            model = peft.get_peft_model(model, lora)
        else:
            model = peft.get_peft_model(model, lora)
            patch(model, backend=backend, **GATE)
        models[backend] = model
    models["fused_gate"].load_state_dict(models["torch"].state_dict())
    assert _merged(models["fused_gate"].get_base_model())
    inputs = _padded_inputs()
    logits, grads = _logits_and_grads(models["fused_gate"], inputs)
    expected, expected_grads = _logits_and_grads(models["torch"], inputs)
    rows = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[rows], expected[rows], rtol=1e-4, atol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("lora_A" in n for n in grads)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_peft_modules_to_save_runs_and_trains_the_gates_copy():
    """With `modules_to_save=["attn_gate"]` PEFT runs a trainable copy of each gate: the logits must come from
    that copy, in training, in the merged GEMM's prefill and in short calls (before the fix the query GEMM
    computed them from the frozen original: the copies changed nothing and got no gradient)."""
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["attn_gate"])
    models = {}
    for backend in ("torch", "fused_gate"):
        torch.manual_seed(0)
        models[backend] = peft.get_peft_model(patch(tiny_model("llama"), backend=backend, **GATE), lora)
    models["fused_gate"].load_state_dict(models["torch"].state_dict())
    with torch.no_grad():
        for model in models.values():
            for name, param in model.named_parameters():
                if "modules_to_save" in name:  # the copies differ from the originals from here on
                    param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    short, prefill = _padded_inputs(length=5), _padded_inputs(length=20)  # 10 and 40 tokens
    fused, reference = models["fused_gate"], models["torch"]
    with torch.no_grad():
        for inputs in (short, prefill):
            rows = inputs["attention_mask"].bool()
            logits, expected = (model(**inputs).logits[rows] for model in (fused, reference))
            torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    assert _merged(fused.get_base_model())  # the original gate stays merged, unused while wrapped
    logits, grads = _logits_and_grads(fused, prefill)
    expected, expected_grads = _logits_and_grads(reference, prefill)
    assert grads.keys() == expected_grads.keys() and any("modules_to_save" in n for n in grads)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("backend", "top_k"),
    [("torch", None), ("torch", 1), ("fused_gate", None), ("triton", None), ("triton", 1)],
    ids=["torch", "torch-sparse-top1", "fused_gate", "triton", "triton-top1"],
)
def test_a_deep_copy_runs_on_its_own_modules(backend, top_k):
    """`copy.deepcopy` of a patched model (EMA, `AveragedModel`, a frozen reference model): the copy's hooks,
    projection `forward`s and attention function use the copy's modules and block patches, so changing the
    copy's weights changes only the copy, which computes what a model patched afresh with those weights
    computes; unpatching the copy leaves the original patched. Before, the copy's hooks wrote into the
    original's block patches (RuntimeError), and a triton-patched model could not be copied at all."""
    gate = {**GATE, "top_k": top_k, "top_k_unit": "kv_group"}
    model = patch(tiny_model("llama", attn_implementation="sdpa"), backend=backend, **gate)
    calls = [_padded_inputs(length=20), tiny_inputs("llama", batch=1, length=1)]  # 40 tokens, one token
    with torch.no_grad():
        expected = [model(**inputs).logits for inputs in calls]
        twin = copy.deepcopy(model)
        for param in twin.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) / 4)
        fresh = patch(tiny_model("llama", attn_implementation="sdpa"), backend=backend, **gate)
        fresh.load_state_dict(twin.state_dict())
        for inputs, logits in zip(calls, expected, strict=True):
            torch.testing.assert_close(twin(**inputs).logits, fresh(**inputs).logits, rtol=1e-4, atol=1e-5)
            assert not torch.allclose(twin(**inputs).logits, logits, atol=1e-3)
            assert torch.equal(model(**inputs).logits, logits)
        unpatch(twin)
        assert is_patched(model)
        for inputs, logits in zip(calls, expected, strict=True):
            assert torch.equal(model(**inputs).logits, logits)


def test_save_and_reload_a_merged_model(tmp_path):
    """The shared buffer must not make transformers drop a 'tied' tensor when saving."""
    _, model = _pair()
    inputs = _padded_inputs()
    with torch.no_grad():
        expected = model(**inputs).logits
    model.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path, backend="fused_gate")
    assert gate_backend_of(loaded) == "fused_gate" and _merged(loaded)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**inputs).logits, expected)
    state, expected_state = loaded.state_dict(), model.state_dict()
    assert list(state) == list(expected_state)
    assert all(torch.equal(state[key], expected_state[key]) for key in expected_state)


def test_autocast_bfloat16_training_step_is_close_to_the_reference():
    reference, model = _pair(granularity="elementwise")
    inputs = _padded_inputs()
    results = []
    for m in (reference, model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(**inputs, labels=inputs["input_ids"]).loss
        loss.backward()
        grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
        assert all(g.dtype == torch.float32 for g in grads.values())
        results.append((loss.detach(), grads))
    (expected, expected_grads), (loss, grads) = results
    torch.testing.assert_close(loss, expected, rtol=1e-2, atol=1e-2)
    for name, grad in expected_grads.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(grads[name], grad, rtol=5e-2, atol=2e-2 * scale + 1e-6, msg=name)


@pytest.mark.parametrize("backend", ["torch", "fused_gate", "triton"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_torch_compile_fullgraph_forward_and_backward(variant, backend):
    """No graph break (fullgraph=True) in forward and backward; equal to eager. Under tracing the merged
    projection runs as two GEMMs and the fused pass as its custom op."""
    torch._dynamo.reset()
    reference, model = _pair(backend=backend, variant=variant, granularity="elementwise")
    inputs = _padded_inputs()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    logits, grads = _logits_and_grads(compiled, inputs)
    expected, expected_grads = _logits_and_grads(reference, inputs)
    rows = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[rows], expected[rows], rtol=1e-4, atol=1e-5)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("sparse", [None, True], ids=["masked", "skipping-tiles"])
@pytest.mark.slow
def test_torch_compile_fullgraph_top_k_training_on_triton(sparse):
    """Top-k training on backend "triton" (SDPA and the masked gate pass; `sparse=True`: the flash kernel
    skipping tiles) traces whole, left padding included: no graph break, equal to the masked torch path."""
    torch._dynamo.reset()
    gate = {**GATE, "top_k": 1}
    reference = patch(tiny_model("llama", attn_implementation="sdpa"), backend="torch", sparse=False, **gate)
    model = patch(tiny_model("llama", attn_implementation="sdpa"), backend="triton", sparse=sparse, **gate)
    model.load_state_dict(reference.state_dict())
    inputs = _padded_inputs(length=20)  # more queries than decode's 16: key_mask may not read the mask here
    _assert_same(torch.compile(model, backend="aot_eager", fullgraph=True), reference, inputs)


def test_fused_pass_in_training_equals_the_torch_path(monkeypatch):
    """`ops.FUSED_PASS_IN_TRAINING` (what gpu.py's `..., fused pass in training` cases set): training steps of
    `fused_gate` run the fused gate pass's forward and backward kernels, with the torch path's gradients."""
    from hf_gate_attention.kernels import gate_multiply, ops

    calls = []
    backward = gate_multiply.gate_multiply_backward
    monkeypatch.setattr(ops, "FUSED_PASS_IN_TRAINING", True)
    monkeypatch.setattr(gate_multiply, "gate_multiply_backward", lambda *a: calls.append(1) or backward(*a))
    reference, model = _pair(granularity="elementwise")
    _assert_same(model, reference, _padded_inputs())
    assert len(calls) == model.config.num_hidden_layers


# --- "auto" and the backend contract ---


class _Weight:
    """Stands for a query weight on some device (resolution reads only dtype and is_cuda)."""

    def __init__(self, is_cuda: bool, dtype=torch.bfloat16):
        self.is_cuda, self.dtype = is_cuda, dtype


@pytest.mark.parametrize(
    ("top_k", "is_cuda", "expected"),
    [(None, True, "fused_gate"), (2, True, "triton"), (None, False, "torch"), (2, False, "torch")],
)
def test_auto_picks_by_device_and_phase(top_k, is_cuda, expected):
    model_config = tiny_model("llama").config
    config = GateConfig(top_k=top_k)
    assert resolve_backend("auto", config, model_config, 8, _Weight(is_cuda)).name == expected


def test_auto_falls_back_to_torch_when_triton_cannot_run(monkeypatch):
    import hf_gate_attention.kernels

    monkeypatch.setattr(hf_gate_attention.kernels, "triton_available", lambda: (False, "no CUDA GPU"))
    model_config = tiny_model("llama").config
    assert resolve_backend("auto", GateConfig(), model_config, 8, _Weight(True)).name == "torch"
    with pytest.raises(ValueError, match=r"backend='fused_gate' cannot run here: no CUDA GPU"):
        resolve_backend("fused_gate", GateConfig(), model_config, 8, _Weight(True))


@pytest.mark.parametrize(
    ("sparse", "is_cuda", "expected"), [(None, False, True), (None, True, False), (True, True, True)]
)
def test_torch_sparse_loops_run_on_cuda_only_when_asked_for(sparse, is_cuda, expected):
    """On CUDA `sparse=None` masks: the per-sequence loops of core/sparse.py are the readable CPU path."""
    model_config = tiny_model("llama").config
    attention = backends.backend_named("torch").attention(
        GateConfig(top_k=1), model_config, sparse, _Weight(is_cuda)
    )
    assert (attention is not None) == expected


def test_a_new_backend_is_one_registration(monkeypatch):
    monkeypatch.setattr(backends, "_BACKENDS", dict(backends._BACKENDS))
    calls = []

    def doubled(values, logits, scale, keep):
        calls.append(logits.shape)
        return values * 2

    register_backend(GateBackend("doubling", "test", lambda *args: None, gate_multiply=doubled))
    model = tiny_model("llama")
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        expected = model(**inputs).logits
        patch(model, backend="doubling", variant="value")
        assert not torch.allclose(model(**inputs).logits, expected)
    assert gate_backend_of(model) == "doubling" and len(calls) == 2  # one call per layer
    with pytest.raises(ValueError, match="backend name 'doubling' is taken"):
        register_backend(GateBackend("doubling", "again", lambda *args: None))
    with pytest.raises(ValueError, match="backend name 'auto' is taken"):
        register_backend(GateBackend("auto", "no", lambda *args: None))
    with pytest.raises(TypeError, match="must be a GateBackend"):
        register_backend("doubling")


def test_fused_gate_refuses_sparse_skipping_with_the_alternatives():
    with pytest.raises(ValueError, match=r"sparse=True: backend 'fused_gate' computes every head.*'torch'"):
        patch(tiny_model("llama"), backend="fused_gate", top_k=1, sparse=True)
    model = patch(tiny_model("llama"), backend="fused_gate", top_k=1, init="paper")  # masked top-k
    reference = patch(tiny_model("llama"), backend="torch", top_k=1, init="paper", sparse=False)
    model.load_state_dict(reference.state_dict())
    inputs = tiny_inputs("llama")
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, reference(**inputs).logits, rtol=1e-4, atol=1e-5)
