"""The split-KV decode kernel (`gated_decode_attention`) against the float64 reference, and a tiny Llama on
backend "triton" with static caches and top-k decoding (the flash kernel's `kv_length`: test_kernels.py).

The kernels run through Triton's interpreter on CPU (blocks of 16 keys, row blocks of 16), so small shapes
span several chunks, several row blocks and partial blocks. Tolerance as in test_kernels.py: at most twice
PyTorch's own error in the same dtype plus a small epsilon.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first imported

import pytest
import torch
import transformers
from helpers import REPO, first_output, tiny_inputs, tiny_model

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from test_kernels import (  # noqa: F401 (_bfloat16_rounds_to_nearest: an autouse fixture)
    AVAILABLE,
    DEVICE,
    DTYPES,
    REASON,
    _bfloat16_rounds_to_nearest,
    _GuardedTorch,
    assert_close_to_reference,
    assert_guards_intact,
    guarded,
)

from hf_gate_attention import GateConfig, patch
from hf_gate_attention.kernels import gated_attention_reference, gated_decode_attention

pytestmark = pytest.mark.skipif(not AVAILABLE, reason=REASON)


@dataclass(frozen=True)
class Case:
    batch: int
    length: int  # Lq
    heads: int
    kv_heads: int
    keys: int  # S
    dim: int
    causal: bool
    gate: str  # "headwise" or "elementwise"
    chunks: int | None  # None: the launcher's choice
    dtype: str = "fp32"
    left_padding: bool = False  # the first sequence's first third of keys padded
    kv_length: tuple[int, ...] | None = None  # filled length, per sequence or one for all
    keep_groups: bool = False  # top-1 key/value group per (sequence, query): sequences keep different ones

    @property
    def id(self) -> str:
        return (
            f"B{self.batch}-Lq{self.length}-H{self.heads}-KV{self.kv_heads}-S{self.keys}-D{self.dim}-"
            f"{'causal' if self.causal else 'full'}-{self.gate}-chunks{self.chunks}-{self.dtype}"
            f"{'-pad' if self.left_padding else ''}{f'-len{self.kv_length}' if self.kv_length else ''}"
            f"{'-top1' if self.keep_groups else ''}"
        )


CASES = [
    # 1 head per group, 1 chunk; 2 heads per group, 3 chunks, left padding, top-1 group
    Case(2, 1, 4, 4, 37, 32, causal=True, gate="headwise", chunks=1),
    Case(2, 3, 4, 2, 45, 64, True, "elementwise", chunks=3, left_padding=True, keep_groups=True),
    # 4 heads per group: a static cache filled to a different length per sequence; one length for all
    Case(3, 1, 8, 2, 50, 32, True, "headwise", 4, "bf16", kv_length=(50, 17, 33), keep_groups=True),
    Case(2, 3, 4, 1, 40, 40, False, "elementwise", 2, "fp16", left_padding=True, kv_length=(29,)),
    # 20 rows per group (2 row blocks), the launcher's chunks; the longest query (16 positions)
    Case(1, 5, 8, 2, 33, 32, True, "headwise", chunks=None, kv_length=(21,), keep_groups=True),
    Case(1, 16, 2, 1, 24, 16, True, "elementwise", chunks=2, kv_length=(20,)),
]


def decode_inputs(case: Case) -> dict:
    dtype = DTYPES[case.dtype]
    q = torch.randn(case.batch, case.heads, case.length, case.dim, device=DEVICE, dtype=dtype)
    k, v = torch.randn(2, case.batch, case.kv_heads, case.keys, case.dim, device=DEVICE, dtype=dtype)
    width = 1 if case.gate == "headwise" else case.dim
    gate_logits = torch.randn(case.batch, case.length, case.heads, width, device=DEVICE, dtype=dtype)
    keep = None
    if case.keep_groups:  # group b + i (mod KV) for sequence b, query i
        group = (torch.arange(case.batch)[:, None] + torch.arange(case.length)) % case.kv_heads  # (B, Lq)
        kept = torch.nn.functional.one_hot(group, case.kv_heads).float()  # (B, Lq, KV)
        keep = kept.repeat_interleave(case.heads // case.kv_heads, dim=-1).to(DEVICE)  # (B, Lq, H)
    mask = None
    if case.left_padding:
        mask = torch.ones(case.batch, case.keys, dtype=torch.bool, device=DEVICE)
        mask[0, : case.keys // 3] = False
    kv_length = None if case.kv_length is None else torch.tensor(case.kv_length, device=DEVICE)
    return {
        "q": q, "k": k, "v": v, "gate_logits": gate_logits, "keep": keep, "key_padding_mask": mask,
        "kv_length": kv_length,
    }  # fmt: skip


def decode(inputs: dict, causal: bool, chunks: int | None = None, **options) -> torch.Tensor:
    with torch.no_grad():
        return gated_decode_attention(**inputs, gate_scale=2.0, causal=causal, num_chunks=chunks, **options)


def reference(inputs: dict, causal: bool, dtype: torch.dtype) -> torch.Tensor:
    args = {name: t.to(dtype) if t is not None and t.is_floating_point() else t for name, t in inputs.items()}
    return gated_attention_reference(**args, gate_scale=2.0, causal=causal)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_decode_kernel_matches_reference(case):
    inputs = decode_inputs(case)
    out = decode(inputs, case.causal, case.chunks)
    assert out.shape == (case.batch, case.length, case.heads, case.dim) and out.dtype == inputs["q"].dtype
    torch_out = reference(inputs, case.causal, inputs["q"].dtype)
    assert_close_to_reference("out", out, reference(inputs, case.causal, torch.float64), torch_out)


KEEP_CASES = [case for case in CASES if case.keep_groups]


@pytest.mark.parametrize("case", KEEP_CASES, ids=lambda case: case.id)
def test_kept_groups_slots_give_the_same_result(case):
    """`kept_groups`: one slot per kept group (sequence b keeps groups b + i mod KV at its queries i: Lq of
    them, or all), and one slot for all (the kept groups served one after another). With the chunk count
    given, the same bits as one slot per group; with the launcher's chunks (sized for the slots), close to
    the reference."""
    inputs = decode_inputs(case)
    expected = reference(inputs, case.causal, torch.float64)
    torch_out = reference(inputs, case.causal, inputs["q"].dtype)
    every_group = decode(inputs, case.causal, case.chunks)
    for kept_groups in sorted({1, min(case.length, case.kv_heads)}):
        out = decode(inputs, case.causal, case.chunks, kept_groups=kept_groups)
        if case.chunks is not None:
            assert torch.equal(out, every_group), kept_groups
        assert_close_to_reference(f"out, kept_groups={kept_groups}", out, expected, torch_out)


def test_decode_takes_strided_inputs():
    """q and the cache as transformers hands them over: transposed views of (B, L, heads, D) tensors."""
    q = torch.randn(2, 2, 4, 32, device=DEVICE).transpose(1, 2)  # (B, H, Lq, D), non-contiguous
    kv = torch.randn(2, 27, 2, 2, 32, device=DEVICE)  # (B, S, [k, v], KV, D)
    k, v = kv.transpose(1, 3).unbind(2)  # 2 x (B, KV, S, D), non-contiguous
    inputs = {"q": q, "k": k, "v": v, "gate_logits": torch.randn(2, 2, 4, 1, device=DEVICE)}
    expected = reference(inputs, True, torch.float64)
    torch.testing.assert_close(decode(inputs, True, 2).double(), expected, atol=1e-5, rtol=1e-5)


def test_dropped_groups_and_unfilled_chunks_are_never_read():
    """NaN in the cache of every group a sequence dropped at all its queries, and in the slots past each
    sequence's filled length (whole chunks and the tail of one): the same finite output as the clean cache,
    equal to the reference."""
    case = Case(2, 3, 6, 3, 70, 32, True, "headwise", chunks=5, kv_length=(40, 23), keep_groups=True)
    inputs = decode_inputs(case)
    # sequence b keeps the groups b, b + 1, b + 2 (mod 3) at its queries 0, 1, 2: make it keep only group b
    inputs["keep"] = inputs["keep"][:, :1].expand(-1, 3, -1).contiguous()
    clean = decode(inputs, True, case.chunks)
    poisoned = {**inputs, "k": inputs["k"].clone(), "v": inputs["v"].clone()}
    for b, filled in enumerate(case.kv_length):
        dropped = inputs["keep"][b, 0].unflatten(0, (3, 2))[:, 0] == 0  # (KV,)
        for cache in (poisoned["k"], poisoned["v"]):
            cache[b, dropped] = float("nan")
            cache[b, :, filled:] = float("nan")
    out = decode(poisoned, True, case.chunks)
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean)
    torch.testing.assert_close(out.double(), reference(inputs, True, torch.float64), atol=1e-5, rtol=1e-5)
    # one slot per sequence: the kept group goes first, the dropped ones are never visited
    assert torch.equal(decode(poisoned, True, case.chunks, kept_groups=1), clean)


@pytest.mark.parametrize("kept_groups", [None, 1], ids=["every-group", "top1-one-slot"])
def test_decode_kernel_touches_only_its_tensors(monkeypatch, kept_groups):
    """Every input in a NaN-guarded buffer (a read outside it would reach the output) and every tensor the
    launcher allocates (partials, output) too (a write outside it would overwrite the guard; a read of a
    partial nobody wrote, such as those of the groups one slot never visits, would reach the output)."""
    from hf_gate_attention.kernels import decode_attention

    outputs = _GuardedTorch()
    monkeypatch.setattr(decode_attention, "torch", outputs)
    case = Case(
        2, 5, 8, 2, 37, 24, True, "elementwise", 3, left_padding=True, kv_length=(37, 30),
        keep_groups=kept_groups is not None,
    )  # fmt: skip
    inputs_buffers: list = []
    inputs = {name: guarded(t, inputs_buffers) for name, t in decode_inputs(case).items() if t is not None}
    if kept_groups is not None:  # every query keeps the same group: one per sequence
        inputs["keep"].copy_(inputs["keep"][:, :1].expand_as(inputs["keep"]))
    out = decode(inputs, case.causal, case.chunks, kept_groups=kept_groups)
    torch.testing.assert_close(out.double(), reference(inputs, True, torch.float64), atol=1e-5, rtol=1e-5)
    assert len(outputs.buffers) == 3  # partial outputs, partial log-sum-exps, output
    assert_guards_intact(outputs.buffers + inputs_buffers)


def test_kernels_compile_for_hopper(tmp_path):
    """Triton's compiler, which the interpreter never runs, accepts the split and merge kernels and the fused
    gate pass for sm_90 (H100/H200) with every flag combination the launchers use, and, specialised for
    aligned inputs as the JIT does, their bfloat16 tiles compile to 16-byte global loads without register
    spills; each fused attention kernel has an autotuning candidate without spills at head dims 64 and 128
    (`hopper_compile.py`, its own process)."""
    pytest.importorskip("triton.backends.nvidia", reason="Triton without its NVIDIA backend")
    env = os.environ | {"TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    script = REPO / "tests" / "kernels" / "hopper_compile.py"
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("compiled ") == 20 + 12  # 12: 3 attention kernels x 2 head dims x 2 candidates


def test_custom_op_passes_opcheck_and_compiles_without_graph_breaks():
    case = Case(1, 2, 4, 2, 20, 32, True, "headwise", chunks=2, kv_length=(13,), keep_groups=True)
    inputs = decode_inputs(case)
    args = tuple(inputs[n] for n in ("q", "k", "v", "gate_logits", "keep", "key_padding_mask", "kv_length"))
    op = torch.ops.hf_gate_attention.gated_decode_attention
    # dropped groups read nothing (one slot per group), or their sink and window keys (one slot for all)
    for streaming, kept_groups in (((0, 0), None), ((1, 3), 1)):
        result = torch.library.opcheck(op, (*args, 2.0, True, 0.125, 2, *streaming, kept_groups))
        assert set(result.values()) == {"SUCCESS"}, result
    compiled = torch.compile(lambda inputs: decode(inputs, True, 2), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(inputs), decode(inputs, True, 2))


def test_decode_refuses_gradients_long_queries_and_bad_lengths():
    inputs = decode_inputs(Case(1, 1, 2, 1, 8, 16, True, "headwise", chunks=1))
    with pytest.raises(ValueError, match=r"forward only.*use gated_flash_attention"):
        gated_decode_attention(inputs["q"].requires_grad_(), inputs["k"], inputs["v"])
    q = torch.randn(1, 2, 17, 16, device=DEVICE)
    with pytest.raises(ValueError, match="at most 16 positions"):
        decode({"q": q, "k": q[:, :1], "v": q[:, :1]}, True)
    with pytest.raises(ValueError, match=r"kv_length must be an int32 or int64 tensor of shape \(B,\)"):
        decode({**inputs, "q": inputs["q"].detach(), "kv_length": torch.tensor([1.0])}, True)
    inputs["q"] = inputs["q"].detach()
    with pytest.raises(ValueError, match="kept_groups must be a positive int or None, got 0"):
        decode({**inputs, "keep": torch.ones(1, 1, 2)}, True, kept_groups=0)
    with pytest.raises(ValueError, match="kept_groups bounds the key/value groups that `keep` keeps"):
        decode(inputs, True, kept_groups=1)


# --- backend "triton" on a tiny Llama: static caches and top-k decode ---

GQA = {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3}  # 3 groups of 2 heads


def _gated_llama(
    backend: str,
    variant: str = "output",
    reads: dict | None = None,
    bare=False,
    top_k=1,
    unit="kv_group",
    **options,
):
    model = tiny_model("llama", bare=bare, **GQA)
    torch.manual_seed(7)  # the same gate weights on both backends
    config = GateConfig(variant=variant, init="paper", top_k=top_k, top_k_unit=unit, **(reads or {}))
    return patch(model, config, backend=backend, **options)


def _padded_prompt(length: int) -> dict:
    inputs = tiny_inputs("llama", batch=2, length=length)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    inputs["attention_mask"][1, :3] = 0  # left padding, as for batched generation
    return inputs


def test_key_mask_passes_the_filled_length_of_static_caches():
    """Backend "triton"'s mask function: its bool key padding mask (or None) when every key exists; with a
    static cache's unfilled slots, the filled length at each attended key (0 elsewhere), on the device."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    from hf_gate_attention.kernels.backends import key_mask

    padded = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    causal = {"mask_function": causal_mask_function}
    assert torch.equal(key_mask(2, 4, 4, 0, attention_mask=padded, **causal), padded)  # no cache, dynamic
    assert key_mask(2, 1, 4, 3, **causal) is None
    static_prefill = key_mask(2, 4, 6, 0, attention_mask=padded, **causal)  # generate's mask: 4 of 6 slots
    assert torch.equal(static_prefill, torch.tensor([[0, 4, 4, 4, 0, 0], [4, 4, 4, 4, 0, 0]]))
    position = torch.tensor(4)  # the cache's own position tensor: the mask stays on the device
    assert torch.equal(key_mask(1, 1, 6, position, **causal), torch.tensor([[5, 5, 5, 5, 5, 0]]))
    # an encoder with more keys than queries (prefix tuning): every key exists; a mask that masks nothing is
    # kept for up to MAX_DECODE_QUERIES queries (dropping it would read it on the host)
    prefixed = torch.ones(1, 6, dtype=torch.bool)
    kept = key_mask(1, 4, 6, 0, attention_mask=prefixed, mask_function=bidirectional_mask_function)
    assert torch.equal(kept, prefixed)


def test_key_mask_drops_a_mask_that_masks_nothing_in_prefill(monkeypatch):
    """More than MAX_DECODE_QUERIES queries (prefill, training): an all-True key mask becomes None (SDPA's
    flash kernel; one host read per forward, as transformers' SDPA mask does), but not while compiling; a
    mask with padding stays."""
    from transformers.masking_utils import causal_mask_function

    from hf_gate_attention.kernels.backends import key_mask
    from hf_gate_attention.kernels.ops import MAX_DECODE_QUERIES

    length = MAX_DECODE_QUERIES + 1
    causal = {"mask_function": causal_mask_function}
    every = torch.ones(2, length, dtype=torch.long)
    assert key_mask(2, length, length, 0, attention_mask=every, **causal) is None
    assert torch.equal(
        key_mask(2, length - 1, length - 1, 0, attention_mask=every[:, 1:], **causal), every[:, 1:] > 0
    )
    padded = every.clone()
    padded[1, 0] = 0
    assert torch.equal(key_mask(2, length, length, 0, attention_mask=padded, **causal), padded > 0)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert torch.equal(key_mask(2, length, length, 0, attention_mask=every, **causal), every > 0)


@pytest.mark.parametrize("dropped", ["nothing", "sink2-window3"])
@pytest.mark.parametrize("variant", ["output", "qk"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_top_k_on_triton_equals_the_masked_reference(variant, cache, dropped):
    """Greedy generation, prompt left-padded: the triton backend (the split-KV kernel at decode; with sink
    and window reads, SDPA twice at prefill) equals the torch reference."""
    reads = {"top_k_sink": 2, "top_k_window": 3} if dropped != "nothing" else None
    inputs = _padded_prompt(7)
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0, "output_scores": True}
    settings["return_dict_in_generate"] = True
    if cache == "static":
        settings["cache_implementation"] = "static"
    results = []
    for backend, options in (("torch", {"sparse": False}), ("triton", {})):
        with torch.no_grad():
            results.append(_gated_llama(backend, variant, reads, **options).generate(**inputs, **settings))
    expected, generated = results
    assert torch.equal(generated.sequences, expected.sequences)
    scores, expected_scores = torch.stack(generated.scores), torch.stack(expected.scores)  # (new, B, V)
    torch.testing.assert_close(scores, expected_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])  # without an attention mask, and left padded
@pytest.mark.parametrize("length", [9, 20])  # the decode kernel (<= 16 queries), the flash kernel
def test_static_cache_prefill_on_triton_equals_torch(length, padded):
    """Regression: a StaticCache hands the attention all `max_cache_len` slots; the causal window must end at
    the filled length, not at the end of the cache (logits were off by 0.1 to 0.8)."""
    inputs = _padded_prompt(length)
    if not padded:
        del inputs["attention_mask"]
    logits = []
    for backend in ("torch", "triton"):
        model = _gated_llama(backend)
        cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad():
            logits.append(model(**inputs, cache=cache, use_cache=True).logits)
    real = inputs["attention_mask"].bool() if padded else slice(None)
    torch.testing.assert_close(logits[1][real], logits[0][real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("variant", "top_k", "unit"), [("output", 1, "kv_group"), ("qk", 1, "kv_group"), ("output", 2, "head")]
)
def test_decode_steps_launch_one_slot_per_kept_group(variant, top_k, unit, monkeypatch):
    """Backend "triton" tells the decode kernel that a query keeps at most `top_k` groups (top-1 of the 3
    groups; or top-2 of the 6 heads, which may fall in one group: a slot then has nothing to do), and the
    kernel launches that many group slots per sequence (`decode_attention.py`): prompt and decode step equal
    the torch reference, and every decode call got `kept_groups = top_k * Lq`."""
    import hf_gate_attention.kernels as kernels

    calls = []
    decode_kernel = kernels.gated_decode_attention

    def spy(query, *args, **options):
        calls.append((query.shape[2], options.get("kept_groups")))
        return decode_kernel(query, *args, **options)

    monkeypatch.setattr(kernels, "gated_decode_attention", spy)
    inputs = _padded_prompt(5)
    logits = {}
    for backend, options in (("torch", {"sparse": False}), ("triton", {})):
        model = _gated_llama(backend, variant, top_k=top_k, unit=unit, **options)
        with torch.no_grad():
            out = model(**inputs, use_cache=True)
            ids = out.logits[:, -1:].argmax(-1)
            mask = torch.cat([inputs["attention_mask"], torch.ones_like(ids)], dim=1)
            step = model(input_ids=ids, attention_mask=mask, past_key_values=out.past_key_values)
        logits[backend] = torch.cat([out.logits, step.logits], dim=1)[mask.bool()]  # real positions
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-5, rtol=1e-5)
    layers = model.config.num_hidden_layers
    assert calls == [(5, 5 * top_k)] * layers + [(1, top_k)] * layers  # the prompt's 5 queries, one step


def test_compiled_static_cache_decode_steps_equal_the_reference():
    """Decode steps on a StaticCache under `torch.compile(fullgraph=True)`: the filled length reaches the
    decode kernel as a tensor, without a graph break (no host synchronisation in the traced step)."""
    torch._dynamo.reset()
    prompt = tiny_inputs("llama", batch=2, length=7)
    steps = {}
    for backend, options in (("torch", {"sparse": False}), ("triton", {})):
        model = _gated_llama(backend, **options)
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        step = torch.compile(model, fullgraph=True, backend="aot_eager") if backend == "triton" else model
        with torch.no_grad():
            ids = model(**prompt, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
            steps[backend] = []
            for _ in range(3):
                logits = step(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
                steps[backend].append(logits)
                ids = logits.argmax(-1, keepdim=True)
    torch.testing.assert_close(
        torch.stack(steps["triton"]), torch.stack(steps["torch"]), atol=1e-5, rtol=1e-5
    )


# --- Dropped heads reading their sink and window keys (top_k_sink, top_k_window) ---

STREAMING_CASES = [
    # (case, sink, window): per-head keep drawn at random (some heads of a group kept, others not)
    (Case(2, 1, 4, 2, 45, 32, True, "headwise", chunks=3, left_padding=True), 2, 5),
    (Case(3, 3, 8, 2, 50, 32, True, "elementwise", 4, kv_length=(50, 17, 33)), 1, 16),
    (Case(2, 2, 4, 4, 37, 16, False, "headwise", chunks=2, left_padding=True, kv_length=(30,)), 0, 7),
    (Case(1, 5, 8, 1, 40, 32, True, "headwise", chunks=None, kv_length=(21,)), 4, 0),
]


@pytest.mark.parametrize(
    ("case", "sink", "window"),
    STREAMING_CASES,
    ids=[f"{c.id}-sink{s}-window{w}" for c, s, w in STREAMING_CASES],
)
def test_streaming_decode_matches_reference(case, sink, window):
    inputs = decode_inputs(case)
    generator = torch.Generator().manual_seed(case.keys)
    inputs["keep"] = (torch.rand(case.batch, case.length, case.heads, generator=generator) > 0.5).float()
    options = {"top_k_sink": sink, "top_k_window": window}
    out = decode(inputs, case.causal, case.chunks, **options)
    args = {k: t.double() if t is not None and t.is_floating_point() else t for k, t in inputs.items()}
    expected = gated_attention_reference(**args, gate_scale=2.0, causal=case.causal, **options)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    # one group slot per sequence: kept groups first, then the dropped ones with their sink and window reads
    one_slot = decode(inputs, case.causal, case.chunks, kept_groups=1, **options)
    if case.chunks is not None:
        assert torch.equal(one_slot, out)
    torch.testing.assert_close(one_slot.double(), expected, atol=1e-5, rtol=1e-5)
    dropping_nothing = gated_attention_reference(**args, gate_scale=2.0, causal=case.causal)
    assert (expected - dropping_nothing).abs().max() > 1e-3  # the dropped heads' reads matter


def test_streaming_decode_reads_only_the_sink_and_window_of_dropped_groups():
    """Decode with whole groups dropped and `top_k_sink=2, top_k_window=5`: NaN at every other cached key of
    those groups (the first 3 slots padded for sequence 0, so its sink starts later; sequence 1 filled to
    30 of 64 slots) gives the same finite output."""
    case = Case(2, 1, 6, 3, 64, 32, True, "headwise", chunks=4, kv_length=(64, 30))
    inputs = decode_inputs(case)
    inputs["key_padding_mask"] = torch.ones(2, 64, dtype=torch.bool)
    inputs["key_padding_mask"][0, :3] = False
    inputs["keep"] = torch.ones(2, 1, 6)
    dropped = {0: 1, 1: 0}  # sequence -> its dropped group
    read = {0: [3, 4, *range(59, 64)], 1: [0, 1, *range(25, 30)]}  # sink after padding; window at the end
    for b, g in dropped.items():
        inputs["keep"][b, :, 2 * g : 2 * g + 2] = 0.0
    options = {"gate_scale": 2.0, "causal": True, "num_chunks": 4, "top_k_sink": 2, "top_k_window": 5}
    with torch.no_grad():
        clean = gated_decode_attention(**inputs, **options)
        poisoned = {**inputs, "k": inputs["k"].clone(), "v": inputs["v"].clone()}
        for b, g in dropped.items():
            unread = torch.ones(64, dtype=torch.bool)
            unread[read[b]] = False
            poisoned["k"][b, g, unread] = float("nan")
            poisoned["v"][b, g, unread] = float("nan")
        out = gated_decode_attention(**poisoned, **options)
        one_slot = gated_decode_attention(**poisoned, **options, kept_groups=1)
    assert torch.isfinite(out).all()
    assert torch.equal(out, clean) and torch.equal(one_slot, clean)


@pytest.mark.parametrize("length", [11, 24], ids=["masked-reads", "blocked-reads"])
@pytest.mark.parametrize("bare", [True, False], ids=["bare", "task-head"])
def test_training_with_sink_and_window_reads_on_triton_equals_torch(bare, length):
    """Forward and backward on backend "triton" with `top_k_sink`/`top_k_window` (prefill and training run
    SDPA, and the reads blocked where 1 + 8 + 4 keys are fewer than the prompt's): outputs and every
    parameter's gradient equal the torch reference's."""
    inputs = _padded_prompt(length)
    real = inputs["attention_mask"].bool()
    results = []
    for backend, options in (("torch", {"sparse": False}), ("triton", {})):
        reads = {"top_k_sink": 1, "top_k_window": 4}
        model = _gated_llama(backend, reads=reads, bare=bare, **options).train()
        logits = first_output(model(**inputs))
        logits[real].square().mean().backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        results.append((logits.detach()[real], grads))
    (expected, expected_grads), (logits, grads) = results
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert grads.keys() == expected_grads.keys() and any("attn_gate" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)
