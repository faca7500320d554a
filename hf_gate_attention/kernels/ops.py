"""Custom ops, autograd and functional API of the Triton kernels, with their input checks.

Layers (as in flash-attention): Triton kernel + launcher (`gated_attention.py`, `decode_attention.py`,
`gate_multiply.py`) -> `torch.library` custom op per direction, with a fake implementation so that
`torch.compile` traces through it -> one `torch.autograd.Function` per op (not for the forward-only decode
attention) -> the functional API. The kernel modules are imported on first
use, so that this module imports without Triton and `TRITON_INTERPRET` may be set until the first call.
"""

from __future__ import annotations

import os

import torch

from ..core.gate import rounds_like_float32
from .reference import sigmoid_gate

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
MAX_DECODE_QUERIES = 16  # the longest query (positions) `gated_decode_attention` serves


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def triton_available() -> tuple[bool, str]:
    """Whether the Triton kernels can run here, and why (or why not).

    They need Triton and a CUDA GPU, or `TRITON_INTERPRET=1` (set before the first call) to run them on CPU
    tensors through Triton's interpreter, slowly (for tests)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "Triton is not installed (`pip install triton`); use patch(..., backend='torch')"
    if torch.cuda.is_available():
        return True, "Triton and a CUDA GPU"
    if _interpreting():
        return True, "Triton's interpreter (TRITON_INTERPRET=1): CPU tensors, slow"
    return False, (
        "the Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 to run them on CPU, slowly); "
        "use patch(..., backend='torch')"
    )


def check_supported(head_dim: int, dtype: torch.dtype) -> None:
    """Raise `ValueError` naming what the fused attention kernel supports if `head_dim` or `dtype` is not."""
    if not (head_dim % 8 == 0 and 8 <= head_dim <= MAX_HEAD_DIM):
        raise ValueError(
            f"head_dim={head_dim} is not supported by the Triton attention kernel: supported head dims are "
            f"multiples of 8 from 8 to {MAX_HEAD_DIM} (e.g. 32, 64, 80, 96, 128); "
            "use patch(..., backend='torch')"
        )
    _check_dtype(dtype)


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"dtype {dtype} is not supported by the Triton kernels: supported dtypes are "
            f"{', '.join(str(t) for t in SUPPORTED_DTYPES)}; use patch(..., backend='torch')"
        )


def _require_triton(device: torch.device) -> None:
    available, reason = triton_available()
    if not available:
        raise RuntimeError(f"backend='triton' is unavailable: {reason}")
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError(
            f"the Triton kernels run on CUDA tensors, got {device.type} tensors (set TRITON_INTERPRET=1 to "
            "run them on CPU, slowly); use patch(..., backend='torch')"
        )


# --- Fused gated flash attention ---


@torch.library.custom_op("hf_gate_attention::gated_attention_fwd", mutates_args=())
def _gated_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None,
    keep: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    kv_length: torch.Tensor | None,
    gate_scale: float,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    _require_triton(q.device)
    from .gated_attention import gated_attention_forward

    return gated_attention_forward(
        q, k, v, gate_logits, keep, key_padding_mask, kv_length, gate_scale, causal, sm_scale
    )


@_gated_attention_fwd.register_fake
def _(q, k, v, gate_logits, keep, key_padding_mask, kv_length, gate_scale, causal, sm_scale):
    batch, heads, length, dim = q.shape
    out = q.new_empty(batch, length, heads, dim)
    lse = q.new_empty(batch, heads, length, dtype=torch.float32)
    return out, lse


@torch.library.custom_op("hf_gate_attention::gated_attention_bwd", mutates_args=())
def _gated_attention_bwd(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None,
    keep: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    kv_length: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    gate_scale: float,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q, k, v and of the gate logits (an empty tensor without gate logits)."""
    _require_triton(q.device)
    from .gated_attention import gated_attention_backward

    grad_q, grad_k, grad_v, grad_logits = gated_attention_backward(
        grad_out, q, k, v, gate_logits, keep, key_padding_mask, kv_length, out, lse, gate_scale, causal,
        sm_scale,
    )  # fmt: skip
    return grad_q, grad_k, grad_v, grad_logits if grad_logits is not None else q.new_empty(0)


@_gated_attention_bwd.register_fake
def _(
    grad_out, q, k, v, gate_logits, keep, key_padding_mask, kv_length, out, lse, gate_scale, causal, sm_scale
):
    grad_logits = gate_logits.new_empty(gate_logits.shape) if gate_logits is not None else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), grad_logits


class GatedFlashAttention(torch.autograd.Function):
    """Autograd of the fused gated attention: saves the inputs, the gated output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, gate_logits, keep, key_padding_mask, kv_length, gate_scale, causal, sm_scale):
        out, lse = _gated_attention_fwd(
            q, k, v, gate_logits, keep, key_padding_mask, kv_length, gate_scale, causal, sm_scale
        )
        ctx.save_for_backward(q, k, v, gate_logits, keep, key_padding_mask, kv_length, out, lse)
        ctx.gate_scale, ctx.causal, ctx.sm_scale = gate_scale, causal, sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, gate_logits, keep, key_padding_mask, kv_length, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v, grad_logits = _gated_attention_bwd(
            grad_out, q, k, v, gate_logits, keep, key_padding_mask, kv_length, out, lse, ctx.gate_scale,
            ctx.causal, ctx.sm_scale,
        )  # fmt: skip
        grad_logits = grad_logits if gate_logits is not None else None
        return grad_q, grad_k, grad_v, grad_logits, None, None, None, None, None, None


def _check_attention_inputs(q, k, v, gate_logits, keep, key_padding_mask, kv_length) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(
            f"expected q (B, H, L, D) and k, v (B, KV, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    if k.shape[0] != batch or k.shape[3] != dim or heads % kv_heads or not (length and keys):
        raise ValueError(
            f"q {tuple(q.shape)} and k/v {tuple(k.shape)} disagree: same batch and head_dim, heads a "
            "multiple of the key/value heads, and non-empty sequences are needed"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    check_supported(dim, q.dtype)
    if gate_logits is not None and (
        gate_logits.shape[:3] != (batch, length, heads) or gate_logits.shape[3] not in (1, dim)
    ):
        raise ValueError(
            f"gate_logits must have shape (B, L, H, 1) or (B, L, H, D) = ({batch}, {length}, {heads}, 1 or "
            f"{dim}); got {tuple(gate_logits.shape)}"
        )
    if keep is not None and keep.shape != (batch, length, heads):
        raise ValueError(
            f"keep must have shape (B, L, H) = {(batch, length, heads)}; got {tuple(keep.shape)}"
        )
    if key_padding_mask is not None and (
        key_padding_mask.shape != (batch, keys) or key_padding_mask.dtype != torch.bool
    ):
        raise ValueError(
            f"key_padding_mask must be a bool tensor of shape (B, S) = {(batch, keys)}; got "
            f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )
    if kv_length is not None and (
        kv_length.dtype not in (torch.int32, torch.int64)
        or kv_length.shape not in ((batch,), (1,))
        or kv_length.device != q.device
    ):
        raise ValueError(
            f"kv_length must be an int32 or int64 tensor of shape (B,) = ({batch},) or (1,) on q's device "
            f"({q.device}); got {kv_length.dtype} {tuple(kv_length.shape)} on {kv_length.device}"
        )


def gated_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None = None,
    gate_scale: float = 1.0,
    keep: torch.Tensor | None = None,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    kv_length: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused gated flash attention: `softmax(q k^T * sm_scale) v * gate_scale * sigmoid(gate_logits) * keep`.

    Never materialises the L x S weights; the gate (sigmoid in float32) is applied in the kernel's epilogue.
    Differentiable in q, k, v and gate_logits.

    Args:
        q (`torch.Tensor` of shape `(B, H, L, D)`): queries; float16, bfloat16 or float32.
        k, v (`torch.Tensor` of shape `(B, KV, S, D)`): keys and values, `H` a multiple of `KV` (GQA).
        gate_logits (`torch.Tensor` of shape `(B, L, H, w)`, *optional*): `w` = 1 (headwise) or D
            (elementwise); `None` for no sigmoid gate.
        gate_scale (`float`, *optional*, defaults to 1.0): `s` in `g = s * sigmoid(z)` (2 for identity init).
        keep (`torch.Tensor` of shape `(B, L, H)`, *optional*): 0/1 top-k mask; (query block, head) tiles of
            zeros are skipped.
        causal (`bool`, *optional*, defaults to `False`): query `i` sees key `j <= i + kv_length - L`.
        key_padding_mask (`torch.Tensor` of shape `(B, S)`, *optional*): bool, True for keys to attend.
        sm_scale (`float`, *optional*): score scale; defaults to `1 / sqrt(D)`.
        kv_length (`torch.Tensor` of shape `(B,)` or `(1,)`, *optional*): int32/int64 on q's device: only keys
            `j < kv_length` exist (a static cache's filled length; read on the device, never loaded past it,
            their gradients 0); defaults to S.

    Returns:
        `torch.Tensor` of shape `(B, L, H, D)` in the dtype of `q`; rows without a visible key are 0.
    """
    _check_attention_inputs(q, k, v, gate_logits, keep, key_padding_mask, kv_length)
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    return GatedFlashAttention.apply(
        q, k, v, gate_logits, keep, key_padding_mask, kv_length, float(gate_scale), bool(causal),
        float(sm_scale),
    )  # fmt: skip


# --- Split-KV decode attention (forward only) ---


@torch.library.custom_op("hf_gate_attention::gated_decode_attention", mutates_args=())
def _gated_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None,
    keep: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    kv_length: torch.Tensor | None,
    gate_scale: float,
    causal: bool,
    sm_scale: float,
    num_chunks: int | None,
    top_k_sink: int,
    top_k_window: int,
    kept_groups: int | None,
) -> torch.Tensor:
    _require_triton(q.device)
    from .decode_attention import decode_attention_forward

    return decode_attention_forward(
        q, k, v, gate_logits, keep, key_padding_mask, kv_length, gate_scale, causal, sm_scale, num_chunks,
        top_k_sink, top_k_window, kept_groups,
    )  # fmt: skip


@_gated_decode_attention.register_fake
def _(q, k, v, gate_logits, keep, key_padding_mask, kv_length, gate_scale, causal, sm_scale, *options):
    batch, heads, length, dim = q.shape
    return q.new_empty(batch, length, heads, dim)


def gated_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate_logits: torch.Tensor | None = None,
    gate_scale: float = 1.0,
    keep: torch.Tensor | None = None,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    kv_length: torch.Tensor | None = None,
    num_chunks: int | None = None,
    top_k_sink: int = 0,
    top_k_window: int = 0,
    kept_groups: int | None = None,
) -> torch.Tensor:
    """Split-KV ("flash-decoding") gated attention of a short query (`L <= 16`: decode, speculative or short
    chunks), the same result as `gated_flash_attention` (`decode_attention.py`).

    The keys are split into chunks, attended in parallel and merged by their log-sum-exp; the gate is applied
    in the merge. A key/value group that `keep` drops for all its heads and queries is never read, and
    neither are keys past `kv_length`; both are checked on the device (no host synchronisation: a decode
    step is capturable in a CUDA graph). Forward only: raises `ValueError` when a gradient is required (use
    `gated_flash_attention` to train).

    Args:
        q (`torch.Tensor` of shape `(B, H, L, D)`), `L <= 16`; k, v (`torch.Tensor` of shape `(B, KV, S, D)`),
        gate_logits, gate_scale, keep, causal, key_padding_mask, sm_scale, kv_length: as in
            `gated_flash_attention`.
        num_chunks (`int`, *optional*): key chunks per (sequence, group); default chosen from the shapes
            only (S, B * KV and the GPU's multiprocessor count).
        top_k_sink, top_k_window (`int`, *optional*, default to 0): with `keep`, a dropped head attends to the
            first `top_k_sink` and the last `top_k_window` keys its query sees, and keeps its gate
            (`gated_attention_reference`); only those keys of a fully dropped group are read.
        kept_groups (`int`, *optional*): with `keep`, at most how many key/value groups of a sequence keep a
            row (top-k's `k` times the query length): the kernel then launches that many group slots per
            sequence instead of KV, kept groups first, and sizes the chunks for them. Work layout only: a
            sequence that keeps more groups gets them served one after another, with the same result.

    Returns:
        `torch.Tensor` of shape `(B, L, H, D)` in the dtype of `q`; rows without a visible key are 0.
    """
    _check_attention_inputs(q, k, v, gate_logits, keep, key_padding_mask, kv_length)
    if q.shape[2] > MAX_DECODE_QUERIES:
        raise ValueError(
            f"gated_decode_attention serves queries of at most {MAX_DECODE_QUERIES} positions, got "
            f"{q.shape[2]}; use gated_flash_attention"
        )
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, gate_logits)):
        raise ValueError(
            "gated_decode_attention is forward only (inference) but a gradient is required; use "
            "gated_flash_attention, or run under torch.no_grad()"
        )
    for name, value in (("num_chunks", num_chunks), ("kept_groups", kept_groups)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if kept_groups is not None and keep is None:
        raise ValueError("kept_groups bounds the key/value groups that `keep` keeps; it needs keep")
    for name, value in (("top_k_sink", top_k_sink), ("top_k_window", top_k_window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    args = (q, k, v, gate_logits, keep, key_padding_mask, kv_length, float(gate_scale), bool(causal))
    options = (float(sm_scale), num_chunks, top_k_sink, top_k_window, kept_groups)
    if torch.compiler.is_compiling():  # the custom op traces; in eager the launcher skips its dispatch
        return _gated_decode_attention(*args, *options)
    _require_triton(q.device)
    from .decode_attention import decode_attention_forward

    return decode_attention_forward(*args, *options)


# --- Fused sigmoid-gate-multiply ---


@torch.library.custom_op("hf_gate_attention::sigmoid_gate_multiply_fwd", mutates_args=())
def _sigmoid_gate_multiply_fwd(
    values: torch.Tensor, gate_logits: torch.Tensor, keep: torch.Tensor | None, gate_scale: float
) -> torch.Tensor:
    _require_triton(values.device)
    from .gate_multiply import gate_multiply_forward

    return gate_multiply_forward(values, gate_logits, keep, gate_scale)


@_sigmoid_gate_multiply_fwd.register_fake
def _(values, gate_logits, keep, gate_scale):
    return values.new_empty(values.shape)


@torch.library.custom_op("hf_gate_attention::sigmoid_gate_multiply_bwd", mutates_args=())
def _sigmoid_gate_multiply_bwd(
    grad_out: torch.Tensor,
    values: torch.Tensor,
    gate_logits: torch.Tensor,
    keep: torch.Tensor | None,
    gate_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    _require_triton(values.device)
    from .gate_multiply import gate_multiply_backward

    return gate_multiply_backward(grad_out, values, gate_logits, keep, gate_scale)


@_sigmoid_gate_multiply_bwd.register_fake
def _(grad_out, values, gate_logits, keep, gate_scale):
    return values.new_empty(values.shape), gate_logits.new_empty(gate_logits.shape)


def _gate_multiply_ops():
    """`(forward, backward)` of the fused gate multiply: the custom ops when `torch.compile` traces, the
    launchers themselves in eager mode (the same kernels, without the custom op's dispatch cost, which
    matters at decode: one call per layer and token)."""
    if torch.compiler.is_compiling():
        return _sigmoid_gate_multiply_fwd, _sigmoid_gate_multiply_bwd
    from .gate_multiply import gate_multiply_backward, gate_multiply_forward

    return gate_multiply_forward, gate_multiply_backward


class SigmoidGateMultiply(torch.autograd.Function):
    """Autograd of the fused gate multiply: saves the values and the logits (the sigmoid is recomputed)."""

    @staticmethod
    def forward(ctx, values, gate_logits, keep, gate_scale):
        ctx.save_for_backward(values, gate_logits, keep)
        ctx.gate_scale = gate_scale
        return _gate_multiply_ops()[0](values, gate_logits, keep, gate_scale)

    @staticmethod
    def backward(ctx, grad_out):
        values, gate_logits, keep = ctx.saved_tensors
        grad_values, grad_logits = _gate_multiply_ops()[1](
            grad_out, values, gate_logits, keep, ctx.gate_scale
        )
        return grad_values, grad_logits, None, None


# At most this many tokens outside CUDA-graph capture is host-bound work (eager decode), where a Triton launch
# costs more host time than the few torch ops it replaces (H200: +10 ms per 16-layer decode step).
HOST_BOUND_TOKENS = 16


def capturing(tensor: torch.Tensor) -> bool:
    """Whether work on `tensor`'s device is being captured into a CUDA graph now."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def host_bound(tokens: int, tensor: torch.Tensor) -> bool:
    """Whether a call on `tokens` tokens of `tensor`'s device is limited by host work: few tokens, and not
    being captured into a CUDA graph (where only device time counts)."""
    return tokens <= HOST_BOUND_TOKENS and not capturing(tensor)


def fused_pays(tokens: int, tensor: torch.Tensor, needs_grad: bool) -> bool:
    """Whether backend `fused_gate`'s fast pieces (merged query/gate GEMM, fused gate pass) run for this call:
    not traced by `torch.compile`, no gradient needed, not host-bound: where they measured faster on an H200
    (benchmarks/results/gpu/). Elsewhere the torch path's computation runs."""
    return not (torch.compiler.is_compiling() or needs_grad or host_bound(tokens, tensor))


# Whether training steps run the fused gate pass (forward and backward kernels) instead of torch ops. Not
# since bec5af8: on an H200 the torch ops' steps took x1.075 / x1.087 the ungated time (headwise /
# elementwise, 4k tokens) against x1.095 / x1.110 with the fused pass, wall times whose rounds ranged over
# 5 % either way, while at kernel level the fused backward reached x0.99 SDPA's throughput against
# x0.78-0.94 for the torch gate. benchmarks/gpu.py's train and train_profile phases time both side by side
# (the `..., fused pass in training` cases).
FUSED_PASS_IN_TRAINING = False


class RecomputedSigmoidGate(torch.autograd.Function):
    """`values (*, G, D) * sigmoid_gate(logits (*, G, w), scale, keep).to(values.dtype)` in torch ops, whose
    gradients are those autograd gives that formula, bit for bit, but which keeps for backward only the values
    and the logits: the float32 sigmoid and the cast gate are recomputed (elementwise gates in bfloat16: 4
    bytes an element kept instead of 8; float32: 8 instead of 12). `keep (*, G)` gets no gradient."""

    @staticmethod
    def forward(ctx, values, logits, scale, keep):
        ctx.save_for_backward(values, logits, keep)
        ctx.scale = scale
        return values * sigmoid_gate(logits, scale, keep).to(values.dtype)

    @staticmethod
    def backward(ctx, grad):
        values, logits, keep = ctx.saved_tensors
        # the forward's ops again, then the backward of each in reverse, as autograd runs them
        sigmoid = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))  # (*, G, w)
        gate = ctx.scale * sigmoid
        if keep is not None:
            gate = gate * keep.unsqueeze(-1)
        grad_values = grad * gate.to(values.dtype) if ctx.needs_input_grad[0] else None
        grad_logits = None
        if ctx.needs_input_grad[1]:
            grad_gate = (grad * values).sum_to_size(gate.shape).to(gate.dtype)  # (*, G, w)
            if keep is not None:
                grad_gate = grad_gate * keep.unsqueeze(-1)
            grad_logits = torch.ops.aten.sigmoid_backward(grad_gate * ctx.scale, sigmoid).to(logits.dtype)
        return grad_values, grad_logits, None, None


def gate_multiply_unchecked(
    values: torch.Tensor, gate_logits: torch.Tensor, gate_scale: float, keep: torch.Tensor | None
) -> torch.Tensor:
    """`sigmoid_gate_multiply` without its input checks, for callers whose shapes are right by construction
    (the hooks). The fused kernel runs where it measured faster on an H200 (benchmarks/results/gpu/): in
    inference on more than `HOST_BOUND_TOKENS` tokens or inside CUDA-graph capture. Elsewhere the same formula
    in plain torch ops:

    - under `torch.compile` (float32 multiply, one cast): inductor fuses them into one kernel forward and one
      backward, and into neighbouring copies, which an opaque custom op would prevent;
    - training (gradients needed): the torch path's ops (`gate.apply_gate`'s formula) measured faster per
      step, x1.075 / x1.087 the ungated time against x1.095 / x1.110 with the kernel's forward and backward
      (headwise / elementwise, 4k tokens; the kernel used less memory: x1.017 / x1.042 against x1.018 /
      x1.075); they run in `RecomputedSigmoidGate`, which keeps the logits for backward instead of the
      float32 sigmoid and the cast gate (`FUSED_PASS_IN_TRAINING`: the kernels instead, for gpu.py to
      compare);
    - host-bound calls (`host_bound`: eager decode) without gradients: the sigmoid in the values' dtype when
      that gives the same bits (`rounds_like_float32`), two or three torch ops, fewer host steps than a
      Triton launch or the float32 formula's casts.
    """
    if torch.compiler.is_compiling():
        return (values.float() * sigmoid_gate(gate_logits, gate_scale, keep)).to(values.dtype)
    needs_grad = torch.is_grad_enabled() and (values.requires_grad or gate_logits.requires_grad)
    if needs_grad and FUSED_PASS_IN_TRAINING:
        return SigmoidGateMultiply.apply(values, gate_logits, keep, float(gate_scale))
    if not fused_pays(values.shape[:-2].numel(), values, needs_grad):
        if needs_grad:
            return RecomputedSigmoidGate.apply(values, gate_logits, gate_scale, keep)
        if not rounds_like_float32(values.dtype, gate_logits.dtype, gate_scale, keep):
            return values * sigmoid_gate(gate_logits, gate_scale, keep).to(values.dtype)
        gate = torch.sigmoid(gate_logits)  # (..., G, w) in the dtype of values: see rounds_like_float32
        return values * (gate if gate_scale == 1.0 else gate * gate_scale)
    if values.device.type != "cuda":
        _require_triton(values.device)
    from .gate_multiply import gate_multiply_forward

    return gate_multiply_forward(values, gate_logits, keep, gate_scale)


def sigmoid_gate_multiply(
    values: torch.Tensor,
    gate_logits: torch.Tensor,
    gate_scale: float = 1.0,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused `values * gate_scale * sigmoid(gate_logits) * keep` (sigmoid in float32), forward and backward in
    one pass each. Differentiable in values and gate_logits.

    Args:
        values (`torch.Tensor` of shape `(*, G, D)`): per-head values (attention output or value projection),
            float16, bfloat16 or float32, unit stride on D for a copy-free launch.
        gate_logits (`torch.Tensor` of shape `(*, G, w)`): `w` = 1 (headwise) or D (elementwise).
        gate_scale (`float`, *optional*, defaults to 1.0): `s` in `g = s * sigmoid(z)`.
        keep (`torch.Tensor` of shape `(*, G)`, *optional*): 0/1 top-k mask.

    Returns:
        `torch.Tensor` shaped like `values`, in their dtype.
    """
    if (
        values.dim() < 2
        or gate_logits.shape[:-1] != values.shape[:-1]
        or gate_logits.shape[-1]
        not in (
            1,
            values.shape[-1],
        )
    ):
        raise ValueError(
            f"gate_logits must have shape (*, G, 1) or (*, G, D) for values (*, G, D) = "
            f"{tuple(values.shape)}; got {tuple(gate_logits.shape)}"
        )
    if keep is not None and keep.shape != values.shape[:-1]:
        raise ValueError(f"keep must have shape (*, G) = {tuple(values.shape[:-1])}; got {tuple(keep.shape)}")
    _check_dtype(values.dtype)
    _require_triton(values.device)
    return SigmoidGateMultiply.apply(values, gate_logits, keep, float(gate_scale))
