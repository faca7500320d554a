"""Gated attention under transformers' tensor parallelism computes what one process computes.

`tp_worker.py` (beside this file) loads tiny gated checkpoints with `tp_plan="auto"` on 2 CPU ranks over gloo
(`python -m torch.distributed.run --standalone --nproc_per_node 2`), and on 4 where the heads allow, as a
user launches it: through `hf_gate_attention.from_pretrained`, `DistributedConfig(tp_size=N)`, the shipped
remote code (`trust_remote_code=True`), `load_gate_adapter` and `patch` after a TP load. Here the same
checkpoints are loaded in this one process and compared: float32 logits, the gradient of every parameter of
a loss, the logits after one SGD step (every parameter, or the gates alone) within `TOLERANCE`; greedy
`generate` equal. Decoders of the model matrix with a TP plan: llama, qwen3 (q/k norms), mistral, gemma3_text
(sliding and full layers), qwen3_moe (experts); every variant and granularity, top-k (selected among every
rank's heads) and phi3, whose plan keeps every head on every rank. What cannot run sharded is refused with
the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers import torchrun
from model_zoo import zoo_model
from safetensors.torch import load_file
from tp_worker import computed

import hf_gate_attention
from hf_gate_attention import (
    gate_parameters,
    load_gate_adapter,
    patch,
    save_gate_adapter,
)

pytestmark = pytest.mark.slow  # torchrun launches of 2 and 4 processes
WORKER = Path(__file__).with_name("tp_worker.py")
TOLERANCE = 1e-5
MODEL_TYPES = ("llama", "qwen3", "mistral", "gemma3_text", "qwen3_moe")
GATES = [
    {"variant": variant, "granularity": granularity}
    for variant in ("output", "value", "qk")
    for granularity in ("headwise", "elementwise")
]


def gate_name(gate: dict) -> str:
    return "-".join(str(value) for value in gate.values())


def save_gated(folder: Path, model_type: str, gate: dict, **config) -> Path:
    """A tiny gated checkpoint whose gates hold random values (the identity init would hide a misplaced
    shard)."""
    model = zoo_model(model_type, **config)
    patch(model, **gate, init="paper")
    torch.manual_seed(1)
    for param in gate_parameters(model):
        torch.nn.init.normal_(param, std=0.5)
    model.save_pretrained(folder)
    return folder


def load_one_process(case: dict):
    if case["load"] in ("package", "distributed_config"):
        return hf_gate_attention.from_pretrained(case["path"])
    if case["load"] == "remote":
        return transformers.AutoModelForCausalLM.from_pretrained(case["path"], trust_remote_code=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(case["path"])
    if case["load"] == "adapter":
        return load_gate_adapter(model, case["adapter"])
    return patch(model, **case["gate"])


def one_process(case: dict) -> dict:
    """What the worker computes for `case`, without tensor parallelism."""
    return computed(load_one_process(case), case)


def build_cases(root: Path) -> tuple[list[dict], list[dict]]:
    """The cases of the 2-rank and the 4-rank runs, their checkpoints written under `root`."""
    two, four = [], []
    for model_type in MODEL_TYPES:
        for gate in GATES:
            name = f"{model_type}-{gate_name(gate)}"
            path = str(save_gated(root / name, model_type, gate))
            two.append({"name": f"{name}-package", "load": "package", "path": path, "train": "all"})
            two.append({"name": f"{name}-remote", "load": "remote", "path": path, "train": "gates"})
    llama = str(root / "llama-output-headwise")
    two += [
        {"name": "llama-distributed-config", "load": "distributed_config", "path": llama, "generate": True,
         "save": True},
        {"name": "llama-remote-generate", "load": "remote", "path": llama, "generate": True, "save": True},
        {"name": "qwen3-moe-generate", "load": "package", "path": str(root / "qwen3_moe-qk-elementwise"),
         "generate": True},
    ]  # fmt: skip
    base = root / "llama-base"
    zoo_model("llama").save_pretrained(base)
    adapter_model = hf_gate_attention.from_pretrained(root / "llama-value-elementwise")
    save_gate_adapter(adapter_model, root / "llama-adapter", base_model_name_or_path=str(base))
    adapter = str(root / "llama-adapter")
    two.append(
        {"name": "llama-adapter", "load": "adapter", "path": str(base), "adapter": adapter, "train": "all"}
    )
    for gate in GATES:  # identity init: the same gates on every rank and here
        name = f"llama-patch-{gate_name(gate)}"
        two.append({"name": name, "load": "patch", "path": str(base), "gate": gate, "train": "gates"})
    top_ks = (  # the heads of both ranks compete; dropped ones read their sink and window keys
        {"top_k": 2},
        {"top_k": 1, "top_k_unit": "kv_group"},
        {"top_k": 1, "top_k_unit": "kv_group", "top_k_sink": 2, "top_k_window": 3},
    )
    for top_k in top_ks:
        gate = {"variant": "qk" if "top_k_sink" in top_k else "output", "granularity": "elementwise", **top_k}
        path = str(save_gated(root / f"llama-top-{gate_name(top_k)}", "llama", gate))
        name = f"llama-top-k-{gate_name(top_k)}"
        two.append({"name": name, "load": "package", "path": path, "train": "all", "generate": True})
        two.append({"name": f"{name}-remote", "load": "remote", "path": path, "train": "gates"})
    phi3 = str(save_gated(root / "phi3-qk", "phi3", {"variant": "qk", "granularity": "elementwise"}))
    two.append({"name": "phi3-whole-heads", "load": "package", "path": phi3, "train": "all"})
    whole = {
        f"model.layers.*.self_attn.{name}": "colwise_gather_output" for name in ("q_proj", "k_proj", "v_proj")
    }
    whole["model.layers.*.self_attn.o_proj"] = "rowwise_split_input"  # the attention of every rank whole
    path = str(root / "llama-value-headwise")
    two.append(
        {"name": "llama-whole-heads-plan", "load": "remote", "path": path, "tp_plan": whole, "train": "all"}
    )
    latent = root / "deepseek_v3-base"
    zoo_model("deepseek_v3").save_pretrained(latent)
    mqa = root / "llama-one-kv-head"
    zoo_model("llama", num_key_value_heads=1).save_pretrained(mqa)
    refused = {
        "one-kv-head": (str(mqa), {"variant": "value"}),
        "fused-gate": (str(base), {"backend": "fused_gate"}),
        "sparse": (str(base), {"top_k": 2, "sparse": True}),
        "latent": (str(latent), {"variant": "output"}),
    }
    for name, (path, gate) in refused.items():
        two.append({"name": f"refused-{name}", "load": "patch", "path": path, "gate": gate})
    four_heads = {"num_key_value_heads": 4}
    for gate in GATES:
        name = f"llama-4kv-{gate_name(gate)}"
        path = str(save_gated(root / name, "llama", gate, **four_heads))
        four.append({"name": name, "load": "package", "path": path, "train": "all"})
    return two, four


@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory) -> dict:
    """Runs the worker on 2 ranks and on 4 once; returns every case with its TP result."""
    root = tmp_path_factory.mktemp("tensor_parallel")
    two, four = build_cases(root)
    results = {}
    for ranks, cases in ((2, two), (4, four)):
        out = root / f"out-{ranks}"
        out.mkdir()
        (root / f"cases-{ranks}.json").write_text(json.dumps(cases))
        torchrun(str(WORKER), str(root / f"cases-{ranks}.json"), str(out), nproc=ranks, timeout=900)
        for case in cases:
            results[case["name"]] = (case, torch.load(out / f"{case['name']}.pt"))
    return results


def assert_close(tp: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    assert tp.shape == reference.shape, f"{what}: shape {tuple(tp.shape)} against {tuple(reference.shape)}"
    diff = (tp - reference).abs().max().item()
    assert diff <= TOLERANCE, f"{what}: max abs difference {diff:.2e} to one process"


def computed_cases(tp_runs):
    return [name for name in tp_runs if not name.startswith("refused")]


def test_every_case_ran(tp_runs):
    failed = {name: r["error"] for name, (_, r) in tp_runs.items() if "error" in r and "refused" not in name}
    assert not failed, failed


@pytest.mark.parametrize("what", ["logits", "grads", "logits_after_step", "generated"])
def test_tensor_parallel_equals_one_process(tp_runs, what):
    compared = 0
    for name in computed_cases(tp_runs):
        case, result = tp_runs[name]
        if what not in result:
            continue
        reference = one_process(case)
        if what == "generated":
            assert torch.equal(result[what], reference[what]), f"{name}: generate differs"
        elif what == "grads":
            assert result[what].keys() == reference[what].keys(), f"{name}: other trainable parameters"
            for param, grad in result[what].items():
                assert_close(grad, reference[what][param], f"{name}: gradient of {param}")
        else:
            assert_close(result[what], reference[what], f"{name}: {what}")
        compared += 1
    assert compared >= {"logits": 60, "grads": 60, "logits_after_step": 60, "generated": 5}[what]


@pytest.mark.parametrize("name", ["llama-distributed-config", "llama-remote-generate"])
def test_a_save_under_tensor_parallelism_writes_the_whole_checkpoint(tp_runs, name):
    """`save_pretrained` on every rank: the gathered weights, gates included, are the loaded checkpoint's,
    bit for bit, with the remote code beside them."""
    case, _ = tp_runs[name]
    saved = Path(case["path"]).parent / "out-2" / f"{name}-saved"
    written, loaded = (load_file(folder / "model.safetensors") for folder in (saved, Path(case["path"])))
    assert written.keys() == loaded.keys()
    for key, tensor in loaded.items():
        assert torch.equal(written[key], tensor), key
    assert (saved / "gated_attention_tensor_parallel.py").is_file()
    config = json.loads((saved / "config.json").read_text())
    assert "distributed_config" not in config and config["gate_attention"]["variant"] == "output"


def test_gate_gradients_are_those_of_every_gate(tp_runs):
    """Training every parameter under TP gives the gates a gradient too: not all zero, one per block."""
    _, result = tp_runs["llama-output-headwise-package"]
    gate_grads = {name: grad for name, grad in result["grads"].items() if ".attn_gate." in name}
    assert len(gate_grads) == 4 and all(grad.abs().sum() > 0 for grad in gate_grads.values())


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("refused-one-kv-head", "4 query heads and 1 key/value heads, which 2 ranks cannot share out whole"),
        ("refused-fused-gate", "backend='fused_gate' under tensor parallelism"),
        ("refused-sparse", "sparse=True under tensor parallelism"),
        (
            "refused-latent",
            "the TP plan splits the heads of model.layers.0.self_attn (DeepseekV3Attention) as "
            "{q_a_proj: not in the plan, o_proj: rowwise}",
        ),
    ],
)
def test_what_cannot_shard_is_refused_with_the_reason(tp_runs, name, message):
    _, result = tp_runs[name]
    assert message in result.get("error", ""), result.get("error", "no error: it ran")
