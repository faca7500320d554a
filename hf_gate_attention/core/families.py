"""Where the attention blocks of a model are: attention layouts described as data, and the structural search
that finds every block of a known layout in any transformers model, its geometry read from the config that
belongs to it and checked against the projections' shapes.

A layout (`AttentionFamily`) names, relative to an attention block, the modules that produce the queries,
keys and values and the output projection whose *input* is the attention output (heads concatenated,
head-major). The gates hook these modules, so they work under every attention implementation without
re-deriving masks or rotary embeddings. A model is served without registration when its blocks follow one of
`LAYOUTS`; `register_family(model_type, ...)` (the per-type table, for exceptions) overrides the search.

This module needs only torch: it ships as remote code with the gate runtime (see `sharing/saving.py`).
"""

from __future__ import annotations

import dis
import inspect
import re
from dataclasses import dataclass, field

from torch import nn

QKV_ROLES = ("query", "key", "value")  # also the order of the parts of a fused projection's output
QKV_LAYOUTS = ("concatenated", "grouped")
ATTENTION_KINDS = ("encoder", "decoder", "cross")
# last name of a block that is cross-attention although no `is_cross_attention` attribute says so (T5, BART)
CROSS_ATTENTION_NAMES = ("encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "cross_attention")
# where a block, or the module holding its projections, keeps its number of query heads
NUM_HEADS_ATTRIBUTES = ("num_heads", "num_attention_heads", "n_heads", "n_head")


@dataclass(frozen=True, kw_only=True)
class AttentionFamily:
    """Where gated attention attaches in one attention layout.

    Args:
        query, key, value (`str`):
            Paths, relative to the block, of the query/key/value projections. A fused projection is given by
            the same path for each role it plays (`qkv_proj` three times; GPT-2's cross-attention `c_attn` as
            key and value). `key = value = None`: no per-head key/value projection (DeepSeek's latent
            attention); `query` is then the projection that reads the block's input `x`.
        output (`str`):
            Path of the output projection; its input is the attention output `(batch, seq, heads * head_dim)`.
        qkv_layout (`str`, *optional*, defaults to `"concatenated"`):
            How a fused projection lays out its output. `"concatenated"`: `[q | k | v]` (Phi-3, GPT-2,
            ModernBERT). `"grouped"`: per key/value group, that group's query heads, then its key head, then
            its value head, each `head_dim` wide (GPT-NeoX: groups of one query head; Falcon).
        qkv_order (`tuple[str]`, *optional*): the order of the roles' parts in a fused projection's output
            (defaults to `QKV_ROLES`; CodeGen: query, value, key).
        qkv_chunks (`str`, *optional*): for a `"concatenated"` fused projection split into model-parallel
            chunks, each `[parts in qkv_order]` holding its share of every role's heads: the block attribute
            with the number of chunks (CodeGen's `mp_num`); a block without it does not have this layout.
        block (`str`, *optional*):
            Regular expression matched against the end of module names that selects the blocks; its first
            group is the layer index. `None` (the built-in layouts): any module holding these projections.
        variants (`tuple[str]`, *optional*): the gate variants this layout can serve (`None`: all), and
        limits (`str`): why it cannot serve the others, for the error.
        marker (`str`, *optional*): a path that must exist too for a block to have this layout.
        num_heads_attr (`str`):
            Config attribute with the number of query heads, read when neither the block nor its query
            projection's parent module carries one of `NUM_HEADS_ATTRIBUTES`. The key/value heads and
            `head_dim` are read off the projections' shapes, and checked.
    """

    query: str
    key: str | None
    value: str | None
    output: str
    qkv_layout: str = "concatenated"
    qkv_order: tuple[str, ...] = QKV_ROLES
    qkv_chunks: str | None = None
    block: str | None = None
    variants: tuple[str, ...] | None = None
    limits: str = ""
    marker: str | None = None
    num_heads_attr: str = "num_attention_heads"

    def __post_init__(self):
        if self.block is not None:
            try:
                groups = re.compile(self.block).groups
            except re.error as err:
                raise ValueError(
                    f"AttentionFamily.block={self.block!r} is not a regular expression: {err}"
                ) from None
        if self.block is not None and groups < 1:
            raise ValueError(f"AttentionFamily.block={self.block!r} needs a group capturing the layer index")
        if self.qkv_layout not in QKV_LAYOUTS:
            raise ValueError(
                f"AttentionFamily.qkv_layout={self.qkv_layout!r} is not valid; "
                f"accepted: {', '.join(QKV_LAYOUTS)}"
            )
        if sorted(self.qkv_order) != sorted(QKV_ROLES):
            raise ValueError(
                f"AttentionFamily.qkv_order={self.qkv_order!r} is not valid; accepted: an ordering of "
                f"{', '.join(QKV_ROLES)}"
            )
        if self.qkv_chunks is not None and self.qkv_layout != "concatenated":
            raise ValueError(
                f"AttentionFamily.qkv_chunks={self.qkv_chunks!r} needs qkv_layout='concatenated' (a grouped "
                "layout is chunked per key/value group already)"
            )

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths of its projections, each once (query first, output last)."""
        return tuple(
            dict.fromkeys(p for p in (self.query, self.key, self.value, self.output) if p is not None)
        )

    @property
    def fused_qkv(self) -> bool:
        """Whether one module produces queries, keys and values."""
        return self.query == self.key == self.value

    def roles_of(self, path: str) -> tuple[str, ...]:
        """The roles that the projection at `path` plays, in the order of their parts (`qkv_order`)."""
        return tuple(role for role in self.qkv_order if getattr(self, role) == path)

    def chunks(self, block: nn.Module, num_kv_heads: int) -> int:
        """How many chunks a fused projection's output of `block` is laid out in: one per key/value group
        (`"grouped"`), the block's `qkv_chunks` attribute, or 1."""
        if self.qkv_layout == "grouped":
            return num_kv_heads
        return getattr(block, self.qkv_chunks) if self.qkv_chunks else 1

    def match_block(self, module_name: str) -> int | None:
        """The layer index if `module_name` matches `block` (a registered family), else `None`."""
        found = re.search(rf"(?:^|\.){self.block}$", module_name) if self.block else None
        return int(found.group(1)) if found else None


def _family(query: str, key: str | None, value: str | None, output: str, **kwargs) -> AttentionFamily:
    return AttentionFamily(query=query, key=key, value=value, output=output, **kwargs)


_OUTPUT_ONLY_LATENT = {
    "variants": ("output",),
    "limits": "multi-head latent attention has no per-head key or value projection (its keys and values "
    "come out of a shared latent)",
}

# The layouts the structural search knows, most specific first (a block is claimed by the first that fits).
# A new layout is one entry; the comments name model types of transformers 5.25 that use it.
LAYOUTS: tuple[AttentionFamily, ...] = (
    # DiffLlama: differential attention joins value heads in pairs (`torch.chunk` over the heads), so a gate
    # per key/value head would reach halves of other heads
    _family(
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        marker="groupnorm",
        variants=("output", "qk"),
        limits="differential attention joins its value heads in pairs, so a value gate would not gate whole "
        "heads",
    ),
    # Longformer: projects its input sequence-first, beside separate global-attention projections
    _family(
        "self.query",
        "self.key",
        "self.value",
        "output.dense",
        marker="self.query_global",
        variants=(),
        limits="Longformer's self-attention projects its input sequence-first (length, batch) and computes "
        "global attention through projections of its own, which the gates do not follow",
    ),
    # Llama, Mistral, Qwen, Gemma, OLMo, Granite, Mixtral and the MoE decoders, Cohere, GLM-4, ViT, DINOv2
    _family("q_proj", "k_proj", "v_proj", "o_proj"),
    # BART, mBART, Pegasus, Marian, Whisper, CLIP, SigLIP, GPT-J, OPT
    _family("q_proj", "k_proj", "v_proj", "out_proj"),
    _family("q_proj", "k_proj", "v_proj", "dense"),  # Phi, StableLM (older code)
    _family("self.query", "self.key", "self.value", "output.dense"),  # BERT, RoBERTa, ELECTRA, DeiT, Swin
    _family("self.query_proj", "self.key_proj", "self.value_proj", "output.dense"),  # DeBERTa-v2
    _family("attention.query", "attention.key", "attention.value", "output.dense"),  # Data2Vec-vision, BEiT
    _family("q_lin", "k_lin", "v_lin", "out_lin"),  # DistilBERT
    _family("q", "k", "v", "o"),  # T5, mT5, LongT5
    _family("qkv_proj", "qkv_proj", "qkv_proj", "o_proj"),  # Phi-3
    # CodeGen: [q | v | k] in each of `mp_num` model-parallel chunks
    _family(
        "qkv_proj",
        "qkv_proj",
        "qkv_proj",
        "out_proj",
        qkv_order=("query", "value", "key"),
        qkv_chunks="mp_num",
    ),
    _family("Wqkv", "Wqkv", "Wqkv", "Wo"),  # ModernBERT
    _family("q_attn", "c_attn", "c_attn", "c_proj"),  # GPT-2 cross-attention (keys and values fused)
    _family("c_attn", "c_attn", "c_attn", "c_proj"),  # GPT-2 self-attention (Conv1D)
    _family("query_key_value", "query_key_value", "query_key_value", "dense", qkv_layout="grouped"),  # NeoX
    _family("query", "key", "value", "dense"),  # ALBERT (projections on the block itself)
    # DeepSeek-V2/V3 latent attention: the output gate reads the block's input through the first query
    # projection; keys and values come out of a shared latent (no per-head projection to gate or read)
    *(
        _family(query, None, None, "o_proj", marker="kv_a_proj_with_mqa", **_OUTPUT_ONLY_LATENT)
        for query in ("q_a_proj", "q_proj")
    ),
)

# The decoder layout by name (`model.layers.N.self_attn`): what the paper's and Qwen3-Next's checkpoint
# layouts hold (`sharing/layouts`).
DECODER = _family("q_proj", "k_proj", "v_proj", "o_proj", block=r"layers\.(\d+)\.self_attn")

# The model types the test matrix patches and checks (tests/core/test_model_matrix.py, which keeps this list
# and the README's table true); any other whose blocks follow `LAYOUTS` is served too.
TESTED_MODEL_TYPES: tuple[str, ...] = (
    "afmoe",
    "albert",
    "apertus",
    "apertus1p5_text",
    "arcee",
    "aria_text",
    "bart",
    "beam",
    "beit",
    "bert",
    "bert-generation",
    "big_bird",
    "bigbird_pegasus",
    "biogpt",
    "bitnet",
    "blenderbot",
    "blenderbot-small",
    "bloom",
    "camembert",
    "clip",
    "codegen",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "cwm",
    "data2vec-text",
    "data2vec-vision",
    "deberta-v2",
    "deepseek_v3",
    "deit",
    "diffllama",
    "dinov2",
    "dinov2_with_registers",
    "distilbert",
    "doge",
    "electra",
    "encoder-decoder",
    "ergo",
    "ernie",
    "ernie4_5",
    "ernie4_5_moe",
    "eurobert",
    "exaone",
    "exaone4",
    "exaone_moe",
    "falcon",
    "falcon_h1",
    "flaubert",
    "flex_olmo",
    "flint",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gemma4_text",
    "gemma4_unified_text",
    "glm",
    "glm4",
    "glm4_moe",
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "gpt_neox_japanese",
    "gpt_oss",
    "gptj",
    "granite",
    "granite_swa",
    "granitemoe",
    "granitemoe_swa",
    "granitemoeshared",
    "gte",
    "helium",
    "hrm_text",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "hy_v3",
    "hy_v4",
    "hyperclovax",
    "ijepa",
    "inkling_text",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jina_embeddings_v3",
    "kolibri1",
    "laguna",
    "lara_mini",
    "layoutlm",
    "led",
    "lfm2",
    "llama",
    "llama4_text",
    "llava",
    "longt5",
    "luke",
    "marian",
    "mbart",
    "megatron-bert",
    "mellum",
    "minimax",
    "minimax_m2",
    "minimax_m3_vl_text",
    "ministral",
    "ministral3",
    "mistral",
    "mixtral",
    "mobilebert",
    "mobilevit",
    "modernbert",
    "mpnet",
    "mt5",
    "mvp",
    "nanochat",
    "nemotron",
    "nemotron_h",
    "nomic_bert",
    "nystromformer",
    "olmo",
    "olmo2",
    "olmo3",
    "olmoe",
    "openai-gpt",
    "opt",
    "param2moe",
    "pegasus",
    "persimmon",
    "phi",
    "phi3",
    "phimoe",
    "plbart",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "rembert",
    "roberta",
    "roberta-prelayernorm",
    "roc_bert",
    "roformer",
    "sarvam_moe",
    "seed_oss",
    "siglip",
    "smollm3",
    "solar_open",
    "stablelm",
    "starcoder2",
    "swin",
    "t5",
    "tapas",
    "trocr",
    "ultrabert",
    "vaultgemma",
    "vision-encoder-decoder",
    "vit",
    "vit_msn",
    "whisper",
    "xglm",
    "xlm",
    "xlm-roberta",
    "xlm-roberta-xl",
    "yoso",
)

# The exceptions: model types whose blocks a registered family describes instead of the structural search.
_FAMILIES: dict[str, AttentionFamily] = {}


def register_family(model_type: str, family: AttentionFamily, *, overwrite: bool = False) -> None:
    """Describe the attention of `config.model_type` by hand (for layouts the structural search does not
    know); refuses to replace an existing registration unless `overwrite`."""
    if not isinstance(family, AttentionFamily):
        raise TypeError(f"family must be an AttentionFamily, got {type(family).__name__}")
    if family.block is None:
        raise ValueError("a registered AttentionFamily needs `block`, the pattern of its blocks' names")
    if model_type in _FAMILIES and not overwrite:
        raise ValueError(
            f"model type {model_type!r} is already registered; pass overwrite=True to replace it"
        )
    _FAMILIES[model_type] = family


def registered_family(model_type: str) -> AttentionFamily | None:
    """The family registered for `model_type`, or `None` (then the structural search runs)."""
    return _FAMILIES.get(model_type)


def supported_model_types() -> list[str]:
    """The `config.model_type` values tested (`TESTED_MODEL_TYPES`) or registered (`register_family`)."""
    return sorted(set(TESTED_MODEL_TYPES) | set(_FAMILIES))


def projection_features(module: nn.Module) -> tuple[int, int] | None:
    """`(in_features, out_features)` of a projection: a Linear (also bitsandbytes' and PEFT-wrapped ones) or
    GPT-2's `Conv1D` (weight stored `(in, out)`); `None` for any other module."""
    base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    if isinstance(base, nn.Linear):
        return base.in_features, base.out_features
    if type(base).__name__ == "Conv1D" and getattr(base, "weight", None) is not None:
        return tuple(base.weight.shape)
    return None


def _child(module: nn.Module, path: str) -> nn.Module | None:
    for name in path.split("."):
        module = module._modules.get(name) if module is not None else None
    return module


@dataclass
class AttentionBlock:
    """One attention block found in a model.

    Args:
        name (`str`): its module name in the model (`model.decoder.layers.3.encoder_attn`).
        module (`nn.Module`): the block.
        family (`AttentionFamily`): its layout.
        kind (`str`): `"encoder"` (bidirectional self-attention), `"decoder"` (causal self-attention) or
            `"cross"` (cross-attention; its queries come from the decoder's hidden state).
        index (`int`): its layer index: its place among the blocks whose names differ from its own only in
            numbers (its stack: `model.encoder.layers.N.self_attn`), in module order.
        geometry (`dict`): `hidden_size` (the width entering the query projection), `num_heads`,
            `num_kv_heads`, `head_dim`.
        part_config: the config of the model part holding the block (a vision tower's, a text model's).
    """

    name: str
    module: nn.Module
    family: AttentionFamily
    kind: str
    index: int
    geometry: dict = field(default_factory=dict)
    part_config: object = None

    @property
    def stack(self) -> str:
        """The block's name with every number replaced by `N`: the same for every layer of its stack."""
        return re.sub(r"(?<=\.)\d+(?=\.|$)", "N", self.name)


def _layout_of(module: nn.Module) -> AttentionFamily | None:
    for family in LAYOUTS:
        if family.marker is not None and _child(module, family.marker) is None:
            continue
        if family.qkv_chunks is not None and not isinstance(getattr(module, family.qkv_chunks, None), int):
            continue
        children = [_child(module, path) for path in family.paths]
        if all(child is not None and projection_features(child) for child in children):
            return family
    return None


def _kind(name: str, block: nn.Module) -> str:
    """Cross-attention, causal self-attention (decoder) or bidirectional self-attention (encoder): from the
    block's last name (`CROSS_ATTENTION_NAMES`) and the attributes transformers sets on attention modules
    (`is_cross_attention`; `is_causal` or `is_decoder`, the self-attention of a decoder being causal)."""
    modules = [m for m in block.modules() if projection_features(m) is None]
    if name.rsplit(".", 1)[-1] in CROSS_ATTENTION_NAMES or any(
        getattr(m, "is_cross_attention", False) is True for m in modules
    ):
        return "cross"
    causal = any(getattr(m, flag, False) is True for m in modules for flag in ("is_causal", "is_decoder"))
    return "decoder" if causal else "encoder"


def _num_heads(block: nn.Module, family: AttentionFamily, config) -> tuple[int | None, str]:
    """The number of query heads and where it was read: the block, the module holding the query projection,
    the block's own `config`, or the config of the model part holding the block."""
    holder = _child(block, family.query.rpartition(".")[0]) if "." in family.query else block
    for module, where in ((block, "the block"), (holder, "the query projection's module")):
        for attribute in NUM_HEADS_ATTRIBUTES:
            value = getattr(module, attribute, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value, f"{where}'s {attribute}"
    config = getattr(block, "config", None) or config
    value = getattr(config, family.num_heads_attr, None)
    return value, f"config.{family.num_heads_attr} of {type(config).__name__}"


def block_geometry(name: str, block: nn.Module, family: AttentionFamily, config) -> dict:
    """`hidden_size`, `num_heads`, `num_kv_heads`, `head_dim` of one block, checked against its projections'
    shapes (`ValueError` naming what disagrees). `config` is the config of the model part holding it."""
    features = {path: projection_features(_child(block, path)) for path in family.paths}
    num_heads, source = _num_heads(block, family, config)
    attn_width = features[family.output][0]
    if not isinstance(num_heads, int) or num_heads < 1 or attn_width % num_heads:
        raise ValueError(
            f"attention block {name}: {num_heads!r} query heads ({source}) do not divide its output "
            f"projection's input width {attn_width}"
        )
    head_dim = attn_width // num_heads
    q_size = num_heads * head_dim
    if family.key is None:  # latent attention: one key/value head per query head, nothing else to check
        return {"hidden_size": features[family.query][0], "num_heads": num_heads, "num_kv_heads": num_heads,
                "head_dim": head_dim}  # fmt: skip
    if family.fused_qkv:
        kv_width = (features[family.query][1] - q_size) / 2
    elif family.key == family.value:
        kv_width = features[family.key][1] / 2
    else:
        kv_width = features[family.key][1]
        if features[family.value][1] != kv_width:
            raise ValueError(f"attention block {name}: key and value projections differ in width")
    num_kv_heads = kv_width / head_dim
    query_out = q_size if family.fused_qkv else features[family.query][1]
    problems = []
    if query_out == 2 * q_size:
        problems.append(
            "its query projection is twice as wide as its heads: it already carries an output gate "
            "(qwen3_next, qwen3_5): it is a gated model already; hf_gate_attention.sharing.layouts converts "
            "such checkpoints to and from a patched qwen3"
        )
    elif query_out != q_size:
        problems.append(f"its query projection is {query_out} wide, not heads x head_dim = {q_size}")
    if num_kv_heads < 1 or num_kv_heads != int(num_kv_heads) or num_heads % int(num_kv_heads):
        problems.append(
            f"its key/value width {kv_width:g} is not a divisor of the query heads times {head_dim}"
        )
    elif family.fused_qkv and int(num_kv_heads) % family.chunks(block, int(num_kv_heads)):
        problems.append(
            f"its fused projection's {family.chunks(block, int(num_kv_heads))} chunks ({family.qkv_chunks}) "
            f"do not divide its {int(num_kv_heads)} key/value heads"
        )
    if problems:
        raise ValueError(
            f"attention block {name} ({num_heads} heads from {source}, head_dim {head_dim}): "
            + "; ".join(problems)
        )
    return {
        "hidden_size": features[family.query][0],
        "num_heads": num_heads,
        "num_kv_heads": int(num_kv_heads),
        "head_dim": head_dim,
    }


def _part_configs(model: nn.Module) -> dict[str, object]:
    """Module name -> config of every module that carries one (the model and its parts: a vision tower, a
    language model, an encoder): the config that belongs to a block is that of the nearest one above it."""
    return {
        name: module.config
        for name, module in model.named_modules()
        if hasattr(getattr(module, "config", None), "to_dict")
    }


def _nearest(configs: dict, name: str):
    while True:
        if name in configs:
            return configs[name]
        if not name:
            return None
        name = name.rpartition(".")[0]


def find_attention(model: nn.Module, family: AttentionFamily | None = None) -> list[AttentionBlock]:
    """Every attention block of `model`, in module order, each found once.

    With `family` (a registered one), the blocks are the modules whose names match its `block` pattern;
    otherwise any module whose projections fit one of `LAYOUTS` (the modules inside a found block are not
    searched again). Raises `ValueError` when a block's geometry disagrees with its projections.
    """
    configs = _part_configs(model)
    found: list[tuple[str, nn.Module, AttentionFamily]] = []
    inside = None
    for name, module in model.named_modules():
        if inside is not None and name.startswith(inside):
            continue
        layout = (family if family.match_block(name) is not None else None) if family else _layout_of(module)
        if layout is not None:
            found.append((name, module, layout))
            inside = f"{name}." if name else ""
    blocks, stacks = [], {}
    for name, module, layout in found:
        config = _nearest(configs, name)
        geometry = block_geometry(name, module, layout, config)
        block = AttentionBlock(name, module, layout, _kind(name, module), 0, geometry, config)
        block.index = layout.match_block(name) if family else stacks.setdefault(block.stack, 0)
        stacks[block.stack] = block.index + 1
        blocks.append(block)
    return blocks


def unrecognised_attention(model: nn.Module, blocks: list[AttentionBlock]) -> list[str]:
    """Names of modules that look like attention (a class name ending in `Attention`) but are neither a found
    block, nor inside one, nor hold one: what the search did not understand."""
    found = [block.name for block in blocks]
    names = []
    for name, module in model.named_modules():
        if not type(module).__name__.endswith("Attention") or not name:
            continue
        related = any(
            name == other or name.startswith(f"{other}.") or other.startswith(f"{name}.") for other in found
        )
        if not related:
            names.append(f"{name} ({type(module).__name__})")
    return names


def modules_on_attention_output(block: nn.Module, family: AttentionFamily) -> list[str]:
    """The child modules that the block's own forward calls on the attention output before its output
    projection (BitNet's `attn_sub_norm`, DiffLlama's `groupnorm`), read off its bytecode: those it loads
    after it looks up `ALL_ATTENTION_FUNCTIONS` and before the output projection, dropout and identities
    aside. Empty for a block whose forward does not both look up the attention function and call its output
    projection (BERT's `output.dense` runs in the parent's forward)."""
    names = [
        (instruction.opname, instruction.argval)
        for instruction in dis.get_instructions(inspect.unwrap(type(block).forward))
        if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL")
    ]
    lookups = [i for i, (_, name) in enumerate(names) if name == "ALL_ATTENTION_FUNCTIONS"]
    if "." in family.output or not lookups:
        return []
    after = [name for opname, name in names[lookups[-1] + 1 :] if opname != "LOAD_GLOBAL"]
    if family.output not in after:
        return []
    return [
        name
        for name in dict.fromkeys(after[: after.index(family.output)])
        if isinstance(block._modules.get(name), nn.Module)
        and not isinstance(block._modules[name], (nn.Dropout, nn.Identity))
    ]


def uses_attention_interface(block: nn.Module) -> bool:
    """Whether the block computes attention through transformers' attention interface (a forward that reads
    `ALL_ATTENTION_FUNCTIONS`), so that an attention implementation of ours replaces it."""
    for module in block.modules():
        forward = inspect.unwrap(type(module).forward)
        if "ALL_ATTENTION_FUNCTIONS" in getattr(getattr(forward, "__code__", None), "co_names", ()):
            return True
    return False
