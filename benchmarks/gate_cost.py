"""Where a dense gate's decode-step time goes on the CPU: the package's gate beside stripped-down versions.

A decode step of SmolLM2-135M-Instruct (batch 1, `--context`-token DynamicCache prefilled once and cropped
back after each round, `--steps` single-token forwards, no grad) is timed for each case, in many short
interleaved rounds after a warm-up round (`harness.py`). The headline ratio is that of the cases' 10th
percentiles over rounds (other processes only ever add time, so on a shared machine the low end of many short
rounds moves least); beside it the median over rounds of (case / ungated of the same round), with its range.
The gate is the headwise output gate (`init="paper"`: the paper's G1, 9 heads per layer).

- `ungated`: the model as loaded.
- `patched`: `patch(model, GateConfig(init="paper"), backend=--backend)`: what users run (backend `torch`:
  hook-free, `core/hooks.py: InlineForward` and `AttentionGate.gated`).
- `patched, hooks`: the same gate run from hooks with `apply_gate` (`core/hooks.py: use_hooks`), as `patch`
  ran it before the hook-free path: same bits.
- `no-op hooks`: three hooks per layer that do nothing, where `patch` puts its own (a forward pre-hook on the
  attention block, a forward hook on `q_proj`, a forward pre-hook on `o_proj`): the cost of hook dispatch.
- `inline, own GEMM`: no hook at all; `q_proj` and `o_proj` get a `forward` of their instance (as
  `kernels/query_gate.py` does) that keeps `x` / computes `sigmoid(x W_g + b_g)`, multiplies the attention
  output by it and projects: the gate's arithmetic with the least Python around it.
- `inline, merged GEMM`: the same with `[W_q; W_g]` in one GEMM (`z` taken from the query projection's
  output).
- `sigmoid and multiply only`: the floor of any eager gate: `o_proj` multiplies the attention output by the
  sigmoid of fixed logits (a tensor per layer, no GEMM, no query-side work), with the views that broadcast it.

The inline cases use their own random gate weights (same shapes and init as `patch`'s) and exist only here,
for the headwise output gate. `--variant`, `--granularity` and `--dtype` choose the gate and the model's dtype
(the other gates: ungated, patched and patched with hooks). Run it on an otherwise idle machine, with
`--threads` as the users' (torch's default: one per core) and 1:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gate_cost.py --out benchmarks/results/gate_cost
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gate_cost.py --threads 1 \
        --out benchmarks/results/gate_cost_1thread

With `--instructions` it counts, instead of timing, the instructions one decode step executes (one thread,
under valgrind's callgrind: `instructions.py`), once per case: deterministic where the timings are not, on a
busy machine too (about 10 minutes a run):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gate_cost.py --instructions \
        --out benchmarks/results/gate_cost_instructions_float32_output_headwise
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from functools import partial

import instructions
import torch
import transformers
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
from torch.nn import functional as F

from hf_gate_attention import GateConfig, patch, unpatch
from hf_gate_attention.core.hooks import use_hooks
from hf_gate_attention.offline import resolve_model

CASES = (
    "ungated",
    "patched",
    "patched, hooks",
    "no-op hooks",
    "inline, own GEMM",
    "inline, merged GEMM",
    "sigmoid and multiply only",
)
PACKAGE_CASES = CASES[:3]  # for gates other than the headwise output gate


class InlineQuery:
    """`q_proj.forward` of the inline cases: `q = x W_q^T`; keeps `x` (own GEMM) or, merged, computes
    `[q | z] = x [W_q; W_g]^T + [0; b_g]` in one GEMM and keeps `z`."""

    def __init__(self, query: torch.nn.Linear, gate_weight, gate_bias, kept: list, merged: bool):
        self.query, self.kept, self.merged = query, kept, merged
        self.n_q = query.out_features
        if merged:
            self.weight = torch.cat([query.weight, gate_weight]).detach()  # (n_q + G, hidden)
            self.bias = torch.cat([query.weight.new_zeros(self.n_q), gate_bias]).detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.merged:
            self.kept.append(x)
            return F.linear(x, self.query.weight)
        y = F.linear(x, self.weight, self.bias)  # (..., n_q + G)
        self.kept.append(y[..., self.n_q :])
        return y[..., : self.n_q]


class InlineOutput:
    """`o_proj.forward` of the inline cases: the attention output `(..., H*D)` times the gate per head, then
    the projection."""

    def __init__(self, output: torch.nn.Linear, gate_weight, gate_bias, kept: list, merged: bool, heads: int):
        self.output, self.kept, self.merged, self.heads = output, kept, merged, heads
        self.gate_weight, self.gate_bias = gate_weight.detach(), gate_bias.detach()

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        kept = self.kept.pop()
        logits = kept if self.merged else F.linear(kept, self.gate_weight, self.gate_bias)  # (..., H)
        gated = values.unflatten(-1, (self.heads, -1)) * torch.sigmoid(logits).unsqueeze(-1)  # (..., H, D)
        return F.linear(gated.flatten(-2), self.output.weight, self.output.bias)


class FixedLogits:
    """The `kept` of `InlineOutput` for `sigmoid and multiply only`: always the same logits `(1, 1, H)`."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def pop(self) -> torch.Tensor:
        return self.logits


def _noop_pre(module, args):
    return None


def _noop_post(module, args, output):
    return None


class Cases:
    """One model; installs and removes each case's gate around a timed decode."""

    def __init__(self, model, backend: str, gate_config: GateConfig):
        self.model, self.backend, self.gate_config = model, backend, gate_config
        config = model.config
        self.heads = config.num_attention_heads
        generator = torch.Generator().manual_seed(0)
        std = config.initializer_range
        self.gates = [
            (
                (torch.randn(self.heads, config.hidden_size, generator=generator) * std).to(model.dtype),
                torch.zeros(self.heads, dtype=model.dtype),
            )
            for _ in model.model.layers
        ]

    def install(self, case: str) -> list:
        """What `case` adds to the model; returns the hook handles (inline cases set instance forwards)."""
        if case.startswith("patched"):
            patch(self.model, self.gate_config, backend=self.backend)
            if case == "patched, hooks":
                use_hooks(self.model)
            return []
        handles = []
        for layer, (weight, bias) in zip(self.model.model.layers, self.gates, strict=True):
            attention = layer.self_attn
            if case == "no-op hooks":
                handles += [
                    attention.register_forward_pre_hook(_noop_pre),
                    attention.q_proj.register_forward_hook(_noop_post),
                    attention.o_proj.register_forward_pre_hook(_noop_pre),
                ]
            elif case == "sigmoid and multiply only":
                x = torch.randn(1, 1, weight.shape[1], dtype=weight.dtype)
                fixed = FixedLogits(F.linear(x, weight))  # (1, 1, H)
                output = InlineOutput(attention.o_proj, weight, bias, fixed, True, self.heads)
                attention.o_proj.forward = output
            elif case.startswith("inline"):
                kept, merged = [], case.endswith("merged GEMM")
                attention.q_proj.forward = InlineQuery(attention.q_proj, weight, bias, kept, merged)
                attention.o_proj.forward = InlineOutput(
                    attention.o_proj, weight, bias, kept, merged, self.heads
                )
        return handles

    def remove(self, case: str, handles: list) -> None:
        if case.startswith("patched"):
            unpatch(self.model)
        for handle in handles:
            handle.remove()
        for layer in self.model.model.layers:
            for projection in (layer.self_attn.q_proj, layer.self_attn.o_proj):
                projection.__dict__.pop("forward", None)

    def prefilled(self, context: int):
        """A DynamicCache holding random keys and values of `context` positions (a decode step's work does
        not depend on their values)."""
        config = self.model.config
        cache = transformers.DynamicCache(config=config)
        shape = (1, config.num_key_value_heads, context, config.hidden_size // config.num_attention_heads)
        for layer in range(config.num_hidden_layers):
            keys_and_values = torch.randn(2, *shape, dtype=self.model.dtype)
            cache.update(keys_and_values[0], keys_and_values[1], layer)
        return cache

    @torch.no_grad()
    def steps(self, cache, steps: int) -> None:
        token = torch.zeros(1, 1, dtype=torch.long)
        for _ in range(steps):
            self.model(input_ids=token, past_key_values=cache, use_cache=True)

    def decode(self, case: str, cache, steps: int) -> float:
        """Seconds per single-token step on `cache` with `case` installed; the cache is cropped back after."""
        handles = self.install(case)
        start = time.perf_counter()
        self.steps(cache, steps)
        elapsed = (time.perf_counter() - start) / steps
        cache.crop(-steps)
        self.remove(case, handles)
        return elapsed

    def decode_instructions(self, case: str, cache, steps: int) -> float:
        """Instructions per single-token step on `cache` with `case` installed, after two steps uncounted."""
        handles = self.install(case)
        self.steps(cache, 2)
        counted = instructions.count(partial(self.steps, cache, steps)) / steps
        cache.crop(-steps - 2)
        self.remove(case, handles)
        return counted


def low(values: list[float]) -> float:
    """The 10th percentile: other processes only ever add time, so the low end of many short rounds is the
    estimate least moved by them on a shared machine."""
    return statistics.quantiles(values, n=10)[0]


def timed(cases: Cases, cache, names: list[str], args) -> tuple[list[dict], str, list[str]]:
    """Rows, the table's header and columns of the timed rounds."""
    times = interleaved(lambda case: cases.decode(case, cache, args.steps), names, args.rounds)
    cpu = f"{cpu_model()}, {args.threads} threads"
    rows = []
    for case in names:
        ratio, ratio_min, ratio_max = median_range(ratios(times[case], times["ungated"]))
        rows.append(
            {
                "case": case,
                "ms_per_step": 1e3 * low(times[case]),
                "time_ratio": ratio,
                "ratio_min": ratio_min,
                "ratio_max": ratio_max,
                "low_ratio": low(times[case]) / low(times["ungated"]),
                "added_us_per_layer": (low(times[case]) - low(times["ungated"])) * 1e6 / len(cases.gates),
                "rounds": len(times[case]),
                "cpu": cpu,
            }
        )
    header = (
        f"{args.steps} decode steps per round on a {args.context}-token DynamicCache (cropped back after "
        f"each), {args.rounds} interleaved rounds after a warm-up round; {cpu}. ms per step and added us per "
        "layer: 10th percentiles of the rounds. Time ratio: case / ungated, of the 10th percentiles, and the "
        "median [range] of the per-round ratios."
    )
    cells = [
        [
            r["case"],
            f"{r['ms_per_step']:.2f}",
            f"x{r['low_ratio']:.3f}",
            f"x{r['time_ratio']:.3f} [{r['ratio_min']:.3f}, {r['ratio_max']:.3f}]",
            f"{r['added_us_per_layer']:.0f}",
        ]
        for r in rows
    ]
    columns = ["case", "ms per step", "time ratio (10th percentiles)", "time ratio, median [rounds]"]
    return rows, header, markdown_table([*columns, "added us per layer"], cells, "lrllr")


def counted(cases: Cases, cache, names: list[str], args) -> tuple[list[dict], str, list[str]]:
    """Rows, the table's header and columns of the instruction counts."""
    counts = {case: cases.decode_instructions(case, cache, args.steps) for case in names}
    rows = [
        {
            "case": case,
            "instructions_per_step": counts[case],
            "instruction_ratio": counts[case] / counts["ungated"],
            "added_instructions_per_layer": (counts[case] - counts["ungated"]) / len(cases.gates),
        }
        for case in names
    ]
    header = (
        f"Instructions executed per decode step (mean of {args.steps} steps after 2 uncounted, on a "
        f"{args.context}-token DynamicCache), counted by valgrind's callgrind in one thread "
        "(`benchmarks/instructions.py`: the same count on every run, within about 0.5 %); "
        f"{cpu_model()}. A count, not a time: memory stalls are not in it."
    )
    cells = [
        [
            r["case"],
            f"{r['instructions_per_step'] / 1e6:.2f}",
            f"x{r['instruction_ratio']:.4f}",
            f"{r['added_instructions_per_layer'] / 1e3:.1f}",
        ]
        for r in rows
    ]
    columns = ["case", "million instructions per step", "ratio", "added thousand instructions per layer"]
    return rows, header, markdown_table(columns, cells, "lrlr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context", type=int, default=256, help="tokens in the cache before decoding")
    parser.add_argument("--steps", type=int, default=4, help="decoded tokens per measurement")
    parser.add_argument("--rounds", type=int, default=100, help="timed rounds, after a warm-up round")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--backend", default="torch", help="what runs the gates of the `patched` case")
    parser.add_argument("--variant", default="output", choices=["output", "value", "qk"])
    parser.add_argument("--granularity", default="headwise", choices=["headwise", "elementwise"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's")
    parser.add_argument("--instructions", action="store_true", help="count instructions instead of timing")
    parser.add_argument(
        "--model", default="SmolLM2-135M-Instruct", help="local folder, Hub id or offline name"
    )
    parser.add_argument("--out", default="benchmarks/results/gate_cost", help="writes <out>.csv and <out>.md")
    args = parser.parse_args()
    if args.instructions:
        instructions.run_under_callgrind()  # exits here outside callgrind
        args.threads = 1
    torch.set_num_threads(args.threads)
    gate_config = GateConfig(variant=args.variant, granularity=args.granularity, init="paper")
    model = load_model(resolve_model(args.model)).to(getattr(torch, args.dtype))
    cases = Cases(model, args.backend, gate_config)
    cache = cases.prefilled(args.context)
    names = list(CASES if (args.variant, args.granularity) == ("output", "headwise") else PACKAGE_CASES)
    rows, details, table = (counted if args.instructions else timed)(cases, cache, names, args)
    for row in rows:
        row.update(torch=torch.__version__, command=command_line())
    header = (
        f"`{command_line()}` on {datetime.date.today()}: {args.model} {args.dtype}, batch 1, "
        f'GateConfig(variant="{args.variant}", granularity="{args.granularity}", init="paper") on backend '
        f"{args.backend}; torch {torch.__version__}. {details}"
    )
    write_results(args.out, rows, markdown_page(header, table))
    print(markdown_page(header, table))


if __name__ == "__main__":
    main()
