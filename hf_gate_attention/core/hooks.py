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

import warnings
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from .config import GateConfig
from .families import (
    QKV_ROLES,
    AttentionBlock,
    AttentionFamily,
    find_attention,
    projection_features,
    registered_family,
    unrecognised_attention,
)
from .gate import AttentionGate, apply_gate, called_bare
from .tensor_parallel import (
    GATE_STYLE,
    block_sharding,
    effective_plan,
    generic_name,
    shard_gate,
    tensor_parallel_size,
)

GATE_MODULE_NAME = "attn_gate"
CONFIG_ATTRIBUTE = "gate_attention"
PATCHES_ATTRIBUTE = "_gate_attention_patches"

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
        tensor_parallel: bool = False,
    ):
        self.block = block
        self.family = family
        self.gate_variant = config.gate_variant
        self.input_names = tuple(name for name, _ in self.gate_variant.inputs)
        self.scale = config.gate_scale
        self.gate_multiply = gate_multiply  # the backend's fused gate pass, or None (torch's `apply_gate`)
        self.gate_in_attention = gate_in_attention
        self.sparse = sparse  # patch(sparse=...): how top_k runs, for attention functions deciding per call
        self.head_dim, self.num_kv_heads = geometry["head_dim"], geometry["num_kv_heads"]
        self.q_size = geometry["num_heads"] * geometry["head_dim"]
        self.kv_size = geometry["num_kv_heads"] * geometry["head_dim"]
        self.chunks = family.chunks(block, geometry["num_kv_heads"])
        self.stash: dict[str, torch.Tensor] = {}
        self.query_stashes_logits = False  # set by `query_computes_logits`
        self.roles = self._roles()
        self.hooked: dict[str, tuple[nn.Module, list]] = {}
        # on plain torch (dense gates, or sparse top-k, whose attention function applies the gate), the
        # projections' parts run from instance `forward`s, not hooks (`InlineForward`); not under tensor
        # parallelism, whose `forward`s of the projections would wrap them (the hooks stay outside)
        self.inline = (
            gate_multiply is None and (config.top_k is None or gate_in_attention) and not tensor_parallel
        )
        self._watch()
        self.block_handle = self._hook_block()
        self._sync_hooks(block, ())
        if gate_in_attention:
            for module in block.modules():
                setattr(module, BLOCK_PATCH_ATTRIBUTE, self)

    def _roles(self) -> dict[str, frozenset[str]]:
        """Projection path -> the roles it plays (a fused qkv projection plays three)."""
        roles: dict[str, set[str]] = {}
        for role in QKV_ROLES:
            if getattr(self.family, role) is not None:
                roles.setdefault(getattr(self.family, role), set()).add(role)
        if self.gate_variant.gates_attention_output:
            roles.setdefault(self.family.output, set()).add("output")
        return {path: frozenset(names) for path, names in roles.items()}

    def _hook_block(self):
        """`_sync_hooks` before every forward of the block: from an instance `forward` of the block where the
        projections run without hooks (`InlineForward`: a hook on the block would send every call of it
        through `nn.Module`'s slower path for hooked modules), else a forward pre-hook."""
        if self.inline and "forward" not in self.block.__dict__:
            return InlineForward(self.block, self._sync_hooks, None)
        return self.block.register_forward_pre_hook(self._sync_hooks)

    def _sync_hooks(self, block, args):
        """(Re)attach hooks to the modules now at the family's paths (they change when PEFT wraps them).

        Runs before every forward of the block: the paths are walked through `_modules` directly, since
        `get_submodule` costs a third of the hooks' host time in a decode step. Empties the stash: a
        projection called again within the forward (DeBERTa's query projection also maps the relative
        position embeddings) keeps what its first call of this forward stashed. (`torch.nn.DataParallel`
        replicas, whose threads would share one stash, are refused by the gate: `AttentionGate`.)"""
        self.stash.clear()
        for path, roles, parts in self.watched:
            module = block
            for name in parts:
                module = module._modules[name]
            hooked = self.hooked.get(path)
            if hooked is not None and hooked[0] is module:
                continue
            self._remove(path)
            hook = self._projection_hook(path, roles)
            before = self._before_output if "output" in roles else None
            if self.inline and "forward" not in module.__dict__:
                handles = [InlineForward(module, before, hook)]
            else:
                handles = [module.register_forward_hook(hook)] if hook is not None else []
                if before is not None:
                    handles.append(module.register_forward_pre_hook(before))
            self.hooked[path] = (module, handles)

    def _watch(self) -> None:
        """The projections `_sync_hooks` attaches something to: `(path, roles, path parts)`."""
        self.watched = tuple(
            (path, roles, tuple(path.split(".")))
            for path, roles in self.roles.items()
            if "output" in roles or self._projection_hook(path, roles) is not None
        )

    def query_computes_logits(self) -> None:
        """The query projection now stashes the gate `logits` itself (backend `fused_gate`'s merged GEMM,
        `kernels/query_gate.py`): its hook that kept the input `x` for the gate goes (one hook fewer per layer
        and token)."""
        self.query_stashes_logits = True
        self._reattach()

    def use_hooks(self) -> None:
        """Run this block's gate from hooks again (`use_hooks`); a projection's `InlineForward.project`
        becomes its instance `forward`."""
        projects = {}
        for module, _ in self.hooked.values():
            inline = module.__dict__.get("forward")
            if isinstance(inline, InlineForward) and inline.project is not None:
                projects[module] = inline.project
        self.inline = False
        self.block_handle.remove()
        self.block_handle = self._hook_block()
        self._reattach()
        for module, project in projects.items():
            module.forward = project

    def _reattach(self) -> None:
        """Take everything off the projections and attach it again as the patch's settings now say."""
        for path in list(self.hooked):
            self._remove(path)
        self._watch()
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

    def _projection_hook(self, path: str, roles: frozenset[str]):
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
        return partial(self._keep_inputs_and_gate, reads, gated, self.family.roles_of(path))

    def _keep_input(self, module, args, output):
        self.stash.setdefault("x", args[0])

    def _keep_inputs_and_gate(self, reads, gated, roles, module, args, output):
        parts = self.split(output, roles)
        for name, role in reads:
            self.stash.setdefault(name, args[0] if name == "x" else parts[role])
        if gated is None:
            return None
        parts[gated] = self._apply(parts[gated], self._take_inputs())
        return self._join(parts, roles)

    def split(self, output: torch.Tensor, roles: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The output of a projection playing `roles` (`family.roles_of`), by role: `(..., width)` ->
        `(..., q_size)` for the queries, `(..., kv_size)` for keys and values, as the family lays them out
        (in `chunks` of `[parts in qkv_order]`, each holding its share of every role's heads)."""
        if len(roles) == 1:
            return {roles[0]: output}
        sizes = [(self.q_size if role == "query" else self.kv_size) // self.chunks for role in roles]
        if self.chunks == 1:
            return dict(zip(roles, output.split(sizes, -1), strict=True))
        parts = output.unflatten(-1, (self.chunks, -1)).split(sizes, -1)  # (..., chunks, size) each
        return {role: part.flatten(-2) for role, part in zip(roles, parts, strict=True)}

    def _join(self, parts: dict[str, torch.Tensor], roles: tuple[str, ...]) -> torch.Tensor:
        """The inverse of `split`."""
        if len(roles) == 1:
            return parts[roles[0]]
        if self.chunks == 1:
            return torch.cat([parts[role] for role in roles], dim=-1)
        chunked = [parts[role].unflatten(-1, (self.chunks, -1)) for role in roles]
        return torch.cat(chunked, dim=-1).flatten(-2)

    def _take_inputs(self) -> dict[str, torch.Tensor]:
        """The stashed gate inputs of this forward (`GateVariant.inputs`); or the gate `logits`, when the
        query projection computed them in its own GEMM (backend `fused_gate`)."""
        stash = self.stash
        if self.query_stashes_logits:
            logits = stash.pop("logits", None)
            if logits is not None:
                stash.pop("x", None)
                return {"logits": logits}
        inputs = {}
        try:
            for name in self.input_names:  # a loop, not a comprehension: no frame of its own on Python 3.11
                inputs[name] = stash.pop(name)
        except KeyError as missing:
            raise RuntimeError(
                f"gated attention: the output projection ran before the {missing} projection of this block; "
                "the block's forward does not follow the registered AttentionFamily layout"
            ) from None
        return inputs

    def _apply(self, values: torch.Tensor, inputs: dict) -> torch.Tensor:
        """Gate `values: (..., G*D)` with the gate computed from `inputs` (or given as `logits`), on this
        patch's backend."""
        gate = self.block._modules[GATE_MODULE_NAME]  # `self.gate()`, one call fewer per layer and token
        if self.inline and type(gate) is AttentionGate and gate.top_k is None and called_bare(gate):
            return gate.gated(values, **inputs)
        if self.gate_multiply is not None:
            logits, keep = gate(**inputs, logits_only=True)
            return self.gate_multiply(values, logits, self.scale, keep)
        return apply_gate(values, gate(**inputs))

    def take_gate_logits(self):
        """For the fused attention function: `(logits (B, L, H, w), keep (B, L, H) or None, scale)`."""
        logits, keep = self.gate()(**self._take_inputs(), logits_only=True)
        self.stash["fused"] = True
        return logits, keep, self.scale

    def take_gate(self, kept_on_host: bool = False):
        """For an attention function that applies the gate itself: `(gate (B, L, H, w), keep (B, L, H) or
        None)`, float32, `gate` already multiplied by `keep`. `kept_on_host` (one token, top-k): `(gate, the
        H kept heads as bools)`, the gate not multiplied (`AttentionGate.with_kept_heads`), as a projection
        that needed the selection computed it for one token (stashed as `gate`)."""
        inputs = self._take_inputs()
        precomputed = self.stash.pop("gate", None)
        if precomputed is None:
            gate_module = self.gate()
            select = gate_module.with_kept_heads if kept_on_host else gate_module.with_selection
            gate, keep = select(**inputs)
        else:
            gate, keep = precomputed
            if not kept_on_host:  # the selection as `with_selection` gives it
                keep = gate.new_tensor(keep).view(gate.shape[:-1])  # (1, 1, H)
                gate = gate if self.gate().dropped_reads_keys else gate * keep.unsqueeze(-1)
        self.stash["fused"] = True
        return gate, keep

    def _before_output(self, module, args):
        if self.gate_in_attention and self.stash.pop("fused", False):  # the attention function applied it
            return None
        return (self._apply(args[0], self._take_inputs()), *args[1:])


class InlineForward:
    """A projection's hooks run as the `forward` of its instance instead: `before(module, args)` may replace
    the arguments (the output projection's gate), then the class's `forward`, then `after(module, args,
    output)` may replace the output (the hook that keeps the gate's inputs). The same functions as the hooks,
    without hook dispatch, which costs as much as the gate's arithmetic in a CPU decode step
    (benchmarks/gate_cost.py). Used where the module has no instance `forward` of its own; `remove()` takes it
    off. An object, not a closure, so that `copy.deepcopy(model)` gives the copy's projection the copy's
    block patch. `project`, if set, runs instead of the class's `forward` (sparse top-k's partial
    projections, `sparse.prepare_block`)."""

    def __init__(self, module: nn.Module, before, after):
        self.module, self.before, self.after = module, before, after
        self.linear = type(module) is nn.Linear
        self.project = None
        module.forward = self

    def __call__(self, *args, **kwargs):
        module = self.module
        if self.before is not None:
            args = self.before(module, args) or args
        if self.project is not None:
            output = self.project(*args, **kwargs)
        elif self.linear and not kwargs:  # `nn.Linear.forward` without its two `nn.Module.__getattr__`s
            weights = module._parameters
            output = F.linear(*args, weights["weight"], weights["bias"])
        else:
            output = type(module).forward(module, *args, **kwargs)
        if self.after is not None:
            replaced = self.after(module, args, output)
            return output if replaced is None else replaced
        return output

    def remove(self) -> None:
        if self.module.__dict__.get("forward") is self:
            del self.module.forward


def use_hooks(model: nn.Module) -> None:
    """Run a patched model's gates from hooks with `apply_gate` again, as before `InlineForward`: the
    reference that tests and benchmarks/gate_cost.py compare the hook-free path to (same bits, more host
    time)."""
    for block_patch in getattr(unwrap_model(model), PATCHES_ATTRIBUTE):
        block_patch.use_hooks()


def _in_parts(name: str, parts) -> bool:
    return parts is None or any(f".{part}." in f".{name}." for part in parts)


def _no_blocks_message(model: nn.Module, family: AttentionFamily | None) -> str:
    model_type = getattr(model.config, "model_type", "?")
    looked_for = (
        f"modules matching the registered block pattern {family.block!r}"
        if family
        else "attention blocks whose projections follow a known layout (hf_gate_attention.core.families."
        "LAYOUTS: q/k/v/o projections such as q_proj/k_proj/v_proj/o_proj, query/key/value + output.dense, "
        "fused qkv_proj, Wqkv, c_attn, query_key_value)"
    )
    seen = unrecognised_attention(model, []) or ["no module whose class name ends in 'Attention'"]
    return (
        f"model type {model_type!r} ({type(model).__name__}): found no attention block to gate. Looked for "
        f"{looked_for}; found: {'; '.join(seen[:4])}. Describe its layout with "
        "hf_gate_attention.register_family(model_type, AttentionFamily(block=..., query=..., key=..., "
        "value=..., output=...))"
    )


def attention_layout(model: nn.Module, config: GateConfig, family: AttentionFamily | None = None) -> list:
    """The attention blocks `config` gates (`AttentionBlock`s, module order), found by the structural search
    (or by `family`, or the family registered for the model type); `ValueError` naming what is wrong when the
    model has none, or `config` asks for attention kinds, parts or layers it does not have."""
    base = unwrap_model(model)
    family = family or registered_family(getattr(base.config, "model_type", None))
    found = find_attention(base, family)
    if not found:
        raise ValueError(_no_blocks_message(base, family))
    model_name = f"{type(base).__name__} (model type {base.config.model_type!r})"
    if config.parts is not None:
        missing = [part for part in config.parts if not any(_in_parts(b.name, (part,)) for b in found)]
        if missing:
            stacks = sorted({b.stack for b in found})
            raise ValueError(
                f"GateConfig.parts {missing} name no part of {model_name} holding attention; its attention "
                f"blocks are {', '.join(stacks)} (a part is a segment of these names)"
            )
    in_parts = [b for b in found if _in_parts(b.name, config.parts)]
    kinds = {b.kind for b in in_parts}
    # the default (every self-attention) fits any model; asking for cross-attention, or only for a kind the
    # model lacks, is an error
    missing = [kind for kind in config.attention if kind not in kinds]
    if "cross" in missing or not kinds & set(config.attention):
        raise ValueError(
            f"GateConfig.attention asks for {', '.join(missing)} attention, which {model_name} does not have "
            f"(in the parts chosen); it has: {', '.join(sorted(kinds))}"
        )
    chosen = [b for b in in_parts if b.kind in config.attention]
    if config.layers is not None:
        missing = sorted(set(config.layers) - {b.index for b in chosen})
        if missing:
            last = max(b.index for b in chosen)
            raise ValueError(f"GateConfig.layers {missing} not found; this model has layers 0..{last}")
        chosen = [b for b in chosen if b.index in config.layers]
    if "cross" in config.attention and not config.gate_variant.reads_only_hidden_state:
        raise ValueError(
            f"GateConfig.variant={config.variant!r} reads the query and key of the same position, which "
            "cross-attention does not have (its keys are the encoder's); gate cross-attention with variant "
            "'output' or 'value'"
        )
    for block in chosen:
        family = block.family
        if family.variants == ():
            raise ValueError(f"{block.name} ({type(block.module).__name__}) cannot be gated: {family.limits}")
        if family.variants is not None and config.variant not in family.variants:
            raise ValueError(
                f"GateConfig.variant={config.variant!r} cannot gate {block.name} "
                f"({type(block.module).__name__}): {family.limits}; it serves {', '.join(family.variants)}"
            )
    unknown = unrecognised_attention(base, found)
    unknown = [name for name in unknown if _in_parts(name, config.parts)]
    if unknown:
        warnings.warn(
            f"gated attention: {len(unknown)} module(s) of {model_name} look like attention but follow no "
            f"known layout and get no gate: {', '.join(unknown[:4])}. Describe them with register_family, or "
            "leave their part out with GateConfig.parts",
            stacklevel=3,
        )
    return chosen


def blocks_by_layer(model: nn.Module) -> dict[int, nn.Module]:
    """Layer index -> self-attention block of a model with one stack of them (a decoder, an encoder), gated or
    not; `ValueError` for a model with several (an encoder-decoder, a composite model)."""
    base = unwrap_model(model)
    family = registered_family(getattr(base.config, "model_type", None))
    blocks = [block for block in find_attention(base, family) if block.kind != "cross"]
    if not blocks:
        raise ValueError(_no_blocks_message(base, family))
    stacks = sorted({block.stack for block in blocks})
    if len(stacks) > 1:
        raise ValueError(
            f"{type(base).__name__} has several stacks of self-attention blocks ({', '.join(stacks)}); this "
            "needs a model with one (a decoder or an encoder)"
        )
    return {block.index: block.module for block in blocks}


def gate_dtype(block: AttentionBlock, model: nn.Module) -> torch.dtype:
    """The gate's dtype: its query projection's, or, where that weight is quantized (bitsandbytes 4/8-bit),
    the model's float dtype, that of the hidden states entering the block: gates are never quantized."""
    query = block.module.get_submodule(block.family.query)
    base = query.get_base_layer() if hasattr(query, "get_base_layer") else query
    if base.weight.dtype.is_floating_point:
        return base.weight.dtype
    dtype = getattr(model, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def gate_device(block: AttentionBlock) -> torch.device:
    """The gate's device: its query projection's; where accelerate offloaded that weight (`device_map` with
    "cpu" or "disk": the meta device until the forward), the device accelerate runs the block on. (A model
    being built on the meta device, as `from_pretrained` builds the `trust_remote_code` class, gets its gates
    there too: they are loaded with its weights.)"""
    query = block.module.get_submodule(block.family.query)
    if query.weight.device.type == "meta":
        for module in (query, block.module):
            hook = getattr(module, "_hf_hook", None)
            for part in getattr(hook, "hooks", (hook,)):
                device = getattr(part, "execution_device", None)
                if device is not None:
                    return torch.device(device)
    return query.weight.device


def _gate_input_width(block: AttentionBlock, config: GateConfig) -> int:
    """The width of the input `x` the gate reads: that of the projection it reads it from (MobileBERT's value
    projection reads another input than its query projection)."""
    role = next((role for name, role in config.gate_variant.inputs if name == "x"), "query")
    return projection_features(block.module.get_submodule(getattr(block.family, role)))[0]


def add_gates(
    model: nn.Module,
    config: GateConfig,
    layout: list[AttentionBlock],
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
    sharded = tensor_parallel_sharding(base, config, layout)
    patches = []
    for found in layout:
        block, family, geometry = found.module, found.family, found.geometry
        gate = AttentionGate(
            config,
            **{**geometry, "hidden_size": _gate_input_width(found, config)},
            init_std=getattr(found.part_config, "initializer_range", 0.02),
            dtype=gate_dtype(found, base),
            device=gate_device(found),
        )
        block.add_module(GATE_MODULE_NAME, gate)
        tensor_parallel = sharded is not None
        patches.append(
            _BlockPatch(
                block, family, config, geometry, gate_multiply, gate_in_attention, sparse, tensor_parallel
            )
        )
    setattr(base, PATCHES_ATTRIBUTE, patches)
    setattr(base.config, CONFIG_ATTRIBUTE, config.to_dict())
    if sharded is not None:
        _plan_gates(base, layout, sharded)


def tensor_parallel_sharding(model: nn.Module, config: GateConfig, layout: list) -> dict[str, bool] | None:
    """Under tensor parallelism (a model loaded, or being loaded, with a TP size above 1): block name ->
    whether its gate shards with its heads (`tensor_parallel.block_sharding`, which refuses what cannot
    shard); `None` without TP."""
    size = tensor_parallel_size(model.config)
    if size == 1:
        return None
    plan = effective_plan(model)
    return {block.name: block_sharding(block, plan, size) for block in layout}


def _plan_gates(model: nn.Module, layout: list, sharded: dict[str, bool]) -> None:
    """Give each gate its entry in the model's TP plan: `GATE_STYLE` for a gate that shards with its heads,
    `replicate` for its parameters where the heads stay whole. A model being loaded applies them itself
    (`from_pretrained` with a TP plan, after building the gated class); one already loaded with TP gets
    them applied here."""
    mesh_manager = getattr(model, "_mesh_manager", None)
    mesh = mesh_manager.get_mesh("tp") if getattr(model, "_device_mesh", None) is not None else None
    for block in layout:
        name = generic_name(f"{block.name}.{GATE_MODULE_NAME}")
        if sharded[block.name]:
            model._tp_plan[name] = GATE_STYLE
            if mesh is not None:
                shard_gate(block.module._modules[GATE_MODULE_NAME], mesh)
        else:
            model._tp_plan.update({f"{name}.weight": "replicate", f"{name}.bias": "replicate"})
