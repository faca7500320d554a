"""`patch` / `unpatch`: add gates to the self-attention blocks of one model instance, reversibly.

Each patched block gets a submodule `attn_gate` (state_dict keys `...<block>.attn_gate.weight/bias`) and
forward hooks on its own projection modules: the query projection's hook keeps `X` (its input) or `q`, the key
projection's keeps `k`, the value projection's gates `V` (variant `value`), and a pre-hook on the output
projection multiplies its input, the attention output, by the gate. No class is modified; the hooks follow the
modules currently at the family's paths, so wrapping projections later (PEFT LoRA) keeps the gate in front of
the whole wrapped layer.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from . import fused
from .config import GateConfig
from .families import AttentionFamily, family_for
from .gate import AttentionGate, apply_gate

GATE_MODULE_NAME = "attn_gate"
CONFIG_ATTRIBUTE = "gate_attention"
_PATCHES_ATTRIBUTE = "_gate_attention_patches"
_PREVIOUS_ATTN_ATTRIBUTE = "_gate_attention_previous_attn_implementation"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def _linear_features(module: nn.Module) -> tuple[int, int]:
    """`(in_features, out_features)` of a Linear, also when wrapped by PEFT."""
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    if not isinstance(base, nn.Linear):
        raise TypeError(f"expected a Linear projection, found {type(base).__name__}")
    return base.in_features, base.out_features


class _BlockPatch:
    """The hooks of one patched attention block and the tensors they pass from projection to projection."""

    def __init__(
        self, block: nn.Module, family: AttentionFamily, config: GateConfig, geometry: dict, backend: str
    ):
        self.block = block
        self.family = family
        self.variant = config.variant
        self.scale = config.gate_scale
        self.backend = backend
        self.q_size = geometry["num_heads"] * geometry["head_dim"]
        self.kv_size = geometry["num_kv_heads"] * geometry["head_dim"]
        self.stash: dict[str, torch.Tensor] = {}
        self.hooked: dict[str, tuple[nn.Module, list]] = {}
        self.block_handle = block.register_forward_pre_hook(self._sync_hooks)
        self._sync_hooks(block, ())
        if backend == "triton" and self.variant != "value":
            for module in block.modules():
                fused.BLOCK_PATCHES[module] = self

    def _roles(self) -> dict[str, set[str]]:
        """Projection path -> the roles it plays (a fused qkv projection plays three)."""
        roles: dict[str, set[str]] = {}
        for role in ("query", "key", "value"):
            roles.setdefault(getattr(self.family, role), set()).add(role)
        if self.variant != "value":
            roles.setdefault(self.family.output, set()).add("output")
        return roles

    def _sync_hooks(self, block, args):
        """(Re)attach hooks to the modules now at the family's paths (they change when PEFT wraps them)."""
        for path, roles in self._roles().items():
            module = block.get_submodule(path)
            if path in self.hooked and self.hooked[path][0] is module:
                continue
            self._remove(path)
            handles = []
            if roles & {"query", "key", "value"}:
                handles.append(module.register_forward_hook(self._projection_hook(frozenset(roles))))
            if "output" in roles:
                handles.append(module.register_forward_pre_hook(self._before_output))
            self.hooked[path] = (module, handles)

    def _remove(self, path: str) -> None:
        for handle in self.hooked.pop(path, (None, []))[1]:
            handle.remove()

    def remove(self) -> None:
        for path in list(self.hooked):
            self._remove(path)
        self.block_handle.remove()
        self.stash.clear()
        for module in self.block.modules():
            fused.BLOCK_PATCHES.pop(module, None)

    def _gate(self) -> nn.Module:
        return getattr(self.block, GATE_MODULE_NAME)

    def _projection_hook(self, roles: frozenset[str]):
        def hook(module, args, output):
            parts = {"query": output, "key": output, "value": output}
            if self.family.fused_qkv:  # output: (..., q_size + 2 * kv_size) laid out [q | k | v]
                split = output.split([self.q_size, self.kv_size, self.kv_size], -1)
                parts = dict(zip(("query", "key", "value"), split, strict=True))
            if self.variant == "output" and "query" in roles:
                self.stash["x"] = args[0]
            if self.variant == "qk":
                for role, name in (("query", "q"), ("key", "k")):
                    if role in roles:
                        self.stash[name] = parts[role]
            if self.variant == "value" and "value" in roles:
                gated = self._apply(parts["value"], {"x": args[0]})
                if not self.family.fused_qkv:
                    return gated
                return torch.cat([parts["query"], parts["key"], gated], dim=-1)
            return None

        return hook

    def _take_inputs(self) -> dict[str, torch.Tensor]:
        """The stashed gate inputs of this forward: `x` (output gate) or `q` and `k` (qk gate)."""
        names = ("x",) if self.variant == "output" else ("q", "k")
        try:
            return {name: self.stash.pop(name) for name in names}
        except KeyError as missing:
            raise RuntimeError(
                f"gated attention: the output projection ran before the {missing} projection of this block; "
                "the block's forward does not follow the registered AttentionFamily layout"
            ) from None

    def _apply(self, values: torch.Tensor, inputs: dict) -> torch.Tensor:
        """Gate `values: (..., G*D)` with the gate computed from `inputs`, on this patch's backend."""
        if self.backend == "triton":
            logits, keep = self._gate()(**inputs, logits_only=True)
            return fused.fused_gate_multiply(values, logits, self.scale, keep)
        return apply_gate(values, self._gate()(**inputs))

    def take_gate_logits(self):
        """For the fused attention function: `(logits (B, L, H, w), keep (B, L, H) or None, scale)`."""
        logits, keep = self._gate()(**self._take_inputs(), logits_only=True)
        self.stash["fused"] = True
        return logits, keep, self.scale

    def _before_output(self, module, args):
        if self.stash.pop("fused", False):  # the attention function already applied the gate
            return None
        return (self._apply(args[0], self._take_inputs()), *args[1:])


def _geometry(model_config, family: AttentionFamily, block: nn.Module) -> dict:
    num_heads = getattr(model_config, family.num_heads_attr)
    num_kv_heads = getattr(model_config, family.num_kv_heads_attr, None) or num_heads
    hidden_size, _ = _linear_features(block.get_submodule(family.query))
    attn_width, _ = _linear_features(block.get_submodule(family.output))
    if attn_width % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"inconsistent attention geometry: output projection width {attn_width}, {num_heads} heads, "
            f"{num_kv_heads} key/value heads"
        )
    return {
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": attn_width // num_heads,
    }


def find_attention_blocks(model: nn.Module, family: AttentionFamily) -> dict[int, nn.Module]:
    """Layer index -> self-attention block, for every block the family's pattern matches."""
    blocks = {}
    for name, module in unwrap_model(model).named_modules():
        index = family.match_block(name)
        if index is not None:
            blocks[index] = module
    return blocks


def patch(
    model: nn.Module, config: GateConfig | None = None, *, train_gates_only: bool = False, **overrides
) -> nn.Module:
    """Add a gate to the self-attention blocks of `model`, in place; returns `model`.

    Args:
        model: a transformers model (bare, with a task head, or wrapped by PEFT) whose `config.model_type` is
            registered (see `supported_model_types`).
        config: the gate to add; defaults to `GateConfig()`. `overrides` (e.g. `variant="qk"`) replace fields.
        train_gates_only: freeze every parameter except the new gates.
    """
    config = (config or GateConfig()).replace(**overrides) if overrides else (config or GateConfig())
    base = unwrap_model(model)
    if is_patched(base):
        raise ValueError("this model is already patched with gated attention; call unpatch(model) first")
    model_config = base.config
    family = family_for(model_config.model_type)
    blocks = find_attention_blocks(base, family)
    if not blocks:
        raise ValueError(
            f"no self-attention block matching {family.block!r} found in {type(base).__name__}; "
            "its layout differs from the registered AttentionFamily"
        )
    layers = sorted(blocks) if config.layers is None else list(config.layers)
    missing = sorted(set(layers) - set(blocks))
    if missing:
        raise ValueError(f"GateConfig.layers {missing} not found; this model has layers 0..{max(blocks)}")

    geometries = {index: _geometry(model_config, family, blocks[index]) for index in layers}
    query_weight = blocks[layers[0]].get_submodule(family.query).weight
    backend = fused.resolve_backend(config, model_config, geometries[layers[0]]["head_dim"], query_weight)

    patches = []
    for index in layers:
        block = blocks[index]
        gate = AttentionGate(
            config,
            **geometries[index],
            init_std=getattr(model_config, "initializer_range", 0.02),
            dtype=query_weight.dtype,
            device=query_weight.device,
        )
        block.add_module(GATE_MODULE_NAME, gate)
        patches.append(_BlockPatch(block, family, config, geometries[index], backend))
    setattr(base, _PATCHES_ATTRIBUTE, patches)
    setattr(model_config, CONFIG_ATTRIBUTE, config.to_dict())
    if backend == "triton" and config.variant != "value":
        fused.register_attention_implementation()
        setattr(base, _PREVIOUS_ATTN_ATTRIBUTE, model_config._attn_implementation)
        base.set_attn_implementation(fused.ATTN_IMPLEMENTATION)
    if train_gates_only:
        for param in model.parameters():
            param.requires_grad_(False)
        for param in gate_parameters(model):
            param.requires_grad_(True)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Remove every gate and hook added by `patch`: module structure, state_dict and outputs are restored."""
    base = unwrap_model(model)
    if not is_patched(base):
        raise ValueError("this model is not patched with gated attention")
    for block_patch in getattr(base, _PATCHES_ATTRIBUTE):
        block_patch.remove()
        delattr(block_patch.block, GATE_MODULE_NAME)
    delattr(base, _PATCHES_ATTRIBUTE)
    if hasattr(base, _PREVIOUS_ATTN_ATTRIBUTE):
        base.set_attn_implementation(getattr(base, _PREVIOUS_ATTN_ATTRIBUTE))
        delattr(base, _PREVIOUS_ATTN_ATTRIBUTE)
    if hasattr(base.config, CONFIG_ATTRIBUTE):
        delattr(base.config, CONFIG_ATTRIBUTE)
    return model


def is_patched(model: nn.Module) -> bool:
    return hasattr(unwrap_model(model), _PATCHES_ATTRIBUTE)


def gate_config_of(model: nn.Module) -> GateConfig:
    """The `GateConfig` a patched model was patched with."""
    if not is_patched(model):
        raise ValueError("this model is not patched with gated attention")
    return GateConfig.from_dict(getattr(unwrap_model(model).config, CONFIG_ATTRIBUTE))


def gate_parameters(model: nn.Module) -> Iterator[nn.Parameter]:
    """The parameters added by `patch` (also the trainable copies PEFT makes with `modules_to_save`)."""
    seen = set()
    for module in model.modules():
        if isinstance(module, AttentionGate):
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param
