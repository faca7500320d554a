"""What the paper measures inside a model (Qiu et al. 2025, sections 4.2-4.3): the attention sink (attention
mass on the first token), massive activations (max |hidden state| per layer) and the gate values.

The attention weights come from a probe: for the probed forward only, the model's attention implementation
is wrapped by one that calls the original function (so the model's outputs are unchanged) and also computes
`softmax(q k^T * scaling + mask)` from the same query, key and mask (`attention_probabilities`, the readable
formula). Eager attention returns its weights, which are used as they are. The weights are those before any
gate: the qk gate, which scales rows of them, is reported with the gate statistics.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from weakref import WeakKeyDictionary

import torch
from torch import nn

from ..core.families import find_attention, registered_family
from ..core.hooks import GATE_MODULE_NAME, PATCHES_ATTRIBUTE, blocks_by_layer, unwrap_model
from ..core.patching import gate_backend_of, is_patched

PROBE_PREFIX = "hf_gate_attention_probe_"
GATE_HISTOGRAM_BINS = 200
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
LOW_GATE = 0.1  # "fraction of gate values below 0.1"
ATTENTION_SUMS = ("first_token", "top1", "top1_at_first", "top1_at_previous", "top1_at_self")
# attention module (the one calling the attention function) -> (its recorder, layer index), during a probe
_PROBED: WeakKeyDictionary = WeakKeyDictionary()


def attention_probabilities(query, key, attention_mask=None, scaling=None, is_causal=True, softcap=None):
    """Attention weights `(B, H, L, S)` in float32 from `query: (B, H, L, D)` and `key: (B, KV, S, D)`.

    `attention_mask` is what transformers passes to attention functions: `None` (causal when `is_causal`,
    aligned so that the last query sees every key), a key padding mask `(B, S)` (1 = keep), a boolean
    `(B, 1, L, S)` (True = attend) or an additive float `(B, 1, L, S)`. A query that sees no key gets 0.
    """
    key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)  # (B, H, S, D)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling  # (B, H, L, S)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    length, key_length = scores.shape[-2:]
    if attention_mask is None or attention_mask.dim() == 2:
        allowed = torch.ones(length, key_length, dtype=torch.bool, device=scores.device)
        if is_causal and length > 1:
            allowed = allowed.tril(key_length - length)
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, :].bool()
        scores = scores.masked_fill(~allowed, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask[..., :key_length], float("-inf"))
    else:
        scores = scores + attention_mask[..., :key_length].float()
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query with no visible key: all 0


def _original_attention(name: str, module: nn.Module):
    """The attention function that implementation `name` runs for `module` (eager: its modeling file's)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "eager":
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise ValueError(f"{type(module).__name__} has no eager_attention_forward to probe")
        return eager
    return ALL_ATTENTION_FUNCTIONS[name]


def register_probe(original: str) -> str:
    """Register (idempotent) the probe implementation that wraps `original`; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = PROBE_PREFIX + original

    def probe_attention(module, query, key, value, attention_mask, **kwargs):
        output, weights = _original_attention(original, module)(
            module, query, key, value, attention_mask, **kwargs
        )
        if module in _PROBED:
            recorder, layer = _PROBED[module]
            probed = weights
            if probed is None:
                is_causal = kwargs.get("is_causal")
                probed = attention_probabilities(
                    query,
                    key,
                    attention_mask,
                    kwargs.get("scaling"),
                    getattr(module, "is_causal", True) if is_causal is None else is_causal,
                    kwargs.get("softcap"),
                )
            recorder.attention(layer, probed)
        return output, weights  # exactly what the original returned

    if original not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(
            f"diagnose cannot probe attention implementation {original!r}; probed: "
            f"{', '.join(sorted(n for n in ALL_MASK_ATTENTION_FUNCTIONS if not n.startswith(PROBE_PREFIX)))}"
        )
    AttentionInterface.register(name, probe_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    return name


class _Recorder:
    """Running sums of one diagnosis, per layer (attention: per head; gates: per gated head)."""

    def __init__(self, num_layers: int, skip_queries: int):
        self.skip_queries = skip_queries
        # name -> per layer, sums over queries (H,): the weight on key 0, the largest weight, and how often
        # the largest weight sits on key 0, on the query's previous position, on its own position
        self.sums = {name: [None] * num_layers for name in ATTENTION_SUMS}
        self.queries = [0] * num_layers
        self.activation = [None] * num_layers  # (max |h|, input, position, channel, median |h|)
        self.gates: dict[int, dict] = {}
        self.input_index = 0

    def attention(self, layer: int, weights: torch.Tensor) -> None:
        length, key_length = weights.shape[-2:]
        weights = weights[0, :, self.skip_queries :].float()  # (H, L - skip, S)
        top1, top1_key = weights.max(-1)  # (H, L - skip)
        position = torch.arange(self.skip_queries, length, device=weights.device) + key_length - length
        values = {
            "first_token": weights[..., 0].sum(-1),
            "top1": top1.sum(-1),
            "top1_at_first": (top1_key == 0).sum(-1),
            "top1_at_previous": (top1_key == position - 1).sum(-1),
            "top1_at_self": (top1_key == position).sum(-1),
        }
        for name, value in values.items():
            total = self.sums[name][layer]
            self.sums[name][layer] = value.double() if total is None else total + value
        self.queries[layer] += weights.shape[1]

    def hidden(self, layer: int, hidden: torch.Tensor) -> None:
        values = hidden[0].detach().float().abs()  # (L, C)
        peak = values.max()
        position, channel = divmod(int(values.argmax()), values.shape[-1])
        median = values.median().item()
        if self.activation[layer] is None or peak.item() > self.activation[layer][0]:
            self.activation[layer] = (peak.item(), self.input_index, position, channel, median)

    def gate(self, layer: int, gate: torch.Tensor, keep: torch.Tensor | None, scale: float) -> None:
        """`gate: (1, L, G, w)` before top-k selection, `keep: (1, L, G)` or None."""
        values = gate[0].detach().float().transpose(0, 1).flatten(1)  # (G, L*w)
        totals = self.gates.get(layer)
        if totals is None:  # on the gates' device (the Trainer callback records them on the GPU)
            heads, on = values.shape[0], {"dtype": torch.float64, "device": values.device}
            totals = self.gates[layer] = {
                "sum": torch.zeros(heads, **on),
                "count": 0,
                "low": torch.zeros(heads, **on),
                "histogram": torch.zeros(heads, GATE_HISTOGRAM_BINS, **on),
                "kept": None if keep is None else torch.zeros(heads, **on),
                "tokens": 0,
                "scale": scale,
            }
        totals["sum"] += values.sum(-1).double()
        totals["count"] += values.shape[1]
        totals["low"] += (values < LOW_GATE).sum(-1).double()
        bins = (values / scale * GATE_HISTOGRAM_BINS).long().clamp_(0, GATE_HISTOGRAM_BINS - 1)
        totals["histogram"].scatter_add_(1, bins, torch.ones_like(bins, dtype=torch.float64))
        if keep is not None:
            totals["kept"] += keep[0].detach().double().sum(0)
        totals["tokens"] += gate.shape[1]

    def result(self) -> dict:
        if any(count == 0 for count in self.queries):
            missing = [layer for layer, count in enumerate(self.queries) if count == 0]
            raise ValueError(
                f"no attention weights were recorded for layers {missing}: their attention does not go "
                "through transformers' attention interface, which the probe wraps (or every input is "
                "shorter than "
                f"skip_queries + 1 = {self.skip_queries + 1} tokens)"
            )
        attention = {
            name: [(s / n).tolist() for s, n in zip(sums, self.queries, strict=True)]
            for name, sums in self.sums.items()
        }
        keys = ("max_abs", "input", "position", "channel", "median_abs")
        activations = {key: [entry[i] for entry in self.activation] for i, key in enumerate(keys)}
        return {
            "attention": {**attention, "queries": self.queries[0]},
            "activations": activations,
            "gates": self._gate_result() if self.gates else None,
        }

    def _gate_result(self) -> dict:
        layers = sorted(self.gates)
        out = {"layers": layers, "mean": [], "below_0.1": [], "quantiles": {str(q): [] for q in QUANTILES}}
        out["keep_rate"] = [] if self.gates[layers[0]]["kept"] is not None else None
        for layer in layers:
            totals = self.gates[layer]
            out["mean"].append((totals["sum"] / totals["count"]).tolist())
            out["below_0.1"].append((totals["low"] / totals["count"]).tolist())
            cumulative = totals["histogram"].cumsum(-1) / totals["count"]  # (G, bins)
            for q in QUANTILES:
                # upper edge of the first bin reaching the quantile: resolution scale / GATE_HISTOGRAM_BINS
                index = (cumulative < q).sum(-1).clamp(max=GATE_HISTOGRAM_BINS - 1)
                edges = (index + 1).double() * totals["scale"] / GATE_HISTOGRAM_BINS
                out["quantiles"][str(q)].append(edges.tolist())
            if out["keep_rate"] is not None:
                out["keep_rate"].append((totals["kept"] / totals["tokens"]).tolist())
        return out


class _GateProbe:
    """Recomputes one gated block's gate, as the model computes it, from the inputs its projections see."""

    def __init__(self, block_patch, layer: int, recorder: _Recorder):
        self.block_patch, self.layer, self.recorder = block_patch, layer, recorder
        self.gate = getattr(block_patch.block, GATE_MODULE_NAME)
        self.inputs: dict[str, torch.Tensor] = {}

    def attach(self) -> list:
        family = self.block_patch.family
        paths: dict[str, list] = {}  # projection path -> the (gate input, role) pairs it yields
        for name, role in self.gate.gate_variant.inputs:
            paths.setdefault(getattr(family, role), []).append((name, role))
        block = self.block_patch.block
        return [
            block.get_submodule(path).register_forward_hook(self._hook(wanted, family.roles_of(path)))
            for path, wanted in paths.items()
        ]

    def _hook(self, wanted: list, roles: tuple[str, ...]):
        def hook(module, args, output):
            parts = self.block_patch.split(output, roles)
            self.inputs.update({name: args[0] if name == "x" else parts[role] for name, role in wanted})
            if len(self.inputs) == len(self.gate.gate_variant.inputs):
                gate = self.gate._sigmoid(self.gate.logits(**self.inputs))  # (1, L, G, w)
                keep = self.gate.selection(gate) if self.gate.top_k is not None else None
                self.recorder.gate(self.layer, gate, keep, self.gate.scale)
                self.inputs.clear()

        return hook


def _gate_hooks(base: nn.Module, blocks: dict, recorder: _Recorder, cross: _Recorder) -> list:
    """Probes of the gated blocks: those of the diagnosed self-attention `blocks` record into `recorder` by
    layer, the gated cross-attention blocks (`AttentionBlock.kind == "cross"`) into `cross` by their layer
    in their own stack; the gates of blocks in other parts (an encoder's, with `part`) are not recorded."""
    layer_of = {id(block): index for index, block in blocks.items()}
    patches = getattr(base, PATCHES_ATTRIBUTE, [])
    found = {id(b.module): b for b in find_attention(base, _family(base))} if patches else {}
    diagnosed = {_stack_parent(found[id(block)].name) for block in blocks.values() if id(block) in found}
    handles = []
    for block_patch in patches:
        block = found.get(id(block_patch.block))
        if id(block_patch.block) in layer_of:
            handles += _GateProbe(block_patch, layer_of[id(block_patch.block)], recorder).attach()
        elif block is not None and block.kind == "cross" and _stack_parent(block.name) in diagnosed:
            handles += _GateProbe(block_patch, block.index, cross).attach()
    return handles


def _family(base: nn.Module):
    return registered_family(getattr(base.config, "model_type", None))


def _stack_parent(name: str) -> str:
    """The part of a block's name above its layer number (`decoder.transformer.h` of
    `decoder.transformer.h.3.crossattention`): the self- and cross-attention of one stack of layers share
    it."""
    parts = name.split(".")
    numbers = [i for i, part in enumerate(parts) if part.isdigit()]
    return ".".join(parts[: numbers[-1]]) if numbers else ""


def _in_part(name: str, part: str) -> bool:
    return f".{part}." in f".{name}."


def diagnosed_blocks(base: nn.Module, part: str | None = None) -> dict[int, nn.Module]:
    """Layer index -> self-attention block of the stack `diagnose` measures: the model's only one, or, with
    `part`, the only one among the blocks whose module name has `part` as a segment (`"decoder"`: the
    decoder of an encoder-decoder model, whose cross-attention gates are then reported beside it)."""
    if part is None:
        try:
            return blocks_by_layer(base)
        except ValueError as err:
            if "several stacks" in str(err):
                raise ValueError(f"{err}; or choose one with part=... (e.g. part='decoder')") from None
            raise
    found = [b for b in find_attention(base, _family(base)) if b.kind != "cross" and _in_part(b.name, part)]
    stacks = sorted({b.stack for b in found})
    if len(stacks) != 1:
        seen = sorted({b.stack for b in find_attention(base, _family(base)) if b.kind != "cross"})
        raise ValueError(
            f"part={part!r} selects {len(stacks)} stacks of self-attention blocks "
            f"({', '.join(stacks) or 'none'}); it must select one. The model's stacks: {', '.join(seen)}"
        )
    return {b.index: b.module for b in found}


def _hidden_hooks(base: nn.Module, blocks: dict, recorder: _Recorder) -> list:
    """Forward hooks on each layer (the module holding an attention block) recording its output's peaks."""
    names = {id(module): name for name, module in base.named_modules()}
    handles = []
    for index, block in blocks.items():
        layer = base.get_submodule(names[id(block)].rpartition(".")[0])

        def hook(module, args, output, index=index):
            recorder.hidden(index, output[0] if isinstance(output, tuple | list) else output)

        handles.append(layer.register_forward_hook(hook))
    return handles


@torch.no_grad()
def diagnose(
    model: nn.Module,
    inputs: Iterable[dict],
    skip_queries: int = 4,
    progress: bool = False,
    part: str | None = None,
) -> dict:
    """Attention sink, massive activations and gate statistics of `model` on `inputs`.

    Args:
        model: a transformers model of a supported family (see `supported_model_types`), patched or not,
            bare, with a task head or wrapped by PEFT; its outputs are unchanged.
        inputs: model inputs of one example each (`{"input_ids": (1, L)}`, `{"pixel_values": (1, C, H, W)}`,
            ...), without padding (see `text_inputs`, `image_inputs`).
        skip_queries: the first query positions left out of the attention averages (a causal query 0 can
            only attend to token 0).
        part: a module name segment choosing the self-attention stack of a model with several (`"decoder"`
            for an encoder-decoder: its decoder's layers); `None`: the model's only stack.

    Returns a JSON-serialisable dict: `attention` (`first_token`, `top1`: per layer, per head, the mean over
    queries of the weight on key 0 and of the largest weight; `top1_at_first`, `top1_at_previous`,
    `top1_at_self`: the share of queries whose largest weight is on key 0, the previous position, the query's
    own position), `activations` (per layer: `max_abs` of the
    layer's output hidden state, where it sits (`input`, `position`, `channel`) and `median_abs`), `gates`
    (per gated layer and gated head: `mean`, `below_0.1`, `quantiles`, `keep_rate` for top-k; `None` for an
    ungated model), `cross_gates` (the same for the gated cross-attention blocks of the diagnosed stack's
    layers, numbered by layer; `None` without them) and `summary` (the scalars of `summarize`).
    """
    base = unwrap_model(model)
    blocks = diagnosed_blocks(base, part)
    if sorted(blocks) != list(range(len(blocks))):
        raise ValueError(f"attention blocks {sorted(blocks)} are not numbered 0..{len(blocks) - 1}")
    recorder, cross = _Recorder(len(blocks), skip_queries), _Recorder(0, skip_queries)
    original = base.config._attn_implementation
    probe_name = register_probe(original)
    for index, block in blocks.items():
        for module in block.modules():
            _PROBED[module] = (recorder, index)
    handles = _hidden_hooks(base, blocks, recorder) + _gate_hooks(base, blocks, recorder, cross)
    was_training = base.training
    base.eval()
    base.set_attn_implementation(probe_name)
    try:
        items = list(inputs)
        if not items:
            raise ValueError("diagnose needs at least one input")
        if progress:
            from tqdm.auto import tqdm

            items = tqdm(items, desc="Diagnosing", unit="input")
        device = next(base.parameters()).device
        for index, item in enumerate(items):
            _check_input(item, index)
            recorder.input_index = index
            model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in item.items()})
    finally:
        base.set_attn_implementation(original)
        base.train(was_training)
        for handle in handles:
            handle.remove()
        for block in blocks.values():
            for module in block.modules():
                _PROBED.pop(module, None)
    result = recorder.result()
    result["cross_gates"] = cross._gate_result() if cross.gates else None
    result["model"] = {
        "model_type": base.config.model_type,
        "num_layers": len(blocks),
        "attn_implementation": original,
        "gate": getattr(base.config, "gate_attention", None),
        "backend": gate_backend_of(base) if is_patched(base) else None,
        "part": part,
    }
    result["inputs"] = {"count": len(items), "skip_queries": skip_queries}
    result["summary"] = summarize(result)
    return result


def _check_input(item, index: int) -> None:
    if not isinstance(item, dict) or not item:
        raise ValueError(f"input {index} must be a dict of model inputs, got {type(item).__name__}")
    mask = item.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError(f"input {index} has padding; pass one example per input, without padding")
    for name, value in item.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] != 1:
            raise ValueError(f"input {index}: {name} has batch size {value.shape[0]}; pass one example each")


def summarize(result: dict) -> dict:
    """The few scalars of a diagnosis that the paper reports (averages over layers and heads)."""
    first = torch.tensor(result["attention"]["first_token"])
    attention = result["attention"]
    summary = {
        "first_token_attention": first.mean().item(),
        "top1_attention": torch.tensor(attention["top1"]).mean().item(),
        # where the largest weight sits (shares of queries; the rest: elsewhere)
        **{f"{name}_share": torch.tensor(attention[name]).mean().item() for name in ATTENTION_SUMS[2:]},
        "max_activation": max(result["activations"]["max_abs"]),
        "max_activation_layer": int(torch.tensor(result["activations"]["max_abs"]).argmax()),
        "median_activation": float(torch.tensor(result["activations"]["median_abs"]).median()),
    }
    cross = result.get("cross_gates")
    if cross is not None:
        summary["cross_gate_mean"] = torch.tensor(cross["mean"]).mean().item()
        summary["cross_gate_below_0.1"] = torch.tensor(cross["below_0.1"]).mean().item()
    gates = result["gates"]
    if gates is not None:
        summary["gate_mean"] = torch.tensor(gates["mean"]).mean().item()
        summary["gate_below_0.1"] = torch.tensor(gates["below_0.1"]).mean().item()
        if gates["keep_rate"] is not None:  # how often top-k keeps each (layer, head): the extremes
            keep_rate = torch.tensor(gates["keep_rate"])
            summary["keep_rate_min"], summary["keep_rate_max"] = (
                keep_rate.min().item(),
                keep_rate.max().item(),
            )
    return summary


def text_inputs(tokenizer, texts: Iterable[str], max_length: int = 512, min_length: int = 8) -> list[dict]:
    """One `{"input_ids", "attention_mask"}` (1, <= max_length) per text; texts shorter than `min_length`
    tokens are left out."""
    items = []
    for text in texts:
        encoded = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
        if encoded["input_ids"].shape[1] >= min_length:
            items.append(dict(encoded))
    return items


def image_inputs(processor, images: Iterable) -> list[dict]:
    """One `{"pixel_values": (1, C, H, W)}` per image (PIL images or arrays), preprocessed by `processor`."""
    return [
        {"pixel_values": processor(images=image, return_tensors="pt")["pixel_values"]} for image in images
    ]
