"""Compile the split-KV decode kernels for an H100/H200 (sm_90) without a GPU: Triton's front end, its
passes and the ptxas it ships, for the flag combinations the launcher passes. Run as a script in a process
without Triton's interpreter (`test_decode_kernel.py` does); exits non-zero on the first failure.

The interpreter runs the kernels' Python, not Triton's compiler: a kernel it accepts can still fail to
compile (types of loop bounds, constexpr branches), and a GPU is rarely at hand to find out.
"""

from __future__ import annotations

import itertools
import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") != "0":
    sys.exit("run without TRITON_INTERPRET: the interpreter replaces the kernels the compiler needs")

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hf_gate_attention.kernels import decode_attention

HOPPER = GPUTarget("cuda", 90, 32)
DOT = {"bf16": (tl.bfloat16, "tf32"), "fp32": (tl.float32, "ieee")}


def compile_for_hopper(kernel, pointers: dict[str, str], floats: tuple[str, ...], constants: dict) -> None:
    """`kernel` compiled with `pointers` (argument -> Triton pointer type), `floats` as fp32 and the other
    runtime arguments as i32."""
    signature = {
        name: "constexpr" if name in constants else pointers.get(name, "fp32" if name in floats else "i32")
        for name in kernel.arg_names
    }
    triton.compile(ASTSource(kernel, signature, constants), target=HOPPER)


def split_kernels():
    """Every (keep, streaming, kept first) the launcher combines, in bf16 with every mask; fp32 and no masks
    for two of them."""
    modes = [(False, False, False), *itertools.product([True], [False, True], [False, True])]
    variants = [(mode, "bf16", True) for mode in modes]
    variants += [(modes[0], "fp32", False), (modes[2], "fp32", False)]
    for (keep, streaming, kept_first), dtype, masks in variants:
        yield f"split keep={keep} streaming={streaming} kept_first={kept_first} {dtype} masks={masks}", {
            "CAUSAL": masks, "HAS_KPM": masks, "HAS_KV_LEN": masks, "HAS_KEEP": keep, "STREAMING": streaming,
            "KEPT_FIRST": kept_first, "DOT_DTYPE": DOT[dtype][0], "DOT_PRECISION": DOT[dtype][1],
            "BLOCK_D": 64, "BLOCK_M": decode_attention.MAX_BLOCK_M, "BLOCK_N": decode_attention.BLOCK_N,
            "BLOCK_KV": 8, "BLOCK_GL": 4,
        }, dtype  # fmt: skip


def main() -> None:
    for name, constants, dtype in split_kernels():
        pointers = dict.fromkeys(["Q", "K", "V"], f"*{dtype}")
        pointers.update(KEEP="*fp32", KPM="*i8", KV_LEN="*i64", SINK_STOP="*i32", WINDOW_START="*i32")
        pointers.update(PART_OUT="*fp32", PART_LSE="*fp32")
        compile_for_hopper(decode_attention._decode_split_kernel, pointers, ("sm_scale",), constants)
        print("compiled", name, flush=True)
    for gate, keep, elementwise in [(True, True, True), (True, False, False), (False, True, False)]:
        pointers = {"PART_OUT": "*fp32", "PART_LSE": "*fp32", "Z": "*bf16", "KEEP": "*fp32", "OUT": "*bf16"}
        constants = {"HAS_GATE": gate, "HAS_KEEP": keep, "ELEMENTWISE": elementwise, "BLOCK_D": 64}
        constants["BLOCK_R"] = decode_attention.MERGE_BLOCK_R
        compile_for_hopper(decode_attention._decode_merge_kernel, pointers, ("gate_scale",), constants)
        print(f"compiled merge gate={gate} keep={keep} elementwise={elementwise}", flush=True)


if __name__ == "__main__":
    main()
