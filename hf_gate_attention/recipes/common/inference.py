"""Where and in what precision the recipes evaluate trained models, and their interleaved timing rounds."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm


def inference_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inference_dtype(config) -> torch.dtype:
    """bfloat16 / float16 when the run trained in that precision, else float32."""
    return torch.bfloat16 if config.bf16 else torch.float16 if config.fp16 else torch.float32


def interleaved_rounds(names: list[str], rounds: int, time_round: Callable[[str], dict]) -> dict[str, list]:
    """`{name: [time_round(name) for each round]}`, running the names in the order rotated by the round
    number, so that a slow phase of a shared machine hits every model alike (shared by the recipes)."""
    per_round = {name: [] for name in names}
    for r in tqdm(range(rounds), desc="Timing (interleaved rounds)", unit="round"):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            per_round[name].append(time_round(name))
    return per_round
