"""Gated vs ungated attention on one CUDA GPU, every gate backend: a Llama-3.2-1B-shaped model (prefill,
training step, decode) and the attention kernels, in one run of about 6 minutes on an H200.

Model: a `LlamaConfig` with Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32 heads, 8 key/value heads,
head_dim 64, vocab 128256, tied embeddings), random weights (no download), bf16, `attn_implementation="sdpa"`.
Cases: `ungated`, then every gate of `--gates` (`variant/granularity`, `init="paper"`, seed 0) on every
backend of `--backends` (named `gate:backend`). One model instance is patched and unpatched between calls;
a case that raises (e.g. a backend not available yet) is logged as `error: <message>` and the run goes on.
Phases:

- `prefill`: a no-grad forward of `--prefill-len` tokens (batch 1, no KV cache, last logits only); this
  phase and `train` also time, for each k of `--phase-top-ks` (2), `output/headwise` with `top_k=k` of the
  key/value groups on `triton`, zeroed (SDPA and the masked gate pass; and `sparse=True`, the flash kernel
  skipping tiles: `... skipping tiles:triton`) and with `top_k_sink=4, top_k_window=64`, as time / dense
  gated (`output/headwise:fused_gate`) against `SPARSE_PHASE_DENSE_LIMIT` (issue 23: <= 1.05);
- `train`: one step on `--train-len` tokens (batch 1, `model.train()`, gradient on every parameter): forward
  with labels, backward, `zero_grad(set_to_none=True)`; no optimizer step, so the weights stay fixed and the
  memory compares activations and gradients. This phase and `train_profile` also time each `fused_gate`
  case with the fused gate pass in training (`..., fused pass in training`: `ops.FUSED_PASS_IN_TRAINING`)
  beside its default, the torch ops. Peak memory: `torch.cuda.max_memory_allocated` after resetting it
  before the step (weights included);
- `train_profile`: the `train` step of every case, `PROFILED_STEPS` (3) times under `torch.profiler` after
  one unrecorded step: the kernel time on the device per step and its ratio to ungated (host noise does not
  reach it, unlike the wall times of `train`), launches added, and the kernels that add the most time;
  `gpu_profile.csv` has every (case, kernel name) with its calls and time added to the ungated step. On a
  CPU, the aten ops' self times. One recording per case, not interleaved rounds;
- `decode_eager`: `--decode-steps` single-token forwards per batch size on transformers' `DynamicCache` of
  `--context` tokens, prefilled once per batch size by the ungated model and rewound after each measurement;
- `decode_graph`: the same with a `StaticCache` (`max_cache_len` = context + steps) and one decode step
  captured in a CUDA graph (3 warm-up steps on a side stream, then `torch.cuda.graph`), captured again for
  every measurement since patching changes the model's tensors. Static inputs: `input_ids` and `position_ids`
  `(B, 1)` and a boolean mask `(B, 1, 1, max_cache_len)` updated in place before each replay, so transformers
  runs no host-side mask logic (an implementation whose mask function takes a 2-D key mask,
  `flash_attention_mask` or the `triton` backend's `key_mask`, gets the `(B, max_cache_len)` view). Replays
  are timed with CUDA events; once per case the graphed logits are compared with an eager call of the same
  step (max abs diff in the CSV). A failed capture (e.g. a host sync inside the step) is recorded as the
  case's error;
- `sparse_decode` (issue 23): the same graphed decode step (`graph_decoder`, shared with `decode_graph`),
  time per decoded token at each context of `--sparse-contexts` (4k, 8k, 32k) and batch of `--batches`, over
  its own cases: `ungated` (sdpa), the dense gated reference `output/headwise:fused_gate`, and
  `GateConfig(variant="output", granularity="headwise", init="paper", top_k=k, top_k_unit="kv_group")` on
  backend `triton` for each k of `--top-ks` (1, 2, 4, 8 of the 8 key/value groups; k = 8 keeps every group:
  the kernel's all-kept time), for each k of `--slot-top-ks` (1, 2) the same on the decode kernel's grid
  before group slots (one slot per key/value group, `gpu_bench.one_slot_per_group`: the side-by-side
  measure of the slots), and for each k of `--reads-top-ks` (1, 2) the same with `top_k_sink=4,
  top_k_window=64` (dropped groups read their sink and window keys). One `StaticCache` per (context, batch),
  `max_cache_len` = context + `--sparse-steps`, its first `context` slots filled with random keys and values
  in place (decode time does not depend on them) and its filled length set, rewound after each measurement,
  freed (`torch.cuda.empty_cache`) before the next (32k x batch 16: 17 GB). Reported as speed-ups, ungated
  time / case time, and as case time / dense gated time, against `SPARSE_SPEEDUP_TARGETS`,
  `SPARSE_ALL_KEPT_LIMIT` (k = all groups, at every context and batch) and `SPARSE_DENSE_LIMIT` (every k at
  4k and 8k);
- `kernels`: attention alone, bf16, causal, q/k/v transposed views of `(B, L, H, D)` as transformers passes
  them, 16k tokens per shape (B = 16384 / L, H = 2048 / D), L in 4096 and 8192, head_dim 64 and 128, headwise
  and elementwise: `sdpa` (`F.scaled_dot_product_attention` on flash / cuDNN), `sdpa+torch_gate`,
  `sdpa+fused_gate` (`sigmoid_gate_multiply`) and `triton` (`gated_flash_attention`), forward and backward
  (medians of CUDA-event timings from `benchmarks/attention_kernels.py`), as throughput relative to `sdpa`.

Every case is called once before the timed rounds (its `first_call_s` includes Triton compilation and
autotuning not done by an earlier phase). Then each round times every case once, in an order rotated from
round to round, with Python's garbage collector off during each timed call (as `timeit`); in `prefill` and
`train` after one untimed call (the first call after patching runs on a changed allocator and weight layout;
`first_call_s` there covers both calls); a case's ratio is the median over rounds of (case / ungated of the
same round), with the range of the rounds. `--budget-s` bounds the whole run: each phase gets a share of the
time left and runs fewer rounds (at least one) when the next would not fit; cases are never dropped. The CSVs
and the Markdown are rewritten after each phase, so a killed run keeps what it measured. Targets: `TARGETS`,
`KERNEL_TARGET` and the `SPARSE_*` constants of `gpu_bench.py`.

Files: this one (options, phase budgets, the Markdown report), `gpu_bench.py` (cases, targets, `Bench`: timing
rounds and rows), `gpu_phases.py` (one `run_<phase>` per phase), `harness.py` (rounds, ratios, CSV).

On the GPU machine (torch + CUDA, Triton, transformers; no network needed):

    HF_HUB_OFFLINE=1 python3 benchmarks/gpu.py --out $OUT/gpu

CPU smoke test of the logic (tiny model; decode_graph, sparse_decode and kernels are reported as needing
CUDA):

    python benchmarks/gpu.py --device cpu --dtype float32 --layers 2 --hidden 128 --heads 4 --kv-heads 2 \\
        --vocab 1000 --prefill-len 64 --train-len 64 --context 64 --decode-steps 4 --batches 1 2 --rounds 2 \\
        --backends torch --out /tmp/gpu
"""

from __future__ import annotations

import argparse
import datetime
import functools
import time
from pathlib import Path

from gpu_bench import (  # first: it starts the run's clock (START) before torch is imported
    FIRST_CALL_LIMIT_S,
    KERNEL_TOKENS,
    SPARSE_DENSE,
    START,
    Bench,
    error_text,
    log,
    targets_text,
)

# isort: split
import torch
import transformers
from gpu_phases import (
    PROFILED_STEPS,
    run_decode_eager,
    run_decode_graph,
    run_kernels,
    run_prefill,
    run_sparse_decode,
    run_train,
    run_train_profile,
)
from harness import command_line, cpu_model, markdown_table, missing, write_csv
from transformers import LlamaConfig, LlamaForCausalLM

from hf_gate_attention.files import atomic_write_text

PHASES = ("prefill", "train", "train_profile", "decode_eager", "decode_graph", "sparse_decode", "kernels")
PHASE_WEIGHTS = {"prefill": 1.0, "train": 1.5, "train_profile": 1.5, "decode_eager": 1.5, "decode_graph": 2.0}
PHASE_WEIGHTS.update(sparse_decode=2.0, kernels=1.5)  # shares of --budget-s
CUDA_PHASES = ("decode_graph", "sparse_decode", "kernels")


def fmt(value) -> str:
    if missing(value):
        return ""
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def cell(row: dict, key: str) -> str:
    """A table cell; key `ratio` / `memory_ratio`: median [min, max] and the target's verdict."""
    if not key.endswith("ratio"):
        return fmt(row.get(key)).replace("|", "/")
    if key not in row:
        return ""
    text = f"x{row[key]:.3f} [{row[key + '_min']:.3f}, {row[key + '_max']:.3f}]"
    status = key.replace("ratio", "status")
    return f"{text} {row[status]} ({row[key.replace('ratio', 'target')]})" if status in row else text


MODEL_COLUMNS = {"case": "case", "resolved": "resolved_backend", "batch": "batch"}
MODEL_COLUMNS.update({"first call s": "first_call_s", "median ms": "median_ms", "tokens/s": "tokens_per_s"})
MODEL_COLUMNS.update({"time ratio [min, max]": "ratio", "time vs dense gated [min, max]": "dense_ratio"})
MODEL_COLUMNS.update({"peak GiB": "peak_gib"})
MODEL_COLUMNS.update(
    {"memory ratio [min, max]": "memory_ratio", "graph vs eager max abs diff": "graph_max_abs_diff"}
)
SPARSE_COLUMNS = {"case": "case", "resolved": "resolved_backend", "context": "context", "batch": "batch"}
SPARSE_COLUMNS.update({"first call s": "first_call_s", "median ms": "median_ms", "ms per step": "step_ms"})
SPARSE_COLUMNS.update({"tokens/s": "tokens_per_s", "speed-up vs ungated [min, max]": "speedup_ratio"})
SPARSE_COLUMNS.update(
    {"time vs dense gated [min, max]": "dense_ratio", "graph vs eager max abs diff": "graph_max_abs_diff"}
)
KERNEL_COLUMNS = {"L": "seq_len", "head_dim": "head_dim", "granularity": "granularity", "method": "method"}
KERNEL_COLUMNS.update({"pass": "pass", "first call s": "first_call_s", "median ms": "median_ms"})
KERNEL_COLUMNS.update(
    {"throughput vs sdpa [min, max]": "ratio", "max abs diff vs torch_gate": "max_abs_diff_vs_torch_gate"}
)
PROFILE_COLUMNS = {"case": "case", "resolved": "resolved_backend", "device ms per step": "device_ms"}
PROFILE_COLUMNS.update({"device time vs ungated": "device_vs_ungated", "launches added": "added_launches"})
PROFILE_COLUMNS.update({"largest additions (us per step, launches)": "largest_additions"})
TAIL_COLUMNS = {"rounds": "rounds", "note": "error"}


def table(rows: list[dict], columns: dict) -> list[str]:
    """A Markdown table of the columns that have a value in some row."""
    columns = {
        name: key for name, key in {**columns, **TAIL_COLUMNS}.items() if any(cell(r, key) for r in rows)
    }
    return markdown_table(list(columns), ([cell(r, key) for key in columns.values()] for r in rows))


def markdown(rows: list[dict], header: list[str], durations: dict, args) -> str:
    titles = {
        "prefill": f"prefill: no-grad forward of {args.prefill_len:,} tokens, batch 1",
        "train": f"train: forward + backward + zero_grad, {args.train_len:,} tokens, batch 1, no optimizer",
        "train_profile": f"train_profile: the train step under torch.profiler, {PROFILED_STEPS} steps per "
        "case; kernel time on the device (every kernel: gpu_profile.csv)",
        "decode_eager": f"decode_eager: {args.decode_steps} steps, DynamicCache of {args.context:,} tokens",
        "decode_graph": f"decode_graph: {args.decode_steps} graph replays, StaticCache of {args.context:,}",
        "sparse_decode": f"sparse_decode: {args.sparse_steps} graph replays, random StaticCache of each "
        f"context; top-k key/value groups on triton vs ungated sdpa and dense gated ({SPARSE_DENSE})",
        "kernels": f"kernels: attention alone, bf16, causal, {KERNEL_TOKENS:,} tokens per shape",
    }
    lines = [*header, ""]
    for phase in PHASES:
        phase_rows = [r for r in rows if r["phase"] == phase]
        if phase_rows:
            lines += [f"## {titles[phase]}", ""]
            if "skipped" in phase_rows[0]:
                lines += [phase_rows[0]["skipped"], ""]
                continue
            columns = {"kernels": KERNEL_COLUMNS, "sparse_decode": SPARSE_COLUMNS}.get(phase, MODEL_COLUMNS)
            columns = PROFILE_COLUMNS if phase == "train_profile" else columns
            lines += [*table(phase_rows, columns), ""]
    first = {}  # the first forward + backward of a case: its first prefill and train calls
    for r in rows:
        if r["phase"] in ("prefill", "train") and fmt(r.get("first_call_s")):
            first.setdefault(r["case"], {})[r["phase"]] = r["first_call_s"]
    if first:
        lines += ["## first calls: compilation + autotuning of a forward + backward", ""]
        lines += ["| case | prefill s | train s | sum |", "|---|---|---|---|"]
        for case, calls in first.items():
            total = sum(calls.values())
            verdict = f"{'pass' if total <= FIRST_CALL_LIMIT_S else 'MISS'} (<= {FIRST_CALL_LIMIT_S:.0f} s)"
            lines.append(f"| {case} | {fmt(calls.get('prefill'))} | {fmt(calls.get('train'))} "
                         f"| {fmt(total)} {verdict} |")  # fmt: skip
        lines.append("")
    lines.append("Phase durations: " + ", ".join(f"{p} {s:.1f} s" for p, s in durations.items()) + ".")
    return "\n".join(lines) + "\n"


def build_model(args):
    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        vocab_size=args.vocab, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LlamaForCausalLM._from_config(
            config, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
        )
    return model.eval().requires_grad_(True)


def measure(phase: str, bench: Bench | None, args, deadline: float, tables: dict, save) -> None:
    """Add the rows of one phase to its table of `tables` (`model`, `kernels`; `profile`: train_profile's
    kernels), calling `save()` after each part (batch size, kernel shape); an error outside the per-case
    calls becomes a row of the phase."""
    rows = tables["kernels" if phase == "kernels" else "model"]
    if phase in CUDA_PHASES and torch.device(args.device).type != "cuda":
        rows.append({"phase": phase, "case": "-", "skipped": f"Skipped: {phase} needs CUDA (--device cuda)."})
    elif phase == "kernels":
        try:
            run_kernels(args, deadline, rows, save)
        except Exception as error:
            rows.append({"phase": phase, "method": "all", "error": error_text(error)})
    elif bench is not None:
        profile = functools.partial(run_train_profile, kernel_rows=tables["profile"])
        runner = {"prefill": run_prefill, "train": run_train, "train_profile": profile}.get(phase)
        parts = [{"batch": 1}] if runner else [{"batch": batch} for batch in args.batches]
        if phase == "sparse_decode":  # one static cache per (context, batch), allocated and freed in turn
            parts = [{"batch": b, "context": c} for c in args.sparse_contexts for b in args.batches]
        runners = {"decode_eager": run_decode_eager, "decode_graph": run_decode_graph}
        runner = runner or {**runners, "sparse_decode": run_sparse_decode}[phase]
        for index, part in enumerate(parts):
            part_deadline = time.perf_counter() + (deadline - time.perf_counter()) / (len(parts) - index)
            try:
                rows += runner(bench, part_deadline, **part)
            except Exception as error:
                rows.append({"phase": phase, "case": "all", **part, "error": error_text(error)})
                log(f"{phase} {part}: {rows[-1]['error']}")
                bench.recover()
            save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES), help="what to measure")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per phase (fewer if over budget)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="time budget of the whole run, seconds")
    parser.add_argument("--gates", nargs="+", default=["output/headwise", "output/elementwise"])
    parser.add_argument("--backends", nargs="+", default=["torch", "fused_gate", "triton"])
    parser.add_argument("--prefill-len", type=int, default=8192, help="tokens of the prefill")
    parser.add_argument("--train-len", type=int, default=4096, help="tokens of the training step")
    parser.add_argument("--context", type=int, default=4096, help="cached tokens before decoding")
    parser.add_argument("--decode-steps", type=int, default=32, help="decoded tokens per measurement")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16], help="decode batch sizes")
    parser.add_argument(
        "--sparse-contexts", type=int, nargs="+", default=[4096, 8192, 32768], help="sparse_decode contexts"
    )
    parser.add_argument(
        "--top-ks", type=int, nargs="+", default=[1, 2, 4, 8], help="sparse_decode: kept key/value groups"
    )
    optional_top_ks = {  # option -> (default, help): extra top-k cases, none with an empty list
        "--slot-top-ks": ([1, 2], "sparse_decode: kept groups of cases on the decode kernel's grid of one "
                          "slot per group"),
        "--reads-top-ks": ([1, 2], "sparse_decode: kept groups of cases whose dropped groups read 4 sink + "
                           "64 window keys"),
        "--phase-top-ks": ([2], "prefill and train: also top-k of the key/value groups on triton, zeroed "
                           "(masked, and skipping tiles) and with 4 sink + 64 window reads, against the "
                           "dense gate"),
    }  # fmt: skip
    for option, (default, help_text) in optional_top_ks.items():
        parser.add_argument(option, type=int, nargs="*", default=default, help=help_text)
    parser.add_argument("--sparse-steps", type=int, default=32, help="sparse_decode: steps per measurement")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (intermediate: 4x)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--out", default="benchmarks/results/gpu", help="folder of gpu_model.csv etc.")
    args = parser.parse_args()

    try:
        import triton

        versions = f"triton {triton.__version__}"
    except Exception:
        versions = "no triton"
    versions = f"torch {torch.__version__} (CUDA {torch.version.cuda}), {versions}, "
    versions += f"transformers {transformers.__version__}"
    cuda = torch.device(args.device).type == "cuda"
    machine = torch.cuda.get_device_name(args.device) if cuda else f"{cpu_model()} (CPU)"
    header = [
        f"`{command_line()}`",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}; {machine}; {versions}.",
        f"Model: Llama-3.2-1B-shaped with random weights, {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads, vocab {args.vocab:,}, {args.dtype}, sdpa; gates "
        '`init="paper"`. Ratios: median over interleaved rounds of case / ungated of the same round '
        "[min, max]. " + targets_text(args.kv_heads),
    ]
    log(f"{machine}; {versions}")
    out, rows, durations = Path(args.out), {"model": [], "kernels": [], "profile": []}, {}

    def save() -> None:
        for name, part in rows.items():
            if part:
                write_csv(out / f"gpu_{name}.csv", part)
        atomic_write_text(out / "gpu.md", markdown(rows["model"] + rows["kernels"], header, durations, args))

    bench = None
    if set(args.phases) - {"kernels"}:
        try:
            bench = Bench(build_model(args), args)
            log(f"model: {sum(p.numel() for p in bench.model.parameters()) / 1e6:.0f}M parameters")
        except Exception as error:
            rows["model"].append({"phase": args.phases[0], "case": "model", "error": error_text(error)})
            log(f"model: {rows['model'][-1]['error']}")
    deadline = START + args.budget_s
    for index, phase in enumerate(args.phases):
        share = PHASE_WEIGHTS[phase] / sum(PHASE_WEIGHTS[p] for p in args.phases[index:])
        phase_start = time.perf_counter()
        phase_deadline = phase_start + (deadline - phase_start) * share
        log(f"phase {phase} (budget until +{phase_deadline - START:.0f}s)")
        measure(phase, bench, args, phase_deadline, rows, save)
        if cuda:
            torch.cuda.empty_cache()
        durations[phase] = time.perf_counter() - phase_start
        save()
        log(f"phase {phase} done in {durations[phase]:.1f} s")
    save()
    print(markdown(rows["model"] + rows["kernels"], header, durations, args), flush=True)
    log(f"wrote {out}/gpu.md and the CSVs")


if __name__ == "__main__":
    main()
