"""Validation loss of the pretrained (untrained) model with sparse top-k gates: what each way of treating the
dropped key/value groups costs before any training, to choose the semantics the reproduction then trains.

Every case patches SmolLM2-135M-Instruct with an identity-init headwise output gate (which computes the
ungated model until top-k drops something: all groups tie at step 0, so top-k keeps the first groups) and
measures the mean loss on the summary tokens of the validation split of the reproduction preset
(`recipes/summarization/configs/reproduce.yaml`: its data, prompt budget and truncation). Cases: the ungated
model; keeping 2 or 1 of the 3 groups, the dropped ones reading nothing (their output is 0) or their first
`sink` and last `window` keys (`GateConfig.top_k_sink/top_k_window`).

    # writes benchmarks/results/sparse_zero_shot.csv and .md
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/sparse_zero_shot.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from harness import command_line, markdown_page, markdown_table, write_results
from transformers import AutoModelForCausalLM

from hf_gate_attention import GateConfig, patch, unpatch
from hf_gate_attention.offline import resolve_model
from hf_gate_attention.recipes.common.summaries.data import DataCollatorForSummarization
from hf_gate_attention.recipes.common.summaries.pipeline import load_data, training_features
from hf_gate_attention.recipes.common.training import load_tokenizer
from hf_gate_attention.recipes.summarization.config import load_config

PRESET = Path(__file__).parents[1] / "recipes/summarization/configs/reproduce.yaml"
# (top_k, sink, window); top_k None: the ungated model
CASES = [(None, 0, 0)] + [
    (top_k, sink, window)
    for top_k in (2, 1)
    for sink, window in ((0, 0), (0, 64), (4, 64), (4, 128), (4, 256))
]


def case_name(top_k, sink, window) -> str:
    if top_k is None:
        return "ungated"
    reads = "nothing" if not (sink or window) else f"sink {sink} + window {window}"
    return f"top-{top_k} of 3 kv groups, dropped read {reads}"


def validation_loss(model, batches) -> float:
    with torch.no_grad():
        return sum(model(**batch).loss.item() for batch in batches) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", default="benchmarks/results/sparse_zero_shot", help="CSV and Markdown prefix"
    )
    args = parser.parse_args()
    config = load_config(PRESET)
    model_path = resolve_model(config.model)
    tokenizer = load_tokenizer(model_path)
    features = training_features(load_data(config)["validation"], tokenizer, config)
    collate = DataCollatorForSummarization(tokenizer)
    batches = [collate([example]) for example in features]
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    rows = []
    for top_k, sink, window in CASES:
        if top_k is not None:
            gate = GateConfig(top_k=top_k, top_k_unit="kv_group", top_k_sink=sink, top_k_window=window)
            patch(model, gate, backend="torch")
        loss = validation_loss(model, batches)
        if top_k is not None:
            unpatch(model)
        rows.append({"case": case_name(top_k, sink, window), "validation_loss": round(loss, 4)})
        print(f"{rows[-1]['case']}: {loss:.4f}", flush=True)
    header = (
        f"`{command_line()}`: {config.model}, {len(batches)} validation examples of `{config.dataset}` "
        f"({config.doc_token_budget}-token prompts), mean loss on the summary tokens, no training."
    )
    cells = [[row["case"], f"{row['validation_loss']:.4f}"] for row in rows]
    table = markdown_table(["case", "validation loss"], cells, "lr")
    write_results(args.out, rows, markdown_page(header, table))


if __name__ == "__main__":
    main()
