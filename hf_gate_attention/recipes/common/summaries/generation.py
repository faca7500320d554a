"""Evaluation of a model that writes summaries: greedy summaries of the test split, ROUGE with bootstrap CIs,
inference speed.

Speed is measured on single prompts (batch 1) with a plain KV-cache loop, so that prefill (the prompt's
forward pass) and decode (one token per forward pass) are timed apart and every model decodes the same number
of tokens. `interleaved_speed` alternates the models round by round on the same prompts, so that a slow phase
of a shared machine hits them all alike.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import time

import datasets
import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

from ....memory import peak_growth_mib
from ..inference import inference_device, interleaved_rounds
from .data import DataCollatorForSummarization, build_prompt
from .rouge import per_example_rouge, summarize_rouge

logger = logging.getLogger(__name__)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def generation_prompts(split: datasets.Dataset, tokenizer, config) -> list[list[int]]:
    """Generation prompts (token ids) of a `document` split, built as for training."""
    budget, truncation, instruction = config.doc_token_budget, config.truncation, config.instruction
    return [
        build_prompt(tokenizer, doc, budget, truncation, instruction)["input_ids"]
        for doc in split["document"]
    ]


def _generation_config(model, tokenizer, max_new_tokens: int) -> GenerationConfig:
    eos = model.generation_config.eos_token_id
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=tokenizer.eos_token_id if eos is None else eos,
        pad_token_id=tokenizer.pad_token_id,
    )


@torch.inference_mode()
def generate_summaries(
    model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int, desc: str = "Generating"
) -> tuple[list[str], float]:
    """Greedy summaries of `prompts`, batched with left padding; returns `(texts, wall seconds)`."""
    collate = DataCollatorForSummarization(tokenizer.pad_token_id, padding_side="left")
    generation_config = _generation_config(model, tokenizer, max_new_tokens)
    device = next(model.parameters()).device
    texts, start = [], time.perf_counter()
    for i in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch"):
        batch = collate([{"input_ids": ids} for ids in prompts[i : i + batch_size]])
        batch = {k: v.to(device) for k, v in batch.items()}
        output = model.generate(**batch, generation_config=generation_config)  # (batch, prompt + new)
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        texts += [t.strip() for t in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]
    return texts, time.perf_counter() - start


def sentences_per_line(text: str) -> str:
    """One sentence per line (split after `.`, `!`, `?`), the input rougeLsum expects."""
    return "\n".join(s for s in _SENTENCE_END.split(" ".join(text.split())) if s)


def rouge_with_ci(
    predictions: list[str], references: list[str], n_bootstrap: int, confidence: float, seed: int
) -> tuple[dict, dict]:
    """ROUGE x100 (`per_example_rouge`) of the texts put one sentence per line, with bootstrap CIs.

    Returns:
        `({type: {"mean", "low", "high"}}, {type: [per-example scores]})` for the types in `ROUGE_TYPES`.
    """
    per_example = per_example_rouge(
        [sentences_per_line(p) for p in predictions], [sentences_per_line(r) for r in references]
    )
    scores = {t: values.tolist() for t, values in per_example.items()}
    return summarize_rouge(scores, n_bootstrap, confidence, seed), scores


def evaluate_quality(
    model, tokenizer, prompts: list[list[int]], references: list[str], config, run_name: str
):
    """Summaries of the test prompts and their ROUGE against `references`."""
    predictions, seconds = generate_summaries(
        model,
        tokenizer,
        prompts,
        config.max_new_tokens,
        config.generation_batch_size,
        f"Generating ({run_name})",
    )
    rouge, per_example = rouge_with_ci(
        predictions, references, config.n_bootstrap, config.confidence, config.seed
    )
    return {
        "rouge": rouge,
        "per_example": per_example,
        "predictions": predictions,
        "num_examples": len(prompts),
        "generation_seconds_per_summary": seconds / len(prompts),
        "mean_summary_words": float(np.mean([len(p.split()) for p in predictions])),
    }


# ----------------------------------------------------------------------------------------------- speed


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _summarize_one(model, input_ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """Greedy prefill + `new_tokens - 1` decode steps of one prompt `(1, length)`; returns their seconds."""
    device = input_ids.device
    _synchronize(device)
    start = time.perf_counter()
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    next_id = out.logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    _synchronize(device)
    prefilled = time.perf_counter()
    for _ in range(new_tokens - 1):
        out = model(input_ids=next_id, cache=out.cache, use_cache=True)
        next_id = out.logits[:, -1].argmax(-1, keepdim=True)
    _synchronize(device)
    return prefilled - start, time.perf_counter() - prefilled


def _time_round(model, prompts: list[torch.Tensor], new_tokens: int) -> dict:
    prefill_s = decode_s = 0.0
    for ids in prompts:
        prefill, decode = _summarize_one(model, ids, new_tokens)
        prefill_s, decode_s = prefill_s + prefill, decode_s + decode
    return {
        "prefill_tokens_per_s": sum(ids.shape[1] for ids in prompts) / prefill_s,
        "decode_tokens_per_s": len(prompts) * (new_tokens - 1) / max(decode_s, 1e-9),
        "seconds_per_summary": (prefill_s + decode_s) / len(prompts),
    }


def peak_memory_mb(model, input_ids: torch.Tensor, new_tokens: int) -> float:
    """Peak memory while summarizing one prompt, in MiB: the weights' bytes plus the peak growth of the call
    (activations, KV cache; `hf_gate_attention.memory`). NaN, with a warning, where it cannot be measured
    (a CPU without Linux's /proc): the speed tables show `nan` rather than a guess."""
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    try:
        growth = peak_growth_mib(lambda: _summarize_one(model, input_ids, new_tokens), input_ids.device)
    except RuntimeError as error:
        logger.warning("peak memory not measured: %s", error)
        return float("nan")
    return weights / 2**20 + growth


def interleaved_speed(
    models: dict, prompts: list[list[int]], rounds: int, new_tokens: int
) -> dict[str, dict]:
    """Inference speed of each model on the same prompts, alternating the models within every round.

    Round `r` runs the models in the order rotated by `r`; each model summarizes every prompt (batch 1,
    exactly `new_tokens` greedy tokens) after one untimed warm-up.

    Returns:
        `{name: {"rounds": [per-round dicts], "prefill_tokens_per_s", "decode_tokens_per_s",
        "seconds_per_summary" (medians over rounds), "peak_memory_mb", "prompt_tokens", "new_tokens"}}`.
    """
    device = inference_device()
    inputs = [torch.tensor([ids], device=device) for ids in prompts]
    names = list(models)
    for name in names:
        _summarize_one(models[name], inputs[0], min(new_tokens, 2))
    per_round = interleaved_rounds(names, rounds, lambda name: _time_round(models[name], inputs, new_tokens))
    longest = max(inputs, key=lambda ids: ids.shape[1])
    results = {}
    for name in names:
        rows = per_round[name]
        results[name] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        results[name] |= {
            "rounds": rows,
            "peak_memory_mb": peak_memory_mb(models[name], longest, new_tokens),
            "prompt_tokens": [ids.shape[1] for ids in inputs],
            "new_tokens": new_tokens,
            "device": str(device),
        }
    return results


def predictions_jsonl(ids: list, predictions: list[str], references: list[str]) -> str:
    """JSON lines `{"id", "prediction", "reference"}`, one per test example."""
    rows = zip(ids, predictions, references, strict=True)
    return "".join(
        json.dumps({"id": i, "prediction": p, "reference": r}, ensure_ascii=False) + "\n" for i, p, r in rows
    )
