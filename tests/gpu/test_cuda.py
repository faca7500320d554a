"""GPU checks of the gate backends on CUDA (`pytest -m gpu tests/gpu`; they skip without CUDA).

1. Every variant x granularity on each backend of `BACKENDS` against `backend="torch"` on the same weights
   (gates `init="paper"`, so they are not 1): a tiny Llama with grouped-query attention and a bare BERT, batch
   2 with the first sequence padded on the left, forward and the gradient of every parameter. The loss is
   the model's output at the real positions times a fixed random tensor (a mean of squares after the last
   norm would make every gradient below it rounding noise: tests/kernels/test_backend_gradients.py). float32:
   within 1e-4. bfloat16: the error to a float32 run of the same bfloat16 weights may be at most twice
   PyTorch's own bfloat16 error plus a small epsilon (the flash-attention rule of
   tests/kernels/test_kernels.py).
   Also top-1 key/value group sparse gating on "triton", zeroed and with sink and window reads.
2. Greedy `generate` of 12 tokens, batch 2 left-padded, float32: the same tokens on every backend.
3. A decode step captured in a CUDA graph and replayed for two positions equals eager decoding (dense gates
   on torch and fused_gate, top-1 key/value group on triton); and a
   `torch.compile(mode="reduce-overhead", fullgraph=True)` forward under `generate` with a static cache.

The backend "fused_gate" (vendor attention, gate logits from the query projection's GEMM, one fused Triton
gate kernel) is skipped while `patch` does not accept that name. Run from the project's root on the GPU
machine: `source .gpu-wheels/env.sh && python3 -m pytest -m gpu tests/gpu -q` (benchmarks/gpu_wheels.sh).
CPU check of this file's logic without a GPU: `HF_GATE_GPU_TESTS_ON_CPU=1 pytest -m gpu
tests/gpu/test_cuda.py` (see gpu_setup.py).
"""

from __future__ import annotations

import pytest
import torch
from gpu_setup import BACKENDS, DEVICE, GPU_MARKS, ON_CPU
from helpers import GRANULARITIES, VARIANTS, first_output, tiny_inputs, tiny_model

pytest.importorskip("triton")

from hf_gate_attention import gate_backend_of, patch
from hf_gate_attention.core.variants import GATE_VARIANTS

pytestmark = GPU_MARKS

GATES = [(variant, granularity) for variant in VARIANTS for granularity in GRANULARITIES]
MODEL_TYPES = ("llama", "bert")  # causal decoder with GQA (4 query heads, 2 key/value heads), encoder
LENGTH, PADDED = 20, 5  # the first sequence has PADDED pad tokens on the left
GATE_SEED = 5
# float32: outputs within RTOL/ATOL; gradients within RTOL and GRAD_ATOL_OF_MAX of the tensor's largest value
# (with a floor of GRAD_FLOOR_OF_MODEL_MAX of the model's largest gradient, for the parameters whose exact
# gradient is 0, such as BERT's key biases: their values are rounding noise)
RTOL, ATOL, GRAD_ATOL_OF_MAX, GRAD_FLOOR_OF_MODEL_MAX = 1e-4, 1e-4, 1e-4, 1e-6
# bfloat16: |x - ref|_max <= 2 |x_torch - ref|_max + BF16_EPS_OF_MAX * |ref|_max (+ the floor above, 1e-4)
BF16_EPS_OF_MAX, BF16_FLOOR_OF_MODEL_MAX = 5e-3, 1e-4


def patch_with(model, backend: str, **gate):
    """`patch(model, backend=backend, init="paper", **gate)` (the backend it runs is the one asked)."""
    patch(model, backend=backend, init="paper", **gate)
    assert gate_backend_of(model) == backend
    return model


def reference_state(model_type: str, **gate) -> dict[str, torch.Tensor]:
    """The float32 weights of the tiny model with its gates (drawn once, on CPU, by the torch backend)."""
    model = tiny_model(model_type, bare=model_type == "bert", attn_implementation="sdpa")
    torch.manual_seed(GATE_SEED)
    patch(model, backend="torch", init="paper", **gate)
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def build(model_type: str, backend: str, dtype: torch.dtype, state: dict, **gate):
    """The tiny model on DEVICE in `dtype`, patched on `backend`, holding `state` (cast to `dtype`)."""
    model = tiny_model(model_type, bare=model_type == "bert", attn_implementation="sdpa").to(DEVICE, dtype)
    patch_with(model, backend, **gate)
    model.load_state_dict(state)  # strict: the gates' parameters do not depend on the backend
    return model


def padded_batch(model_type: str = "llama", length: int = LENGTH, padded: int = PADDED) -> dict:
    """Batch 2 on DEVICE; the first sequence starts with `padded` pad tokens (id 0, attention mask 0)."""
    ids = tiny_inputs(model_type, batch=2, length=length)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, :padded] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0).to(DEVICE), "attention_mask": mask.to(DEVICE)}


def run(model, batch: dict, causal: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The output at the real positions (float32) and every parameter's gradient (float32) after one backward
    of `sum(output * W)`, `W` a fixed random tensor (plus the pooler's output for BERT). Padded query rows of
    the decoder are left out: they see no key and their values are the implementation's choice."""
    outputs = model(**batch)
    output = first_output(outputs).float()
    rows = batch["attention_mask"].bool() if causal else torch.ones_like(batch["attention_mask"], dtype=bool)
    output = output[rows]
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(7)).to(output.device)
    loss = (output * weights).sum()
    pooled = getattr(outputs, "pooler_output", None)
    if pooled is not None:
        pooled_weights = torch.randn(pooled.shape, generator=torch.Generator().manual_seed(8))
        loss = loss + (pooled.float() * pooled_weights.to(pooled.device)).sum()
    loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        assert param.grad is not None, f"{name} got no gradient"
        grads[name] = param.grad.float()
    return output.detach(), grads


def assert_float32_gradients(grads: dict, expected: dict, what: str) -> None:
    assert grads.keys() == expected.keys()
    model_max = max(grad.abs().max().item() for grad in expected.values())
    for name, grad in expected.items():
        atol = max(GRAD_ATOL_OF_MAX * grad.abs().max().item(), GRAD_FLOOR_OF_MODEL_MAX * model_max)
        torch.testing.assert_close(
            grads[name], grad, rtol=RTOL, atol=atol, msg=lambda m, n=name: f"{what} {n}: {m}"
        )


def bfloat16_error(value: torch.Tensor, torch_value: torch.Tensor, reference: torch.Tensor, floor: float):
    """`(error, bound)`: the max error of `value` to the float32 `reference`, and its bound: twice PyTorch's
    own bfloat16 error plus BF16_EPS_OF_MAX of the reference's largest value plus `floor`."""
    error = (value - reference).abs().max().item()
    torch_error = (torch_value - reference).abs().max().item()
    return error, 2 * torch_error + BF16_EPS_OF_MAX * reference.abs().max().item() + floor


def assert_backend_matches_torch(model_type: str, backend: str, **gate) -> None:
    """Section 1 in float32 and bfloat16 for one gate (the docstring's tolerances): asserts that `backend`'s
    output and every parameter's gradient match the torch path's."""
    causal = model_type == "llama"
    state = reference_state(model_type, **gate)
    batch = padded_batch(model_type)

    expected, expected_grads = run(build(model_type, "torch", torch.float32, state, **gate), batch, causal)
    output, grads = run(build(model_type, backend, torch.float32, state, **gate), batch, causal)
    torch.testing.assert_close(output, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"float32 output: {m}")
    assert_float32_gradients(grads, expected_grads, f"float32 {backend} vs torch")

    rounded = {
        name: t.to(torch.bfloat16).float() if t.is_floating_point() else t for name, t in state.items()
    }
    reference, reference_grads = run(
        build(model_type, "torch", torch.float32, rounded, **gate), batch, causal
    )
    torch_output, torch_grads = run(build(model_type, "torch", torch.bfloat16, state, **gate), batch, causal)
    output, grads = run(build(model_type, backend, torch.bfloat16, state, **gate), batch, causal)
    failures = []
    error, bound = bfloat16_error(output, torch_output, reference, 0.0)
    if not error <= bound:
        failures.append(f"output: {error:.3g} > {bound:.3g}")
    floor = BF16_FLOOR_OF_MODEL_MAX * max(grad.abs().max().item() for grad in reference_grads.values())
    for name, reference_grad in reference_grads.items():
        error, bound = bfloat16_error(grads[name], torch_grads[name], reference_grad, floor)
        if not error <= bound:
            failures.append(f"grad {name}: {error:.3g} > {bound:.3g}")
    assert not failures, f"bfloat16 {backend} vs float32 beyond 2x torch's bfloat16 error: {failures}"


# ------------------------------------------------------------------------------------ 1. backends vs torch


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("variant", "granularity"), GATES)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_backend_matches_torch_forward_and_every_gradient(model_type, variant, granularity, backend):
    assert_backend_matches_torch(model_type, backend, variant=variant, granularity=granularity)


# (variant, dropped units' reads, patch's sparse): zeroed top-k trains on SDPA and the masked gate pass, or
# with sparse=True on the flash kernel skipping tiles
SPARSE_CASES = [(variant, {}, None) for variant in VARIANTS]
SPARSE_CASES += [(variant, {}, True) for variant in VARIANTS if GATE_VARIANTS[variant].top_k_skips]
SPARSE_CASES += [
    (variant, {"top_k_sink": 2, "top_k_window": 8}, None)
    for variant in VARIANTS
    if GATE_VARIANTS[variant].dropped_read_keys
]
SPARSE_IDS = [
    f"{v}-{'sink2-window8' if r else 'zeroed'}{'-skipping-tiles' if s else ''}" for v, r, s in SPARSE_CASES
]


@pytest.mark.parametrize(("variant", "reads", "sparse"), SPARSE_CASES, ids=SPARSE_IDS)
def test_top1_kv_group_on_triton_matches_torch(variant, reads, sparse):
    """Sparse gating, float32 only (in bfloat16 the selection itself may differ from the float32 one);
    headwise (elementwise gates take the same path through the selection). With sink and window reads the
    triton backend's blocked reads meet the padding queries, which see no key (0, no NaN in any gradient)."""
    gate = {"variant": variant, "granularity": "headwise", "top_k": 1, "top_k_unit": "kv_group", **reads}
    state = reference_state("llama", **gate)
    batch = padded_batch()
    expected, expected_grads = run(build("llama", "torch", torch.float32, state, **gate), batch, True)
    output, grads = run(build("llama", "triton", torch.float32, state, sparse=sparse, **gate), batch, True)
    torch.testing.assert_close(output, expected, rtol=RTOL, atol=ATOL)
    assert_float32_gradients(grads, expected_grads, "top-1 triton vs torch")


# ----------------------------------------------------------------------------------- 2. greedy generation


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_generation_equals_torch(variant, backend):
    gate = {"variant": variant, "granularity": "headwise"}
    state = reference_state("llama", **gate)
    prompt = padded_batch(length=7, padded=3)
    settings = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = build("llama", "torch", torch.float32, state, **gate).generate(**prompt, **settings)
        tokens = build("llama", backend, torch.float32, state, **gate).generate(**prompt, **settings)
    assert expected.shape == (2, 7 + 12)
    assert torch.equal(tokens, expected), f"{backend}:\n{tokens}\ntorch:\n{expected}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sigmoid_in_half_precision_rounds_like_the_float32_formula(dtype):
    """Eager decode's gate (`core/gate.py: rounds_like_float32`) takes the sigmoid in the model's dtype
    for the float32 formula's cast: the same bits for every finite value, on this device's kernels."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).to(DEVICE)
    logits = every[torch.isfinite(every)]
    assert torch.equal(torch.sigmoid(logits), torch.sigmoid(logits.float()).to(dtype))


# ---------------------------------------------------------------------------- 3. CUDA graphs, torch.compile

MAX_LEN, PROMPT, PROMPT_PADDED, WARMUP = 16, 6, 2, 2


GRAPHED = [("torch", {}), ("fused_gate", {}), ("triton", {"top_k": 1, "top_k_unit": "kv_group"})]


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize(("backend", "sparse"), GRAPHED, ids=["torch", "fused_gate", "triton-top1-kv_group"])
def test_cuda_graph_decode_steps_equal_eager(backend, sparse, granularity):
    """A decode step with a StaticCache and a 4-D boolean mask `(B, 1, 1, MAX_LEN)` updated in place, warmed
    up on a side stream, captured in a `torch.cuda.CUDAGraph` and replayed for two successive positions, gives
    the logits of an eager copy decoding with the usual 2-D mask and a dynamic cache (within 1e-4, float32).
    The torch backend runs too, as the baseline of the capture itself; triton with top-1 of the 2 key/value
    groups captures the split-KV kernel with one group slot per sequence (its selection read on the device).
    Transformers' StaticCache counts its position in a tensor, in place: every replay writes the next slot;
    the warm-up's steps are cropped."""
    from transformers import DynamicCache, StaticCache

    gate = {"variant": "output", "granularity": granularity, **sparse}
    state = reference_state("llama", **gate)
    graphed = build("llama", backend, torch.float32, state, **gate)
    eager = build("llama", backend, torch.float32, state, **gate)
    prompt = padded_batch(length=PROMPT, padded=PROMPT_PADDED)
    mask = prompt["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    tol = {"rtol": 1e-4, "atol": 1e-4}

    with torch.no_grad():
        cache = StaticCache(config=graphed.config, max_cache_len=MAX_LEN)
        prefill = graphed(**prompt, position_ids=positions, cache=cache).logits[:, -1]
        eager_cache = DynamicCache(config=eager.config)
        eager_logits = eager(**prompt, position_ids=positions, cache=eager_cache).logits[:, -1]
        torch.testing.assert_close(prefill, eager_logits, **tol)

        # static inputs of the decode step, at the first position after the prompt
        static_ids = prefill.argmax(-1, keepdim=True)
        static_positions = positions[:, -1:] + 1
        static_mask = torch.zeros(2, 1, 1, MAX_LEN, dtype=torch.bool, device=DEVICE)
        static_mask[:, 0, 0, :PROMPT] = mask.bool()
        static_mask[:, 0, 0, PROMPT] = True
        # the triton backend's mask function takes a 2-D key mask: the same memory, viewed (B, MAX_LEN)
        step_mask = static_mask.view(2, MAX_LEN) if backend == "triton" else static_mask

        def step():
            return graphed(
                input_ids=static_ids, attention_mask=step_mask, position_ids=static_positions, cache=cache
            ).logits[:, -1]

        if DEVICE == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(WARMUP):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            cache.crop(-WARMUP)  # the warm-up wrote slot PROMPT (and the next): the replay writes them again
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_logits = step()

            def replay():
                graph.replay()
                return static_logits.clone()

        else:  # CPU check mode: the same static buffers and cache bookkeeping, without a graph
            for _ in range(WARMUP):
                step()
            cache.crop(-WARMUP)
            replay = step

        eager_mask = mask
        next_ids = static_ids.clone()
        for offset in range(2):
            logits = replay()
            eager_mask = torch.cat([eager_mask, torch.ones_like(mask[:, :1])], dim=-1)
            expected = eager(
                input_ids=next_ids,
                attention_mask=eager_mask,
                position_ids=positions[:, -1:] + 1 + offset,
                cache=eager_cache,
            ).logits[:, -1]
            torch.testing.assert_close(
                logits, expected, **tol, msg=lambda m, o=offset: f"decode step {o}: {m}"
            )
            next_ids = expected.argmax(-1, keepdim=True)
            static_ids.copy_(next_ids)  # the next step's inputs, in place
            static_positions.add_(1)
            static_mask[:, 0, 0, PROMPT + offset + 1] = True


COMPILE_BACKEND = "torch" if ON_CPU else "fused_gate"  # CPU check mode: inductor on CPU, no CUDA graphs


def test_compiled_reduce_overhead_generate_equals_eager():
    """`model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)` (CUDA graphs via
    inductor) under `generate(cache_implementation="static")`: the greedy tokens of an eager copy with the
    default dynamic cache. `disable_compile=True` keeps generate from compiling the model a second time (it
    would compile `__call__` for a static cache on CUDA on its own)."""
    gate = {"variant": "output", "granularity": "headwise"}
    state = reference_state("llama", **gate)
    eager = build("llama", COMPILE_BACKEND, torch.float32, state, **gate)
    compiled = build("llama", COMPILE_BACKEND, torch.float32, state, **gate)
    torch._dynamo.reset()
    compiled.forward = torch.compile(compiled.forward, mode="reduce-overhead", fullgraph=True)
    prompt = padded_batch(length=PROMPT, padded=PROMPT_PADDED)
    settings = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = eager.generate(**prompt, **settings)
        tokens = compiled.generate(**prompt, **settings, cache_implementation="static", disable_compile=True)
    assert expected.shape == (2, PROMPT + 6)
    assert torch.equal(tokens, expected), f"compiled:\n{tokens}\neager:\n{expected}"
