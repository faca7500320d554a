"""The cases, targets and timing rounds of benchmarks/gpu.py: `Bench` holds the model, patches it for a case,
runs interleaved rounds (benchmarks/harness.py) that record a failing case's error and go on, and turns them
into rows with ratios to the baseline's round and their verdicts."""
# ruff: noqa: E402

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import statistics
import time

START = time.perf_counter()

import torch
from harness import interleaved, ratio_fields, ratios

import hf_gate_attention.kernels as gate_kernels
import hf_gate_attention.kernels.ops as gate_ops
from hf_gate_attention import GateConfig, gate_backend_of, patch, unpatch

DECODE_ATTENTION = gate_kernels.gated_decode_attention


def one_slot_per_group(*args, kept_groups=None, **options):
    """The split-KV decode kernel as it ran before group slots (21525cb): one slot per key/value group,
    `kept_groups` dropped. The `... one slot per group` cases of sparse_decode run it, for a side-by-side
    comparison with the same top-k on slots sized for the kept groups."""
    return DECODE_ATTENTION(*args, **options)


BASELINE = "ungated"
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
SPARSE_PHASE_DENSE_LIMIT = 1.05  # prefill and train with top-k (`--phase-top-ks`): time / dense gated
KERNEL_SHAPES = [(L, D) for L in (4096, 8192) for D in (64, 128)]
KERNEL_TOKENS, KERNEL_HIDDEN, KERNEL_REPEATS = 16384, 2048, 10
FIRST_CALL_LIMIT_S = 20.0


def targets_text(kv_heads: int) -> str:
    """The targets in words, for the report's header (`kv_heads`: the model's key/value groups)."""
    model = ", ".join(f"{p} {m} <= {h} / {e}" for (p, m), (h, e) in TARGETS.items())
    sparse = ", ".join(
        f"top-{k} at {c:,} batch {b} >= {bound}" for (c, b, k), bound in SPARSE_SPEEDUP_TARGETS.items()
    )
    return (
        f"Targets headwise / elementwise: {model}; kernels: sdpa+fused_gate >= {KERNEL_TARGET} x sdpa; "
        f"sparse_decode (speed-up: ungated time / case time, per decoded token): {sparse}, top-k "
        f"keeping all {kv_heads} groups: time <= {SPARSE_ALL_KEPT_LIMIT} x ungated, every top-k at "
        f"{' and '.join(map(str, SPARSE_DENSE_CONTEXTS))}: time <= {SPARSE_DENSE_LIMIT} x dense gated; "
        f"prefill and train with top-k: time <= {SPARSE_PHASE_DENSE_LIMIT} x dense gated ({SPARSE_DENSE})."
    )


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
        self.one_slot_per_group_cases = set()
        for k in getattr(args, "slot_top_ks", ()):  # the same top-k on the decode kernel's previous grid
            case = f"output/headwise top-{k}:triton, one slot per group"
            self.sparse_cases[case] = ({**headwise, "top_k": k, "top_k_unit": "kv_group"}, "triton")
            self.one_slot_per_group_cases.add(case)
        for k in getattr(args, "reads_top_ks", ()):  # dropped groups read 4 sink and 64 window keys
            gate = {**headwise, "top_k": k, "top_k_unit": "kv_group", "top_k_sink": 4, "top_k_window": 64}
            self.sparse_cases[f"output/headwise top-{k} sink 4 + window 64:triton"] = (gate, "triton")
        # prefill and train also time top-k on triton against the dense gate: zeroed (SDPA and the masked gate
        # pass; `sparse=True`: the flash kernel skipping tiles) and with the reads
        self.phase_cases, self.tile_skipping_cases = {}, set()
        for k in getattr(args, "phase_top_ks", ()):
            gate = {**headwise, "top_k": k, "top_k_unit": "kv_group"}
            self.phase_cases[f"output/headwise top-{k}:triton"] = (gate, "triton")
            self.phase_cases[f"output/headwise top-{k} skipping tiles:triton"] = (gate, "triton")
            self.tile_skipping_cases.add(f"output/headwise top-{k} skipping tiles:triton")
            reads = {**gate, "top_k_sink": 4, "top_k_window": 64}
            self.phase_cases[f"output/headwise top-{k} sink 4 + window 64:triton"] = (reads, "triton")
        # train and train_profile also time fused_gate's dense gates with the fused gate pass in training
        # (`ops.FUSED_PASS_IN_TRAINING`), beside the torch ops it runs there by default
        self.train_cases = {
            f"{case}, fused pass in training": gate
            for case, gate in self.cases.items()
            if case.endswith(":fused_gate")
        }
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
        gate_kernels.gated_decode_attention = (
            one_slot_per_group if case in self.one_slot_per_group_cases else DECODE_ATTENTION
        )
        gate_ops.FUSED_PASS_IN_TRAINING = case in self.train_cases
        if case != BASELINE:
            gate, backend = {**self.cases, **self.sparse_cases, **self.phase_cases, **self.train_cases}[case]
            torch.manual_seed(0)
            try:
                sparse = True if case in self.tile_skipping_cases else None
                patch(self.model, GateConfig(init="paper", **gate), backend=backend, sparse=sparse)
            except Exception:
                with contextlib.suppress(Exception):  # a patch that failed half-way
                    unpatch(self.model)
                raise
            self.case, self.resolved[case] = case, gate_backend_of(self.model)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, fn, warmup: bool = False, before=None) -> float:
        """Seconds of one `fn()`, the device synchronised around it and Python's garbage collector off during
        it, as `timeit` does (a collection inside a host-bound decode loop is noise, not the case); with
        `warmup`, after one untimed call (the first call after `set_case` patched the model runs on a changed
        allocator and weight layout: it measured a changed state, not the case); `before()` runs right
        before the timed call."""
        if warmup:
            fn()
        self.sync()
        if before is not None:
            before()
        collecting = gc.isenabled()
        gc.disable()
        try:
            start = time.perf_counter()
            fn()
            self.sync()
            return time.perf_counter() - start
        finally:
            if collecting:
                gc.enable()

    def interleaved(self, label: str, run, deadline: float, cases=None) -> dict:
        """`run(case) -> dict of measures` for every case (default: `self.cases`): one first call (timed as
        `first_call_s`), then rotated rounds until `deadline`. A case that raises keeps its error and is
        skipped from then on (its rounds hold None)."""
        cases = list(self.cases if cases is None else cases)
        results = {case: {"first_call_s": math.nan, "rounds": [], "error": ""} for case in cases}

        def guarded(case):
            if results[case]["error"]:
                return None
            try:
                return run(case)
            except Exception as error:
                results[case]["error"] = error_text(error)
                self.recover()
                return None

        for case in cases:
            start = time.perf_counter()
            if guarded(case) is None:
                log(f"{label} {case}: {results[case]['error']}")
            else:
                results[case]["first_call_s"] = time.perf_counter() - start

        def report(index, rounds):
            summary = ", ".join(f"{c} {m['s'] * 1e3:.1f} ms" for c in cases if (m := rounds[c][-1]))
            log(f"{label} round {index + 1}/{self.args.rounds}: {summary}")

        count = self.args.rounds
        rounds = interleaved(guarded, cases, count, warmup=False, on_round=report, deadline=deadline)
        if len(rounds[cases[0]]) < count:
            log(f"{label}: stopping after {len(rounds[cases[0]])} rounds to stay within --budget-s")
        for case in cases:
            results[case]["rounds"] = rounds[case]
        return results

    def recover(self) -> None:
        self.model.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def rows(self, phase: str, tokens: int, batch: int, results: dict, work: int) -> list[dict]:
        """One row per case: medians, tokens/s (`work` tokens per call), ratios to the baseline's round."""
        rows = []
        base = {key: measures(results[BASELINE]["rounds"], key) for key in ("s", "peak_gib")}
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
                prefix = "" if metric == "time" else "memory_"
                if key != "s":
                    row[key] = statistics.median(m[key] for m in measured)
                row.update(ratio_fields(f"{prefix}ratio", ratios(measures(result["rounds"], key), base[key])))
                dense_gate = case == BASELINE or case in self.phase_cases
                if f"{prefix}ratio" in row and (phase, metric) in TARGETS and not dense_gate:
                    bound = TARGETS[phase, metric][granularity[case] == "elementwise"]
                    status = "pass" if row[f"{prefix}ratio"] <= bound else "MISS"
                    row.update({f"{prefix}target": f"<= {bound}", f"{prefix}status": status})
            if case in self.phase_cases and SPARSE_DENSE in results:
                vs_dense = ratios(
                    measures(result["rounds"], "s"), measures(results[SPARSE_DENSE]["rounds"], "s")
                )
                row.update(ratio_fields("dense_ratio", vs_dense))
                if "dense_ratio" in row:
                    row["dense_target"] = f"<= {SPARSE_PHASE_DENSE_LIMIT}"
                    row["dense_status"] = "pass" if row["dense_ratio"] <= SPARSE_PHASE_DENSE_LIMIT else "MISS"
            rows.append(row)
        return rows


def measures(rounds: list, key: str) -> list:
    """The `key` measure of each round, None where the round has none (a failed case)."""
    return [m.get(key) if m else None for m in rounds]
