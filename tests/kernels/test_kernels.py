"""The Triton kernels against their float64 references, on odd shapes (Triton's interpreter on CPU).

Tolerance, as in flash-attention: the kernel's error to the float64 reference may be at most twice PyTorch's
own error in the same dtype (the reference run in that dtype), plus a small absolute epsilon per dtype (a 2x
bound on a tiny PyTorch error, exactly 0 for the dq of a single key, is below float32 accumulation noise),
for the output and every gradient.

The kernels run through the Triton interpreter on CPU (`TRITON_INTERPRET=1`, the default here), blocks of 16,
so small shapes still span several blocks, partial blocks and the causal diagonal. On a CUDA machine,
`TRITON_INTERPRET=0 pytest tests/kernels/test_kernels.py` runs the same tests on the GPU.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first imported

import pytest
import torch
from helpers import interpreter_rounds_bfloat16_to_nearest

pytest.importorskip("triton", reason="the Triton kernels need the triton package")

from hf_gate_attention.kernels import (
    check_supported,
    gated_attention_reference,
    gated_flash_attention,
    sigmoid_gate_multiply,
    sigmoid_gate_multiply_reference,
    triton_available,
)

AVAILABLE, REASON = triton_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=REASON)
INTERPRET = os.environ["TRITON_INTERPRET"] != "0"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
EPS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-3}


@pytest.fixture(autouse=True)
def _bfloat16_rounds_to_nearest(monkeypatch):
    if INTERPRET:
        interpreter_rounds_bfloat16_to_nearest(monkeypatch)


def assert_close_to_reference(
    name: str, out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor
) -> None:
    """`|out - ref|_max <= 2 |torch_out - ref|_max + eps`, `ref` in float64, `torch_out` PyTorch's result in
    the dtype of `out`."""
    error = (out.double() - ref).abs().max().item()
    torch_error = (torch_out.double() - ref).abs().max().item()
    bound = 2 * torch_error + EPS[out.dtype]
    assert error <= bound, (
        f"{name}: max error {error:.3g} > {bound:.3g} (PyTorch's own error: {torch_error:.3g})"
    )


def run_with_grads(fn, inputs: list[torch.Tensor | None], grad_out: torch.Tensor | None = None, **kwargs):
    """`fn(*inputs, **kwargs)` on fresh leaf copies, its output and the gradients of the floating inputs
    (`None` entries are passed through)."""
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in inputs]
    out = fn(*leaves, **kwargs)
    out.backward(grad_out.to(out.dtype))
    return out, [x.grad for x in leaves if x is not None]


# --- Fused gated flash attention ---


@dataclass(frozen=True)
class Case:
    batch: int
    length: int
    heads: int
    kv_heads: int
    dim: int
    causal: bool
    padding: str  # "none", "left" or "right"
    gate: str  # "headwise", "elementwise" or "none"
    dtype: str
    keys: int | None = None  # S (default L); causal with S > L: the queries are the last L positions
    top_k: int | None = None

    @property
    def id(self) -> str:
        keys = f"-S{self.keys}" if self.keys else ""
        top_k = f"-top{self.top_k}" if self.top_k else ""
        return (
            f"B{self.batch}-L{self.length}{keys}-H{self.heads}-KV{self.kv_heads}-D{self.dim}-"
            f"{'causal' if self.causal else 'full'}-pad_{self.padding}-{self.gate}{top_k}-{self.dtype}"
        )


SLOW = pytest.mark.slow  # the two largest cases (seconds each through the interpreter)
CASES = [
    pytest.param(
        Case(2, 113, 3, 1, 64, causal=True, padding="left", gate="headwise", dtype="bf16"), marks=SLOW
    ),
    Case(1, 77, 3, 1, 64, causal=False, padding="right", gate="elementwise", dtype="fp32"),
    Case(1, 17, 4, 2, 32, causal=True, padding="none", gate="elementwise", dtype="fp16"),
    Case(2, 1, 2, 2, 80, causal=False, padding="none", gate="headwise", dtype="fp32"),
    Case(2, 1, 4, 2, 96, causal=True, padding="left", gate="headwise", dtype="bf16", keys=40),
    Case(1, 24, 4, 1, 128, causal=True, padding="none", gate="elementwise", dtype="fp32", keys=57),
    Case(2, 40, 4, 2, 32, causal=True, padding="right", gate="headwise", dtype="fp16", top_k=2),
    pytest.param(
        Case(2, 50, 3, 3, 96, causal=False, padding="left", gate="elementwise", dtype="bf16", top_k=1),
        marks=SLOW,
    ),
    Case(1, 33, 2, 2, 128, causal=False, padding="none", gate="none", dtype="bf16"),
    Case(1, 9, 4, 2, 8, causal=True, padding="right", gate="elementwise", dtype="fp32"),
]


def attention_inputs(case: Case) -> dict:
    """Random inputs of `case`: q/k/v in its dtype, gate logits, a top-k keep mask, a key padding mask."""
    dtype, keys = DTYPES[case.dtype], case.keys or case.length
    q = torch.randn(case.batch, case.heads, case.length, case.dim, device=DEVICE, dtype=dtype)
    k = torch.randn(case.batch, case.kv_heads, keys, case.dim, device=DEVICE, dtype=dtype)
    v = torch.randn(case.batch, case.kv_heads, keys, case.dim, device=DEVICE, dtype=dtype)
    width = {"headwise": 1, "elementwise": case.dim, "none": 0}[case.gate]
    gate_logits = (
        torch.randn(case.batch, case.length, case.heads, width, device=DEVICE, dtype=dtype) if width else None
    )
    keep = None
    if case.top_k:
        scores = torch.rand(case.batch, case.length, case.heads, device=DEVICE)
        keep = torch.zeros_like(scores).scatter(-1, scores.topk(case.top_k, dim=-1).indices, 1.0)
    mask = None
    if case.padding != "none":  # a third of the keys of batch 0 padded, the other batches not
        mask = torch.ones(case.batch, keys, dtype=torch.bool, device=DEVICE)
        padded = max(1, keys // 3)
        if case.padding == "left":
            mask[0, :padded] = False
        else:
            mask[0, keys - padded :] = False
    return {"q": q, "k": k, "v": v, "gate_logits": gate_logits, "keep": keep, "key_padding_mask": mask}


def check_attention(inputs: dict, causal: bool, gate_scale: float = 2.0) -> None:
    q, k, v, gate_logits = inputs["q"], inputs["k"], inputs["v"], inputs["gate_logits"]
    keep, mask = inputs["keep"], inputs["key_padding_mask"]
    grad_out = torch.randn(q.shape[0], q.shape[2], q.shape[1], q.shape[3], device=DEVICE)  # (B, L, H, D)
    kwargs = {"gate_scale": gate_scale, "causal": causal, "key_padding_mask": mask}
    out, grads = run_with_grads(gated_flash_attention, [q, k, v, gate_logits], grad_out, keep=keep, **kwargs)
    ref, ref_grads = run_with_grads(
        gated_attention_reference,
        [t.double() if t is not None else None for t in (q, k, v, gate_logits)],
        grad_out,
        keep=keep.double() if keep is not None else None,
        **kwargs,
    )
    torch_out, torch_grads = run_with_grads(
        gated_attention_reference,
        [q, k, v, gate_logits],
        grad_out,
        keep=keep.to(q.dtype) if keep is not None else None,
        **kwargs,
    )
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert_close_to_reference("out", out, ref, torch_out)
    for name, grad, ref_grad, torch_grad in zip(
        ("dq", "dk", "dv", "dz"), grads, ref_grads, torch_grads, strict=False
    ):
        assert grad.shape == ref_grad.shape and grad.dtype == torch_grad.dtype, name
        assert_close_to_reference(name, grad, ref_grad, torch_grad)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_gated_flash_attention_matches_reference(case):
    check_attention(attention_inputs(case), case.causal)


def test_gated_flash_attention_takes_strided_inputs():
    """q, k, v as transformers hands them over: transposed views of (B, L, heads, D) projections."""
    q = torch.randn(2, 21, 4, 32, device=DEVICE).transpose(1, 2)  # (B, H, L, D), non-contiguous
    kv = torch.randn(2, 21, 2, 2, 32, device=DEVICE)  # (B, S, [k, v], KV, D), as from a fused projection
    k, v = kv.transpose(1, 3).unbind(2)  # 2 x (B, KV, S, D), non-contiguous
    gate_logits = torch.randn(2, 21, 4, 1, device=DEVICE)
    check_attention(
        {"q": q, "k": k, "v": v, "gate_logits": gate_logits, "keep": None, "key_padding_mask": None}, True
    )


def test_flash_kernel_respects_kv_length_forward_and_backward():
    """The flash kernel (prefill, training) with a partly filled static cache: keys past kv_length (NaN) are
    never read, the causal window ends at the filled length, their gradients are 0."""
    q = torch.randn(2, 4, 19, 32, device=DEVICE)
    k, v = torch.randn(2, 2, 2, 45, 32, device=DEVICE)
    gate_logits = torch.randn(2, 19, 4, 1, device=DEVICE)
    kv_length = torch.tensor([19, 34], device=DEVICE)
    grad_out = torch.randn(2, 19, 4, 32, device=DEVICE)
    kwargs = {"gate_scale": 2.0, "causal": True, "kv_length": kv_length}
    poisoned_k, poisoned_v = k.clone(), v.clone()
    for b, filled in enumerate(kv_length.tolist()):
        poisoned_k[b, :, filled:] = float("nan")
        poisoned_v[b, :, filled:] = float("nan")
    poisoned = [q, poisoned_k, poisoned_v, gate_logits]
    out, grads = run_with_grads(gated_flash_attention, poisoned, grad_out, **kwargs)
    clean = [t.double() for t in (q, k, v, gate_logits)]
    ref, ref_grads = run_with_grads(gated_attention_reference, clean, grad_out, **kwargs)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for name, grad, ref_grad in zip(("dq", "dk", "dv", "dz"), grads, ref_grads, strict=True):
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad.double(), ref_grad, atol=1e-5, rtol=1e-5, msg=name)
    assert not grads[1][0, :, 19:].any() and not grads[2][1, :, 34:].any()


def test_top_k_skips_dropped_tiles():
    """A (query block, head) tile whose keep values are all 0 is never computed: NaN queries there reach
    neither the output nor any gradient, and the rest is exact."""
    inputs = attention_inputs(
        Case(2, 40, 4, 2, 32, causal=True, padding="none", gate="headwise", dtype="fp32")
    )
    keep = torch.ones(2, 40, 4, device=DEVICE)
    keep[0, :, 1] = 0.0  # head 1 of batch 0 dropped at every position: all its tiles, whatever the block size
    clean_q = inputs["q"].clone()
    inputs["q"][0, 1] = float("nan")
    out, (dq, dk, dv, dz) = run_with_grads(
        gated_flash_attention,
        [inputs["q"], inputs["k"], inputs["v"], inputs["gate_logits"]],
        torch.ones(2, 40, 4, 32, device=DEVICE),
        gate_scale=2.0,
        keep=keep,
        causal=True,
    )
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1]))
    assert torch.equal(dq[0, 1], torch.zeros_like(dq[0, 1])) and torch.equal(
        dz[0, :, 1], torch.zeros_like(dz[0, :, 1])
    )
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv, dz))
    check_attention({**inputs, "q": clean_q, "keep": keep}, causal=True)


def test_decode_never_reads_the_keys_and_values_of_dropped_groups():
    """Decode (one query per sequence) with whole key/value groups dropped, as `top_k_unit="kv_group"` gives:
    the kernel never loads their keys and values (NaN there reaches nothing), and each sequence of the batch
    drops its own group."""
    inputs = attention_inputs(
        Case(2, 1, 6, 3, 32, causal=True, padding="left", gate="headwise", dtype="fp32", keys=40)
    )
    keep = torch.ones(2, 1, 6, device=DEVICE)  # (B, L, H); group g holds heads 2g and 2g + 1
    dropped = {0: 1, 1: 2}  # sequence -> its dropped group
    poisoned_k, poisoned_v = inputs["k"].clone(), inputs["v"].clone()
    for b, g in dropped.items():
        keep[b, :, 2 * g : 2 * g + 2] = 0.0
        poisoned_k[b, g] = float("nan")
        poisoned_v[b, g] = float("nan")
    kwargs = {"gate_scale": 2.0, "keep": keep, "causal": True, "key_padding_mask": inputs["key_padding_mask"]}
    q, gate_logits = inputs["q"], inputs["gate_logits"]
    out = gated_flash_attention(q, poisoned_k, poisoned_v, gate_logits, **kwargs)
    expected = gated_attention_reference(q, inputs["k"], inputs["v"], gate_logits, **kwargs)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    check_attention({**inputs, "keep": keep}, causal=True)


# --- Fused sigmoid-gate-multiply ---


@pytest.mark.parametrize(
    ("shape", "width", "with_keep", "dtype"),
    [((2, 7, 3, 64), 1, False, "fp32"), ((5, 4, 80), 80, True, "bf16"), ((3, 11, 2, 96), 1, True, "fp16")],
    ids=["N2x7-G3-D64-headwise-fp32", "N5-G4-D80-elementwise-keep-bf16", "N3x11-G2-D96-headwise-keep-fp16"],
)
def test_sigmoid_gate_multiply_matches_reference(shape, width, with_keep, dtype):
    dtype = DTYPES[dtype]
    values = torch.randn(shape, device=DEVICE, dtype=dtype)
    gate_logits = torch.randn(*shape[:-1], width, device=DEVICE, dtype=dtype)
    keep = (torch.rand(shape[:-1], device=DEVICE) > 0.5).float() if with_keep else None
    grad_out = torch.randn(shape, device=DEVICE)
    out, grads = run_with_grads(
        sigmoid_gate_multiply, [values, gate_logits], grad_out, gate_scale=2.0, keep=keep
    )
    ref, ref_grads = run_with_grads(
        sigmoid_gate_multiply_reference,
        [values.double(), gate_logits.double()],
        grad_out,
        gate_scale=2.0,
        keep=keep.double() if keep is not None else None,
    )
    torch_out, torch_grads = run_with_grads(
        sigmoid_gate_multiply_reference, [values, gate_logits], grad_out, gate_scale=2.0, keep=keep
    )
    assert_close_to_reference("out", out, ref, torch_out)
    for name, grad, ref_grad, torch_grad in zip(
        ("dvalues", "dz"), grads, ref_grads, torch_grads, strict=True
    ):
        assert_close_to_reference(name, grad, ref_grad, torch_grad)


def test_sigmoid_gate_multiply_takes_a_strided_slice():
    """The value part of a fused qkv projection output: a strided view, read without a copy."""
    qkv = torch.randn(2, 9, 3 * 4 * 16, device=DEVICE)
    values = qkv[..., 2 * 64 :].unflatten(-1, (4, 16))  # (B, L, G, D) with row stride 192
    gate_logits = torch.randn(2, 9, 4, 16, device=DEVICE)
    expected = sigmoid_gate_multiply_reference(values, gate_logits, 1.0)
    torch.testing.assert_close(sigmoid_gate_multiply(values, gate_logits), expected)


# --- Memory safety: no read or write outside the tensors ---


class _GuardedTorch:
    """`torch` for the kernel launchers, whose `empty`/`empty_like` place each output inside a NaN-filled
    buffer: a kernel store outside its output changes the guard (`assert_guards_intact`). The outputs start
    as NaN too (0x5A if integer): a kernel that reads an element nobody wrote puts NaN in the results."""

    def __init__(self):
        self.buffers: list[tuple[torch.Tensor, int]] = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *size, dtype=None, device=None):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
        return self._guarded(shape, dtype or torch.get_default_dtype(), device)

    def empty_like(self, tensor):
        return self._guarded(tensor.shape, tensor.dtype, tensor.device)

    def _guarded(self, shape, dtype, device):
        fill = float("nan") if dtype.is_floating_point else 0x5A
        return guarded(torch.full(shape, fill, dtype=dtype, device=device), self.buffers)


def guarded(tensor: torch.Tensor, buffers: list) -> torch.Tensor:
    """A copy of `tensor` in the middle of a buffer whose other elements (the guards) are NaN or 0x5A."""
    fill = float("nan") if tensor.is_floating_point() else 0x5A
    dtype = tensor.dtype if tensor.dtype != torch.bool else torch.uint8
    guard = tensor.numel() + 64  # wider than a tile's overshoot, so that a stray store lands in the guard
    buffer = torch.full((tensor.numel() + 2 * guard,), fill, dtype=dtype, device=tensor.device)
    inner = buffer[guard : guard + tensor.numel()].view(tensor.shape)
    inner.copy_(tensor.to(dtype))
    buffers.append((buffer, fill, guard))
    return inner.view(torch.bool) if tensor.dtype == torch.bool else inner


def assert_guards_intact(buffers: list) -> None:
    for buffer, fill, size in buffers:
        for guard in (buffer[:size], buffer[-size:]):
            intact = guard.isnan().all() if isinstance(fill, float) else (guard == fill).all()
            assert intact, f"a kernel wrote outside a tensor of {buffer.numel() - 2 * size} elements"


@pytest.mark.parametrize(
    "case",
    [
        Case(2, 17, 4, 2, 32, causal=False, padding="right", gate="headwise", dtype="fp32"),
        Case(1, 33, 3, 1, 24, causal=True, padding="left", gate="elementwise", dtype="fp32", top_k=2),
        Case(2, 5, 2, 2, 40, causal=True, padding="none", gate="headwise", dtype="bf16", keys=21),
    ],
    ids=lambda case: case.id,
)
def test_kernels_touch_only_their_tensors(case, monkeypatch):
    """Every input sits in a NaN-guarded buffer (a read outside it would put NaN in the results) and every
    output the launchers allocate too (a write outside it would overwrite the guard)."""
    from hf_gate_attention.kernels import gate_multiply, gated_attention

    outputs = _GuardedTorch()
    for module in (gated_attention, gate_multiply):
        monkeypatch.setattr(module, "torch", outputs)
    inputs_buffers: list = []
    inputs = {
        name: guarded(t, inputs_buffers) if t is not None else None
        for name, t in attention_inputs(case).items()
    }
    check_attention(inputs, case.causal)
    values = guarded(torch.randn(3, case.length, case.heads, case.dim), inputs_buffers)
    logits = guarded(torch.randn(3, case.length, case.heads, 1), inputs_buffers)
    grad_out = torch.randn(values.shape)
    out, grads = run_with_grads(sigmoid_gate_multiply, [values, logits], grad_out, gate_scale=2.0)
    ref, ref_grads = run_with_grads(
        sigmoid_gate_multiply_reference, [values, logits], grad_out, gate_scale=2.0
    )
    for result, expected in zip([out, *grads], [ref, *ref_grads], strict=True):
        torch.testing.assert_close(result, expected)
    assert len(outputs.buffers) >= 8  # out, lse, delta, dz, dk, dv, dq of the attention; the multiply's
    assert_guards_intact(outputs.buffers + inputs_buffers)


# --- Custom ops, torch.compile, errors ---


def _op_inputs():
    q = torch.randn(1, 2, 19, 32, device=DEVICE)
    k, v = torch.randn(2, 1, 1, 19, 32, device=DEVICE)
    gate_logits, keep = torch.randn(1, 19, 2, 1, device=DEVICE), torch.ones(1, 19, 2, device=DEVICE)
    mask = torch.ones(1, 19, dtype=torch.bool, device=DEVICE)
    return q, k, v, gate_logits, keep, mask


def test_custom_ops_pass_opcheck():
    ops = torch.ops.hf_gate_attention
    q, k, v, gate_logits, keep, mask = _op_inputs()
    kv_length = torch.tensor([15], device=DEVICE)
    out, lse = ops.gated_attention_fwd(q, k, v, gate_logits, keep, mask, kv_length, 2.0, True, 0.125)
    grad_out = torch.randn_like(out)
    values = torch.randn(3, 5, 2, 32, device=DEVICE)
    logits = torch.randn(3, 5, 2, 32, device=DEVICE)
    backward_args = (grad_out, q, k, v, gate_logits, keep, mask, kv_length, out, lse, 2.0, True, 0.125)
    for op, args in [
        (ops.gated_attention_fwd, (q, k, v, gate_logits, keep, mask, kv_length, 2.0, True, 0.125)),
        (ops.gated_attention_fwd, (q, k, v, None, None, None, None, 1.0, False, 0.125)),
        (ops.gated_attention_bwd, backward_args),
        (ops.sigmoid_gate_multiply_fwd, (values, logits, None, 2.0)),
        (ops.sigmoid_gate_multiply_bwd, (values, values, logits, None, 2.0)),
    ]:
        result = torch.library.opcheck(op, args)  # schema, autograd registration, fake tensor, AOT dispatch
        assert set(result.values()) == {"SUCCESS"}, result


def test_torch_compile_traces_without_graph_breaks():
    q, k, v, gate_logits, keep, mask = _op_inputs()
    values = torch.randn(1, 19, 2, 32, device=DEVICE)

    def gated(q, k, v, gate_logits, values):
        attn = gated_flash_attention(q, k, v, gate_logits, 2.0, keep, True, mask)  # (B, L, H, D)
        return sigmoid_gate_multiply(attn + values, gate_logits, 2.0)

    inputs = [q, k, v, gate_logits, values]
    grad_out = torch.randn(1, 19, 2, 32, device=DEVICE)
    compiled = torch.compile(gated, fullgraph=True, backend="aot_eager")
    out, grads = run_with_grads(compiled, inputs, grad_out)
    eager_out, eager_grads = run_with_grads(gated, inputs, grad_out)
    torch.testing.assert_close(out, eager_out)
    for grad, eager_grad in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(grad, eager_grad)


def test_unsupported_head_dim_and_dtype_name_what_is_supported():
    with pytest.raises(ValueError, match="multiples of 8 from 8 to 128"):
        check_supported(100, torch.float16)
    with pytest.raises(
        ValueError, match=r"supported dtypes are torch\.float16, torch\.bfloat16, torch\.float32"
    ):
        check_supported(64, torch.float64)
    q = torch.randn(1, 2, 5, 100, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim=100"):
        gated_flash_attention(q, q, q)
    with pytest.raises(ValueError, match="gate_logits must have shape"):
        gated_flash_attention(q[..., :64], q[..., :64], q[..., :64], torch.zeros(1, 5, 2, 3, device=DEVICE))


def test_unavailable_triton_names_the_fallback(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    available, reason = triton_available()
    assert not available and "CUDA GPU" in reason and "backend='torch'" in reason
    q = torch.randn(1, 2, 5, 32)
    with pytest.raises(RuntimeError, match=r"backend='triton' is unavailable.*backend='torch'"):
        gated_flash_attention(q, q, q)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    available, reason = triton_available()
    assert not available and "not installed" in reason and "backend='torch'" in reason
