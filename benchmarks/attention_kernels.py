"""Speed and peak memory of the fused gated attention kernel against PyTorch SDPA, on a CUDA GPU.

First a correctness check (the fused kernel's output and gradients against a float64 reference, within twice
PyTorch's own bfloat16 error), then, for each shape, CUDA-event timings (warm-up, then the median of
`--repeats` runs) of forward, backward and forward+backward for:

- `sdpa`: ungated `F.scaled_dot_product_attention` on its flash / cuDNN backends (the speed of light);
- `sdpa+torch_gate`: the same, then the gate in plain torch ops (`out * (s * sigmoid(z.float())).to(dtype)`),
  what the `torch` backend runs;
- `fused`: `gated_flash_attention`, the gate in the kernel's epilogue.

Shapes: bfloat16, `--tokens` tokens per batch (batch = tokens / L) and `--hidden` / head_dim heads, so that
batch x heads fill the GPU at every L; q, k, v are transposed views of (B, L, H, D) tensors, as transformers
passes them. TFLOP/s count the attention matmuls only (4 B H L S D, halved when causal; backward 2.5x
forward), the same for every method. Peak memory: `torch.cuda.max_memory_allocated` during one call, less
what was allocated before it (inputs included there).

Targets on an H200: fused forward >= 0.9x and backward >= 0.8x the throughput of `sdpa`, never slower than
`sdpa+torch_gate`, peak memory linear in L. The printed ratios are against `sdpa` of the same row.

Example (on a CUDA machine):

    .venv/bin/python benchmarks/attention_kernels.py     # all shapes: benchmarks/results/kernels.csv
    .venv/bin/python benchmarks/attention_kernels.py --seq-lens 1024 --head-dims 64 --repeats 5 --out q.csv
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from harness import write_csv
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_gate_attention.kernels import gated_attention_reference, gated_flash_attention, triton_available

GATE_SCALE = 2.0
METHODS = ("sdpa", "sdpa+torch_gate", "fused")
PASSES = ("fwd", "bwd", "fwd+bwd")
# printed columns and their widths (the CSV has them all, with the dtype)
COLUMNS = {
    "method": 15,
    "pass": 7,
    "causal": 6,
    "granularity": 11,
    "batch": 5,
    "heads": 5,
    "seq_len": 7,
    "head_dim": 8,
    "median_ms": 9,
    "tflops": 7,
    "peak_mib": 9,
    "throughput_vs_sdpa": 18,
}


def sdpa(q, k, v, gate_logits, causal):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)  # (B, L, H, D)


def sdpa_torch_gate(q, k, v, gate_logits, causal):
    out = sdpa(q, k, v, None, causal)  # (B, L, H, D)
    return out * (GATE_SCALE * torch.sigmoid(gate_logits.float())).to(out.dtype)


def fused(q, k, v, gate_logits, causal):
    return gated_flash_attention(q, k, v, gate_logits, GATE_SCALE, causal=causal)


FUNCTIONS = {"sdpa": sdpa, "sdpa+torch_gate": sdpa_torch_gate, "fused": fused}


def make_inputs(batch, heads, length, dim, width, dtype=torch.bfloat16, seed=0):
    """q, k, v `(B, H, L, D)`, transposed views of `(B, L, H, D)` tensors, and gate logits `(B, L, H, w)`."""
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=generator)

    q, k, v = (randn(batch, length, heads, dim).transpose(1, 2).requires_grad_() for _ in range(3))
    gate_logits = randn(batch, length, heads, width).requires_grad_()
    return q, k, v, gate_logits


def check_correctness(dim, width, causal) -> str | None:
    """`None` if the fused kernel is within twice PyTorch's bfloat16 error of float64, else a message."""
    q, k, v, gate_logits = make_inputs(2, 4, 1000, dim, width, seed=1)
    grad_out = torch.randn(2, 1000, 4, dim, device="cuda")
    inputs = (q, k, v, gate_logits)
    results = {}
    for name, dtype, fn in [
        ("fused", torch.bfloat16, fused),
        ("float64", torch.float64, None),
        ("torch bf16", torch.bfloat16, None),
    ]:
        leaves = [x.detach().to(dtype).requires_grad_() for x in inputs]
        if fn is None:
            out = gated_attention_reference(*leaves, gate_scale=GATE_SCALE, causal=causal)
        else:
            out = fn(*leaves, causal)
        out.backward(grad_out.to(dtype))
        results[name] = [out, *(x.grad for x in leaves)]
    for index, what in enumerate(("out", "dq", "dk", "dv", "dz")):
        ref = results["float64"][index]
        error = (results["fused"][index].double() - ref).abs().max().item()
        torch_error = (results["torch bf16"][index].double() - ref).abs().max().item()
        if not error <= 2 * torch_error + 1e-3:
            return f"{what}: max error {error:.3g} > 2 x PyTorch's bfloat16 error {torch_error:.3g} + 1e-3"
    return None


def time_ms(run, setup, warmup, repeats) -> float:
    """Median CUDA-event time of `run(setup())` in milliseconds (`setup` untimed)."""
    for _ in range(warmup):
        run(setup())
    times = []
    for _ in range(repeats):
        state = setup()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(state)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def peak_mib(run, setup) -> float:
    """Peak memory allocated by one `run(setup())` beyond what was allocated before it, in MiB."""
    state = setup()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run(state)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def measure(method, inputs, causal, grad_out, warmup, repeats) -> dict[str, tuple[float, float]]:
    """`{pass: (median ms, peak MiB)}` for one method on one shape."""
    fn = FUNCTIONS[method]
    q, k, v, gate_logits = inputs
    leaves = (q, k, v, gate_logits) if method != "sdpa" else (q, k, v)

    def forward(_):
        with torch.no_grad():
            fn(q, k, v, gate_logits, causal)

    def graph():
        for x in leaves:
            x.grad = None
        return fn(q, k, v, gate_logits, causal)

    def backward(out):
        out.backward(grad_out)

    def forward_backward(_):
        backward(graph())

    passes = {
        "fwd": (forward, lambda: None),
        "bwd": (backward, graph),
        "fwd+bwd": (forward_backward, lambda: None),
    }
    return {
        name: (time_ms(run, setup, warmup, repeats), peak_mib(run, setup))
        for name, (run, setup) in passes.items()
    }


def attention_tflop(batch, heads, length, dim, causal, pass_name) -> float:
    forward = 4 * batch * heads * length * length * dim * (0.5 if causal else 1.0)
    return forward * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_name] / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument(
        "--granularities", nargs="+", choices=["headwise", "elementwise"], default=["headwise"]
    )
    parser.add_argument("--causal", nargs="+", choices=["causal", "full"], default=["causal", "full"])
    parser.add_argument("--tokens", type=int, default=16384, help="batch x L of every shape")
    parser.add_argument("--hidden", type=int, default=2048, help="heads x head_dim of every shape")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default="benchmarks/results/kernels.csv")
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit(
            "benchmarks/attention_kernels.py needs a CUDA GPU; none is visible here, so nothing was measured."
        )
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        sys.exit("TRITON_INTERPRET is set: the kernels would run on CPU through the interpreter; unset it.")
    available, reason = triton_available()
    if not available:
        sys.exit(f"the Triton kernels cannot run: {reason}")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")

    cases = [
        (causal == "causal", dim, granularity)
        for causal in args.causal
        for dim in args.head_dims
        for granularity in args.granularities
    ]
    for causal, dim, granularity in cases:
        failure = check_correctness(dim, 1 if granularity == "headwise" else dim, causal)
        if failure:
            sys.exit(f"correctness check failed (D={dim}, {granularity}, causal={causal}): {failure}")
    print(f"correctness: fused output and gradients within 2x PyTorch's bfloat16 error ({len(cases)} cases)")

    rows = []
    print(" ".join(f"{name:>{width}}" for name, width in COLUMNS.items()))
    for causal, dim, granularity in cases:
        for length in args.seq_lens:
            batch, heads = max(1, args.tokens // length), args.hidden // dim
            inputs = make_inputs(batch, heads, length, dim, 1 if granularity == "headwise" else dim)
            grad_out = torch.randn(batch, length, heads, dim, device="cuda", dtype=torch.bfloat16)
            results = {
                method: measure(method, inputs, causal, grad_out, args.warmup, args.repeats)
                for method in METHODS
            }
            for method in METHODS:
                for pass_name in PASSES:
                    ms, mib = results[method][pass_name]
                    tflop = attention_tflop(batch, heads, length, dim, causal, pass_name)
                    row = {
                        "method": method,
                        "pass": pass_name,
                        "causal": causal,
                        "granularity": granularity,
                        "batch": batch,
                        "heads": heads,
                        "seq_len": length,
                        "head_dim": dim,
                        "dtype": "bfloat16",
                        "median_ms": round(ms, 4),
                        "tflops": round(tflop / (ms / 1e3), 2),
                        "peak_mib": round(mib, 1),
                        "throughput_vs_sdpa": round(results["sdpa"][pass_name][0] / ms, 3),
                    }
                    rows.append(row)
                    print(" ".join(f"{row[name]!s:>{width}}" for name, width in COLUMNS.items()))
            del inputs, grad_out, results
            torch.cuda.empty_cache()

    write_csv(Path(args.out), rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
