"""The model geometry of the layout tests and the attention math their references are written with (RMS norm,
rotary embeddings, causal softmax attention), from the published formulas, independent of transformers."""

from __future__ import annotations

import math

import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 32, 4, 2, 8, 2, 99
GROUP = HEADS // KV_HEADS


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on `x: (B, T, heads, D)` with `cos, sin: (B, T, D)` (rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention, `q: (B, T, H, D)`, `k, v: (B, T, KV, D)` -> `(B, T, H, D)`; GQA by repetition."""
    k, v = (t.repeat_interleave(q.shape[2] // t.shape[2], dim=2) for t in (k, v))  # (B, T, H, D)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    causal = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v)


def rope(length: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`cos, sin: (1, T, D)` of positions 0..T-1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None]  # (T, D/2)
    angles = torch.cat([freqs, freqs], dim=-1)[None]  # (1, T, D)
    return angles.cos(), angles.sin()
