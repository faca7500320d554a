"""Host time the gates add per layer to an eager decode step, on the CPU.

Eager decode of a small batch is host-bound: on an H200 every gate path cost x1.1-1.4 per token in eager mode
(benchmarks/results/gpu/), the GPU waiting for Python. This measures that host work without a GPU: a tiny
16-layer Llama (hidden 64, so that the tensor work is negligible) decodes `--steps` single tokens after a
32-token prompt, one thread, ungated and gated (`output/headwise`, `init="paper"`) on each backend of
`--backends`, in interleaved rounds after a warm-up round (benchmarks/harness.py); it prints the median time
per step and the added time per layer (median over rounds), with the range of the rounds, the aten ops
each gate adds per layer to one step (calls from Python into the dispatcher: on a GPU, each one is host work,
and each that computes a kernel launch; a count, not a timing, so it does not depend on the machine), and the
Python function calls it adds (also a count). Backend `torch, hooks`: the torch backend's gates run from hooks
as before its hook-free path (`core/hooks.py: use_hooks`). `--sparse` adds sparse top-k (`SPARSE_CASES`). It
writes the same as CSV. `--dtype bfloat16` as on the GPU (its casts are real ops there; on this CPU its
arithmetic is slow, so the times then mix in compute).

    HF_HUB_OFFLINE=1 TRITON_INTERPRET=1 .venv/bin/python benchmarks/host_overhead.py --out /tmp/host.csv

(`TRITON_INTERPRET=1` lets `fused_gate` run on the CPU; its decode steps use no Triton kernel.) Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from harness import (
    command_line,
    cpu_model,
    interleaved,
    markdown_page,
    markdown_table,
    median_range,
    write_results,
)
from torch.profiler import profile

from hf_gate_attention import GateConfig, patch, unpatch
from hf_gate_attention.core.hooks import use_hooks

LAYERS = 16
HOOKS = ", hooks"  # a backend's name + this: its gates run from hooks (`core/hooks.py: use_hooks`)
# `--sparse`: sparse top-k on backend `torch` (one of the 2 key/value groups kept per token), its dropped
# group reading nothing or its sink and window keys (the 33rd key on is outside them)
SPARSE_CASES = {
    "torch, top-1 of 2 groups": {"top_k": 1, "top_k_unit": "kv_group"},
    "torch, top-1 of 2 groups, sink 2 + window 8": {
        "top_k": 1,
        "top_k_unit": "kv_group",
        "top_k_sink": 2,
        "top_k_window": 8,
    },
}


def step_seconds(model, steps: int) -> float:
    """Mean seconds of one single-token decode step on a fresh DynamicCache of a 32-token prompt."""
    config = model.config
    with torch.no_grad():
        cache = transformers.DynamicCache(config=config)
        model(input_ids=torch.randint(0, config.vocab_size, (1, 32)), cache=cache, use_cache=True)
        token = torch.randint(0, config.vocab_size, (1, 1))
        start = time.perf_counter()
        for _ in range(steps):
            model(input_ids=token, cache=cache, use_cache=True)
        return (time.perf_counter() - start) / steps


def ops_per_step(model) -> int:
    """The aten ops called from Python (not from inside another aten op) in one decode step."""
    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=torch.zeros(1, 32, dtype=torch.long), cache=cache, use_cache=True)
        with profile() as trace:
            model(input_ids=torch.zeros(1, 1, dtype=torch.long), cache=cache, use_cache=True)
    aten = [event for event in trace.events() if event.name.startswith("aten::")]
    return sum(not (event.cpu_parent and event.cpu_parent.name.startswith("aten::")) for event in aten)


def python_calls_per_step(model) -> int:
    """The Python function calls (the interpreter's `call` events; C functions apart) in one decode step."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    with torch.no_grad():
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=torch.zeros(1, 32, dtype=torch.long), cache=cache, use_cache=True)
        sys.setprofile(count)
        try:
            model(input_ids=torch.zeros(1, 1, dtype=torch.long), cache=cache, use_cache=True)
        finally:
            sys.setprofile(None)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["torch", f"torch{HOOKS}", "fused_gate"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--init", choices=["paper", "identity"], default="paper", help="gate scale 1 or 2")
    parser.add_argument("--sparse", action="store_true", help="also the cases of SPARSE_CASES")
    parser.add_argument("--out", default="host_overhead.csv", help="writes this CSV and the same name .md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    model = transformers.LlamaForCausalLM(config).eval().to(getattr(torch, args.dtype))
    cases = ["ungated", *args.backends, *(SPARSE_CASES if args.sparse else ())]

    def measure(case, measurement, *options):
        if case != "ungated":
            gate = GateConfig(init=args.init, **SPARSE_CASES.get(case, {}))
            patch(model, gate, backend=case.split(",")[0])
            if case.endswith(HOOKS):
                use_hooks(model)
        result = measurement(model, *options)
        if case != "ungated":
            unpatch(model)
        return result

    ops = {case: measure(case, ops_per_step) for case in cases}
    calls = {case: measure(case, python_calls_per_step) for case in cases}
    seconds = interleaved(lambda case: measure(case, step_seconds, args.steps), cases, args.rounds)
    rows = []
    for case in cases:
        added = [(s - b) / LAYERS * 1e6 for s, b in zip(seconds[case], seconds["ungated"], strict=True)]
        median, low, high = median_range(added)
        rows.append(
            {
                "case": case,
                "ms_per_step": statistics.median(seconds[case]) * 1e3,
                "added_us_per_layer": median,
                "added_min": low,
                "added_max": high,
                "added_ops_per_layer": (ops[case] - ops["ungated"]) / LAYERS,
                "added_python_calls_per_layer": (calls[case] - calls["ungated"]) / LAYERS,
            }
        )
    cells = [
        [
            r["case"],
            f"{r['ms_per_step']:.2f}",
            f"{r['added_us_per_layer']:.0f} [{r['added_min']:.0f}, {r['added_max']:.0f}]",
            f"{r['added_ops_per_layer']:g}",
            f"{r['added_python_calls_per_layer']:g}",
        ]
        for r in rows
    ]
    header = ["case", "ms per step", "added us per layer [min, max]", "added aten ops per layer"]
    header.append("added Python calls per layer")
    title = (
        f"`{command_line()}` on {datetime.date.today()}: tiny {LAYERS}-layer Llama, {args.dtype}, "
        f'GateConfig(init="{args.init}"), {args.rounds} interleaved rounds of {args.steps} decode steps; '
        f"{cpu_model()}, 1 thread; torch {torch.__version__}."
    )
    page = markdown_page(title, markdown_table(header, cells))
    print(page)
    write_results(Path(args.out).with_suffix(""), rows, page)


if __name__ == "__main__":
    main()
