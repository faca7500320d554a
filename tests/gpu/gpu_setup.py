"""Where the GPU checks of `tests/gpu` run, and the marks every one of them carries.

On a machine with CUDA they run there (`pytest -m gpu tests/gpu`); without CUDA they skip, unless the hidden
switch `HF_GATE_GPU_TESTS_ON_CPU=1` is set: the CPU check mode, for working on these tests without a GPU. It
runs the same comparisons on CPU, the Triton kernels through Triton's interpreter (`TRITON_INTERPRET=1`, set
by tests/conftest.py when CUDA is absent), CUDA-graph replay
replaced by plain calls on the same static buffers, and bfloat16 rounded to nearest in the interpreter as on a
GPU (tests/gpu/conftest.py). It checks the tests' logic, not the GPU; it is slow (minutes).
"""

from __future__ import annotations

import os

import pytest
import torch

ON_CPU = not torch.cuda.is_available() and os.environ.get("HF_GATE_GPU_TESTS_ON_CPU") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu" if ON_CPU else None
BACKENDS = ("fused_gate", "triton")  # the backends checked against backend="torch" (and in the recipes)
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE is None, reason="needs a CUDA GPU (HF_GATE_GPU_TESTS_ON_CPU=1: logic on CPU)"),
]


def require(*modules: str) -> None:
    """Skip unless every module imports (the GPU image may lack the recipes' packages, or have versions
    that fail to import: any error skips, naming it)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # an ImportError, or a version check failing on the image
            pytest.skip(f"{name} does not import here: {type(error).__name__}: {error}")
