"""Where a trained captioner's cross-attention falls on the test images, and what its gates do, read with
teacher forcing on the reference captions (so that every run is measured on the same tokens).

The weights are the post-softmax cross-attention weights that eager attention returns
(`output_attentions=True`; the output gate scales a head's output after them, it does not change them); the
gate values are what each cross-attention block's gate module returns, recorded by a forward hook.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..common.attention_maps import GateRecorder, mean_or_nan, object_keys, object_share, patch_coverage
from .metrics import WORD_CLASSES, sink_share, word_class
from .model import encode_caption, start_and_end

END = "</end>"  # the word of the step that emits the end token


def object_key_sets(rows: list[dict], image_size: int, grid: int, prefix: int, threshold: float) -> list:
    """Per row, per object: its keys (`object_keys`), or `None` for a row without objects."""
    return [
        None
        if not row["objects"]
        else [
            object_keys(patch_coverage(o["mask"], image_size, grid), threshold, prefix)
            for o in row["objects"]
        ]
        for row in rows
    ]


def _steps(tokenizer, caption: str, max_tokens: int) -> tuple[list[int], list[tuple[int, str]]]:
    """`(token ids, [(step, word) for each word kept and the end])`: a word's step is the decoding step that
    emits its first token (the start token's step emits the first token)."""
    ids, starts = encode_caption(tokenizer, caption, max_tokens)
    steps = [(start, word) for start, word in zip(starts, caption.split(), strict=True) if start is not None]
    return ids, [*steps, (len(ids), END)]


@torch.inference_mode()
def measure_attention(
    model,
    tokenizer,
    features: torch.Tensor,
    rows: list[dict],
    keys: list,
    batch_size: int,
    max_tokens: int,
    keep_maps: int = 0,
) -> dict:
    """Per test caption: `share_weighted`, `share_plain`, `share_chance` (means over the steps emitting an
    object's words; NaN without objects), `share_layers` (the weighted share per layer), `sink` (mean over
    every step), `gate` (`{word class: mean gate}`, NaN where the caption has no such word; `None` ungated).
    `maps`: for the first `keep_maps` captions, the words, the attention map of each step (gate-weighted
    mean over heads, mean over layers, `(keys,)`) and its gate value.

    Args:
        model: a trained captioner with eager attention (it must return its attention weights).
        features: `(n, keys, hidden)` cached encoder outputs of `rows`.
        keys: `object_key_sets(rows, ...)`.
    """
    device = next(model.parameters()).device
    start = start_and_end(tokenizer)[0]
    recorder = GateRecorder(model, "cross")
    captions, maps = [], []
    try:
        for first in range(0, len(rows), batch_size):
            batch = rows[first : first + batch_size]
            encoded = [_steps(tokenizer, row["caption"], max_tokens) for row in batch]
            length = max(len(ids) for ids, _ in encoded) + 1
            inputs = torch.full((len(batch), length), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(inputs)
            for i, (ids, _) in enumerate(encoded):
                inputs[i, : len(ids) + 1] = torch.tensor([start, *ids])
                mask[i, : len(ids) + 1] = 1
            out = model(
                encoder_outputs=(features[first : first + len(batch)].to(device, torch.float32),),
                decoder_input_ids=inputs.to(device),
                decoder_attention_mask=mask.to(device),
                output_attentions=True,
            )
            weights = (
                torch.stack(out.cross_attentions, dim=1).float().cpu()
            )  # (batch, layers, heads, steps, keys)
            if weights.isnan().any():
                raise RuntimeError("cross-attention weights hold NaN")
            gates = recorder.take()  # (batch, layers, steps, heads) or None
            gates = None if gates is None else gates.cpu()
            for i, (_, steps) in enumerate(encoded):
                index = first + i
                record = _caption_record(
                    weights[i], None if gates is None else gates[i], steps, batch[i], keys[index]
                )
                captions.append(record)
                if index < keep_maps:
                    maps.append(_maps(weights[i], None if gates is None else gates[i], steps))
    finally:
        recorder.remove()
    return {"captions": captions, "maps": maps}


def _caption_record(weights, gates, steps, row, keys) -> dict:
    """One caption's record (see `measure_attention`); `weights: (layers, heads, steps, keys)`, `gates:
    (layers, steps, heads)` or `None`, `steps`: `_steps`'s."""
    layers, _, _, key_count = weights.shape
    step_gates = (lambda step: None) if gates is None else (lambda step: gates[:, step])
    word_step = {position: step for position, (step, _) in enumerate(steps[:-1])}  # the words kept
    weighted, plain, chance, per_layer = [], [], [], []
    outside = torch.ones(key_count, dtype=torch.bool)
    for obj, obj_keys in zip(row["objects"] or [], keys or [], strict=True):
        outside &= ~obj_keys
        for step in (word_step[p] for p in obj["positions"] if p in word_step):
            w, p = object_share(weights[:, :, step], obj_keys, step_gates(step))
            weighted.append(w)
            plain.append(p)
            chance.append(obj_keys.sum().item() / key_count)
            g = step_gates(step)
            per_layer.append(
                [
                    object_share(
                        weights[layer : layer + 1, :, step],
                        obj_keys,
                        None if g is None else g[layer : layer + 1],
                    )[0]
                    for layer in range(layers)
                ]
            )
    record = {
        "share_weighted": mean_or_nan(weighted),
        "share_plain": mean_or_nan(plain),
        "share_chance": mean_or_nan(chance),
        "share_layers": np.mean(per_layer, axis=0).tolist() if per_layer else [math.nan] * layers,
        "sink": float(np.mean([sink_share(weights[:, :, step], outside) for step, _ in steps])),
        "gate": None,
    }
    if gates is not None:
        by_class: dict[str, list[float]] = {}
        for step, word in steps:
            cls = "end" if word == END else word_class(word)
            by_class.setdefault(cls, []).append(gates[:, step].double().mean().item())
        record["gate"] = {cls: mean_or_nan(by_class.get(cls, [])) for cls in WORD_CLASSES}
    return record


def _maps(weights, gates, steps) -> dict:
    """The map of each step: gate-weighted mean over heads (plain mean ungated), mean over layers."""
    out = {"words": [], "maps": [], "gates": None if gates is None else []}
    for step, word in steps:
        w = weights[:, :, step].double()  # (layers, heads, keys)
        if gates is None:
            heads = w.mean(1)
        else:
            g = gates[:, step].double()  # (layers, heads)
            heads = (g[..., None] * w).sum(1) / g.sum(-1, keepdim=True).clamp_min(1e-12)
            out["gates"].append(g.mean().item())
        out["words"].append(word)
        out["maps"].append(heads.mean(0).tolist())
    return out
