"""What a dense gate costs per decode step under `torch.compile` on the CPU (SmolLM2-135M-Instruct).

One model instance per case (ungated; `output` headwise and elementwise and `qk` headwise gates on backend
`torch`, `init="paper"`), each in a process of its own (so that no case's compiled code shares dynamo's
caches and guards with another's), with a StaticCache of `--context` prefilled tokens and its `forward`
compiled by `torch.compile` (inductor, `fullgraph=True`: a graph break fails the run instead of hiding in it);
the processes compile one after the other, then only the one being timed runs. A
decode step writes the token after the context, at the same cache position every time, so that every step
of every round does the same work. Each round times `--steps` steps of every case, in an order rotated from
round to round, after a warm-up round that also compiles; the ratio is that of the cases' 10th percentiles
over rounds (other processes only ever add time), beside the median [range] of the per-round ratios.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/compiled_decode.py --out benchmarks/results/compiled_decode

`--sparse` times instead the ungated model, the dense headwise gate and the reproduction's sparse runs that
keep quality (`SPARSE_CASES`: top-2 / top-1 of 3 key/value groups, dropped groups reading a sink of 4 and a
window of 64 keys), whose compiled decode step runs every head in one masked SDPA call (`core/sparse.py`):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/compiled_decode.py --sparse --context 1024 \
        --out benchmarks/results/compiled_decode_sparse

A StaticCache passes a mask, and with a mask transformers' SDPA attention repeats the key/value heads for
their query heads (`use_gqa_in_sdpa`: CUDA's fused kernels take grouped heads only without a mask), a copy of
the cache per layer and step that the sparse path's own SDPA call does not make (`enable_gqa=True`).
`--force-gqa` sets `TRANSFORMERS_SDPA_FORCE_GQA=1` in every case's process, so that no case copies.

Run it on an otherwise idle machine (compiling takes a few minutes per case on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import statistics
import time

import torch
import transformers
from gate_cost import low
from harness import (
    command_line,
    cpu_model,
    interleaved,
    markdown_page,
    markdown_table,
    median_range,
    ratios,
    write_results,
)
from overhead import load_model

from hf_gate_attention import GateConfig, patch
from hf_gate_attention.offline import resolve_model

CASES = {
    "ungated": None,
    "output/headwise": {"variant": "output", "granularity": "headwise"},
    "output/elementwise": {"variant": "output", "granularity": "elementwise"},
    "qk/headwise": {"variant": "qk", "granularity": "headwise"},
}
SINK_WINDOW = {"top_k_unit": "kv_group", "top_k_sink": 4, "top_k_window": 64}
SPARSE_CASES = {
    "ungated": None,
    "output/headwise": CASES["output/headwise"],
    "top-2 of 3, sink 4 + window 64": {**CASES["output/headwise"], "top_k": 2, **SINK_WINDOW},
    "top-1 of 3, sink 4 + window 64": {**CASES["output/headwise"], "top_k": 1, **SINK_WINDOW},
}


class CompiledDecoder:
    """One model with its compiled `forward` and a StaticCache holding `context` tokens."""

    def __init__(self, path: str, gate: dict | None, context: int):
        self.model = load_model(path).eval()
        if gate is not None:
            torch.manual_seed(0)
            patch(self.model, GateConfig(init="paper", **gate), backend="torch")
        config = self.model.config
        self.cache = transformers.StaticCache(config=config, max_cache_len=context + 1)
        prompt = torch.randint(config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            self.model(input_ids=prompt, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.forward = torch.compile(self.model.forward, fullgraph=True)
        self.token, self.context = prompt[:, -1:], context

    @torch.no_grad()
    def step_seconds(self, steps: int) -> float:
        """Mean seconds of `steps` decode steps, each writing the same cache slot (the cache's write position
        is put back after each step, outside the timing)."""
        elapsed = 0.0
        for _ in range(steps):
            start = time.perf_counter()
            self.forward(input_ids=self.token, cache=self.cache, use_cache=True)
            elapsed += time.perf_counter() - start
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(self.context)
        return elapsed / steps


def _serve(connection, path: str, gate: dict | None, context: int, threads: int) -> None:
    """A case's process: compiles its decoder (one untimed step), says so, then times `steps` steps per
    request until it gets `None`."""
    torch.set_num_threads(threads)
    decoder = CompiledDecoder(path, gate, context)
    connection.send(decoder.step_seconds(1))
    while (steps := connection.recv()) is not None:
        connection.send(decoder.step_seconds(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache before the step")
    parser.add_argument("--steps", type=int, default=4, help="decode steps per case and round")
    parser.add_argument("--rounds", type=int, default=60, help="timed rounds, after a warm-up round")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--sparse", action="store_true", help="the cases of SPARSE_CASES instead")
    parser.add_argument(
        "--force-gqa", action="store_true", help="TRANSFORMERS_SDPA_FORCE_GQA=1: no case repeats key/value"
    )
    parser.add_argument("--out", default="benchmarks/results/compiled_decode", help="writes <out>.csv/.md")
    args = parser.parse_args()
    cases = SPARSE_CASES if args.sparse else CASES
    if args.force_gqa:
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"  # inherited by the cases' processes
    gqa = "grouped key/value heads in every SDPA call" if args.force_gqa else "transformers' default GQA"
    path = resolve_model("SmolLM2-135M-Instruct")
    spawn = multiprocessing.get_context("spawn")
    connections, processes = {}, []
    for case, gate in cases.items():
        connections[case], child = spawn.Pipe()
        processes.append(spawn.Process(target=_serve, args=(child, path, gate, args.context, args.threads)))
        processes[-1].start()
        connections[case].recv()  # compiled

    def time_case(case: str) -> float:
        connections[case].send(args.steps)
        return connections[case].recv()

    times = interleaved(time_case, list(cases), args.rounds)
    for connection in connections.values():
        connection.send(None)
    for process in processes:
        process.join()
    rows = []
    for case in cases:
        ratio, ratio_min, ratio_max = median_range(ratios(times[case], times["ungated"]))
        rows.append(
            {
                "case": case,
                "ms_per_step": 1e3 * low(times[case]),
                "low_ratio": low(times[case]) / low(times["ungated"]),
                "time_ratio": ratio,
                "ratio_min": ratio_min,
                "ratio_max": ratio_max,
                "median_ms_per_step": 1e3 * statistics.median(times[case]),
                "rounds": len(times[case]),
            }
        )
    header = (
        f"`{command_line()}` on {datetime.date.today()}: SmolLM2-135M-Instruct float32, torch.compile "
        f"(inductor, fullgraph), one process per case, batch 1, StaticCache of {args.context} tokens, "
        f"{args.steps} decode steps per round, {args.rounds} interleaved rounds after a warm-up round, "
        f"{gqa}; "
        f"{cpu_model()}, {args.threads} threads; torch {torch.__version__}. ms per step: 10th percentile of "
        "the rounds. Time ratio: case / ungated, of the 10th percentiles, and the median [range] of the "
        "per-round ratios."
    )
    cells = [
        [
            r["case"],
            f"{r['ms_per_step']:.2f}",
            f"x{r['low_ratio']:.3f}",
            f"x{r['time_ratio']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]",
        ]
        for r in rows
    ]
    columns = ["case", "ms per step", "time ratio (10th percentiles)", "time ratio, median [rounds]"]
    page = markdown_page(header, markdown_table(columns, cells, "lrll"))
    write_results(args.out, rows, page)
    print(page)


if __name__ == "__main__":
    main()
