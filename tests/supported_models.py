"""The supported-models matrix: which model types of the zoo (`model_zoo.py`) `patch` serves, which it
refuses and why, and the README's table made from it.

    python tests/supported_models.py            # print the table
    python tests/supported_models.py --write    # rewrite it in README.md (tests/core/test_model_matrix.py
                                                # checks that README.md holds what this prints)
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from model_zoo import SWEPT, UNBUILT, UNCHECKED, ZOO, zoo_model

from hf_gate_attention import GateConfig, patch
from hf_gate_attention.core.families import find_attention

README = Path(__file__).parents[1] / "README.md"
START, END = "<!-- supported-models: start -->", "<!-- supported-models: end -->"

# zoo key -> (a part of the error `patch` raises, why in words) for the model types it refuses
REFUSED = {
    "qwen3_next": (
        "it already carries an output gate",
        "its attention already carries an output gate (a query projection twice as wide)",
    ),
    # swept types (model_zoo.SWEPT_MAPPINGS)
    "convbert": (
        "heads from the query projection",
        "its attention blocks do not have the geometry of a known layout",
    ),
    "cpmant": ("found no attention block", "no attention block follows a known layout"),
    "ctrl": ("found no attention block", "no attention block follows a known layout"),
    "deberta": ("found no attention block", "no attention block follows a known layout"),
    "deepseek_v4": ("found no attention block", "no attention block follows a known layout"),
    "efficientnet": ("found no attention block", "no attention block follows a known layout"),
    "falcon_mamba": ("found no attention block", "no attention block follows a known layout"),
    "fnet": ("found no attention block", "no attention block follows a known layout"),
    "focalnet": ("found no attention block", "no attention block follows a known layout"),
    "funnel": ("found no attention block", "no attention block follows a known layout"),
    "ibert": ("found no attention block", "no attention block follows a known layout"),
    "inkling2_loop_text": ("found no attention block", "no attention block follows a known layout"),
    "inkling2_text": ("found no attention block", "no attention block follows a known layout"),
    "jetmoe": ("found no attention block", "no attention block follows a known layout"),
    "lfm3": ("found no attention block", "no attention block follows a known layout"),
    "mamba": ("found no attention block", "no attention block follows a known layout"),
    "mimo_v2_flash": (
        "key and value projections differ in width",
        "its attention blocks do not have the geometry of a known layout",
    ),
    "minicpm5_moe": ("found no attention block", "no attention block follows a known layout"),
    "mobilenet_v1": ("found no attention block", "no attention block follows a known layout"),
    "mobilenet_v2": ("found no attention block", "no attention block follows a known layout"),
    "modernbert-decoder": ("found no attention block", "no attention block follows a known layout"),
    "olmo_hybrid": (
        "key and value projections differ in width",
        "its attention blocks do not have the geometry of a known layout",
    ),
    "perceiver": (
        "key and value projections differ in width",
        "its attention blocks do not have the geometry of a known layout",
    ),
    "prophetnet": ("found no attention block", "no attention block follows a known layout"),
    "rwkv": ("found no attention block", "no attention block follows a known layout"),
    "squeezebert": ("found no attention block", "no attention block follows a known layout"),
    "swiftformer": ("found no attention block", "no attention block follows a known layout"),
    "xlnet": ("found no attention block", "no attention block follows a known layout"),
    "longformer": (
        "projects its input sequence-first",
        "its self-attention projects its input sequence-first and computes global attention through "
        "projections of its own",
    ),
}
# zoo key -> (the variants its layout serves, a part of the error for the others)
LIMITED_VARIANTS = {
    "deepseek_v3": (("output",), "has no per-head key or value projection"),
    "hy_v4": (("output",), "has no per-head key or value projection"),
    "diffllama": (("output", "qk"), "joins its value heads in pairs"),
}
# zoo key -> what `patch` warns it leaves ungated (module names of the unknown attention), for partial models
PARTLY_GATED = {
    "led": "led.encoder.layers.0.self_attn",
    "minimax": "model.layers.1.self_attn",  # lightning (linear) attention
    "siglip": "vision_model.head.attention",
}
SERVED = tuple(key for key in ZOO if key not in REFUSED)


def model_of_unknown_layout():
    """A tiny Llama whose attention no layout describes: its output projections replaced by `nn.Identity`."""
    model = zoo_model("llama")
    for layer in model.model.layers:
        layer.self_attn.o_proj = torch.nn.Identity()
    return model


def kinds_of(model) -> tuple[str, ...]:
    """Every attention kind the model has (`GateConfig.attention` that gates all of its attention)."""
    return tuple(sorted({block.kind for block in find_attention(model)}))


def gate_everything(model, sparse: bool | None = None, backend: str = "auto", **overrides):
    """`patch` with gates on every attention block the model has (cross-attention included), `overrides`
    replacing `GateConfig` fields; the warning about attention of unknown layout (`PARTLY_GATED`) muted."""
    config = GateConfig(**{"attention": kinds_of(model), **overrides})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="gated attention: .* look like attention")
        return patch(model, config, sparse=sparse, backend=backend)


def _layout(block) -> str:
    family = block.family
    fused = " (fused per key/value group)" if family.qkv_layout == "grouped" else ""
    if family.qkv_chunks:
        fused = f" (fused: {', '.join(family.qkv_order)} in each of `{family.qkv_chunks}` chunks)"
    return " / ".join(f"`{path}`" for path in family.paths) + fused


def rows() -> list[str]:
    """One Markdown row per zoo entry: model type, class, attention found (kind, stack, layout), status."""
    lines = []
    for key in ZOO:
        model = zoo_model(key)
        name = type(model).__name__
        if key in REFUSED:
            lines.append(f"| {key} | {name} | - | refused: {REFUSED[key][1]} |")
            continue
        blocks = find_attention(model)
        stacks = {}
        for block in blocks:
            heads = f"{block.geometry['num_heads']}/{block.geometry['num_kv_heads']}"
            stacks.setdefault(block.stack, (block.kind, _layout(block), heads))
        found = "<br>".join(f"{kind}: `{stack}` {layout}" for stack, (kind, layout, _) in stacks.items())
        status = "served" if key not in PARTLY_GATED else f"served; not gated: `{PARTLY_GATED[key]}` ..."
        if key in LIMITED_VARIANTS:
            served = LIMITED_VARIANTS[key][0]
            status += f"; variant{'s' * (len(served) > 1)} {', '.join(f'`{v}`' for v in served)} only"
        lines.append(f"| {key} | {name} | {found} | {status} |")
    for key, spec in SWEPT.items():
        start = f"| {key} | {spec.auto_class.__name__} | - |"
        if key in UNBUILT:
            why = UNBUILT[key].replace("|", "/")
            lines.append(f"{start} not tested: its shrunk default config does not build and run: {why} |")
        elif key in UNCHECKED:
            lines.append(f"{start} patched, not checked here: {UNCHECKED[key]} |")
    return lines


def table() -> str:
    header = [
        "| model type (tested) | class | attention blocks found (kind: stack, projections) | status |",
        "|---|---|---|---|",
    ]
    return "\n".join([START, *header, *rows(), END])


def readme_table() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index(START) : text.index(END) + len(END)]


if __name__ == "__main__":
    generated = table()
    if "--write" in sys.argv:
        text = README.read_text(encoding="utf-8")
        README.write_text(text.replace(readme_table(), generated), encoding="utf-8")
    print(generated)
