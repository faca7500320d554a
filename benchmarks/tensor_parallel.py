"""Step time of gated against ungated attention under transformers' tensor parallelism, and in one process.

A random Llama (`--layers` layers of hidden 512, 8 query heads and 4 key/value heads of 64, MLP 1,376,
vocabulary 32,000: SmolLM2-135M's 9 heads and 3 key/value heads do not share out across 2 ranks) is saved once
ungated and once per gate (`--gates`, random gate weights), then every checkpoint is loaded with
`DistributedConfig(tp_size=N)` (the model's own TP plan) under `torchrun` (`hf_gate_attention.from_pretrained`
for the gated ones) and timed in the same interleaved rounds (`harness.py`): a `--length`-token prefill
without gradients, and a training step (forward, backward and an SGD step of every parameter) on the same
tokens. Each rank runs with one thread; the time of a call is rank 0's, after a barrier before and after it.
The ratio of a gate is the median over rounds of (gated / ungated of the same round), with its range.

The gate's one-process cost is the same script under `torchrun --nproc_per_node 1` (no TP: one process, one
thread): run both on an otherwise idle machine, one after the other, and compare the ratios:

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        benchmarks/tensor_parallel.py --out benchmarks/results/tensor_parallel_tp2
    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 1 \\
        benchmarks/tensor_parallel.py --out benchmarks/results/tensor_parallel_tp1
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from harness import (
    command_line,
    cpu_model,
    interleaved,
    markdown_table,
    publish,
    ratio_cell,
    ratio_fields,
    ratios,
)

import hf_gate_attention
from hf_gate_attention import gate_parameters, patch

GATES = {
    "output headwise": {"variant": "output", "granularity": "headwise"},
    "output elementwise": {"variant": "output", "granularity": "elementwise"},
    "value headwise": {"variant": "value", "granularity": "headwise"},
    "qk headwise": {"variant": "qk", "granularity": "headwise"},
}
PHASES = ("prefill", "train step")


def llama_config(layers: int) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=512,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=1376,
        num_hidden_layers=layers,
        vocab_size=32000,
        max_position_embeddings=4096,
    )


def save_checkpoints(folder: Path, layers: int, gates: list[str]) -> dict[str, Path]:
    """Case name -> checkpoint: the ungated model and one gated copy per gate (rank 0 writes them)."""
    paths = {"ungated": folder / "ungated", **{gate: folder / gate.replace(" ", "-") for gate in gates}}
    if dist.get_rank() == 0:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(llama_config(layers))
        model.save_pretrained(paths["ungated"])
        for gate in gates:
            patched = patch(transformers.LlamaForCausalLM.from_pretrained(paths["ungated"]), **GATES[gate])
            for param in gate_parameters(patched):
                torch.nn.init.normal_(param, std=0.1)
            patched.save_pretrained(paths[gate])
    dist.barrier()
    return paths


def load(name: str, path: Path):
    world = dist.get_world_size()
    tp = {"distributed_config": transformers.DistributedConfig(tp_size=world)} if world > 1 else {}
    if name == "ungated":
        return transformers.LlamaForCausalLM.from_pretrained(path, **tp)
    return hf_gate_attention.from_pretrained(path, **tp)


def timed(call) -> float:
    """Seconds of `call()` on rank 0, every rank starting and ending together."""
    dist.barrier()
    start = time.perf_counter()
    call()
    dist.barrier()
    return time.perf_counter() - start


def step_calls(model, ids: torch.Tensor) -> dict:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

    def prefill():
        with torch.no_grad():
            model(input_ids=ids)

    def train_step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return {"prefill": prefill, "train step": train_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--gates", nargs="+", default=list(GATES), choices=list(GATES))
    parser.add_argument("--out", required=True, help="prefix of the .csv and .md files")
    parser.add_argument("--scratch", default=f"{tempfile.gettempdir()}/tensor_parallel_benchmark",
                        help="where the checkpoints are written, one folder for every rank")  # fmt: skip
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world = dist.get_world_size()
    paths = save_checkpoints(Path(args.scratch), args.layers, args.gates)
    ids = torch.randint(0, 32000, (1, args.length), generator=torch.Generator().manual_seed(1))
    calls = {}
    for name, path in paths.items():
        for phase, call in step_calls(load(name, path), ids).items():
            calls[(name, phase)] = call
    times = interleaved(lambda case: timed(calls[case]), list(calls), args.rounds)
    rows = []
    for name in paths:
        for phase in PHASES:
            row = {"case": name, "phase": phase, "tp_size": world, "rounds": len(times[(name, phase)])}
            row["median_s"] = statistics.median(times[(name, phase)])
            row |= ratio_fields("ratio", ratios(times[(name, phase)], times[("ungated", phase)]))
            rows.append(row)
    if dist.get_rank() == 0:
        header = (
            f"# Gated against ungated attention, TP size {world}\n\n"
            f"`OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc_per_node {world} "
            f"{command_line().removeprefix('python ')}` ({datetime.date.today()}, "
            f"{cpu_model()}, {world} process(es) of 1 thread, transformers {transformers.__version__}, torch "
            f"{torch.__version__}): {args.layers}-layer random Llama, {args.length} tokens, {args.rounds} "
            "interleaved rounds; ratio = median over rounds of gated / ungated of the same round [range]."
        )
        table = markdown_table(
            ["case", "phase", "median (ms)", "x ungated [range]"],
            [
                [
                    row["case"],
                    row["phase"],
                    f"{row['median_s'] * 1e3:.1f}",
                    ratio_cell(row),
                ]
                for row in rows
            ],
            align="llrr",
        )
        publish(args.out, rows, header, table)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
