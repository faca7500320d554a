"""The phases of benchmarks/gpu.py: each `run_<phase>` times every case of one part (batch size, context,
kernel shape) in interleaved rounds and returns its rows."""

from __future__ import annotations

import functools
import math
import statistics
import time

import attention_kernels as kb
import torch
from gpu_bench import (
    BASELINE,
    KERNEL_HIDDEN,
    KERNEL_REPEATS,
    KERNEL_SHAPES,
    KERNEL_TARGET,
    KERNEL_TOKENS,
    SPARSE_ALL_KEPT_LIMIT,
    SPARSE_DENSE,
    SPARSE_DENSE_CONTEXTS,
    SPARSE_DENSE_LIMIT,
    SPARSE_SPEEDUP_TARGETS,
    Bench,
    error_text,
    log,
    measures,
)
from harness import interleaved, ratio_fields, ratios
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

from hf_gate_attention.kernels.backends import key_mask


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
        return {
            "s": bench.timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), warmup=True)
        }

    results = bench.interleaved("prefill", run, deadline, [*bench.cases, *bench.phase_cases])
    return bench.rows("prefill", args.prefill_len, 1, results, args.prefill_len)


def train_step(model, ids: torch.Tensor) -> None:
    """One training step of `train` and `train_profile`: forward with labels, backward, `zero_grad`."""
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    model.zero_grad(set_to_none=True)


def run_train(bench: Bench, deadline: float, batch: int = 1) -> list[dict]:
    args, model = bench.args, bench.model
    ids = bench.tokens(1, args.train_len)
    cuda = bench.device.type == "cuda"
    step = functools.partial(train_step, model, ids)

    def run(case):
        bench.set_case(case)
        model.train()
        model.zero_grad(set_to_none=True)
        seconds = bench.timed(step, warmup=True, before=torch.cuda.reset_peak_memory_stats if cuda else None)
        return {"s": seconds, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else math.nan}

    results = bench.interleaved(
        "train", run, deadline, [*bench.cases, *bench.train_cases, *bench.phase_cases]
    )
    model.eval()
    return bench.rows("train", args.train_len, 1, results, args.train_len)


PROFILED_STEPS = 3  # train_profile: training steps recorded per case (times are per step)
PROFILE_ADDITIONS = 5  # train_profile: the kernels with the largest added time named in each case's row


def device_times(step, steps: int, cuda: bool) -> dict[str, tuple[float, float]]:
    """What `step()` ran, `steps` times under `torch.profiler`: name -> (calls, self time in us) per step, of
    the CUDA kernels on a GPU (device time: host noise does not reach it), of the aten ops on a CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    times = {}
    for event in profiler.key_averages():
        if cuda and event.device_type == DeviceType.CUDA:
            times[event.key] = (event.count / steps, event.self_device_time_total / steps)
        elif not cuda and event.key.startswith("aten::"):
            times[event.key] = (event.count / steps, event.self_cpu_time_total / steps)
    return times


def run_train_profile(bench: Bench, deadline: float, kernel_rows: list, batch: int = 1) -> list[dict]:
    """The `train` phase's step (`--train-len` tokens) of every case, `PROFILED_STEPS` times under the
    profiler after one unrecorded step: one row per case (device time per step, its ratio to ungated,
    launches added, the kernels that add the most time), and one per (case, kernel name) appended to
    `kernel_rows`, with what it adds to the ungated step. Not interleaved rounds: one recording per case, in
    case order (device times vary far less than wall times; the `train` phase times the steps)."""
    args, model = bench.args, bench.model
    cuda = bench.device.type == "cuda"
    step = functools.partial(train_step, model, bench.tokens(1, args.train_len))
    recorded = {}
    for case in [*bench.cases, *bench.train_cases, *bench.phase_cases]:
        if time.perf_counter() > deadline and case != BASELINE:
            log(f"train_profile: no time left for {case}")
            continue
        try:
            bench.set_case(case)
            model.train()
            step()
            recorded[case] = device_times(step, PROFILED_STEPS, cuda)
        except Exception as error:
            recorded[case] = error_text(error)
            bench.recover()
    model.eval()
    base = recorded.get(BASELINE)
    rows = []
    for case, times in recorded.items():
        row = {"phase": "train_profile", "tokens": args.train_len, "batch": 1, "case": case}
        row["resolved_backend"] = bench.resolved.get(case, "")
        if isinstance(times, str) or isinstance(base, str):
            rows.append({**row, "error": times if isinstance(times, str) else f"ungated: {base}"})
            continue
        added = {}  # name -> (calls, us) added to the ungated step, largest time first
        for name in {*times, *base}:
            (calls, us), (base_calls, base_us) = times.get(name, (0, 0.0)), base.get(name, (0, 0.0))
            added[name] = (calls - base_calls, us - base_us)
        added = dict(sorted(added.items(), key=lambda item: -item[1][1]))
        for name, (calls, us) in added.items():
            kernel_rows.append({"case": case, "kernel": name, "calls": times.get(name, (0, 0))[0],
                                "device_us": times.get(name, (0, 0.0))[1], "added_calls": calls,
                                "added_us": us})  # fmt: skip
        total, base_total = (sum(us for _, us in t.values()) for t in (times, base))
        largest = list(added.items())[:PROFILE_ADDITIONS]
        row.update(device_ms=total / 1e3, device_vs_ungated=total / base_total)
        row["added_launches"] = sum(calls for calls, _ in added.values())
        if case != BASELINE:
            row["largest_additions"] = "; ".join(
                f"{name[:80]} {us:+.0f} us ({calls:+g})" for name, (calls, us) in largest if us > 0
            )
        rows.append(row)
    return rows


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
    base, dense = (measures(results[case]["rounds"], "s") for case in (BASELINE, SPARSE_DENSE))
    for row in bench.rows("sparse_decode", context, batch, results, batch * steps):
        case, k = row["case"], bench.sparse_cases[row["case"]]
        k = None if k is None else k[0].get("top_k")
        for key in ("ratio", "ratio_min", "ratio_max"):  # case / ungated: reported as its inverse, a speed-up
            row.pop(key, None)
        row.update(context=context, top_k=k, graph_max_abs_diff=diffs.get(case))
        if "median_ms" in row:
            row["step_ms"] = row["median_ms"] / steps
        seconds = measures(results[case]["rounds"], "s")
        if case != BASELINE and (speedups := ratios(base, seconds)):
            row.update(ratio_fields("speedup_ratio", speedups))
            if k is not None and k >= model.config.num_key_value_heads:
                limit = SPARSE_ALL_KEPT_LIMIT
                row["speedup_target"] = f">= {1 / limit:.3f}: time <= {limit} x ungated"
                row["speedup_status"] = "pass" if row["speedup_ratio"] >= 1 / limit else "MISS"
            elif (context, batch, k) in SPARSE_SPEEDUP_TARGETS:
                bound = SPARSE_SPEEDUP_TARGETS[context, batch, k]
                row["speedup_target"] = f">= {bound}"
                row["speedup_status"] = "pass" if row["speedup_ratio"] >= bound else "MISS"
        if k is not None and (vs_dense := ratios(seconds, dense)):
            row.update(ratio_fields("dense_ratio", vs_dense))
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
    info = {name: {"first_call_s": math.nan, "error": ""} for name in methods}
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

    def timed_passes(name):
        """`{pass: median ms}` of one method in one round; NaN once the method has failed."""
        times = dict.fromkeys(passes, math.nan)
        for pass_name, make in passes.items():
            if not info[name]["error"]:
                try:
                    times[pass_name] = kb.time_ms(*make(methods[name]), 2, KERNEL_REPEATS)
                except Exception as error:
                    info[name]["error"] = error_text(error)
        return times

    names = list(methods)
    timed = interleaved(timed_passes, names, rounds, warmup=False, deadline=deadline)
    rows = []
    for name in names:
        for pass_name in passes:
            times = measures(timed[name], pass_name)
            row = {"phase": "kernels", "seq_len": length, "head_dim": dim, "granularity": granularity}
            row.update(batch=batch, heads=heads, method=name, error=info[name]["error"])
            row.update({key: info[name].get(key) for key in ("first_call_s", "max_abs_diff_vs_torch_gate")})
            throughputs = ratios(measures(timed["sdpa"], pass_name), times)
            row.update({"pass": pass_name, "rounds": len(throughputs)})
            if throughputs:
                row["median_ms"] = statistics.median(t for t in times if not math.isnan(t))
                row.update(ratio_fields("ratio", throughputs))
                if name == "sdpa+fused_gate":
                    status = "pass" if row["ratio"] >= KERNEL_TARGET else "MISS"
                    row.update(target=f">= {KERNEL_TARGET}", status=status)
            rows.append(row)
    return rows
