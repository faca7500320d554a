"""`diagnose` of every run of a captioning comparison: the attention sink and activations of the decoder's
self-attention (`part="decoder"`) and its gates, the cross-attention gates listed separately, on the first
test images with their reference captions (teacher forcing)."""

from __future__ import annotations

import torch

from ...diagnostics import diagnose
from ...files import atomic_write_json
from ..common.encoder_decoder import load_trained, start_and_end
from .model import encode_caption

DIAGNOSED_EXAMPLES = 16
DIAGNOSIS_FILE = "diagnostics.json"


def diagnosis_inputs(
    tokenizer, rows: list[dict], features: torch.Tensor, max_tokens: int, device
) -> list[dict]:
    """One input per test image: its cached encoder output and its reference caption behind the start
    token."""
    start = start_and_end(tokenizer)[0]
    inputs = []
    for index, row in enumerate(rows[:DIAGNOSED_EXAMPLES]):
        ids = encode_caption(tokenizer, row["caption"], max_tokens)[0]
        inputs.append(
            {
                "encoder_outputs": (features[index : index + 1].to(device, torch.float32),),
                "decoder_input_ids": torch.tensor([[start, *ids]]),
            }
        )
    return inputs


def diagnose_runs(config, tokenizer, data, features: torch.Tensor) -> dict[str, dict]:
    """`{run: diagnose(...)["summary"]}`; each run's whole diagnosis in `<run>/diagnostics.json`."""
    summaries = {}
    for run in config.runs:
        model = load_trained(config, run, attn_implementation="eager")
        device = next(model.parameters()).device
        inputs = diagnosis_inputs(tokenizer, data.splits["test"], features, config.max_caption_tokens, device)
        result = diagnose(model, inputs, skip_queries=1, part="decoder")
        atomic_write_json(config.run_dir / run.name / DIAGNOSIS_FILE, result)
        summaries[run.name] = result["summary"]
        del model
    return summaries
