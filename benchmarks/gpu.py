"""Gated vs ungated attention on one CUDA GPU, every gate backend: a Llama-3.2-1B-shaped model (prefill,
training step, decode) and the attention kernels, in one run of about 6 minutes on an H200.

Model: a `LlamaConfig` with Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32 heads, 8 key/value heads,
head_dim 64, vocab 128256, tied embeddings), random weights (no download), bf16, `attn_implementation="sdpa"`.
Cases: `ungated`, then every gate of `--gates` (`variant/granularity`, `init="paper"`, seed 0) on every
backend of `--backends` (named `gate:backend`). One model instance is patched and unpatched between calls;
a case that raises (e.g. a backend not available yet) is logged as `error: <message>` and the run goes on.
Phases:

- `prefill`: a no-grad forward of `--prefill-len` tokens (batch 1, no KV cache, last logits only);
- `train`: one step on `--train-len` tokens (batch 1, `model.train()`, gradient on every parameter): forward
  with labels, backward, `zero_grad(set_to_none=True)`; no optimizer step, so the weights stay fixed and the
  memory compares activations and gradients. Peak memory: `torch.cuda.max_memory_allocated` after resetting it
  before the step (weights included);
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
  the kernel's all-kept time). One `StaticCache` per (context, batch), `max_cache_len` = context +
  `--sparse-steps`, its first `context` slots filled with random keys and values in place (decode time does
  not depend on them) and its filled length set, rewound after each measurement, freed
  (`torch.cuda.empty_cache`) before the next (32k x batch 16: 17 GB). Reported as speed-ups, ungated time /
  case time, and as case time / dense gated time, against `SPARSE_SPEEDUP_TARGETS`, `SPARSE_ALL_KEPT_LIMIT`
  (k = all groups, at every context and batch) and `SPARSE_DENSE_LIMIT` (every k at 4k and 8k);
- `kernels`: attention alone, bf16, causal, q/k/v transposed views of `(B, L, H, D)` as transformers passes
  them, 16k tokens per shape (B = 16384 / L, H = 2048 / D), L in 4096 and 8192, head_dim 64 and 128, headwise
  and elementwise: `sdpa` (`F.scaled_dot_product_attention` on flash / cuDNN), `sdpa+torch_gate`,
  `sdpa+fused_gate` (`sigmoid_gate_multiply`) and `triton` (`gated_flash_attention`), forward and backward
  (medians of CUDA-event timings from `benchmarks/attention_kernels.py`), as throughput relative to `sdpa`.

Every case is called once before the timed rounds (its `first_call_s` includes Triton compilation and
autotuning not done by an earlier phase). Then each round times every case once, in an order rotated from
round to round; a case's ratio is the median over rounds of (case / ungated of the same round), with the range
of the rounds. `--budget-s` bounds the whole run: each phase gets a share of the time left and runs fewer
rounds (at least one) when the next would not fit; cases are never dropped. The CSVs and the Markdown are
rewritten after each phase, so a killed run keeps what it measured. Targets: see `TARGETS`, `KERNEL_TARGET`
and the `SPARSE_*` constants.

On the GPU machine (torch + CUDA, Triton, transformers; no network needed):

    HF_HUB_OFFLINE=1 python3 benchmarks/gpu.py --out $OUT/gpu

CPU smoke test of the logic (tiny model; decode_graph, sparse_decode and kernels are reported as needing
CUDA):

    python benchmarks/gpu.py --device cpu --dtype float32 --layers 2 --hidden 128 --heads 4 --kv-heads 2 \\
        --vocab 1000 --prefill-len 64 --train-len 64 --context 64 --decode-steps 4 --batches 1 2 --rounds 2 \\
        --backends torch --out /tmp/gpu
"""
# ruff: noqa: E402

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

START = time.perf_counter()

import attention_kernels as kb
import torch
import transformers
from harness import cpu_model
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

from hf_gate_attention import GateConfig, gate_backend_of, patch, unpatch
from hf_gate_attention.files import atomic_write_text
from hf_gate_attention.kernels.backends import key_mask

BASELINE = "ungated"
PHASES = ("prefill", "train", "decode_eager", "decode_graph", "sparse_decode", "kernels")
PHASE_WEIGHTS = {"prefill": 1.0, "train": 1.5, "decode_eager": 2.0, "decode_graph": 2.0, "sparse_decode": 2.0}
PHASE_WEIGHTS["kernels"] = 1.5  # shares of --budget-s
CUDA_PHASES = ("decode_graph", "sparse_decode", "kernels")
# (phase, metric) -> (headwise, elementwise) bounds on the ratio to the baseline
TARGETS = {
    ("prefill", "time"): (1.02, 1.05),
    ("train", "time"): (1.03, 1.06),
    ("train", "memory"): (1.02, 1.05),
    ("decode_eager", "time"): (1.08, 1.08),
    ("decode_graph", "time"): (1.03, 1.03),
}
KERNEL_TARGET = 0.97  # sdpa+fused_gate throughput / sdpa
# sparse_decode: (context, batch, top_k) -> minimum speed-up (ungated time / case time, per decoded token)
SPARSE_SPEEDUP_TARGETS = {(32768, 16, 2): 2.0, (32768, 16, 1): 2.5, (32768, 1, 1): 1.25}
SPARSE_ALL_KEPT_LIMIT = 1.03  # top-k keeping every group: time / ungated, at every context and batch
SPARSE_DENSE_LIMIT, SPARSE_DENSE_CONTEXTS = 1.03, (4096, 8192)  # every top-k: time / dense gated
SPARSE_DENSE = "output/headwise:fused_gate"  # the dense gated reference of sparse_decode
KERNEL_SHAPES = [(L, D) for L in (4096, 8192) for D in (64, 128)]
KERNEL_TOKENS, KERNEL_HIDDEN, KERNEL_REPEATS = 16384, 2048, 10
FIRST_CALL_LIMIT_S = 20.0


def log(message: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S} +{time.perf_counter() - START:6.1f}s] {message}", flush=True)


def error_text(error: BaseException) -> str:
    """`error: <type>: <message>` on one line, with the exception it interrupted (a failed capture's)."""
    text = f"{type(error).__name__}: {error}"
    if error.__context__ is not None:
        text += f" (while handling {type(error.__context__).__name__}: {error.__context__})"
    return "error: " + " ".join(text.split())[:400]


class Bench:
    """One model and its device; `set_case` patches it for a case (unpatching the previous one)."""

    def __init__(self, model, args):
        self.model, self.args, self.device = model, args, torch.device(args.device)
        self.generator = torch.Generator().manual_seed(0)
        # case -> (GateConfig fields, backend): `cases` of every phase but sparse_decode, then `sparse_cases`
        self.cases = {BASELINE: None}
        for gate in args.gates:
            variant, _, granularity = gate.partition("/")
            for backend in args.backends:
                self.cases[f"{gate}:{backend}"] = ({"variant": variant, "granularity": granularity}, backend)
        headwise = {"variant": "output", "granularity": "headwise"}
        self.sparse_cases = {BASELINE: None, SPARSE_DENSE: (headwise, "fused_gate")}
        for k in args.top_ks:
            gate = {**headwise, "top_k": k, "top_k_unit": "kv_group"}
            self.sparse_cases[f"output/headwise top-{k}:triton"] = (gate, "triton")
        self.case, self.resolved = BASELINE, {BASELINE: "-"}

    def tokens(self, batch: int, length: int) -> torch.Tensor:
        ids = torch.randint(self.model.config.vocab_size, (batch, length), generator=self.generator)
        return ids.to(self.device)

    def set_case(self, case: str) -> None:
        if case == self.case:
            return
        if self.case != BASELINE:
            self.case = BASELINE
            unpatch(self.model)
        if case != BASELINE:
            gate, backend = {**self.cases, **self.sparse_cases}[case]
            torch.manual_seed(0)
            try:
                patch(self.model, GateConfig(init="paper", **gate), backend=backend)
            except Exception:
                with contextlib.suppress(Exception):  # a patch that failed half-way
                    unpatch(self.model)
                raise
            self.case, self.resolved[case] = case, gate_backend_of(self.model)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, fn) -> float:
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start

    def interleaved(self, label: str, run, deadline: float, cases=None) -> dict:
        """`run(case) -> dict of measures` for every case (default: `self.cases`): one untimed first call,
        then rotated rounds."""
        cases = list(self.cases if cases is None else cases)
        results = {case: {"first_call_s": math.nan, "rounds": [], "error": ""} for case in cases}
        for case in cases:
            start = time.perf_counter()
            try:
                run(case)
                results[case]["first_call_s"] = time.perf_counter() - start
            except Exception as error:
                results[case]["error"] = error_text(error)
                log(f"{label} {case}: {results[case]['error']}")
                self.recover()
        for r in range(self.args.rounds):
            round_start = time.perf_counter()
            for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
                measures = None
                if not results[case]["error"]:
                    try:
                        measures = run(case)
                    except Exception as error:
                        results[case]["error"] = error_text(error)
                        self.recover()
                results[case]["rounds"].append(measures)
            summary = ", ".join(
                f"{c} {m['s'] * 1e3:.1f} ms" for c in cases if (m := results[c]["rounds"][-1])
            )
            log(f"{label} round {r + 1}/{self.args.rounds}: {summary}")
            if (
                r + 1 < self.args.rounds
                and time.perf_counter() + (time.perf_counter() - round_start) > deadline
            ):
                log(f"{label}: stopping after {r + 1} rounds to stay within --budget-s")
                break
        return results

    def recover(self) -> None:
        self.model.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def rows(self, phase: str, tokens: int, batch: int, results: dict, work: int) -> list[dict]:
        """One row per case: medians, tokens/s (`work` tokens per call), ratios to the baseline's round."""
        rows = []
        base = results[BASELINE]["rounds"]
        granularity = {c: "elementwise" if "elementwise" in c else "headwise" for c in results}
        for case, result in results.items():
            measured = [m for m in result["rounds"] if m]
            row = {"phase": phase, "tokens": tokens, "batch": batch, "case": case, "rounds": len(measured)}
            row.update(backend=case.partition(":")[2] or "-", resolved_backend=self.resolved.get(case, ""))
            row.update(first_call_s=result["first_call_s"], error=result["error"])
            if measured:
                median_s = statistics.median(m["s"] for m in measured)
                row.update(median_ms=median_s * 1e3, tokens_per_s=work / median_s)
            for metric, key in (("time", "s"), ("memory", "peak_gib")):
                if not measured or key not in measured[0]:
                    continue
                pairs = [(m[key], b[key]) for m, b in zip(result["rounds"], base, strict=True) if m and b]
                prefix = "" if metric == "time" else "memory_"
                if key != "s":
                    row[key] = statistics.median(m[key] for m in measured)
                ratios = [m / b for m, b in pairs if b > 0]
                if ratios:
                    row[f"{prefix}ratio"] = statistics.median(ratios)
                    row.update({f"{prefix}ratio_min": min(ratios), f"{prefix}ratio_max": max(ratios)})
                    if (phase, metric) in TARGETS and case != BASELINE:
                        bound = TARGETS[phase, metric][granularity[case] == "elementwise"]
                        status = "pass" if row[f"{prefix}ratio"] <= bound else "MISS"
                        row.update({f"{prefix}target": f"<= {bound}", f"{prefix}status": status})
            rows.append(row)
        return rows


def rewind(cache, context: int) -> None:
    """Every layer of `cache` back to `context` tokens (also after a failure half-way through a forward)."""
    for layer in cache.layers:
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(context)
        elif layer.get_seq_length() > context:
            layer.crop(context - layer.get_seq_length())


def run_prefill(bench: Bench, deadline: float, batch: int = 1) -> list[dict]:
    args, model = bench.args, bench.model
    ids = bench.tokens(1, args.prefill_len)

    @torch.no_grad()
    def run(case):
        bench.set_case(case)
        model.eval()
        return {"s": bench.timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))}

    results = bench.interleaved("prefill", run, deadline)
    return bench.rows("prefill", args.prefill_len, 1, results, args.prefill_len)


def run_train(bench: Bench, deadline: float, batch: int = 1) -> list[dict]:
    args, model = bench.args, bench.model
    ids = bench.tokens(1, args.train_len)
    cuda = bench.device.type == "cuda"

    def step():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)

    def run(case):
        bench.set_case(case)
        model.train()
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds = bench.timed(step)
        return {"s": seconds, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else math.nan}

    results = bench.interleaved("train", run, deadline)
    model.eval()
    return bench.rows("train", args.train_len, 1, results, args.train_len)


@torch.no_grad()
def run_decode_eager(bench: Bench, deadline: float, batch: int) -> list[dict]:
    args, model = bench.args, bench.model
    bench.set_case(BASELINE)
    model.eval()
    cache = DynamicCache(config=model.config)
    model(input_ids=bench.tokens(batch, args.context), cache=cache, use_cache=True, logits_to_keep=1)
    token = bench.tokens(batch, 1)

    def steps():
        for _ in range(args.decode_steps):
            model(input_ids=token, cache=cache, use_cache=True)

    def run(case):
        bench.set_case(case)
        model.eval()
        try:
            return {"s": bench.timed(steps)}
        finally:
            rewind(cache, args.context)

    results = bench.interleaved(f"decode_eager batch {batch}", run, deadline)
    return bench.rows("decode_eager", args.context, batch, results, batch * args.decode_steps)


def graph_decoder(bench: Bench, cache, context: int, batch: int, steps: int, diffs: dict):
    """`run(case) -> {"s": seconds}`: `steps` decode steps of the current case on the `StaticCache` `cache`
    (its `context` tokens filled, `max_cache_len` >= context + steps), one step captured in a CUDA graph for
    the case (3 warm-up steps on a side stream, then `torch.cuda.graph`) and replayed `steps` times, timed
    with CUDA events. Captured again at every call, since patching changes the model's tensors. Static inputs:
    `input_ids` and `position_ids` `(B, 1)` and a boolean mask `(B, 1, 1, max_cache_len)` updated in place
    before each replay, so that transformers runs no host-side mask logic; an implementation whose mask
    function takes a 2-D key mask (`flash_attention_mask`, the `triton` backend's `key_mask`) gets the
    `(B, max_cache_len)` view. At a case's first call, `diffs[case]` = max |graphed - eager logits| of the
    same step. The cache is rewound to `context` after every use."""
    model, max_len = bench.model, cache.layers[0].max_cache_len
    ids = bench.tokens(batch, 1)
    position_ids = torch.full((batch, 1), context, dtype=torch.long, device=bench.device)
    mask = torch.zeros(batch, 1, 1, max_len, dtype=torch.bool, device=bench.device)
    pool = torch.cuda.graph_pool_handle()

    def at(step: int) -> None:
        """Static inputs of decode step `step` (the cache's own position advances inside the graph)."""
        position_ids.fill_(context + step)
        mask[..., : context + step + 1] = True
        mask[..., context + step + 1 :] = False

    def run(case):
        bench.set_case(case)
        model.eval()
        implementation = model.config._attn_implementation
        two_d = ALL_MASK_ATTENTION_FUNCTIONS.get(implementation) in (flash_attention_mask, key_mask)
        step_mask = mask.view(batch, max_len) if two_d else mask

        def step():
            return model(
                input_ids=ids,
                position_ids=position_ids,
                attention_mask=step_mask,
                cache=cache,
                use_cache=True,
            ).logits

        graph = None
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    at(0)
                    step()
                    rewind(cache, context)
            torch.cuda.current_stream().wait_stream(side)
            at(0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static_logits = step()
            if case not in diffs:
                at(0)
                eager = step().float()
                rewind(cache, context)
                at(0)
                graph.replay()
                torch.cuda.synchronize()
                diffs[case] = (static_logits.float() - eager).abs().max().item()
                rewind(cache, context)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for i in range(steps):
                at(i)
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            return {"s": start.elapsed_time(end) / 1e3}
        finally:
            del graph
            rewind(cache, context)

    return run


@torch.no_grad()
def run_decode_graph(bench: Bench, deadline: float, batch: int) -> list[dict]:
    args, model = bench.args, bench.model
    context = args.context
    bench.set_case(BASELINE)
    model.eval()
    # random keys and values, as in sparse_decode: a cache prefilled by a forward failed to capture
    # on an H200 (CUDACachingAllocator assert, then "Offset increment outside graph capture" for every case)
    cache = random_static_cache(bench, batch, context, context + args.decode_steps)
    diffs = {}  # case -> max |graphed - eager logits|
    run = graph_decoder(bench, cache, context, batch, args.decode_steps, diffs)
    results = bench.interleaved(f"decode_graph batch {batch}", run, deadline)
    rows = bench.rows("decode_graph", context, batch, results, batch * args.decode_steps)
    return [{**row, "graph_max_abs_diff": diffs.get(row["case"])} for row in rows]


def random_static_cache(bench: Bench, batch: int, context: int, max_len: int) -> StaticCache:
    """A `StaticCache` of `max_len` slots whose first `context` hold random keys and values (decode time does
    not depend on them; the gates see only the new token's hidden state): allocated at once
    (`early_initialization`), filled in place, each layer's filled length (`cumulative_length`) set."""
    config = bench.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = StaticCache(config=config, max_cache_len=max_len)
    dtype = bench.model.get_input_embeddings().weight.dtype
    cache.early_initialization(batch, config.num_key_value_heads, head_dim, dtype, bench.device)
    generator = torch.Generator(bench.device).manual_seed(0)
    for layer in cache.layers:
        layer.keys.normal_(generator=generator)
        layer.values.normal_(generator=generator)
    rewind(cache, context)
    return cache


@torch.no_grad()
def run_sparse_decode(bench: Bench, deadline: float, batch: int, context: int) -> list[dict]:
    """Decode per token of every sparse case (ungated sdpa, dense gated, top-k kv_group on triton),
    CUDA-graphed on one random `StaticCache` of `context` tokens (+ the steps), freed before the next
    (context, batch)."""
    args, model = bench.args, bench.model
    steps = args.sparse_steps
    bench.set_case(BASELINE)
    model.eval()
    cache, run, diffs = random_static_cache(bench, batch, context, context + steps), None, {}
    try:
        run = graph_decoder(bench, cache, context, batch, steps, diffs)
        label = f"sparse_decode context {context} batch {batch}"
        results = bench.interleaved(label, run, deadline, bench.sparse_cases)
    finally:
        del cache, run
        bench.sync()
        torch.cuda.empty_cache()
    rows = []
    base, dense = results[BASELINE]["rounds"], results[SPARSE_DENSE]["rounds"]
    for row in bench.rows("sparse_decode", context, batch, results, batch * steps):
        case, k = row["case"], bench.sparse_cases[row["case"]]
        k = None if k is None else k[0].get("top_k")
        for key in ("ratio", "ratio_min", "ratio_max"):  # case / ungated: reported as its inverse, a speed-up
            row.pop(key, None)
        row.update(context=context, top_k=k, graph_max_abs_diff=diffs.get(case))
        if "median_ms" in row:
            row["step_ms"] = row["median_ms"] / steps
        rounds = results[case]["rounds"]
        speedups = [b["s"] / m["s"] for m, b in zip(rounds, base, strict=True) if m and b]
        if speedups and case != BASELINE:
            row.update(speedup_ratio=statistics.median(speedups))
            row.update(speedup_ratio_min=min(speedups), speedup_ratio_max=max(speedups))
            if k is not None and k >= model.config.num_key_value_heads:
                limit = SPARSE_ALL_KEPT_LIMIT
                row["speedup_target"] = f">= {1 / limit:.3f}: time <= {limit} x ungated"
                row["speedup_status"] = "pass" if row["speedup_ratio"] >= 1 / limit else "MISS"
            elif (context, batch, k) in SPARSE_SPEEDUP_TARGETS:
                bound = SPARSE_SPEEDUP_TARGETS[context, batch, k]
                row["speedup_target"] = f">= {bound}"
                row["speedup_status"] = "pass" if row["speedup_ratio"] >= bound else "MISS"
        vs_dense = [m["s"] / d["s"] for m, d in zip(rounds, dense, strict=True) if m and d]
        if vs_dense and k is not None:
            row.update(dense_ratio=statistics.median(vs_dense))
            row.update(dense_ratio_min=min(vs_dense), dense_ratio_max=max(vs_dense))
            if context in SPARSE_DENSE_CONTEXTS:
                row["dense_target"] = f"<= {SPARSE_DENSE_LIMIT}"
                row["dense_status"] = "pass" if row["dense_ratio"] <= SPARSE_DENSE_LIMIT else "MISS"
        rows.append(row)
    return rows


def run_kernels(args, deadline: float, rows: list[dict], save) -> None:
    from hf_gate_attention.kernels import sigmoid_gate_multiply

    def sdpa_fused_gate(q, k, v, gate_logits, causal):
        return sigmoid_gate_multiply(kb.sdpa(q, k, v, None, causal), gate_logits, kb.GATE_SCALE)

    methods = {"sdpa": kb.sdpa, "sdpa+torch_gate": kb.sdpa_torch_gate}
    methods.update({"sdpa+fused_gate": sdpa_fused_gate, "triton": kb.fused})
    shapes = [(L, D, g) for L, D in KERNEL_SHAPES for g in ("headwise", "elementwise")]
    for index, shape in enumerate(shapes):
        shape_deadline = time.perf_counter() + (deadline - time.perf_counter()) / (len(shapes) - index)
        try:
            rows += kernel_shape(methods, *shape, args.rounds, shape_deadline)
        except Exception as error:
            rows.append(
                {"phase": "kernels", "seq_len": shape[0], "head_dim": shape[1], "granularity": shape[2]}
            )
            rows[-1].update(method="all", error=error_text(error))
        log(f"kernels L={shape[0]} D={shape[1]} {shape[2]}: " + ", ".join(
            f"{r['method']} {r['pass']} x{r['ratio']:.3f}" for r in rows[-2 * len(methods) :] if "ratio" in r
        ))  # fmt: skip
        torch.cuda.empty_cache()
        save()


def kernel_shape(methods: dict, length: int, dim: int, granularity: str, rounds: int, deadline: float):
    """Rows of every method x pass on one shape: first call, then rotated rounds of `kb.time_ms` medians."""
    batch, heads = KERNEL_TOKENS // length, KERNEL_HIDDEN // dim
    inputs = kb.make_inputs(batch, heads, length, dim, 1 if granularity == "headwise" else dim)
    grad_out = torch.randn(batch, length, heads, dim, device=inputs[0].device, dtype=inputs[0].dtype)

    def forward(fn):
        with torch.no_grad():
            return fn(*inputs, True)

    def graph(fn):
        for x in inputs:
            x.grad = None
        return fn(*inputs, True)

    passes = {  # pass -> fn -> (timed run, untimed setup) for `kb.time_ms`
        "fwd": lambda fn: (lambda _: forward(fn), lambda: None),
        "bwd": lambda fn: (lambda out: out.backward(grad_out), lambda: graph(fn)),
    }
    info = {name: {"first_call_s": math.nan, "error": "", "fwd": [], "bwd": []} for name in methods}
    reference = forward(kb.sdpa_torch_gate).float()
    for name, fn in methods.items():
        try:
            start = time.perf_counter()
            graph(fn).backward(grad_out)
            torch.cuda.synchronize()
            info[name]["first_call_s"] = time.perf_counter() - start
            if name not in ("sdpa", "sdpa+torch_gate"):
                info[name]["max_abs_diff_vs_torch_gate"] = (
                    (forward(fn).float() - reference).abs().max().item()
                )
        except Exception as error:
            info[name]["error"] = error_text(error)
    names = list(methods)
    for r in range(rounds):
        round_start = time.perf_counter()
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for pass_name, make in passes.items():
                ms = math.nan
                if not info[name]["error"]:
                    try:
                        ms = kb.time_ms(*make(methods[name]), 2, KERNEL_REPEATS)
                    except Exception as error:
                        info[name]["error"] = error_text(error)
                info[name][pass_name].append(ms)
        now = time.perf_counter()
        if r + 1 < rounds and now + (now - round_start) > deadline:
            break
    rows = []
    for name in names:
        for pass_name in passes:
            times = info[name][pass_name]
            row = {"phase": "kernels", "seq_len": length, "head_dim": dim, "granularity": granularity}
            row.update(batch=batch, heads=heads, method=name, error=info[name]["error"])
            row.update({key: info[name].get(key) for key in ("first_call_s", "max_abs_diff_vs_torch_gate")})
            ratios = [
                s / t for s, t in zip(info["sdpa"][pass_name], times, strict=True) if not math.isnan(s / t)
            ]
            row.update({"pass": pass_name, "rounds": len(ratios)})
            if ratios:
                row["median_ms"] = statistics.median(t for t in times if not math.isnan(t))
                row.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
                if name == "sdpa+fused_gate":
                    status = "pass" if row["ratio"] >= KERNEL_TARGET else "MISS"
                    row.update(target=f">= {KERNEL_TARGET}", status=status)
            rows.append(row)
    return rows


def fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
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
MODEL_COLUMNS.update({"time ratio [min, max]": "ratio", "peak GiB": "peak_gib"})
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
TAIL_COLUMNS = {"rounds": "rounds", "note": "error"}


def table(rows: list[dict], columns: dict) -> list[str]:
    """A Markdown table of the columns that have a value in some row."""
    columns = {
        name: key for name, key in {**columns, **TAIL_COLUMNS}.items() if any(cell(r, key) for r in rows)
    }
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(r, key) for key in columns.values()) + " |" for r in rows]


def markdown(rows: list[dict], header: list[str], durations: dict, args) -> str:
    titles = {
        "prefill": f"prefill: no-grad forward of {args.prefill_len:,} tokens, batch 1",
        "train": f"train: forward + backward + zero_grad, {args.train_len:,} tokens, batch 1, no optimizer",
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


def write_csv(path: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


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


def measure(phase: str, bench: Bench | None, args, deadline: float, rows: list[dict], save) -> None:
    """Add the rows of one phase to `rows`, calling `save()` after each part (batch size, kernel shape); an
    error outside the per-case calls becomes a row of the phase."""
    if phase in CUDA_PHASES and torch.device(args.device).type != "cuda":
        rows.append({"phase": phase, "case": "-", "skipped": f"Skipped: {phase} needs CUDA (--device cuda)."})
    elif phase == "kernels":
        try:
            run_kernels(args, deadline, rows, save)
        except Exception as error:
            rows.append({"phase": phase, "method": "all", "error": error_text(error)})
    elif bench is not None:
        runner = {"prefill": run_prefill, "train": run_train}.get(phase)
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
    targets = ", ".join(f"{p} {m} <= {h} / {e}" for (p, m), (h, e) in TARGETS.items())
    sparse_targets = ", ".join(
        f"top-{k} at {c:,} batch {b} >= {bound}" for (c, b, k), bound in SPARSE_SPEEDUP_TARGETS.items()
    )
    header = [
        f"`{shlex.join(['python', *sys.argv])}`",
        "",
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}; {machine}; {versions}.",
        f"Model: Llama-3.2-1B-shaped with random weights, {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads, vocab {args.vocab:,}, {args.dtype}, sdpa; gates "
        '`init="paper"`. Ratios: median over interleaved rounds of case / ungated of the same round '
        "[min, max]. "
        f"Targets headwise / elementwise: {targets}; kernels: sdpa+fused_gate >= {KERNEL_TARGET} x sdpa; "
        f"sparse_decode (speed-up: ungated time / case time, per decoded token): {sparse_targets}, top-k "
        f"keeping all {args.kv_heads} groups: time <= {SPARSE_ALL_KEPT_LIMIT} x ungated, every top-k at "
        f"{' and '.join(map(str, SPARSE_DENSE_CONTEXTS))}: time <= {SPARSE_DENSE_LIMIT} x dense gated.",
    ]
    log(f"{machine}; {versions}")
    out, rows, durations = Path(args.out), {"model": [], "kernels": []}, {}

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
        measure(phase, bench, args, phase_deadline, rows["kernels" if phase == "kernels" else "model"], save)
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
