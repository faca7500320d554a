"""Backends: what runs the gates of a patched instance, as one small contract that implementations register
into. `patch(model, backend=NAME)` validates the name, asks the backend whether it can serve this model and
installs what it declares; a new backend is one module that builds a `GateBackend` and calls
`register_backend` (the Triton ones: `hf_gate_attention/kernels/backends.py`, registered on package import).

Registered here: `"torch"`, the readable reference (plain torch ops in hooks; with `top_k`, the sparse
attention of `sparse.py`). `"auto"` is not a backend but the choice below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import sparse as sparse_module
from . import streaming
from .config import GateConfig
from .variants import names_where

AUTO = "auto"


@dataclass(frozen=True)
class GateBackend:
    """One way of running the gates.

    Args:
        name (`str`): what `patch(..., backend=name)` accepts.
        summary (`str`): one line for error messages and `--help`.
        unavailable_reason (`Callable`): `(config, model_config, head_dim, weight) -> str | None`, why this
            backend cannot serve the model (`weight`: the query projection's weight, for dtype and device), or
            `None` when it can.
        gate_multiply (`Callable`, *optional*): `(values (..., G*D), logits (..., G, w), scale, keep) -> gated
            values` applied in the hooks; `None`: the torch reference (`gate.apply_gate`).
        attention (`Callable`, *optional*): `(config, model_config, sparse, weight) -> module | None`, an
            attention implementation that applies the gate itself (a module with `ATTN_IMPLEMENTATION`,
            `register_attention_implementation()` and, optionally, `prepare_block(block_patch)` and
            `release_block(block)`), or `None` to keep the model's own attention implementation; raises
            `ValueError` for a `sparse` it cannot honour.
        prepare_block (`Callable`, *optional*): `(block_patch, family) -> None`, run for each gated block
            after the gates exist (e.g. merging the query and gate projections); undone by `release_block`.
        release_block (`Callable`, *optional*): `(block) -> None`, run by `unpatch` before the gate goes.
    """

    name: str
    summary: str
    unavailable_reason: Callable[..., str | None]
    gate_multiply: Callable | None = None
    attention: Callable[..., Any] | None = None
    prepare_block: Callable | None = None
    release_block: Callable | None = None


_BACKENDS: dict[str, GateBackend] = {}


def register_backend(backend: GateBackend, *, overwrite: bool = False) -> None:
    """Make `backend` available to `patch`; refuses to replace a registered name unless `overwrite`."""
    if not isinstance(backend, GateBackend):
        raise TypeError(f"backend must be a GateBackend, got {type(backend).__name__}")
    if backend.name == AUTO or (backend.name in _BACKENDS and not overwrite):
        raise ValueError(f"backend name {backend.name!r} is taken; pass overwrite=True to replace it")
    _BACKENDS[backend.name] = backend


def backend_names() -> tuple[str, ...]:
    """The names `patch(..., backend=...)` accepts: `"auto"` and every registered backend."""
    return (AUTO, *_BACKENDS)


def backend_named(name: str) -> GateBackend:
    """The registered backend called `name` (`ValueError` listing the accepted names otherwise)."""
    if name not in _BACKENDS:
        check_backend_name(name)
        raise ValueError(f"backend={name!r} is not a backend but a choice among them; pass a backend's name")
    return _BACKENDS[name]


def check_backend_name(name: str) -> None:
    if name not in backend_names():
        raise ValueError(f"backend={name!r} is not valid; accepted values: {', '.join(backend_names())}")


# What "auto" tries on a CUDA device, first that can serve the model wins (measured on an H200,
# benchmarks/results/gpu/): dense gates run fastest on the vendor attention with the gate in one fused pass;
# with top_k the Triton decode kernel skips dropped groups, while the torch sparse path loops in Python.
AUTO_ON_CUDA = {"dense": ("fused_gate",), "top_k": ("triton",)}


def resolve_backend(
    name: str, config: GateConfig, model_config, head_dim: int, weight: torch.Tensor
) -> GateBackend:
    """The backend that runs `config` on this model: `name` itself (`ValueError` naming why if it cannot
    serve it) or, for `"auto"`, the first of `AUTO_ON_CUDA` that can on a CUDA device, else `"torch"`."""
    check_backend_name(name)
    if name != AUTO:
        backend = _BACKENDS[name]
        reason = backend.unavailable_reason(config, model_config, head_dim, weight)
        if reason is not None:
            raise ValueError(f"backend={name!r} cannot run here: {reason}. Fallback: backend='torch'")
        return backend
    if weight.is_cuda:
        for candidate in AUTO_ON_CUDA["dense" if config.top_k is None else "top_k"]:
            backend = _BACKENDS.get(candidate)
            if (
                backend is not None
                and backend.unavailable_reason(config, model_config, head_dim, weight) is None
            ):
                return backend
    return _BACKENDS["torch"]


def _torch_attention(config: GateConfig, model_config, sparse: bool | None, weight: torch.Tensor):
    """The sparse top-k attention (`sparse.py`) when asked for or possible, else the masked reference: the
    model's own attention, or `streaming.py` when dropped units read sink and window keys. On a CUDA device
    `sparse=None` masks: the sparse path's per-sequence, per-group Python loops and host syncs cost far more
    there than they skip (prefill x27 the ungated time on an H200); `sparse=True` still runs them."""
    if sparse is False or (sparse is None and (config.top_k is None or weight.is_cuda)):
        return streaming if config.dropped_reads_keys else None
    reason = sparse_module.sparse_unavailable_reason(config.variant, config.top_k, model_config)
    if reason is not None and sparse:
        raise ValueError(f"sparse=True cannot run: {reason}. Use sparse=None or False")
    if reason is not None:
        return streaming if config.dropped_reads_keys else None
    return sparse_module


register_backend(
    GateBackend(
        name="torch",
        summary="the readable reference: plain torch ops (sparse top-k skips work on variants "
        f"{'/'.join(names_where(lambda v: v.top_k_skips))})",
        unavailable_reason=lambda config, model_config, head_dim, weight: None,
        attention=_torch_attention,
    )
)
