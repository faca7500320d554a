"""benchmarks/gpu.py's rows on the CPU: the CUDA parts (graphed decode, kernel timings) replaced by fakes
with fixed times per round, so that rotation, errors, ratios and verdicts are checked against hand-computed
values."""

from __future__ import annotations

import math
from types import SimpleNamespace

import attention_kernels
import gpu_phases
import pytest
import torch
from gpu_bench import BASELINE, SPARSE_DENSE, Bench

TOP1, TOP8 = "output/headwise top-1:triton", "output/headwise top-8:triton"


def sparse_bench(rounds: int) -> Bench:
    model = SimpleNamespace(eval=lambda: None, zero_grad=lambda **_: None)
    model.config = SimpleNamespace(num_key_value_heads=8)
    args = SimpleNamespace(device="cpu", gates=[], backends=[], top_ks=[1, 8], rounds=rounds, sparse_steps=4)
    return Bench(model, args)


def fake_decoder(monkeypatch, seconds: dict, calls: list) -> None:
    """`graph_decoder` whose run(case) returns the case's next time (the first call: the untimed one)."""
    monkeypatch.setattr(gpu_phases, "random_static_cache", lambda *args: object())

    def graph_decoder(bench, cache, context, batch, steps, diffs):
        def run(case):
            calls.append(case)
            diffs.setdefault(case, 0.0)
            value = seconds[case].pop(0)
            if isinstance(value, Exception):
                raise value
            return {"s": value}

        return run

    monkeypatch.setattr(gpu_phases, "graph_decoder", graph_decoder)


def test_sparse_decode_rows(monkeypatch):
    seconds = {
        BASELINE: [9.0, 4.0, 4.0, 5.0],
        SPARSE_DENSE: [9.0, 4.4, 4.0, 5.5],
        TOP1: [9.0, 1.0, 2.0, 2.0],
        TOP8: [9.0, 4.0, 4.4, 5.0],
    }
    calls = []
    fake_decoder(monkeypatch, seconds, calls)
    rows = gpu_phases.run_sparse_decode(sparse_bench(3), math.inf, batch=16, context=32768)
    first, rotations = calls[:4], [calls[4:8], calls[8:12], calls[12:]]
    assert first == [BASELINE, SPARSE_DENSE, TOP1, TOP8]
    assert rotations == [first, first[1:] + first[:1], first[2:] + first[:2]]
    rows = {row["case"]: row for row in rows}
    assert all("ratio" not in row for row in rows.values())  # reported as speed-ups
    assert "speedup_ratio" not in rows[BASELINE] and "dense_ratio" not in rows[SPARSE_DENSE]
    # top-1: speed-ups 4/1, 4/2, 5/2 against the target of 2.5 at 32k, batch 16; vs dense 1/4.4, 2/4, 2/5.5
    top1 = rows[TOP1]
    assert (top1["speedup_ratio"], top1["speedup_ratio_min"], top1["speedup_ratio_max"]) == (2.5, 2.0, 4.0)
    assert (top1["speedup_target"], top1["speedup_status"]) == (">= 2.5", "pass")
    assert top1["dense_ratio"] == pytest.approx(2 / 5.5)
    assert (top1["dense_ratio_min"], top1["dense_ratio_max"]) == pytest.approx((1 / 4.4, 0.5))
    assert "dense_status" not in top1  # dense limit only at 4k and 8k
    assert top1["median_ms"] == 2000.0 and top1["step_ms"] == 500.0 and top1["tokens_per_s"] == 16 * 4 / 2.0
    # top-8 keeps every group: time <= 1.03 x ungated, i.e. speed-up >= 1 / 1.03; speed-ups 1, 4/4.4, 1
    top8 = rows[TOP8]
    assert (top8["speedup_ratio"], top8["speedup_status"]) == (1.0, "pass")
    assert top8["speedup_ratio_min"] == pytest.approx(4 / 4.4)


def test_sparse_decode_failing_case_keeps_its_error(monkeypatch):
    seconds = {
        BASELINE: [9.0, 4.0, 4.0],
        SPARSE_DENSE: [9.0, 4.0, 4.0],
        TOP1: [9.0, 1.0, RuntimeError("capture failed")],
        TOP8: [RuntimeError("no kernel")],
    }
    calls = []
    fake_decoder(monkeypatch, seconds, calls)
    rows = gpu_phases.run_sparse_decode(sparse_bench(2), math.inf, batch=1, context=4096)
    rows = {row["case"]: row for row in rows}
    assert calls.count(TOP8) == 1  # not called again after its first call failed
    assert rows[TOP8]["rounds"] == 0 and rows[TOP8]["error"] == "error: RuntimeError: no kernel"
    assert math.isnan(rows[TOP8]["first_call_s"]) and "speedup_ratio" not in rows[TOP8]
    top1 = rows[TOP1]
    assert top1["rounds"] == 1 and top1["error"] == "error: RuntimeError: capture failed"
    assert top1["speedup_ratio"] == 4.0 and top1["dense_ratio"] == 0.25
    assert (top1["dense_target"], top1["dense_status"]) == ("<= 1.03", "pass")


def test_kernel_shape_rows(monkeypatch):
    """Throughput vs sdpa per round: sdpa time / method time of the same round."""
    times = {"sdpa": {"fwd": [2.0, 2.0, 4.0], "bwd": [4.0, 4.0, 4.0]}}
    times["sdpa+fused_gate"] = {"fwd": [2.5, 2.0, 4.4], "bwd": [5.0, 4.0, 4.0]}
    called = []

    def method(name):
        def run(q, k, v, gate_logits, causal):
            if name == "triton":
                raise RuntimeError("no kernel")
            called.append(name)
            return q.transpose(1, 2) * 1.0

        return run

    def make_inputs(batch, heads, length, dim, width):
        q, k, v = (torch.randn(batch, length, heads, dim).transpose(1, 2).requires_grad_() for _ in range(3))
        return q, k, v, torch.randn(batch, length, heads, width).requires_grad_()

    def time_ms(run, setup, warmup, repeats):
        state = setup()  # bwd: the forward to differentiate
        run(state)
        return times[called[-1]]["fwd" if state is None else "bwd"].pop(0)

    monkeypatch.setattr(gpu_phases, "KERNEL_TOKENS", 8)
    monkeypatch.setattr(gpu_phases, "KERNEL_HIDDEN", 8)
    monkeypatch.setattr(attention_kernels, "make_inputs", make_inputs)
    monkeypatch.setattr(attention_kernels, "sdpa_torch_gate", method("sdpa+torch_gate"))
    monkeypatch.setattr(attention_kernels, "time_ms", time_ms)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    methods = {name: method(name) for name in ("sdpa", "sdpa+fused_gate", "triton")}
    rows = gpu_phases.kernel_shape(methods, 4, 4, "headwise", 3, math.inf)
    rows = {(r["method"], r["pass"]): r for r in rows}
    assert rows["sdpa", "fwd"]["ratio"] == 1.0 and "status" not in rows["sdpa", "fwd"]
    fwd = rows["sdpa+fused_gate", "fwd"]  # 2 / 2.5, 2 / 2, 4 / 4.4
    assert fwd["ratio"] == pytest.approx(4 / 4.4) and (fwd["ratio_min"], fwd["ratio_max"]) == (0.8, 1.0)
    assert (fwd["median_ms"], fwd["rounds"], fwd["target"], fwd["status"]) == (2.5, 3, ">= 0.97", "MISS")
    assert fwd["max_abs_diff_vs_torch_gate"] == 0.0 and (fwd["batch"], fwd["heads"]) == (2, 2)
    bwd = rows["sdpa+fused_gate", "bwd"]  # 4 / 5, 4 / 4, 4 / 4
    assert (bwd["ratio"], bwd["ratio_min"], bwd["status"]) == (1.0, 0.8, "pass")
    failed = rows["triton", "fwd"]
    assert failed["error"] == "error: RuntimeError: no kernel"
    assert failed["rounds"] == 0 and "ratio" not in failed


def test_tile_skipping_cases_patch_with_sparse_true():
    """The `... skipping tiles` case patches its top-k gate with `sparse=True` (the flash kernel skips tiles
    in prefill and training); the same gate without the words, with `sparse=None` (SDPA and the masked
    pass)."""
    from helpers import tiny_model

    model = tiny_model("llama", hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    args = SimpleNamespace(device="cpu", gates=[], backends=[], top_ks=[], phase_top_ks=[1], rounds=1)
    bench = Bench(model, args)
    for case, sparse in (
        ("output/headwise top-1 skipping tiles:triton", True),
        ("output/headwise top-1:triton", None),
    ):
        bench.set_case(case)
        assert [p.sparse for p in model._gate_attention_patches] == [sparse] * model.config.num_hidden_layers


def test_sparse_decode_cases_with_sink_and_window_reads():
    model = SimpleNamespace(eval=lambda: None, zero_grad=lambda **_: None)
    model.config = SimpleNamespace(num_key_value_heads=8)
    args = SimpleNamespace(device="cpu", gates=[], backends=[], top_ks=[1], reads_top_ks=[2], rounds=1)
    gate, backend = Bench(model, args).sparse_cases["output/headwise top-2 sink 4 + window 64:triton"]
    assert backend == "triton" and (gate["top_k"], gate["top_k_sink"], gate["top_k_window"]) == (2, 4, 64)


def test_one_slot_per_group_cases_run_the_decode_kernel_without_kept_groups(monkeypatch):
    """The `..., one slot per group` cases swap the package's decode attention for `one_slot_per_group`
    (the kernel called without `kept_groups`, as before group slots) while they are set, and only then."""
    import gpu_bench
    from helpers import tiny_model

    import hf_gate_attention.kernels as gate_kernels

    calls = []
    monkeypatch.setattr(gate_kernels, "gated_decode_attention", gate_kernels.gated_decode_attention)
    monkeypatch.setattr(gpu_bench, "DECODE_ATTENTION", lambda *args, **options: calls.append(options))
    model = tiny_model("llama", hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    args = SimpleNamespace(device="cpu", gates=[], backends=[], top_ks=[1], slot_top_ks=[1], rounds=1)
    bench = Bench(model, args)
    case = "output/headwise top-1:triton, one slot per group"
    assert bench.sparse_cases[case] == bench.sparse_cases[TOP1]
    for name, passed in ((case, {}), (TOP1, {"kept_groups": 1}), (case, {}), (BASELINE, {"kept_groups": 1})):
        bench.set_case(name)
        gate_kernels.gated_decode_attention(kept_groups=1)
        assert calls.pop() == passed, name


def test_prefill_rows_of_top_k_cases_against_the_dense_gate(monkeypatch):
    """`--phase-top-ks 2`: prefill times top-2 zeroed (masked, and skipping tiles) and with sink + window
    reads beside the dense gate; their time / dense gated per round is judged against 1.05, not the dense
    gates' targets."""
    zeroed, reads = "output/headwise top-2:triton", "output/headwise top-2 sink 4 + window 64:triton"
    tiles = "output/headwise top-2 skipping tiles:triton"
    model = SimpleNamespace(eval=lambda: None, zero_grad=lambda **_: None)
    model.config = SimpleNamespace(num_key_value_heads=8)
    args = SimpleNamespace(
        device="cpu", gates=["output/headwise"], backends=["fused_gate"], top_ks=[], phase_top_ks=[2]
    )
    args.rounds, args.prefill_len = 2, 8
    bench = Bench(model, args)
    assert bench.phase_cases[reads][0]["top_k_window"] == 64 and bench.phase_cases[zeroed][1] == "triton"
    seconds = {
        BASELINE: [9, 1.0, 1.0],
        SPARSE_DENSE: [9, 1.1, 1.0],
        zeroed: [9, 1.1, 1.2],
        tiles: [9, 1.32, 1.3],
        reads: [9, 1.2, 1.0],
    }
    monkeypatch.setattr(bench, "set_case", lambda case: setattr(bench, "case", case))
    monkeypatch.setattr(bench, "timed", lambda fn, warmup: seconds[bench.case].pop(0))
    monkeypatch.setattr(bench, "tokens", lambda batch, length: None)
    rows = {row["case"]: row for row in gpu_phases.run_prefill(bench, math.inf)}
    assert list(rows) == [BASELINE, SPARSE_DENSE, zeroed, tiles, reads]
    assert bench.phase_cases[tiles] == bench.phase_cases[zeroed] and bench.tile_skipping_cases == {tiles}
    assert (rows[SPARSE_DENSE]["ratio"], rows[SPARSE_DENSE]["status"]) == (pytest.approx(1.05), "MISS")
    assert "dense_ratio" not in rows[SPARSE_DENSE]
    # zeroed: 1.1 / 1.1 and 1.2 / 1.0; reads: 1.2 / 1.1 and 1.0 / 1.0 (rounds rotate, times follow the case)
    assert rows[zeroed]["dense_ratio"] == pytest.approx(1.1) and rows[zeroed]["dense_status"] == "MISS"
    assert rows[reads]["dense_ratio"] == pytest.approx((1.2 / 1.1 + 1.0) / 2)
    assert (rows[reads]["dense_target"], rows[reads]["dense_status"]) == ("<= 1.05", "pass")
    assert "status" not in rows[zeroed] and rows[zeroed]["ratio"] == pytest.approx(1.15)


def test_train_profile_rows_name_what_the_gate_adds(monkeypatch):
    """`train_profile` on the CPU records aten ops: the torch gate adds one sigmoid and one sigmoid backward
    per layer and step, the ungated step has none; a case that fails keeps its error in its row."""
    from helpers import tiny_model

    model = tiny_model("llama", hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    gates = ["output/headwise", "output/elementwise"]
    args = SimpleNamespace(device="cpu", gates=gates, backends=["torch"], top_ks=[], rounds=1, train_len=12)
    bench = Bench(model, args)
    broken = "output/elementwise:torch"
    set_case = bench.set_case

    def failing(case):
        if case == broken:
            raise RuntimeError("out of memory")
        set_case(case)

    monkeypatch.setattr(bench, "set_case", failing)
    kernels = []
    rows = {row["case"]: row for row in gpu_phases.run_train_profile(bench, math.inf, kernels)}
    assert list(rows) == [BASELINE, "output/headwise:torch", broken]
    assert rows[broken]["error"] == "error: RuntimeError: out of memory"
    assert rows[BASELINE]["device_vs_ungated"] == 1 and rows[BASELINE]["added_launches"] == 0
    gated = {k["kernel"]: k for k in kernels if k["case"] == "output/headwise:torch"}
    layers = model.config.num_hidden_layers
    for op in ("aten::sigmoid", "aten::sigmoid_backward"):
        assert gated[op]["added_calls"] == gated[op]["calls"] == layers, op
    assert "aten::sigmoid" not in {k["kernel"] for k in kernels if k["case"] == BASELINE}
    assert rows["output/headwise:torch"]["added_launches"] > 0
    added = [k["added_us"] for k in kernels if k["case"] == "output/headwise:torch"]
    assert added == sorted(added, reverse=True)  # largest addition first


def test_timed_warms_up_once_and_calls_before_right_before_the_timed_call():
    import gc

    bench, calls = sparse_bench(rounds=1), []

    def fn():
        calls.append(("fn", gc.isenabled()))

    seconds = bench.timed(fn, warmup=True, before=lambda: calls.append(("before", gc.isenabled())))
    assert calls == [("fn", True), ("before", True), ("fn", False)] and seconds >= 0 and gc.isenabled()
    bench.timed(fn)
    assert calls[3:] == [("fn", False)] and gc.isenabled()  # the collector is off while timing only


def test_fused_pass_in_training_cases_set_the_flag_only_while_set(monkeypatch):
    """`..., fused pass in training` cases (one per fused_gate gate) patch like their fused_gate case and set
    `ops.FUSED_PASS_IN_TRAINING` while they are the case, and only then."""
    from helpers import tiny_model

    import hf_gate_attention.kernels.ops as ops

    monkeypatch.setattr(ops, "FUSED_PASS_IN_TRAINING", False)
    model = tiny_model("llama", hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    args = SimpleNamespace(
        device="cpu", gates=["output/headwise"], backends=["torch", "fused_gate"], top_ks=[]
    )
    bench = Bench(model, args)
    case = "output/headwise:fused_gate, fused pass in training"
    assert (
        list(bench.train_cases) == [case]
        and bench.train_cases[case] == bench.cases["output/headwise:fused_gate"]
    )
    for name, flag in ((case, True), ("output/headwise:fused_gate", False), (case, True), (BASELINE, False)):
        bench.set_case(name)
        assert ops.FUSED_PASS_IN_TRAINING is flag, name
