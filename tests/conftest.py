"""Tiny random models of every registered family, and shared helpers."""

from __future__ import annotations

import os

import pytest
import torch
import transformers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if (
    not torch.cuda.is_available()
):  # run the Triton kernels through the interpreter (read when they are defined)
    os.environ.setdefault("TRITON_INTERPRET", "1")
transformers.logging.set_verbosity_error()

VARIANTS = ("output", "value", "qk")
GRANULARITIES = ("headwise", "elementwise")

_TEXT = {"vocab_size": 99, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_DECODER = {
    **_TEXT,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "attention_dropout": 0.0,
}
_ENCODER = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
# model_type -> (config kwargs, Auto class of the task head tested)
TINY_MODELS = {
    "llama": (_DECODER, transformers.AutoModelForCausalLM),
    "mistral": (_DECODER, transformers.AutoModelForCausalLM),
    "qwen2": (_DECODER, transformers.AutoModelForCausalLM),
    "qwen3": (_DECODER, transformers.AutoModelForCausalLM),
    "gemma": (_DECODER, transformers.AutoModelForCausalLM),
    "gemma2": (_DECODER, transformers.AutoModelForCausalLM),
    "gemma3_text": (_DECODER, transformers.AutoModelForCausalLM),
    "phi3": ({k: v for k, v in _DECODER.items() if k != "head_dim"}, transformers.AutoModelForCausalLM),
    "bert": ({**_ENCODER, **_TEXT}, transformers.AutoModelForSequenceClassification),
    "roberta": ({**_ENCODER, **_TEXT, "pad_token_id": 1}, transformers.AutoModelForMaskedLM),
    "vit": ({**_ENCODER, "image_size": 30, "patch_size": 10}, transformers.AutoModelForImageClassification),
    "dinov2": ({**_ENCODER, "image_size": 28, "patch_size": 14}, transformers.AutoModel),
}
IMAGE_MODELS = ("vit", "dinov2")


def tiny_model(model_type: str, seed: int = 0, attn_implementation: str = "eager", **overrides):
    """A randomly initialised tiny model of `model_type` in eval mode."""
    kwargs, auto_class = TINY_MODELS[model_type]
    config = transformers.AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(seed)
    model = auto_class.from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def tiny_inputs(model_type: str, batch: int = 2, length: int = 11, seed: int = 1) -> dict:
    """Model inputs of the right kind: token ids (never the pad id) or pixel values."""
    generator = torch.Generator().manual_seed(seed)
    if model_type in IMAGE_MODELS:
        size = TINY_MODELS[model_type][0]["image_size"]
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}
    return {"input_ids": torch.randint(3, 99, (batch, length), generator=generator)}


def first_output(outputs) -> torch.Tensor:
    """logits for heads, last_hidden_state for bare models."""
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)
