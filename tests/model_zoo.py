"""A zoo of tiny random models of many transformers model types, for parametrized test matrices.

`ZOO` maps a key (a transformers `model_type`, or a variant of one such as "falcon-mqa") to a `ZooSpec`;
`zoo_model` builds the model (eval mode, float32, seeded) and `zoo_inputs` makes inputs of the right kind.
Sizes: hidden 32, 4 attention heads and 2 key/value heads where the config has GQA, head_dim 8, 2 layers
(2 encoder + 2 decoder layers for encoder-decoders), intermediate 37 (MoE experts 40 or 24: see `_MOE`),
vocabulary 99 with pad 0 / bos 1 / eos 2 (decoder_start_token_id set for encoder-decoders), dropout 0,
30x30 images of 10x10 patches (dinov2 28x28 / 14, swin 32x32 / 4), MoE: 4 experts, top-2; sliding and
chunked attention windows (8) shorter than the inputs. Each builds and runs in well under a second on a CPU.
Nothing is loaded from the Hub.

    model = zoo_model("qwen2")
    outputs = model(**zoo_inputs("qwen2"))
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import PretrainedConfig

VOCAB = 99
SPECIAL_IDS = (0, 1, 2)  # pad, bos, eos
IMAGE = {"image_size": 30, "patch_size": 10, "num_channels": 3}

INPUT_KINDS = (
    "text",  # input_ids
    "image",  # pixel_values
    "seq2seq",  # input_ids + decoder_input_ids
    "speech",  # input_features (whisper) + decoder_input_ids
    "image-to-text",  # pixel_values + decoder_input_ids
    "image-text",  # input_ids + pixel_values: clip/siglip; llava's input_ids hold its image tokens
    "decoder",  # input_ids + encoder_hidden_states: the causal-LM decoder of an encoder-decoder family
)


@dataclass(frozen=True)
class ZooSpec:
    """`config(**overrides)` returns the transformers config; `auto_class.from_config` builds the model (an
    Auto class, or a model class such as `EncoderDecoderModel`); `inputs` is one of `INPUT_KINDS`;
    `generates`: the model supports `model.generate`."""

    config: Callable[..., PretrainedConfig]
    auto_class: Any
    inputs: str
    generates: bool = False


def _for_model(model_type: str, **kwargs) -> Callable[..., PretrainedConfig]:
    """A config factory: `AutoConfig.for_model(model_type, **kwargs)`, the keyword overrides last."""

    def config(**overrides) -> PretrainedConfig:
        return transformers.AutoConfig.for_model(model_type, **{**kwargs, **overrides})

    return config


_TEXT = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DECODER = {
    **_TEXT,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}
_NO_HEAD_DIM = {k: v for k, v in _DECODER.items() if k != "head_dim"}  # head_dim = hidden / heads
_SLIDING_FULL = ["sliding_attention", "full_attention"]
# Experts run through torch._grouped_mm by default, which needs 16-byte aligned strides: expert sizes are
# multiples of 8 (odd sizes fail with "strides should be multiple of 16 bytes").
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 24}
_ENCODER = {
    **_TEXT,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
_VISION = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    **IMAGE,
}
_BART = {  # bart, mbart, pegasus, marian, led: d_model / encoder_* / decoder_*
    **_TEXT,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 37,
    "decoder_ffn_dim": 37,
    "max_position_embeddings": 64,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "decoder_start_token_id": 2,
}
_T5 = {  # t5, mt5, longt5 (no bos; the decoder starts from pad)
    **_TEXT,
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 37,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 16,
    "dropout_rate": 0.0,
    "decoder_start_token_id": 0,
}
_CLIP_TOWER = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "attention_dropout": 0.0,
}

_GPT2 = {
    **_TEXT,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": 37,
    "n_positions": 64,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}
_FALCON = {
    **_TEXT,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "ffn_hidden_size": 37,
    "max_position_embeddings": 64,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}


def _clip(**overrides) -> PretrainedConfig:
    return transformers.CLIPConfig(
        text_config={**_CLIP_TOWER, **_TEXT, "max_position_embeddings": 16},
        vision_config={**_CLIP_TOWER, **IMAGE},
        projection_dim=16,
        **overrides,
    )


def _siglip(**overrides) -> PretrainedConfig:
    return transformers.SiglipConfig(
        text_config={**_CLIP_TOWER, **_TEXT, "max_position_embeddings": 16, "projection_size": 32},
        vision_config={**_CLIP_TOWER, **IMAGE},
        **overrides,
    )


def _llava(**overrides) -> PretrainedConfig:
    kwargs = {
        "vision_config": transformers.CLIPVisionConfig(**_CLIP_TOWER, **IMAGE),
        "text_config": transformers.LlamaConfig(**_DECODER),
        "image_token_id": 3,
        "image_seq_length": 9,  # (30 / 10)^2 patches, CLS dropped ("default" select strategy)
        "vision_feature_layer": -1,
        "tie_word_embeddings": False,
        **_TEXT,
        **overrides,
    }
    return transformers.LlavaConfig(**kwargs)


def _paired(config_class, encoder: PretrainedConfig, decoder: PretrainedConfig, **overrides):
    """An encoder-decoder config of two parts (a decoder with cross-attention), ids and overrides set."""
    config = config_class.from_encoder_decoder_configs(encoder, decoder)
    for key, value in {**_TEXT, "decoder_start_token_id": 1, **overrides}.items():
        setattr(config, key, value)
    return config


def _vision_encoder_decoder(**overrides) -> PretrainedConfig:
    decoder = transformers.GPT2Config(**_GPT2, is_decoder=True, add_cross_attention=True)
    return _paired(
        transformers.VisionEncoderDecoderConfig, transformers.ViTConfig(**_VISION), decoder, **overrides
    )


def _encoder_decoder(**overrides) -> PretrainedConfig:
    decoder = transformers.BertConfig(**_ENCODER, is_decoder=True, add_cross_attention=True)
    return _paired(
        transformers.EncoderDecoderConfig, transformers.BertConfig(**_ENCODER), decoder, **overrides
    )


_CAUSAL = transformers.AutoModelForCausalLM
_SEQ2SEQ = transformers.AutoModelForSeq2SeqLM
_CLASSIFY = transformers.AutoModelForSequenceClassification


def _decoder(model_type: str, **kwargs) -> ZooSpec:
    return ZooSpec(_for_model(model_type, **{**_DECODER, **kwargs}), _CAUSAL, "text", generates=True)


ZOO: dict[str, ZooSpec] = {
    # ---- decoder-only language models (Llama-like: q/k/v/o projections)
    "llama": _decoder("llama"),
    "mistral": _decoder("mistral", sliding_window=8),  # sliding windows of 8 < 11 tokens: masks exercised
    "qwen2": _decoder("qwen2"),
    "qwen3": _decoder("qwen3"),
    "gemma": _decoder("gemma"),
    "gemma2": _decoder("gemma2", sliding_window=8),  # layer 0 sliding, layer 1 full
    "gemma3_text": _decoder("gemma3_text", sliding_window=8, layer_types=_SLIDING_FULL),
    "phi3": ZooSpec(_for_model("phi3", **_NO_HEAD_DIM), _CAUSAL, "text", generates=True),  # fused qkv_proj
    "olmo": _decoder("olmo"),
    "olmo2": _decoder("olmo2"),
    "granite": _decoder("granite"),
    "smollm3": _decoder("smollm3"),
    "starcoder2": _decoder("starcoder2", residual_dropout=0.0, embedding_dropout=0.0),
    "cohere": _decoder("cohere"),
    "stablelm": _decoder("stablelm", hidden_dropout=0.0),
    "glm4": _decoder("glm4"),
    "exaone4": _decoder("exaone4", sliding_window=8, layer_types=_SLIDING_FULL),
    "phi": _decoder("phi", resid_pdrop=0.0, embd_pdrop=0.0),
    # ---- mixtures of experts
    "mixtral": _decoder("mixtral", num_local_experts=4, num_experts_per_tok=2, intermediate_size=40),
    "qwen2_moe": _decoder("qwen2_moe", **_MOE, num_experts=4, shared_expert_intermediate_size=24),
    "qwen3_moe": _decoder("qwen3_moe", **_MOE, num_experts=4),
    "olmoe": _decoder("olmoe", num_experts=4, num_experts_per_tok=2, intermediate_size=40),
    "granitemoe": _decoder("granitemoe", num_local_experts=4, num_experts_per_tok=2, intermediate_size=40),
    "llama4_text": _decoder(
        "llama4_text",
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size_mlp=37,
        attention_chunk_size=8,
    ),
    "deepseek_v3": _decoder(  # multi-head latent attention, no GQA: num_key_value_heads = num_attention_heads
        "deepseek_v3",
        num_key_value_heads=4,
        head_dim=4,  # the rotary part: qk_rope_head_dim
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=8,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=24,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,  # layer 0 dense, layer 1 MoE
    ),
    "qwen3_next": _decoder(  # layer 0 gated DeltaNet (linear attention), layer 1 gated full attention
        "qwen3_next",
        **_MOE,
        num_experts=4,
        shared_expert_intermediate_size=24,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
    ),
    # ---- fused qkv, other naming (GPT-2 Conv1D, GPT-NeoX, GPT-J, Falcon)
    "gpt2": ZooSpec(_for_model("gpt2", **_GPT2), _CAUSAL, "text", generates=True),
    "gpt_neox": ZooSpec(  # no GQA
        _for_model("gpt_neox", **{k: v for k, v in _NO_HEAD_DIM.items() if k != "num_key_value_heads"}),
        _CAUSAL,
        "text",
        generates=True,
    ),
    "gptj": ZooSpec(
        _for_model("gptj", **{k: v for k, v in _GPT2.items() if k != "n_positions"}, rotary_dim=4),
        _CAUSAL,
        "text",
        generates=True,
    ),
    "codegen": ZooSpec(  # fused qkv_proj: [q | v | k] in each of 4 model-parallel chunks of 2 heads
        _for_model("codegen", **{**_GPT2, "n_head": 8}, n_ctx=64, rotary_dim=2),
        _CAUSAL,
        "text",
        generates=True,
    ),
    "falcon": ZooSpec(  # grouped query attention (Falcon-40B/180B layout)
        _for_model("falcon", **_FALCON, new_decoder_architecture=True, num_kv_heads=2),
        _CAUSAL,
        "text",
        generates=True,
    ),
    "falcon-mqa": ZooSpec(  # multi-query attention (Falcon-7B layout)
        _for_model("falcon", **_FALCON, new_decoder_architecture=False, multi_query=True),
        _CAUSAL,
        "text",
        generates=True,
    ),
    # ---- text encoders
    "bert": ZooSpec(_for_model("bert", **_ENCODER), _CLASSIFY, "text"),
    "roberta": ZooSpec(_for_model("roberta", **_ENCODER), transformers.AutoModelForMaskedLM, "text"),
    "xlm-roberta": ZooSpec(_for_model("xlm-roberta", **_ENCODER), _CLASSIFY, "text"),
    "electra": ZooSpec(_for_model("electra", **_ENCODER, embedding_size=16), _CLASSIFY, "text"),
    "albert": ZooSpec(  # the projections on the attention module itself; one layer shared by both
        _for_model("albert", **_ENCODER, embedding_size=16, classifier_dropout_prob=0.0), _CLASSIFY, "text"
    ),
    "mobilebert": ZooSpec(  # queries and keys read a bottleneck (16 wide), values the layer input (32)
        _for_model("mobilebert", **_ENCODER, embedding_size=16, intra_bottleneck_size=16), _CLASSIFY, "text"
    ),
    "distilbert": ZooSpec(
        _for_model(
            "distilbert",
            **_TEXT,
            dim=32,
            hidden_dim=37,
            n_layers=2,
            n_heads=4,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            seq_classif_dropout=0.0,
        ),
        _CLASSIFY,
        "text",
    ),
    "deberta-v2": ZooSpec(  # DeBERTa-v3 settings: disentangled relative attention
        _for_model(
            "deberta-v2",
            **_ENCODER,
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=-1,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            position_biased_input=False,
        ),
        _CLASSIFY,
        "text",
    ),
    "modernbert": ZooSpec(  # fused Wqkv; layer 0 global, layer 1 local (sliding window 4) attention
        _for_model(
            "modernbert",
            **{k: v for k, v in _ENCODER.items() if "dropout" not in k},
            cls_token_id=1,
            sep_token_id=2,
            global_attn_every_n_layers=2,
            local_attention=4,
        ),
        _CLASSIFY,
        "text",
    ),
    # ---- image encoders
    "vit": ZooSpec(_for_model("vit", **_VISION), transformers.AutoModelForImageClassification, "image"),
    "dinov2": ZooSpec(
        _for_model("dinov2", **{**_VISION, "image_size": 28, "patch_size": 14}),
        transformers.AutoModel,
        "image",
    ),
    "data2vec-vision": ZooSpec(  # attention.query/key/value + output.dense
        _for_model("data2vec-vision", **_VISION), transformers.AutoModelForImageClassification, "image"
    ),
    "deit": ZooSpec(  # the Auto class maps deit to 2 heads and needs config.architectures: the class itself
        _for_model("deit", **_VISION), transformers.DeiTForImageClassification, "image"
    ),
    "swin": ZooSpec(  # 8x8 patches, windows of 4x4: stage 0 with shifted windows, stage 1 one window
        _for_model(
            "swin",
            image_size=32,
            patch_size=4,
            embed_dim=32,
            depths=[2, 2],
            num_heads=[4, 8],
            window_size=4,
            mlp_ratio=1.0,
            drop_path_rate=0.0,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        transformers.AutoModelForImageClassification,
        "image",
    ),
    # ---- text + image towers
    "clip": ZooSpec(_clip, transformers.CLIPModel, "image-text"),
    "siglip": ZooSpec(_siglip, transformers.SiglipModel, "image-text"),
    # ---- encoder-decoders (self-attention + cross-attention)
    "bart": ZooSpec(_for_model("bart", **_BART), _SEQ2SEQ, "seq2seq", generates=True),
    "mbart": ZooSpec(_for_model("mbart", **_BART), _SEQ2SEQ, "seq2seq", generates=True),
    "pegasus": ZooSpec(
        _for_model("pegasus", **_BART | {"decoder_start_token_id": 0}), _SEQ2SEQ, "seq2seq", generates=True
    ),
    "marian": ZooSpec(
        _for_model("marian", **_BART | {"decoder_start_token_id": 0, "decoder_vocab_size": VOCAB}),
        _SEQ2SEQ,
        "seq2seq",
        generates=True,
    ),
    "led": ZooSpec(  # Longformer self-attention in the encoder (window 4)
        _for_model(
            "led",
            **{k: v for k, v in _BART.items() if k != "max_position_embeddings"},
            max_encoder_position_embeddings=64,
            max_decoder_position_embeddings=64,
            attention_window=4,
        ),
        _SEQ2SEQ,
        "seq2seq",
        generates=True,
    ),
    "t5": ZooSpec(_for_model("t5", **_T5), _SEQ2SEQ, "seq2seq", generates=True),
    "mt5": ZooSpec(_for_model("mt5", **_T5), _SEQ2SEQ, "seq2seq", generates=True),
    "longt5": ZooSpec(  # local attention (radius 3) in the encoder
        _for_model("longt5", **_T5, local_radius=3, global_block_size=4), _SEQ2SEQ, "seq2seq", generates=True
    ),
    "whisper": ZooSpec(
        _for_model(
            "whisper",
            **{k: v for k, v in _BART.items() if k != "max_position_embeddings"}
            | {"decoder_start_token_id": 1},
            num_mel_bins=8,
            max_source_positions=16,  # input_features of 32 frames
            max_target_positions=64,
            suppress_tokens=None,
            begin_suppress_tokens=None,
        ),
        transformers.WhisperForConditionalGeneration,
        "speech",
        generates=True,
    ),
    "vision-encoder-decoder": ZooSpec(  # ViT encoder + GPT-2 decoder with cross-attention
        _vision_encoder_decoder, transformers.VisionEncoderDecoderModel, "image-to-text", generates=True
    ),
    "encoder-decoder": ZooSpec(  # BERT encoder + BERT decoder with cross-attention
        _encoder_decoder, transformers.EncoderDecoderModel, "seq2seq", generates=True
    ),
    # ---- vision-language (CLIP vision tower + Llama)
    "llava": ZooSpec(_llava, transformers.LlavaForConditionalGeneration, "image-text", generates=True),
}


# ---- every further type of these Auto mappings, shrunk from its default config (`shrunk_config`)
SWEPT_MAPPINGS = {
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": (_CAUSAL, "text"),
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": (transformers.AutoModelForMaskedLM, "text"),
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": (transformers.AutoModelForImageClassification, "image"),
}
# what `shrunk_config` sets where the default config has it (dropout probabilities go to 0); MoE expert sizes
# multiples of 8 (torch._grouped_mm)
SHRUNK = {
    **{key: 32 for key in ("hidden_size", "d_model", "n_embd", "embedding_size")},
    **{key: 2 for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers")},
    **{
        key: 4 for key in ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads")
    },
    **{key: 40 for key in ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "n_inner", "d_ff")},
    **{"decoder_layers": 2, "decoder_attention_heads": 4, "decoder_ffn_dim": 40, "num_key_value_heads": 2},
    **{"head_dim": 8, "max_position_embeddings": 64, "n_positions": 64, "image_size": 32, "patch_size": 8},
    **{"num_channels": 3, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2},
    **{
        "moe_intermediate_size": 24,
        "vocab_size": VOCAB,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def shrunk_config(model_type: str, **overrides) -> PretrainedConfig:
    """The default config of `model_type` with the `SHRUNK` sizes it has, dropout 0; `ValueError` for a
    composite config (its parts' default configs would stay full size)."""
    config_class = transformers.AutoConfig.for_model(model_type).__class__
    if getattr(config_class, "sub_configs", None):
        raise ValueError(f"composite config ({', '.join(config_class.sub_configs)}): not shrunk")
    defaults = config_class().to_dict()
    sizes = {key: value for key, value in SHRUNK.items() if key in defaults}
    dropout = {
        k: 0.0 for k, v in defaults.items() if isinstance(v, float) and ("dropout" in k or "pdrop" in k)
    }
    return config_class(**{**sizes, **dropout, **overrides})


def swept_types(covered: set[str]) -> dict[str, tuple[Any, str]]:
    """Model type -> (Auto class, input kind) of every type of `SWEPT_MAPPINGS` not in `covered` (the first
    mapping holding it decides)."""
    found = {}
    for mapping, (auto_class, kind) in SWEPT_MAPPINGS.items():
        for model_type in getattr(transformers.models.auto.modeling_auto, mapping):
            if model_type not in covered and model_type not in found:
                found[model_type] = (auto_class, _decoder_kind(model_type) if auto_class is _CAUSAL else kind)
    return found


def _decoder_kind(model_type: str) -> str:
    """ "decoder" for the causal LM of an encoder-decoder family (its cross-attention reads encoder states:
    BART's relatives, TrOCR), else "text"."""
    defaults = transformers.CONFIG_MAPPING[model_type]  # class defaults: some default configs do not build
    reads_encoder = getattr(defaults, "is_encoder_decoder", False) is True or hasattr(
        defaults, "cross_attention_hidden_size"
    )
    return "decoder" if reads_encoder else "text"


def build_error(error: Exception) -> str:
    """How a type that does not build is listed: the exception's class and first line."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:100]}"


HAND_WRITTEN = tuple(ZOO)
COVERED = {key for key in ZOO} | {spec.config().model_type for spec in ZOO.values()}
# swept types that do not build from a shrunk default config (or whose forward fails), with `build_error`
UNBUILT: dict[str, str] = {
    "axk1": "RuntimeError: The size of tensor a (32) must match the size of tensor b (4) at non-singleton dimension 3",  # noqa: E501
    "axk2": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "bailing_hybrid": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "bamba": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "blt": "ValueError: composite config (patcher_config, encoder_config, decoder_config, global_config): not shrunk",  # noqa: E501
    "cohere_compass_text": "KeyError: 'full_attention'",
    "dbrx": "ValueError: composite config (attn_config, ffn_config): not shrunk",
    "deepseek_v2": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "deepseek_v32": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "dory": "RuntimeError: The size of tensor a (22) must match the size of tensor b (11) at non-singleton dimension 3",  # noqa: E501
    "dots1": "TypeError: empty() takes 1 positional argument but 3 were given",
    "dots3_note": "ValueError: composite config (text_config, vision_config, audio_config): not shrunk",
    "dots3_note_text": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "emu3": "ValueError: composite config (vq_config, text_config): not shrunk",
    "fuyu": "ValueError: composite config (text_config): not shrunk",
    "gemma3": "ValueError: composite config (text_config, vision_config): not shrunk",
    "gemma3n": "ValueError: composite config (text_config, vision_config, audio_config): not shrunk",
    "gemma3n_text": "ValueError: The set of layer types producing a cache is different than the set of layer types using them",  # noqa: E501
    "gemma4": "ValueError: composite config (text_config, vision_config, audio_config): not shrunk",
    "gemma4_assistant": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "gemma4_unified": "ValueError: composite config (text_config, vision_config, audio_config): not shrunk",
    "gemma4_unified_assistant": "ValueError: composite config (text_config): not shrunk",
    "git": "ValueError: composite config (vision_config): not shrunk",
    "glm4_moe_lite": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "glm_moe_dsa": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "got_ocr2": "ValueError: composite config (text_config, vision_config): not shrunk",
    "gpt_neo": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "granitemoehybrid": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "jamba": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "kimi_linear": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "kolibri1_1": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "lfm2_moe": "TypeError: 'NoneType' object is not subscriptable",
    "llama4": "ValueError: composite config (text_config, vision_config): not shrunk",
    "longcat_flash": "RuntimeError: The size of tensor a (32) must match the size of tensor b (4) at non-singleton dimension 3",  # noqa: E501
    "mamba2": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "minicpm3": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "mllama": "ValueError: composite config (text_config, vision_config): not shrunk",
    "moshi": "ValueError: composite config (audio_encoder_config, depth_decoder_config): not shrunk",
    "moss_transcribe_diarize": "ValueError: composite config (audio_config, text_config): not shrunk",
    "mpt": "ValueError: composite config (attn_config): not shrunk",
    "musicgen": "ValueError: composite config (text_encoder, audio_encoder, decoder): not shrunk",
    "musicgen_melody": "ValueError: composite config (text_encoder, audio_encoder, decoder): not shrunk",
    "phi4_multimodal": "ValueError: composite config (audio_config, vision_config): not shrunk",
    "qwen3_5": "ValueError: composite config (vision_config, text_config): not shrunk",
    "qwen3_5_moe": "ValueError: composite config (vision_config, text_config): not shrunk",
    "qwen3_5_moe_text": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "qwen3_5_text": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "qwen4_exp": "ValueError: composite config (vision_config, text_config): not shrunk",
    "qwen4_exp_text": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "recurrent_gemma": "ValueError: `get_mask_sizes` can only be called on Attention layers, and the current Cache seem to only contain ",  # noqa: E501
    "reformer": "AssertionError: If you want to use `ReformerModelWithLMHead` make sure that `is_decoder=True`.",  # noqa: E501
    "sarvam_mla": "RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at non-singleton dimension 1",  # noqa: E501
    "xlstm": "ValueError: matC_old has wrong shape, got torch.Size([2, 4, 16, 16])",
    "xmod": "ValueError: Input language unknown. Please call `XmodPreTrainedModel.set_default_language()`",
    "youtu": "RuntimeError: The size of tensor a (32) must match the size of tensor b (4) at non-singleton dimension 3",  # noqa: E501
    "zamba": "StrictDataclassClassValidationError: Class validation error for validator 'validate_layer_type':",  # noqa: E501
    "zamba2": "StrictDataclassClassValidationError: Class validation error for validator 'validate_layer_type':",  # noqa: E501
    "zaya": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "esm": "ValueError: composite config (esmfold_config): not shrunk",
    "esmc": "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture':",  # noqa: E501
    "modernvbert": "ValueError: composite config (text_config, vision_config): not shrunk",
    "neomme": "ValueError: rope_parameters['full_attention']['partial_rotary_factor']=0.25 rotates 2 of head_dim=8 dims, which ",  # noqa: E501
    "ultravbert": "ValueError: composite config (text_config, vision_config): not shrunk",
    "bit": "AttributeError: 'BitConfig' object has no attribute 'image_size'",
    "convnext": "RuntimeError: Calculated padded input size per channel: (1 x 1). Kernel size: (2 x 2). Kernel size can't be greate",  # noqa: E501
    "convnextv2": "RuntimeError: Calculated padded input size per channel: (1 x 1). Kernel size: (2 x 2). Kernel size can't be greate",  # noqa: E501
    "cvt": "StrictDataclassFieldValidationError: Validation error for field 'num_heads':",
    "dinat": "StrictDataclassFieldValidationError: Validation error for field 'num_heads':",
    "donut-swin": "StrictDataclassFieldValidationError: Validation error for field 'num_heads':",
    "hgnet_v2": "AttributeError: 'HGNetV2Config' object has no attribute 'image_size'",
    "hiera": "StrictDataclassFieldValidationError: Validation error for field 'image_size':",
    "imagegpt": "AttributeError: 'ImageGPTConfig' object has no attribute 'image_size'",
    "levit": "StrictDataclassFieldValidationError: Validation error for field 'num_attention_heads':",
    "metaclip_2": "ValueError: composite config (vision_config, text_config): not shrunk",
    "mobilevitv2": "RuntimeError: Given input with spatial size (4, 4), kernel_size=(8, 8), dilation=(1, 1), padding=(0, 0), calculate",  # noqa: E501
    "poolformer": "AttributeError: 'PoolFormerConfig' object has no attribute 'image_size'",
    "pp_lcnet": "AttributeError: 'PPLCNetConfig' object has no attribute 'image_size'",
    "pvt": "StrictDataclassFieldValidationError: Validation error for field 'num_attention_heads':",
    "pvt_v2": "StrictDataclassFieldValidationError: Validation error for field 'num_attention_heads':",
    "regnet": "AttributeError: 'RegNetConfig' object has no attribute 'image_size'",
    "resnet": "AttributeError: 'ResNetConfig' object has no attribute 'image_size'",
    "segformer": "StrictDataclassFieldValidationError: Validation error for field 'num_attention_heads':",
    "shieldgemma2": "ValueError: composite config (text_config, vision_config): not shrunk",
    "siglip2": "ValueError: composite config (vision_config, text_config): not shrunk",
    "swinv2": "StrictDataclassFieldValidationError: Validation error for field 'num_heads':",
    "textnet": "AttributeError: 'TextNetConfig' object has no attribute 'num_channels'",
    "timm_wrapper": "ImportError: TimmWrapperForImageClassification requires the timm library but it was not found in your environment",  # noqa: E501
}
# swept types that patch serves but whose checks cannot run on the CPU, and why
UNCHECKED: dict[str, str] = {
    "mra": "its attention runs only in a CUDA kernel (without it, transformers returns zeros), so gradients "
    "and value-gate heads cannot be checked on the CPU",
}
# every swept type's spec; the zoo holds those neither unbuilt nor unchecked
SWEPT = {t: ZooSpec(functools.partial(shrunk_config, t), *spec) for t, spec in swept_types(COVERED).items()}
ZOO.update({t: spec for t, spec in SWEPT.items() if t not in UNBUILT and t not in UNCHECKED})


def zoo_config(model_type: str, **overrides) -> PretrainedConfig:
    return (ZOO.get(model_type) or SWEPT[model_type]).config(**overrides)


def zoo_model(model_type: str, seed: int = 0, attn_implementation: str = "eager", **overrides):
    """A randomly initialised tiny model of the `ZOO` key `model_type` (with its task head), float32, in eval
    mode; `overrides` go to its config (the top-level config of composite models)."""
    spec = ZOO.get(model_type) or SWEPT[model_type]
    config = spec.config(**overrides)
    torch.manual_seed(seed)
    # Auto classes have from_config, model classes (CLIPModel, EncoderDecoderModel ...) _from_config
    build = getattr(spec.auto_class, "from_config", None) or spec.auto_class._from_config
    model = build(config, attn_implementation=attn_implementation, dtype=torch.float32)
    return model.eval()


def _walk(config) -> list[dict]:
    """The config's dict and those of its sub-configs."""
    found, stack = [], [config.to_dict() if isinstance(config, PretrainedConfig) else config]
    while stack:
        values = stack.pop()
        found.append(values)
        stack.extend(value for value in values.values() if isinstance(value, dict))
    return found


@functools.cache
def _token_facts(model_type: str) -> tuple[int, tuple[int, ...]]:
    """The smallest vocabulary size of the config (and its sub-configs) and every special token id in it."""
    dicts = _walk(zoo_config(model_type))
    vocab = min((d["vocab_size"] for d in dicts if isinstance(d.get("vocab_size"), int)), default=VOCAB)
    special = set(SPECIAL_IDS)
    for values in dicts:
        for key, value in values.items():
            if isinstance(key, str) and key.endswith(("token_id", "token_ids", "token_index")):
                special.update(
                    v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int)
                )
    return vocab, tuple(sorted(special))


def _tokens(model_type: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    vocab, special = _token_facts(model_type)
    allowed = torch.tensor([i for i in range(vocab) if i not in special])
    return allowed[torch.randint(0, len(allowed), shape, generator=generator)]


def _decoder_input_ids(model_type: str, config, batch: int, length: int, generator) -> torch.Tensor:
    """decoder_start_token_id followed by ordinary tokens; half the encoder's length (different lengths)."""
    start = config.decoder_start_token_id
    tokens = _tokens(model_type, (batch, max(length // 2, 1)), generator)
    return torch.cat([torch.full((batch, 1), start), tokens], dim=1)


def _pixels(vision_config, batch: int, generator) -> torch.Tensor:
    size, channels = vision_config.image_size, vision_config.num_channels
    return torch.randn(batch, channels, size, size, generator=generator)


def zoo_inputs(model_type: str, batch: int = 2, length: int = 11, seed: int = 1) -> dict[str, torch.Tensor]:
    """Model inputs of the kind of `ZOO[model_type].inputs`: token ids are never special token ids (pad, bos,
    eos, decoder start, image token ...); decoder_input_ids start with decoder_start_token_id; llava's
    input_ids hold, after the first token, as many image tokens as the image has features."""
    spec, config = ZOO.get(model_type) or SWEPT[model_type], zoo_config(model_type)
    generator = torch.Generator().manual_seed(seed)
    kind = spec.inputs
    if kind == "text":
        return {"input_ids": _tokens(model_type, (batch, length), generator)}
    if kind == "decoder":
        width = getattr(config, "cross_attention_hidden_size", None) or config.d_model
        states = torch.randn(batch, length + 2, width, generator=generator)  # (B, S, d) of an encoder
        return {"input_ids": _tokens(model_type, (batch, length), generator), "encoder_hidden_states": states}
    if kind == "image":
        return {"pixel_values": _pixels(config, batch, generator)}
    if kind == "seq2seq":
        return {
            "input_ids": _tokens(model_type, (batch, length), generator),
            "decoder_input_ids": _decoder_input_ids(model_type, config, batch, length, generator),
        }
    if kind == "speech":
        frames = 2 * config.max_source_positions  # the encoder's second convolution has stride 2
        features = torch.randn(batch, config.num_mel_bins, frames, generator=generator)
        return {
            "input_features": features,
            "decoder_input_ids": _decoder_input_ids(model_type, config, batch, length, generator),
        }
    if kind == "image-to-text":
        return {
            "pixel_values": _pixels(config.encoder, batch, generator),
            "decoder_input_ids": _decoder_input_ids(model_type, config, batch, length, generator),
        }
    if kind == "image-text":
        input_ids = _tokens(model_type, (batch, length), generator)
        pixel_values = _pixels(config.vision_config, batch, generator)
        image_token = getattr(config, "image_token_id", None)
        if image_token is not None:
            images = torch.full((batch, config.image_seq_length), image_token)
            input_ids = torch.cat([input_ids[:, :1], images, input_ids[:, 1:]], dim=1)
        return {"input_ids": input_ids, "pixel_values": pixel_values}
    raise ValueError(f"unknown input kind {kind!r}")
