"""tests/gpu: one config per autotuned kernel on the GPU (compile time); in the CPU check mode (gpu_setup.py),
bfloat16 rounds to nearest in Triton's interpreter."""

from __future__ import annotations

import os

import pytest
from gpu_setup import DEVICE, ON_CPU
from helpers import interpreter_rounds_bfloat16_to_nearest


@pytest.fixture(autouse=True)
def _interpreter_bfloat16_rounds_to_nearest(monkeypatch):
    """In the CPU check mode, bfloat16 rounds to nearest in Triton's interpreter, as on a GPU."""
    if ON_CPU:
        interpreter_rounds_bfloat16_to_nearest(monkeypatch)


@pytest.fixture(scope="module", autouse=True)
def _one_config_per_autotuned_kernel():
    """Compile time on the GPU: each `triton.autotune`d kernel of hf_gate_attention.kernels runs with one
    config (the smallest block, the quickest to compile) instead of compiling and timing all of them for each
    causality x dtype. Compiled for sm_90 on a 2-core CPU, the 4 configs of each of the 3 attention kernels
    take 27 s (float32) + 9 s (bfloat16) per causality, ~70 s of this folder's 3-minute budget; one config a
    quarter of that. These tests check what the kernels compute inside whole models, which any config must
    give; tuning is benchmarks/attention_kernels.py's. Restored after each module.
    `HF_GATE_GPU_TESTS_AUTOTUNE=1` keeps the full autotuning."""
    if DEVICE != "cuda" or os.environ.get("HF_GATE_GPU_TESTS_AUTOTUNE") == "1":
        yield
        return
    import importlib
    import pkgutil

    from triton.runtime.autotuner import Autotuner

    import hf_gate_attention.kernels as kernels

    tuned = []
    for info in pkgutil.walk_packages(kernels.__path__, kernels.__name__ + "."):
        module = importlib.import_module(info.name)
        tuned += [k for k in vars(module).values() if isinstance(k, Autotuner) and len(k.configs) > 1]
    saved = {kernel: kernel.configs for kernel in tuned}
    for kernel in tuned:
        smallest = min(kernel.configs, key=lambda c: (_block_area(c), c.num_stages, c.num_warps))
        kernel.configs = [smallest]
    yield
    for kernel, configs in saved.items():
        kernel.configs = configs


def _block_area(config) -> int:
    area = 1
    for name, value in config.kwargs.items():
        if name.startswith("BLOCK") and isinstance(value, int):
            area *= value
    return area
