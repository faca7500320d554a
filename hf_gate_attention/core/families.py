"""Model families described as data: where the self-attention blocks and their projections are.

A family names, relative to each self-attention block, the module that produces the queries, keys and values
and the output projection whose *input* is the attention output (heads concatenated, head-major). The gates
hook these modules, so they work under every attention implementation without re-deriving masks or rotary
embeddings. Register your own with `register_family`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionFamily:
    """Where gated attention attaches in one model family.

    Args:
        block (`str`):
            Regular expression matched against the end of module names (`model.named_modules()`) that selects
            the self-attention blocks; its first group is the layer index. Cross-attention must not match.
        query, key, value (`str`):
            Paths, relative to the block, of the query/key/value projections. A fused projection (one module
            producing `[q | k | v]` along the last dim, as in Phi-3) is given by the same path three times.
        output (`str`):
            Path of the output projection; its input is the attention output `(batch, seq, heads * head_dim)`.
        num_heads_attr, num_kv_heads_attr (`str`):
            Config attributes with the number of query heads and key/value heads (the latter may be absent:
            then it equals the number of query heads). `head_dim` is read off the output projection's width.
    """

    block: str
    query: str
    key: str
    value: str
    output: str
    num_heads_attr: str = "num_attention_heads"
    num_kv_heads_attr: str = "num_key_value_heads"

    def __post_init__(self):
        pattern = re.compile(self.block)
        if pattern.groups < 1:
            raise ValueError(f"AttentionFamily.block={self.block!r} needs a group capturing the layer index")

    @property
    def fused_qkv(self) -> bool:
        return self.query == self.key == self.value

    def match_block(self, module_name: str) -> int | None:
        """The layer index if `module_name` is a self-attention block of this family, else `None`."""
        found = re.search(rf"(?:^|\.){self.block}$", module_name)
        return int(found.group(1)) if found else None


DECODER = AttentionFamily(
    block=r"layers\.(\d+)\.self_attn", query="q_proj", key="k_proj", value="v_proj", output="o_proj"
)
DECODER_FUSED_QKV = AttentionFamily(
    block=r"layers\.(\d+)\.self_attn", query="qkv_proj", key="qkv_proj", value="qkv_proj", output="o_proj"
)
BERT = AttentionFamily(
    block=r"layer\.(\d+)\.attention",
    query="self.query",
    key="self.key",
    value="self.value",
    output="output.dense",
)
VIT = AttentionFamily(
    block=r"layers?\.(\d+)\.attention", query="q_proj", key="k_proj", value="v_proj", output="o_proj"
)

_FAMILIES: dict[str, AttentionFamily] = {
    "bert": BERT,
    "roberta": BERT,
    "vit": VIT,
    "dinov2": VIT,
    "llama": DECODER,
    "mistral": DECODER,
    "qwen2": DECODER,
    "qwen3": DECODER,
    "gemma": DECODER,
    "gemma2": DECODER,
    "gemma3_text": DECODER,
    "phi3": DECODER_FUSED_QKV,
}


def register_family(model_type: str, family: AttentionFamily, *, overwrite: bool = False) -> None:
    """Teach the patcher a new `config.model_type`; refuses to replace an existing one unless `overwrite`."""
    if not isinstance(family, AttentionFamily):
        raise TypeError(f"family must be an AttentionFamily, got {type(family).__name__}")
    if model_type in _FAMILIES and not overwrite:
        raise ValueError(
            f"model type {model_type!r} is already registered; pass overwrite=True to replace it"
        )
    _FAMILIES[model_type] = family


def supported_model_types() -> list[str]:
    """The `config.model_type` values `patch` accepts."""
    return sorted(_FAMILIES)


def family_for(model_type: str) -> AttentionFamily:
    if model_type not in _FAMILIES:
        raise ValueError(
            f"model type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}. "
            "Describe its attention layout with "
            "hf_gate_attention.register_family(model_type, AttentionFamily(...))."
        )
    return _FAMILIES[model_type]
