"""Test environment (offline Hub, Triton's interpreter on CPU) and shared fixtures (helpers: helpers.py)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if (
    not torch.cuda.is_available()
):  # run the Triton kernels through the interpreter (read when they are defined)
    os.environ.setdefault("TRITON_INTERPRET", "1")
transformers.logging.set_verbosity_error()

from helpers import make_dataset, make_tiny_model, tiny_config  # noqa: E402 (after the environment)

OUTPUT = {"variant": "output", "granularity": "headwise"}
# the runs of `recipe_results`
RESULTS_RUNS = [
    {"name": "baseline", "gate": None},
    {"name": "output-headwise", "gate": OUTPUT},
    {"name": "output-headwise-b", "gate": OUTPUT},  # same gate: picking by gate config is ambiguous
    {"name": "qk-elementwise", "gate": {"variant": "qk", "granularity": "elementwise"}},
]


def pytest_sessionstart(session):
    """The test folders (core, kernels, sharing, diagnostics, recipes, gpu, benchmarks) have no __init__.py:
    pytest's default "prepend" import mode imports each module by its file name, so a name used twice would
    clash."""
    names = Counter(path.name for path in Path(__file__).parent.rglob("*.py") if path.name != "conftest.py")
    if clashes := sorted(name for name, count in names.items() if count > 1):
        raise pytest.UsageError(f"test module names must be unique across tests/: {', '.join(clashes)}")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(1234)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama with its tokenizer and a JSONL summarization dataset (with 2 empty train documents)."""
    root = tmp_path_factory.mktemp("tiny_recipe")
    return {
        "model": make_tiny_model(root / "model"),
        "data": make_dataset(root / "data", empty_train_documents=2),
    }


@pytest.fixture(scope="session")
def recipe_results(tmp_path_factory) -> Path:
    """A real results folder of the summarization recipe (tiny Llama, 2 steps per run)."""
    from hf_gate_attention.recipes.summarization import RecipeConfig, run_comparison

    root = tmp_path_factory.mktemp("card_recipe")
    assets = {"model": make_tiny_model(root / "model"), "data": make_dataset(root / "data")}
    keys = tiny_config(
        assets,
        root / "results",
        runs=RESULTS_RUNS,
        eval_steps=None,
        max_steps=2,
        speed_examples=1,
    )
    return run_comparison(RecipeConfig.from_dict(keys))
