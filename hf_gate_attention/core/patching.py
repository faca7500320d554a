"""`patch` / `unpatch`: add gates to the self-attention blocks of one model instance, reversibly.

The hooks themselves live in `hooks.py`; this module picks the family and the backend (what runs the gate,
`backends.py`: the torch path, or the Triton backends `hf_gate_attention.kernels` registers), and restores
the model on `unpatch`. The backend is a property of this patched instance, never of the saved checkpoint.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable, Iterator
from types import MethodType

from torch import nn

from . import sparse as sparse_module
from .backends import backend_named, check_backend_name, resolve_backend
from .config import GateConfig
from .families import modules_on_attention_output, uses_attention_interface
from .gate import AttentionGate
from .hooks import (
    CONFIG_ATTRIBUTE,
    GATE_MODULE_NAME,
    PATCHES_ATTRIBUTE,
    add_gates,
    attention_layout,
    gate_dtype,
    unwrap_model,
)
from .tensor_parallel import tensor_parallel_size

_BACKEND_ATTRIBUTE = "_gate_attention_backend"
_PREVIOUS_ATTN_ATTRIBUTE = "_gate_attention_previous_attn_implementation"
# the name of the Python module of the attention implementation that applies the gates (a name, not the
# module: `copy.deepcopy(model)` cannot copy a module)
_ATTENTION_ATTRIBUTE = "_gate_attention_attention"


# instance methods bound on a patched model (removed by unpatch): name -> function(model, *args, **kwargs).
# The core names no room above it: the package fills this on import (`save_pretrained`, `push_to_hub`, which
# import the sharing code on first call), as the kernels register their backends into `backends.py`.
_INSTANCE_METHODS: dict[str, Callable] = {}


def register_instance_method(name: str, function: Callable) -> None:
    """Bind `function` as `model.<name>` on every instance patched from now on (`unpatch` removes it)."""
    _INSTANCE_METHODS[name] = function


def patch(
    model: nn.Module,
    config: GateConfig | None = None,
    *,
    backend: str = "auto",
    sparse: bool | None = None,
    train_gates_only: bool = False,
    **overrides,
) -> nn.Module:
    """Add a gate to the self-attention blocks of `model`, in place; returns `model`.

    Args:
        model: a transformers model (bare, with a task head, or wrapped by PEFT). Its attention blocks are
            found by their projections (`core/families.py`; `supported_model_types` lists the model types
            tested), or by a family `register_family` gave its `config.model_type`.
        config: the gate to add (a `GateConfig`, or a dict of its fields); defaults to `GateConfig()`.
            `overrides` (e.g. `variant="qk"`) replace fields.
        backend (`str`, *optional*, defaults to `"auto"`): what runs the gates (`core/backends.py`).
            `"torch"`: the readable reference path. `"fused_gate"`: the model's own attention, the gate logits
            from the query GEMM and one fused Triton gate pass. `"triton"`: our flash attention with the gate
            in its epilogue (least memory; top-k decode skips dropped key/value groups). Both Triton backends
            need CUDA (or `TRITON_INTERPRET=1`). `"auto"`: on a CUDA device `"fused_gate"` for dense gates and
            `"triton"` with `top_k`, when they can serve the model; else `"torch"`. Not saved with the model:
            choose it again when loading.
        sparse (`bool`, *optional*): how `top_k` runs. `None` (default): skip the work of the dropped heads
            and key/value groups where that measured faster (torch on CPU: `core/sparse.py`, variants
            `output`/`qk`; triton: decode, whose kernel never reads a dropped group's cache), else compute
            every head and mask the dropped ones. `True`: skip wherever the backend can (triton: also the
            flash kernel's tiles in prefill and training), or raise `ValueError` saying why it cannot.
            `False`: the masked reference (torch only).
        train_gates_only: freeze every parameter except the new gates.
    """
    check_backend_name(backend)
    if not isinstance(model, nn.Module) or not hasattr(unwrap_model(model), "config"):
        raise TypeError(
            "patch takes a transformers model (a PreTrainedModel, bare, with a task head or wrapped by "
            f"PEFT); got {type(model).__name__}"
        )
    if isinstance(config, dict):
        config = GateConfig.from_dict(config)
    if config is not None and not isinstance(config, GateConfig):
        raise TypeError(f"config must be a GateConfig or a dict of its fields, got {type(config).__name__}")
    if not isinstance(train_gates_only, bool):
        raise ValueError(f"train_gates_only={train_gates_only!r} is not valid; accepted values: True, False")
    if sparse not in (None, True, False):
        raise ValueError(f"sparse={sparse!r} is not valid; accepted values: None, True, False")
    config = (config or GateConfig()).replace(**overrides) if overrides else (config or GateConfig())
    base = unwrap_model(model)
    if is_patched(base):
        raise ValueError("this model is already patched with gated attention; call unpatch(model) first")
    layout = attention_layout(base, config)
    backend, sparse = _under_tensor_parallelism(base, config, backend, sparse)
    first = layout[0]
    query_weight = first.module.get_submodule(first.family.query).weight
    if not query_weight.dtype.is_floating_point:  # quantized: the backends see the dtype the gates compute in
        query_weight = query_weight.new_empty(0, dtype=gate_dtype(first, base))
    _keep_cpu_4bit_layers_trainable(base)
    no_attention_function = _attention_function_unavailable(base, layout)
    if no_attention_function and backend == "auto" and config.top_k is not None:
        backend = "torch"  # top_k's Triton kernels and sparse paths are attention functions
    runner = resolve_backend(backend, config, base.config, first.geometry["head_dim"], query_weight)
    attention = runner.attention(config, base.config, sparse, query_weight) if runner.attention else None
    if attention is not None and no_attention_function:
        if attention is not sparse_module or sparse or config.dropped_reads_keys:
            raise ValueError(
                f"backend={runner.name!r} with this GateConfig applies the gate inside the attention "
                f"function, which cannot serve this model: {no_attention_function}. Use backend='torch' "
                "with dense gates, or with top_k, sparse=None and no top_k_sink/top_k_window (masked)"
            )
        attention = None  # sparse=None: the masked reference (the hooks apply gate * keep)
    add_gates(base, config, layout, runner.gate_multiply, attention is not None, sparse)
    setattr(base, _BACKEND_ATTRIBUTE, runner.name)
    for name, method in _INSTANCE_METHODS.items():
        setattr(base, name, MethodType(method, base))
    for block_patch in getattr(base, PATCHES_ATTRIBUTE):
        if runner.prepare_block is not None:
            runner.prepare_block(block_patch, block_patch.family)
        if hasattr(attention, "prepare_block"):
            attention.prepare_block(block_patch)
    if attention is not None:
        attention.register_attention_implementation()
        setattr(base, _ATTENTION_ATTRIBUTE, attention.__name__)
        setattr(base, _PREVIOUS_ATTN_ATTRIBUTE, base.config._attn_implementation)
        base.set_attn_implementation(attention.ATTN_IMPLEMENTATION)
    if train_gates_only:
        freeze_all_but_gates(model)
    return model


def _keep_cpu_4bit_layers_trainable(model: nn.Module) -> None:
    """Turn off bitsandbytes' (0.50) repacking of 4-bit weights on a CPU with AVX512-BF16: the first forward
    in eval mode without gradients repacks them into a format without backward, so that training after an
    evaluation gets zero gradients (with one torch warning only). Warns what it did, and about layers that an
    evaluation before `patch` already repacked."""
    on_cpu = [
        m
        for m in model.modules()
        if hasattr(m, "support_avx512bf16_for_cpu") and m.weight.device.type == "cpu"
    ]
    repacking = [m for m in on_cpu if m.support_avx512bf16_for_cpu]
    for module in repacking:
        module.support_avx512bf16_for_cpu = False
    if repacking:
        warnings.warn(
            f"set support_avx512bf16_for_cpu = False on {len(repacking)} bitsandbytes 4-bit layers: on this "
            "CPU (AVX512-BF16) their weights are repacked on the first evaluation into a format without "
            "backward, and training after it would get zero gradients; set it back to True on a model that "
            "is only evaluated (faster CPU inference)",
            stacklevel=3,
        )
    packed = [
        m for m in on_cpu if getattr(getattr(m.weight, "quant_state", None), "packing_format_for_cpu", False)
    ]
    if packed:
        warnings.warn(
            f"{len(packed)} bitsandbytes 4-bit layers were repacked for CPU inference by an evaluation "
            "before patch: they have no backward, so training this model gets zero gradients. Load it again "
            "and set support_avx512bf16_for_cpu = False on its Linear4bit layers (or patch it) before "
            "evaluating",
            stacklevel=3,
        )


def _under_tensor_parallelism(model: nn.Module, config: GateConfig, backend: str, sparse: bool | None):
    """`(backend, sparse)` for a model under tensor parallelism: the torch path, top-k masked, which
    `tensor_parallel.py` shards with the heads; the Triton backends and the sparse top-k paths read every head
    of a block (the merged `[q | gate]` query GEMM of `fused_gate`, the kept heads chosen on the host) and
    are refused. Unchanged without TP."""
    if tensor_parallel_size(model.config) == 1:
        return backend, sparse
    if backend not in ("auto", "torch"):
        raise ValueError(
            f"backend={backend!r} under tensor parallelism: its kernels read the gate and query weights of "
            "every head of a block, which TP splits across ranks; use backend='torch' (what 'auto' picks "
            "under TP)"
        )
    if config.top_k is not None and sparse:
        raise ValueError(
            "sparse=True under tensor parallelism: skipping the dropped heads' attention is not sharded "
            "across ranks; use sparse=None or False (top-k then masks the dropped heads, selected among "
            "every rank's)"
        )
    return "torch", (False if config.top_k is not None else sparse)


def _attention_function_unavailable(model: nn.Module, layout: list) -> str | None:
    """Why an attention function that applies the gate (sparse top-k, sink/window reads, the Triton
    attention) cannot serve these blocks, or `None`: it replaces the model's attention implementation, so
    every gated block must be self-attention that calls transformers' attention interface with a mask alone
    (no relative position bias), under the model's own config (not a part with a config of its own), on
    SDPA's semantics (a model whose eager attention adds learned sinks says it does not support SDPA), and
    whose forward passes the attention output straight to the output projection (where the masked reference
    gates it)."""
    for block in layout:
        name = f"{block.name} ({type(block.module).__name__})"
        if block.kind == "cross":
            return f"{name} is cross-attention"
        if block.part_config is not model.config:
            return f"{name} belongs to a part with a config of its own (a composite model, T5's stacks)"
        if not uses_attention_interface(block.module):
            return f"{name} computes attention without transformers' attention interface"
        if any("relative" in key for key, _ in block.module.named_parameters()):
            return f"{name} adds a relative position bias to its attention scores"
        if "position_bias" in inspect.unwrap(type(block.module).forward).__code__.co_varnames:
            return f"{name} passes a position bias to its attention function"
        if between := modules_on_attention_output(block.module, block.family):
            return (
                f"{name} passes its attention output through {', '.join(between)} before its output "
                "projection, where the gate is defined"
            )
    if not getattr(model, "_supports_sdpa", True):
        return (
            f"{type(model).__name__} does not support SDPA attention (its own attention computes more, such "
            "as learned attention sinks), which this attention function runs"
        )
    return None


def unpatch(model: nn.Module) -> nn.Module:
    """Remove every gate and hook added by `patch`: module structure, state_dict and outputs are restored."""
    base = unwrap_model(model)
    if not is_patched(base):
        raise ValueError("this model is not patched with gated attention")
    runner = backend_named(getattr(base, _BACKEND_ATTRIBUTE))
    attention_name = base.__dict__.pop(_ATTENTION_ATTRIBUTE, None)
    attention = None if attention_name is None else importlib.import_module(attention_name)
    releases = [f for f in (runner.release_block, getattr(attention, "release_block", None)) if f is not None]
    for block_patch in getattr(base, PATCHES_ATTRIBUTE):
        block_patch.remove()
        for release in releases:
            release(block_patch.block)
        delattr(block_patch.block, GATE_MODULE_NAME)
    delattr(base, PATCHES_ATTRIBUTE)
    delattr(base, _BACKEND_ATTRIBUTE)
    for name in _INSTANCE_METHODS:
        base.__dict__.pop(name, None)
    if hasattr(base, _PREVIOUS_ATTN_ATTRIBUTE):
        base.set_attn_implementation(getattr(base, _PREVIOUS_ATTN_ATTRIBUTE))
        delattr(base, _PREVIOUS_ATTN_ATTRIBUTE)
    if hasattr(base.config, CONFIG_ATTRIBUTE):
        delattr(base.config, CONFIG_ATTRIBUTE)
    marker = f".{GATE_MODULE_NAME}"
    base._tp_plan = {key: style for key, style in (base._tp_plan or {}).items() if marker not in key}
    return model


def is_patched(model: nn.Module) -> bool:
    return hasattr(unwrap_model(model), PATCHES_ATTRIBUTE)


def _require_patched(model: nn.Module) -> nn.Module:
    if not is_patched(model):
        raise ValueError("this model is not patched with gated attention")
    return unwrap_model(model)


def gate_config_of(model: nn.Module) -> GateConfig:
    """The `GateConfig` a patched model was patched with."""
    return GateConfig.from_dict(getattr(_require_patched(model).config, CONFIG_ATTRIBUTE))


def gate_backend_of(model: nn.Module) -> str:
    """What runs the gates of a patched model: the name of its backend (`"auto"` resolved)."""
    return getattr(_require_patched(model), _BACKEND_ATTRIBUTE)


def gate_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The parameters added by `patch` (also the trainable copies PEFT makes with `modules_to_save`, and the
    gates of a model loaded with `trust_remote_code=True`, whose class is the checkpoint's copy of ours)."""
    seen = set()
    for module in model.modules():
        if isinstance(module, AttentionGate) or type(module).__name__ == AttentionGate.__name__:
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param


def freeze_all_but_gates(model: nn.Module) -> nn.Module:
    """Make the gates the only trainable parameters of `model`."""
    model.requires_grad_(False)
    for param in gate_parameters(model):
        param.requires_grad_(True)
    return model
