"""Compile the split-KV decode kernels and the fused gate pass (`gate_multiply.py`, backend `fused_gate`) for
an H100/H200 (sm_90) without a GPU: Triton's front end, its passes and the ptxas it ships, for the flag
combinations the launchers pass. Run as a script in a process without Triton's interpreter
(`test_decode_kernel.py` does); exits non-zero, naming every failure, after compiling all.

The interpreter runs the kernels' Python, not Triton's compiler: a kernel it accepts can still fail to
compile (types of loop bounds, constexpr branches), and a GPU is rarely at hand to find out. Each kernel is
compiled twice, as Triton's JIT specialises a launch:

- plain: no argument known to be a multiple of 16 (odd strides);
- aligned: 16-byte aligned pointers and the integers that are multiples of 16 for head_dim 64 and
  contiguous tensors (`ALIGNED`), marked `tt.divisibility=16` as the JIT marks them. The code must then be
  what a memory-bound kernel needs: 16-byte global loads (`cp.async` or vector loads), no 2-byte global
  accesses but a headwise gate's one logit per row, and no register spills (ptxas's report); checked for
  decode's tile in bfloat16 (one query, 4 heads per group), the merge and the gate pass. The decode kernel's
  largest tile (16 queries) and float32 are compiled and their registers and spills printed, not checked:
  they spill (docs/backends.md). A GPU measures the speed; this catches code shapes that would cap it.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET", "0") != "0":
    sys.exit("run without TRITON_INTERPRET: the interpreter replaces the kernels the compiler needs")

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from hf_gate_attention.kernels import decode_attention, gate_multiply, gated_attention

HOPPER = GPUTarget("cuda", 90, 32)
DOT = {"bf16": (tl.bfloat16, "tf32"), "fp32": (tl.float32, "ieee")}
# runtime integers that are multiples of 16 for q (B, H, Lq, 64) and a contiguous cache (B, KV, S, 64): the
# strides, the head dim and the keys per chunk (whole blocks of BLOCK_N)
ALIGNED = {"stride_qb", "stride_qh", "stride_ql", "stride_kb", "stride_kh", "stride_ks", "stride_vb"}
ALIGNED |= {"stride_vh", "stride_vs", "D", "CHUNK", "stride_xn", "stride_xg", "stride_zn"}
NARROW_GLOBAL_ACCESS = re.compile(r"\b(?:ld|st)\.global(?:\.\w+)*?\.[bfu]16\b")
WIDE_GLOBAL_LOAD = re.compile(r"\bcp\.async\b|\bld\.global(?:\.\w+)*?\.v[24]\.")
FLOATS = ("sm_scale", "gate_scale")  # the kernels' float arguments
FLASH_KERNELS = (
    "_gated_attention_fwd_kernel",
    "_gated_attention_bwd_dkdv_kernel",
    "_gated_attention_bwd_dq_kernel",
)
FLASH_TENSORS = ("Q", "K", "V", "Z", "DOUT", "OUT", "DQ", "DK", "DV")
FLASH_TRAINING_FLAGS = {"CAUSAL": True, "HAS_KPM": False, "HAS_KV_LEN": False, "HAS_GATE": True}
FLASH_TRAINING_FLAGS |= {
    "HAS_KEEP": False,
    "ELEMENTWISE": False,
    "DOT_DTYPE": tl.bfloat16,
    "DOT_PRECISION": "tf32",
}
SPILLS = re.compile(r"(\d+) bytes spill stores")


def compile_for_hopper(kernel, pointers: dict[str, str], constants: dict, aligned: bool, options=None):
    """`kernel` compiled with `pointers` (argument -> Triton pointer type), `FLOATS` as fp32 and the other
    runtime arguments as i32; with `aligned`, the pointers and the integers of `ALIGNED` marked divisible by
    16. Returns Triton's compiled kernel."""
    signature = {
        name: "constexpr" if name in constants else pointers.get(name, "fp32" if name in FLOATS else "i32")
        for name in kernel.arg_names
    }
    attrs = {}
    if aligned:
        attrs = {
            (index,): [["tt.divisibility", 16]]
            for index, name in enumerate(kernel.arg_names)
            if name in pointers or name in ALIGNED
        }
    return triton.compile(ASTSource(kernel, signature, constants, attrs), target=HOPPER, options=options)


def code_problems(compiled, narrow_ok: bool) -> tuple[list[str], str]:
    """What is wrong with an aligned compilation's code (2-byte global accesses unless `narrow_ok`, no
    16-byte global load, spills), and ptxas's register and spill lines."""
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        command = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", source.name, "-o", os.devnull]
        report = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    problems = []
    if not narrow_ok:
        problems += [
            f"2-byte global access {access}" for access in sorted(set(NARROW_GLOBAL_ACCESS.findall(ptx)))
        ]
    if not WIDE_GLOBAL_LOAD.search(ptx):
        problems.append("no 16-byte global load (cp.async or ld.global.v4)")
    spills = [int(count) for count in SPILLS.findall(report)]
    if not spills or max(spills) > 0:
        problems.append(f"{max(spills, default='?')} bytes of register spill stores")
    usage = "; ".join(line.split(":", 1)[-1].strip() for line in report.splitlines() if "registers" in line)
    return problems, usage


def split_kernels():
    """`(name, constants, dtype, checked)`: every (keep, streaming, kept first) the launcher combines, in bf16
    with every mask, at decode's tile (one query, 4 heads per group: BLOCK_M 16), `checked`; and, compiled
    and reported only, 16 queries of 4 heads (BLOCK_M 64: the largest tile) and float32 for two of them."""
    modes = [(False, False, False), *itertools.product([True], [False, True], [False, True])]
    variants = [(mode, "bf16", True, 16, 4) for mode in modes]
    variants += [(mode, "bf16", True, 64, 64) for mode in (modes[0], modes[4])]
    variants += [(mode, "fp32", False, 16, 4) for mode in (modes[0], modes[2])]
    for (keep, streaming, kept_first), dtype, masks, block_m, rows in variants:
        name = f"split keep={keep} streaming={streaming} kept_first={kept_first} {dtype} masks={masks}"
        yield f"{name} BLOCK_M={block_m}", {
            "CAUSAL": masks, "HAS_KPM": masks, "HAS_KV_LEN": masks, "HAS_KEEP": keep, "STREAMING": streaming,
            "KEPT_FIRST": kept_first, "DOT_DTYPE": DOT[dtype][0], "DOT_PRECISION": DOT[dtype][1],
            "BLOCK_D": 64, "BLOCK_M": block_m, "BLOCK_N": decode_attention.BLOCK_N, "BLOCK_KV": 8,
            "BLOCK_GL": rows,
        }, dtype, dtype == "bf16" and block_m == 16  # fmt: skip


def kernels():
    """`(name, kernel, pointers, constants, checked, narrow_ok)` of every compilation."""
    for name, constants, dtype, checked in split_kernels():
        pointers = dict.fromkeys(["Q", "K", "V"], f"*{dtype}")
        pointers.update(KEEP="*fp32", KPM="*i8", KV_LEN="*i64", SINK_STOP="*i32", WINDOW_START="*i32")
        pointers.update(PART_OUT="*fp32", PART_LSE="*fp32")
        yield name, decode_attention._decode_split_kernel, pointers, constants, checked, False
    merge = decode_attention._decode_merge_kernel
    for gate, keep, elementwise in [(True, True, True), (True, False, False), (False, True, False)]:
        pointers = {"PART_OUT": "*fp32", "PART_LSE": "*fp32", "Z": "*bf16", "KEEP": "*fp32", "OUT": "*bf16"}
        constants = {"HAS_GATE": gate, "HAS_KEEP": keep, "ELEMENTWISE": elementwise, "BLOCK_D": 64}
        constants["BLOCK_R"] = decode_attention.MERGE_BLOCK_R
        name = f"merge gate={gate} keep={keep} elementwise={elementwise}"
        yield (
            name,
            merge,
            pointers,
            constants,
            True,
            gate and not elementwise,
        )  # headwise: a 2-byte logit a row
    pointers = dict.fromkeys(["X", "Z", "OUT", "DOUT", "DX", "DZ"], "*bf16") | {"KEEP": "*fp32"}
    passes = (gate_multiply._gate_multiply_fwd_kernel, gate_multiply._gate_multiply_bwd_kernel)
    for kernel, elementwise, keep in itertools.product(passes, (False, True), (False, True)):
        constants = {"HAS_KEEP": keep, "ELEMENTWISE": elementwise, "BLOCK_R": 64, "BLOCK_D": 64}
        name = f"{kernel.__name__} elementwise={elementwise} keep={keep}"
        yield name, kernel, pointers, constants, True, not elementwise


def flash_candidates():
    """`(name, kernel, pointers, constants, num_warps, num_stages)`: every autotuning candidate of the fused
    attention's kernels at head dims 64 and 128 with a training step's flags (causal, a headwise gate, no
    padding, no top-k), bfloat16."""
    for autotuner in (
        gated_attention._gated_attention_fwd_kernel,
        gated_attention._gated_attention_bwd_dkdv_kernel,
        gated_attention._gated_attention_bwd_dq_kernel,
    ):
        kernel = autotuner.fn
        pointers = {name: "*bf16" for name in kernel.arg_names if name in FLASH_TENSORS}
        pointers.update(LSE="*fp32", DELTA="*fp32", KEEP="*fp32", KPM="*i8", KV_LEN="*i64")
        pointers = {name: kind for name, kind in pointers.items() if name in kernel.arg_names}
        for head_dim, config in itertools.product((64, 128), autotuner.configs):
            constants = {**FLASH_TRAINING_FLAGS, "BLOCK_D": head_dim, **config.kwargs}
            name = f"{kernel.__name__} head_dim={head_dim} {config.kwargs} warps={config.num_warps}"
            yield name, kernel, pointers, constants, config.num_warps, config.num_stages


def main() -> None:
    failures = []
    for name, kernel, pointers, constants, checked, narrow_ok in kernels():
        compile_for_hopper(kernel, pointers, constants, aligned=False)
        aligned = compile_for_hopper(kernel, pointers, constants, aligned=True)
        problems, usage = code_problems(aligned, narrow_ok)
        if checked:
            failures += [f"{name}: {problem}" for problem in problems]
        print("compiled", name, "|", usage, "|", "; ".join(problems) or "ok", flush=True)
    spill_free = set()  # (kernel, head dim) with a candidate that does not spill
    for name, kernel, pointers, constants, num_warps, num_stages in flash_candidates():
        options = {"num_warps": num_warps, "num_stages": num_stages}
        compiled = compile_for_hopper(kernel, pointers, constants, aligned=True, options=options)
        problems, usage = code_problems(compiled, narrow_ok=True)
        if not any("spill" in problem for problem in problems):
            spill_free.add((kernel.__name__, constants["BLOCK_D"]))
        print("compiled", name, "|", usage, "|", "; ".join(problems) or "ok", flush=True)
    for kernel, head_dim in itertools.product(FLASH_KERNELS, (64, 128)):
        if (kernel, head_dim) not in spill_free:
            failures.append(f"{kernel} head_dim={head_dim}: every autotuning candidate spills registers")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
