"""The gate runtime: instance hooks that add a gate to each self-attention block of a model.

Each patched block gets a submodule `attn_gate` (state_dict keys `...<block>.attn_gate.weight/bias`) and
forward hooks on its own projection modules: those the variant's gate reads from keep their input `X` or
their output (`q`, `k`; `GateVariant.inputs`), the projection whose output the variant gates multiplies it by
the gate (`V`, variant `value`), or a pre-hook on the output projection multiplies its input, the attention
output (variants `output`, `qk`). No class is modified; the hooks follow the modules currently at the
family's paths, so wrapping projections later (PEFT LoRA) keeps the gate in front of the whole wrapped layer.

This module needs only torch: with `config.py`, `variants.py`, `families.py` and `gate.py` it is also copied
into saved checkpoints as the code that `trust_remote_code=True` runs (see `sharing/saving.py`).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .config import GateConfig
from .families import AttentionFamily
from .gate import AttentionGate, apply_gate

GATE_MODULE_NAME = "attn_gate"
CONFIG_ATTRIBUTE = "gate_attention"
PATCHES_ATTRIBUTE = "_gate_attention_patches"
QKV_ROLES = ("query", "key", "value")  # also the layout of a fused qkv projection's output

# set on every module inside a block whose gate is applied by the attention function (the fused Triton
# attention, or the sparse top-k attention): its block patch. The attention function gets the module that
# calls it: the block itself in decoders, a child such as BertSelfAttention in BERT. An attribute of the
# module, so that `copy.deepcopy(model)` gives the copy's modules the copy's block patches.
BLOCK_PATCH_ATTRIBUTE = "_gate_attention_block_patch"


def block_patch_of(module: nn.Module):
    """The block patch whose gate the attention function called by `module` applies, or `None`."""
    return getattr(module, BLOCK_PATCH_ATTRIBUTE, None)


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
        self,
        block: nn.Module,
        family: AttentionFamily,
        config: GateConfig,
        geometry: dict,
        gate_multiply=None,
        gate_in_attention: bool = False,
        sparse: bool | None = None,
    ):
        self.block = block
        self.family = family
        self.gate_variant = config.gate_variant
        self.input_names = tuple(name for name, _ in self.gate_variant.inputs)
        self.scale = config.gate_scale
        self.gate_multiply = gate_multiply  # the backend's fused gate pass, or None (torch's `apply_gate`)
        self.gate_in_attention = gate_in_attention
        self.sparse = sparse  # patch(sparse=...): how top_k runs, for attention functions deciding per call
        self.q_size = geometry["num_heads"] * geometry["head_dim"]
        self.kv_size = geometry["num_kv_heads"] * geometry["head_dim"]
        self.stash: dict[str, torch.Tensor] = {}
        self.query_stashes_logits = False  # set by `query_computes_logits`
        self.roles = self._roles()
        self.path_parts = {path: tuple(path.split(".")) for path in self.roles}
        self.hooked: dict[str, tuple[nn.Module, list]] = {}
        self.block_handle = block.register_forward_pre_hook(self._sync_hooks)
        self._sync_hooks(block, ())
        if gate_in_attention:
            for module in block.modules():
                setattr(module, BLOCK_PATCH_ATTRIBUTE, self)

    def _roles(self) -> dict[str, frozenset[str]]:
        """Projection path -> the roles it plays (a fused qkv projection plays three)."""
        roles: dict[str, set[str]] = {}
        for role in QKV_ROLES:
            roles.setdefault(getattr(self.family, role), set()).add(role)
        if self.gate_variant.gates_attention_output:
            roles.setdefault(self.family.output, set()).add("output")
        return {path: frozenset(names) for path, names in roles.items()}

    def _sync_hooks(self, block, args):
        """(Re)attach hooks to the modules now at the family's paths (they change when PEFT wraps them).

        Runs before every forward of the block: the paths are walked through `_modules` directly, since
        `get_submodule` costs a third of the hooks' host time in a decode step. Refuses a block that is not
        this patch's own but shares its hooks: a `torch.nn.DataParallel` replica, whose threads would share
        one stash (and re-register hooks in the original's hook dicts)."""
        if block is not self.block:
            raise RuntimeError(
                "gated attention: this block is a replica sharing the original's hooks, as "
                "torch.nn.DataParallel makes them (the Trainer wraps the model in it when it sees several "
                "GPUs without a distributed launch); not supported: launch with torchrun or `accelerate "
                "launch` (DistributedDataParallel), or make one GPU visible (CUDA_VISIBLE_DEVICES)"
            )
        for path, roles in self.roles.items():
            module = block
            for name in self.path_parts[path]:
                module = module._modules[name]
            hooked = self.hooked.get(path)
            if hooked is not None and hooked[0] is module:
                continue
            self._remove(path)
            handles = []
            hook = self._projection_hook(roles)
            if hook is not None:
                handles.append(module.register_forward_hook(hook))
            if "output" in roles:
                handles.append(module.register_forward_pre_hook(self._before_output))
            self.hooked[path] = (module, handles)

    def query_computes_logits(self) -> None:
        """The query projection now stashes the gate `logits` itself (backend `fused_gate`'s merged GEMM,
        `kernels/query_gate.py`): its hook that kept the input `x` for the gate goes (one hook fewer per layer
        and token)."""
        self.query_stashes_logits = True
        for path in list(self.hooked):
            self._remove(path)
        self._sync_hooks(self.block, ())

    def _remove(self, path: str) -> None:
        for handle in self.hooked.pop(path, (None, []))[1]:
            handle.remove()

    def remove(self) -> None:
        for path in list(self.hooked):
            self._remove(path)
        self.block_handle.remove()
        self.stash.clear()
        if self.gate_in_attention:
            for module in self.block.modules():
                module.__dict__.pop(BLOCK_PATCH_ATTRIBUTE, None)

    def gate(self) -> nn.Module:
        """The block's gate now (PEFT's `modules_to_save` may have wrapped it); `_modules`, not `getattr`:
        this runs per layer and token."""
        return self.block._modules[GATE_MODULE_NAME]

    def _projection_hook(self, roles: frozenset[str]):
        """The forward hook of a projection with these roles, or `None` if it has nothing to do: it keeps
        the gate inputs read from it (`x`: its input; else its output's part of that role) and gates the part
        of its output that the variant gates (`GateVariant.gates`, e.g. the values). Bound methods, not
        closures: `copy.deepcopy(model)` gives the copy's hooks the copy's block patch."""
        reads = tuple(
            (name, role)
            for name, role in self.gate_variant.inputs
            if role in roles and not (role == "query" and self.query_stashes_logits)
        )
        gates = self.gate_variant.gates  # the attention output is gated by the output projection's pre-hook
        gated = gates if not self.gate_variant.gates_attention_output and gates in roles else None
        if not reads and gated is None:
            return None
        if gated is None and all(name == "x" for name, _ in reads):
            return self._keep_input
        return partial(self._keep_inputs_and_gate, reads, gated)

    def _keep_input(self, module, args, output):
        self.stash["x"] = args[0]

    def _keep_inputs_and_gate(self, reads, gated, module, args, output):
        parts = self._split(output)
        for name, role in reads:
            self.stash[name] = args[0] if name == "x" else parts[role]
        if gated is None:
            return None
        gated_part = self._apply(parts[gated], self._take_inputs())
        if not self.family.fused_qkv:
            return gated_part
        return torch.cat([gated_part if role == gated else parts[role] for role in QKV_ROLES], dim=-1)

    def _split(self, output: torch.Tensor) -> dict[str, torch.Tensor]:
        """A projection's output by role (fused qkv: `(..., q_size + 2 * kv_size)` laid out `[q, k, v]`)."""
        if not self.family.fused_qkv:
            return {"query": output, "key": output, "value": output}
        split = output.split([self.q_size, self.kv_size, self.kv_size], -1)
        return dict(zip(QKV_ROLES, split, strict=True))

    def _take_inputs(self) -> dict[str, torch.Tensor]:
        """The stashed gate inputs of this forward (`GateVariant.inputs`); or the gate `logits`, when the
        query projection computed them in its own GEMM (backend `fused_gate`)."""
        logits = self.stash.pop("logits", None)
        if logits is not None:
            self.stash.pop("x", None)
            return {"logits": logits}
        try:
            return {name: self.stash.pop(name) for name in self.input_names}
        except KeyError as missing:
            raise RuntimeError(
                f"gated attention: the output projection ran before the {missing} projection of this block; "
                "the block's forward does not follow the registered AttentionFamily layout"
            ) from None

    def _apply(self, values: torch.Tensor, inputs: dict) -> torch.Tensor:
        """Gate `values: (..., G*D)` with the gate computed from `inputs` (or given as `logits`), on this
        patch's backend."""
        if self.gate_multiply is not None:
            logits, keep = self.gate()(**inputs, logits_only=True)
            return self.gate_multiply(values, logits, self.scale, keep)
        return apply_gate(values, self.gate()(**inputs))

    def take_gate_logits(self):
        """For the fused attention function: `(logits (B, L, H, w), keep (B, L, H) or None, scale)`."""
        logits, keep = self.gate()(**self._take_inputs(), logits_only=True)
        self.stash["fused"] = True
        return logits, keep, self.scale

    def take_gate(self):
        """For an attention function that applies the gate itself: `(gate (B, L, H, w), keep (B, L, H) or
        None)`, float32, `gate` already multiplied by `keep` (computed earlier by a projection that needed the
        selection, if one stashed it as `gate`)."""
        inputs = self._take_inputs()
        precomputed = self.stash.pop("gate", None)
        gate, keep = precomputed if precomputed is not None else self.gate().with_selection(**inputs)
        self.stash["fused"] = True
        return gate, keep

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


def attention_layout(model: nn.Module, config: GateConfig, family: AttentionFamily) -> dict:
    """Layer index -> `(block, geometry)` for the layers `config` gates; `ValueError` if they don't exist."""
    base = unwrap_model(model)
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
    return {index: (blocks[index], _geometry(base.config, family, blocks[index])) for index in layers}


def add_gates(
    model: nn.Module,
    config: GateConfig,
    family: AttentionFamily,
    layout: dict,
    gate_multiply=None,
    gate_in_attention: bool = False,
    sparse: bool | None = None,
) -> None:
    """Give every block of `layout` (from `attention_layout`) an `attn_gate` and its hooks; record `config`.

    `gate_multiply` is the backend's fused gate pass (`GateBackend.gate_multiply`), or `None` for plain torch
    (hooks.py itself imports no backend, so that it can ship as remote code).
    `gate_in_attention`: the model's attention function applies the gate (`take_gate*`), not the hooks.
    `sparse`: `patch`'s argument, kept on each block patch.
    """
    base = unwrap_model(model)
    patches = []
    for block, geometry in layout.values():
        query_weight = block.get_submodule(family.query).weight
        gate = AttentionGate(
            config,
            **geometry,
            init_std=getattr(base.config, "initializer_range", 0.02),
            dtype=query_weight.dtype,
            device=query_weight.device,
        )
        block.add_module(GATE_MODULE_NAME, gate)
        patches.append(_BlockPatch(block, family, config, geometry, gate_multiply, gate_in_attention, sparse))
    setattr(base, PATCHES_ATTRIBUTE, patches)
    setattr(base.config, CONFIG_ATTRIBUTE, config.to_dict())
