"""Patch the real SmolLM2-135M-Instruct in one call: parameter overhead and greedy answers before/after.

Run with `python -m hf_gate_attention.demo [--model PATH_OR_HUB_ID]`; the default model ships offline.
"""

from __future__ import annotations

import argparse

import torch
import transformers

from .core.config import GateConfig
from .core.patching import gate_parameters, patch, unpatch
from .offline import resolve_model

CASES = [
    GateConfig(variant="output", granularity="headwise"),
    GateConfig(variant="output", granularity="elementwise"),
    GateConfig(variant="value", granularity="headwise"),
    GateConfig(variant="qk", granularity="headwise"),
    GateConfig(variant="output", granularity="headwise", init="paper"),
]


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int = 16) -> str:
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--model", default="SmolLM2-135M-Instruct", help="local folder, Hub id or offline name"
    )
    parser.add_argument("--question", default="What is the capital of France?")
    args = parser.parse_args(argv)

    path = resolve_model(args.model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    total = sum(p.numel() for p in model.parameters())
    print(f"model: {args.model} ({total / 1e6:.1f}M parameters)")
    print(f"question: {args.question}")
    print(f"{'gate':<36} {'added params':>12} {'overhead':>9}  greedy answer")
    print(f"{'none (original)':<36} {0:>12,} {0:>8.3f}%  {greedy_answer(model, tokenizer, args.question)!r}")
    for config in CASES:
        patch(model, config)
        added = sum(p.numel() for p in gate_parameters(model))
        label = f"{config.variant}/{config.granularity}/{config.init}"
        answer = greedy_answer(model, tokenizer, args.question)
        print(f"{label:<36} {added:>12,} {100 * added / total:>8.3f}%  {answer!r}")
        unpatch(model)
    print("identity init reproduces the original answer exactly; 'paper' init (gates ~0.5) changes the model")


if __name__ == "__main__":
    main()
